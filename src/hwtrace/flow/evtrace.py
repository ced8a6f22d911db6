"""Event-trace packets (CFE, EVD) and TRIG in the query decoder.

Kept apart from :mod:`.query` because these are the newest and least
settled part of the format: CFE (control-flow event) packets announce
interrupts, IRET, SMI/RSM, SIPI/INIT, VM entry/exit, shutdown, UINTR and
UIRET, software interrupts and syscalls; EVD packets carry their extra
data (CR2, VMX exit reason and qualification) and precede the CFE.

Where an event binds, as libipt 2.3 reports it:

* a CFE with its IP bit binds to the next FUP, which gives the event's
  IP and is used up by it;
* a CFE without IP while tracing is disabled stands alone;
* a CFE without IP while tracing is enabled goes with the next IP packet:
  the FUP of an asynchronous branch (the event happens at the FUP's IP,
  which it gets, before that branch) or the TIP / TIP.PGD of the branch
  that needs it (the event binds to that instruction, IP suppressed);
* an EVD the CFE does not take (CR2 for anything but an interrupt, VMX
  data for anything but a VM exit) is a bad packet context at the CFE.

The events' ``bind`` attribute tells the instruction decoder which
(:mod:`.evtrace_insn`): ``"ip"`` (IP-less, at ``at``), ``"insn"`` (the
next instruction that needs trace), unset (the event's own IP, or none).
"""

from __future__ import annotations

from hwtrace.pt import errors as E
from hwtrace.pt.errors import PtError

# CFE type -> event type (libipt's event names).
CFE_EVENTS = {1: "interrupt", 2: "iret", 3: "smi", 4: "rsm", 5: "sipi",
              6: "init", 7: "vmentry", 8: "vmexit", 9: "vmexit",
              10: "shutdown", 12: "uintr", 13: "uiret", 14: "swintr",
              15: "syscall"}
TYPES = frozenset(CFE_EVENTS.values())
# CFE types that carry a vector.
_VECTOR = frozenset((1, 5, 9, 12, 14))
# EVD types (0 CR2, 1 VMX qualification, 2 VMX exit reason) each CFE type
# takes; other EVD types are ignored.
_EVD_KNOWN = frozenset((0, 1, 2))
_EVD_OK = {1: frozenset((0,)), 8: frozenset((1, 2)), 9: frozenset((1, 2))}
# Packets skipped when looking for the IP packet an IP-less CFE goes with.
_SKIP = frozenset(("pad", "tsc", "tma", "mtc", "cyc", "cbr", "mnt", "evd",
                   "cfe", "mode.exec", "mode.tsx", "pip", "vmcs", "ptw",
                   "exstop", "mwait", "pwre", "pwrx", "trig", "unknown"))


class EventTraceState:
    __slots__ = ("evd", "fup")

    def __init__(self):
        self.evd = {}       # EVD type -> payload, waiting for their CFE
        self.fup = []       # CFE events waiting for a FUP (None: ignored)

    def __deepcopy__(self, memo):
        c = EventTraceState()
        c.evd = dict(self.evd)
        c.fup = [copy_event(ev) for ev in self.fup]
        return c


def copy_event(ev):
    if ev is None:
        return None
    import copy
    return copy.copy(ev)


def bind_tip(q, ev) -> bool:
    """A CFE event waiting for a TIP is published there (the TIP stays
    for the branch that needs it)."""
    return ev.type in TYPES


def bind_tip_pge(q, ev) -> bool:
    return ev.type in TYPES


def bind_tip_pgd(q, ev) -> bool:
    return ev.type in TYPES


def bind_fup(q, ev) -> bool:
    """A TRIG event waiting for a FUP gets its IP."""
    if ev.type == "trig":
        q.consume_packet = True
        q._event_ip(ev)
        return True
    return False


def fup_pending(q) -> bool:
    return bool(q.evt.fup)


