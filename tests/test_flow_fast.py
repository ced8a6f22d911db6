"""The compiled flow core's counts and edges (hwtrace.flow.fast) against
its Python twin: `decode --quiet --stat` output byte for byte over the
ptxed corpus, counts, errors and edges over emulated-engine recordings,
real captures and seeded mutations of them -- always decoded by the core
(it has no bail-out).  Batches: tests/test_flow_core.py."""

from __future__ import annotations

import contextlib
import io
import json
import random
import subprocess
from pathlib import Path

import pytest

from conftest import CORPUS, _need, compiled_flow_core, run_hwtrace
from ptxed_corpus import argv_for, ptxed_variants, variant_id

from hwtrace.flow import fast
from hwtrace.flow.config import FlowConfig
from hwtrace.flow.image import Image
from hwtrace.flow.loaders import load_raw
from hwtrace.pt import cpu as cpumod


def test_compiled_core_loaded():
    # Fails where the extension was built (or is required) but is unusable.
    fast.STATUS.check()
    if fast.STATUS.expected and not fast.STATUS.disabled:
        assert fast.CORE is not None




_COUNT_INTO = fast.count_into


def _cli(argv, core, monkeypatch, used):
    """Run `hwtrace ARGV` in-process with fast.CORE = core; stdout."""
    from hwtrace.cli import main
    monkeypatch.setattr(fast, "CORE", core)
    real = _COUNT_INTO

    def spy(*a, **k):
        r = real(*a, **k)
        used.append(r)
        return r
    monkeypatch.setattr(fast, "count_into", spy)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    assert rc == 0
    return out.getvalue()


def test_corpus_quiet_stat_identical(monkeypatch, corpus):
    """Every ptxed variant, both decoders, --stat / --stat:insn /
    --stat:blocks with --quiet (errors printed, with and without
    --resync-on-error): compiled path == Python path, byte for byte, and
    the compiled path decoded every one of them."""
    core = compiled_flow_core()
    compiled = 0
    total = 0
    stats = ("--stat", "--stat:insn", "--stat:blocks")
    for i, (d, v, meta) in enumerate(ptxed_variants()):
        for decoder in ("insn", "block"):
            stat = stats[(i + (decoder == "block")) % 3]
            argv = argv_for(d, v, decoder) + ["--quiet", stat]
            if i % 4 == 0 and "--resync-on-error" not in argv:
                argv.append("--resync-on-error")
            used = []
            got = _cli(argv, core, monkeypatch, used)
            ref = _cli(argv, None, monkeypatch, [])
            assert got == ref, (variant_id(v), decoder, got, ref)
            total += 1
            # --block:show-blocks numbers blocks: decode's own path
            if "--block:show-blocks" not in argv:
                assert used == [True], (variant_id(v), decoder)
                compiled += 1
    assert total == 860
    assert compiled == 860 - 12


# -- recorded traces --------------------------------------------------------

def _record(tmp: Path, argv: list[str]) -> Path:
    out = tmp / "bundle"
    # thread mode: the whole run in one stream (in cpu mode the run is split
    # between CPUs as the host schedules QEMU, so a stream holds a varying part)
    r = run_hwtrace("record", "--mode", "thread", "--copy-images", "-o", out,
                    "--", *argv, timeout=300)
    if r.returncode != 0:
        _need("emulated engine", r.stderr.strip()[-300:])
    return out


class _Loaded(tuple):
    """(trace bytes, image, config); ``observed``: the instructions the
    recorder saw in that stream (the manifest's instructions_observed)."""

    observed = None


