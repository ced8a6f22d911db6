"""From an execution log to PT streams: threads, blocks, kernel transitions.

:func:`load` reads an execution log (:mod:`.execlog`) into per-thread
segments of resolved blocks; :func:`generate` drives one
:class:`~.ptgen.Tracer` per stream over them, in cpu mode (a stream per
logical CPU; a thread's segments go to the CPU they ran on, ordered by
time, with FUP + TIP.PGD / TIP.PGE where threads switch) or thread mode (a
stream per thread).  No I/O: bytes in, tracers out.

A block's last instruction is the only one that can transfer control
(blocks with a branch inside are split when they are defined).  Its
outcome is known once the thread's next instruction is: the flow keeps it
pending until then.  A rep-prefixed string instruction that continues in
place (the next block starts at its own address) retires once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from hwtrace.x86 import decode
from hwtrace.x86.insn import Kind, X86Error

from . import execlog as xl, schedule
from .ptgen import (K_CALL, K_CALL_IND, K_FAR, K_JCC, K_JMP, K_JMP_IND, K_OTHER,
                    K_REP, K_RET, K_TRAP, TraceConfig, Tracer)

#: classify()'s kind for an instruction that always faults (ud0/ud1/ud2:
#: #UD): it never retires, so split_block ends the run before it and the
#: thread leaves user code *at* it (FUP(ud2) + TIP.PGD, as hardware traces
#: a fault), not after it as after a trap.  The generator never sees it.
K_FAULT = -1

_KIND = {
    Kind.JCC: K_JCC, Kind.JRCXZ: K_JCC, Kind.LOOP: K_JCC, Kind.LOOPE: K_JCC,
    Kind.LOOPNE: K_JCC, Kind.JMP_REL: K_JMP, Kind.JMPABS: K_JMP,
    Kind.CALL_REL: K_CALL, Kind.CALL_IND: K_CALL_IND, Kind.JMP_IND: K_JMP_IND,
    Kind.RET: K_RET, Kind.RET_IMM: K_RET,
    Kind.CALL_FAR: K_FAR, Kind.CALL_FAR_IND: K_FAR, Kind.JMP_FAR: K_FAR,
    Kind.JMP_FAR_IND: K_FAR, Kind.RETF: K_FAR, Kind.RETF_IMM: K_FAR,
    Kind.IRET: K_FAR,
    Kind.SYSCALL: K_TRAP, Kind.SYSENTER: K_TRAP, Kind.INT: K_TRAP,
    Kind.INT3: K_TRAP, Kind.INTO: K_TRAP, Kind.INT1: K_TRAP, Kind.UD: K_FAULT,
    Kind.SYSRET: K_TRAP, Kind.SYSEXIT: K_TRAP, Kind.HLT: K_TRAP,
}
_PREFIXES = frozenset((0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65, 0x66, 0x67, 0xF0, 0xF2, 0xF3))
_STRING_OPS = frozenset((0x6C, 0x6D, 0x6E, 0x6F, 0xA4, 0xA5, 0xA6, 0xA7,
                         0xAA, 0xAB, 0xAC, 0xAD, 0xAE, 0xAF))


def _is_rep_string(code: bytes) -> bool:
    rep = False
    i = 0
    while i < len(code) and code[i] in _PREFIXES:
        rep = rep or code[i] in (0xF2, 0xF3)
        i += 1
    if i < len(code) and 0x40 <= code[i] <= 0x4F:
        i += 1
    return rep and i < len(code) and code[i] in _STRING_OPS


def classify(pc: int, code: bytes) -> tuple[int, int]:
    """(kind, direct target or 0) of one instruction (see ptgen.K_*)."""
    try:
        insn = decode(code)
    except X86Error:
        return K_OTHER, 0
    k = _KIND.get(insn.kind)
    if k is None:
        return (K_REP if _is_rep_string(code) else K_OTHER), 0
    if k in (K_JCC, K_JMP, K_CALL):
        return k, insn.target(pc) or 0
    return k, 0


class BlockInfo(NamedTuple):
    """A straight-line run whose last instruction may transfer control."""
    pc: int
    ninsn: int
    last: int       # address of the last instruction
    kind: int       # its kind (ptgen.K_*)
    target: int     # its direct target (0 if none)
    nlip: int       # the address after it
    sizes: bytes = b""  # instruction lengths (the first ninsn count): where PSB+ can go


def _complete(code: bytes) -> bool:
    try:
        return decode(code).size == len(code)
    except X86Error:
        return False


def _before_fault(b: BlockInfo) -> BlockInfo:
    """The part of ``b`` that retired when its last instruction faulted:
    a plain run whose next instruction is the faulting one."""
    return BlockInfo(b.pc, b.ninsn - 1, b.last, K_OTHER, 0, b.last, b.sizes)


def split_block(pc: int, sizes: bytes, code: bytes, starts: dict | None = None,
                last_only: bool = False) -> list[BlockInfo]:
    """BlockInfos for one defined block: one, unless a branch is inside.
    ``starts`` (if given) receives each part's instruction addresses.
    ``last_only``: the source guarantees only the last instruction can
    transfer control (QEMU ends a translation block at every branch), so
    only it is classified.

    QEMU 7.2 reports an instruction it started to translate but moved to
    the next block (its bytes cut short) as the block's last one: such an
    incomplete last instruction is dropped, it did not execute there.
    """
    if len(sizes) > 1 and not _complete(code[len(code) - sizes[-1]:]):
        code = code[:len(code) - sizes[-1]]
        sizes = sizes[:-1]
    out = []
    start = pc
    first = 0
    n = 0
    off = 0
    ip = pc
    last = len(sizes) - 1
    if last_only:
        addrs = []
        ip = pc
        for sz in sizes:
            addrs.append(ip)
            ip += sz
        kind, target = classify(addrs[-1], code[len(code) - sizes[-1]:])
        b = BlockInfo(pc, len(sizes), addrs[-1], kind, target, ip, bytes(sizes))
        if kind == K_FAULT:
            b, addrs = _before_fault(b), addrs[:-1]
        if starts is not None:
            starts[b] = tuple(addrs)
        return [b]
    addrs = []
    for i, sz in enumerate(sizes):
        n += 1
        addrs.append(ip)
        insn = code[off:off + sz]
        kind, target = classify(ip, insn)
        if i == last or (kind != K_OTHER and kind != K_REP):
            b = BlockInfo(start, n, ip, kind, target, ip + sz, bytes(sizes[first:i + 1]))
            if kind == K_FAULT:
                b, addrs = _before_fault(b), addrs[:-1]
            out.append(b)
            if starts is not None:
                starts[b] = tuple(addrs)
            addrs = []
            start = ip + sz
            first = i + 1
            n = 0
        off += sz
        ip += sz
    return out


@dataclass
class Segment:
    """A run of one thread's records between two chunk starts."""
    pid: int
    tid: int
    cpu: int
    time: int
    items: list = field(default_factory=list)   # BlockInfo lists and event records
    first_ip: int | None = None
    busy: bool = False      # index-only load: EXEC records seen


