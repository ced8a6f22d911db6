"""The instruction flow decoder: every executed instruction, in order.

libipt's pt_insn_decoder semantics, written anew over
:class:`~hwtrace.flow.query.QueryDecoder`:

    dec = InsnDecoder(trace_bytes, image, config)
    r = dec.sync_forward()              # status, or a DecodeError
    r = dec.next()                      # (status, FlowInsn) or DecodeError
    r = dec.event()                     # (status, Event)    or DecodeError

Status flags (:mod:`.status`) say whether an event is pending (fetch it
with :meth:`event` before the next instruction), whether tracing is
disabled (IP suppressed) and whether the trace ended.  Errors are values:
a :class:`DecodeError` with libipt's message, the trace offset, the IP
being decoded and, when the instruction itself was decoded before the
error struck, that instruction (ptxed prints it).

The decoder follows the code from the current IP, asking the query layer
only where the code cannot tell: conditional branches (TNT bits, with
compressed returns resolved on a return-address stack), indirect branches
(TIP), and events, which bind either to an IP (they happen before the
instruction there executes) or to an instruction (a synchronous disable,
PIP on MOV CR3 or a far branch, VMCS, PTWRITE).  CPU errata workarounds
(BDM64, SKD022, SKL014) are applied where libipt applies them.
"""

from __future__ import annotations

from typing import NamedTuple

from hwtrace.pt import errors as E
from hwtrace.pt.errors import PtError
from hwtrace.x86.insn import IClass, Kind

from . import fetch as F
from .config import FlowConfig
from .fetch import FetchError, FlowInsn, InsnCache
from .query import QueryDecoder
from .retstack import RetStack
from .events import Event
from .status import DEFERRED, EOS, EVENT_PENDING, IP_SUPPRESSED
from . import evtpos

MASK64 = 0xFFFFFFFFFFFFFFFF
BDM64_MAX_STEPS = 0x100

_OTHER = int(IClass.OTHER)
_PTWRITE = int(IClass.PTWRITE)
_CALL = int(IClass.CALL)
_RETURN = int(IClass.RETURN)
_JUMP = int(IClass.JUMP)
_COND = int(IClass.COND_JUMP)
_UNKNOWN = int(IClass.UNKNOWN)
_SLOW = EVENT_PENDING | DEFERRED

# Instructions without a query after which direct branches are watched for
# a loop that can never consume trace again (see _watch_loop).
LOOP_WATCH = 1 << 16

# Events whose IP comes from the trace: TRIG's instruction count restarts.
_IP_REFERENCE = frozenset(("enabled", "async_branch", "overflow", "tsx",
                           "exstop", "mwait", "iflags", "trig",
                           "async_disabled", "exec_mode"))

# Packets only a CPU that traces writes (see _process_enabled).
_TRACE_ON = frozenset(("tnt8", "tnt64", "tip", "fup", "tip.pgd"))

# Events that only carry information and never bind to an instruction.
_USER_ONLY = frozenset(("pwre", "pwrx", "tick", "cbr", "mnt"))


class DecodeError(NamedTuple):
    """A flow decode error: libipt's message ``code`` at trace ``offset``
    while decoding at ``ip``; ``insn`` is the instruction decoded before
    the error, if any."""

    code: str
    offset: int
    ip: int = 0
    insn: FlowInsn | None = None

    type = "error"


class _Err(Exception):
    def __init__(self, code: str):
        self.code = code


