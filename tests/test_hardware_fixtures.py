"""Every real capture in ../shared/fixtures/hardware, through hwtrace's
default paths, against libipt (the live ``ptoracle``, Debian's 2.0.5) and
the fixture's own expectations.

- packets: every stream, ``hwtrace dump --format jsonl`` (the compiled
  packet decoder where built) equals ``ptoracle pkt`` with the capture's
  CPU (2.0.5 has no MODE.EXEC ``iflag`` field: dropped);
- flow, where the traced binaries are there: the stream as a bundle
  (``hwtrace import``) or a raw trace with its images, ``hwtrace decode
  --quiet --stat`` (the compiled flow core) equals libipt's instruction
  count and error offsets;
- a capture directory nobody tests fails :func:`test_every_capture_is_tested`.

:func:`test_compiled_core_takes_the_capture`: the compiled core decodes
every flow capture itself (the LLDB ones carry MODE.TSX inside PSB+), to
the Python twin's counts, errors and batches.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import FIXTURES, IN_CI, run_hwtrace

PDC = FIXTURES / "perf_data_converter"
DRPT = FIXTURES / "drpt2trace_simple"
HASE = FIXTURES / "hase_loopy"
RAW = FIXTURES / "raw_no_binary"
LLDB = FIXTURES / "lldb_intelpt"
pytestmark = pytest.mark.usefixtures("hardware")   # every test reads them
DRPT_OPTS = ["--cpu", "6/85/4", "--mtc-freq", "3", "--nom-freq", "37",
             "--cpuid-0x15.eax", "2", "--cpuid-0x15.ebx", "308"]

# capture directory -> what tests it here
TESTED = {
    "perf_data_converter": "packets of both layouts' imported streams",
    "drpt2trace_simple": "packets; flow: the 8 instructions",
    "hase_loopy": "packets; flow of the imported bundle",
    "raw_no_binary": "packets",
    "lldb_intelpt": "packets; flow of the three imported LLDB traces",
}


def _need(path: Path):
    if not path.exists():
        if IN_CI:
            pytest.fail(f"{path} missing in CI")
        pytest.skip(f"{path} missing")


def test_every_capture_is_tested():
    _need(FIXTURES)
    dirs = {p.name for p in FIXTURES.iterdir() if p.is_dir()}
    assert dirs == set(TESTED)


# -- packets -------------------------------------------------------------------

def _dump(pt: Path, cpu):
    args = ["dump", "--format", "jsonl", str(pt)]
    if cpu:
        args += ["--cpu", cpu]
    r = run_hwtrace(*args)
    assert r.returncode == 0, r.stderr
    out = []
    for line in r.stdout.splitlines():
        o = json.loads(line)
        o.pop("iflag", None)
        out.append(o)
    return out


def _pkt_oracle(ptoracle, pt: Path, cpu):
    args = [str(ptoracle), "pkt", str(pt)] + (["--cpu", cpu] if cpu else [])
    r = subprocess.run(args, capture_output=True, text=True, check=True)
    return [json.loads(x) for x in r.stdout.splitlines() if x.strip()]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """Bundles of the perf.data and LLDB captures, imported once."""
    base = tmp_path_factory.mktemp("hw")
    out = {}
    for name, src, extra in (
            ("pdc-file", PDC / "perf.data.intel_pt-4.14", ()),
            ("pdc-pipe", PDC / "perf.data.piped.intel_pt-4.14", ()),
            ("hase", HASE / "loopy-20180404T162955.perf",
             ("--image", HASE / "loopy")),
            ("lldb-multi", LLDB / "intelpt-multi-core-trace" / "trace.json",
             ()),
            ("lldb-single", LLDB / "intelpt-trace" / "trace.json", ())):
        if not src.exists():
            continue
        r = run_hwtrace("import", src, "-o", base / name, *extra)
        assert r.returncode == 0, r.stderr
        out[name] = base / name
    return out


def _streams(bundle: Path):
    from hwtrace.bundle import Bundle
    b = Bundle(bundle)
    cpu = b.decoder_args()[1] if b.decoder_args()[:1] == ["--cpu"] else None
    return [(b.stream_path(s), cpu) for s in b.streams]


def test_packets_of_every_stream(ptoracle, imported):
    _need(FIXTURES)
    cases = [(RAW / "traced_data.bin", None), (DRPT / "pt.bin", "6/85/4")]
    for name in ("pdc-file", "pdc-pipe", "hase", "lldb-multi", "lldb-single"):
        cases += _streams(imported[name])
    mf = LLDB / "intelpt-trace-multi-file" / "multi-file.trace"
    cases.append((mf, "6/79/1"))
    total = 0
    for pt, cpu in cases:
        want = _pkt_oracle(ptoracle, pt, cpu)
        assert _dump(pt, cpu) == want, pt
        assert not any("error" in x for x in want[1:]), pt
        total += len(want)
    assert len(cases) == 11 and total > 10000


# -- flow ----------------------------------------------------------------------

def _stat(*args):
    """{stream or None: (insns, [(offset, message)])} of ``decode --quiet
    --stat`` at libipt 2.0's error offsets."""
    r = run_hwtrace("decode", "--quiet", "--stat", "--error-offsets", "2.0",
                    *map(str, args))
    assert r.returncode == 0, r.stderr
    out, stream = {}, None
    for line in r.stdout.splitlines():
        if line.startswith("[stream "):
            stream = line[8:-1]
            out[stream] = [0, []]
            continue
        out.setdefault(stream, [0, []])
        if line.startswith("insn: "):
            out[stream][0] = int(line[6:-1])
        elif line.startswith("[") and ": error: " in line:
            where, msg = line[1:-1].split(": error: ")
            out[stream][1].append((int(where.split(", ")[0], 16), msg))
    return {k: tuple(v) for k, v in out.items()}


