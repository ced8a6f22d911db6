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


def _resynced(sink, dec, status) -> None:
    """Report a resynchronization; sinks with ``status_ex`` also get
    whether tracing is off there (ptoracle's ``ip_suppressed``)."""
    ex = getattr(sink, "status_ex", None)
    if ex is None:
        sink.status("resynced", _offset23(dec))
    else:
        ex("resynced", _offset23(dec),
           ip_suppressed=bool(status & IP_SUPPRESSED))


def _drain(dec, status, sink):
    """Fetch and report pending events; returns the last status or the
    DecodeError that stopped it."""
    while status & EVENT_PENDING:
        offset = _offset23(dec)
        r = dec.event()
        if r.__class__ is DecodeError:
            return r
        status, ev = r
        sink.event(ev, offset)
    return status


def run_insn(dec, sink, resync: bool = False, max_insns: int = 0) -> int:
    """Drive an :class:`~hwtrace.flow.insn.InsnDecoder` over its trace.
    Returns the number of instructions."""
    ninsn = 0
    last_sync = 0
    want_offset = getattr(sink, "needs_offset", True)
    on_insn = sink.insn
    offset = 0
    while True:
        r = dec.sync_forward()
        last_ip = 0
        if r.__class__ is DecodeError:
            if r.code == E.EOS:
                break
            sink.error("sync error", dec.offset, 0, r.code)
            pos = dec.offset
            if pos <= last_sync:
                break
            last_sync = pos
            continue
        status = r
        while True:
            err = None
            while True:
                status = _drain(dec, status, sink)
                if status.__class__ is DecodeError:
                    err = status
                    err = DecodeError(err.code, err.offset, last_ip)
                    break
                if status & EOS:
                    if not status & IP_SUPPRESSED:
                        sink.status("end_of_trace", _offset23(dec))
                    err = None
                    break
                if want_offset:
                    offset = dec.offset
                r = dec.next()
                if r.__class__ is DecodeError:
                    if r.insn is not None:
                        on_insn(r.insn, offset)
                        ninsn += 1
                    err = r
                    break
                status, insn = r
                last_ip = insn.ip
                on_insn(insn, offset)
                ninsn += 1
                if max_insns and ninsn >= max_insns:
                    return ninsn
            if err is None:
                return ninsn
            if err.code == E.EOS:
                return ninsn
            sink.error("error", err.offset, err.ip, err.code)
            if not resync:
                break
            r = dec.resync()
            if r.__class__ is DecodeError:
                if r.code == E.EOS:
                    return ninsn
                sink.error("resync error", r.offset, err.ip, r.code)
                break
            status = r
            last_ip = err.ip
            _resynced(sink, dec, status)
    return ninsn


def run_blocks(dec, sink, resync: bool = False) -> int:
    """Drive a :class:`~hwtrace.flow.block.BlockDecoder`; ptxed's block
    loop.  Returns the number of instructions."""
    from .block import BlockError

    ninsn = 0
    last_sync = 0
    while True:
        r = dec.sync_forward()
        last_ip = 0
        if r.__class__ is DecodeError:
            if r.code == E.EOS:
                break
            sink.error("sync error", dec.offset, 0, r.code)
            pos = dec.offset
            if pos <= last_sync:
                break
            last_sync = pos
            continue
        status = r
        while True:
            err = None
            while True:
                status = _drain(dec, status, sink)
                if status.__class__ is DecodeError:
                    err = DecodeError(status.code, status.offset, last_ip)
                    break
                if status & EOS:
                    if not status & IP_SUPPRESSED:
                        sink.status("end_of_trace", _offset23(dec))
                    break
                offset = dec.offset
                r = dec.next()
                if r.__class__ is BlockError:
                    if r.block is not None:
                        sink.block(r.block, offset)
                        ninsn += r.block.ninsn
                    err = DecodeError(r.code, r.offset, r.ip)
                    break
                status, block = r
                last_ip = block.end_ip
                sink.block(block, offset)
                ninsn += block.ninsn
            if err is None or err.code == E.EOS:
                return ninsn
            sink.error("error", err.offset, err.ip, err.code)
            if not resync:
                break
            r = dec.resync()
            if r.__class__ is DecodeError:
                if r.code == E.EOS:
                    return ninsn
                sink.error("resync error", r.offset, err.ip, r.code)
                break
            status = r
            _resynced(sink, dec, status)
    return ninsn
