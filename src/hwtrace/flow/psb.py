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
            raise _fail(header_error(q, nxt))
        t = nxt.type
        if t == "psbend":
            break
        if t == "ovf":
            if not q.enabled:
                evq.dequeue(BIND_PSBEND)
                first = None
            break
        if t == "pad" or t == "invalid":
            pass                # invalid: SKZ84's TMA, which libipt skips
        elif t == "fup":
            if q.config.errata.bdm70 and not (was_enabled or q.enabled):
                code = bdm70_scan_error(q, nxt.offset + nxt.size)
                if code is not None:
                    raise _fail(code)
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



# Opcodes whose packets libipt 2.0 does not take in a PSB+ (no header
# decoder): TNT-8, TIP, TIP.PGE/PGD by their first byte (see
# header_error), and these second bytes after 0x02: PSB, TNT-64, STOP,
# EXSTOP, EXSTOP.IP, MWAIT, PWRE, PWRX (and PTW's, masked).
_EXT_NO_HEADER = frozenset((0x82, 0xa3, 0x83, 0x62, 0xe2, 0xc2, 0x22, 0xa2))


def header_error(q, err: PtError) -> str:
    """The error libipt reports for a packet in a PSB+ that does not
    decode: it picks the packet's decoder by its opcode alone, so one
    that may not be in a PSB+ at all is "unexpected packet context"
    however malformed or cut short, any other fails as it decodes (a cut
    opcode is the end of the trace)."""
    buf, pos, end = q._buf, err.offset, q._end
    if pos >= end:
        return err.code
    b = buf[pos]
    if b == 0x02:
        if pos + 1 >= end:
            return E.EOS
        b1 = buf[pos + 1]
        if b1 in _EXT_NO_HEADER or b1 & 0x1f == 0x12:     # .. or PTW
            return E.BAD_CONTEXT
        return err.code
    if b in (0x00, 0x99, 0x19, 0x59) or b & 3 == 3:
        return err.code             # PAD, MODE, TSC, MTC, CYC
    if b & 1 == 0 or b & 0x1f in (0x0d, 0x11, 0x01):
        return E.BAD_CONTEXT        # TNT-8, TIP, TIP.PGE, TIP.PGD
    return err.code                 # FUP, an unknown opcode


def bdm70_scan_error(q, pos: int) -> str | None:
    """libipt 2.0 looks for BDM70's TIP.PGE after a PSB+ FUP (with the
    erratum, while tracing is not known to be on) with a packet decoder
    of its own, and fails the PSB+ on a packet that does not decode
    before it decides (running into the end is no error): that error."""
    while True:
        p = q.peek_after(pos)
        if isinstance(p, PtError):
            return None if p.code == E.EOS else p.code
        if p.type not in _BDM70_SKIP:
            return None
        pos += p.size


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