@dataclass
class ThreadInfo:
    pid: int
    tid: int
    parent_tid: int = 0
    segments: list = field(default_factory=list)
    exit_status: int | None = None
    #: per PROC_EXEC record of the thread, in order: [the record, void]
    #: (void: a SYSRET followed, the execve failed)
    execs: list = field(default_factory=list)


@dataclass
class ExecTrace:
    """Everything the generator and the bundle need from one log."""
    header: xl.Header
    threads: dict           # tid -> ThreadInfo (in order of appearance)
    processes: dict         # pid -> {"ppid", "exe", "exit", "execs": [...]}
    mmaps: list             # xl.Mmap records
    handlers: dict          # pid -> set of signal handler addresses
    t0: int = 0
    blocks: list = field(default_factory=list)   # index-only: BLOCK parts in log order
    features: set = field(default_factory=set)   # record kinds that need the Python path
    #: per MMAP record (as ``mmaps``): the image it belongs to, as the
    #: number of execve calls its process had made before it (epoch)
    mmap_epochs: list = field(default_factory=list)
    #: pid -> how it ended, as its parent's wait saw (REAPED records)
    reaped: dict = field(default_factory=dict)


def load(data: bytes, index_only: bool = False) -> ExecTrace:
    """Parse an execution log into per-thread segments of BlockInfos.

    ``index_only``: don't resolve EXEC records (the compiled generator
    does): segments keep only their event records, ``blocks`` lists each
    BLOCK record's parts in log order and ``features`` says which records
    only the Python generator handles ("insn", "exec_part", "signal",
    "multi")."""
    order_blocks: list = []
    features: set = set()
    cuts: set = set()           # id() of the runs EXEC_PART cut short
    starts: dict = {}           # BlockInfo -> its instruction addresses
    sync_handlers: dict = {}    # pid -> handlers of fault signals
    header, off = xl.parse_header(data)
    qemu_blocks = header.source == xl.SOURCE_QEMU
    tables: dict[int, dict[int, list[BlockInfo]]] = {}
    threads: dict[int, ThreadInfo] = {}
    processes: dict[int, dict] = {}
    handlers: dict[int, set] = {}
    mmaps: list = []
    seg: Segment | None = None
    table: dict = {}
    multi: dict[int, bool] = {}     # pid -> some block has a branch inside
    t0 = None
    last_time = 0
    mmap_execs: list = []       # per MMAP: its process's PROC_EXEC records before it
    open_exec: dict = {}        # tid -> (process, index) of an execve not yet known to succeed
    reaped: dict = {}           # pid -> its status, as its parent's wait saw
    for r in xl.parse(data, off, first_ids=index_only):
        t = type(r)
        if seg is None and t not in (xl.Block, xl.Ctx, xl.Time, xl.Mmap, xl.Munmap):
            raise xl.ExecLogError(f"execution log: {t.__name__} record before any CTX")
        if t is xl.Exec and open_exec:
            open_exec.pop(seg.tid, None)        # code ran after the execve
        if t is xl.Exec and index_only:
            if r.ids and not seg.busy:
                seg.busy = True
                b = table.get(r.ids[0])
                if b is None:
                    raise xl.ExecLogError("execution log: EXEC of an undefined block")
                seg.first_ip = (b[0] if type(b) is tuple else b).pc
        elif t is xl.Exec:
            items = seg.items
            try:
                # every block is one BlockInfo (QEMU's always are)
                items += map(table.__getitem__, r.ids)
            except KeyError:
                raise xl.ExecLogError(f"execution log: EXEC of an undefined block") from None
            if type(items[-1]) is not BlockInfo or multi.get(seg.pid):
                _expand_multi(items, len(r.ids))
        elif t is xl.Block:
            parts = split_block(r.pc, r.sizes, r.code, starts, qemu_blocks)
            if index_only:
                order_blocks.append(parts)
                if len(parts) != 1:
                    features.add("multi")
            if len(parts) == 1:
                tables.setdefault(r.pid, {})[r.id] = parts[0]
            else:
                tables.setdefault(r.pid, {})[r.id] = tuple(parts)
                multi[r.pid] = True
        elif t is xl.Ctx:
            th = threads.get(r.tid)
            if th is None:
                th = threads[r.tid] = ThreadInfo(r.pid, r.tid)
            seg = Segment(r.pid, r.tid, r.cpu, last_time)
            th.segments.append(seg)
            table = tables.setdefault(r.pid, {})
            processes.setdefault(r.pid, {"ppid": 0, "exe": "", "exit": None, "execs": [], "exec_ok": []})
        elif t is xl.Time:
            last_time = r.value
            if t0 is None:
                t0 = r.value
            if seg is not None:
                if not seg.items and not seg.busy:
                    seg.time = r.value
                seg.items.append(r)         # where the slices of schedule start
        elif t is xl.Insn:
            features.add("insn")
            seg.items.extend(split_block(r.pc, bytes((len(r.code),)), r.code))
        elif t is xl.ExecPart:
            features.add("exec_part")
            blocks = table.get(r.id)
            if blocks is None:
                raise xl.ExecLogError("execution log: EXEC_PART of an undefined block")
            blocks = blocks if type(blocks) is tuple else (blocks,)
            if index_only:
                if not seg.busy:
                    seg.busy = True
                    seg.first_ip = blocks[0].pc
                continue
            left = r.count
            for b in blocks:
                if left >= b.ninsn:
                    seg.items.append(b)
                    left -= b.ninsn
                    continue
                # the next instruction never retired (it faulted, or the
                # thread stopped before it): a plain run up to it, maybe empty
                nlip = b.pc + sum(b.sizes[:left])
                cut = BlockInfo(b.pc, left, nlip - b.sizes[left - 1] if left else 0,
                                K_OTHER, 0, nlip, b.sizes)
                seg.items.append(cut)
                cuts.add(id(cut))
                break
        elif t is xl.ProcStart:
            p = processes.setdefault(seg.pid, {"ppid": 0, "exe": "", "exit": None, "execs": [], "exec_ok": []})
            p["ppid"] = r.parent_pid
            if r.parent_pid and multi.get(r.parent_pid):
                multi[seg.pid] = True
            if r.parent_pid and r.parent_pid in tables:
                # the child's own blocks (defined before this record reached
                # the log) win over the inherited ones
                inherited = dict(tables[r.parent_pid])
                inherited.update(tables.get(seg.pid, {}))
                table = tables[seg.pid] = inherited
                handlers[seg.pid] = set(handlers.get(r.parent_pid, ()))
                sync_handlers[seg.pid] = set(sync_handlers.get(r.parent_pid, ()))
        elif t is xl.ThreadStart:
            threads[seg.tid].parent_tid = r.parent_tid
        elif t is xl.Sigaction:
            if r.handler > 1:
                handlers.setdefault(seg.pid, set()).add(r.handler)
                if r.signo in SYNC_SIGNALS:
                    sync_handlers.setdefault(seg.pid, set()).add(r.handler)
            seg.items.append(r)
        elif t is xl.Mmap:
            mmaps.append(r)
            p = processes.get(r.pid)
            mmap_execs.append(len(p["execs"]) if p else 0)
        elif t is xl.ProcExec:
            p = processes[seg.pid]
            p["execs"].append(r)
            p["exec_ok"].append(r.followed)
            threads[seg.tid].execs.append([r, False])
            open_exec[seg.tid] = (p, len(p["execs"]) - 1)
            seg.items.append(r)
        elif t is xl.ProcExit:
            processes[seg.pid]["exit"] = r.status
            seg.items.append(r)
        elif t is xl.ThreadExit:
            threads[seg.tid].exit_status = r.status
            seg.items.append(r)
        elif t is xl.Reaped:
            reaped[r.pid] = r.status
        elif t is xl.Munmap:
            pass
        else:
            if t is xl.Signal:
                features.add("signal")
            elif t is xl.Sysret and open_exec:
                got = open_exec.pop(seg.tid, None)
                if got is not None:     # the execve failed: its PROC_EXEC is void
                    got[0]["exec_ok"][got[1]] = False
                    threads[seg.tid].execs[-1][1] = True
            seg.items.append(r)
    for th in threads.values():
        _find_signals(th, handlers.get(th.pid, set()), starts,
                      sync_handlers.get(th.pid, set()), cuts)
        for s in th.segments:
            for it in s.items:
                if type(it) is BlockInfo:
                    s.first_ip = it.pc
                    break
    epochs = []
    for m, k in zip(mmaps, mmap_execs):
        ok = processes.get(m.pid, {}).get("exec_ok", ())
        epochs.append(sum(1 for x in ok[:k] if x))
    return ExecTrace(header, threads, processes, mmaps, handlers, t0 or 0,
                     order_blocks, features, epochs, reaped)


