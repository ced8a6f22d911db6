"""Fuzz targets: one ``check(data)`` per harness, plus its seed corpus.

Every target turns arbitrary bytes into a call of one hwtrace reader and
enforces the reader's contract:

- ``packets``   the packet decoder (``hwtrace.pt``): nothing raises for any
                bytes (decode errors are PtError values); the compiled core
                and the Python twin yield identical records, errors and
                resync points; ptdump formatting of the result never raises.
- ``flow``      the instruction/block flow decoders (``hwtrace.flow``) over
                a memory image and a trace, both taken from the input:
                nothing raises (errors are DecodeError values).
- ``perfdata``  the perf.data reader (``hwtrace.engines.perf.perfdata``):
                only ``PerfDataError`` escapes.
- ``perfimport`` perf.data -> bundle (``hwtrace import``): only
                PerfDataError / BundleError escape; what it writes reads back.
- ``recover``   ``hwtrace recover`` over a trace directory with mutated
                persisted ToPA registers and sideband.
- ``bundle``    the bundle reader (``hwtrace.bundle``) over a directory the
                input describes: only ``BundleError`` escapes.
- ``lldbimport`` LLDB trace directory -> bundle (``hwtrace import
                trace.json``) over a directory the input describes (with
                planted FIFOs and links out): only LldbTraceError /
                BundleError escape; what it writes reads back.
- ``flowdiff``  the compiled flow core against its Python twin
                (:mod:`flowdiff`): the same batches, record for record.
- ``libiptdiff`` hwtrace's instruction decoder (``decode --format jsonl
                --error-offsets 2.0``) against libipt 2.0.5 (build/ptoracle,
                :mod:`libiptdiff`): the same instruction IPs and error offsets.

Seeds are built at run time from ../shared (the libipt corpus and the
hardware fixtures): nothing from there is copied into the repo.

The hang and memory limits are applied by the runner (:mod:`fuzz.run`),
the invariants here.  No global mutable state: per-run state (the bundle
scratch directory) lives in a :class:`Target` instance.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = Path(os.environ.get("HWTRACE_SHARED", HERE.parent.parent / "shared"))
CORPUS = SHARED / "corpus" / "libipt"
FIXTURES = SHARED / "fixtures" / "hardware"

#: Seeds larger than this are cut (fuzzing speed; the limit on decode time
#: is per 64 KiB, so smaller inputs lose nothing).
MAX_SEED = 64 << 10


def _scratch(given: str | None, prefix: str, owner) -> Path:
    """A scratch directory, removed when ``owner`` goes (unless given)."""
    if given:
        return Path(given)
    import shutil
    import weakref
    d = Path(tempfile.mkdtemp(prefix=prefix))
    weakref.finalize(owner, shutil.rmtree, d, True)
    return d


class Violation(AssertionError):
    """An invariant of a reader broke (not an expected, documented error)."""


def _corpus_variants():
    if not CORPUS.is_dir():
        return
    for d in sorted(CORPUS.iterdir()):
        meta = d / "meta.json"
        if meta.is_file():
            m = json.loads(meta.read_text())
            for v in m.get("variants", [])[:1]:
                yield d, v


def _flag_byte(name: str) -> int:
    return hashlib.sha256(name.encode()).digest()[0]


# ---------------------------------------------------------------- packets

def _packet_args(data: bytes):
    """(trace, errata, disabled, no_sync, mtc_freq, nom_freq) from a
    2-byte header: flags, nom_freq."""
    from hwtrace.pt.cpu import Errata
    if len(data) < 2:
        data = data + b"\0" * (2 - len(data))
    flags, nom = data[0], data[1]
    errata = Errata(skd007=bool(flags & 1), skz84=bool(flags & 2))
    disabled = ("cfe", "evd", "trig") if flags & 8 else ()
    return data[2:], errata, disabled, bool(flags & 4), flags >> 4, nom


def check_packets(data: bytes) -> None:
    from hwtrace.pt import _impl
    from hwtrace.pt.decoder import PacketDecoder
    from hwtrace.pt.errors import PtError
    from hwtrace.pt.ptdump_format import PtdumpOptions, ptdump_lines
    from hwtrace.pt.timing import TimingConfig

    trace, errata, disabled, no_sync, mtc, nom = _packet_args(data)
    py = PacketDecoder(trace, errata=errata, disabled=disabled, impl="python")
    got_py = list(py.packets(no_sync=no_sync))
    count_py = PacketDecoder(trace, errata=errata, disabled=disabled,
                             impl="python").count(no_sync=no_sync)
    want_count = (sum(p.__class__ is not PtError for p in got_py),
                  sum(p.__class__ is PtError for p in got_py))
    if count_py != want_count:
        raise Violation(f"python count {count_py} != packets {want_count}")
    if _impl.core_for(None) is not None or _impl.STATUS.expected:
        c = PacketDecoder(trace, errata=errata, disabled=disabled,
                          impl="compiled")
        got_c = list(c.packets(no_sync=no_sync))
        if got_c != got_py:
            first = next(i for i, (a, b) in enumerate(zip(got_c + [None] * len(got_py),
                                                          got_py + [None] * len(got_c)))
                         if a != b)
            raise Violation(f"compiled/python differ at record {first}: "
                            f"{got_c[first:first + 1]} vs {got_py[first:first + 1]}")
        count_c = PacketDecoder(trace, errata=errata, disabled=disabled,
                                impl="compiled").count(no_sync=no_sync)
        if count_c != want_count:
            raise Violation(f"compiled count {count_c} != packets {want_count}")
        # next() stepping from a few offsets, both ways
        for off in range(0, min(len(trace), 64), 7):
            for impl in ("python", "compiled"):
                d = PacketDecoder(trace, errata=errata, impl=impl)
                d.sync_set(off)
                r = d.next()
                if impl == "python":
                    ref = (r, d.offset)
                elif (r, d.offset) != ref:
                    raise Violation(f"next() at {off}: {ref} vs {(r, d.offset)}")
    opts = PtdumpOptions(show_last_ip=True, show_exec_mode=True,
                         show_time=bool(mtc & 1), show_tcal=bool(mtc & 2),
                         no_sync=no_sync)
    for _ in ptdump_lines(trace, opts, TimingConfig(mtc, nom, 2, nom + 1, errata)):
        pass


def seeds_packets() -> list[bytes]:
    out = []
    for d, v in _corpus_variants():
        pt = d / v["pt"]
        if pt.is_file():
            out.append(bytes([_flag_byte(v["pt"]), 0]) + pt.read_bytes()[:MAX_SEED])
    for p in (FIXTURES / "raw_no_binary" / "traced_data.bin",
              FIXTURES / "drpt2trace_simple" / "pt.bin",
              FIXTURES / "hase_loopy" / "loopy-20180404T162955.trace"):
        if p.is_file():
            out.append(bytes([0x30, 37]) + p.read_bytes()[:MAX_SEED])
    return out


# ---------------------------------------------------------------- flow

_FLOW_HDR = struct.Struct("<BBIQ")   # flags, mtc_freq, image length, vaddr


class StopDecoding(Exception):
    """Raised by the harness's sink once its output budget is spent."""