def _load(bundle: Path):
    """(trace bytes, image, config) of a bundle's largest stream."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    entry = max(manifest["streams"], key=lambda s: s.get("size", 0))
    stream = entry["file"]
    r = run_hwtrace("images", "--pt", stream, bundle, check=True)
    opts = r.stdout.split()
    image = Image()
    for i in range(0, len(opts), 2):
        assert opts[i] == "--raw"
        load_raw(image, opts[i + 1])
    cfg = FlowConfig()
    c = manifest.get("cpu") or {}
    if c.get("family"):
        cfg.errata = cpumod.errata(
            cpumod.Cpu.parse(f"{c['family']}/{c['model']}"))
    out = _Loaded(((bundle / stream).read_bytes(), image, cfg))
    out.observed = entry.get("instructions_observed")
    return out


@pytest.fixture(scope="module")
def true_trace(tmp_path_factory):
    return _load(_record(tmp_path_factory.mktemp("true"), ["/bin/true"]))


@pytest.fixture(scope="module")
def gzip_trace(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gzip")
    text = tmp / "in.txt"
    text.write_bytes((Path(__file__).read_bytes() * 4)[:4096])
    return _load(_record(tmp, ["/usr/bin/gzip", "-9", "-f", str(text)]))


def _timing_cfg(bundle: Path, cfg: FlowConfig) -> FlowConfig:
    """The bundle's timing parameters (as `hwtrace decode DIR` uses them)."""
    m = json.loads((bundle / "manifest.json").read_text())
    cfg.mtc_freq = m.get("mtc_freq", 0)
    cfg.nom_freq = m.get("nom_freq", 0)
    cfg.cpuid_0x15_eax = m.get("cpuid_0x15_eax", 0)
    cfg.cpuid_0x15_ebx = m.get("cpuid_0x15_ebx", 0)
    return cfg


@pytest.fixture(scope="module")
def timing_trace(tmp_path_factory):
    """gzip recorded with TSC, MTC (every 2**3 CTC) and CYC packets, and a
    PSB+ every 2 KiB (psb-freq=0): among those a PSB+ whose FUP is ahead of
    the instruction the last query was for, so its exec-mode event waits
    for its IP (the compiled core bailed on that before)."""
    tmp = tmp_path_factory.mktemp("timing")
    text = tmp / "in.txt"
    text.write_bytes((Path(__file__).read_bytes() * 4)[:4096])
    out = tmp / "bundle"
    r = run_hwtrace("record", "--copy-images", "--config",
                    "branch;user;tsc;retc;cyc;mtc;mtc-freq=3;psb-freq=0", "-o", out,
                    "--", "/usr/bin/gzip", "-9", "-f", str(text), timeout=300)
    if r.returncode != 0:
        _need("emulated engine", r.stderr.strip()[-300:])
    data, image, cfg = _load(out)
    return data, image, _timing_cfg(out, cfg)


def _kinds(data: bytes) -> set:
    from hwtrace.pt.decoder import PacketDecoder
    from hwtrace.pt.errors import PtError
    d = PacketDecoder(data)
    d.sync_forward()
    kinds = set()
    while True:
        p = d.next()
        if isinstance(p, PtError):
            return kinds
        kinds.add(p.type)


def test_timing_recording_compiled(timing_trace):
    """MTC/TMA/CYC no longer send a trace to the twin: a recording with
    timing on decodes compiled, to the twin's counts and edges."""
    data, image, cfg = timing_trace
    compiled_flow_core()
    assert {"mtc", "tma", "cyc", "tsc", "cbr"} <= _kinds(data)
    for decoder in ("block", "insn"):
        c = fast.count(data, image, cfg, decoder, impl="compiled")
        p = fast.count(data, image, cfg, decoder, impl="python")
        assert c.compiled and not p.compiled
        assert c[:2] + c[4:] == p[:2] + p[4:]
        assert c.insns > 100000
    c = fast.edges(data, image, cfg)
    p = fast.edges(data, image, cfg, impl="python")
    assert c.compiled and c.counts == p.counts and c.insns == p.insns


@pytest.mark.parametrize("params", [
    (0, 0, 0, 0),            # no calibration: every CYC is lost
    (3, 22, 0, 0),           # no CTC->TSC ratio: configuration errors only
    (0, 22, 2, 176),         # the wrong MTC period: CTCs misread
    (15, 1, 1, 1),
    (3, 22, 2, 176),         # as recorded
])
def test_timing_parameters_identical(timing_trace, params):
    """Whatever timing parameters the user gives (wrong ones make the time
    tracker fail somewhere or nowhere), both implementations agree."""
    data, image, cfg0 = timing_trace
    compiled_flow_core()
    cfg = FlowConfig(errata=cfg0.errata, mtc_freq=params[0],
                     nom_freq=params[1], cpuid_0x15_eax=params[2],
                     cpuid_0x15_ebx=params[3])
    for decoder in ("block", "insn"):
        c = fast.count(data, image, cfg, decoder)
        p = fast.count(data, image, cfg, decoder, impl="python")
        assert c.compiled
        assert c[:2] + c[4:] == p[:2] + p[4:]


