"""The compiled call-stack matcher (hwtrace.analysis._c_runs) gives what
its Python twin (runs.match, runs._paths) gives: the same Match, the same
rows, the same names registered in the same order -- on random runs over
a merged symbol table and over a lookup callback, on hand-made edge
cases (returns without calls, calls never returned from, tail calls,
jumps that may unwind, a depth limit, far calls), and end to end on real
recordings through the builder."""

from __future__ import annotations

import numpy as np
import pytest

from hwtrace.analysis import _runs_impl, runs
from hwtrace.analysis.records import Flag
from hwtrace.analysis.slices import SLICE, NameTable
from hwtrace.analysis.symtable import AddrTable

U8 = np.uint64
CALL, RET, JUMP, COND, FCALL, FRET = (runs.CALL, runs.RET, runs.JUMP, runs.COND,
                                      runs.FCALL, runs.FRET)


def test_core_loaded_where_expected():
    st = _runs_impl.STATUS
    st.check()          # raises if expected (REQUIRE or built) but unusable
    if st.disabled:
        assert _runs_impl.CORE is None
    elif st.expected:
        assert _runs_impl.CORE is not None


def _core():
    return _runs_impl.core_for("compiled")


# -- a program: functions of 0x100 bytes from 0x1000, one gap of unknown code --
FUNCS = [0x1000 + 0x100 * i for i in range(12)]
NAMES = [f"f{i}" for i in range(12)]
NAMES[5] = "f5.cold"                    # a .cold part: never a tail-call target
UNKNOWN = 0x9000                        # no symbol covers 0x9000..


class _Image:
    low, high, bias = 0x1000, 0x1000 + 0x100 * 12, 0
    _starts = FUNCS
    _ends = [a + 0x100 for a in FUNCS]
    _names = NAMES


class _Sym:
    images = [_Image()]

    def lookup(self, addr):
        for a, n in zip(FUNCS, NAMES):
            if a <= addr < a + 0x100:
                return a, n
        return None


def _table(merged: bool) -> AddrTable:
    s = _Sym()
    t = AddrTable(s.lookup if merged else (lambda a: s.lookup(a)), NameTable())
    assert (t.table() is not None) == merged
    return t


def _stack(frames):
    """STACK rows: (func, ret or None) from the bottom."""
    st = np.zeros(len(frames), runs.STACK)
    for i, (func, ret) in enumerate(frames):
        st[i]["id"] = 1000 + i
        st[i]["parent"] = 999 + i if i else -1
        st[i]["func"] = func
        st[i]["name"] = i
        st[i]["pid"], st[i]["tid"] = 7, 8
        st[i]["path"] = 31 * (i + 1)
        st[i]["ret"] = ret or 0
        st[i]["ret_ok"] = ret is not None
        st[i]["flags"] = int(Flag.FAR) if i == 1 else 0
    return st


def _tr(rows):
    """Transfers from (code, src, fall, tgt) rows."""
    code = np.array([r[0] for r in rows], np.int8)
    src = np.array([r[1] for r in rows], U8)
    fall = np.array([r[2] for r in rows], U8)
    tgt = np.array([r[3] for r in rows], U8)
    land = np.arange(1, len(rows) + 1, dtype=np.int64) * 3
    return runs.Transfers(code, fall, tgt, land, src)


