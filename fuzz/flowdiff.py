"""The ``flowdiff`` fuzz target: the compiled flow core against its Python
twin, record for record.

An input is a decoder configuration, a memory image and a trace::

    header  <BBHBBBHHB  flags, flags2, errata, mtc_freq, nom_freq,
                        cpuid_0x15_eax, cpuid_0x15_ebx, addr_cfg, sections
    [if flags2 & FILTERS] 8 x <Q: addr0_a, addr0_b, ..., addr3_b
    sections x (<IQ length, vaddr; bytes)
    the trace: the rest

``flags``: block decoder 1, resync on error 2, tick events 4, iflags events
8, end on call 16, end on jump 32, libipt 2.0's error offsets 64.
``flags2``: keep the calibration over OVF 1, libipt 2.3's strict reading
2, FILTERS 0x10.  ``errata``:
one bit per :data:`hwtrace.flow.config.ERRATA` name, in that order.

Both producers decode it (the compiled core's batches, cut small so batch
boundaries fall everywhere, and the Python twin) and must hand out the
same records, instructions and items -- events attribute for attribute
-- in the same order; neither may raise.  Output is capped (a trace may
describe a long loop without trace): both stop after
:func:`flow_items` records and items, and the part both produced in full
is compared.

Seeds: every ptxed variant of libipt's corpus with its CPU errata and
options, the real captures in ../shared/fixtures/hardware (their ELF
images flattened into sections) and, if ``HWTRACE_FUZZ_BUNDLE`` names
recorded bundles (``:``-separated), the start of each of their streams
with the bundle's images (the first 256 KiB of each section).
"""

from __future__ import annotations

import shlex
import struct
from pathlib import Path

HDR = struct.Struct("<BBHBBBHHB")
SEC = struct.Struct("<IQ")
FILTERS = struct.Struct("<8Q")
F_BLOCK, F_RESYNC, F_TICK, F_IFLAGS, F_CALL, F_JUMP, F_OFF20 = \
    1, 2, 4, 8, 16, 32, 64
F2_KEEP_TCAL, F2_STRICT, F2_FILTERS = 1, 2, 0x10
MAX_SECTION = 256 << 10


class Violation(AssertionError):
    pass


class _Stop(Exception):
    pass


def flow_items(data: bytes) -> int:
    return 16 * len(data) + 10_000


def make_input(trace: bytes, sections, cfg=None, *, block=False,
               resync=False) -> bytes:
    """An input from a trace, [(vaddr, bytes)] and a FlowConfig."""
    from hwtrace.flow.config import ERRATA, FlowConfig
    cfg = cfg or FlowConfig()
    flags = (F_BLOCK if block else 0) | (F_RESYNC if resync else 0) | \
        (F_TICK if cfg.enable_tick_events else 0) | \
        (F_IFLAGS if cfg.enable_iflags_events else 0) | \
        (F_CALL if cfg.end_on_call else 0) | \
        (F_JUMP if cfg.end_on_jump else 0) | \
        (F_OFF20 if cfg.error_offsets == "2.0" else 0)
    f = cfg.addr_filter
    flags2 = (F2_KEEP_TCAL if cfg.keep_tcal_on_ovf else 0) | \
        (F2_STRICT if getattr(cfg, "strict", False) else 0) | \
        (F2_FILTERS if f.addr_cfg else 0)
    errata = sum(1 << i for i, n in enumerate(ERRATA)
                 if getattr(cfg.errata, n))
    sections = list(sections)[:255]
    out = [HDR.pack(flags, flags2, errata, cfg.mtc_freq & 0xff,
                    cfg.nom_freq & 0xff, cfg.cpuid_0x15_eax & 0xff,
                    cfg.cpuid_0x15_ebx & 0xffff, f.addr_cfg & 0xffff,
                    len(sections))]
    if f.addr_cfg:
        out.append(FILTERS.pack(*(v & (2**64 - 1) for n in range(4)
                                  for v in (f.a[n], f.b[n]))))
    for vaddr, b in sections:
        b = bytes(b[:MAX_SECTION])
        out.append(SEC.pack(len(b), vaddr) + b)
    out.append(trace)
    return b"".join(out)


