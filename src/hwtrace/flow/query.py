"""The query/event decoder: what the packets say, asked for in code order.

This is libipt's pt_query_decoder, written anew: the layer between the
packets and the instruction flow.  The instruction decoder walks the code
and asks

* :meth:`QueryDecoder.cond_branch` — was this conditional branch taken?
  (one bit of the TNT cache, refilled from the next TNT packet),
* :meth:`QueryDecoder.indirect_branch` — where did this indirect branch
  go? (the next TIP that is not part of an event),
* :meth:`QueryDecoder.event` — the next event (when a status says one is
  pending): tracing enabled/disabled, async branches (FUP+TIP), paging,
  overflow, exec mode, TSX, power, PTWRITE, … with their IPs.

Every call returns ``(status, value)`` or a :class:`~hwtrace.pt.errors.PtError`
carrying the trace offset; ``status`` holds the flags of
:mod:`hwtrace.flow.status`.  Events bind to packets the way the SDM
describes: MODE.EXEC and PIP/VMCS inside an async branch bind to the TIP,
MODE.TSX, OVF, EXSTOP.IP, MWAIT and PTW.IP bind to the following FUP, the
contents of a PSB+ are status updates published at PSBEND.

The newer event-trace packets (CFE, EVD) and TRIG are handled by
:mod:`.evtrace`, power events and PTWRITE by :mod:`.power`, PSB+ headers
by :mod:`.psb`, OVF by :mod:`.overflow`; :mod:`.evtpos` works out the
trace offsets libipt 2.3 reports.
"""

from __future__ import annotations

from hwtrace.pt import errors as E
from hwtrace.pt.cpu import Errata
from hwtrace.pt.decoder import PacketDecoder, find_psb_backward, find_psb_forward
from hwtrace.pt.errors import PtError

from . import evtpos, evtrace, overflow, power, psb
from .config import FlowConfig
from .events import (BIND_FUP, BIND_PSBEND, BIND_TIP, Event,
                     EventQueue)
from .status import DEFERRED, EOS, EVENT_PENDING
from .timing import FlowTime, TimeError
from .tnt import TntCache

MASK64 = 0xFFFFFFFFFFFFFFFF

# Packet classes, by the role they play for queries (libipt's pdff_*).
_TNT = frozenset(("tnt8", "tnt64"))
_EVENT = frozenset(("tip.pge", "tip.pgd", "ovf", "pip",
                    "mode.tsx", "stop", "vmcs", "mnt", "exstop", "mwait",
                    "pwre", "pwrx", "ptw", "cbr", "trig"))
_TIMING = frozenset(("tsc", "tma", "mtc", "cyc"))
# Second bytes of extended opcodes of branch/event packets (TNT-64, PIP,
# CBR, VMCS, OVF, STOP, MNT, EXSTOP, MWAIT, PWRE, PWRX).
_EXT_STOP = frozenset((0xa3, 0x43, 0x03, 0xc8, 0xf3, 0x83, 0xc3, 0x62, 0xe2,
                       0xc2, 0x22, 0xa2))

MODES = {(0, 0): "16bit", (0, 1): "32bit", (1, 0): "64bit", (1, 1): None}


class Fail(Exception):
    """Internal: a decode step failed with libipt error string ``code``.
    Never escapes the public methods, which turn it into a PtError."""

    def __init__(self, code: str):
        self.code = code


def exec_mode(pkt) -> str | None:
    """The execution mode a MODE.EXEC packet announces (None: reserved)."""
    return MODES[(pkt.csl & 1, pkt.csd & 1)]


