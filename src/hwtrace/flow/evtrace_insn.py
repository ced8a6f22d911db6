"""How the instruction decoder treats event-trace events (interrupt,
iret, vmexit, …), TRIG and iflags: where they bind and what they change."""

from __future__ import annotations


def check_insn_event(dec, ev, insn, x):
    """Status if ``ev`` binds to the instruction just decoded, else None."""
    return None


def check_ip_event(dec, ev, pending: int) -> int:
    """Status for ``ev`` at the current IP (``pending`` if it binds)."""
    if ev.type == "trig":
        if not dec.enabled:
            return pending
        if not ev.ip_suppressed:
            return pending if ev.ip == dec.ip else dec._status(0)
        if ev.get("icntv", False):
            if dec.icount != ev.icnt:
                return dec._status(0)
            ev.ip = dec.ip
            ev.ip_suppressed = False
            ev.icnt = 0     # used up: the event is at its place now
        return pending
    return pending


def process_event(dec, ev) -> None:
    """Apply ``ev`` to the decoder state when the user fetches it."""
    if ev.type == "trig":
        if not ev.ip_suppressed and dec.enabled and ev.ip != dec.ip:
            from hwtrace.pt import errors as E
            from .insn import _Err
            raise _Err(E.BAD_QUERY)
    return None
