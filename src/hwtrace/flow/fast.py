"""The compiled flow core (``_c_flow.c`` and ``core/``) behind a narrow
boundary: counts, edge coverage and the core decoder that produces
batches (docs/pipeline.md).

The core is a port of the Python flow decoders (the twin and reference:
:mod:`.query`, :mod:`.insn`, :mod:`.block`, :mod:`.session` and their
helpers) that decodes every trace they decode, with identical results:
every packet, every event at any IP, errata, timing, address filters,
both resync modes and both error-offset conventions.  On an instruction
cache miss the core decodes the instructions from ``ip`` on from the
bytes of the image's mapping there (:func:`mappings`, ``core/pyfill.h``)
with the compiled x86 decoder (``core/x86.c``, a port of
:mod:`hwtrace.x86`, its twin and reference) and keeps the result (its
instruction and run caches live as long as a decode); what is unusual --
errors, instructions crossing a section end, images it cannot see into
-- goes to :func:`filler`'s ``fill(ip, mode)``, which leaves it to the
twin's instruction cache::

    from hwtrace.flow import fast
    c = fast.count(data, image, config, decoder="block")   # Counts
    c.insns, c.blocks, c.errors, c.compiled
    e = fast.edges(data, image, config)                     # Edges
    e.counts            # {(from_ip, to_ip): times taken}
    fast.edge_bitmap(e.counts)                             # AFL-style map
    p = fast.packed_edges(data, image, config)             # PackedEdges
    text, taken = fast.edge_text(p.table)   # coverage --edges's lines

**Edges.** For every executed branch instruction (any class but OTHER and
PTWRITE: conditional branches taken or not, direct and indirect jumps and
calls, returns, far transfers), the pair (IP of the branch, IP of the next
instruction the trace shows executing).  That next instruction may come
after a gap in tracing (a syscall disables tracing: its edge goes to where
tracing resumes).  A decode error ends the pair (no edge across an error).
It is the instruction decoder's flow (``--insn-decoder``).

**Bitmap.** :func:`edge_bitmap` folds the edge counts into a ``size``-byte
(default 64 KiB) map the way AFL does: ``h(x) = ((x * 0x9E3779B97F4A7C15)
mod 2**64) >> 48`` and ``index = (h(from) ^ (h(to) >> 1)) % size``; each
byte adds up the counts of the edges mapped there, saturating at 255.

**Which implementation.**  :data:`CORE` is the extension, or None
(``HWTRACE_NO_EXTENSIONS=1``; tests monkeypatch it): then the Python
decoders run.  ``impl="python"`` forces the twin, ``impl="compiled"``
the core.  There is no fallback from one to the other: a configuration
the core cannot represent (timing parameters past 64-bit arithmetic) is
an :class:`Unsupported` error naming it.  ``Counts.compiled`` /
``Edges.compiled`` say which one ran.
"""

from __future__ import annotations

from collections import namedtuple

from hwtrace import _ext
from hwtrace.pt import errors as E
from .config import ERRATA, FlowConfig
from .image import Image

NAME = "hwtrace.flow._c_flow"
ABI = 9

#: how the selection went (see hwtrace._ext.Status)
STATUS = _ext.select(NAME, ABI)

#: the compiled core in use, or None (the Python twin)
CORE = STATUS.module

MASK64 = 0xFFFFFFFFFFFFFFFF
_MODES = ("16bit", "32bit", "64bit")

# Decoder flags (_c_flow.c)
F_BLOCK, F_RESYNC, F_WANT_INSNS, F_PLAIN_OFFSETS, F_PLAIN_EVENTS = 1, 2, 4, 8, 16

# fill() record: size, iclass, flags, rel; flags as core/icache.h's IF_*
# (a struct.Struct made on first use, :func:`_struct`)
_REC = "<BBBQ"
IF_INDIRECT, IF_FAR, IF_CPL, IF_CR3, IF_VMPTRLD, IF_VMENTRY, IF_TRUNC = \
    1, 2, 4, 8, 16, 32, 64
# the core's error numbers of the fetch errors (core/common.h)
_FETCH_CODES = {E.NOMAP: 13, E.BAD_INSN: 14}
#: instructions one fill() call returns at most
FILL_MAX = 1024


_STRUCTS: dict = {}


def _struct(fmt: str):
    """``struct.Struct(fmt)``, made once.  struct is imported where the
    twin's records are packed (fill records, packed edge tables in
    Python): the compiled path's start-up does without it (an extension
    module to load, ~0.5 ms)."""
    s = _STRUCTS.get(fmt)
    if s is None:
        import struct
        s = _STRUCTS[fmt] = struct.Struct(fmt)
    return s