class _BudgetSink:
    """Counts everything and stops after ``budget`` items: a trace may
    legitimately describe an endless loop (``jmp .`` needs no packets)."""

    needs_offset = True

    def __init__(self, budget: int):
        self.left = budget

    def _take(self):
        self.left -= 1
        if self.left < 0:
            raise StopDecoding

    def insn(self, insn, offset):
        self._take()

    def block(self, block, offset):
        self._take()

    def event(self, ev, offset):
        self._take()

    def error(self, kind, offset, ip, code):
        self._take()

    def status(self, name, offset):
        self._take()


def flow_items(data: bytes) -> int:
    """Most items (insns, blocks, events, errors) one flow input may emit."""
    return 16 * len(data) + 10_000


def flow_input(image: bytes, vaddr: int, trace: bytes, flags: int = 0,
               mtc_freq: int = 0) -> bytes:
    return _FLOW_HDR.pack(flags, mtc_freq, len(image), vaddr) + image + trace


def check_flow(data: bytes) -> None:
    from hwtrace.flow import session
    from hwtrace.flow.block import BlockDecoder
    from hwtrace.flow.config import FlowConfig
    from hwtrace.flow.image import Image
    from hwtrace.flow.insn import InsnDecoder

    if len(data) < _FLOW_HDR.size:
        data = data + b"\0" * (_FLOW_HDR.size - len(data))
    flags, mtc, ilen, vaddr = _FLOW_HDR.unpack_from(data)
    body = data[_FLOW_HDR.size:]
    image_bytes, trace = body[:ilen], body[ilen:]
    image = Image()
    if image_bytes:
        image.add_bytes(image_bytes, vaddr & ((1 << 64) - 1))
        if flags & 0x40:        # a second, overlapping copy elsewhere
            image.add_bytes(image_bytes[: len(image_bytes) // 2],
                            (vaddr + len(image_bytes) // 3) & ((1 << 64) - 1))
    cfg = FlowConfig(mtc_freq=mtc & 0xF, nom_freq=mtc >> 4,
                     enable_tick_events=bool(flags & 4),
                     enable_iflags_events=bool(flags & 8),
                     end_on_call=bool(flags & 16), end_on_jump=bool(flags & 32))
    sink = _BudgetSink(flow_items(data))
    resync = bool(flags & 2)
    try:
        if flags & 1:
            session.run_blocks(BlockDecoder(trace, image, cfg), sink, resync=resync)
        else:
            session.run_insn(InsnDecoder(trace, image, cfg), sink, resync=resync)
    except StopDecoding:
        pass


def seeds_flow() -> list[bytes]:
    from hwtrace.flow.loaders import parse_c_number
    out = []
    for d, v in _corpus_variants():
        raw = v.get("raw") or []
        pt = d / v["pt"]
        if len(raw) != 1 or not pt.is_file():
            continue
        name, _, addr = raw[0].rpartition(":")
        img = d / name
        if not img.is_file():
            continue
        try:
            vaddr = parse_c_number(addr)
        except Exception:
            continue
        image = img.read_bytes()[:MAX_SEED]
        f = _flag_byte(v["pt"]) & 0x3F
        out.append(flow_input(image, vaddr, pt.read_bytes()[:MAX_SEED], f))
    return out


# ---------------------------------------------------------------- perfdata

def check_perfdata(data: bytes) -> None:
    from hwtrace.engines.perf.errors import PerfDataError
    from hwtrace.engines.perf.perfdata import PerfData, iter_records

    try:
        pd = PerfData(data)
        _ = pd.layout
        for a in pd.attrs:
            _ = a.ids
        for name in pd.feature_names():
            pd.feature(name)
        for rec in pd.records():
            if rec.type == 71:      # PERF_RECORD_AUXTRACE
                mv = pd.aux_data(rec)
                if len(mv) > len(data):
                    raise Violation("aux data larger than the file")
        pd.record_counts()
        pd.build_ids()
    except PerfDataError:
        pass
    try:
        for _ in iter_records(data):
            pass
    except PerfDataError:
        pass


def seeds_perfdata() -> list[bytes]:
    out = []
    for p in sorted((FIXTURES / "perf_data_converter").glob("perf.data*intel_pt-4.14")) + \
            [FIXTURES / "hase_loopy" / "loopy-20180404T162955.perf"]:
        if p.is_file():
            b = p.read_bytes()
            out.append(b[:MAX_SEED])
            out.append(b)           # whole file once (header offsets intact)
    for p in sorted((FIXTURES / "drpt2trace_simple").glob("*.pevent")):
        out.append(p.read_bytes())
    return out


class ImportTarget:
    """perf.data -> bundle (``hwtrace import``) into a private scratch dir:
    only PerfDataError / BundleError escape, the bundle written reads back
    and its streams are exactly the sizes the importer reports."""

    def __init__(self, scratch: str | None = None):
        self.root = _scratch(scratch, "hwtrace-fuzz-import-", self)

    def check(self, data: bytes) -> None:
        from hwtrace.bundle import Bundle, BundleError
        from hwtrace.engines.perf.errors import PerfDataError
        from hwtrace.engines.perf.importer import import_perf_data
        out = self.root / "b"
        try:
            res = import_perf_data(data, out, exist_ok=True)
        except (PerfDataError, BundleError):
            return
        b = Bundle(out)
        sizes = {s.file: len(b.read_stream(s)) for s in b.streams}
        if sizes != dict(res.streams):
            raise Violation(f"imported streams {dict(res.streams)} read back as {sizes}")
        list(b.iter_sideband())


class RecoverTarget:
    """``hwtrace recover`` over a trace directory whose persisted ToPA
    registers (buf-N/regs, 128 bytes) and sideband come from the input: only
    RecoverError / BundleError escape, and a recovered stream is never larger
    than its buffer."""

    SEG = b"\x02\x82" * 8 + b"\x02\x23" + b"\x19" + bytes(range(1, 8)) + b"\x00" * 300

    def __init__(self, scratch: str | None = None):
        import hwtrace
        from hwtrace.engines.testing import TestEngine
        self.root = _scratch(scratch, "hwtrace-fuzz-recover-", self)
        self.trace = self.root / "t"
        with hwtrace.open_device(engine=TestEngine({0: [self.SEG * 9], 1: [self.SEG * 30]}),
                                 directory=self.trace, lock_path=self.root / "lock") as dev:
            for circular in (False, True):
                dev.alloc_buffer(hwtrace.BufferConfig(num_chunks=2, chunk_order=0,
                                                      is_circular=circular))
            dev.cpu_mode_alloc()
            dev.cpu_mode_start()
            dev.run(["p"])
            dev.cpu_mode_stop()
        self.regs = sorted(self.trace.glob("buf-*/regs"))
        self.seed_regs = [p.read_bytes() for p in self.regs]
        self.total = 2 * 4096

    def seeds(self) -> list[bytes]:
        sb = (self.trace / "sideband.jsonl")
        side = sb.read_bytes() if sb.is_file() else b""
        return [b"".join(self.seed_regs) + side,
                b"".join(self.seed_regs) + b'{"type":"process","pid":1,"cr3":4096}\n']

    def check(self, data: bytes) -> None:
        from hwtrace.bundle import Bundle, BundleError
        from hwtrace.control.recover import RecoverError, write_bundle
        n = 128
        for i, p in enumerate(self.regs):
            p.chmod(0o644)
            p.write_bytes(data[i * n:(i + 1) * n].ljust(n, b"\0"))
        (self.trace / "sideband.jsonl").write_bytes(data[len(self.regs) * n:])
        out = self.root / "out"
        try:
            write_bundle(self.trace, out, overwrite=True)
            b = Bundle(out)
            for s in b.streams:
                if len(b.read_stream(s)) > self.total:
                    raise Violation(f"{s.file}: more bytes than its buffer")
            list(b.iter_sideband())
        except (RecoverError, BundleError):
            pass


# ---------------------------------------------------------------- bundle

#: Parts of a bundle input, separated by this marker: manifest, sideband,
#: then streams/images (each "NAME\n" + bytes).
SEP = b"\n--8<--\n"


def bundle_input(manifest: dict | bytes, sideband: bytes = b"",
                 files: dict[str, bytes] | None = None) -> bytes:
    m = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    parts = [m, sideband] + [n.encode() + b"\n" + b for n, b in (files or {}).items()]
    return SEP.join(parts)


class BundleTarget:
    """Writes each input as a bundle directory in a private scratch dir
    and reads it back with every reader API."""

    def __init__(self, scratch: str | None = None):
        self.root = _scratch(scratch, "hwtrace-fuzz-bundle-", self)
        self.outside = self.root / "outside"
        self.outside.mkdir(exist_ok=True)
        (self.outside / "secret").write_bytes(b"not for the bundle")
        self.n = 0

    def _write(self, data: bytes) -> Path:
        import shutil
        d = self.root / "b"
        if d.exists():
            shutil.rmtree(d)
        d.mkdir()
        parts = data.split(SEP)
        (d / "manifest.json").write_bytes(parts[0])
        if len(parts) > 1:
            (d / "sideband.jsonl").write_bytes(parts[1])
        for p in parts[2:16]:
            name, _, body = p.partition(b"\n")
            n = name.decode("ascii", "replace")
            if not n or "\0" in n or n.startswith("/") or ".." in n or len(n) > 100:
                continue
            if ("/" in n and not n.startswith("images/")) or os.path.lexists(d / n):
                continue
            try:
                if n.startswith("images/"):
                    (d / "images").mkdir(exist_ok=True)
                if body.startswith(b"@fifo"):           # a planted FIFO
                    os.mkfifo(d / n)
                elif body.startswith(b"@link"):         # a link out of the bundle
                    os.symlink(self.outside / "secret", d / n)
                else:
                    (d / n).write_bytes(body)
            except OSError:
                pass
        return d

    def check(self, data: bytes) -> None:
        from hwtrace.bundle import Bundle, BundleError
        d = self._write(data)
        try:
            b = Bundle(d)
            _ = (b.engine, b.mode, b.images)
            for attr in ("config", "capabilities", "cpu"):
                try:
                    getattr(b, attr)
                except BundleError:
                    pass
            try:
                b.decoder_args()
            except BundleError:
                pass
            for s in b.streams:
                try:
                    got = b.read_stream(s)
                    if len(got) != s.size:
                        raise Violation("read_stream size differs from the manifest")
                    b.open_stream(s).close()
                except BundleError:
                    pass
            try:
                for _ in b.iter_sideband():
                    pass
            except BundleError:
                pass
            for i in b.images:
                for fn in (i["path"], str(self.outside / "secret")):
                    p = b.find_image(fn, i["build_id"])
                    if p is not None and not Path(p).resolve().is_relative_to(d.resolve()):
                        raise Violation(f"find_image left the bundle: {p}")
        except BundleError:
            pass


def seeds_bundle() -> list[bytes]:
    out = []
    base = {"format": "hwtrace-bundle", "version": 1, "engine": "emulated",
            "mode": "cpu", "config": {"num_chunks": 1, "chunk_order": 0,
                                      "is_circular": False, "ctl": 0x2001},
            "cpu": {"vendor": "GenuineIntel", "family": 6, "model": 85,
                    "stepping": 4},
            "nom_freq": 37, "mtc_freq": 3, "sideband": "sideband.jsonl"}
    sb = (b'{"type":"process","pid":1,"cr3":4096,"comm":"a","exe":"/bin/a"}\n'
          b'{"type":"mmap","pid":1,"start":4096,"size":100,"offset":0,'
          b'"file":"/bin/a","build_id":"ab"}\n'
          b'{"type":"thread","tid":2,"pid":1}\n{"type":"exit","pid":1,"tid":1}\n'
          b'{"type":"switch","cpu":0,"time":1,"prev_pid":1,"prev_tid":1,'
          b'"next_pid":-1,"next_tid":-1}\n')
    for d, v in list(_corpus_variants())[:12]:
        pt = (d / v["pt"]).read_bytes()[:4096]
        m = dict(base, streams=[{"file": "cpu0.pt", "cpu": 0, "size": len(pt),
                                 "capture_end": len(pt)}],
                 images=[{"file": "images/ab-a", "path": "/bin/a", "build_id": "ab"}])
        out.append(bundle_input(m, sb, {"cpu0.pt": pt, "images/ab-a": b"\x90" * 16}))
    m = dict(base, mode="thread", streams=[{"file": "tid5.pt", "tid": 5, "pid": 5,
                                            "size": 3, "wrapped": True}])
    out.append(bundle_input(m, b"", {"tid5.pt": b"\x02\x82\x02"}))
    m = dict(base, streams=[{"file": "cpu0.pt", "cpu": 0, "size": 0},
                            {"file": "cpu1.pt", "cpu": 1, "size": 18}],
             images=[{"file": "images/x", "path": "/bin/a", "build_id": "ab"}])
    out.append(bundle_input(m, b"@fifo", {"cpu0.pt": b"@fifo", "cpu1.pt": b"@link",
                                         "images/x": b"@link"}))
    return out


class LldbImportTarget(BundleTarget):
    """An LLDB ``trace save`` directory -- trace.json, then the files it
    names (the bundle target's input layout: trace.json first) -- imported
    into a private scratch dir: only LldbTraceError / BundleError escape,
    nothing outside the trace directory is read into the bundle, and the
    bundle written reads back with the sizes the importer reports."""

    def check(self, data: bytes) -> None:
        import shutil
        from hwtrace.bundle import Bundle, BundleError
        from hwtrace.importers.lldb import LldbTraceError, import_lldb_trace
        d = self._write(data)
        (d / "manifest.json").rename(d / "trace.json")
        out = self.root / "out"
        if out.exists():
            shutil.rmtree(out)
        try:
            res = import_lldb_trace(d / "trace.json", out)
        except (LldbTraceError, BundleError):
            return
        b = Bundle(out)
        sizes = {s.file: len(b.read_stream(s)) for s in b.streams}
        if sizes != dict(res.streams):
            raise Violation(f"imported streams {dict(res.streams)} read "
                            f"back as {sizes}")
        secret = (self.outside / "secret").read_bytes()
        for s in b.streams:
            if secret in b.read_stream(s):
                raise Violation("a file outside the trace directory was read")
        list(b.iter_sideband())


def seeds_lldbimport() -> list[bytes]:
    out = []
    lldb = FIXTURES / "lldb_intelpt"
    for name in ("intelpt-trace", "intelpt-multi-core-trace"):
        d = lldb / name
        if not (d / "trace.json").is_file():
            continue
        desc = json.loads((d / "trace.json").read_text())
        files = {}
        for p in sorted(d.rglob("*")):
            rel = str(p.relative_to(d))
            if p.is_file() and rel != "trace.json" and \
                    not rel.endswith((".cpp", ".h")):
                # the layout keeps one directory level: cores/x -> cores_x
                flat = rel.replace("/", "_")
                files[flat] = p.read_bytes()[:MAX_SEED // 4]
        text = json.dumps(desc)
        for rel in sorted({str(p.relative_to(d)) for p in d.rglob("*")},
                          key=len, reverse=True):
            if "/" in rel:
                text = text.replace(f'"{rel}"', f'"{rel.replace("/", "_")}"')
        out.append(bundle_input(text.encode(), b"", files))
    return out


# ---------------------------------------------------------------- registry

def _passes(n: int):
    def budget(data: bytes) -> float:
        return n * max(1, -(-len(data) // 65536))
    return budget


def _flow_budget(data: bytes) -> float:
    # A trace may describe far more instructions than it has bytes (``jmp .``
    # needs no packets): the sink stops at flow_items(data), each allowed
    # 10 us on top of the per-64-KiB second.
    return max(1, -(-len(data) // 65536)) + flow_items(data) / 100_000


def _flowdiff_budget(data: bytes) -> float:
    # the twin's decode (the compiled one is noise) plus numpy's records
    return 2 * _flow_budget(data)


def budget(name: str):
    """CPU seconds one input of ``name`` may take: 1 s per started 64 KiB
    per decoding pass (packets: Python packets + count + ptdump = 3, the
    compiled passes are noise; perfdata: PerfData + iter_records = 2)."""
    return {"packets": _passes(3), "flow": _flow_budget, "perfdata": _passes(2),
            "perfimport": _passes(2), "bundle": _passes(1), "recover": _passes(1),
            "lldbimport": _passes(2), "flowdiff": _flowdiff_budget,
            "libiptdiff": _flowdiff_budget}[name]


def make(name: str):
    """(check, seeds) for a target name."""
    if name == "packets":
        return check_packets, seeds_packets
    if name == "flow":
        return check_flow, seeds_flow
    if name == "perfdata":
        return check_perfdata, seeds_perfdata
    if name == "bundle":
        t = BundleTarget()
        return t.check, seeds_bundle
    if name == "recover":
        t = RecoverTarget()
        return t.check, t.seeds
    if name == "perfimport":
        return ImportTarget().check, seeds_perfdata
    if name == "lldbimport":
        return LldbImportTarget().check, seeds_lldbimport
    if name == "flowdiff":
        import flowdiff
        return flowdiff.check, lambda: flowdiff.seeds(CORPUS, FIXTURES, MAX_SEED)
    if name == "libiptdiff":
        import libiptdiff
        return (libiptdiff.Target().check,
                lambda: libiptdiff.seeds(CORPUS, FIXTURES))
    raise KeyError(name)


TARGETS = ("packets", "flow", "perfdata", "perfimport", "bundle", "recover",
           "lldbimport", "flowdiff", "libiptdiff")
