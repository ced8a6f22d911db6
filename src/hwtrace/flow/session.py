"""Decode a whole trace the way ptxed drives the decoders.

:func:`run_insn` and :func:`run_blocks` synchronize, drain events, decode
instructions (or blocks) until an error or the end of the trace, report
the error and resynchronize at the next PSB (or, with ``resync``, resume
right after the error the way libipt's ``pt_insn_resync`` does), and hand
everything to a *sink*:

    sink.insn(insn, offset)             # a FlowInsn
    sink.event(ev, offset)              # an Event (status updates too)
    sink.block(block, offset)           # blocks only (a Block)
    sink.error(kind, offset, ip, code)  # kind: "sync error" | "error" | ...
    sink.status(name, offset)           # "end_of_trace", "resynced"

The loops themselves are generators (:func:`iter_insn`,
:func:`iter_blocks`) yielding those calls as tuples, so a consumer can
pull (:mod:`.batches` groups them into record batches) and
:func:`deliver` pushes them into a sink.

No printing here: the sinks in :mod:`.sinks` format ptxed text or JSON.
"""

from __future__ import annotations

from hwtrace.pt import errors as E

from .insn import DecodeError
from .status import EOS, EVENT_PENDING, IP_SUPPRESSED


def _offset23(dec) -> int:
    """The trace offset libipt 2.3 reports at this point (where its event
    decoder stands, one event ahead; see :mod:`.evtpos`)."""
    f = getattr(dec, "error_offset", None)
    if f is None:
        f = getattr(getattr(dec, "insn", None), "error_offset", None)
    return f() if f is not None else dec.offset


#: what the step generators yield (first element of each tuple)
INSN, BLOCK, EVENT, ERROR, STATUS = range(5)


def _drain(dec, status):
    """Fetch pending events, yielding (EVENT, ev, offset); returns the
    last status or the DecodeError that stopped it."""
    while status & EVENT_PENDING:
        offset = _offset23(dec)
        r = dec.event()
        if r.__class__ is DecodeError:
            return r
        status, ev = r
        yield (EVENT, ev, offset)
    return status


def _resynced(dec, status):
    return (STATUS, "resynced", _offset23(dec),
            bool(status & IP_SUPPRESSED))


#: what :func:`_recover` returns when decoding goes on at the next PSB
_SYNC = object()


def _sync(dec, last):
    """Synchronize forward (ptxed's outer loop, both decoders), yielding a
    "sync error" step per failed attempt; returns the status to decode
    from, or None at the end of the trace (or where an attempt got no
    further than the one before: ``last[0]``, the offset it reached)."""
    while True:
        r = dec.sync_forward()
        if r.__class__ is not DecodeError:
            return r
        if r.code == E.EOS:
            return None
        yield (ERROR, "sync error", dec.offset, 0, r.code)
        pos = dec.offset
        if pos <= last[0]:
            return None
        last[0] = pos


def _recover(dec, err, resync):
    """After the decode stopped at ``err`` (None: the end of the trace),
    both decoders: yield the "error" step and, with ``resync``, try to go
    on right after it (a "resync error", or the "resynced" status);
    returns the status to go on from, :data:`_SYNC` (synchronize at the
    next PSB), or None (the trace is done)."""
    if err is None or err.code == E.EOS:
        return None
    yield (ERROR, "error", err.offset, err.ip, err.code)
    if not resync:
        return _SYNC
    r = dec.resync()
    if r.__class__ is DecodeError:
        if r.code == E.EOS:
            return None
        yield (ERROR, "resync error", r.offset, err.ip, r.code)
        return _SYNC
    yield _resynced(dec, r)
    return r