def _expand_multi(items: list, n: int) -> None:
    """Replace the tuples among the last ``n`` items by their parts."""
    tail = items[len(items) - n:]
    del items[len(items) - n:]
    for it in tail:
        if type(it) is tuple:
            items.extend(it)
        else:
            items.append(it)


NR_RT_SIGRETURN = 15


def _explained(prev: BlockInfo, pc: int, handlers) -> bool:
    """Whether control can reach ``pc`` right after ``prev`` without an
    asynchronous event (a signal delivered between them)."""
    k = prev.kind
    if k == K_OTHER or k == K_REP:
        return pc == prev.nlip or (k == K_REP and pc == prev.last)
    if k == K_JCC:
        return pc == prev.target or pc == prev.nlip
    if k == K_JMP or k == K_CALL:
        return pc == prev.target
    if k == K_TRAP:
        return True
    return pc not in handlers


#: Signals raised by a faulting instruction (SIGILL, SIGTRAP, SIGBUS,
#: SIGFPE, SIGSEGV): their handlers resume at the instruction that faulted.
SYNC_SIGNALS = frozenset((4, 5, 7, 8, 11))


def _find_signals(th: ThreadInfo, handlers, starts: dict | None = None,
                  sync_handlers=frozenset(), cuts=frozenset()) -> None:
    """Mark where signals were delivered asynchronously (QEMU reports no
    delivery): a transfer no instruction explains, or an indirect one into
    a handler.  The interrupted IP is where the handler's rt_sigreturn
    resumes; a SIGNAL record (async, with that IP) goes before the
    handler's first block.  If the handler is one of a fault signal and
    that IP lies inside the block before (an instruction of it faulted:
    QEMU ends a block early there), the block is cut before it, so
    exactly the retired instructions count.  If the source said the block
    before was left early (EXEC_PART: QEMU saw which instruction faulted,
    in ``cuts``), the signal is at that instruction, wherever the handler
    returns to (it may skip it, or never return).  Sources that log
    SIGNAL themselves are left alone."""
    if not handlers:
        return      # no handler: no signal is delivered to user code
    prev = None
    prev_at = None              # (segment, index) of prev
    in_kernel = True
    deliveries: list = []       # open handler activations: [Signal or None]
    resume_for = None           # activation whose sigreturn just happened
    fixes: list = []            # (segment, index, delivery slot)
    slots: list = []
    for seg in th.segments:
        for i, it in enumerate(seg.items):
            t = type(it)
            if t is BlockInfo:
                if in_kernel and handlers and it.pc in handlers and \
                        (prev is None or prev.kind != K_TRAP or it.pc != prev.nlip):
                    # delivered at a kernel exit -- possibly right at the
                    # rt_sigreturn of another handler, whose resume IP is
                    # then the one this handler's rt_sigreturn goes to
                    deliveries.append(("carry", resume_for))
                    resume_for = None
                elif resume_for is not None:
                    slots[resume_for] = it.pc
                    resume_for = None
                if in_kernel:
                    pass
                elif prev is not None and not _explained(prev, it.pc, handlers):
                    slots.append(0)
                    deliveries.append(len(slots) - 1)
                    fixes.append((seg, i, len(slots) - 1, prev, it.pc, prev_at))
                in_kernel = False
                prev = it
                prev_at = (seg, i)
            elif t is xl.Syscall:
                in_kernel = True
                if it.nr == NR_RT_SIGRETURN and deliveries:
                    d = deliveries.pop()
                    resume_for = d[1] if type(d) is tuple else d
            elif t is xl.Signal:
                return
    if not fixes:
        return
    by_seg: dict[int, list] = {}
    for seg, i, slot, prev, handler, (pseg, pi) in fixes:
        ip = slots[slot]
        if id(prev) in cuts:
            ip = prev.nlip
        elif ip and handler in sync_handlers and prev.pc <= ip <= prev.last \
                and starts and ip in starts.get(prev, ()):
            # a fault: the instructions from ip on never retired
            n = starts[prev].index(ip)
            pseg.items[pi] = BlockInfo(prev.pc, n, 0, K_OTHER, 0, ip, prev.sizes)
        if not ip:
            k = prev.kind
            ip = prev.target if k in (K_JMP, K_CALL) else prev.nlip
        by_seg.setdefault(id(seg), []).append((i, xl.Signal(0, True, handler, ip), seg))
    for lst in by_seg.values():
        seg = lst[0][2]
        items = seg.items
        for i, sig, _ in sorted(lst, key=lambda x: -x[0]):
            items.insert(i, sig)


