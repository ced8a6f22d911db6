"""The PT generator: one emulated Intel PT tracer writing one stream.

:class:`Tracer` is what a logical processor's trace logic does, driven by
the instruction flow of whatever runs on it (:mod:`.flow` feeds it from an
execution log).  It has no I/O: packets are appended to ``Tracer.buf`` and
handed to a sink (``write(bytes) -> int``, ``stopped``; the trace-control
device's ToPA output unit) in batches.

What it emits, following the SDM (Vol. 3C, "Intel Processor Trace": the
packet generation tables) and what real captures show:

* PSB+ at enable and whenever PacketByteCnt reached ``2**(11+PSBFreq)``
  bytes: PSB, TSC (TSCEn; the cycles not yet in a CYC are in it), TMA
  (TSCEn+MTCEn), CBR, and when PacketEn is
  set MODE.Exec and FUP(the IP of the next instruction), then PSBEND.  The
  SDM promises only "as quickly after the threshold as possible"; this CPU
  inserts it at the first instruction boundary after the next instruction
  retired, mid-block included, as a Skylake does (lldb_intelpt core 45: the
  TNT that crossed the threshold came from ``jne 0x400bd5``, the PSB+
  after the following ``addl``, with FUP 0x400bdb).  So its FUP is
  usually not the target of a branch.  :meth:`Tracer.run` is given each
  straight-line run's instruction lengths to place it.  No PIP: with OS=0 the CR3 writes happen where ContextEn is
  clear, and the hardware emits PIP only if OS=1.  Last IP and the return
  compression stack are reset.
* TNT bits for conditional branches and compressed returns, in TNT-8
  packets (up to 6 bits) or, with ``long_tnt``, TNT-64 (up to 47 bits);
  pending bits are flushed before any other control-flow packet and PSB.
* TIP for indirect calls/jumps and uncompressed returns.  A return is
  compressed (a taken TNT bit) unless DisRETC, when its target equals the
  top of a 64-entry stack of call NLIPs (the oldest entry drops out).
* TIP.PGE(ip) when PacketEn becomes set (user code resumed; a branch into a
  filter range), preceded by MODE.Exec if none was sent since the last
  PSB; TIP.PGD() with the IP suppressed when entering the untraced kernel
  synchronously (syscall, int3, ud2, ...), FUP(next IP) + TIP.PGD() when
  leaving user code asynchronously (signal, interrupt, context switch);
  TIP.PGD(target) when a branch leaves the ADDRn filter ranges (no TNT/TIP
  for that branch), TIP.PGD(target) + TraceStop when a branch target lies
  in a TraceStop range (then nothing more is traced).
* Timing, on an instruction-count clock (``Timing``): the TSC advances one
  tick per retired instruction from ``t0``; the core clock equals the TSC
  clock (CBR = ``nom_freq``), the crystal clock (ART) runs at
  TSC * eax / ebx (CPUID 0x15); MTC at every 2**MTCFreq ART ticks; CYC
  before TNT/TIP/TIP.PGE/TIP.PGD/FUP/MTC packets once at least the
  CycThresh count of cycles passed.  An MTC is emitted after the run in
  which its tick fell, but its CYC counts the cycles up to the tick only
  (a decoder times what follows from the MTC on).
"""

from __future__ import annotations

from dataclasses import dataclass

from hwtrace.pt import encoder as enc
from hwtrace.pt.lastip import compress

# Ctl bits (IA32_RTIT_CTL)
CYC_EN = 1 << 1
OS = 1 << 2
USER = 1 << 3
CR3_FILTER = 1 << 7
MTC_EN = 1 << 9
TSC_EN = 1 << 10
DIS_RETC = 1 << 11
BRANCH_EN = 1 << 13

RETSTACK_DEPTH = 64

# instruction kinds the generator distinguishes (see flow.classify)
K_OTHER = 0
K_JCC = 1
K_JMP = 2
K_CALL = 3
K_JMP_IND = 4
K_CALL_IND = 5
K_RET = 6
K_FAR = 7       # far transfer staying in user mode: TIP
K_TRAP = 8      # enters the kernel synchronously: syscall, int n, int3, ud2
K_REP = 9       # rep-prefixed string instruction (may repeat in place)

_PSB_PLUS_TAIL_64 = enc.mode_exec(csl=1)
_TIP, _PGE, _PGD, _FUP = 0x0D, 0x11, 0x01, 0x1D
_IPC_BYTES = {1: 2, 2: 4, 3: 6, 4: 6, 6: 8}


