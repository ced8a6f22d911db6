"""Decoded flow in batches: the one shape every view consumes.

See ``docs/pipeline.md``.  A :class:`Batch` holds a numpy array of
records (:data:`BLOCK`: one per block, or per run of the instruction
decoder), optionally every instruction (:data:`INSN`), and the events,
errors and statuses between them (``items``: ``(index, offset, item)``
with ``index`` the number of the batch's records before the item).

Two producers, identical record for record:

* the compiled core (:mod:`hwtrace.flow._c_flow`), when it has
  ``decode_batches``;
* :func:`python_batches`, the twin: the reference decoders driven as
  :mod:`.session` drives them, grouped into records.

:func:`batches` picks one (``impl`` "compiled" | "python" | None: the
compiled core where it loaded, as ``HWTRACE_NO_EXTENSIONS`` says).
:func:`replay` hands batches to a :mod:`.session` sink, so every sink
(ptxed text, JSON, counts) works on either producer's output.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np

from hwtrace.x86.insn import IClass

from .config import FlowConfig

BLOCK = np.dtype([("ip", "<u8"), ("end_ip", "<u8"), ("offset", "<u8"),
                  ("tsc", "<u8"), ("ninsn", "<u4"), ("iclass", "u1"),
                  ("size", "u1"), ("mode", "u1"), ("flags", "u1")])
INSN = np.dtype([("ip", "<u8"), ("size", "u1"), ("iclass", "u1")])

# BLOCK flags
SPECULATIVE = 1
TRUNCATED = 2
INDIRECT = 4

MODE_NUMBER = {None: 0, "16bit": 1, "32bit": 2, "64bit": 3}
MODE_NAME = {v: k for k, v in MODE_NUMBER.items()}

_OTHER = int(IClass.OTHER)


class ErrorItem(NamedTuple):
    """A decode error between records (what ``sink.error`` is given)."""

    kind: str           # "sync error" | "error" | "resync error"
    offset: int
    ip: int
    code: str           # libipt's message

    type = "error"


class StatusItem(NamedTuple):
    """A decoder status between records (what ``sink.status`` is given);
    ``ip_suppressed`` is None where the session reports none
    ("end_of_trace")."""

    name: str           # "end_of_trace" | "resynced"
    offset: int
    ip_suppressed: bool | None

    type = "status"


class SpaceItem(NamedTuple):
    """The stream went on in another address space (a bundle stream
    switching processes by the sideband or by PIP): the records after it
    run ``space``'s code (an :class:`~hwtrace.flow.spaces.AddressSpace`).
    ``offset`` is the decoder's when it switched.  A stream with a plan
    has one first, at index 0, for the space it starts in."""

    space: object
    offset: int

    type = "space"


class Batch(NamedTuple):
    blocks: np.ndarray          # BLOCK records
    insns: np.ndarray | None    # INSN records (want_insns) or None
    items: list                 # [(index, offset, Event|ErrorItem|StatusItem)]
    first_insn: int             # instructions of the stream before this batch
    #: with ``plain_events``: the events a row tells exactly, as rows
    #: (:data:`.plain.PLAIN`) instead of items; else None
    plain: np.ndarray | None = None

    @property
    def ninsn(self) -> int:
        return int(self.blocks["ninsn"].sum())


#: the first batch's record limit; each next one doubles up to max_records
FIRST_BATCH = 256


def view_config(config: FlowConfig | None = None) -> FlowConfig:
    """``config`` with every branch ending a block (what views decode
    with: each record's last instruction is its only branch)."""
    cfg = config or FlowConfig()
    if cfg.end_on_call and cfg.end_on_jump:
        return cfg
    return cfg.replace(end_on_call=True, end_on_jump=True)


# -- the compiled core ---------------------------------------------------------

def _core(impl):
    from . import fast
    core = fast._core(impl)
    if core is None or not hasattr(core, "decode_batches"):
        if impl == "compiled":
            raise RuntimeError("the compiled flow core has no batch decoder")
        return None
    return core


def batches(data, image, config: FlowConfig | None = None, *,
            decoder: str = "block", resync: bool = False,
            want_insns: bool = False, max_records: int = 1 << 16,
            impl: str | None = None, spaces=None,
            space_items: bool = False,
            plain_events: bool = False) -> Iterator[Batch]:
    """Decode ``data`` (any buffer) with ``image`` into batches.
    ``spaces``: a :class:`~hwtrace.flow.spaces.SpacePlan` to switch
    address spaces by (``image`` is then its initial space's);
    ``space_items``: each switch is a :class:`SpaceItem` in the items;
    ``plain_events``: the compiled core gives the events a row tells
    exactly as ``Batch.plain`` rows (:mod:`.plain`), not items (the
    twin's batches have none)."""
    core = _core(impl) if impl != "python" else None
    if core is not None:
        from . import fast
        return fast.compiled_batches(core, data, image, config,
                                     decoder=decoder, resync=resync,
                                     want_insns=want_insns,
                                     max_records=max_records, spaces=spaces,
                                     plain_events=plain_events,
                                     **({"space_items": True}
                                        if space_items and spaces is not None
                                        else {}))
    return python_batches(data, image, config, decoder=decoder,
                          resync=resync, want_insns=want_insns,
                          max_records=max_records, plan=spaces,
                          space_items=space_items)


def reports_switches(impl: str | None = None) -> bool:
    """Whether the producer ``batches(impl=...)`` picks gives
    :class:`SpaceItem` s when asked (``space_items=True``)."""
    core = _core(impl) if impl != "python" else None
    if core is None:
        return True
    import inspect
    from . import fast
    return "space_items" in inspect.signature(
        fast.compiled_batches).parameters


# -- the Python twin ---------------------------------------------------------------

def _decoder(data, image, config, decoder):
    if decoder == "block":
        from .block import BlockDecoder
        return BlockDecoder(data, image, config)
    if decoder == "insn":
        from .insn import InsnDecoder
        return InsnDecoder(data, image, config)
    raise ValueError(f"unknown decoder {decoder!r}")


def python_batches(data, image, config: FlowConfig | None = None, *,
                   decoder: str = "block", resync: bool = False,
                   want_insns: bool = False, max_records: int = 1 << 16,
                   dec=None, plan=None,
                   space_items: bool = False) -> Iterator[Batch]:
    """The twin producer.  ``dec`` (optional) is a ready decoder with the
    usual verbs (e.g. a :class:`~hwtrace.flow.spaces.SpaceSwitcher`
    around one); ``data``/``image``/``config`` are then not used.
    ``plan``: a :class:`~hwtrace.flow.spaces.SpacePlan` to switch address
    spaces by; with ``space_items`` each switch becomes a
    :class:`SpaceItem`."""
    g = _Grouper(decoder == "block", want_insns, max_records)
    if dec is None:
        dec = _decoder(data, image, config, decoder)
        if plan is not None:
            if space_items:
                told = plan.on_switch

                def on_switch(space, offset):
                    g.switch(space, offset)
                    if told is not None:
                        told(space, offset)
                plan = plan.replace(on_switch=on_switch)
            dec = plan.wrap(dec)
    g.bind(dec)
    # the twin's session: imported where the twin runs (the compiled
    # path's start-up does without it and the decoders it imports)
    from . import session
    if decoder == "block":
        steps = session.iter_blocks(dec, resync)
    else:
        steps = session.iter_insn(dec, resync)
    return g.run(steps)


def _flow_of(dec):
    """The InsnDecoder inside ``dec`` (a switcher, a block decoder)."""
    d = getattr(dec, "dec", dec)
    return getattr(d, "insn", d)


class _Grouper:
    """Turns session steps into batches (see docs/pipeline.md for what a
    record is with each decoder)."""

    def __init__(self, block: bool, want_insns: bool, max_records: int):
        self.dec = self.flow = None
        self.block = block
        self.want_insns = want_insns
        self.max_records = max(1, max_records)
        self.limit = min(FIRST_BATCH, self.max_records)
        self.first_insn = 0
        self._new()
        self.run_rec = None     # insn decoder: the open record (a list)

    def bind(self, dec) -> None:
        self.dec = dec
        self.flow = _flow_of(dec)

    def switch(self, space, offset: int) -> None:
        """An address-space switch: an item before what follows (an open
        run ends here, its instructions ran in the old space)."""
        self._close_run()
        self.items.append((len(self.recs), offset, SpaceItem(space, offset)))

    def _new(self) -> None:
        self.recs = []
        self.insns = [] if self.want_insns else None
        self.items = []

    def _time(self) -> int:
        tsc, _lost_mtc, _lost_cyc, have = self.dec.time()
        return tsc if have else 0

    def _indirect(self, mode: str | None, ip: int) -> int:
        if mode is None:
            return 0
        d = self.flow.cache.tables[mode].get(ip)
        return INDIRECT if d is not None and d.x86.is_indirect else 0

    # -- records ---------------------------------------------------------------------
    def _add_block(self, b, offset: int, tsc: int) -> None:
        last = b.insns[-1]
        flags = (SPECULATIVE if b.speculative else 0) | \
            (TRUNCATED if b.truncated else 0) | \
            self._indirect(b.mode, b.end_ip)
        self.recs.append((b.ip, b.end_ip, offset, tsc, b.ninsn, b.iclass,
                          last.size, MODE_NUMBER[b.mode], flags))
        if self.insns is not None:
            self.insns.extend((i.ip, i.size, i.iclass) for i in b.insns)

    def _close_run(self) -> None:
        r = self.run_rec
        if r is None:
            return
        self.run_rec = None
        first, last, offset, tsc, n, ins = r
        flags = (SPECULATIVE if last.speculative else 0) | \
            (TRUNCATED if last.truncated else 0) | \
            self._indirect(last.mode, last.ip)
        self.recs.append((first, last.ip, offset, tsc, n, last.iclass,
                          last.size, MODE_NUMBER[last.mode], flags))
        if self.insns is not None:
            self.insns.extend(ins)

    def _add_insn(self, insn, offset: int) -> None:
        r = self.run_rec
        if r is not None:
            last = r[1]
            if r[2] != offset or last.speculative != insn.speculative or \
                    last.mode != insn.mode:
                self._close_run()
                r = None
        if r is None:
            r = self.run_rec = [insn.ip, insn, offset, self._time(), 1, []]
        else:
            r[1] = insn
            r[4] += 1
        if self.insns is not None:
            r[5].append((insn.ip, insn.size, insn.iclass))
        if insn.iclass != _OTHER:
            self._close_run()

    def _batch(self) -> Batch:
        """The records so far (an open run goes on into the next batch:
        batch boundaries never split a record)."""
        blocks = np.array(self.recs, dtype=BLOCK)
        insns = np.array(self.insns, dtype=INSN) \
            if self.insns is not None else None
        b = Batch(blocks, insns, self.items, self.first_insn)
        self.first_insn += int(blocks["ninsn"].sum()) if len(blocks) else 0
        self._new()
        self.limit = min(self.limit * 2, self.max_records)
        return b

    # -- driving -------------------------------------------------------------------------
    def run(self, steps) -> Iterator[Batch]:
        from . import session
        INSN_, BLOCK_, EVENT_, ERROR_ = (session.INSN, session.BLOCK,
                                         session.EVENT, session.ERROR)
        for step in steps:
            k = step[0]
            if k == BLOCK_:
                self._add_block(step[1], step[2], self._time())
            elif k == INSN_:
                self._add_insn(step[1], step[2])
            else:
                self._close_run()
                if k == EVENT_:
                    item = step[1]
                elif k == ERROR_:
                    item = ErrorItem(step[1], step[2], step[3], step[4])
                else:
                    item = StatusItem(step[1], step[2], step[3])
                self.items.append((len(self.recs), step[2], item))
            if len(self.recs) >= self.limit:
                yield self._batch()
        self._close_run()
        if self.recs or self.items:
            yield self._batch()


def flatten(batch_iter) -> tuple[np.ndarray, np.ndarray | None, list]:
    """All records, instructions and items of a batch stream as one batch
    (items re-indexed over all records): what two producers must agree
    on, whatever their batch sizes."""
    recs, insns, items = [], [], []
    n = 0
    have_insns = True
    for b in batch_iter:
        recs.append(b.blocks)
        if b.insns is None:
            have_insns = False
        else:
            insns.append(b.insns)
        items.extend((n + i, off, it) for i, off, it in b.items)
        n += len(b.blocks)
    blocks = np.concatenate(recs) if recs else np.zeros(0, BLOCK)
    ins = (np.concatenate(insns) if insns else np.zeros(0, INSN)) \
        if have_insns else None
    return blocks, ins, items


# -- consumers' helpers -------------------------------------------------------------

def replay(batch_iter, sink, decoder: str = "block") -> int:
    """Hand batches to a :mod:`.session` sink exactly as ``run_blocks`` /
    ``run_insn`` would have (blocks become :class:`~.block.Block` s, runs
    :class:`~.fetch.FlowInsn` s; needs ``want_insns`` batches).  Returns
    the number of instructions.  For tests and the twin's text output;
    fast paths format from the arrays directly."""
    from .block import Block
    from .fetch import FlowInsn
    ex = getattr(sink, "status_ex", None)
    n = 0
    for b in batch_iter:
        if b.insns is None:
            raise ValueError("replay needs batches with want_insns")
        recs = b.blocks.tolist()
        insns = b.insns.tolist()
        items = b.items
        it = 0
        pos = 0
        for i in range(len(recs) + 1):
            while it < len(items) and items[it][0] == i:
                _idx, offset, item = items[it]
                it += 1
                t = item.type
                if t == "error" and isinstance(item, ErrorItem):
                    sink.error(item.kind, item.offset, item.ip, item.code)
                elif t == "status" and isinstance(item, StatusItem):
                    if item.ip_suppressed is None or ex is None:
                        sink.status(item.name, item.offset)
                    else:
                        ex(item.name, item.offset,
                           ip_suppressed=item.ip_suppressed)
                elif t == "space" and isinstance(item, SpaceItem):
                    tell = getattr(sink, "space", None)
                    if tell is not None:
                        tell(item.space, item.offset)
                else:
                    sink.event(item, offset)
            if i == len(recs):
                break
            ip, end_ip, offset, _tsc, ninsn, iclass, size, mode, flags = recs[i]
            mname = MODE_NAME[mode]
            spec = bool(flags & SPECULATIVE)
            trunc = bool(flags & TRUNCATED)
            fl = [FlowInsn(a, s, c, mname, spec, trunc and j == ninsn - 1)
                  for j, (a, s, c) in enumerate(insns[pos:pos + ninsn])]
            pos += ninsn
            n += ninsn
            if decoder == "block":
                sink.block(Block(ip, end_ip, ninsn, tuple(fl), mname, spec,
                                 trunc, iclass), offset)
            else:
                for f in fl:
                    sink.insn(f, offset)
    return n