class QueryDecoder:
    """libipt-style query decoder over one trace buffer."""

    def __init__(self, data, config: FlowConfig | None = None):
        self.config = config or FlowConfig()
        e = self.config.errata
        # the packet decoder's own (the two that change packets): with
        # none, it keeps its shared tables
        self._pkt = PacketDecoder(data, errata=Errata(
            skd007=e.skd007, skz84=e.skz84))
        self._buf = self._pkt.buffer
        self._end = len(self._buf)
        self.pos = None           # offset of the next packet to decode
        self.sync = None          # offset of the last sync point
        self.next = None          # the packet at pos (or a PtError)
        self.time = FlowTime(self.config)
        self._reset()

    # -- state -------------------------------------------------------------
    def _reset(self) -> None:
        self.ip = 0
        self.have_ip = False
        self.ip_suppressed = False
        self.tnt = TntCache()
        self.evq = EventQueue()
        self.published = None         # the event the last decode step published
        self.consume_packet = False
        self.enabled = False
        self.evt = evtrace.EventTraceState()
        self.cur_mode = None
        self.cur_if = None
        self.mode_exec_pending = False
        # For libipt 2.3's offsets (.evtpos): the end of the TNT packet
        # whose bits are in use, where the last event was published; the
        # last PSB; an error found reading ahead, reported when proceeding.
        self.tnt_end = 0
        self.event_at = None
        self.last_psb = None
        self.deferred = None

    @property
    def offset(self) -> int:
        return self.pos if self.pos is not None else 0

    @property
    def sync_offset(self) -> int:
        return self.sync if self.sync is not None else 0

    # -- packets -----------------------------------------------------------
    def _fetch(self) -> None:
        """Decode the packet at ``pos`` into ``next`` (a PtError at the end
        or on a decode error)."""
        pos = self.pos
        if pos >= self._end:
            self.next = PtError(E.EOS, pos)
            return
        dec = self._pkt
        dec.sync_set(pos)
        self.next = dec.next()

    def _consume(self) -> None:
        self.pos += self.next.size
        self._fetch()

    def _fetch_error(self) -> str:
        nxt = self.next
        if isinstance(nxt, PtError):
            return nxt.code
        return E.INTERNAL

    def peek_after(self, pos: int):
        """The packet at ``pos`` without moving (PtError at the end)."""
        if pos >= self._end:
            return PtError(E.EOS, pos)
        dec = self._pkt
        dec.sync_set(pos)
        return dec.next()

    # -- last IP -----------------------------------------------------------
    def _update_ip(self, pkt) -> None:
        ipc = pkt.ipc
        ip = pkt.ip
        if ipc == 0:
            self.ip_suppressed = True
            return
        if ipc == 1:
            self.ip = (self.ip & ~0xFFFF & MASK64) | ip
        elif ipc == 2:
            self.ip = (self.ip & ~0xFFFFFFFF & MASK64) | ip
        elif ipc == 3:
            self.ip = (ip | ~0xFFFFFFFFFFFF) & MASK64 if ip & (1 << 47) else ip
        elif ipc == 4:
            self.ip = (self.ip & ~0xFFFFFFFFFFFF & MASK64) | ip
        elif ipc == 6:
            self.ip = ip
        else:
            raise Fail(E.BAD_PACKET)
        self.have_ip = True
        self.ip_suppressed = False

    def query_ip(self) -> int | None:
        """The last IP, or None if there is none or it is suppressed."""
        if not self.have_ip or self.ip_suppressed:
            return None
        return self.ip

    def _event_ip(self, ev: Event, name: str = "ip") -> None:
        ip = self.query_ip()
        if ip is None:
            ev.ip_suppressed = True
        else:
            setattr(ev, name, ip)

    def _new_event(self, type: str, **fields) -> Event:
        """A new event; it gets its time stamp when it is published."""
        return Event(type, **fields)

    def stamp(self, ev: Event) -> None:
        self.time.stamp(ev)
        ev.stamped = True

    # -- synchronization ----------------------------------------------------
    def sync_forward(self):
        """Synchronize at the next PSB.  Returns (status, ip or None)."""
        pos = self.pos
        if pos is None:
            start = 0
        else:
            start = pos + 16 if pos == self.sync else pos
            start -= min(start, 15)
        found = find_psb_forward(self._buf, start)
        if found < 0:
            return PtError(E.EOS, self.offset)
        return self._start(found)

    def sync_backward(self):
        pos = self.sync if self.sync is not None else self._end
        found = find_psb_backward(self._buf, pos)
        if found < 0:
            return PtError(E.EOS, self.offset)
        return self._start(found)

    def sync_set(self, offset: int):
        if offset < 0 or offset > self._end:
            return PtError(E.EOS, self.offset)
        return self._start(offset)

    def _start(self, pos: int):
        self._reset()
        self.time.reset()
        self.pos = self.sync = pos
        self._fetch()
        nxt = self.next
        if isinstance(nxt, PtError) or nxt.type != "psb":
            return PtError(E.NOSYNC, pos)
        try:
            self._decode_psb()
            ip = self.query_ip()
            self._read_ahead()
        except Fail as f:
            return PtError(f.code, self.offset)
        status = self._status_flags()
        if ip is None:
            from .status import IP_SUPPRESSED
            status |= IP_SUPPRESSED
        return status, ip

    # -- status ------------------------------------------------------------
    def _will_event(self) -> bool:
        nxt = self.next
        if isinstance(nxt, PtError):
            if self._bad_packet_kind(nxt) == "event":
                return True
            t = self._err_opcode(nxt)       # TIP, FUP: by the queue
            if t is None:
                return False
        else:
            t = nxt.type
        if t in _EVENT:
            return True
        if t == "cfe":
            return evtrace.will_event(self, nxt)
        if t == "evd":
            return evtrace.evd_fails(self, nxt)
        if t == "psbend":
            return self.evq.pending(BIND_PSBEND)
        if t == "tip":
            return self.evq.pending(BIND_TIP)
        if t == "fup":
            q = self.evq
            return q.pending(BIND_FUP) or bool(self.evt.fup) or (
                self.mode_exec_pending and q.pending(BIND_TIP) and
                q.find(BIND_TIP, "async_branch") is None)
        return False

    def _will_eos(self) -> bool:
        # the trace ended, or ends in a status packet cut short or an opcode
        # cut (libipt gives up reading ahead there); a branch or event packet
        # (or a FUP an event binds to) cut short is the next packet until a
        # query needs it decoded
        nxt = self.next
        return isinstance(nxt, PtError) and nxt.code == E.EOS \
            and not self._stops_read_ahead(nxt)

    def _status_flags(self) -> int:
        flags = 0 if self.deferred is None else DEFERRED
        if not self.tnt.index:
            if self._will_event():
                flags |= EVENT_PENDING
            if self._will_eos():
                flags |= EOS
        return flags

    def _bad_packet_kind(self, err: PtError) -> str | None:
        """What libipt takes a malformed packet for before decoding it:
        it only looks at opcodes there, so a malformed branch ("branch")
        or event ("event") packet is not decoded until a query needs it
        and its error surfaces later; an unknown opcode or a malformed
        status packet (None) fails when read ahead.  So does a packet the
        end of the trace cut short, where its opcode is whole."""
        if err.code != E.BAD_PACKET and err.code != E.EOS:
            return None
        buf, pos = self._buf, err.offset
        if pos >= self._end:
            return None
        if err.code == E.EOS and buf[pos] == 0x02 and (
                pos + 1 >= self._end or (buf[pos + 1] == 0xc3 and pos + 2 >= self._end)):
            return None                           # the opcode itself is cut
        b = buf[pos]
        if b & 1 == 0 and b not in (0, 2):
            return "branch"                       # TNT-8
        low = b & 0x1f
        if low == 0x0d:
            return "branch"                       # TIP
        if low in (0x01, 0x11) or b == 0x99:
            return "event"                        # TIP.PGD/PGE, MODE
        if b == 0x02 and pos + 1 < self._end:
            b1 = buf[pos + 1]
            if b1 == 0xa3:
                return "branch"                   # TNT-64
            if b1 in _EXT_STOP:
                return "event"
        return None

    def _err_opcode(self, err: PtError) -> str | None:
        """The packet a malformed or cut one is by its opcode where
        libipt's queries look at that before decoding it: "tip", "tnt"
        (TNT-8, TNT-64) or "fup"; else None."""
        if self._bad_packet_kind(err) == "branch":
            b = self._buf[err.offset]
            return "tip" if b & 0x1f == 0x0d else "tnt"
        if err.code in (E.BAD_PACKET, E.EOS) and err.offset < self._end \
                and self._buf[err.offset] & 0x1f == 0x1d:
            return "fup"
        return None

    def _stops_read_ahead(self, err: PtError) -> bool:
        """Whether libipt's read-ahead stops at a packet that does not
        decode (its opcode says a branch or event packet, or a FUP an
        event binds to) instead of failing on it."""
        return self._bad_packet_kind(err) is not None or self._will_event()

    def _read_ahead(self) -> None:
        """Decode status packets until the next branch or event packet."""
        while True:
            nxt = self.next
            if isinstance(nxt, PtError):
                if self._stops_read_ahead(nxt):
                    return
                if nxt.code == E.EOS and nxt.offset < self._end:
                    # a status packet cut by the end: libipt gives up
                    # reading ahead at the end
                    self.pos = self._end
                    self._fetch()
                raise Fail(nxt.code)
            t = nxt.type
            if t == "tip" or t in _TNT:
                return
            if self._will_event():
                return
            try:
                self._decode(nxt)
            except Fail as f:
                if f.code == E.EOS:
                    # a PSB+ cut by the end of the trace: libipt gives up
                    # reading ahead at the end (no packet next: the end)
                    self.pos = self._end
                    self._fetch()
                raise

    def _read_ahead_tolerant(self) -> None:
        """Read ahead after a successful query (running out of trace is
        reported by the next query, an inconsistent PSB+ when the decoder
        proceeds: :attr:`deferred`)."""
        try:
            self._read_ahead()
        except Fail as f:
            if f.code == E.BAD_STATUS_UPDATE:
                self.deferred = PtError(f.code, self.pos)
            elif f.code != E.EOS:
                raise

    # -- queries -------------------------------------------------------------
    def cond_branch(self):
        """(status, taken) for the next conditional branch."""
        try:
            tnt = self.tnt
            if not tnt.index:
                self._cache_tnt()
            taken = tnt.take()
            if taken < 0:
                raise Fail(E.BAD_QUERY)
            return self._status_flags(), taken
        except Fail as f:
            return PtError(f.code, self.offset)

    def _cache_tnt(self) -> None:
        while True:
            nxt = self.next
            if isinstance(nxt, PtError):
                # libipt asks for a TNT by the opcodes it read ahead
                if self._will_event() or self._err_opcode(nxt) == "tip":
                    raise Fail(E.BAD_QUERY)
                raise Fail(nxt.code)
            if self._will_event():
                raise Fail(E.BAD_QUERY)
            t = nxt.type
            if t == "tip":
                raise Fail(E.BAD_QUERY)
            self.published = None
            self._decode(nxt)
            if self.published is not None:
                raise Fail(E.EVENT_IGNORED)
            if t in _TNT:
                break
            self._read_ahead()
        self.time.mark()
        self._read_ahead_tolerant()

    def indirect_branch(self):
        """(status, target or None if suppressed) for the next indirect
        branch."""
        try:
            while True:
                nxt = self.next
                if isinstance(nxt, PtError):
                    if self._will_event() or self.tnt.index and \
                            self._err_opcode(nxt) == "tnt":
                        raise Fail(E.BAD_QUERY)
                    raise Fail(nxt.code)
                if self._will_event():
                    raise Fail(E.BAD_QUERY)
                t = nxt.type
                if t in _TNT and self.tnt.index:
                    raise Fail(E.BAD_QUERY)
                self.published = None
                self._decode(nxt)
                if self.published is not None:
                    raise Fail(E.EVENT_IGNORED)
                if t == "tip":
                    target = self.query_ip()
                    break
                self._read_ahead()
            self.time.mark()
            self._read_ahead_tolerant()
            status = self._status_flags()
            if target is None:
                from .status import IP_SUPPRESSED
                status |= IP_SUPPRESSED
            return status, target
        except Fail as f:
            return PtError(f.code, self.offset)

    def skip_to_ip(self):
        """Resynchronization after an error: drop cached TNT bits and TNT
        packets up to the next TIP or event.  Returns (status, target) at a
        TIP (target None if suppressed), (status, None) with EVENT_PENDING
        set at an event, or a PtError."""
        try:
            self.tnt.clear()
            while True:
                nxt = self.next
                if isinstance(nxt, PtError):
                    raise Fail(nxt.code)
                if self._will_event():
                    return self._status_flags(), None
                t = nxt.type
                self.published = None
                self._decode(nxt)
                if self.published is not None:
                    raise Fail(E.EVENT_IGNORED)
                if t in _TNT:
                    self.tnt.clear()
                elif t == "tip":
                    target = self.query_ip()
                    self.time.mark()
                    self._read_ahead_tolerant()
                    status = self._status_flags()
                    if target is None:
                        from .status import IP_SUPPRESSED
                        status |= IP_SUPPRESSED
                    return status, target
                self._read_ahead()
        except Fail as f:
            return PtError(f.code, self.offset)

    def event(self):
        """(status, Event): the next event."""
        try:
            if self.tnt.index:
                raise Fail(E.BAD_QUERY)
            while True:
                nxt = self.next
                if isinstance(nxt, PtError):
                    if self._err_opcode(nxt) in ("tip", "tnt") and \
                            not self._will_event():
                        raise Fail(E.BAD_QUERY)
                    raise Fail(nxt.code)
                t = nxt.type
                if (t == "tip" or t in _TNT) and not self._will_event():
                    raise Fail(E.BAD_QUERY)
                self.published = None
                start = self.pos
                self._decode(nxt)
                ev = self.published
                if ev is not None:
                    if not ev.stamped:
                        self.stamp(ev)
                    self.event_at = (evtpos.stays(t, ev), start,
                                     max(self.pos, start + nxt.size))
                    break
                self._read_ahead()
            self.time.mark()
            self._read_ahead_tolerant()
            return self._status_flags(), ev
        except Fail as f:
            return PtError(f.code, self.offset)


    # -- packet decode functions ---------------------------------------------
    def _decode(self, pkt) -> None:
        fn = _DECODE.get(pkt.type)
        if fn is None:
            raise Fail(E.BAD_OPC)
        try:
            fn(self, pkt)
        except TimeError as e:
            raise Fail(e.code) from None

    def _dec_skip(self, pkt) -> None:
        self._consume()

    def _dec_timing(self, pkt) -> None:
        self.time.update(pkt)
        self._consume()

    def _dec_cbr(self, pkt) -> None:
        self.time.update(pkt)
        self.published = self._new_event("cbr", ratio=pkt.ratio)
        self._consume()

    def _dec_tnt(self, pkt) -> None:
        if not self.tnt.fill(pkt.payload, pkt.bit_size):
            raise Fail(E.BAD_CONTEXT)
        self.tnt_end = self.pos + pkt.size
        self._consume()

    def _dec_tip(self, pkt) -> None:
        self.mode_exec_pending = False
        self._update_ip(pkt)
        ev = self.evq.dequeue(BIND_TIP)
        if ev is None:
            self._consume()
            return
        t = ev.type
        if t == "async_branch":
            self.consume_packet = True
            self._event_ip(ev, "to")
        elif t in ("async_paging", "async_vmcs", "exec_mode", "iflags"):
            self._event_ip(ev)
        elif not evtrace.bind_tip(self, ev):
            raise Fail(E.BAD_CONTEXT)
        self.published = ev
        if self.evq.pending(BIND_TIP):
            return
        if not self.consume_packet:
            return
        self.consume_packet = False
        self._consume()

    def _dec_tip_pge(self, pkt) -> None:
        self.mode_exec_pending = False
        self._update_ip(pkt)
        ip = self.query_ip()
        if ip is None:
            raise Fail(E.BAD_PACKET)
        if not self.consume_packet:
            ev = self._new_event("enabled", ip=ip, resumed=False)
            self.tnt.clear()
            self.consume_packet = True
            self.enabled = True
        else:
            ev = self.evq.dequeue(BIND_TIP)
            if ev is not None:
                if ev.type in ("exec_mode", "iflags"):
                    self._event_ip(ev)
                elif not evtrace.bind_tip_pge(self, ev):
                    raise Fail(E.BAD_CONTEXT)
        if ev is None:
            raise Fail(E.INTERNAL)
        self.published = ev
        if self.evq.pending(BIND_TIP):
            return
        self.consume_packet = False
        self._consume()

    def _dec_tip_pgd(self, pkt) -> None:
        self.mode_exec_pending = False
        self._update_ip(pkt)
        ev = self.evq.dequeue(BIND_TIP)
        if ev is not None:
            t = ev.type
            if t == "async_branch":
                ev.type = "async_disabled"
                ev.at = ev.from_
                self._event_ip(ev)
            elif t in ("async_paging", "async_vmcs", "exec_mode", "iflags"):
                ev.ip_suppressed = True
            elif evtrace.bind_tip_pgd(self, ev):
                self.published = ev     # the disable comes next
                return
            else:
                raise Fail(E.BAD_CONTEXT)
        else:
            ev = self._new_event("disabled")
            self._event_ip(ev)
        self.published = ev
        if self.evq.pending(BIND_TIP):
            return
        self.enabled = False
        self._consume()

    def _dec_fup(self, pkt) -> None:
        self._update_ip(pkt)
        ev = self.evq.dequeue(BIND_FUP)
        if ev is not None:
            t = ev.type
            if t == "overflow":
                self.consume_packet = True
                ip = self.query_ip()
                if ip is None:
                    raise Fail(E.NOIP)
                ev.ip = ip
                self.enabled = True
            elif t == "tsx":
                if not ev.aborted:
                    self.consume_packet = True
                self._event_ip(ev)
            elif t in ("exstop", "mwait", "ptwrite"):
                self.consume_packet = True
                self._event_ip(ev)
            elif not evtrace.bind_fup(self, ev):
                raise Fail(E.INTERNAL)
            self.published = ev
            if self.evq.pending(BIND_FUP):
                return
            if not self.consume_packet:
                return
            self.consume_packet = False
            self._consume()
            return
        if evtrace.fup_pending(self):
            if evtrace.bind_fup_cfe(self):
                self._consume()
            return
        if self.mode_exec_pending and \
                self.evq.find(BIND_TIP, "async_branch") is None:
            # MODE.EXEC + FUP: an interrupt-flag (or mode) change at the
            # FUP's IP (event trace), not an asynchronous branch.
            ev = self.evq.dequeue(BIND_TIP)
            if ev is not None:
                self._event_ip(ev)
                self.published = ev
                if self.evq.pending(BIND_TIP):
                    return
            self.mode_exec_pending = False
            self._consume()
            return
        ip = self.query_ip()
        if ip is None:
            raise Fail(E.NOIP if not self.have_ip else E.IP_SUPPRESSED)
        ev = self._new_event("async_branch", from_=ip)
        self.evq.enqueue(BIND_TIP, ev)
        self._consume()

    def _dec_pip(self, pkt) -> None:
        if self.evq.find(BIND_TIP, "async_branch") is not None:
            ev = self._new_event("async_paging", cr3=pkt.cr3,
                                 non_root=bool(pkt.nr))
            self.evq.enqueue(BIND_TIP, ev)
        else:
            self.published = self._new_event("paging", cr3=pkt.cr3,
                                         non_root=bool(pkt.nr))
        self._consume()

    def _dec_vmcs(self, pkt) -> None:
        if self.evq.find(BIND_TIP, "async_branch") is not None:
            ev = self._new_event("async_vmcs", base=pkt.base)
            self.evq.enqueue_before(BIND_TIP, ev, "async_paging")
        else:
            self.published = self._new_event("vmcs", base=pkt.base)
        self._consume()

    def _dec_mode(self, pkt) -> None:
        if pkt.type == "mode.exec":
            # Like libipt 2.3: report only what changed; a MODE.EXEC binds
            # to the next TIP* or, when a FUP comes first, to that FUP.
            mode = exec_mode(pkt)
            if mode != self.cur_mode:
                self.evq.enqueue(BIND_TIP, self._new_event("exec_mode",
                                                           mode=mode))
                self.cur_mode = mode
            iflag = bool(pkt.iflag)
            if self.config.enable_iflags_events and iflag != self.cur_if:
                self.evq.enqueue(BIND_TIP, self._new_event("iflags",
                                                           iflag=iflag))
            self.cur_if = iflag
            self.mode_exec_pending = True
        else:
            ev = self._new_event("tsx", speculative=bool(pkt.intx),
                                 aborted=bool(pkt.abrt))
            if self.enabled:
                self.evq.enqueue(BIND_FUP, ev)
            else:
                ev.ip_suppressed = True
                self.published = ev
        self._consume()

    def _dec_stop(self, pkt) -> None:
        self.published = self._new_event("stop")
        self._consume()

    def _dec_mnt(self, pkt) -> None:
        self.published = self._new_event("mnt", payload=pkt.payload)
        self._consume()

    def _dec_ovf(self, pkt) -> None:
        overflow.decode_ovf(self, pkt)

    def overflow_reset(self) -> None:
        """Forget the decode state at an OVF (timing is kept)."""
        self.time.overflow()
        self.ip = 0
        self.have_ip = False
        self.ip_suppressed = False
        self.tnt.clear()
        self.evq.clear()
        self.consume_packet = False
        self.enabled = False
        self.evt = evtrace.EventTraceState()
        self.cur_mode = None
        self.cur_if = None
        self.mode_exec_pending = False

    # -- PSB+ ----------------------------------------------------------------
    def _decode_psb(self) -> None:
        start = self.pos
        self.last_psb = start
        # Arm SKL168's check of the next MTC's calibration (libipt 2.0's
        # query decoder does this at every PSB; 2.3's event decoder never
        # does, so its flow timing misses the erratum workaround).
        self.time.psb()
        self._consume()
        try:
            self._read_psb_header()
        except Fail as f:
            if f.code != E.BAD_STATUS_UPDATE:   # 2.3 stops at the MODE.EXEC
                self.pos = start
                self._fetch()
            self.evq.clear(BIND_PSBEND)
            raise

    def _read_psb_header(self) -> None:
        psb.read_psb_header(self)

    def _header_time(self, pkt) -> None:
        try:
            self.time.update(pkt, header=True)
        except TimeError as e:
            raise Fail(e.code) from None

    def finish_psbend_event(self, ev: Event) -> None:
        """Give a PSB+ event its IP and time as it is published."""
        if ev.type in ("enabled", "exec_mode", "tsx", "async_paging",
                       "async_vmcs", "iflags"):
            self._event_ip(ev)
        self.stamp(ev)

    def _bdm70(self, pos: int) -> bool:
        return psb.bdm70(self, pos)

    def _dec_psb(self, pkt) -> None:
        self._decode_psb()

    def _dec_psbend(self, pkt) -> None:
        ev = self.evq.dequeue(BIND_PSBEND)
        if ev is not None:
            self.finish_psbend_event(ev)
            self.published = ev
            if self.evq.pending(BIND_PSBEND):
                return
        self._consume()

    # -- timing ----------------------------------------------------------------
    def time_now(self):
        """(tsc, lost_mtc, lost_cyc, has_tsc) at the last query."""
        return self.time.query()

    def core_bus_ratio(self) -> int:
        return self.time.cbr


