"""The call stack over a run of records, all at once (no I/O, numpy only).

Between two events that matter to the call stack (tracing disabled or
enabled, an overflow, a decode error, ...) a stream is a plain run of
records (``hwtrace.flow.batches.BLOCK``, decoded with every branch ending
a record): record ``r``'s last instruction transfers control to record
``r + 1``'s first.  What the builder (:mod:`.callstack`) does with such a
transfer one at a time, :func:`solve` does for thousands at once, as long
as they are *regular*:

* a call whose target is not its fall-through opens an activation
  (``func`` = the target; a far call too, flagged ``FAR``);
* a return closes the top activation, and goes exactly where that
  activation's caller expects (its return address);
* a jump or taken conditional jump to the start of another function
  closes the top activation and opens the target at the same depth, with
  the same return address (a tail call: ``TAIL_CALL``, keeping ``FAR``);
* anything else changes nothing -- except an unconditional jump out of
  its function into a known function other than the top activation's (a
  longjmp may be unwinding), which is not regular.

Levels: the stack's frames are numbered from the bottom (0).  A call with
``d`` frames on the stack opens level ``d``, a return closes level
``d - 1``, a tail call closes and reopens level ``d - 1``.  The frame a
return closes is the last one opened at its level before it -- or, if
none was opened in this run, the frame that was there when the run began
(the ``stack`` argument): one sort of the opens by (level, position) and
one ``searchsorted`` match them all.

:func:`solve` matches, checks, and commits the longest regular prefix:
the first irregular transfer (a return to an unexpected address, a
return from the stack's bottom frame, a jump that may unwind, a tail call
to the function itself, a stack deeper than the limit) is left for the
builder to handle the slow way, after which it calls :func:`solve` again.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hwtrace.analysis import _runs_impl
from hwtrace.analysis.records import Flag
from hwtrace.analysis.slices import PATH_MUL, SLICE, Cols

# transfer codes (as the builder's)
NONE, CALL, RET, JUMP, COND, FCALL, FRET, FJUMP = range(8)

#: hwtrace.x86.insn.IClass value -> transfer code
ICLASS_CODE = np.zeros(256, np.int8)
ICLASS_CODE[2] = CALL       # CALL
ICLASS_CODE[3] = RET        # RETURN
ICLASS_CODE[4] = JUMP       # JUMP
ICLASS_CODE[5] = COND       # COND_JUMP
ICLASS_CODE[6] = FCALL      # FAR_CALL
ICLASS_CODE[7] = FRET       # FAR_RETURN
ICLASS_CODE[8] = FJUMP      # FAR_JUMP
ICLASS_CODE[10] = JUMP      # INDIRECT

#: a frame of the stack a run starts on (the builder keeps these current)
STACK = np.dtype([("id", "<i8"), ("parent", "<i8"), ("func", "<u8"),
                  ("name", "<i4"), ("flags", "<u4"), ("pid", "<i8"),
                  ("tid", "<i8"), ("begin_idx", "<i8"), ("eseq", "<i8"),
                  ("path", "<u8"), ("ret", "<u8"), ("ret_ok", "?")])

SLICE_T = {f: SLICE.fields[f][0] for f in SLICE.names}
_FAR = int(Flag.FAR)
_TAIL = int(Flag.TAIL_CALL)
_U8 = np.uint64


class Transfers(NamedTuple):
    """The transfers of a run: transfer ``j`` ends record ``j`` and lands
    on record ``j + 1``."""

    code: np.ndarray        # int8 transfer code
    fall: np.ndarray        # u8 fall-through (return address)
    tgt: np.ndarray         # u8 where it went
    land_idx: np.ndarray    # i8 instruction index where it landed
    src: np.ndarray         # u8 the branch instruction


class Committed(NamedTuple):
    k: int                  # transfers committed
    enters: np.ndarray      # SLICE rows (begin fields)
    exits: np.ndarray       # SLICE rows (end fields but times)
    keep: int               # frames of the old stack still there (the bottom ones)
    top: np.ndarray         # STACK rows above them (opened in this run)
    opened: int             # activations opened
    paths: tuple            # (path, parent path, name) of every open
    placed: bool = False    # enters and exits were written where ``out`` put them


class Match(NamedTuple):
    """What the matching of a run found, before the rows are made (the
    compiled core's and the twin's common answer; indices into the run).

    Opens (calls and tail calls, in order) ``o_*``, closes (returns and
    tail calls, in order) ``x_*``; a frame is named by the index of its
    open, or -1 for a frame of the stack the run began on."""

    k: int                  # transfers committed
    keep: int               # frames of the old stack still there
    d_end: int              # frames on the stack after the run
    o_tr: np.ndarray        # i8 the transfer that opened it
    o_lvl: np.ndarray       # i8 its level
    o_ret: np.ndarray       # u8 its return address
    o_ret_ok: np.ndarray    # bool the return address is known
    o_flags: np.ndarray     # u4 FAR / TAIL_CALL
    o_pfr: np.ndarray       # i8 its parent's open (-1: an old frame, or none)
    x_tr: np.ndarray        # i8 the transfer that closed it
    x_lvl: np.ndarray       # i8 its level
    x_fr: np.ndarray        # i8 its open (-1: the old frame at x_lvl)
    top_fr: np.ndarray      # i8 the open of each level keep..d_end-1
    unknown: np.ndarray     # u8 addresses to register as unknown names first
    o_nid: np.ndarray | None = None   # i4 name ids of the opens (-1: unknown
    #                                   code), or None: the names resolve them


def solve(tr: Transfers, stack: np.ndarray, names, *, seq0: int,
          next_id: int, max_depth: int, pid: int, tid: int, tx: bool,
          lookup: bool, paths: bool = True, impl: str | None = None,
          scanned: int = 0, out=None, named=None, guard=None,
          soft: bool = False) -> Committed | None:
    """Commit the regular prefix of ``tr`` (see the module doc).

    ``stack``: STACK rows of the frames at the start (at least one);
    ``names``: the :class:`~.symtable.AddrTable`; ``seq0``: the sequence
    number of transfer 0 (transfer ``j`` lands at record ``j + 1``, whose
    anchor gets ``seq0 + 4j``, its close ``+1`` and its open ``+2``);
    ``tx``: frames opened now are inside a TSX transaction; ``lookup``:
    symbols exist (tail calls and unwinding jumps can be recognized);
    ``paths``: compute call-path hashes (else 0).  ``impl``: "python"
    or "compiled" (default: :data:`._runs_impl.CORE`); ``scanned``:
    transfers [0, scanned) went through an earlier call already (the
    names of their unknown jump targets are registered: the compiled
    core need not look again past the cut); ``out``: where the compiled
    core writes the rows (``out(n_enters, n_exits)`` -> two SLICE
    :class:`.slices.Cols` to fill; the result says ``placed``);
    ``named``: None, or (bool per transfer, name id): the frames those
    transfers open have that name, not their target's (their target is
    no code: a ``[syscall]``, see :mod:`.roundtrips`); ``guard``: None,
    or ``guard(match)`` before the rows are made -- true: make none,
    return None; ``soft``: a jump that may unwind but finds no frame below
    the top in the function it lands in (mempcpy's jump into memcpy's
    body) goes on in the run, and so does a conditional jump to the start
    of the function it is in (a loop whose head is the entry: no tail
    call), else they end it (the builder takes them, one at a time, as
    changing nothing -- but where runs are cut decides the order in which
    the code met is named: see batchfeed)."""
    core = _runs_impl.core_for(impl)
    if core is None:
        m = match(tr, stack, names, max_depth=max_depth, lookup=lookup, soft=soft)
    else:
        m = _match_compiled(core, tr, stack, names, max_depth=max_depth,
                            lookup=lookup, scanned=scanned, soft=soft)
    if guard is not None and guard(m):
        return None
    return commit(m, tr, stack, names, seq0=seq0, next_id=next_id, pid=pid,
                  tid=tid, paths=paths, core=core, out=out, named=named)


def jump_kinds(tr: Transfers, names):
    """(tail, spec, spec_start) per transfer: a taken jump to the start
    of a known function (a tail call); an unconditional jump out of its
    function into a known one (maybe unwinding), and that function's
    start."""
    code, fall, tgt = tr.code, tr.fall, tr.tgt
    n = len(code)
    jumpish = ((code == JUMP) | (code == COND)) & (tgt != fall)
    tail = np.zeros(n, bool)
    spec = np.zeros(n, bool)
    spec_start = None
    if jumpish.any():
        jpos = np.flatnonzero(jumpish)
        is_start = names.starts(tgt[jpos])
        tail[jpos[is_start]] = True
        # an unconditional jump out of its function into a known one: maybe
        # unwinding (a jump within one function unwinds nothing)
        j2 = jpos[~is_start & (code[jpos] == JUMP)]
        j2 = j2[~names.same_function(tr.src[j2], tgt[j2])]
        start, _nid, known = names.resolve(tgt[j2])
        spec[j2[known]] = True
        spec_start = np.zeros(n, _U8)
        spec_start[j2] = start
    return tail, spec, spec_start


def match(tr: Transfers, stack: np.ndarray, names, *, max_depth: int,
          lookup: bool, soft: bool = False, _kinds=None) -> Match:
    """The Python twin of the matching: all transfers at once (numpy)."""
    code, fall, tgt = tr.code, tr.fall, tr.tgt
    n = len(code)
    s0 = len(stack)
    taken = tgt != fall
    opener = ((code == CALL) & taken) | (code == FCALL)
    closer = (code == RET) | (code == FRET)
    if _kinds is not None:
        tail, spec, spec_start = _kinds
    elif lookup:
        tail, spec, spec_start = jump_kinds(tr, names)
    else:
        tail = spec = np.zeros(n, bool)
        spec_start = None
    ev = np.flatnonzero(opener | closer | tail | spec)
    if not len(ev):
        return _no_match(n, s0)
    e_open = opener[ev]
    e_close = closer[ev]
    e_tail = tail[ev]
    e_spec = spec[ev]
    delta = e_open.astype(np.int64) - e_close
    depth = s0 + np.cumsum(delta) - delta           # frames before each event
    ne = len(ev)
    M = 2 * ne + 2
    # every event that opens a level: calls (level = depth), tail calls
    # (level = depth - 1); sorted by (level, position)
    o_ev = np.flatnonzero(e_open | e_tail)
    o_lvl = np.where(e_open[o_ev], depth[o_ev], depth[o_ev] - 1)
    o_key = o_lvl * M + 2 * o_ev + 1
    # a stable sort by level (positions are in order already); levels
    # span less than 2**16 (max_depth): a radix sort
    if len(o_lvl):
        lo = int(o_lvl.min())
        span = int(o_lvl.max()) - lo
        rel = (o_lvl - lo).astype(np.uint16 if span < 1 << 16 else np.int64)
        order = np.argsort(rel, kind="stable")
    else:
        order = np.zeros(0, np.int64)
    s_key = o_key[order]

    def frame_at(lvl, qpos):
        """Index into o_ev of the frame open at ``lvl`` just before event
        ``qpos`` (its close/query part), or -1: the run's initial frame
        at that level."""
        if not len(s_key):
            return np.full(len(lvl), -1, np.int64)
        j = np.searchsorted(s_key, lvl * M + 2 * qpos, side="left") - 1
        cand = order[np.maximum(j, 0)]
        return np.where((j >= 0) & (o_lvl[cand] == lvl), cand, -1)

    # -- what every open frame is: func, ret, far, carried roots ----------------
    o_func = tgt[ev[o_ev]]
    # the frame a tail call replaces
    t_idx = np.flatnonzero(e_tail[o_ev])               # opens that are tail calls
    t_ev = o_ev[t_idx]
    t_lvl = o_lvl[t_idx]
    t_prev = frame_at(t_lvl, t_ev) if len(t_idx) else np.zeros(0, np.int64)
    # return addresses and FAR: an OPEN's own; a tail call's from the frame
    # it replaced (a chain of tail calls from its root)
    o_ret = fall[ev[o_ev]].copy()
    o_ret_ok = np.ones(len(o_ev), bool)
    o_far = (code[ev[o_ev]] == FCALL)
    if len(t_idx):
        ptr = np.arange(len(o_ev))
        ptr[t_idx] = np.where(t_prev >= 0, t_prev, t_idx)
        root_carried = np.full(len(o_ev), -1, np.int64)
        root_carried[t_idx] = np.where(t_prev >= 0, -1, t_lvl)
        while True:
            nxt = ptr[ptr]
            if np.array_equal(nxt, ptr):
                break
            ptr = nxt
        rc = root_carried[ptr]
        from_run = rc < 0
        o_ret = np.where(from_run, o_ret[ptr], 0).astype(_U8)
        o_far = np.where(from_run, o_far[ptr], False)
        carried = ~from_run
        if carried.any():
            lv = rc[carried]
            o_ret[carried] = stack["ret"][lv]
            o_ret_ok[carried] = stack["ret_ok"][lv]
            o_far[carried] = (stack["flags"][lv] & _FAR) != 0

    # -- checks, in event order; the first failure ends the prefix --------------
    bad = np.zeros(ne, bool)
    c_ev = np.flatnonzero(e_close | e_tail)
    c_lvl = depth[c_ev] - 1
    bad[c_ev[c_lvl < 0]] = True
    c_lvl = np.maximum(c_lvl, 0)
    c_fr = frame_at(c_lvl, c_ev)
    c_run = c_fr >= 0
    cf = np.maximum(c_fr, 0)
    c_func = np.where(c_run, o_func[cf] if len(o_ev) else 0,
                      stack["func"][np.minimum(c_lvl, s0 - 1)])
    c_ret = np.where(c_run, o_ret[cf] if len(o_ev) else 0,
                     stack["ret"][np.minimum(c_lvl, s0 - 1)])
    c_ret_ok = np.where(c_run, o_ret_ok[cf] if len(o_ev) else False,
                        stack["ret_ok"][np.minimum(c_lvl, s0 - 1)])
    is_ret = e_close[c_ev]
    self_jump = ~is_ret & (c_func == tgt[ev[c_ev]])
    loop = self_jump & (code[ev[c_ev]] == COND) & (depth[c_ev] > 0)
    if soft and loop.any():
        # a conditional jump back to the start of the function it is in (a
        # loop whose head is the entry) is no tail call: the builder's
        # _settle changes nothing there (soft: where the run is cut cannot
        # change a name, see batchfeed).  Each level's function is the same
        # with or without them (they replaced a frame by its own function),
        # so the frames are found again without them, once
        tail = tail.copy()
        tail[ev[c_ev[loop]]] = False
        return match(tr, stack, names, max_depth=max_depth, lookup=lookup,
                     soft=soft, _kinds=(tail, spec, spec_start))
    bad[c_ev[is_ret & ~(c_ret_ok & (c_ret == tgt[ev[c_ev]]))]] = True
    bad[c_ev[self_jump]] = True     # an unconditional jump to itself
    if e_spec.any():
        q_ev = np.flatnonzero(e_spec)
        q_lvl = np.maximum(depth[q_ev] - 1, 0)
        q_fr = frame_at(q_lvl, q_ev)
        qf = np.maximum(q_fr, 0)
        q_func = np.where(q_fr >= 0, o_func[qf] if len(o_ev) else 0,
                          stack["func"][np.minimum(q_lvl, s0 - 1)])
        q_ev = q_ev[(spec_start[ev[q_ev]] != q_func) & (depth[q_ev] > 1)]
        if not soft:
            q_ev = q_ev[:1]
        # soft: unwinding (the builder's _jump_into) only where a frame
        # below the top is that function's; else the jump changes nothing
        lim = int(np.argmax(bad)) if bad.any() else ne
        for q in q_ev.tolist():
            if q > lim:
                break               # past a cut already
            if not soft:
                bad[q] = True
                break
            lv = np.arange(int(depth[q]) - 1, dtype=np.int64)
            fr = frame_at(lv, np.full(len(lv), q, np.int64))
            f = np.where(fr >= 0, o_func[np.maximum(fr, 0)] if len(o_ev) else 0,
                         stack["func"][np.minimum(lv, s0 - 1)])
            if (f == spec_start[ev[q]]).any():
                bad[q] = True
                break
    bad[o_ev[o_lvl >= max_depth]] = True
    cut = int(np.argmax(bad)) if bad.any() else ne
    k = int(ev[cut]) if cut < ne else n
    if cut == 0:
        return _no_match(k, s0)

    # -- the committed events [0, cut) ----------------------------------------------
    no = int(np.searchsorted(o_ev, cut))      # committed opens (o_ev is sorted)
    o_lvl_c = o_lvl[:no]
    p_lvl = o_lvl_c - 1
    p_fr = frame_at(np.maximum(p_lvl, 0), o_ev[:no]) if no else np.zeros(0, np.int64)
    o_pfr = np.where(p_lvl >= 0, p_fr, -1)
    o_flags = np.where(e_tail[o_ev[:no]], _TAIL | np.where(o_far[:no], _FAR, 0),
                       np.where(o_far[:no], _FAR, 0)).astype(np.uint32)
    nx = int(np.searchsorted(c_ev, cut))
    x_lvl = c_lvl[:nx]
    x_fr = c_fr[:nx]
    # the stack after: the initial frames below the lowest one closed, then
    # for each level above the frame last opened there (still open)
    d_end = int(depth[cut - 1] + delta[cut - 1])
    closed_carried = x_lvl[x_fr < 0]
    keep = int(closed_carried.min()) if len(closed_carried) else s0
    keep = min(keep, d_end)
    lv = np.arange(keep, d_end, dtype=np.int64)
    top_fr = frame_at(lv, np.full(len(lv), cut, np.int64)) if len(lv) else \
        np.zeros(0, np.int64)
    return Match(k, keep, d_end, ev[o_ev[:no]].astype(np.int64), o_lvl_c.astype(np.int64),
                 o_ret[:no].astype(_U8), o_ret_ok[:no], o_flags, o_pfr.astype(np.int64),
                 ev[c_ev[:nx]].astype(np.int64), x_lvl.astype(np.int64),
                 x_fr.astype(np.int64), top_fr.astype(np.int64), np.zeros(0, _U8))


def _no_match(k: int, s0: int) -> Match:
    z8, zu = np.zeros(0, np.int64), np.zeros(0, _U8)
    return Match(k, s0, s0, z8, z8, zu, np.zeros(0, bool), np.zeros(0, np.uint32),
                 z8, z8, z8, z8, z8, zu)


def _match_compiled(core, tr: Transfers, stack: np.ndarray, names, *,
                    max_depth: int, lookup: bool, scanned: int = 0,
                    soft: bool = False) -> Match:
    """The compiled core's matching: one walk over the transfers.  The
    symbol questions it asks of the names' merged table itself; over a
    lookup callback (no merged table) the twin answers them first."""
    table = None
    flags = spec_start = None
    if lookup:
        table = names.table()
        if table is None:
            tail, spec, spec_start = jump_kinds(tr, names)
            flags = tail.view(np.uint8) | (spec.view(np.uint8) << 1)
            if spec_start is None:
                spec_start = np.zeros(len(tr.code), _U8)
    far = ((stack["flags"] & _FAR) != 0)
    r = core.walk(np.ascontiguousarray(tr.code), np.ascontiguousarray(tr.fall),
                  np.ascontiguousarray(tr.tgt), np.ascontiguousarray(tr.src),
                  np.ascontiguousarray(stack["func"]), np.ascontiguousarray(stack["ret"]),
                  np.ascontiguousarray(stack["ret_ok"]).view(np.uint8),
                  far.view(np.uint8), int(max_depth), table, flags, spec_start,
                  int(scanned), bool(soft))
    (k, keep, d_end, o_tr, o_lvl, o_ret, o_ret_ok, o_flags, o_pfr, x_tr, x_lvl,
     x_fr, top_fr, unknown, o_nid) = r
    i8 = np.int64
    return Match(k, keep, d_end, np.frombuffer(o_tr, i8), np.frombuffer(o_lvl, i8),
                 np.frombuffer(o_ret, _U8), np.frombuffer(o_ret_ok, bool),
                 np.frombuffer(o_flags, np.uint32), np.frombuffer(o_pfr, i8),
                 np.frombuffer(x_tr, i8), np.frombuffer(x_lvl, i8),
                 np.frombuffer(x_fr, i8), np.frombuffer(top_fr, i8),
                 np.frombuffer(unknown, _U8),
                 None if o_nid is None else np.frombuffer(o_nid, np.int32))


def commit(m: Match, tr: Transfers, stack: np.ndarray, names, *, seq0: int,
           next_id: int, pid: int, tid: int, paths: bool, core=None,
           out=None, named=None) -> Committed:
    """The rows of a match: the activations opened (``enters``), those
    closed (``exits``), the stack after (``named``: as :func:`solve`'s)."""
    if len(m.unknown):
        names.register_unknown(m.unknown)
    no = len(m.o_tr)
    if not no and not len(m.x_tr):
        return _nothing(m.k, stack)
    s0 = len(stack)
    tgt, land = tr.tgt, tr.land_idx
    o_tr, o_lvl, o_pfr = m.o_tr, m.o_lvl, m.o_pfr
    o_func = tgt[o_tr]
    fixed = None
    if named is not None and no:
        fixed = named[0][o_tr]
        if not fixed.any():
            fixed = None
    if m.o_nid is None:
        if fixed is None:
            _start, o_nid, _known = names.resolve(o_func)
        else:
            # the named frames' targets are no code: not looked up (a
            # lookup would name them)
            o_nid = np.full(no, named[1], np.int32)
            rest = np.flatnonzero(~fixed)
            if len(rest):
                o_nid[rest] = names.resolve(o_func[rest])[1]
    else:
        o_nid = m.o_nid.copy()
        if fixed is not None:
            o_nid[fixed] = named[1]
        unk = np.flatnonzero(o_nid < 0)
        if len(unk):
            o_nid[unk] = names.register_unknown(o_func[unk])
    if core is not None:
        return _commit_compiled(core, m, tr, stack, o_nid, seq0=seq0,
                                next_id=next_id, pid=pid, tid=tid, paths=paths,
                                out=out)
    # parents: the frame at level - 1 (or none at level 0)
    p_lvl = o_lvl - 1
    p_run = o_pfr >= 0
    pc = np.minimum(np.maximum(p_lvl, 0), s0 - 1)
    parent = np.where(p_lvl < 0, -1,
                      np.where(p_run, next_id + o_pfr, stack["id"][pc]))
    # call paths: parent path * MUL + name + 1, parents first
    base_path = np.where(p_lvl < 0, _U8(0),
                         np.where(p_run, _U8(0), stack["path"][pc])).astype(_U8)
    if paths and no:
        if core is not None:
            path = np.frombuffer(core.paths(o_nid.astype(np.int32), o_pfr, base_path),
                                 _U8)
        else:
            path = _paths(o_nid, o_pfr, base_path)
        ppath = np.where(p_run, path[np.maximum(o_pfr, 0)], base_path)
    else:
        path = ppath = np.zeros(no, _U8)
    flags = m.o_flags.astype(np.uint32)
    begin_idx = land[o_tr]
    eseq = seq0 + 4 * o_tr + 2
    e = {"id": next_id + np.arange(no, dtype=np.int64),
         "parent": parent.astype(np.int64, copy=False),
         "func": o_func.astype(_U8, copy=False),
         "name": o_nid.astype(np.int32, copy=False),
         "depth": o_lvl.astype(np.int32),
         "flags": flags,
         "pid": np.full(no, pid, np.int64),
         "tid": np.full(no, tid, np.int64),
         "begin_idx": begin_idx.astype(np.int64, copy=False),
         "end_idx": np.full(no, -1, np.int64),
         "eseq": eseq,
         "xseq": np.full(no, -1, np.int64),
         "path": path.astype(_U8, copy=False),
         "begin": np.zeros(no),
         "end": np.zeros(no),
         "child_insns": np.zeros(no, np.int64),
         "child_time": np.zeros(no)}
    enters = Cols(e, no)
    # closes: exits of run frames and of the initial stack's
    x_tr, x_fr, x_lvl = m.x_tr, m.x_fr, m.x_lvl
    nx = len(x_tr)
    old_i = np.flatnonzero(x_fr < 0)
    lv = np.minimum(x_lvl, s0 - 1)
    x = {}
    if no and len(old_i) < nx:
        src = np.maximum(x_fr, 0)
        old_lv = lv[old_i]
        for f in _CARRIED:
            c = e[f][src]
            if len(old_i):
                c[old_i] = stack[f][old_lv]
            x[f] = c
    else:
        for f in _CARRIED:
            x[f] = stack[f][lv].astype(SLICE_T[f])
    x["depth"] = x_lvl.astype(np.int32)
    x["begin"] = np.zeros(nx)
    x["end"] = np.zeros(nx)
    x["child_insns"] = np.zeros(nx, np.int64)
    x["child_time"] = np.zeros(nx)
    x["end_idx"] = land[x_tr].astype(np.int64, copy=False)
    x["xseq"] = seq0 + 4 * x_tr + 1
    exits = Cols(x, nx)
    top_fr = m.top_fr
    top = np.zeros(len(top_fr), STACK)
    if len(top_fr):
        for f in ("id", "parent", "func", "name", "flags", "pid", "tid",
                  "begin_idx", "eseq", "path"):
            top[f] = e[f][top_fr]
        top["ret"] = m.o_ret[top_fr]
        top["ret_ok"] = m.o_ret_ok[top_fr]
    return Committed(m.k, enters, exits, m.keep, top, no, (path, ppath, o_nid))


_STACK_IN = ("id", "parent", "func", "name", "flags", "pid", "tid", "begin_idx",
             "eseq", "path")
_SLICE_COLS = [(f, SLICE.fields[f][0]) for f in SLICE.names]
_STACK_COLS = [(f, STACK.fields[f][0]) for f in STACK.names]


def _commit_compiled(core, m: Match, tr: Transfers, stack: np.ndarray, o_nid, *,
                     seq0: int, next_id: int, pid: int, tid: int,
                     paths: bool, out=None) -> Committed:
    """commit's rows made by the compiled core (the numpy code above is
    its twin), written where ``out`` says if given."""
    no, nx, nt = len(m.o_tr), len(m.x_tr), len(m.top_fr)
    if out is not None:
        ec, xc = out(no, nx)
        e, x = ec.d, xc.d
    else:
        e = {f: np.empty(no, t) for f, t in _SLICE_COLS}
        x = {f: np.empty(nx, t) for f, t in _SLICE_COLS}
    tc = {f: np.empty(nt, t) for f, t in _STACK_COLS}
    path = np.empty(no, _U8)
    ppath = np.empty(no, _U8)
    c = np.ascontiguousarray
    o_nid = c(o_nid, np.int32)
    core.commit(c(tr.tgt, _U8), c(tr.land_idx, np.int64), c(m.o_tr, np.int64),
                c(m.o_lvl, np.int64), c(m.o_pfr, np.int64), c(m.o_flags, np.uint32),
                o_nid, c(m.o_ret, _U8), c(m.o_ret_ok, bool).view(np.uint8),
                c(m.x_tr, np.int64), c(m.x_lvl, np.int64), c(m.x_fr, np.int64),
                c(m.top_fr, np.int64),
                *(c(stack[f], STACK.fields[f][0]) for f in _STACK_IN),
                int(seq0), int(next_id), int(pid), int(tid), bool(paths),
                tuple(e.values()), tuple(x.values()),
                tuple(tc[f] if f != "ret_ok" else tc[f].view(np.uint8)
                      for f in STACK.names), path, ppath)
    top = np.empty(nt, STACK)
    for f in STACK.names:
        top[f] = tc[f]
    return Committed(m.k, Cols(e, no), Cols(x, nx), m.keep, top, no,
                     (path, ppath, o_nid), out is not None)


#: the fields an exit takes from its activation's begin
_CARRIED = ("id", "parent", "func", "name", "flags", "begin_idx", "eseq",
            "path", "pid", "tid")


def _nothing(k: int, stack: np.ndarray) -> Committed:
    z = Cols.zeros(0)
    return Committed(k, z, z, len(stack), np.zeros(0, STACK), 0,
                     (np.zeros(0, _U8), np.zeros(0, _U8), np.zeros(0, np.int32)))


def _paths(nid: np.ndarray, parent: np.ndarray, base: np.ndarray) -> np.ndarray:
    """path[i] = path[parent[i]] * MUL + nid[i] + 1, where parent[i] < 0
    means the parent path is ``base[i]``: by pointer doubling (parents
    come before children, chains as deep as the run's stack)."""
    s = nid.astype(_U8) + _U8(1)
    mul = np.full(len(nid), PATH_MUL, _U8)
    ptr = parent.astype(np.int64).copy()
    acc_base = base.astype(_U8).copy()
    with np.errstate(over="ignore"):
        while True:
            live = ptr >= 0
            if not live.any():
                break
            p = np.where(live, ptr, 0)
            # s += mul * s[p]; mul *= mul[p]; base from p; ptr = ptr[p]
            s = np.where(live, s + mul * s[p], s)
            new_mul = np.where(live, mul * mul[p], mul)
            acc_base = np.where(live, acc_base[p], acc_base)
            ptr = np.where(live, ptr[p], -1)
            mul = new_mul
        return s + mul * acc_base