class _ThreadState:
    """Where a thread's instruction flow stands between segments."""
    __slots__ = ("tid", "pid", "pending", "in_kernel", "ctx_ok", "handlers", "started")

    def __init__(self, tid: int, pid: int, ctx_ok: bool, handlers: set):
        self.tid = tid
        self.pid = pid
        self.pending: BlockInfo | None = None
        self.in_kernel = True       # threads start in the kernel (exec/clone)
        self.ctx_ok = ctx_ok
        self.handlers = handlers
        self.started = False


def _run_items(st: _ThreadState, tr: Tracer, items: list, i: int = 0,
               end: int | None = None) -> None:
    """Feed a segment's items (``items[i:end]``) to a tracer: the steady
    state (packets on, no filters, no timing packets) in a tight loop, the
    rest item by item."""
    if end is None:
        end = len(items)
    while i < end:
        i = _run_fast(st, tr, items, i, end)
        if i < end:
            _run_one(st, tr, items[i])
            i += 1


def _run_fast(st: _ThreadState, tr: Tracer, items: list, i: int, end: int) -> int:
    """The hot loop: consume items from ``i`` while every one is a block
    whose predecessor's outcome needs at most a TNT bit; return where it
    stopped.  Tracer state lives in locals and is written back on exit."""
    pending = st.pending
    if (pending is None or st.in_kernel or not tr.pkt_en or tr.filters or tr.stops
            or tr.mtc_en or tr.cyc_en):
        return i
    bits, nb, tnt_max = tr.tnt_bits, tr.tnt_n, tr.tnt_max
    insns, t, cyc = tr.insns, tr.t, tr.cyc_acc
    psb_at = tr.psb_at
    rs = tr.retstack
    retc = tr.retc
    period = tr.psb_period
    while i < end:
        b = items[i]
        if type(b) is not BlockInfo:
            break
        pc = b.pc
        k = pending.kind
        if k == K_JCC:
            if pc == pending.nlip:
                bits <<= 1
            elif pc == pending.target:
                bits = (bits << 1) | 1
            else:
                break
            nb += 1
            if nb == tnt_max:
                tr.tnt_bits, tr.tnt_n = bits, nb
                tr._flush_tnt()
                bits, nb = 0, 0
        elif k == K_OTHER:
            if pc != pending.nlip:
                break
        elif k == K_CALL:
            if pc != pending.target:
                break
            if pc != pending.nlip:
                rs.append(pending.nlip)
                if len(rs) > 64:
                    del rs[0]
        elif k == K_JMP:
            if pc != pending.target:
                break
        elif k == K_RET and retc and rs and rs[-1] == pc:
            rs.pop()
            bits = (bits << 1) | 1
            nb += 1
            if nb == tnt_max:
                tr.tnt_bits, tr.tnt_n = bits, nb
                tr._flush_tnt()
                bits, nb = 0, 0
        elif k == K_REP:
            if pc == pending.last and b.ninsn == 1:
                # the same rep instruction, continuing: it retires once
                pending = b
                i += 1
                continue
            if pc != pending.nlip:
                break
        elif k == K_JMP_IND or k == K_CALL_IND or k == K_RET:
            if k == K_CALL_IND:
                rs.append(pending.nlip)
                if len(rs) > 64:
                    del rs[0]
            tr.tnt_bits, tr.tnt_n = bits, nb
            tr._flush_tnt()
            tr._ip(0x0D, pc)
            bits, nb = 0, 0
        else:
            break
        n = b.ninsn
        if psb_at < 0 and tr.since_psb >= period:
            psb_at = t + 1          # see Tracer.run
        if 0 <= psb_at < t + n:
            # PSB+ is due inside (or at the start of) this run
            tr.tnt_bits, tr.tnt_n, tr.insns, tr.t, tr.cyc_acc = bits, nb, insns, t, cyc
            tr.psb_at = psb_at
            tr.run(pc, n, b.sizes)
            bits, nb, insns, t, cyc = tr.tnt_bits, tr.tnt_n, tr.insns, tr.t, tr.cyc_acc
            psb_at = tr.psb_at
        else:
            insns += n
            t += n
            cyc += n
        pending = b
        i += 1
    tr.tnt_bits, tr.tnt_n, tr.insns, tr.t, tr.cyc_acc = bits, nb, insns, t, cyc
    tr.psb_at = psb_at
    tr.cur_ip = pending.nlip
    st.pending = pending
    return i