def _random_run(rng, n, stack_funcs):
    """A plausible run: calls, returns to where the caller expects (and now
    and then elsewhere), jumps within and out of functions, tail calls."""
    rows = []
    stack = [(f, None) for f in stack_funcs]
    pc = stack_funcs[-1] + 0x10
    for _ in range(n):
        r = rng.random()
        cur = stack[-1][0] if stack else FUNCS[0]
        src = pc
        fall = src + 5
        if r < 0.25 and len(stack) < 40:
            f = FUNCS[rng.integers(0, 12)] if rng.random() < 0.9 else UNKNOWN + 0x40
            code = CALL if rng.random() < 0.95 else FCALL
            tgt = f if rng.random() < 0.97 else fall          # call to fall-through
            rows.append((code, src, fall, tgt))
            if tgt != fall or code == FCALL:
                stack.append((f, fall))
            pc = tgt + 0x8
        elif r < 0.5:
            if stack and stack[-1][1] is not None and rng.random() < 0.95:
                tgt = stack[-1][1]
                stack.pop()
            else:
                tgt = FUNCS[rng.integers(0, 12)] + 0x30       # unexpected
            rows.append((RET if rng.random() < 0.97 else FRET, src, fall, tgt))
            pc = tgt
        elif r < 0.65:
            # a tail call (or a jump to a .cold part, or to itself)
            f = FUNCS[rng.integers(0, 12)]
            rows.append((JUMP if rng.random() < 0.5 else COND, src, fall, f))
            if stack:
                stack[-1] = (f, stack[-1][1])
            pc = f + 0x8
        elif r < 0.68:
            # out of the function, into another's middle or unknown code
            tgt = (FUNCS[rng.integers(0, 12)] + 0x48) if rng.random() < 0.8 \
                else UNKNOWN + int(rng.integers(0, 0x400))
            rows.append((JUMP, src, fall, tgt))
            pc = tgt
        else:
            # within the function (taken or not), or nothing
            code = [JUMP, COND, runs.NONE][rng.integers(0, 3)]
            tgt = cur + int(rng.integers(0, 0x100)) if rng.random() < 0.7 else fall
            rows.append((code, src, fall, tgt))
            pc = tgt
    return _tr(rows)


def _eq_match(a: runs.Match, b: runs.Match):
    assert (a.k, a.keep, a.d_end) == (b.k, b.keep, b.d_end)
    for f in runs.Match._fields[3:]:
        x, y = getattr(a, f), getattr(b, f)
        if f in ("unknown", "o_nid"):   # the twin's names resolve them
            continue
        assert len(x) == len(y), f
        assert np.array_equal(np.asarray(x).astype(np.int64),
                              np.asarray(y).astype(np.int64)), f


def _eq_committed(a: runs.Committed, b: runs.Committed):
    assert (a.k, a.keep, a.opened) == (b.k, b.keep, b.opened)
    for x, y in ((a.enters, b.enters), (a.exits, b.exits)):
        assert len(x) == len(y)
        for f in SLICE.names:
            assert np.array_equal(x[f], y[f]), f
            assert x[f].dtype == y[f].dtype, f
    assert np.array_equal(a.top, b.top) and a.top.dtype == b.top.dtype
    for x, y in zip(a.paths, b.paths):
        assert np.array_equal(x, y)


def _both(tr, stack_rows, merged, lookup=True, max_depth=1 << 16, paths=True,
          soft=False):
    out = []
    for impl in ("python", "compiled"):
        names = _table(merged)
        c = runs.solve(tr, stack_rows, names, seq0=100, next_id=50,
                       max_depth=max_depth, pid=3, tid=4, tx=False,
                       lookup=lookup, paths=paths, impl=impl, soft=soft)
        out.append((c, names.names.names))
    (a, na), (b, nb) = out
    _eq_committed(a, b)
    assert na == nb            # the same names, registered in the same order
    return a


def _sub(tr, a):
    return runs.Transfers(*(x[a:] for x in tr))


@pytest.mark.parametrize("merged", [True, False])
@pytest.mark.parametrize("seed", range(24))
def test_random_runs_match_twin(seed, merged):
    """As the builder does: solve, step over the irregular transfer, solve
    the rest on the stack left -- the whole run, both ways."""
    rng = np.random.default_rng(seed)
    sf = [FUNCS[0], FUNCS[1], FUNCS[2]][:1 + seed % 3]
    frames = [(f, (FUNCS[0] + 0x50 + i) if i or seed % 2 else None)
              for i, f in enumerate(sf)]
    tr = _random_run(rng, int(rng.integers(1, 2000)), sf)
    lookup, paths = seed % 5 != 4, seed % 7 != 6
    soft = seed % 3 == 1
    st = _stack(frames)
    tabs = {impl: _table(merged) for impl in ("python", "compiled")}
    pos, next_id, solves, opened = 0, 0, 0, 0
    while pos < len(tr.code):
        part = _sub(tr, pos)
        m1 = runs.match(part, st, _table(merged), max_depth=64, lookup=lookup,
                        soft=soft)
        m2 = runs._match_compiled(_core(), part, st, _table(merged), max_depth=64,
                                  lookup=lookup, soft=soft)
        _eq_match(m1, m2)
        out = [runs.solve(part, st, tabs[impl], seq0=4 * pos, next_id=next_id,
                          max_depth=64, pid=3, tid=4, tx=False, lookup=lookup,
                          paths=paths, impl=impl, soft=soft)
               for impl in ("python", "compiled")]
        _eq_committed(*out)
        assert tabs["python"].names.names == tabs["compiled"].names.names
        c = out[0]
        st = np.concatenate((st[:c.keep], c.top))
        if not len(st):
            st = _stack([(FUNCS[0], None)])
        next_id += c.opened
        opened += c.opened
        pos += c.k + 1
        solves += 1
    assert opened > len(tr.code) // 20