class Unsupported(ValueError):
    """A configuration the compiled core cannot decode exactly (named in
    the message); decode it with ``impl="python"``."""


# The results are collections.namedtuple classes: typing.NamedTuple under
# ``from __future__ import annotations`` compiles every field's annotation
# at import (~0.5 M instructions a field, on every command's start-up).

class Counts(namedtuple("Counts", "insns blocks errors compiled events "
                        "error_items", defaults=(0, ()))):
    """``insns``, ``blocks`` (0 for the instruction decoder), ``errors``,
    ``compiled`` (bool), ``events``, ``error_items``: the errors in order,
    (kind, offset, ip, code) as sinks get them."""
    __slots__ = ()


class Edges(namedtuple("Edges", "counts insns errors compiled")):
    """``counts`` {(from_ip, to_ip): n}, ``insns``, ``errors``,
    ``compiled`` (bool)."""
    __slots__ = ()


class PackedEdges(namedtuple("PackedEdges", "table insns errors compiled")):
    """Edge counts as one table: (from_ip, to_ip, n) little-endian u64
    triples sorted by (from_ip, to_ip) (:func:`pack_edges`) -- what
    ``coverage --edges`` prints, with no Python object per edge; and
    ``insns``, ``errors``, ``compiled``."""
    __slots__ = ()


def _core(impl):
    return _ext.core_for(impl, CORE, NAME, ABI, "flow core")


def _flags_of(x, truncated: bool) -> int:
    # the twin's modules where the twin decodes (the compiled path's
    # start-up does without them)
    from hwtrace.x86.insn import Kind

    from .fetch import changes_cpl
    f = 0
    if x.is_indirect:
        f |= IF_INDIRECT
    if x.is_far:
        f |= IF_FAR
    if changes_cpl(x):
        f |= IF_CPL
    k = x.kind
    if k == Kind.MOV_CR3:
        f |= IF_CR3
    elif k in (Kind.VMPTRLD, Kind.VMCLEAR, Kind.VMXON):
        f |= IF_VMPTRLD
    elif k in (Kind.VMLAUNCH, Kind.VMRESUME):
        f |= IF_VMENTRY
    if truncated:
        f |= IF_TRUNC
    return f


def filler(image):
    """The core's instruction-cache miss handler for ``image``:
    ``fill(ip, mode)`` -> the core's error number of the fetch error the
    twin's InsnCache raises at ``ip``, or ``(lo, last, records)``: the
    mapping ``[lo, last]`` of ``ip`` and :data:`_REC` records of the
    instructions from ``ip`` on -- the plain ones (class OTHER) and the one
    that ends them, inside that mapping, at most :data:`FILL_MAX`.

    With the extension, the compiled x86 decoder (core/x86.h, a port of
    hwtrace.x86) builds the records from the mapping's bytes; what it
    does not decode -- a first instruction that is invalid or runs past
    the mapping's bytes (the twin completes it from the next section and
    marks it truncated), an unmapped IP -- and an instruction that runs
    past them later on go to the twin's InsnCache, so the records are the
    same either way.  Those are the only instructions the compiled path
    puts in the InsnCache's tables: nothing reads them but the Python
    decoders, which decode what is missing on their own."""
    from hwtrace.x86.insn import IClass

    from .fetch import FetchError, InsnCache
    other = int(IClass.OTHER)
    cache = None
    pack = _struct(_REC).pack
    cfill = getattr(CORE, "x86_fill", None)
    span = FILL_MAX * 15        # FILL_MAX instructions fit in it

    def decode(ip, name):
        # the twin's cache on first use: most images never need it (the
        # core fills their misses in C, core/pyfill.h)
        nonlocal cache
        if cache is None:
            cache = InsnCache(image)
        return cache.decode(ip, name)

    def run(name, lo, hi, out, cur, d, left):
        for _ in range(left):
            x = d.x86
            out.append(pack(x.size, int(x.iclass), _flags_of(
                x, d.insn.truncated), x.rel & MASK64))
            if d.insn.iclass != other:
                break
            cur = (cur + x.size) & MASK64
            if not lo <= cur < hi:
                break
            try:
                d = decode(cur, name)
            except FetchError:
                break
        return lo, min(hi - 1, MASK64), b"".join(out)

    def fill(ip: int, mode: int):
        if cfill is not None and 0 <= mode <= 2:
            m = image.find(ip)
            if m is not None:
                start = m.offset + (ip - m.begin)
                r = cfill(memoryview(m.section.buffer())[
                    start:start + min(span, m.end - ip)], mode + 1, FILL_MAX)
                if r is not None:
                    recs, used, count, done = r
                    lo, hi = m.begin, m.end
                    if done:
                        return lo, min(hi - 1, MASK64), recs
                    # the bytes ran out: the twin goes on (as run() would)
                    cur = (ip + used) & MASK64
                    if not lo <= cur < hi:
                        return lo, min(hi - 1, MASK64), recs
                    name = _MODES[mode]
                    try:
                        d = decode(cur, name)
                    except FetchError:
                        return lo, min(hi - 1, MASK64), recs
                    return run(name, lo, hi, [recs], cur, d,
                               FILL_MAX - count)
        name = _MODES[mode]
        try:
            d = decode(ip, name)
        except FetchError as e:
            return _FETCH_CODES[e.code]
        m = image.find(ip)
        return run(name, m.begin, m.end, [], ip, d, FILL_MAX)
    return fill