def second_tma(data: bytes, at: int) -> bytes:
    """``data`` with a second TMA after the PSBEND of the first PSB at or
    after ``at``: a timing error the twin reports (and the core bails on).
    Also used by test_fast_parallel."""
    from hwtrace.pt.decoder import PacketDecoder
    d = PacketDecoder(data)
    d.sync_set(at)
    tma = psbend = None
    while psbend is None:
        p = d.next()
        if p.type == "tma":
            tma = data[p.offset:p.offset + p.size]
        elif p.type == "psbend":
            psbend = p.offset + p.size
    assert tma is not None
    return data[:psbend] + tma + data[psbend:]



def test_timing_error_decoded(timing_trace):
    """A second TMA after a PSB+ (that had its own TSC and TMA) is a
    timing error of the twin ("unexpected packet context"): the core
    reports the same error at the same offset and decodes on the same
    way (it bailed out to the twin on timing errors before)."""
    from hwtrace.pt.decoder import find_psb_forward
    data, image, cfg = timing_trace
    compiled_flow_core()
    bad = second_tma(data, find_psb_forward(data, 0))
    for decoder in ("block", "insn"):
        c = fast.count(bad, image, cfg, decoder)
        p = fast.count(bad, image, cfg, decoder, impl="python")
        assert c.compiled and p.errors >= 1
        assert c[:2] + c[4:] == p[:2] + p[4:]


@pytest.mark.slow
def test_timing_mutations_identical(timing_trace):
    """Seeded mutations of a timing trace (broken MTC/CYC/TMA sequences
    among them): the same counts and errors from both paths, all of them
    decoded by the core."""
    data, image, cfg = timing_trace
    compiled_flow_core()
    rng = random.Random(8)
    errors = 0
    for _ in range(12):
        m = _mutate(data, rng)
        for decoder in ("block", "insn"):
            c = fast.count(m, image, cfg, decoder)
            p = fast.count(m, image, cfg, decoder, impl="python")
            assert c.compiled
            assert c[:2] + c[4:] == p[:2] + p[4:]
            errors += c.errors
    assert errors > 0


@pytest.mark.parametrize("which", ["true_trace", "gzip_trace"])
def test_recorded_counts_identical(which, request):
    rec = request.getfixturevalue(which)
    data, image, cfg = rec
    compiled_flow_core()
    for decoder in ("block", "insn"):
        c = fast.count(data, image, cfg, decoder, impl="compiled")
        p = fast.count(data, image, cfg, decoder, impl="python")
        assert c.compiled and not p.compiled
        assert c[:2] + c[4:] == p[:2] + p[4:]
        # every instruction the recorder saw (how many the loader runs
        # depends on the size of the environment: ~88k for /bin/true under
        # env -i, ~105k from a login shell)
        assert c.insns == rec.observed and c.insns > 50000
    # the instruction cache's misses are filled in C (core/pyfill.h): the
    # same counts as the Python fill's alone, no call into Python for them
    core = fast.CORE
    cfg_t = fast.config_tuple(cfg)
    dec = core.Decoder(data, image, (fast.filler, fast.mappings), cfg_t,
                       fast.F_BLOCK)
    py = core.Decoder(data, image, fast.filler, cfg_t, fast.F_BLOCK)
    assert dec.counts() == py.counts()
    in_c, in_python = dec.fills
    assert in_c > 1000 and in_python == 0, dec.fills
    assert py.fills[0] == 0 and py.fills[1] > 1000