def test_depth_limit_cuts_at_the_call_too_deep():
    f = FUNCS
    rows = [(CALL, f[0] + 1, f[0] + 6, f[1]), (CALL, f[1] + 1, f[1] + 6, f[2]),
            (CALL, f[2] + 1, f[2] + 6, f[3]), (RET, f[3] + 9, 0, f[2] + 6)]
    c = _both(_tr(rows), _stack([(f[0], None)]), True, max_depth=3)
    assert c.k == 2 and c.opened == 2


def test_return_without_call_from_the_bottom_frame_stops():
    f = FUNCS
    rows = [(COND, f[0] + 1, f[0] + 3, f[0] + 0x20), (RET, f[0] + 0x30, 0, f[4] + 8)]
    c = _both(_tr(rows), _stack([(f[0], None)]), True)
    assert c.k == 1 and c.opened == 0 and not len(c.exits)


def test_unmatched_calls_at_the_end_stay_open():
    f = FUNCS
    rows = [(CALL, f[0] + 1, f[0] + 6, f[1]), (CALL, f[1] + 1, f[1] + 6, f[2]),
            (RET, f[2] + 9, 0, f[1] + 6), (CALL, f[1] + 10, f[1] + 15, f[3])]
    c = _both(_tr(rows), _stack([(f[0], None)]), True)
    assert c.k == 4 and c.opened == 3 and len(c.exits) == 1
    assert c.keep == 1 and [int(x) for x in c.top["func"]] == [f[1], f[3]]


def test_tail_calls_carry_the_return_of_an_old_frame():
    f = FUNCS
    # the old stack's top (FAR, returning to f0+0x50) tail-calls f3, which
    # tail-calls f4, which returns where the old frame would have
    rows = [(JUMP, f[1] + 1, f[1] + 3, f[3]), (COND, f[3] + 1, f[3] + 3, f[4]),
            (RET, f[4] + 9, 0, f[0] + 0x51), (JUMP, f[0] + 1, f[0] + 3, f[0])]
    c = _both(_tr(rows), _stack([(f[0], f[0] + 0x50), (f[1], f[0] + 0x51)]), True)
    assert c.opened == 2 and c.k == 3          # the jump to itself stops it
    assert [int(x) for x in c.enters["flags"]] == [int(Flag.TAIL_CALL | Flag.FAR)] * 2
    assert c.keep == 1


def test_jump_into_a_caller_stops_a_run_that_may_unwind():
    f = FUNCS
    rows = [(CALL, f[0] + 1, f[0] + 6, f[1]), (CALL, f[1] + 1, f[1] + 6, f[2]),
            (JUMP, f[2] + 9, f[2] + 11, f[0] + 0x48)]     # longjmp-like
    c = _both(_tr(rows), _stack([(f[0], None)]), True)
    assert c.k == 2
    # ... and a jump into unknown code registers its name in both
    rows[2] = (JUMP, f[2] + 9, f[2] + 11, UNKNOWN + 3)
    c = _both(_tr(rows), _stack([(f[0], None)]), True)
    assert c.k == 3


def test_soft_jump_into_a_function_no_frame_is_in_goes_on():
    """``soft``: a jump out of its function into the middle of another that
    no frame below the top is in (mempcpy's jump into memcpy's body)
    unwinds nothing: the run goes on past it; into a frame's function below
    the top -- one the run opened, or one it started on -- it stops.  Not
    soft, every such jump stops it."""
    f = FUNCS
    rows = [(CALL, f[0] + 1, f[0] + 6, f[1]), (CALL, f[1] + 1, f[1] + 6, f[2]),
            (JUMP, f[2] + 9, f[2] + 11, f[3] + 0x48),
            (RET, f[3] + 0x50, 0, f[1] + 6), (RET, f[1] + 9, 0, f[0] + 6)]
    for start in ([(f[0], None)], [(f[4], None), (f[0], f[4] + 0x20)]):
        for merged in (True, False):
            c = _both(_tr(rows), _stack(start), merged, soft=True)
            assert c.k == 5 and c.opened == 2 and len(c.exits) == 2
            assert _both(_tr(rows), _stack(start), merged).k == 2
            unwind = list(rows)
            unwind[2] = (JUMP, f[2] + 9, f[2] + 11, f[1] + 0x48)   # a run frame's
            assert _both(_tr(unwind), _stack(start), merged, soft=True).k == 2
    unwind[2] = (JUMP, f[2] + 9, f[2] + 11, f[4] + 0x48)       # an initial frame's
    assert _both(_tr(unwind), _stack(start), True, soft=True).k == 2