def mappings(image):
    """The core's view of ``image`` for filling its instruction cache in C
    (core/pyfill.h): ``(generation, ((begin, end - 1, offset, load), ...))``
    -- each mapping ``[begin, end)``, in address order, ``offset`` bytes
    into its section's data, which ``load()`` returns -- or None for an
    object that is not an :class:`~hwtrace.flow.image.Image` (its misses
    all go to :func:`filler`).  The core asks again when the image's
    ``generation`` changes; it decodes from those bytes what
    :func:`filler` decodes from them with the compiled x86 decoder and
    leaves the rest (no mapping, a first instruction that is invalid or
    crosses the bytes' end, an unknown mode) to ``fill``."""
    if not isinstance(image, Image):
        return None
    return image.generation, tuple(
        (m.begin, m.end - 1, m.offset, m.section.buffer)
        for m in image.mappings())


def _u64(name: str, v: int, limit: int = 1 << 64) -> int:
    if not 0 <= v < limit:
        raise Unsupported(f"compiled flow core: {name} = {v} is out of its "
                          f"range (0 .. {limit - 1})")
    return v


def config_tuple(cfg: FlowConfig | None) -> tuple:
    """The core's view of a FlowConfig (see core/pyconfig.c parse_config)."""
    cfg = cfg or FlowConfig()
    e = cfg.errata
    errata = sum(1 << i for i, n in enumerate(ERRATA) if getattr(e, n))
    f = cfg.addr_filter
    return (errata, _u64("addr_cfg", f.addr_cfg),
            tuple(_u64(f"addr{n}_a", f.a[n]) for n in range(4)),
            tuple(_u64(f"addr{n}_b", f.b[n]) for n in range(4)),
            # 2**32: the shifts by mtc_freq stay exact in 64 bits; 2**56:
            # nom_freq << 8 (the twin's unbounded integer) fits
            _u64("mtc_freq", cfg.mtc_freq, 1 << 32),
            _u64("nom_freq", cfg.nom_freq, 1 << 56),
            _u64("cpuid_0x15_eax", cfg.cpuid_0x15_eax),
            _u64("cpuid_0x15_ebx", cfg.cpuid_0x15_ebx),
            bool(cfg.enable_tick_events), bool(cfg.enable_iflags_events),
            bool(cfg.keep_tcal_on_ovf), cfg.error_offsets == "2.0",
            bool(cfg.end_on_call), bool(cfg.end_on_jump),
            bool(getattr(cfg, "strict", False)))


def core_decoder(data, image, config=None, *, block=True, resync=False,
            want_insns=False, plain_offsets=False, release=None,
            impl="compiled"):
    """A compiled core ``Decoder`` over ``data`` in ``image`` (see
    _c_flow.c); ``release``: a file mapping's release_before (taken from
    ``data`` if it has one)."""
    core = _core(impl)
    if core is None:
        raise RuntimeError("compiled flow core unavailable: "
                           f"{STATUS.reason}")
    flags = (F_BLOCK if block else 0) | (F_RESYNC if resync else 0) | \
        (F_WANT_INSNS if want_insns else 0) | \
        (F_PLAIN_OFFSETS if plain_offsets else 0)
    if release is None:
        release = getattr(data, "release_before", None)
    return core.Decoder(data, image, (filler, mappings),
                        config_tuple(config), flags, release)