def parse(data: bytes):
    """(trace, image, FlowConfig, block, resync) of an input."""
    from hwtrace.flow.config import ERRATA, AddrFilter, Errata, FlowConfig
    from hwtrace.flow.image import Image
    data = data.ljust(HDR.size, b"\0") if len(data) < HDR.size else data
    flags, flags2, errata, mtc, nom, eax, ebx, addr_cfg, nsec = \
        HDR.unpack_from(data)
    pos = HDR.size
    f = AddrFilter()
    if flags2 & F2_FILTERS:
        raw = data[pos:pos + FILTERS.size].ljust(FILTERS.size, b"\0")
        v = FILTERS.unpack(raw)
        pos += FILTERS.size
        f = AddrFilter(addr_cfg, [v[0], v[2], v[4], v[6]],
                       [v[1], v[3], v[5], v[7]])
    image = Image()
    for _ in range(nsec):
        if pos + SEC.size > len(data):
            break
        n, vaddr = SEC.unpack_from(data, pos)
        pos += SEC.size
        n = min(n, MAX_SECTION, len(data) - pos)
        if n > 0:
            image.add_bytes(data[pos:pos + n], vaddr)
        pos += max(n, 0)
    e = Errata(**{n: bool(errata >> i & 1) for i, n in enumerate(ERRATA)})
    cfg = FlowConfig(errata=e, addr_filter=f, mtc_freq=mtc, nom_freq=nom,
                     cpuid_0x15_eax=eax, cpuid_0x15_ebx=ebx,
                     enable_tick_events=bool(flags & F_TICK),
                     enable_iflags_events=bool(flags & F_IFLAGS),
                     keep_tcal_on_ovf=bool(flags2 & F2_KEEP_TCAL),
                     strict=bool(flags2 & F2_STRICT),
                     error_offsets="2.0" if flags & F_OFF20 else "2.3",
                     end_on_call=bool(flags & F_CALL),
                     end_on_jump=bool(flags & F_JUMP))
    return (data[pos:], image, cfg, bool(flags & F_BLOCK),
            bool(flags & F_RESYNC))


# -- the two producers --------------------------------------------------------

def _event_key(ev) -> tuple:
    """An event, attribute for attribute (with the values' types)."""
    out = []
    for name in type(ev).__slots__:
        if hasattr(ev, name):
            v = getattr(ev, name)
            out.append((name, type(v).__name__, v))
    return tuple(out)


def _item_key(item) -> tuple:
    from hwtrace.flow.events import Event
    if isinstance(item, Event):
        return ("event",) + _event_key(item)
    return (type(item).__name__,) + tuple((type(v).__name__, v)
                                          for v in item)


def collect(batches, cap: int):
    """(records, insns, items, complete) from batches: records as tuples,
    items as (record index, offset, key); stops once more than ``cap``
    records + items were seen (complete False)."""
    import numpy as np
    recs, insns, items = [], [], []
    first = 0
    for b in batches:
        if b.first_insn != first:
            raise Violation(f"first_insn {b.first_insn}, expected {first}")
        base = len(recs)
        blocks = np.asarray(b.blocks)
        for r in blocks.tolist():
            recs.append(tuple(r))
        first += int(blocks["ninsn"].sum()) if len(blocks) else 0
        if b.insns is not None:
            insns.extend(tuple(i) for i in np.asarray(b.insns).tolist())
        got = b.items
        if b.plain is not None:
            # plain_events: the rows stand for items; merged puts them
            # back where the producer without rows has them
            from hwtrace.flow import plain
            got = plain.merged(b.items, b.plain)
        for index, offset, item in got:
            items.append((base + index, offset, _item_key(item)))
        if len(recs) + len(items) > cap:
            return recs, insns, items, False
    return recs, insns, items, True


def _first_difference(a, b) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare(py, c) -> None:
    """Raise Violation where the two collections differ (both complete:
    everything; else the prefix both produced in full)."""
    (pr, pi, pit, pdone), (cr, ci, cit, cdone) = py, c
    if pdone and cdone:
        n = len(pr)
        if len(cr) != n:
            raise Violation(f"records: python {len(pr)}, compiled {len(cr)}")
    else:
        # the last record of a capped side may be cut short
        n = min(len(pr), len(cr)) - 1
    for name, a, b in (("record", pr[:n], cr[:n]),):
        if a != b:
            i = _first_difference(a, b)
            raise Violation(f"{name} {i}: python {a[i]} compiled {b[i]}")
    ninsn = sum(r[4] for r in pr[:n]) if n > 0 else 0
    if pdone and cdone:
        ninsn = max(len(pi), len(ci))
    if pi[:ninsn] != ci[:ninsn]:
        i = _first_difference(pi[:ninsn], ci[:ninsn])
        raise Violation(f"insn {i}: python {pi[i:i + 1]} compiled "
                        f"{ci[i:i + 1]}")
    pit = [x for x in pit if x[0] <= n] if not (pdone and cdone) else pit
    cit = [x for x in cit if x[0] <= n] if not (pdone and cdone) else cit
    if not (pdone and cdone):
        k = min(len(pit), len(cit))
        pit, cit = pit[:k], cit[:k]
    if pit != cit:
        i = _first_difference(pit, cit)
        raise Violation(f"item {i}: python {pit[i:i + 1]} compiled "
                        f"{cit[i:i + 1]} ({len(pit)} vs {len(cit)})")