def _run_one(st: _ThreadState, tr: Tracer, b) -> None:
    """One item, every case (the reference behaviour)."""
    pending = st.pending
    in_kernel = st.in_kernel
    handlers = st.handlers
    branch = tr.branch
    if type(b) is BlockInfo:
        pc = b.pc
        n = b.ninsn
        if in_kernel:
            tr.enter(pc, st.ctx_ok)
            in_kernel = False
        elif pending is not None:
            k = pending.kind
            if k == K_REP and pc == pending.last:
                n -= 1          # the same rep instruction, continuing
            elif k == K_OTHER or k == K_REP:
                if pc != pending.nlip:
                    _interrupted(tr, pending.nlip, pc)
            elif k == K_JCC:
                if pc == pending.target or pc == pending.nlip:
                    branch(k, pending.nlip, pc)
                else:
                    _interrupted(tr, pending.nlip, pc)
            elif k == K_JMP or k == K_CALL:
                branch(k, pending.nlip, pending.target)
                if pc != pending.target:
                    _interrupted(tr, pending.target, pc)
            elif k == K_TRAP:
                tr.leave_sync()
                tr.enter(pc, st.ctx_ok)
            elif pc in handlers and handlers:
                # an indirect transfer can't be followed by a handler
                # entry except through signal delivery
                _interrupted(tr, pc, pc)
            else:
                branch(k, pending.nlip, pc)
        if n == b.ninsn:
            tr.run(pc, n, b.sizes)
        elif n:     # after the rep instruction that went on
            tr.run(pc + b.sizes[0], n, b.sizes, 1)
        pending = b
    else:
        t = type(b)
        if t is xl.Syscall:
            if pending is not None and not in_kernel:
                tr.leave_sync()
                tr.cur_ip = pending.nlip
            in_kernel = True
            pending = None
        elif t is xl.Signal:
            if not in_kernel:
                ip = b.ip or (pending.nlip if pending is not None else 0)
                if pending is not None:
                    k = pending.kind
                    if k == K_REP and ip == pending.last:
                        if tr.pkt_en:
                            tr.insns -= 1   # retires after the handler
                    elif k not in (K_OTHER, K_REP, K_TRAP):
                        branch(k, pending.nlip, ip)
                tr.leave_async(ip)
            in_kernel = True
            pending = None
        elif t is xl.Sigaction:
            if b.handler > 1:
                handlers.add(b.handler)
    st.pending = pending
    st.in_kernel = in_kernel