class _ErrorSink:
    """Counts like sinks.CountSink and keeps the errors (the Python
    twin's side of :func:`count`)."""

    needs_offset = False

    def __init__(self):
        from hwtrace.x86.insn import IClass
        self.insns = self.blocks = self.events = 0
        self.errors = []
        self._from = None
        self.edges = None
        self._plain = (int(IClass.OTHER), int(IClass.PTWRITE))

    def insn(self, insn, offset):
        self.insns += 1
        if self.edges is not None:
            f = self._from
            if f is not None:
                key = (f, insn.ip)
                self.edges[key] = self.edges.get(key, 0) + 1
            c = insn.iclass
            self._from = insn.ip if c not in self._plain else None

    def block(self, block, offset):
        self.blocks += 1
        self.insns += block.ninsn

    def event(self, ev, offset):
        self.events += 1

    def error(self, kind, offset, ip, code):
        self.errors.append((kind, offset, ip, code))
        self._from = None

    def status(self, name, offset):
        pass


def _python_decoder(data, image, config, block: bool):
    if block:
        from .block import BlockDecoder
        return BlockDecoder(data, image, config)
    from .insn import InsnDecoder
    return InsnDecoder(data, image, config)


def _python_run(dec, block: bool, resync: bool, sink):
    from . import session
    if block:
        session.run_blocks(dec, sink, resync=resync)
    else:
        session.run_insn(dec, sink, resync=resync)


def count(data, image, config=None, decoder="block", impl=None,
          resync=False, wrap=None) -> Counts:
    """Instructions (and blocks) ``hwtrace decode --quiet --stat`` counts,
    with the errors it reports.  ``wrap(decoder)``: an address-space
    switcher around the decoder (:class:`.spaces.SpaceSwitcher`, as the
    bundle decode builds it), called back by the core."""
    block = decoder == "block"
    if _core(impl) is not None:
        dec = _switched_decoder(data, image, config, block, impl, resync,
                                wrap)
        insns, blocks, events, errors = dec.counts()
        return Counts(insns, blocks, len(errors), True, events,
                      tuple(errors))
    sink = _ErrorSink()
    dec = _python_decoder(data, image, config, block)
    if wrap is not None:
        dec = wrap(dec)
    _python_run(dec, block, resync, sink)
    return Counts(sink.insns, sink.blocks if block else 0, len(sink.errors),
                  False, sink.events, tuple(sink.errors))


def compiled_count(data, image, config=None, decoder="block",
                   impl=None) -> Counts | None:
    """Counts from the compiled core, or None if there is no core."""
    if _core(impl) is None:
        return None
    return count(data, image, config, decoder, impl or "compiled")


def count_into(sink, data, image, config, block: bool,
               resync: bool = False, wrap=None) -> bool:
    """For ``hwtrace decode --quiet --stat``: if the compiled core is in
    use, decode with it (``wrap``: see :func:`count`), add its counts to
    ``sink`` (a sinks.CountSink) and hand it the errors in order; True.
    False without a core (the caller runs the Python decoder)."""
    if CORE is None:
        return False
    c = count(data, image, config, "block" if block else "insn",
              resync=resync, wrap=wrap)
    for kind, offset, ip, code in c.error_items:
        sink.error(kind, offset, ip, code)
    sink.insns += c.insns
    sink.blocks += c.blocks
    sink.events += c.events
    return True


class EdgeSink(_ErrorSink):
    """A session sink that counts edges from the instruction stream."""

    def __init__(self):
        super().__init__()
        self.edges = {}

    @property
    def counts(self):
        return self.edges


def _switched_decoder(data, image, config, block, impl, resync, wrap):
    """The compiled core's decoder for counts or edges, switched by
    ``wrap(flow)`` (an address-space switcher around it, called back by
    the core) where given."""
    dec = core_decoder(data, image, config, block=block, resync=resync,
                       plain_offsets=wrap is not None,
                       impl=impl or "compiled")
    if wrap is not None:
        flow = _CoreFlow(dec, data, config)
        dec.set_hooks(*flow.hooks(wrap(flow)))
    return dec


def edges(data, image, config=None, impl=None, resync=False,
          wrap=None) -> Edges:
    """Exact edge counts of the trace (see the module docstring);
    ``wrap``: an address-space switcher, as for :func:`count` (a bundle's
    stream that runs several processes)."""
    if _core(impl) is not None:
        dec = _switched_decoder(data, image, config, False, impl, resync, wrap)
        counts, insns, errors = dec.edges()
        return Edges(counts, insns, len(errors), True)
    sink = EdgeSink()
    dec = _python_decoder(data, image, config, False)
    _python_run(dec if wrap is None else wrap(dec), False, resync, sink)
    return Edges(sink.edges, sink.insns, len(sink.errors), False)