class InsnDecoder:
    def __init__(self, data, image, config: FlowConfig | None = None):
        self.config = config or FlowConfig()
        self.query = QueryDecoder(data, self.config)
        self.image = image
        self.cache = InsnCache(image)
        self.retstack = RetStack()
        # The block decoder also binds a disable without IP to the next
        # branch that would have needed trace (libipt's block decoder does).
        self.disable_at_trace_branch = False
        self._reset()

    # -- state ---------------------------------------------------------------
    def _reset(self) -> None:
        self.mode = None
        self.ip = 0
        self.status = 0
        self.enabled = False
        self.process_event = False
        self.ev = None
        # resync must not hand self.ev out again: its processing failed,
        # or a resync already resumed at its IP (see resync)
        self.ev_spent = False
        self.speculative = False
        self.process_insn = False
        self.p_insn = None
        self.p_x86 = None
        self.bound_paging = False
        self.bound_vmcs = False
        self.bound_ptwrite = False
        self.last_tsc = 0
        self.resyncing = False
        self.injected = None
        # Instructions since the last IP the trace gave (TRIG's icnt).
        self.icount = 0
        self.loop_mark = None       # see _watch_loop
        self.retstack.clear()
        self.cr3 = None
        self.vmcs = None
        self.ev_at = None           # where the query published self.ev
        # The offset of the packet that published the event event()
        # delivered last (None: unknown), where its time stamp belongs:
        # the next event may be fetched, and ev_at overwritten, before
        # event() returns.
        self.event_start = None

    @property
    def offset(self) -> int:
        return self.query.offset

    @property
    def sync_offset(self) -> int:
        return self.query.sync_offset

    def set_image(self, image) -> None:
        self.image = image
        self.cache = InsnCache(image)

    def _error(self, code: str, ip: int | None = None, insn=None) -> DecodeError:
        return DecodeError(code, self.error_offset(),
                           self.ip if ip is None else ip, insn)

    def error_offset(self) -> int:
        """The trace offset libipt 2.3 reports now: where its event decoder
        stands with the event it holds (fetched ahead), see :mod:`.evtpos`;
        with ``config.error_offsets == "2.0"``, where libipt 2.0's query
        decoder stands."""
        q = self.query
        if self.config.error_offsets == "2.0":
            return q.offset
        if self.process_event:
            if self.ev_at is None:
                return q.offset
            return evtpos.after_event(q, *self.ev_at)
        if q.tnt.index:
            return evtpos.skip_pads(q, q.tnt_end)
        return evtpos.lookahead(q)

    def _deferred(self) -> DecodeError:
        """The error found reading ahead, reported when the decoder
        proceeds (a query that finds one sets ``resyncing``, which routes
        the next instruction through :meth:`resync`, which reports it; so
        every fast path that honours ``resyncing`` stops there)."""
        d = self.query.deferred
        return DecodeError(d.code, d.offset, self.ip)

    # -- status --------------------------------------------------------------
    def _status(self, flags: int) -> int:
        if not self.enabled:
            flags |= IP_SUPPRESSED
        if (self.status & EOS) and not self.process_event:
            flags |= EOS
        return flags

    def _event_pending(self) -> bool:
        if self.process_event:
            return True
        if not (self.status & EVENT_PENDING):
            return False
        r = self.query.event()
        if r.__class__ is PtError:
            raise _Err(r.code)
        self.status, self.ev = r
        self.ev_spent = False
        self.loop_mark = None
        if self.status & DEFERRED:
            self.resyncing = True
        self.ev_at = self.query.event_at
        self.last_tsc = self.ev.tsc
        self.process_event = True
        return True

    # -- synchronization -----------------------------------------------------
    def sync_forward(self):
        self._reset()
        return self._start(self.query.sync_forward())

    def sync_backward(self):
        self._reset()
        return self._start(self.query.sync_backward())

    def sync_set(self, offset: int):
        self._reset()
        return self._start(self.query.sync_set(offset))

    def _start(self, r):
        if r.__class__ is PtError:
            return DecodeError(r.code, r.offset, 0)
        status, ip = r
        self.status = status
        if ip is not None:
            self.ip = ip
        if not (status & IP_SUPPRESSED):
            self.enabled = True
        try:
            return self._check_ip_event(None, None)
        except _Err as e:
            return self._error(e.code)

    # -- queries on behalf of instructions ---------------------------------------
    def _cond_branch(self) -> int:
        self.icount = 0
        self.loop_mark = None
        r = self.query.cond_branch()
        if r.__class__ is PtError:
            raise _Err(r.code)
        status, taken = r
        if self.config.enable_tick_events:
            self._tick(self.ip)
        self.status = status
        if status & DEFERRED:
            self.resyncing = True       # resync() reports it (see _deferred)
        return taken

    def _indirect_branch(self, evip: int) -> int:
        self.icount = 0
        self.loop_mark = None
        r = self.query.indirect_branch()
        if r.__class__ is PtError:
            raise _Err(r.code)
        status, target = r
        if self.config.enable_tick_events:
            self._tick(evip)
        self.status = status
        if status & DEFERRED:
            self.resyncing = True
        if status & IP_SUPPRESSED:
            raise _Err(E.NOIP)
        return target

    def _tick(self, ip: int) -> None:
        """Synthesize a tick event if time moved since the last event."""
        if not self.enabled or self.process_event:
            return
        tsc, lost_mtc, lost_cyc, have = self.query.time_now()
        if tsc == self.last_tsc:
            return
        from .events import Event
        ev = Event("tick", ip=ip, has_tsc=have, tsc=tsc, lost_mtc=lost_mtc,
                   lost_cyc=lost_cyc)
        self.ev = ev
        self.ev_spent = False
        self.last_tsc = tsc
        self.process_event = True

    # -- proceeding past an instruction --------------------------------------------
    def _proceed(self, insn: FlowInsn, x) -> None:
        self.icount += 1        # a query for trace below restarts it
        ip = (self.ip + insn.size) & MASK64
        self.ip = ip
        c = insn.iclass
        if c == _OTHER or c == _PTWRITE:
            return
        if c == _COND:
            if not self._cond_branch():
                return
        elif c == _CALL:
            if x.rel or x.is_indirect:
                self.retstack.push(ip)
        elif c == _RETURN:
            r = self.query.cond_branch()
            if r.__class__ is not PtError:
                self.icount = 0
                self.loop_mark = None
                status, taken = r
                if self.config.enable_tick_events:
                    self._tick(self.ip)
                self.status = status
                if status & DEFERRED:
                    self.resyncing = True
                if not taken:
                    raise _Err(E.BAD_RETCOMP)
                target = self.retstack.pop()
                if target is None:
                    raise _Err(E.RETSTACK_EMPTY)
                self.ip = target
                return
        elif c == _UNKNOWN:
            raise _Err(E.BAD_INSN)
        if not x.is_indirect:
            self.ip = (self.ip + x.rel) & MASK64
            if self.icount > LOOP_WATCH:
                self._watch_loop(insn)
        else:
            self.ip = self._indirect_branch(insn.ip)

    def _watch_loop(self, insn: FlowInsn) -> None:
        """A direct branch long after the last query: is the decoder in a
        loop it can never leave (``jmp $``, or any cycle of plain
        instructions and direct branches)?

        Without queries the walk is a function of (IP, mode) alone: a
        pending event that binds would be fetched or processed, which
        clears the mark.  So reaching a marked branch again with no query
        in between proves the decode would run forever without reading
        another byte of trace -- libipt's decoders do exactly that.  This
        reports it instead (``TRACELESS_LOOP``), so the session stops or
        resynchronizes at the next PSB.  The mark moves to the current
        branch each time the count doubles (Brent's cycle finding), so a
        loop of any length is found within a few times its length."""
        n = self.icount
        mark = self.loop_mark
        if mark is None or n >= mark[3]:
            self.loop_mark = (insn.ip, insn.mode, n, 2 * n)
        elif mark[0] == insn.ip and mark[1] == insn.mode:
            raise _Err(E.TRACELESS_LOOP)

    def _at_skl014(self, ev, insn: FlowInsn, x) -> bool:
        if not ev.ip_suppressed:
            return False
        c = insn.iclass
        if (c == _CALL or c == _JUMP) and not x.is_indirect:
            target = F.next_ip(insn.ip, x)
            if target is not None and not self.config.addr_filter.check(target):
                return True
        return False

    def _at_disabled_event(self, ev, insn: FlowInsn, x) -> bool:
        if ev.ip_suppressed:
            if x.is_far or F.changes_cpl(x) or F.changes_cr3(x):
                return True
            cfg = self.config
            if cfg.addr_filter.addr_cfg and cfg.errata.skl014 and \
                    self._at_skl014(ev, insn, x):
                return True
            if self.disable_at_trace_branch and (
                    x.is_indirect or insn.iclass == _COND):
                return True
            return False
        c = insn.iclass
        if c == _OTHER or c == _PTWRITE:
            return False
        if (c == _CALL or c == _JUMP) and not x.is_indirect:
            if F.next_ip(insn.ip, x) != ev.ip:
                return False
            return True
        if c == _UNKNOWN:
            raise _Err(E.BAD_INSN)
        return True

    def _postpone(self, insn: FlowInsn, x) -> int:
        if not self.process_insn:
            self.process_insn = True
            self.p_insn = insn
            self.p_x86 = x
        return self._status(EVENT_PENDING)

    def _clear_postponed(self) -> None:
        self.process_insn = False
        self.bound_paging = False
        self.bound_vmcs = False
        self.bound_ptwrite = False

    def _proceed_postponed(self) -> None:
        if not self.process_insn:
            raise _Err(E.INTERNAL)
        if not self.enabled:
            self._clear_postponed()
            return
        self._proceed(self.p_insn, self.p_x86)
        self._clear_postponed()

    def _check_insn_event(self, insn: FlowInsn, x) -> int:
        """Events binding to the instruction just decoded (0: none)."""
        if not self._event_pending():
            return 0
        ev = self.ev
        t = ev.type
        if t == "disabled":
            if ev.status_update:
                return 0
            if not self._at_disabled_event(ev, insn, x):
                return 0
            nip = F.next_ip(insn.ip, x)
            if nip is None:
                nip = 0
                if insn.iclass in (_CALL, int(IClass.FAR_CALL)):
                    nip = (insn.ip + insn.size) & MASK64
            self.ip = nip
        elif t == "paging":
            if self.bound_paging or not F.binds_to_pip(x):
                return 0
            self.bound_paging = True
            return self._postpone(insn, x)
        elif t == "vmcs":
            if self.bound_vmcs or not F.binds_to_vmcs(x):
                return 0
            self.bound_vmcs = True
            return self._postpone(insn, x)
        elif t == "ptwrite":
            if self.bound_ptwrite:
                return 0
            if ev.ip_suppressed:
                # Binds to the next PTWRITE; libipt 2.3 leaves the IP
                # suppressed (ptxed shows none).
                if not F.is_ptwrite(x):
                    return 0
            elif self.ip != ev.ip:
                return 0
            self.bound_ptwrite = True
            return self._postpone(insn, x)
        else:
            from . import evtrace_insn
            r = evtrace_insn.check_insn_event(self, ev, insn, x)
            if r is not None:
                return r
            return 0
        return self._status(EVENT_PENDING)

    def _bdm64(self, ev, insn, x) -> bool:
        if not ev.aborted:
            return False
        if insn.iclass == _OTHER or insn.iclass == _PTWRITE:
            return False
        if self.cache.range_is_contiguous(self.ip, ev.ip, self.mode,
                                          BDM64_MAX_STEPS):
            return False
        self.ip = ev.ip
        return True

    def _skd022(self) -> bool:
        try:
            d = self.cache.decode(self.ip, self.mode)
        except FetchError:
            return False
        if d.x86.kind not in (Kind.VMLAUNCH, Kind.VMRESUME):
            return False
        ev = self.ev
        ev.type = "disabled"
        ev.ip = ev.get("ip", 0)
        return True

    def _check_ip_event(self, insn, x) -> int:
        """Status for events binding to the current IP."""
        if not self._event_pending():
            return self._status(0)
        ev = self.ev
        t = ev.type
        ip = self.ip
        pending = self._status(EVENT_PENDING)
        if t == "disabled":
            if ev.status_update:
                return pending
        elif t == "enabled" or t == "overflow" or t == "stop":
            return pending
        elif t == "async_disabled":
            if ev.at != ip:
                return self._status(0)
            if self.config.errata.skd022 and self._skd022():
                return self._status(0)
            return pending
        elif t == "tsx":
            if ev.ip_suppressed:
                return pending
            if insn is not None and self.config.errata.bdm64:
                self._bdm64(ev, insn, x)
            if self.ip != ev.ip:
                return self._status(0)
            return pending
        elif t == "async_branch":
            if ev.from_ != ip:
                return self._status(0)
            return pending
        elif t in ("exec_mode", "async_paging", "async_vmcs", "iflags"):
            if not ev.ip_suppressed and ev.ip != ip and (
                    self.enabled or t in ("async_paging", "async_vmcs")):
                return self._status(0)
            return pending
        elif t == "paging" or t == "vmcs" or t == "ptwrite":
            if self.enabled:
                return self._status(0)
            return pending
        elif t == "exstop" or t == "mwait":
            if not ev.ip_suppressed and self.enabled and ip != ev.ip:
                return self._status(0)
            return pending
        elif t in _USER_ONLY:
            return pending
        else:
            from . import evtrace_insn
            return evtrace_insn.check_ip_event(self, ev, pending)
        return self._status(0)

    # -- the public verbs --------------------------------------------------------
    def next(self):
        """Decode the next instruction: (status, FlowInsn) or DecodeError."""
        # Fast path: tracing on, nothing pending, an already decoded
        # instruction that needs no trace.  Everything else: _next().
        if self.process_event or self.resyncing or not self.enabled or \
                self.status & _SLOW:
            return self._next()
        table = self.cache.tables.get(self.mode)
        if table is None:
            return self._next()
        ip = self.ip
        d = table.get(ip)
        if d is None:
            return self._next()
        insn = d.spec if self.speculative else d.insn
        if insn.iclass != _OTHER:
            return self._next()
        self.icount += 1
        self.ip = (ip + insn.size) & MASK64
        return (EOS if self.status & EOS else 0), insn

    def _next(self):
        if self.status & DEFERRED and not self.process_event and \
                not self.status & EVENT_PENDING:
            return self._deferred()
        if self.resyncing:
            r = self.resync()
            if r.__class__ is DecodeError:
                return r
            if r & EVENT_PENDING:
                return self._error(E.EVENT_IGNORED)
        if not self.enabled:
            if self.status & EOS:
                return self._error(E.EOS)
            return self._error(E.NO_ENABLE)
        ip = self.ip
        try:
            d = self.cache.decode(ip, self.mode)
        except FetchError as e:
            return self._error(e.code, ip)
        insn = d.spec if self.speculative else d.insn
        x = d.x86
        try:
            status = self._check_insn_event(insn, x)
            if status & EVENT_PENDING:
                return status, insn
            self._proceed(insn, x)
            return self._check_ip_event(insn, x), insn
        except _Err as e:
            return self._error(e.code, ip, insn)

    def event(self):
        """The pending event: (status, Event) or DecodeError."""
        inj = self.injected
        if inj is not None:
            self.injected = None
            if inj.__class__ is DecodeError:
                return inj
            return self._status(EVENT_PENDING), inj
        if not self.process_event:
            return self._error(E.BAD_QUERY)
        self.loop_mark = None
        ev = self.ev
        self.event_start = self.ev_at[1] if self.ev_at is not None else None
        t = ev.type
        try:
            if t == "enabled":
                if self.ip == ev.ip:
                    ev.resumed = True
                self._process_enabled(ev)
            elif t == "async_disabled":
                if not ev.ip_suppressed and self.ip != ev.at:
                    raise _Err(E.BAD_QUERY)
                self._process_disabled(ev)
            elif t == "disabled":
                self._process_disabled(ev)
            elif t == "async_branch":
                if self.ip != ev.from_:
                    raise _Err(E.BAD_QUERY)
                if ev.status_update or not self.enabled:
                    raise _Err(E.BAD_CONTEXT)
                self.ip = ev.to
            elif t in ("async_paging", "async_vmcs"):
                if not ev.ip_suppressed and self.ip != ev.ip:
                    raise _Err(E.BAD_QUERY)
                self._process_asid(ev)
            elif t in ("paging", "vmcs"):
                self._process_asid(ev)
            elif t == "overflow":
                if ev.status_update:
                    raise _Err(E.BAD_CONTEXT)
                if ev.ip_suppressed:
                    self.enabled = False
                    self.ip = 0
                else:
                    self.ip = ev.ip
                    self.enabled = True
                self.speculative = False
            elif t == "exec_mode":
                mode = ev.mode
                if ev.status_update and self.enabled and \
                        self.mode is not None and self.mode != mode:
                    raise _Err(E.BAD_STATUS_UPDATE)
                self.mode = mode
            elif t == "tsx":
                self.speculative = ev.speculative
            elif t == "stop":
                if ev.status_update or self.enabled:
                    raise _Err(E.BAD_CONTEXT)
            elif t in ("exstop", "mwait"):
                if not ev.ip_suppressed and self.enabled and \
                        self.ip != ev.ip:
                    raise _Err(E.BAD_QUERY)
            elif t in _USER_ONLY or t == "ptwrite" or t == "iflags":
                pass
            else:
                from . import evtrace_insn
                evtrace_insn.process_event(self, ev)
            if t in _IP_REFERENCE and not ev.ip_suppressed:
                self.icount = 0
            self.process_event = False
        except _Err as e:
            self.ev_spent = True
            return self._error(e.code)
        try:
            if self.process_insn:
                status = self._check_insn_event(self.p_insn, self.p_x86)
                if status & EVENT_PENDING:
                    return status, ev
                self._proceed_postponed()
            return self._check_ip_event(None, None), ev
        except _Err as e:
            # The event is delivered; what went wrong after it (fetching
            # the next one) comes with the next call, as libipt 2.3 has it.
            self.injected = self._error(e.code)
            return self._status(EVENT_PENDING), ev

    def _process_enabled(self, ev) -> None:
        if ev.status_update:
            if not self.enabled:
                if self.config.strict:
                    raise _Err(E.BAD_STATUS_UPDATE)
                # Tracing is on at the PSB's IP, the packets after the PSB+
                # show it: go on there (a TIP.PGE after it was read as
                # BDM70 has it, see .psb; at the end of the trace or
                # another PSB, nothing more to decode: stay disabled).
                if ev.get("follows", None) in _TRACE_ON and \
                        not ev.ip_suppressed:
                    self.ip = ev.ip
                    self.enabled = True
            return
        if ev.ip_suppressed:
            raise _Err(E.NOIP)
        if self.enabled:
            raise _Err(E.BAD_CONTEXT)
        self.ip = ev.ip
        self.enabled = True

    def _process_disabled(self, ev) -> None:
        if ev.status_update:
            if self.enabled:
                if self.config.strict:
                    raise _Err(E.BAD_STATUS_UPDATE)
                # A PSB+ without FUP while we trace: where a TIP.PGE comes
                # next, tracing did stop (resume at the TIP.PGE); where
                # TNT/TIP packets come next, the CPU still traced branches:
                # read them (libipt 2.0's reading).
                if ev.get("follows", None) == "tip.pge":
                    self.enabled = False
            return
        if not self.enabled:
            raise _Err(E.BAD_CONTEXT)
        self.enabled = False

    def _process_asid(self, ev) -> None:
        if ev.type in ("paging", "async_paging"):
            self.cr3 = ev.cr3
        else:
            self.vmcs = ev.base

    # -- resynchronization -----------------------------------------------------------
    _IP_EVENTS = frozenset(("tsx", "exstop", "mwait", "ptwrite", "exec_mode",
                            "async_paging", "async_vmcs", "iflags"))

    def resync(self):
        """Resume after an error at the next point of the trace that gives
        an IP (an IP packet, an event with an IP, a PSB+), without going
        back to the next PSB (libipt's pt_insn_resync).

        Returns a status like :meth:`sync_forward` or a DecodeError; events
        without an IP met on the way are left pending for the user."""
        if self.query.deferred is not None:
            return self._deferred()
        if self.process_event and self.ev_spent:
            # The event that could not be applied, or whose IP the last
            # resync resumed at (the error we resume from came after it):
            # handing it out again -- or starting over at its PSB, below
            # -- would fail the same way, for ever.  Drop it and look on.
            self.process_event = False
        if self.process_event and self.ev.status_update and \
                self.query.last_psb is not None:
            # libipt 2.3 holds an event of a PSB+ met on the way: it
            # starts over at that PSB, delivering its status again.
            return self.sync_set(self.query.last_psb)
        self._clear_postponed()
        self.resyncing = False
        try:
            while True:
                if not (self.process_event or self.status & EVENT_PENDING):
                    r = self.query.skip_to_ip()
                    if r.__class__ is PtError:
                        return self._error(r.code)
                    status, target = r
                    self.status = status
                    if target is not None:
                        self.ip = target
                        self.enabled = True
                        return self._check_ip_event(None, None)
                    if not status & EVENT_PENDING:
                        return self._error(E.BAD_QUERY)
                    continue
                self._event_pending()
                ev = self.ev
                t = ev.type
                if t == "enabled":
                    if ev.status_update:
                        self.ip = ev.ip
                        self.enabled = True
                    elif self.enabled:
                        # Tracing was on as far as we know: show the gap.
                        self.injected = Event("disabled", ip_suppressed=True)
                        self.enabled = False
                    return self._status(EVENT_PENDING)
                if t == "exec_mode" and ev.status_update:
                    if self.enabled and self.mode is not None and \
                            self.mode != ev.mode:
                        raise _Err(E.BAD_STATUS_UPDATE)
                    return self._status(EVENT_PENDING)
                if t == "async_branch":
                    self.ip = ev.from_
                    self.enabled = True
                    self.ev_spent = True
                    return self._check_ip_event(None, None)
                if t == "async_disabled":
                    self.ip = ev.at
                    self.enabled = True
                    self.ev_spent = True
                    return self._check_ip_event(None, None)
                if t in self._IP_EVENTS and not ev.ip_suppressed:
                    self.ip = ev.ip
                    self.enabled = True
                    self.ev_spent = True
                    return self._check_ip_event(None, None)
                if t in ("overflow", "disabled", "stop"):
                    return self._status(EVENT_PENDING)
                # An event without IP: the user gets it, then we go on
                # looking for an IP.
                self.resyncing = True
                return self._status(EVENT_PENDING)
        except _Err as e:
            return self._error(e.code)

    # -- time ----------------------------------------------------------------------
    def time(self):
        return self.query.time_now()