def test_soft_conditional_jump_to_its_own_start_goes_on():
    """A conditional jump back to the start of the function it is in (a
    loop whose head is the entry) is no tail call: the builder changes
    nothing there.  Soft, the run goes on past it (the frame stays the one
    the call opened); not soft, it stops there as before.  An unconditional
    jump to itself stops it either way."""
    f = FUNCS
    loop = [(COND, f[1] + 0x20, f[1] + 0x22, f[1])] * 3
    rows = [(CALL, f[0] + 1, f[0] + 6, f[1])] + loop + \
        [(COND, f[1] + 0x20, f[1] + 0x22, f[1] + 0x22),     # not taken
         (CALL, f[1] + 0x30, f[1] + 0x35, f[2]), (RET, f[2] + 9, 0, f[1] + 0x35),
         (COND, f[1] + 0x40, f[1] + 0x42, f[3]),            # a tail call
         (RET, f[3] + 9, 0, f[0] + 6)]
    for start in ([(f[0], None)], [(f[4], None), (f[0], f[4] + 0x20)]):
        for merged in (True, False):
            c = _both(_tr(rows), _stack(start), merged, soft=True)
            assert c.k == len(rows) and c.opened == 3 and len(c.exits) == 3
            assert [int(x) for x in c.enters["func"]] == [f[1], f[2], f[3]]
            assert _both(_tr(rows), _stack(start), merged).k == 1
            # the loop's head once in the old stack's top frame
            c = _both(_tr(loop + rows[4:7]), _stack(start + [(f[1], f[0] + 6)]),
                      merged, soft=True)
            assert c.k == 6 and c.opened == 1 and c.keep == len(start) + 1
            jump = list(rows)
            jump[2] = (JUMP, f[1] + 0x20, f[1] + 0x22, f[1])
            assert _both(_tr(jump), _stack(start), merged, soft=True).k == 2
    # with no frame left (all returned), one stops the run as ever -- even
    # to the start of the function the last frame was
    empty = [(RET, f[4] + 9, 0, f[0] + 0x20), (COND, f[0] + 0x21, f[0] + 0x23, f[4])]
    for merged in (True, False):
        c = _both(_tr(empty), _stack([(f[4], f[0] + 0x20)]), merged, soft=True)
        assert c.k == 1


def test_far_calls_and_returns():
    f = FUNCS
    rows = [(FCALL, f[0] + 1, f[0] + 6, f[1]), (FRET, f[1] + 9, 0, f[0] + 6),
            (FCALL, f[0] + 8, f[0] + 13, f[0] + 13)]   # a far call is always one
    c = _both(_tr(rows), _stack([(f[0], None)]), True)
    assert c.opened == 2 and len(c.exits) == 1
    assert int(c.enters["flags"][0]) == int(Flag.FAR)


def test_paths_match_twin_on_deep_chains():
    rng = np.random.default_rng(1)
    n = 5000
    nid = rng.integers(0, 300, n).astype(np.int32)
    pfr = np.array([-1 if i == 0 or rng.random() < 0.05 else int(rng.integers(max(0, i - 50), i))
                    for i in range(n)], np.int64)
    base = rng.integers(0, 2 ** 63, n).astype(U8)
    a = runs._paths(nid, pfr, base)
    b = np.frombuffer(_core().paths(nid, pfr, base), U8)
    assert np.array_equal(a, b)



