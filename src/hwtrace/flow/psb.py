"""PSB+ headers for the query decoder: the packets between PSB and PSBEND
give the current state; they become status-update events published at
PSBEND (the enabled/disabled status first), with BDM70's workaround.

Unless ``config.strict``, the enabled/disabled status also records what
the trace does right after the PSB+ (:func:`next_kind`, in the event's
``follows``): the flow decoder uses it to read a status that disagrees
with what it knows the way the packets after it show (see
:mod:`.insn`, ``_process_enabled`` / ``_process_disabled``)."""

from __future__ import annotations

from hwtrace.pt import errors as E
from hwtrace.pt.errors import PtError

from . import evtrace
from .events import BIND_FUP, BIND_PSBEND, BIND_TIP, Event

_TIMING = frozenset(("tsc", "tma", "mtc", "cyc"))
_BDM70_SKIP = frozenset(("pad", "tsc", "cbr", "psbend", "pip", "mode.exec",
                         "mode.tsx", "vmcs", "tma", "mtc", "cyc", "mnt"))


def read_psb_header(q):
    evq = q.evq
    if evq.pending(BIND_PSBEND) or evq.pending(BIND_TIP) or \
            evq.pending(BIND_FUP):
        raise _fail(E.BAD_CONTEXT)
    q.ip = 0
    q.have_ip = False
    q.ip_suppressed = False
    was_enabled = q.enabled
    q.enabled = False
    # The enabled/disabled status comes first; filled in at the end.
    first = evq.enqueue(BIND_PSBEND, Event("disabled", status_update=True))
    while True:
        nxt = q.next
        if isinstance(nxt, PtError):
            raise _fail(nxt.code)
        t = nxt.type
        if t == "psbend":
            break
        if t == "ovf":
            if not q.enabled:
                evq.dequeue(BIND_PSBEND)
                first = None
            break
        if t == "pad":
            pass
        elif t == "fup":
            enabled = nxt.ipc != 0
            if enabled and q.config.psb_fup_announces_pge() and \
                    bdm70(q, nxt.offset + nxt.size):
                enabled = False
            q.enabled = enabled
            if enabled:
                q._update_ip(nxt)
        elif t == "mode.exec":
            # libipt 2.3 checks a PSB+ inside tracing against the
            # execution mode it knows.
            if was_enabled and q.enabled and q.cur_mode is not None and \
                    _exec_mode(nxt) != q.cur_mode:
                raise _fail(E.BAD_STATUS_UPDATE)
            q.cur_mode = _exec_mode(nxt)
            q.cur_if = bool(nxt.iflag)
            evq.enqueue(BIND_PSBEND, Event(
                "exec_mode", mode=_exec_mode(nxt), status_update=True))
            if q.config.enable_iflags_events:
                evq.enqueue(BIND_PSBEND, Event(
                    "iflags", iflag=bool(nxt.iflag), status_update=True))
            evtrace.mode_exec_header(q, nxt)
        elif t == "mode.tsx":
            evq.enqueue(BIND_PSBEND, Event(
                "tsx", speculative=bool(nxt.intx),
                aborted=bool(nxt.abrt), status_update=True))
        elif t == "pip":
            evq.enqueue(BIND_PSBEND, Event(
                "async_paging", cr3=nxt.cr3, non_root=bool(nxt.nr),
                status_update=True))
        elif t == "vmcs":
            evq.enqueue(BIND_PSBEND, Event("async_vmcs", base=nxt.base,
                                         status_update=True))
        elif t == "mnt":
            evq.enqueue(BIND_PSBEND, Event("mnt", payload=nxt.payload))
        elif t == "cbr":
            q._header_time(nxt)
            evq.enqueue(BIND_PSBEND, Event("cbr", ratio=nxt.ratio,
                                         status_update=True))
        elif t in _TIMING:
            q._header_time(nxt)
        elif t in ("cfe", "evd", "trig"):
            pass
        else:
            raise _fail(E.BAD_CONTEXT)
        q.pos += nxt.size
        q._fetch()
    if first is not None and not q.config.strict:
        first.follows = next_kind(q, q.pos)
    if first is not None:
        if q.enabled:
            first.type = "enabled"
            first.resumed = False
        else:
            first.ip_suppressed = True



def bdm70(q, pos: int):
    """BDM70: a PSB+ may carry a FUP although tracing is only enabled
    by a TIP.PGE right after it."""
    return next_kind(q, pos) == "tip.pge"


def next_kind(q, pos: int) -> str | None:
    """The type of the first packet from ``pos`` on that is not one of
    the status and timing packets a PSB+ may hold (PSBEND skipped too);
    None at the end of the trace or a packet that does not decode."""
    while True:
        p = q.peek_after(pos)
        if isinstance(p, PtError):
            return None
        if p.type not in _BDM70_SKIP:
            return p.type
        pos += p.size



def _fail(code: str):
    from .query import Fail
    return Fail(code)


def _exec_mode(pkt):
    from .query import exec_mode
    return exec_mode(pkt)
