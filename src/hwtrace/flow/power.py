"""Power events (EXSTOP, MWAIT, PWRE, PWRX) and PTWRITE in the query
decoder: which event each packet makes and what it binds to (an EXSTOP
or PTW with its IP bit binds to the next FUP; MWAIT and PWRE wait for the
EXSTOP / PWRX they go with)."""

from __future__ import annotations

from hwtrace.pt import errors as E

from .events import BIND_EXSTOP, BIND_FUP


def _fail(code: str):
    from .query import Fail
    return Fail(code)


def decode_exstop(q, pkt) -> None:
    # MWAITs waiting for this EXSTOP bind to the FUP it binds to, or
    # are reported now (without IP) if it has none.
    mwait = q.evq.take(BIND_EXSTOP, "mwait")
    if mwait is not None:
        if pkt.ip:
            q.evq.enqueue(BIND_FUP, mwait)
        else:
            mwait.ip_suppressed = True
            q.published = mwait
        return
    ev = q._new_event("exstop")
    if pkt.ip:
        q.evq.enqueue(BIND_FUP, ev)
    else:
        ev.ip_suppressed = True
        q.published = ev
    q._consume()


def decode_mwait(q, pkt) -> None:
    ev = q._new_event("mwait", hints=pkt.hints, ext=pkt.ext)
    q.evq.enqueue(BIND_EXSTOP, ev)
    q._consume()


def decode_pwre(q, pkt) -> None:
    # A power entry is reported after the EXSTOP (and the MWAIT) it
    # goes with, i.e. it waits for the power exit (or an overflow).
    ev = q._new_event("pwre", state=pkt.state,
                      sub_state=pkt.sub_state, hw=bool(pkt.hw))
    q.evq.enqueue(BIND_EXSTOP, ev)
    q._consume()


def decode_pwrx(q, pkt) -> None:
    ev = q.evq.dequeue(BIND_EXSTOP)
    if ev is not None:
        if ev.type != "pwre":
            ev.ip_suppressed = True
        q.published = ev
        return
    q.published = q._new_event(
        "pwrx", last=pkt.last, deepest=pkt.deepest,
        interrupt=bool(pkt.interrupt), store=bool(pkt.store),
        autonomous=bool(pkt.autonomous))
    q._consume()


def decode_ptw(q, pkt) -> None:
    size = 4 if pkt.plc == 0 else 8 if pkt.plc == 1 else 0
    if not size:
        raise _fail(E.BAD_PACKET)
    ev = q._new_event("ptwrite", size=size, payload=pkt.payload)
    if pkt.ip:
        q.evq.enqueue(BIND_FUP, ev)
    else:
        ev.ip_suppressed = True
        q.published = ev
    q._consume()