def _interrupted(tr: Tracer, resume_ip: int, next_ip: int) -> None:
    """User code was left asynchronously before ``resume_ip`` (a signal was
    delivered there) and goes on at ``next_ip`` (the handler)."""
    tr.leave_async(resume_ip)
    tr.enter(next_ip, tr.ctx_ok)


def _switch_out(st: _ThreadState, tr: Tracer, next_ip: int | None) -> None:
    """The thread leaves this CPU at a segment end (its next instruction is
    ``next_ip``, the first one of its next segment, if any)."""
    if st.in_kernel:
        return
    p = st.pending
    if p is not None and next_ip is not None:
        k = p.kind
        if k == K_TRAP:
            tr.leave_sync()
            st.in_kernel = True
            st.pending = None
            return
        if k == K_REP and next_ip == p.last:
            # the rep instruction goes on after the switch: FUP at it, and
            # it retires (is counted) in the next segment only
            if tr.pkt_en:
                tr.insns -= 1
        elif k not in (K_OTHER, K_REP):
            tr.branch(k, p.nlip, p.target if k in (K_JMP, K_CALL) else next_ip)
        tr.leave_async(next_ip)
    elif p is not None:
        _leave_unfinished(tr, p)
    else:
        tr.leave_async(tr.cur_ip)
    st.in_kernel = True
    st.pending = None