def bind_fup_cfe(q) -> bool:
    """The FUP at ``q.pos`` completes the first CFE waiting for it.
    Returns True if the FUP is used up (the caller consumes it)."""
    pending = q.evt.fup
    ev = pending.pop(0)
    if ev is None:                      # an unknown CFE with IP
        return not pending
    ip = q.query_ip()
    if ev.get("bind", None) == "ip":
        # IP-less: happens at the FUP's IP (which it gets), the FUP stays
        # for its asynchronous branch.
        ev.at = ip if ip is not None else 0
        if ip is not None:
            ev.ip = ip
            ev.ip_suppressed = False
        q.published = ev
        return False
    if ip is None:
        ev.ip_suppressed = True
    else:
        ev.ip = ip
    q.published = ev
    return not pending


def mode_exec(q, pkt) -> None:
    pass


def mode_exec_header(q, pkt) -> None:
    pass


def _next_ip_packet(q, pos: int) -> str | None:
    """The type of the next IP packet from ``pos`` on, skipping packets
    that do not end an IP-less CFE's search."""
    while True:
        p = q.peek_after(pos)
        if p.__class__ is PtError:
            return None
        t = p.type
        if t not in _SKIP:
            return t
        pos += p.size


def _binding(q, pkt) -> str | None:
    """How an IP-less CFE at ``pkt`` binds: "ip", "insn" or None."""
    if not q.enabled:
        return None
    t = _next_ip_packet(q, pkt.offset + pkt.size)
    if t == "fup":
        return "ip"
    if t in ("tip", "tip.pgd"):
        return "insn"
    return None


def _check_evd(q, pkt) -> None:
    ok = _EVD_OK.get(pkt.cfe_type, frozenset())
    for t in q.evt.evd:
        if t not in ok:
            from .query import Fail
            raise Fail(E.BAD_CONTEXT)


def will_event(q, pkt) -> bool:
    """Does the CFE ``pkt`` publish an event (or fail) when decoded, as
    opposed to waiting for the packet it binds to?"""
    if pkt.cfe_type not in CFE_EVENTS:
        return False
    ok = _EVD_OK.get(pkt.cfe_type, frozenset())
    if any(t not in ok for t in q.evt.evd):
        return True
    if pkt.ip:
        return False
    return _binding(q, pkt) is None


def decode_cfe(q, pkt) -> None:
    name = CFE_EVENTS.get(pkt.cfe_type)
    if name is None:
        q.evt.evd = {}
        if pkt.ip:
            q.evt.fup.append(None)
        q._consume()
        return
    _check_evd(q, pkt)
    evd = q.evt.evd
    q.evt.evd = {}
    ev = q._new_event(name)
    ct = pkt.cfe_type
    if ct in _VECTOR:
        ev.vector = pkt.vector
    if ct == 1:
        ev.has_cr2 = 0 in evd
        ev.cr2 = evd.get(0, 0)
    elif ct in (8, 9):
        ev.has_vector = ct == 9
        if ct != 9:
            ev.vector = 0
        ev.has_vmxr = 2 in evd
        ev.vmxr = evd.get(2, 0)
        ev.has_vmxq = 1 in evd
        ev.vmxq = evd.get(1, 0)
    if pkt.ip:
        q.evt.fup.append(ev)
    else:
        ev.ip_suppressed = True
        bind = _binding(q, pkt)
        if bind is None:
            q.published = ev
        else:
            ev.bind = bind
            if bind == "ip":
                q.evt.fup.append(ev)
            else:
                from .events import BIND_TIP
                q.evq.enqueue(BIND_TIP, ev)
    q._consume()


def evd_fails(q, pkt) -> bool:
    """Does the EVD ``pkt`` contradict the EVDs before it (CR2 goes with
    an interrupt, VMX data with a VM exit)?"""
    t = pkt.evd_type
    if t not in _EVD_KNOWN:
        return False
    evd = q.evt.evd
    if t == 0:
        return 1 in evd or 2 in evd
    return 0 in evd


def decode_evd(q, pkt) -> None:
    if evd_fails(q, pkt):
        from .query import Fail
        raise Fail(E.BAD_CONTEXT)
    if pkt.evd_type in _EVD_KNOWN:
        q.evt.evd[pkt.evd_type] = pkt.payload
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