def expected_counts(py, block: bool):
    """(insns, blocks, events, error items) fast.count must give, and the
    edges fast.edges must give (the instruction decoder's: None for the
    block decoder), from the twin's complete output."""
    recs, insns, items, _done = py
    events = sum(1 for _i, _o, k in items if k[0] == "event")
    errors = tuple((k[1][1], k[2][1], k[3][1], k[4][1])
                   for _i, _o, k in items if k[0] == "ErrorItem")
    counts = (sum(r[4] for r in recs), len(recs) if block else 0, events,
              errors)
    if block:
        return counts, None
    # EdgeSink: (branch, next instruction); an error ends the pair
    edges = {}
    errs_at = {}
    for i, _o, k in items:
        if k[0] == "ErrorItem":
            errs_at[i] = errs_at.get(i, 0) + 1
    frm = None
    pos = 0
    for n, r in enumerate(recs):
        if errs_at.get(n):
            frm = None
        for ip, _size, iclass in insns[pos:pos + r[4]]:
            if frm is not None:
                edges[(frm, ip)] = edges.get((frm, ip), 0) + 1
            frm = ip if iclass not in (1, 9) else None
        pos += r[4]
    return counts, edges


def check(data: bytes) -> None:
    from hwtrace.flow import batches as B
    from hwtrace.flow import fast
    trace, image, cfg, block, resync = parse(data)
    decoder = "block" if block else "insn"
    cap = flow_items(data)
    py = collect(B.batches(trace, image, cfg, decoder=decoder, resync=resync,
                           want_insns=True, impl="python"), cap)
    # small batches: batch boundaries fall everywhere
    c = collect(B.batches(trace, image, cfg, decoder=decoder, resync=resync,
                          want_insns=True, max_records=7, impl="compiled"),
                cap)
    compare(py, c)
    # the plain events as rows (what the call-stack views ask for): the
    # same items once the rows are put back
    c = collect(B.batches(trace, image, cfg, decoder=decoder, resync=resync,
                          want_insns=True, max_records=5, impl="compiled",
                          plain_events=True), cap)
    compare(py, c)
    if not py[3]:
        return
    # the counts and edges fast paths (no records) give the same
    counts, edges = expected_counts(py, block)
    got = fast.count(trace, image, cfg, decoder, impl="compiled",
                     resync=resync)
    if (got.insns, got.blocks, got.events, got.error_items) != counts:
        raise Violation(f"counts: twin {counts}, compiled {got}")
    if edges is not None:
        e = fast.edges(trace, image, cfg, impl="compiled", resync=resync)
        if e.counts != edges or e.insns != counts[0]:
            raise Violation(f"edges differ: {len(edges)} twin, "
                            f"{len(e.counts)} compiled")


# -- seeds ----------------------------------------------------------------------

def _sections(image) -> list:
    out = []
    for m in image.mappings():
        b = m.section.bytes()[m.offset:m.offset + (m.end - m.begin)]
        out.append((m.begin, b[:MAX_SECTION]))
    return out


def seeds(corpus: Path, fixtures: Path, max_trace: int) -> list[bytes]:
    import os
    out = []
    if corpus.is_dir():
        out += _corpus_seeds(corpus, max_trace)
    if fixtures.is_dir():
        out += _fixture_seeds(fixtures, max_trace)
    for d in filter(None, os.environ.get("HWTRACE_FUZZ_BUNDLE", "").split(":")):
        out += _bundle_seeds(Path(d), max_trace)
    return out


def _bundle_seeds(bundle: Path, max_trace: int) -> list[bytes]:
    """The start of each stream of a recorded bundle, with the pages of
    its images that the decode of that start executes."""
    import hwtrace.streams as S
    from hwtrace.flow import batches as B
    out = []
    for k, st in enumerate(S.open_bundle(bundle).streams):
        trace = Path(st.path).read_bytes()[:max_trace]
        pages = set()
        for b in B.batches(trace, st.image, st.config, decoder="insn",
                           want_insns=True, impl="python"):
            for ip, size in zip(b.insns["ip"].tolist(),
                                b.insns["size"].tolist()):
                pages.update((ip >> 12, (ip + size - 1) >> 12))
        sections = []
        for page in sorted(pages):
            data = st.image.read(page << 12, 4096)
            if data:
                if sections and sections[-1][0] + len(sections[-1][1]) == \
                        page << 12 and len(sections[-1][1]) < MAX_SECTION:
                    sections[-1] = (sections[-1][0], sections[-1][1] + data)
                else:
                    sections.append((page << 12, data))
        for block in (False, True):
            out.append(make_input(trace, sections, st.config, block=block,
                                  resync=bool(k & 1)))
    return out