def _leave_unfinished(tr: Tracer, p: BlockInfo) -> None:
    """The thread's log ends after run ``p`` with nothing to say where it
    went (the thread died or was killed): a direct jmp/call went to its
    target; a branch whose outcome is unknown (jcc, return, indirect) is
    taken as not retired, so the trace stops at it (FUP(branch) + TIP.PGD)
    rather than at an address after it that the decoder can't reach."""
    k = p.kind
    if k == K_TRAP:
        tr.leave_sync()
    elif k == K_OTHER or k == K_REP:
        tr.leave_async(p.nlip)
    elif k == K_JMP or k == K_CALL:
        tr.branch(k, p.nlip, p.target)
        tr.leave_async(p.target)
    else:
        if tr.pkt_en:
            tr.insns -= 1
        tr.leave_async(p.last)


@dataclass
class StreamResult:
    key: tuple              # ("cpu", n) or ("tid", tid)
    tracer: Tracer
    pid: int = 0


def assign_cr3(pids) -> dict[int, int]:
    """The CR3 value the emulation gives each process (32-byte aligned)."""
    return {pid: 0x1000 * (i + 1) for i, pid in enumerate(sorted(pids))}


def _with_t0(trace: ExecTrace, cfg: TraceConfig) -> TraceConfig:
    from dataclasses import replace
    return replace(cfg, timing=replace(cfg.timing, t0=cfg.timing.t0 or trace.t0))