def iter_insn(dec, resync: bool = False, want_offset: bool = True):
    """Drive an :class:`~hwtrace.flow.insn.InsnDecoder` over its trace,
    yielding what a sink is handed, in order: ``(INSN, insn, offset)``,
    ``(EVENT, ev, offset)``, ``(ERROR, kind, offset, ip, code)``,
    ``(STATUS, name, offset, ip_suppressed)`` (``ip_suppressed`` None for
    "end_of_trace").  ``want_offset`` False passes 0 as an instruction's
    offset (saves a property read per instruction)."""
    last_sync = [0]
    offset = 0
    while True:
        status = yield from _sync(dec, last_sync)
        if status is None:
            return
        last_ip = 0
        while True:
            err = None
            while True:
                status = yield from _drain(dec, status)
                if status.__class__ is DecodeError:
                    err = DecodeError(status.code, status.offset, last_ip)
                    break
                if status & EOS:
                    if not status & IP_SUPPRESSED:
                        yield (STATUS, "end_of_trace", _offset23(dec), None)
                    break
                if want_offset:
                    offset = dec.offset
                r = dec.next()
                if r.__class__ is DecodeError:
                    if r.insn is not None:
                        yield (INSN, r.insn, offset)
                    err = r
                    break
                status, insn = r
                last_ip = insn.ip
                yield (INSN, insn, offset)
            status = yield from _recover(dec, err, resync)
            if status is None:
                return
            if status is _SYNC:
                break
            last_ip = err.ip


def iter_blocks(dec, resync: bool = False):
    """Drive a :class:`~hwtrace.flow.block.BlockDecoder`; ptxed's block
    loop.  Yields like :func:`iter_insn`, with ``(BLOCK, block, offset)``
    instead of instructions.  (After a resync, an error in draining the
    events gives the last block's end as its ip, where :func:`iter_insn`
    gives the ip of the error resynchronized from.)"""
    from .block import BlockError

    last_sync = [0]
    while True:
        status = yield from _sync(dec, last_sync)
        if status is None:
            return
        last_ip = 0
        while True:
            err = None
            while True:
                status = yield from _drain(dec, status)
                if status.__class__ is DecodeError:
                    err = DecodeError(status.code, status.offset, last_ip)
                    break
                if status & EOS:
                    if not status & IP_SUPPRESSED:
                        yield (STATUS, "end_of_trace", _offset23(dec), None)
                    break
                offset = dec.offset
                r = dec.next()
                if r.__class__ is BlockError:
                    if r.block is not None:
                        yield (BLOCK, r.block, offset)
                    err = DecodeError(r.code, r.offset, r.ip)
                    break
                status, block = r
                last_ip = block.end_ip
                yield (BLOCK, block, offset)
            status = yield from _recover(dec, err, resync)
            if status is None:
                return
            if status is _SYNC:
                break


def deliver(steps, sink) -> int:
    """Hand what a step generator yields to a sink; returns the number of
    instructions.  A "resynced" status goes to ``sink.status_ex`` where
    the sink has one (ptoracle's ``ip_suppressed`` with it)."""
    n = 0
    on_insn = getattr(sink, "insn", None)
    on_block = getattr(sink, "block", None)
    ex = getattr(sink, "status_ex", None)
    for step in steps:
        k = step[0]
        if k == INSN:
            on_insn(step[1], step[2])
            n += 1
        elif k == BLOCK:
            on_block(step[1], step[2])
            n += step[1].ninsn
        elif k == EVENT:
            sink.event(step[1], step[2])
        elif k == ERROR:
            sink.error(step[1], step[2], step[3], step[4])
        elif step[3] is None or ex is None:
            sink.status(step[1], step[2])
        else:
            ex(step[1], step[2], ip_suppressed=step[3])
    return n


def run_insn(dec, sink, resync: bool = False, max_insns: int = 0) -> int:
    """Drive an :class:`~hwtrace.flow.insn.InsnDecoder` over its trace into
    ``sink``.  Returns the number of instructions (stops after
    ``max_insns`` if that is not 0)."""
    steps = iter_insn(dec, resync, getattr(sink, "needs_offset", True))
    if not max_insns:
        return deliver(steps, sink)

    def limited():
        n = 0
        for step in steps:
            yield step
            if step[0] == INSN:
                n += 1
                if n >= max_insns:
                    return
    return deliver(limited(), sink)


def run_blocks(dec, sink, resync: bool = False) -> int:
    """Drive a :class:`~hwtrace.flow.block.BlockDecoder` into ``sink``;
    ptxed's block loop.  Returns the number of instructions."""
    return deliver(iter_blocks(dec, resync), sink)