@dataclass(frozen=True)
class Timing:
    """The emulated CPU's clocks (recorded in the bundle manifest)."""
    t0: int = 0                # TSC at the first instruction
    nom_freq: int = 22         # CBR ratio = nominal ratio: core clock == TSC
    cpuid_15_eax: int = 2      # TSC / ART = ebx / eax
    cpuid_15_ebx: int = 176


@dataclass(frozen=True)
class TraceConfig:
    """The buffer configuration the tracer applies."""
    ctl: int
    cr3_match: int = 0
    addr_ranges: tuple = ()
    timing: Timing = Timing()
    long_tnt: bool = False


def _field(ctl: int, shift: int) -> int:
    return (ctl >> shift) & 0xF


class Tracer:
    """One logical processor's Intel PT logic writing one stream."""

    def __init__(self, cfg: TraceConfig, sink=None, flush_every: int = 1 << 16):
        ctl = int(cfg.ctl)
        self.cfg = cfg
        self.sink = sink
        self.flush_every = flush_every
        self.branch_en = bool(ctl & BRANCH_EN)
        self.user = bool(ctl & USER)
        self.tsc_en = bool(ctl & TSC_EN)
        self.mtc_en = bool(ctl & MTC_EN)
        self.mtc_freq = _field(ctl, 14)
        self.cyc_en = bool(ctl & CYC_EN)
        ct = _field(ctl, 19)
        self.cyc_thresh = 0 if ct == 0 else 1 << (ct - 1)
        self.psb_period = 1 << (11 + _field(ctl, 24))
        self.retc = not (ctl & DIS_RETC)
        self.cr3_filter = bool(ctl & CR3_FILTER)
        self.cr3_match = cfg.cr3_match
        filt, stops = [], []
        for n, (a, b) in enumerate(cfg.addr_ranges):
            c = (ctl >> (32 + 4 * n)) & 0xF
            if c == 1:
                filt.append((a, b))
            elif c == 2:
                stops.append((a, b))
        self.filters = tuple(filt)
        self.stops = tuple(stops)
        self.tnt_max = 47 if cfg.long_tnt else 6
        tm = cfg.timing
        self.eax, self.ebx, self.cbr = tm.cpuid_15_eax, tm.cpuid_15_ebx, tm.nom_freq

        self.buf = bytearray()
        self.total = 0              # bytes generated
        self.since_psb = 0          # bytes since the last PSB (PacketByteCnt)
        self.triggered = True       # TriggerEn: not stopped
        self.stopped_by_tracestop = False
        self.in_user = False        # ContextEn (CPL) for the running thread
        self.ctx_ok = True          # CR3 filter match for the running process
        self.filter_en = True
        self.pkt_en = False
        self.last_ip = None
        self.tnt_bits = 0
        self.tnt_n = 0
        self.retstack: list[int] = []
        self.mode_sent = False
        self.t = tm.t0
        self.mtc_p = self._art(self.t) >> self.mtc_freq
        self.cyc_acc = 0
        self.cur_ip = 0             # the next instruction of the running thread
        self.insns = 0              # instructions that went into this stream
        self.psb_at = -1            # PSB+ due at the boundary where t reaches this
        self._psb_plus()

    # ---- helpers ---------------------------------------------------------
    def _art(self, t: int) -> int:
        return t * self.eax // self.ebx

    def _emit(self, data: bytes) -> None:
        self.buf += data
        n = len(data)
        self.since_psb += n
        self.total += n
        if len(self.buf) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Hand the generated bytes to the sink."""
        if self.buf and self.sink is not None:
            self.sink.write(bytes(self.buf))
            self.buf.clear()
            if getattr(self.sink, "stopped", False):
                # The ToPA output stopped (stop-on-full): TriggerEn is clear.
                self.triggered = False
                self.pkt_en = False

    def _cyc(self) -> None:
        if self.cyc_en and self.cyc_acc and self.cyc_acc >= self.cyc_thresh:
            self._emit(enc.cyc(self.cyc_acc))
            self.cyc_acc = 0

    def _ip(self, op: int, ip: int | None) -> None:
        if self.cyc_en:
            self._cyc()
        if ip is None:
            self._emit(bytes((op,)))
            return
        ipc, payload = compress(ip, self.last_ip)
        self.last_ip = ip
        self._emit(bytes(((ipc << 5) | op,)) + payload.to_bytes(_IPC_BYTES[ipc], "little"))

    def _flush_tnt(self) -> None:
        n = self.tnt_n
        if n:
            if self.cyc_en:
                self._cyc()
            if n <= 6:
                self._emit(bytes((((1 << n) | self.tnt_bits) << 1,)))
            else:
                self._emit(b"\x02\xa3" + ((1 << n) | self.tnt_bits).to_bytes(6, "little"))
            self.tnt_bits = 0
            self.tnt_n = 0

    def _tnt(self, taken: int) -> None:
        self.tnt_bits = (self.tnt_bits << 1) | taken
        self.tnt_n += 1
        if self.tnt_n == self.tnt_max:
            self._flush_tnt()

    def _update_pkt_en(self) -> bool:
        self.pkt_en = (self.triggered and self.in_user and self.ctx_ok
                       and self.filter_en and self.branch_en)
        return self.pkt_en

    def _in_filter(self, ip: int) -> bool:
        if not self.filters:
            return True
        for a, b in self.filters:
            if a <= ip <= b:
                return True
        return False

    def _in_stop(self, ip: int) -> bool:
        for a, b in self.stops:
            if a <= ip <= b:
                return True
        return False

    def _psb_plus(self) -> None:
        self._flush_tnt()
        self.buf += enc.PSB_BYTES
        self.total += 16
        self.since_psb = 0
        self.psb_at = -1
        self.last_ip = None
        self.retstack.clear()
        self.mode_sent = False
        if self.tsc_en:
            self._emit(enc.tsc(self.t & ((1 << 56) - 1)))
            # the TSC is the clock here: the cycles retired since the last
            # CYC are in it (libipt counts a CYC from the TSC on), so they
            # go unreported -- mid-block, the instruction retired after the
            # packet that reached the period would otherwise count twice
            self.cyc_acc = 0
            if self.mtc_en:
                art = self._art(self.t)
                fc = self.t - art * self.ebx // self.eax
                self._emit(enc.tma(art & 0xFFFF, min(fc, 511)))
        self._emit(enc.cbr(self.cbr))
        if self.pkt_en:
            self._emit(_PSB_PLUS_TAIL_64)
            self.mode_sent = True
            self._ip(_FUP, self.cur_ip)
        self._emit(b"\x02\x23")

    def _stop_trace(self, ip: int) -> None:
        """A branch reached a TraceStop range."""
        self._flush_tnt()
        if self.pkt_en:
            self._ip(_PGD, ip)
        self._emit(enc.stop())
        self.triggered = False
        self.stopped_by_tracestop = True
        self.pkt_en = False

    def _enable(self, ip: int) -> None:
        """PacketEn became set at ``ip``."""
        if not self.mode_sent:
            self._emit(_PSB_PLUS_TAIL_64)
            self.mode_sent = True
        self.retstack.clear()
        self._ip(_PGE, ip)

    # ---- the interface the flow drives ------------------------------------
    def run(self, ip: int, n: int, sizes, first: int = 0) -> None:
        """``n`` instructions of a straight-line run retire, the first at
        ``ip``; their lengths are ``sizes[first:first + n]``.  PSB+ goes
        where it is due: PacketByteCnt reached the period (noticed here: no
        instruction retired since the packet that crossed it) and one more
        instruction retired."""
        while True:
            if self.psb_at < 0:
                if self.since_psb < self.psb_period or not self.triggered:
                    break
                self.psb_at = self.t + 1
            j = self.psb_at - self.t
            if j >= n or not self.triggered:
                break
            if j > 0:
                self.retire(j)
                for k in range(first, first + j):
                    ip += sizes[k]
                first += j
                n -= j
            self.cur_ip = ip
            self._psb_plus()
        self.cur_ip = ip
        if n:
            self.retire(n)

    def enter(self, ip: int, ctx_ok: bool = True) -> None:
        """The thread (re)enters user mode at ``ip`` (sysret, iret, thread
        start, signal handler, switched in)."""
        self.cur_ip = ip
        self.in_user = self.user
        self.ctx_ok = ctx_ok
        if not self.triggered:
            return
        if self.stops and self._in_stop(ip) and self.in_user and ctx_ok:
            self._stop_trace(ip)
            return
        self.filter_en = self._in_filter(ip)
        if self._update_pkt_en():
            self._enable(ip)

    def leave_sync(self) -> None:
        """The last instruction entered the kernel (syscall, trap)."""
        if self.pkt_en:
            self._flush_tnt()
            self._ip(_PGD, None)
        self.in_user = False
        self.pkt_en = False

    def leave_async(self, next_ip: int) -> None:
        """User code was interrupted before ``next_ip`` (signal, interrupt,
        context switch)."""
        if self.pkt_en:
            self._flush_tnt()
            self._ip(_FUP, next_ip)
            self._ip(_PGD, None)
        self.in_user = False
        self.pkt_en = False

    def retire(self, n: int) -> None:
        """``n`` instructions retired (the time advances; counted if traced)."""
        if self.pkt_en:
            self.insns += n
        if not self.triggered:
            return
        t = self.t + n
        if self.mtc_en:
            p = (t * self.eax // self.ebx) >> self.mtc_freq
            if p != self.mtc_p:
                # The MTC goes at the crystal tick, inside this run: its CYC
                # counts the cycles up to that tick only, and the rest go
                # into the next one (a decoder times what follows from the
                # MTC on; counting them before it put every time stamp up
                # to the next MTC that many cycles early)
                b = -(-((p << self.mtc_freq) * self.ebx) // self.eax)
                k = min(max(b - self.t, 0), n)
                self.t = t
                self.mtc_p = p
                self.cyc_acc += k
                if self.cyc_en:
                    self._cyc()
                self._emit(enc.mtc(p & 0xFF))
                self.cyc_acc += n - k
                return
        self.t = t
        self.cyc_acc += n

    def idle_until(self, t: int) -> None:
        """The processor ran nothing traced until TSC ``t`` (PacketEn is
        clear: the thread that ran last left user code): its clock jumps
        there, and as after a wake from a C-state (or, for a thread's own
        stream, TraceEn set again when it is scheduled in) it says so with
        TSC, TMA (with MTC on: the decoder's MTC count starts over from it)
        and CBR packets (without TSC, the MTC of the new period).  The cycles not
        yet reported in a CYC packet are dropped: the TSC supersedes them."""
        if t <= self.t:
            return
        self.t = t
        if not self.triggered:
            return
        self._flush_tnt()
        self.cyc_acc = 0
        p = self._art(t) >> self.mtc_freq
        if self.tsc_en:
            self._emit(enc.tsc(t & ((1 << 56) - 1)))
            if self.mtc_en:
                art = self._art(t)
                self._emit(enc.tma(art & 0xFFFF, min(t - art * self.ebx // self.eax, 511)))
        elif self.mtc_en and p != self.mtc_p:
            self._emit(enc.mtc(p & 0xFF))
        self._emit(enc.cbr(self.cbr))
        self.mtc_p = p

    def branch(self, kind: int, nlip: int, next_ip: int) -> None:
        """A near branch (or far transfer within user mode) retired and
        execution goes on at ``next_ip``; ``nlip`` is the address after it."""
        if not self.triggered or not self.in_user:
            return
        if self.stops and self.ctx_ok and self._in_stop(next_ip):
            self._stop_trace(next_ip)
            return
        if self.filters:
            inside = self._in_filter(next_ip)
            if inside != self.filter_en:
                if not inside:
                    if self.pkt_en:
                        self._flush_tnt()
                        self._ip(_PGD, next_ip)
                    self.filter_en = False
                    self.pkt_en = False
                else:
                    self.filter_en = True
                    if self._update_pkt_en():
                        self._enable(next_ip)
                return
        if not self.pkt_en:
            return
        if kind == K_JCC:
            self._tnt(1 if next_ip != nlip else 0)
        elif kind == K_RET:
            rs = self.retstack
            if self.retc and rs and rs[-1] == next_ip:
                rs.pop()
                self._tnt(1)
            else:
                self._flush_tnt()
                self._ip(_TIP, next_ip)
        elif kind == K_CALL:
            if next_ip != nlip:     # "call next" (PIC) is no call to return from
                self._push(nlip)
        elif kind == K_CALL_IND:
            self._push(nlip)
            self._flush_tnt()
            self._ip(_TIP, next_ip)
        elif kind == K_JMP_IND or kind == K_FAR:
            self._flush_tnt()
            self._ip(_TIP, next_ip)

    def _push(self, nlip: int) -> None:
        rs = self.retstack
        rs.append(nlip)
        if len(rs) > RETSTACK_DEPTH:
            del rs[0]

    def finish(self) -> None:
        """Tracing ends (TraceEn cleared): pending TNT bits, and FUP +
        TIP.PGD if packets were on; then hand everything to the sink."""
        if self.pkt_en:
            self._flush_tnt()
            self._ip(_FUP, self.cur_ip)
            self._ip(_PGD, None)
            self.pkt_en = False
        self._flush_tnt()
        self.flush()