def test_path_table_matches_twin():
    """The compiled path table (a hash of numbered keys, grown as it
    fills) answers lookups as the twin's sorted arrays do: the first
    registration of a hash wins, rows one by one and arrays mixed."""
    from hwtrace.analysis.slices import PathTable
    rng = np.random.default_rng(7)
    tabs = [PathTable(impl="compiled"), PathTable(impl="python")]
    known = []
    for step in range(40):
        n = int(rng.integers(1, 9000))
        h = rng.integers(1, 1 << 40, n).astype(U8)
        if known and step % 3:            # some hashes again, other payloads
            again = rng.choice(np.concatenate(known), n // 2)
            h[:len(again)] = again
        par = rng.integers(0, 1 << 62, n).astype(U8)
        nid = rng.integers(0, 500, n).astype(np.int32)
        for t in tabs:
            if step % 4 == 3:
                for a, b, c in zip(h[:50].tolist(), par[:50].tolist(), nid[:50].tolist()):
                    t.add(a, b, c)
            else:
                t.add_many(h, par, nid)
        if step % 4 == 3:
            h = h[:50]
        known.append(h)
    q = rng.permutation(np.unique(np.concatenate(known)))
    (pa, na), (pb, nb) = (t.lookup(q) for t in tabs)
    assert len(tabs[0]) == len(tabs[1]) == len(q) > 100_000
    assert np.array_equal(pa, pb) and np.array_equal(na, nb)
    with pytest.raises(KeyError):
        tabs[0].lookup(np.array([0], U8))


def test_key_sums_add_in_row_order():
    """KeyIndex numbers keys in first-seen order and sums each key's
    weights in the rows' order (as a loop would)."""
    from hwtrace.analysis.slices import KeyIndex
    rng = np.random.default_rng(3)
    ix = KeyIndex(_core(), sums=True)
    want: dict[int, float] = {}
    order: list[int] = []
    for _ in range(20):
        k = rng.integers(0, 5000, 3000).astype(U8)
        w = rng.random(3000) * 1e6
        ix.add(k, w)
        for a, b in zip(k.tolist(), w.tolist()):
            if a not in want:
                want[a] = 0.0
                order.append(a)
            want[a] += b
    assert ix.keys[:ix.n].tolist() == order
    assert ix.sums[:ix.n].tolist() == [want[a] for a in order]
    assert np.array_equal(ix.find(np.array(order[::-1] + [5001], U8)),
                          np.r_[np.arange(ix.n)[::-1], -1])

# -- end to end: the builder over real recordings ------------------------------------

def _slices(bundle, impl, monkeypatch):
    from hwtrace.analysis import CallStackBuilder
    from hwtrace.streams import open_bundle
    monkeypatch.setattr(_runs_impl, "CORE", None if impl == "python" else _core())
    ts = open_bundle(bundle)
    out = []
    for st in ts.streams:
        b = CallStackBuilder(st.info, ts.symbolizer.lookup)
        chunks = []
        for batch in st.batches(view=True):
            b.feed_batch(batch)
            chunks += b.take_slices()
        b.finish()
        chunks += b.take_slices()
        rows = []
        for ch in chunks:
            for part in (ch.enters, ch.exits):
                rows += part.tolist()
            rows += [(s, m.kind, m.index, m.detail) for s, m in ch.markers]
        out.append((rows, list(b.names.names), b.calls))
    return out


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    from test_views_batches import FIB_C, MT_C, _gcc, _record
    d = tmp_path_factory.mktemp("runs")
    fib = _gcc(d, "fib", FIB_C)
    mt = _gcc(d, "mt", MT_C, "-pthread")
    return {"thread": _record(d, "thread", fib, 12, args=("--mode", "thread")),
            "cpu": _record(d, "cpu", fib, 12),
            "mt": _record(d, "mt_rec", mt)}


@pytest.mark.parametrize("which", ["thread", "cpu", "mt"])
def test_real_recordings_builder_output_matches_twin(recordings, which, monkeypatch):
    a = _slices(recordings[which], "python", monkeypatch)
    b = _slices(recordings[which], "compiled", monkeypatch)
    assert a == b
    assert sum(x[2] for x in a) > 100


# -- the rows' per-row work after the matching (clock.times, Pending) ------------
@pytest.mark.parametrize("seed", range(4))
def test_row_timing_and_sums_match_twin(seed, monkeypatch):
    """times, begins and children of the compiled core give the twin's
    numbers bit for bit (random anchors, rows, trees, carried sums)."""
    from hwtrace.analysis import rows as rows_mod
    from hwtrace.analysis.clock import TimeBase
    from hwtrace.analysis.slices import Cols
    rng = np.random.default_rng(seed)
    core = _core()
    if core is None:
        pytest.skip("no compiled core")

    def run(impl, fn):
        monkeypatch.setattr(_runs_impl, "CORE", None if impl == "python" else core)
        return fn()

    # times: anchors with repeated indices and jumps, rows between them
    na = 200
    tb = TimeBase("tsc", tsc_hz=2.4e9 if seed % 2 else None)
    a_seq = np.sort(rng.choice(10_000, na, replace=False)).astype(np.int64)
    a_idx = np.cumsum(rng.integers(0, 50, na)).astype(np.int64)
    tb.anchors(a_seq, a_idx, np.cumsum(rng.integers(1, 1000, na)).astype(np.uint64))
    seq = np.sort(rng.integers(0, int(tb.last_seq), 5000)).astype(np.int64)
    idx = rng.integers(-5, int(a_idx[-1]) + 5, 5000).astype(np.int64)
    a = run("python", lambda: tb.times(seq, idx))
    b = run("compiled", lambda: tb.times(seq, idx))
    assert a.tobytes() == b.tobytes()
    # rows out of sequence order too (the compiled search gallops on from
    # the last row's anchor only while they are in order), repeats, jumps
    parts = [np.sort(rng.integers(0, int(tb.last_seq), int(k))) for k in
             rng.integers(1, 400, 30)]
    seq2 = np.concatenate(parts + [np.full(7, a_seq[3]), a_seq[::-1]]).astype(np.int64)
    idx2 = rng.integers(-5, int(a_idx[-1]) + 5, len(seq2)).astype(np.int64)
    a = run("python", lambda: tb.times(seq2, idx2))
    b = run("compiled", lambda: tb.times(seq2, idx2))
    assert a.tobytes() == b.tobytes()

    # begins and children: ids of a random tree, some begun in this chunk
    # (numbered in order, as a chunk's are: the core's map of ids is an
    # array; or far apart: a hash)
    n = 3000
    step = 1 if seed % 2 == 0 else 7919
    ids = (100 + np.arange(n, dtype=np.int64)) * step
    parent = np.where(rng.random(n) < 0.1, -1,
                      rng.integers(0, 100 + n, n)).astype(np.int64) * step
    X = Cols.zeros(n)
    order = rng.permutation(n)
    X["id"] = ids[order]
    X["parent"] = parent[order]
    X["begin_idx"] = rng.integers(0, 1000, n)
    X["end_idx"] = X["begin_idx"] + rng.integers(0, 1000, n)
    X["end"] = rng.random(n) * 1e6
    E = Cols.zeros(n // 2)
    E["id"] = np.sort(rng.choice(ids, n // 2, replace=False))
    E["begin"] = rng.random(n // 2) * 1e6
    carried = {int(k) * step: [int(rng.integers(0, 99)), float(rng.random())]
               for k in rng.choice(200 + n, 300, replace=False)}

    def rows_work():
        p = rows_mod.Pending(tb)
        x = X.copy()
        p._begin = {int(k): float(rng_t) for k, rng_t in
                    zip(ids[::7].tolist(), (np.arange(len(ids[::7])) * 0.5).tolist())}
        ended = p._begins(E, x)
        p._child = {k: list(v) for k, v in carried.items()}
        p._children(x)
        return (x.tolist(), None if ended is None else ended.tolist(),
                sorted(p._begin.items()), sorted(p._child.items()))

    assert run("python", rows_work) == run("compiled", rows_work)


@pytest.mark.parametrize("seed", range(4))
def test_outermost_matches_twin(seed, monkeypatch):
    """Profile._outermost: the compiled core and the twin (a sort by
    function and a running maximum) agree on random nested and
    interleaved activations, some still open."""
    from hwtrace.analysis.profile import Profile
    from hwtrace.analysis.slices import Cols
    rng = np.random.default_rng(seed)
    core = _core()
    if core is None:
        pytest.skip("no compiled core")
    n = 4000
    op = np.zeros(n, [("id", "<i8"), ("eseq", "<i8"), ("key", "<i8"),
                      ("main", "?"), ("tid", "<i8")])
    op["id"] = np.arange(n) + 50
    op["eseq"] = np.sort(rng.choice(10 * n, n, replace=False))
    from hwtrace.analysis.profile import _hkey
    fn = np.zeros(n, [("func", "<u8"), ("name", "<i4")])
    fn["name"] = rng.integers(0, 40, n)
    fn["func"] = 0x1000 + 0x10 * fn["name"].astype(np.uint64)
    op["key"] = _hkey(fn)
    ending = np.sort(rng.choice(n, 3 * n // 4, replace=False))
    X = Cols.zeros(len(ending) + 50)
    X["id"] = np.concatenate((op["id"][ending], 10 ** 9 + np.arange(50)))
    X["xseq"] = op["eseq"][np.concatenate((ending, rng.choice(n, 50)))] + \
        rng.integers(1, 5 * n, len(X))
    src = np.concatenate((ending, rng.choice(n, 50)))
    X["func"], X["name"] = fn["func"][src], fn["name"][src]
    perm = rng.permutation(len(X))
    X = X[perm]
    j = np.searchsorted(op["id"], X["id"])
    jj = np.minimum(j, n - 1)
    found = (j < n) & (op["id"][jj] == X["id"])
    xend = np.full(n, np.iinfo(np.int64).max, np.int64)
    xend[jj[found]] = X["xseq"][found]
    monkeypatch.setattr(_runs_impl, "CORE", None)
    a = Profile._outermost(op, xend, X, jj, found)
    monkeypatch.setattr(_runs_impl, "CORE", core)
    b = Profile._outermost(op, xend, X, jj, found)
    assert a.tolist() == b.tolist()
    assert 0 < int((~a).sum()) < len(a)


def test_batch_record_columns_match_twin(monkeypatch):
    """blockcols.columns: the compiled core reads a batch's records into
    the same columns as numpy does (every iclass, sizes, counts), with the
    call-stack builder's codes and the branch source's classes."""
    from hwtrace.analysis import runs
    from hwtrace.analysis.blockcols import columns
    from hwtrace.branches.decoded import _CLS
    from hwtrace.flow.batches import BLOCK
    core = _core()
    if core is None:
        pytest.skip("no compiled core")
    rng = np.random.default_rng(5)
    b = np.zeros(5000, BLOCK)
    b["ip"] = rng.integers(0, 1 << 63, len(b), dtype=np.uint64) * 2
    b["end_ip"] = b["ip"] + rng.integers(0, 1 << 20, len(b)).astype(np.uint64)
    b["end_ip"][:3] = np.uint64(0xFFFFFFFFFFFFFFFF)          # the fall-through wraps
    b["tsc"] = rng.integers(0, 1 << 62, len(b), dtype=np.uint64)
    b["ninsn"] = rng.integers(0, 1 << 32, len(b), dtype=np.uint64).astype(np.uint32)
    b["iclass"] = rng.integers(0, 256, len(b))
    b["size"] = rng.integers(0, 256, len(b))
    for table in (runs.ICLASS_CODE, _CLS):
        for blocks in (b, b[1000:4000]):
            monkeypatch.setattr(_runs_impl, "CORE", None)
            x = columns(blocks, 12345, table)
            monkeypatch.setattr(_runs_impl, "CORE", core)
            y = columns(blocks, 12345, table)
            assert len(x) == len(y) == 6
            for f, (u, v) in zip(("ip", "end", "code", "fall", "tsc", "start"), zip(x, y)):
                assert u.dtype == v.dtype, f
                assert u.tobytes() == v.tobytes(), f


def test_fresh_remembers_only_what_is_named():
    """AddrTable.fresh over the merged table: asked again and again (its
    cache of named addresses), every answer is the search's -- an
    address named since (registered unknown code) is fresh no more, one
    never named stays fresh."""
    t = _table(True)
    rng = np.random.default_rng(5)
    addrs = np.concatenate((np.array(FUNCS, np.uint64) + 4,
                            np.arange(UNKNOWN, UNKNOWN + 0x40, 8, dtype=np.uint64),
                            np.array([0xFFFFFFFFFFFFFFFF, 0], np.uint64)))
    for step in range(6):
        a = rng.permutation(np.concatenate((addrs, addrs[:7])))
        assert t.fresh(a).tolist() == t._fresh(a).tolist()
        if step == 2:
            t.register_unknown(np.array([UNKNOWN + 8, UNKNOWN + 16], np.uint64))
    f = t.fresh(np.array([UNKNOWN, UNKNOWN + 8, FUNCS[0] + 4], np.uint64))
    assert f.tolist() == [True, False, False]