def _insn_oracle(ptoracle, pt, *args):
    r = subprocess.run([str(ptoracle), "insn", str(pt), *map(str, args)],
                       capture_output=True, text=True, check=True)
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    return (sum(1 for x in lines if "iclass" in x and "error" not in x),
            [(x["offset"], x["error"]) for x in lines if "error" in x])


def test_flow_drpt2trace(ptoracle):
    _need(DRPT)
    got = _stat("--pt", DRPT / "pt.bin", "--elf", DRPT / "hello", *DRPT_OPTS)
    want = _insn_oracle(ptoracle, DRPT / "pt.bin", "--elf", DRPT / "hello",
                        *DRPT_OPTS)
    assert got == {None: want} == {None: (8, [])}


def test_flow_hase_loopy(ptoracle, imported):
    _need(HASE)
    from hwtrace.bundle import Bundle
    b = Bundle(imported["hase"])
    (pt, _), = _streams(imported["hase"])
    images = run_hwtrace("images", "--pt", pt.name, imported["hase"])
    assert images.returncode == 0, images.stderr
    want = _insn_oracle(ptoracle, pt, *b.decoder_args(),
                        *images.stdout.split())
    assert want[0] == 57 and want[1] == []
    assert _stat(imported["hase"]) == {"cpu2.pt": want}