def packed_edges(data, image, config=None, impl=None,
                 resync=False, wrap=None) -> PackedEdges:
    """:func:`edges` as a packed table (the core sorts and packs it; the
    twin's dict is packed by :func:`pack_edges`)."""
    if _core(impl) is not None:
        dec = _switched_decoder(data, image, config, False, impl, resync, wrap)
        table, insns, errors = dec.edges(True)
        return PackedEdges(table, insns, len(errors), True)
    e = edges(data, image, config, impl, resync, wrap)
    return PackedEdges(pack_edges(e.counts), e.insns, e.errors, False)


#: a packed table's edge: from_ip, to_ip, n (:func:`_struct`)
_EDGE = "<QQQ"
#: bytes per edge in a packed table
EDGE_BYTES = 24


def pack_edges(counts: dict) -> bytes:
    """A :class:`PackedEdges` table of ``{(from_ip, to_ip): n}``."""
    edge = _struct(_EDGE)
    out = bytearray(EDGE_BYTES * len(counts))
    for j, ((f, t), n) in enumerate(sorted(counts.items())):
        edge.pack_into(out, j * EDGE_BYTES, f, t, n)
    return bytes(out)


def unpack_edges(table: bytes) -> dict:
    """``{(from_ip, to_ip): n}`` of a packed table."""
    return {(f, t): n for f, t, n in _struct(_EDGE).iter_unpack(table)}


def edge_text(table: bytes, lines: bool = True,
              binary: bool = False) -> tuple:
    """(text, taken) of a packed table: ``coverage --edges``'s lines
    ``FROM TO COUNT`` (16 hex digits, decimal) in the table's order as a
    str (None if not ``lines``; ``binary``: as ASCII bytes, what the
    command writes), and the sum of the counts.  The core formats them
    when it is in use; the twin here gives the same text."""
    if CORE is not None:
        text, taken = CORE.edge_text(table, lines)
        if lines and not binary:
            text = text.decode("ascii")
        return (text if lines else None), taken
    rows = list(_struct(_EDGE).iter_unpack(table))
    text = "".join(f"{f:016x} {t:016x} {n}\n" for f, t, n in rows) \
        if lines else None
    if text is not None and binary:
        text = text.encode("ascii")
    return text, sum(n for _f, _t, n in rows)


_GOLDEN = 0x9E3779B97F4A7C15


def edge_index(from_ip: int, to_ip: int, size: int = 1 << 16) -> int:
    """The bitmap index of an edge (see the module docstring)."""
    hf = ((from_ip * _GOLDEN) & MASK64) >> 48
    ht = ((to_ip * _GOLDEN) & MASK64) >> 48
    return (hf ^ (ht >> 1)) % size


def edge_bitmap(counts: dict, size: int = 1 << 16) -> bytearray:
    """An AFL-style hit-count map of ``size`` bytes from edge counts."""
    bm = bytearray(size)
    for (f, t), n in counts.items():
        i = edge_index(f, t, size)
        bm[i] = min(255, bm[i] + n)
    return bm


# -- batches (docs/pipeline.md) ------------------------------------------------

class _CoreFlow:
    """What an address-space switcher (:class:`.spaces.SpaceSwitcher`)
    reads of the decoder it wraps and calls on it, over a compiled core
    ``Decoder``: the switcher's rules run unchanged, called back from the
    core after each synchronization and each event (the verbs return what
    the core just did)."""

    def __init__(self, dec, data, config):
        self._dec = dec
        self.config = config or FlowConfig()
        self.query = _CoreQuery(dec, data)
        self._last = None

    @property
    def ip(self) -> int:
        return self._dec.ip

    @property
    def enabled(self) -> bool:
        return self._dec.enabled

    @property
    def offset(self) -> int:
        return self._dec.offset

    @property
    def event_start(self) -> int | None:
        return self._dec.event_start

    @property
    def decoded(self) -> int:
        """Instructions decoded so far (an instruction clock's count)."""
        return self._dec.decoded

    def set_image(self, image) -> None:
        self._dec.set_image(image)

    def time(self):
        return self._dec.time()

    def time_ahead(self, limit: int, after: int | None = None):
        return self._dec.time_ahead(limit, after)

    # the verbs a switcher wraps: what the core just returned
    def sync_forward(self):
        return 0

    def event(self):
        return self._last

    def hooks(self, switcher):
        def after_sync(dec):
            switcher.sync_forward()

        def after_event(dec, ev):
            self._last = (0, ev)
            switcher.event()
        # the core calls after_event only for the types that can change
        # the switcher's choice, if it says which (None: every event), and
        # nothing at all where nothing can (a one-process stream)
        events = getattr(switcher, "events", None)
        syncs = getattr(switcher, "syncs", True)
        return (after_sync if syncs else None,
                after_event if events is None or events else None, events)


