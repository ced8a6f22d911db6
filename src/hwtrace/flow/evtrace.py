"""Event-trace packets (CFE, EVD) and TRIG in the query decoder.

Kept apart from :mod:`.query` because these are the newest and least
settled part of the format: CFE (control-flow event) packets announce
interrupts, IRET, SMI/RSM, SIPI/INIT, VM entry/exit, shutdown, UINTR and
UIRET, software interrupts and syscalls; EVD packets carry their extra
data (CR2, VMX reasons and qualifications) and precede the CFE; an event
whose CFE has the IP bit binds to the following FUP.
"""

from __future__ import annotations


class EventTraceState:
    __slots__ = ("evd",)

    def __init__(self):
        self.evd = []


def bind_tip(q, ev) -> bool:
    return False


def bind_tip_pge(q, ev) -> bool:
    return False


def bind_tip_pgd(q, ev) -> bool:
    return False


def bind_fup(q, ev) -> bool:
    """An event-trace or TRIG event waiting for a FUP gets its IP."""
    if ev.type == "trig":
        q.consume_packet = True
        q._event_ip(ev)
        return True
    return False


def fup_pending(q) -> bool:
    return False


def bind_fup_cfe(q) -> None:
    pass


def mode_exec(q, pkt) -> None:
    pass


def mode_exec_header(q, pkt) -> None:
    pass


def decode_cfe(q, pkt) -> None:
    q._consume()


def decode_evd(q, pkt) -> None:
    q._consume()


def decode_trig(q, pkt) -> None:
    """TRIG: with its IP bit it binds to the next FUP; otherwise it is
    reported after ``icnt`` more instructions (when ``icntv``), which the
    instruction decoder counts."""
    from .events import BIND_FUP
    ev = q._new_event("trig", trbv=pkt.trbv, icnt=pkt.icnt,
                      mult=bool(pkt.mult))
    ev.icntv = bool(pkt.icntv)
    if pkt.ip:
        q.evq.enqueue(BIND_FUP, ev)
    else:
        ev.ip_suppressed = True
        q.published = ev
    q._consume()
