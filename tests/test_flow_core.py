"""The compiled flow core (hwtrace.flow._c_flow, flow/core/) against its
Python twin, and regression tests for what fuzzing the pair found
(fuzz/flowdiff.py): each names the behaviour."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import CORPUS, compiled_flow_core

from hwtrace.flow import batches as B
from hwtrace.flow import fast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fuzz"))
import flowdiff  # noqa: E402


def _core():
    fast.STATUS.check()
    return compiled_flow_core()


def _both(data: bytes):
    """Both producers over a flowdiff input: (python, compiled) collections
    (records, insns, items, complete); raises if they differ."""
    trace, image, cfg, block, resync = flowdiff.parse(data)
    dec = "block" if block else "insn"
    cap = flowdiff.flow_items(data)
    py = flowdiff.collect(B.batches(trace, image, cfg, decoder=dec,
                                    resync=resync, want_insns=True,
                                    impl="python"), cap)
    c = flowdiff.collect(B.batches(trace, image, cfg, decoder=dec,
                                   resync=resync, want_insns=True,
                                   max_records=7, impl="compiled"), cap)
    flowdiff.compare(py, c)
    return py, c


def test_core_loaded():
    _core()
    assert hasattr(fast.CORE or fast._core("compiled"), "decode_batches")


def test_regression_resync_does_not_repeat_a_failed_event():
    """A disable event that cannot be applied (tracing already off:
    unexpected packet context) while resynchronizing on errors: resync
    handed the same event out again, which failed again -- for ever (both
    twins).  Now the event that failed is dropped and resync looks on."""
    _core()
    from hwtrace.flow.config import FlowConfig
    from hwtrace.pt.cpu import Errata
    cfg = FlowConfig(errata=Errata(bdm70=True, skd022=True, skz84=True))
    trace = bytes.fromhex(
        "028202820282028202820282028202827d0000100000ffffff7f0000009901"
        "022302730101010100003d01000101022302730101010100003d010001")
    data = flowdiff.make_input(trace, [(0x100000, b"\x00\x00")], cfg,
                               block=True, resync=True)
    py, c = _both(data)
    assert py[3] and c[3]                       # both ended
    errors = [i for i in py[2] if i[2][0] == "ErrorItem"]
    assert 1 <= len(errors) < 10


def test_regression_resync_does_not_restart_at_a_failed_status_update():
    """A PSB+ status update that cannot be applied (bad status update)
    while resynchronizing on errors: resync started over at that PSB,
    delivering the same status update, which failed again -- for ever
    (both twins).  The failed event is dropped instead.  (The fuzz input,
    fuzz/flowdiff.py's format: block decoder, resync on error; libipt
    2.3's strict reading, where such a status update is an error.)"""
    _core()
    data = bytes.fromhex(
        "030029000000000000000000001000000000007e02909090f402820282028202"
        "820282028202820282990199217d0000000001060000000099017d0000100000"
        "0099210223710000100000003d010001001000000000007e02909090f4028202"
        "82028202820282028202820282990199217d0000100000000223210200028202"
        "8202820282028202820282028299")
    data = data[:1] + bytes([data[1] | flowdiff.F2_STRICT]) + data[2:]
    py, c = _both(data)
    assert py[3] and c[3]
    errors = [i[2] for i in py[2] if i[2][0] == "ErrorItem"]
    assert errors[0][-1] == ("str", "bad status update")
    assert len(errors) < 10


def test_regression_resync_does_not_resume_twice_at_an_event():
    """A PTWRITE event with an IP pending when the instruction before it
    cannot be decoded, resynchronizing on errors: resync resumed at the
    event's IP, the instruction there did not decode either, and resync
    resumed at the same event again -- for ever (both twins).  An event
    resync has resumed at is dropped by the next resync now.  (The fuzz
    input: instruction decoder, resync on error.)"""
    _core()
    data = bytes.fromhex(
        "0200290200000000000000010200000000001000000000000282028202820282"
        "02820282028202829090f30faee0f3480faee090f40282028202820282028202"
        "82028202827d000010000000990102230292cdab00003d010002b209ef000000"
        "0000003d05003d0b0001f4028202820282028202820282028202827d00001000"
        "00009901022302730101010100003d010001")
    py, c = _both(data)
    assert py[3] and c[3]
    errors = [i[2] for i in py[2] if i[2][0] == "ErrorItem"]
    assert errors[0][-1] == ("str", "unknown instruction")
    assert len(errors) < 10


def test_regression_block_walk_error_in_a_chains_open_block():
    """The counts path's block walk (walk.c walk_blocks) applying a TNT
    chain that leaves a block open -- a loop's exit branch ends the last
    block it closes (jg at 0x400ba7), the next block (mov; nop; leave) is
    still open at the return the chain stops before -- and the return
    failing (bad compressed return: no call), resynchronizing on errors:
    the event whose error follows the resync reports the last whole
    block's end, as the twin's iter_blocks and the record path do.  The
    walk left the session's last IP at the chain's last instruction
    (0x400bbb, in the open block) instead.  (A flowdiff finding, seed 4,
    minimized: block decoder, resync on error.)"""
    _core()
    data = bytes.fromhex(
        "0300290200000000000000011d000000a00b400000000000817df40f2700007f"
        "0a8345fc018345f401ebedc605c32420000190c9c30282028202820282028202"
        "820282028299017da70b4000000002235d35b01022a8d18080808080808080")
    flowdiff.check(data)        # batches, and counts against the twin's
    trace, image, cfg, block, resync = flowdiff.parse(data)
    assert block and resync
    got = fast.count(trace, image, cfg, "block", impl="compiled",
                     resync=True)
    assert [e[2] for e in got.error_items] == [0x400bbc, 0x400ba7,
                                               0x400ba7]
    assert [e[3] for e in got.error_items][:2] == [
        "bad compressed return", "unexpected packet context"]
    assert (got.insns, got.blocks) == (10, 3)


# -- the proof: corpus, real captures, recordings -------------------------------
#
# Every decode below runs the compiled core (impl="compiled": it raises if
# the core is not there) and is compared with the Python twin's batches,
# batch by batch: the same records, instructions, items (events attribute
# for attribute) and batch boundaries.

from conftest import FIXTURES, _need, run_hwtrace  # noqa: E402
from ptxed_corpus import (decode_inputs, normalize,  # noqa: E402
                          ptxed_variants, variant_id)

VARIANTS = list(ptxed_variants()) if CORPUS.is_dir() else []


def _key(x):
    from hwtrace.flow.events import Event
    if isinstance(x, Event):
        return ("Event",) + flowdiff._event_key(x)
    return (type(x).__name__,) + tuple((type(v).__name__, v) for v in x)


def _batches(data, image, cfg, decoder, resync, impl, max_records=1 << 16,
             spaces=None):
    return [(b.blocks.tobytes(),
             None if b.insns is None else b.insns.tobytes(),
             [(i, o, _key(x)) for i, o, x in b.items], b.first_insn)
            for b in B.batches(data, image, cfg, decoder=decoder,
                               resync=resync, want_insns=True,
                               max_records=max_records, impl=impl,
                               spaces=spaces)]


def _same(data, image, cfg, decoder, resync=False, max_records=1 << 16):
    c = _batches(data, image, cfg, decoder, resync, "compiled", max_records)
    p = _batches(data, image, cfg, decoder, resync, "python", max_records)
    assert c == p
    return c


@pytest.mark.parametrize("decoder", ["insn", "block"])
def test_corpus_compiled_batches_are_the_twins(decoder):
    """All 430 ptxed variants with this decoder, as ptxed runs them and
    with --resync-on-error, in batches of 1, 3 and the default size: the
    compiled core's batches are the Python twin's."""
    _core()
    if not VARIANTS:
        _need("corpus", f"{CORPUS} missing")
    n = 0
    for k, (d, v, _m) in enumerate(VARIANTS):
        data, image, cfg, dec, resync, _a = decode_inputs(d, v, decoder)
        size = (1, 3, 1 << 16)[k % 3]
        _same(data, image, cfg, dec, resync, size)
        _same(data, image, cfg, dec, True, size)
        n += 1
    assert n == 430


@pytest.mark.parametrize("decoder", ["insn", "block"])
def test_corpus_compiled_batches_print_the_ptxed_expectations(decoder):
    """Replayed into the ptxed sink, the compiled core's batches print each
    variant's expected ptxed output (diff -ub rules)."""
    from hwtrace.flow import sinks
    from hwtrace.pt import cpu as cpumod
    from hwtrace.pt.errors import PtError
    _core()
    if not VARIANTS:
        _need("corpus", f"{CORPUS} missing")
    bad, n = [], 0
    for d, v, _m in VARIANTS:
        data, image, cfg, dec, resync, args = decode_inputs(d, v, decoder)
        if args.stat or args.stat_insn or args.stat_blocks:
            continue            # statistics lines come from the CLI
        if cfg.cpu is not None and isinstance(cpumod.errata(cfg.cpu),
                                              PtError):
            continue            # the config error line comes from the CLI
        out = []
        sink = sinks.PtxedSink(out.append, event_ip=args.event_ip,
                               event_time=args.event_time,
                               print_offset=args.offset,
                               show_blocks=args.show_blocks)
        B.replay(B.batches(data, image, cfg, decoder=dec, resync=resync,
                           want_insns=True, impl="compiled"), sink, dec)
        n += 1
        if normalize("".join(out)) != normalize(
                (d / v["exp"]["ptxed"]).read_text()):
            bad.append(variant_id(v))
    assert not bad
    assert n > 400


def _capture_cases(tmp: Path):
    """(name, trace, image, config) of every real capture with code to
    decode it with, and of the ones without (an empty image: errors)."""
    from hwtrace.bundle import Bundle
    from hwtrace.flow.config import FlowConfig
    from hwtrace.flow.image import Image
    from hwtrace.flow.loaders import load_elf
    from hwtrace.pt import cpu as cpumod

    if not FIXTURES.is_dir():
        _need("fixtures", f"{FIXTURES} missing")

    def cfg(cpu, timing=None):
        c = FlowConfig(errata=cpumod.errata(cpumod.Cpu.parse(cpu)))
        if timing:
            (c.mtc_freq, c.nom_freq, c.cpuid_0x15_eax,
             c.cpuid_0x15_ebx) = timing
        return c

    def image(*elfs):
        im = Image()
        for e in elfs:
            load_elf(im, str(e))
        return im

    drpt = FIXTURES / "drpt2trace_simple"
    yield ("drpt2trace", (drpt / "pt.bin").read_bytes(),
           image(drpt / "hello"), cfg("6/85/4", (3, 37, 2, 308)))
    lldb = FIXTURES / "lldb_intelpt"
    mc = lldb / "intelpt-multi-core-trace"
    for core in ("45", "51"):
        yield (f"lldb cpu {core}",
               (mc / "cores" / f"{core}.intelpt_trace").read_bytes(),
               image(f"{mc}/modules/m.out:0x400000"), cfg("6/85/4"))
    yield ("lldb thread", (lldb / "intelpt-trace" / "3842849.trace")
           .read_bytes(), image(f"{lldb}/intelpt-trace/a.out:0x400000"),
           cfg("6/79/1"))
    mf = lldb / "intelpt-trace-multi-file"
    yield ("lldb multi-file", (mf / "multi-file.trace").read_bytes(),
           image(f"{mf}/a.out:0x400000", f"{mf}/libfoo.so:0x7ffff7bd9000",
                 f"{mf}/libbar.so:0x7ffff79d7000"), cfg("6/79/1"))
    yield ("raw_no_binary", (FIXTURES / "raw_no_binary" /
                             "traced_data.bin").read_bytes(), Image(),
           FlowConfig())
    # perf.data captures, imported: hase_loopy with its binary, the
    # perf_data_converter ones (no binaries: the errors must agree)
    hase = FIXTURES / "hase_loopy"
    imports = [("hase", [hase / "loopy-20180404T162955.perf", "--image",
                         hase / "loopy"], image(hase / "loopy"))]
    pdc = FIXTURES / "perf_data_converter"
    for f in ("perf.data.intel_pt-4.14", "perf.data.piped.intel_pt-4.14"):
        imports.append((f, [pdc / f], Image()))
    for name, argv, im in imports:
        out = tmp / name
        run_hwtrace("import", *argv, "-o", out, check=True)
        b = Bundle(out)
        c = b.manifest.get("cpu") or {}
        for s in b.streams:
            config = cfg(f"{c['family']}/{c['model']}", tuple(
                b.manifest.get(k, 0) for k in ("mtc_freq", "nom_freq",
                                               "cpuid_0x15_eax",
                                               "cpuid_0x15_ebx")))
            yield f"{name} {s.file}", b.read_stream(s), im, config


def test_every_real_capture_compiled_batches_are_the_twins(tmp_path):
    """Every real capture in ../shared/fixtures/hardware, both decoders,
    with and without resync and libipt 2.3's strict reading: the compiled
    core decodes it (it raises otherwise), to the twin's batches."""
    _core()
    names = []
    for name, data, image, cfg in _capture_cases(tmp_path):
        for decoder in ("insn", "block"):
            for resync, strict in ((False, False), (True, True)):
                c = cfg.replace(strict=strict)
                _same(data, image, c, decoder, resync)
        counts = fast.count(data, image, cfg, "insn", impl="compiled")
        assert counts.compiled
        names.append((name, counts.insns))
    got = dict(names)
    # libipt 2.0.5's counts where the lossless reading does not differ
    assert got["lldb cpu 45"] == 61825 and got["lldb thread"] == 21
    assert got["drpt2trace"] == 8
    assert len(names) >= 10, names


def _record(tmp: Path, mode: str,
            config: str = "branch;user;tsc;mtc;cyc") -> Path:
    out = tmp / f"b-{mode}"
    text = tmp / "in.txt"
    text.write_bytes((Path(__file__).read_bytes() * 4)[:8192])
    r = run_hwtrace("record", "--mode", mode, "--copy-images", "--config",
                    config, "-o", out, "--",
                    "/usr/bin/gzip", "-9", "-f", str(text), timeout=300)
    if r.returncode != 0:
        _need("emulated engine", r.stderr.strip()[-300:])
    return out


@pytest.mark.parametrize("mode,config", [
    ("thread", "branch;user;tsc;mtc;cyc"), ("cpu", "branch;user;tsc;mtc;cyc"),
    # record's default: MTCs with no CYC between the TNTs and TIPs, taken
    # by the walk's quick packet steps (query.h), with each record's time
    ("thread", "branch;user;retc;tsc;mtc"), ("cpu", "branch;user;retc;tsc;mtc")])
def test_recordings_compiled_batches_are_the_twins(tmp_path, mode, config):
    """A gzip recording with timing packets (TSC, MTC, CYC; or TSC and
    MTC), in thread and in cpu mode, every stream of the bundle opened as
    the commands open it (hwtrace.streams: images from the sideband,
    address spaces switched by the Python switcher the core calls back,
    each switch a SpaceItem): compiled batches == twin batches, both
    decoders, views included."""
    import hwtrace.streams as S
    _core()
    bundle = _record(tmp_path, mode, config)
    ts = S.open_bundle(bundle)
    total = 0
    for st in ts.streams:
        for decoder, view in (("insn", False), ("block", False),
                              ("block", True)):
            switches = {}

            def got(impl):
                sw = switches.setdefault(impl, [])
                return [(b.blocks.tobytes(), b.insns.tobytes(),
                         [(i, o, _key(x) if not isinstance(x, B.SpaceItem)
                           else ("SpaceItem", x.space.pid, x.offset))
                          for i, o, x in b.items],
                         b.first_insn)
                        for b in st.batches(decoder, view=view,
                                            want_insns=True, impl=impl,
                                            space_items=True,
                                            on_switch=lambda sp, off:
                                            sw.append((sp.pid, off)))]
            c, p = got("compiled"), got("python")
            assert c == p, (st.name, decoder, view)
            assert switches["compiled"] == switches["python"]
            spaces = [x for b in c for x in b[2] if x[2][0] == "SpaceItem"]
            assert spaces and spaces[0][0] == 0
            total += sum(len(x[1]) // 10 for x in c)
    assert total > 100000


def test_vm_traces_compiled_batches_are_the_twins():
    """The synthetic VM-exit/entry traces of the lossless reading
    (tests/vmtraces.py: PSB+ at VM entries with MODE.TSX, PIP, VMCS, CBR,
    TNT bits pending across them, PSB+s without FUP), strict and not,
    both decoders: the compiled core's batches are the twin's."""
    import vmtraces
    from hwtrace.flow.config import FlowConfig
    from hwtrace.flow.image import Image
    _core()
    image = Image()
    image.add_bytes(vmtraces.CODE, vmtraces.BASE)
    gens = vmtraces.vm_variants() + vmtraces.mixed_variants() + \
        vmtraces.mixed_variants(late_tnt=True) + \
        vmtraces.mixed_variants(nofup=True)
    n = 0
    for name, g in gens:
        data, _truth = g.end()
        for decoder in ("insn", "block"):
            for strict in (False, True):
                _same(data, image, FlowConfig(strict=strict), decoder)
                n += 1
    assert n == 4 * len(gens) >= 4 * 168


def test_fingerprint_covers_every_source_of_the_core(tmp_path):
    """One extension from several C files: the staleness fingerprint (the
    same computation in setup.py and hwtrace._ext) covers _c_flow.c,
    every file in flow/core/ and the headers they include (the packet
    header, the shared owning-buffer type), and
    changes when any of them does; the built core carries it."""
    import shutil
    from hwtrace._ext import sources
    core_mod = fast.CORE or fast._core("compiled")
    src = Path(fast.__file__).with_name("_c_flow.c")
    names = {p.relative_to(src.parent.parent).as_posix()
             for p in sources.inputs(src)}
    assert {"flow/_c_flow.c", "flow/core/session.c", "flow/core/query.h",
            "flow/core/walk.c", "pt/_pt_packets.h", "_ext/ownbuf.h"} <= names
    assert [p.name for p in sources.sources(src)][0] == "_c_flow.c"
    assert len(sources.sources(src)) >= 12
    assert core_mod.SOURCE_SHA256 == sources.fingerprint(src)
    # a copy of the package: touching any one file changes the fingerprint
    pkg = tmp_path / "hwtrace"
    shutil.copytree(src.parent.parent / "flow", pkg / "flow",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copytree(src.parent.parent / "pt", pkg / "pt",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copytree(src.parent.parent / "_ext", pkg / "_ext",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    copy = pkg / "flow" / "_c_flow.c"
    base = sources.fingerprint(copy)
    assert base == sources.fingerprint(src)
    for rel in ("flow/core/insn.c", "flow/core/block.h", "pt/_pt_packets.h",
                "_ext/ownbuf.h"):
        f = pkg / rel
        old = f.read_bytes()
        f.write_bytes(old + b"\n")
        assert sources.fingerprint(copy) != base, rel
        f.write_bytes(old)
    assert sources.fingerprint(copy) == base


def test_hooks_event_types_filter():
    """set_hooks(after_sync, after_event, event_types): after_event is
    called for those types only (a switcher's few; the many others, a
    PSB+'s status updates, make no Event), the counts are unchanged, and
    an unknown type name is refused."""
    _core()
    seeds = flowdiff._corpus_seeds(CORPUS, 1 << 16)
    if not seeds:
        pytest.skip("libipt corpus unavailable")
    seen_all, seen_some, checked = [], [], 0
    for data in seeds[:60]:
        trace, image, cfg, block, resync = flowdiff.parse(data)
        got = []
        for types, seen in ((None, seen_all), (["enabled", "disabled"],
                                               seen_some)):
            dec = fast.core_decoder(trace, image, cfg, block=block,
                                    resync=resync, plain_offsets=True)
            mark = len(seen)
            dec.set_hooks(None, lambda d, ev: seen.append(ev.type), types)
            got.append((dec.counts(), seen[mark:]))
        (c_all, t_all), (c_some, t_some) = got
        assert c_all == c_some
        assert t_some == [t for t in t_all if t in ("enabled", "disabled")]
        checked += 1
    assert checked and any(t not in ("enabled", "disabled")
                           for t in seen_all) and seen_some
    dec = fast.core_decoder(trace, image, cfg)
    with pytest.raises(ValueError):
        dec.set_hooks(None, lambda d, ev: None, ["no such event"])