_DECODE = {
    "pad": QueryDecoder._dec_skip,
    "invalid": QueryDecoder._dec_skip,
    "unknown": QueryDecoder._dec_skip,
    "psb": QueryDecoder._dec_psb,
    "psbend": QueryDecoder._dec_psbend,
    "tnt8": QueryDecoder._dec_tnt,
    "tnt64": QueryDecoder._dec_tnt,
    "tip": QueryDecoder._dec_tip,
    "tip.pge": QueryDecoder._dec_tip_pge,
    "tip.pgd": QueryDecoder._dec_tip_pgd,
    "fup": QueryDecoder._dec_fup,
    "pip": QueryDecoder._dec_pip,
    "vmcs": QueryDecoder._dec_vmcs,
    "mode.exec": QueryDecoder._dec_mode,
    "mode.tsx": QueryDecoder._dec_mode,
    "ovf": QueryDecoder._dec_ovf,
    "stop": QueryDecoder._dec_stop,
    "mnt": QueryDecoder._dec_mnt,
    "exstop": power.decode_exstop,
    "mwait": power.decode_mwait,
    "pwre": power.decode_pwre,
    "pwrx": power.decode_pwrx,
    "ptw": power.decode_ptw,
    "tsc": QueryDecoder._dec_timing,
    "tma": QueryDecoder._dec_timing,
    "mtc": QueryDecoder._dec_timing,
    "cyc": QueryDecoder._dec_timing,
    "cbr": QueryDecoder._dec_cbr,
    "cfe": evtrace.decode_cfe,
    "evd": evtrace.decode_evd,
    "trig": evtrace.decode_trig,
}