def _ctx_ok(cfg: TraceConfig, cr3: dict, pid: int) -> bool:
    return not (int(cfg.ctl) & (1 << 7)) or cr3.get(pid) == cfg.cr3_match


def generate(trace: ExecTrace, cfg: TraceConfig, mode: str = "thread",
             num_cpus: int = 1, sink_for: Callable | None = None,
             cr3: dict | None = None, switches: list | None = None,
             exits: dict | None = None, starts: dict | None = None,
             execs: dict | None = None) -> list[StreamResult]:
    """Drive tracers over the trace; returns one result per stream.

    ``sink_for(key, pid)`` gives the sink of a stream (None: bytes stay in
    the tracer's ``buf``).  Threads run on one clock (:mod:`.schedule`).
    In cpu mode, ``switches`` (a list) receives ``(cpu, time, prev_pid,
    prev_tid, next_pid, next_tid)`` per context switch on a CPU (-1: idle);
    ``exits`` (a dict) gets tid -> time its trace ended, ``starts`` tid ->
    time it began, ``execs`` tid -> the time of each of its PROC_EXEC
    records.  Times are the streams' TSC (the emulated clock).
    """
    from . import schedule
    cr3 = cr3 if cr3 is not None else assign_cr3(trace.processes)
    if mode == "thread":
        def sink(tid):
            return sink_for(("tid", tid), trace.threads[tid].pid) if sink_for else None
        tracers = schedule.run_threads(trace, lambda tid: cfg, sink, cr3, exits=exits,
                                       starts=starts, execs=execs)
        return [StreamResult(("tid", tid), tracers[tid], th.pid)
                for tid, th in trace.threads.items()]
    tracers = schedule.run_cpus(trace, _with_t0(trace, cfg), num_cpus,
                                (lambda c: sink_for(("cpu", c), 0)) if sink_for else None,
                                cr3, switches=switches, exits=exits, starts=starts, execs=execs)
    return [StreamResult(("cpu", c), tr, 0) for c, tr in enumerate(tracers)]


def _end_thread(st: _ThreadState, tr: Tracer) -> None:
    """The thread's log ends: it exited (in the kernel), exec'd, or died."""
    if not st.in_kernel and st.pending is not None:
        _leave_unfinished(tr, st.pending)
    st.in_kernel = True
    st.pending = None