def test_recorded_cli_identical(true_trace, tmp_path):
    """`hwtrace decode --pt ... --quiet --stat` as a user runs it, compiled
    and with HWTRACE_NO_EXTENSIONS=1: the same bytes."""
    data, image, cfg = true_trace
    compiled_flow_core()
    pt = tmp_path / "t.pt"
    pt.write_bytes(data)
    argv = ["decode", "--pt", pt]
    for m in image.mappings():
        argv += ["--raw", f"{m.section.name}:{m.offset:#x}-"
                          f"{m.offset + m.end - m.begin:#x}:{m.begin:#x}"]
    if cfg.errata.bdm70:
        argv += ["--cpu", "6/106"]
    for extra in (["--quiet", "--stat"], ["--insn-decoder", "--quiet",
                                          "--stat:insn"]):
        a = run_hwtrace(*argv, *extra)
        b = run_hwtrace(*argv, *extra, env={"HWTRACE_NO_EXTENSIONS": "1"})
        assert a.returncode == b.returncode == 0, (a.stderr, b.stderr)
        assert a.stdout == b.stdout
        assert a.stdout.startswith("insn: ")


def _mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    what = rng.randrange(4)
    if what == 0:                         # flip a few bytes
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif what == 1:                       # truncate
        del b[rng.randrange(len(b) // 2, len(b)):]
    elif what == 2:                       # drop a run of bytes
        i = rng.randrange(len(b))
        del b[i:i + rng.randint(1, 16)]
    else:                                 # duplicate a run of bytes
        i = rng.randrange(len(b))
        b[i:i] = b[i:i + rng.randint(1, 64)]
    return bytes(b)


def test_mutations_identical(true_trace):
    data, image, cfg = true_trace
    compiled_flow_core()
    rng = random.Random(20261129)
    errors = 0
    for _ in range(16):
        m = _mutate(data, rng)
        for decoder in ("block", "insn"):
            for resync in (False, True):
                c = fast.count(m, image, cfg, decoder, resync=resync)
                p = fast.count(m, image, cfg, decoder, impl="python",
                               resync=resync)
                assert c.compiled
                assert c[:2] + c[4:] == p[:2] + p[4:]
                errors += c.errors
    assert errors > 0


@pytest.mark.parametrize("call,jump", [(True, False), (False, True),
                                       (True, True)])
def test_block_end_options_identical(true_trace, call, jump):
    """--block:end-on-call / --block:end-on-jump change block boundaries
    (and so the block count) the same way in both implementations."""
    data, image, cfg0 = true_trace
    compiled_flow_core()
    cfg = FlowConfig(errata=cfg0.errata, end_on_call=call, end_on_jump=jump)
    c = fast.count(data, image, cfg, "block", impl="compiled")
    p = fast.count(data, image, cfg, "block", impl="python")
    assert c.compiled
    assert (c.insns, c.blocks) == (p.insns, p.blocks)
    plain = fast.count(data, image, cfg0, "block", impl="compiled")
    assert c.insns == plain.insns and c.blocks > plain.blocks


@pytest.mark.parametrize("data", [b"", b"\x00" * 64, bytes(range(256)) * 4])
def test_no_sync_point(data):
    """No PSB: nothing decoded, by either implementation."""
    compiled_flow_core()
    image = Image()
    for decoder in ("block", "insn"):
        c = fast.count(data, image, None, decoder, impl="compiled")
        p = fast.count(data, image, None, decoder, impl="python")
        assert c == (0, 0, 0, True, 0, ())
        assert p == (0, 0, 0, False, 0, ())
    assert fast.edges(bytearray(data), image).counts == {}


# -- real hardware captures ---------------------------------------------------

def _hardware_cases(tmp: Path):
    """(name, trace, image, config) of the real captures with a binary."""
    from conftest import FIXTURES
    from hwtrace.flow.loaders import load_elf
    hw = FIXTURES
    fx = hw / "drpt2trace_simple"
    image = Image()
    load_elf(image, str(fx / "hello"))
    cfg = FlowConfig(errata=cpumod.errata(
        cpumod.Cpu.parse("6/85/4")), mtc_freq=3, nom_freq=37,
        cpuid_0x15_eax=2, cpuid_0x15_ebx=308)
    yield "drpt2trace", (fx / "pt.bin").read_bytes(), image, cfg
    hase = hw / "hase_loopy"
    bundle = tmp / "hase"
    run_hwtrace("import", "-o", bundle, "--image", hase / "loopy",
                hase / "loopy-20180404T162955.perf", check=True)
    m = json.loads((bundle / "manifest.json").read_text())
    image = Image()
    load_elf(image, str(hase / "loopy"))
    c = m["cpu"]
    cfg = _timing_cfg(bundle, FlowConfig(errata=cpumod.errata(
        cpumod.Cpu.parse(f"{c['family']}/{c['model']}"))))
    for s in m["streams"]:
        yield f"hase {s['file']}", (bundle / s["file"]).read_bytes(), \
            image, cfg


def test_hardware_captures_identical(tmp_path, hardware):
    """Real Intel PT (MTC/CYC/TSC on, syscalls and the exit as FUP +
    TIP.PGD, SKD022's workaround on): the compiled core decodes them, to
    the twin's counts, errors and edges."""
    compiled_flow_core()
    seen = 0
    for name, data, image, cfg in _hardware_cases(tmp_path):
        for decoder in ("block", "insn"):
            c = fast.count(data, image, cfg, decoder)
            p = fast.count(data, image, cfg, decoder, impl="python")
            assert c[:2] + c[4:] == p[:2] + p[4:], (name, decoder)
            assert c.compiled and p.insns > 0, name
        e = fast.edges(data, image, cfg)
        pe = fast.edges(data, image, cfg, impl="python")
        assert e.compiled and (e.counts, e.insns) == (pe.counts, pe.insns)
        seen += 1
    assert seen >= 2


def test_hardware_mutations_identical(tmp_path, hardware):
    """Seeded mutations of the real captures (their FUP+TIP.PGD, MTC/CYC
    sequences broken up): both paths agree, every one decoded by the
    core."""
    compiled_flow_core()
    rng = random.Random(88)
    for name, data, image, cfg in _hardware_cases(tmp_path):
        for _ in range(40):
            m = _mutate(data, rng)
            for decoder in ("block", "insn"):
                c = fast.count(m, image, cfg, decoder)
                p = fast.count(m, image, cfg, decoder, impl="python")
                assert c.compiled
                assert c[:2] + c[4:] == p[:2] + p[4:], (name, decoder)
            e = fast.edges(m, image, cfg)
            pe = fast.edges(m, image, cfg, impl="python")
            assert e.compiled
            assert (e.counts, e.insns) == (pe.counts, pe.insns), name


def test_bundle_quiet_stat_compiled(tmp_path):
    """``hwtrace decode --quiet --stat DIR`` of a cpu-mode recording (its
    streams switch address spaces by the sideband): the compiled core
    counts it, called back into the Python switcher, to the same output as
    the Python decoders (HWTRACE_NO_EXTENSIONS=1)."""
    compiled_flow_core()
    text = tmp_path / "in.txt"
    text.write_bytes((Path(__file__).read_bytes() * 4)[:4096])
    out = tmp_path / "b"
    r = run_hwtrace("record", "--mode", "cpu", "--copy-images", "--config",
                    "branch;user;tsc;mtc;cyc", "-o", out, "--",
                    "/bin/sh", "-c", f"gzip -9 -c {text} | wc -c",
                    timeout=300)
    if r.returncode != 0:
        _need("emulated engine", r.stderr.strip()[-300:])
    for extra in ([], ["--insn-decoder", "--resync-on-error"]):
        a = run_hwtrace("decode", "--quiet", "--stat", *extra, out)
        b = run_hwtrace("decode", "--quiet", "--stat", *extra, out,
                        env={"HWTRACE_NO_EXTENSIONS": "1"})
        assert a.returncode == b.returncode == 0, (a.stderr, b.stderr)
        assert a.stdout == b.stdout
        assert "insn: " in a.stdout and a.stdout.count("[stream ") >= 1


_CHAIN_CHECK_RUN = r"""
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import flowdiff
from hwtrace.flow import fast
assert fast._core("compiled").__file__.startswith(sys.argv[2])
n = 0
for data in flowdiff._fixture_seeds(Path(sys.argv[3]), 64 << 10):
    flowdiff.check(data)
    n += 1
print("inputs", n)
"""


def test_chain_check_build(tmp_path):
    """The chain cache's shortcut past its table (core/chain.c: the last
    chain's successor) checked against the table on every use: the core
    built with -DCHAIN_CHECK runs flowdiff's seeds from the hardware
    captures (counts and edges against the twin) with no failed check, and
    the shortcut is taken there."""
    import shutil
    import subprocess
    import sys
    import sysconfig
    from conftest import FIXTURES
    from hwtrace._ext import sources
    if not FIXTURES.is_dir():
        pytest.skip("hardware fixtures unavailable")
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    core = compiled_flow_core()
    pkg = Path(fast.__file__).parent.parent
    copy = tmp_path / "hwtrace"
    shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("__pycache__"))
    src = copy / "flow" / "_c_flow.c"
    so = Path(core.__file__).name
    r = subprocess.run(
        [cc, "-O1", "-std=c11", "-shared", "-fPIC", "-DCHAIN_CHECK",
         f"-I{sysconfig.get_paths()['include']}",
         f'-DHWTRACE_SOURCE_SHA256="{sources.fingerprint(src)}"',
         *map(str, sources.sources(src)), "-o", str(copy / "flow" / so)],
        capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    fuzz = Path(__file__).resolve().parent.parent / "fuzz"
    r = subprocess.run(
        [sys.executable, "-c", _CHAIN_CHECK_RUN, str(fuzz), str(copy),
         str(FIXTURES)],
        capture_output=True, text=True, timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "inputs" in r.stdout
    last = [ln for ln in r.stderr.splitlines()
            if ln.startswith("chain check:")][-1].split()
    assert int(last[2]) > 0, last


def test_a_trace_cut_anywhere_decodes_as_libipt(gzip_trace, ptoracle, tmp_path):
    """A stop-on-full buffer ends where it filled, mid-packet.  libipt
    reads ahead by opcodes: after the last TNT bit cached it takes a branch
    or event packet cut short for the next packet, and goes on to the next
    instruction that needs it (an indirect branch, the next conditional
    one); only no byte left, a cut opcode or a cut status packet is the end
    there.  Both decoders stopped at the last bit: 628 of 1,972 cuts of six
    recorded windows decoded fewer instructions than libipt.  Every cut of
    windows of the trace: the instructions of the compiled core and the
    twin, block and instruction decoders, equal libipt's."""
    compiled_flow_core()
    data, image, cfg = gzip_trace
    argv = []
    for m in image.mappings():
        argv += ["--raw", f"{m.section.name}:{m.offset:#x}-"
                          f"{m.offset + m.end - m.begin:#x}:{m.begin:#x}"]
    if cfg.errata.bdm70:
        argv += ["--cpu", "6/106"]
    psb = bytes([2, 0x82] * 8)
    for frac in (3, 2):
        at = data.find(psb, len(data) // frac)
        assert at >= 0
        window = data[at:at + 160]
        piece = tmp_path / "piece.pt"
        for n in range(17, len(window) + 1):
            piece.write_bytes(window[:n])
            r = subprocess.run([str(ptoracle), "insn", str(piece), *argv, "--summary"],
                               capture_output=True, text=True, check=True)
            ref = json.loads(r.stdout.splitlines()[-1])
            for impl in ("compiled", "python"):
                for dec in ("insn", "block"):
                    c = fast.count(window[:n], image, cfg, dec, impl=impl)
                    assert (c.insns, c.errors) == (ref["insns"], ref["errors"]), \
                        (at, n, impl, dec)


def test_regression_a_psb_plus_cut_by_the_end_after_tracing_stopped_is_the_end():
    """libiptdiff: tracing stops (TIP.PGD), a PSB follows and the trace ends
    inside its PSB+ (no PSBEND).  libipt reads the PSB+ ahead as a status
    packet, runs out of trace there and takes that as the end (it moves to
    the end: no packet next); both decoders stayed at the PSB and, tracing
    off, reported "expected tracing enabled event" for every such cut."""
    compiled_flow_core()
    image = Image()
    image.add_bytes(bytes.fromhex("7e02909090f4"), 0x100000)  # jle +2; nops
    psb = bytes([2, 0x82] * 8)
    trace = (psb + bytes.fromhex("9901 9921 7d000010000000 0223 210200") +
             psb + bytes.fromhex("9901 7d0300100000"))   # the FUP cut
    for n in range(len(psb) + 32, len(trace) + 1):   # the second PSB on
        for impl in ("compiled", "python"):
            for dec in ("insn", "block"):
                c = fast.count(trace[:n], image, FlowConfig(), dec, impl=impl)
                assert (c.insns, c.errors) == (1, 0), (n, impl, dec)