def corpus_variants(corpus: Path, max_trace: int):
    """(index in its test, the parsed ``decode`` arguments, FlowConfig,
    Image, trace bytes up to ``max_trace``) of every corpus variant with a
    ptxed expectation that ``hwtrace decode``'s parser takes: the corpus
    seeds of flowdiff and libiptdiff."""
    import io
    import json

    from hwtrace.cli import Parser
    from hwtrace.cli import decode as D
    sub = Parser(prog="fuzz").add_subparsers(parser_class=Parser)
    D.register(sub)
    p = sub.choices["decode"]
    for d in sorted(corpus.iterdir()):
        meta = d / "meta.json"
        if not meta.is_file():
            continue
        for i, v in enumerate(json.loads(meta.read_text()).get("variants",
                                                               [])):
            if not v.get("exp", {}).get("ptxed"):
                continue
            argv = []
            for r in v.get("raw") or []:
                argv += ["--raw", str(d / r)]
            if v.get("cpu"):
                argv += ["--cpu", v["cpu"]]
            opts = shlex.split(v.get("ptxed_opts") or "")
            opts = [str(d / o) if prev in ("--raw", "--elf") and
                    not o.startswith("/") else o
                    for prev, o in zip([None] + opts, opts)]
            try:
                a = p.parse_args(argv + opts + ["--pt", str(d / v["pt"])])
                cfg = D._config(a, io.StringIO().write)
                image = D._image(a)
                trace = (d / v["pt"]).read_bytes()[:max_trace]
            except (SystemExit, Exception):
                continue
            yield i, a, cfg, image, trace


def _corpus_seeds(corpus: Path, max_trace: int) -> list[bytes]:
    out = []
    for i, a, cfg, image, trace in corpus_variants(corpus, max_trace):
        block = (a.decoder == "block") if a.decoder else bool(i & 1)
        out.append(make_input(trace, _sections(image), cfg, block=block,
                              resync=bool(i & 2)))
    return out


def _fixture_seeds(fx: Path, max_trace: int) -> list[bytes]:
    from hwtrace.flow.config import FlowConfig
    from hwtrace.flow.image import Image
    from hwtrace.flow.loaders import load_elf
    from hwtrace.pt import cpu as cpumod

    def cfg(cpu, **kw):
        c = FlowConfig(**kw)
        c.errata = cpumod.errata(cpumod.Cpu.parse(cpu))
        return c

    lldb = fx / "lldb_intelpt"
    mc = lldb / "intelpt-multi-core-trace"
    mf = lldb / "intelpt-trace-multi-file"
    cases = [
        (mc / "cores" / "45.intelpt_trace", [f"{mc}/modules/m.out:0x400000"],
         cfg("6/85/4")),
        (mc / "cores" / "51.intelpt_trace", [f"{mc}/modules/m.out:0x400000"],
         cfg("6/85/4")),
        (lldb / "intelpt-trace" / "3842849.trace",
         [f"{lldb}/intelpt-trace/a.out:0x400000"], cfg("6/79/1")),
        (mf / "multi-file.trace", [f"{mf}/a.out:0x400000",
                                   f"{mf}/libfoo.so:0x7ffff7bd9000",
                                   f"{mf}/libbar.so:0x7ffff79d7000"],
         cfg("6/79/1")),
        (fx / "drpt2trace_simple" / "pt.bin",
         [str(fx / "drpt2trace_simple" / "hello")],
         cfg("6/85/4", mtc_freq=3, nom_freq=37, cpuid_0x15_eax=2,
             cpuid_0x15_ebx=308)),
    ]
    out = []
    for k, (trace, elfs, c) in enumerate(cases):
        if not trace.is_file():
            continue
        image = Image()
        try:
            for e in elfs:
                load_elf(image, e)
        except Exception:
            continue
        data = trace.read_bytes()[:max_trace]
        for block in (False, True):
            out.append(make_input(data, _sections(image), c, block=block,
                                  resync=bool(k & 1)))
    return out
