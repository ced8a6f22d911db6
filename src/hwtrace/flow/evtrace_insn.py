"""How the instruction decoder treats event-trace events (interrupt,
iret, vmexit, …), TRIG and iflags: where they bind and what they change.

Event-trace events (see :mod:`.evtrace` for how the query decoder binds
them to packets), while tracing is enabled:

* returns (IRET, VM entry, UIRET) with an IP bind to the instruction at
  that IP: it is reported first, then the event;
* other events with an IP happen before the instruction at their IP;
* IP-less events that went with a FUP happen at the FUP's IP (``at``);
* IP-less events that went with a TIP bind to the next instruction that
  needs trace (the branch that TIP completes);
* anything else, and everything while tracing is disabled, at once.
"""

from __future__ import annotations

from . import fetch as F
from .evtrace import TYPES

# Event-trace events that complete at an instruction (returns).
_AT_INSN = frozenset(("iret", "vmentry", "uiret"))


def check_insn_event(dec, ev, insn, x):
    """Status if ``ev`` binds to the instruction just decoded, else None."""
    if ev.type not in TYPES or not dec.enabled:
        return None
    bind = ev.get("bind", None)
    if bind == "insn":
        if F.next_ip(insn.ip, x) is not None:
            return None
    elif bind is not None or ev.ip_suppressed or ev.type not in _AT_INSN \
            or insn.ip != ev.ip:
        return None
    return dec._postpone(insn, x)


def check_ip_event(dec, ev, pending: int) -> int:
    """Status for ``ev`` at the current IP (``pending`` if it binds)."""
    t = ev.type
    if t == "trig":
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
    if t in TYPES and dec.enabled:
        bind = ev.get("bind", None)
        if bind == "insn":
            return dec._status(0)
        if bind == "ip":
            return pending if ev.at == dec.ip else dec._status(0)
        if not ev.ip_suppressed:
            if t in _AT_INSN or ev.ip != dec.ip:
                return dec._status(0)
    return pending


def process_event(dec, ev) -> None:
    """Apply ``ev`` to the decoder state when the user fetches it."""
    if ev.type == "trig":
        if not ev.ip_suppressed and dec.enabled and ev.ip != dec.ip:
            from hwtrace.pt import errors as E
            from .insn import _Err
            raise _Err(E.BAD_QUERY)
    return None