class _CoreQuery:
    """The query-decoder attributes a switcher reads (its position, the
    trace buffer)."""

    def __init__(self, dec, data):
        self._dec = dec
        self._pkt = _Buffer(data)

    @property
    def pos(self):
        return self._dec.pos


class _Buffer(namedtuple("_Buffer", "buffer")):
    __slots__ = ()


def compiled_batches(core, data, image, config=None, *, decoder="block",
                     resync=False, want_insns=False, max_records=1 << 16,
                     spaces=None, space_items=False, plain_events=False):
    """The compiled core's batches (see :func:`hwtrace.flow.batches.batches`):
    the same records, items and batch boundaries as the twin's
    ``python_batches``.  ``spaces``: a :class:`.spaces.SpacePlan`;
    ``space_items``: each address-space switch is a ``SpaceItem`` among
    the items, where the switcher made it; ``plain_events``: events a row
    tells exactly are ``Batch.plain`` rows (:mod:`.plain`)."""
    import numpy as np

    from . import batches as B
    if decoder not in ("block", "insn"):
        raise ValueError(f"unknown decoder {decoder!r}")
    core.set_item_types(B.ErrorItem, B.StatusItem)
    flags = (F_BLOCK if decoder == "block" else 0) | \
        (F_RESYNC if resync else 0) | (F_WANT_INSNS if want_insns else 0) | \
        (F_PLAIN_EVENTS if plain_events else 0)
    if spaces is not None:
        # the twin's session offsets through a switcher are dec.offset
        flags |= F_PLAIN_OFFSETS
    dec = core.Decoder(data, image, (filler, mappings),
                       config_tuple(config), flags,
                       getattr(data, "release_before", None))
    if spaces is not None:
        if space_items:
            told = spaces.on_switch

            def on_switch(space, offset):
                dec.add_item(offset, B.SpaceItem(space, offset))
                if told is not None:
                    told(space, offset)
            spaces = spaces.replace(on_switch=on_switch)
        flow = _CoreFlow(dec, data, config)
        dec.set_hooks(*flow.hooks(spaces.wrap(flow)))
    block_t, insn_t = B.BLOCK, B.INSN
    Batch = B.Batch
    if plain_events:
        from .plain import PLAIN
    max_records = max(1, max_records)
    limit = min(B.FIRST_BATCH, max_records)

    def gen(limit=limit):
        while True:
            r = dec.batch(limit)
            if r is None:
                return
            blocks, insns, items, first = r[:4]
            yield Batch(np.frombuffer(blocks, block_t),
                        None if insns is None else np.frombuffer(insns, insn_t),
                        items, first,
                        np.frombuffer(r[4], PLAIN) if plain_events else None)
            limit = min(limit * 2, max_records)
    return gen()


def compiled_segment(data, image, config, block: bool, start: int,
                     stop_at: int, tail: int, head: int, resync=False,
                     impl=None):
    """One job of the parallel counts path (:mod:`.fast_parallel`): the
    counts from the PSB at ``start`` (-1: the trace start) with checkpoints
    (see core/segment.h): ``(insns, blocks, events, errors, [(psb, key,
    stack, (insns, blocks, events, errors))], underflows, stopped)``.
    None if there is no core."""
    if _core(impl) is None:
        return None
    dec = core_decoder(data, image, config, block=block, resync=resync,
                       impl=impl or "compiled")
    return dec.segment(start, stop_at, tail, head)


def state_probe(data, image, config, block: bool, start: int, impl=None):
    """The checkpoint key's self-check (a test hook): for every state field
    and every field of a queued or processed event, whether flipping it
    changes the key, at the first checkpoint after the PSB at ``start``."""
    dec = core_decoder(data, image, config, block=block,
                       impl=impl or "compiled")
    return dec.state_probe(start)