def test_flow_lldb_traces(ptoracle, imported, tmp_path):
    _need(LLDB)
    multi = LLDB / "intelpt-multi-core-trace"
    got = _stat(imported["lldb-multi"])
    for cpu, n in ((45, 61825), (51, 19521)):
        want = _insn_oracle(ptoracle, multi / "cores" / f"{cpu}.intelpt_trace",
                            "--elf", multi / "modules" / "m.out", "--cpu",
                            "6/85/4")
        assert got[f"cpu{cpu}.pt"] == want and want[0] == n
    single = LLDB / "intelpt-trace"
    assert _stat(imported["lldb-single"]) == {"tid3842849.pt": _insn_oracle(
        ptoracle, single / "3842849.trace", "--elf", single / "a.out",
        "--cpu", "6/79/1")} == {"tid3842849.pt": (21, [])}
    # the multi-file capture with LLDB's description of it
    from test_import_lldb import MULTIFILE, MULTIFILE_JSON
    d = tmp_path / "saved"
    d.mkdir()
    for f in ("a.out", "libfoo.so", "libbar.so", "multi-file.trace"):
        shutil.copy(MULTIFILE / f, d / f)
    (d / "trace.json").write_text(json.dumps(MULTIFILE_JSON))
    assert run_hwtrace("import", d, "-o", tmp_path / "b").returncode == 0
    want = _insn_oracle(ptoracle, MULTIFILE / "multi-file.trace",
                        "--elf", MULTIFILE / "a.out",
                        "--elf", f"{MULTIFILE / 'libfoo.so'}:0x7ffff7bd9000",
                        "--elf", f"{MULTIFILE / 'libbar.so'}:0x7ffff79d7000",
                        "--cpu", "6/79/1")
    assert _stat(tmp_path / "b") == {"tid815455.pt": want}
    assert want[0] == 45


def _flow_case(name):
    """(trace bytes, Image, FlowConfig) of a flow capture."""
    from hwtrace.flow.config import FlowConfig
    from hwtrace.flow.image import Image
    from hwtrace.flow.loaders import load_elf
    from hwtrace.pt import cpu as cpumod
    multi = LLDB / "intelpt-multi-core-trace"
    pt, elfs, cpu, timing = {
        "drpt2trace": (DRPT / "pt.bin", [DRPT / "hello"], "6/85/4",
                       (3, 37, 2, 308)),
        "lldb-cpu45": (multi / "cores" / "45.intelpt_trace",
                       [multi / "modules" / "m.out"], "6/85/4", None),
        "lldb-cpu51": (multi / "cores" / "51.intelpt_trace",
                       [multi / "modules" / "m.out"], "6/85/4", None),
        "lldb-thread": (LLDB / "intelpt-trace" / "3842849.trace",
                        [LLDB / "intelpt-trace" / "a.out"], "6/79/1", None),
    }[name]
    _need(pt)
    image = Image()
    for e in elfs:
        load_elf(image, str(e))
    cfg = FlowConfig()
    cfg.errata = cpumod.errata(cpumod.Cpu.parse(cpu))
    if timing:
        (cfg.mtc_freq, cfg.nom_freq, cfg.cpuid_0x15_eax,
         cfg.cpuid_0x15_ebx) = timing
    return pt.read_bytes(), image, cfg


@pytest.mark.parametrize("name", ["drpt2trace", "lldb-cpu45", "lldb-cpu51",
                                  "lldb-thread"])
@pytest.mark.parametrize("decoder", ["block", "insn"])
def test_compiled_core_takes_the_capture(name, decoder):
    """The compiled core decodes the capture itself (MODE.TSX inside PSB+
    included), to the twin's counts, events and errors -- and to the twin's
    batches, record for record."""
    import numpy as np

    from hwtrace.flow import batches as B
    from hwtrace.flow import fast
    if fast.CORE is None:
        if IN_CI:
            pytest.fail("compiled flow core not built in CI")
        pytest.skip("compiled flow core not built")
    data, image, cfg = _flow_case(name)
    c = fast.count(data, image, cfg, decoder)
    py = fast.count(data, image, cfg, decoder, impl="python")
    assert c.compiled and not py.compiled
    assert c[:2] + c[4:] == py[:2] + py[4:]
    got = B.flatten(B.batches(data, image, cfg, decoder=decoder,
                              want_insns=True, impl="compiled"))
    want = B.flatten(B.batches(data, image, cfg, decoder=decoder,
                               want_insns=True, impl="python"))
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert [(i, o, repr(x)) for i, o, x in got[2]] == \
        [(i, o, repr(x)) for i, o, x in want[2]]
