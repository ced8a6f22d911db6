"""Perfetto's native protobuf trace format, streamed packet by packet.

Each stream gets its own packet sequence and a thread track (a process
track above it; a CPU's stream: a "CPUs" process with a track per CPU,
and, where the stream follows its threads by the sideband's context
switches, each thread's own track under its process).  All tracks share
one timeline.  An activation is a ``TYPE_SLICE_BEGIN`` when it begins and
a ``TYPE_SLICE_END`` when it ends, markers are ``TYPE_INSTANT`` events;
event names are interned per sequence (``InternedData.event_names``, the
packets flagged ``SEQ_NEEDS_INCREMENTAL_STATE``).  Timestamps are
nanoseconds (TSC ticks of unknown frequency and instruction counts are
written 1 unit = 1 ns).

Packets are encoded a chunk of activations at a time (:mod:`.textcols`
assembles the varints); writing needs no protobuf runtime (see
:mod:`._pb`); reading it back is what ``perfetto_trace_pb2.Trace.FromString``
(PyPI ``perfetto``) or the Perfetto UI do.
"""

from __future__ import annotations

import io

import numpy as np

from hwtrace.analysis.records import Flag, StreamInfo
from hwtrace.analysis.slices import RecordChunker
from hwtrace.export import _textcols_impl, flag_names, process_name, track_of
from hwtrace.export._pb import f_bytes, f_str, f_varint, varint
from hwtrace.export.chrome import CPU_PID
from hwtrace.export.textcols import Lines, small_ids

# field numbers (perfetto_trace.proto)
_PKT_TS, _PKT_SEQ, _PKT_TRACK_EVENT, _PKT_INTERNED, _PKT_FLAGS = 8, 10, 11, 12, 13
_PKT_TRACK_DESC, _PKT_FIRST_ON_SEQ = 60, 87
_TE_ANNOT, _TE_TYPE, _TE_NAME_IID, _TE_TRACK = 4, 9, 10, 11
_TD_UUID, _TD_NAME, _TD_PROCESS, _TD_THREAD, _TD_PARENT = 1, 2, 3, 4, 5
_PD_PID, _PD_NAME = 1, 6
_THD_PID, _THD_TID, _THD_NAME = 1, 2, 5
_ID_EVENT_NAMES = 2
_EN_IID, _EN_NAME = 1, 2
_DA_NAME, _DA_INT, _DA_STR = 10, 4, 6
SLICE_BEGIN, SLICE_END, INSTANT = 1, 2, 3
SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE = 1, 2


_TS_TAG = varint(_PKT_TS << 3)
_TYPE_FIELD = {t: f_varint(_TE_TYPE, t) for t in (SLICE_BEGIN, SLICE_END, INSTANT)}
_FIRST_FLAGS = (f_varint(_PKT_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED
                         | SEQ_NEEDS_INCREMENTAL_STATE)
                + f_varint(_PKT_FIRST_ON_SEQ, 1))
_NEEDS_STATE = f_varint(_PKT_FLAGS, SEQ_NEEDS_INCREMENTAL_STATE)
_PACKET_TAG = varint((1 << 3) | 2)
_INSNS_NAME = f_str(_DA_NAME, "insns")
_TE_TAG = varint((_PKT_TRACK_EVENT << 3) | 2)
_ANNOT_TAG = varint((_TE_ANNOT << 3) | 2)
_IID_TAG = varint(_TE_NAME_IID << 3)
_DA_INT_TAG = varint(_DA_INT << 3)


def _packet(body: bytes) -> bytes:
    return f_bytes(1, body)


class PerfettoTraceWriter:
    def __init__(self, fp, impl: str | None = None):
        self._fp = fp
        #: the packet encoder: None (the compiled core where it loaded),
        #: "python" (the twin) or "compiled"
        self.impl = impl
        self._seq = 0
        self._track = 0
        self._iids: dict[str, int] = {}
        self._nid_iid = np.zeros(0, np.int64)     # name id -> iid (0: none yet)
        self._nid_names = None                    # ... of this name table
        self._processes: dict = {}
        self._threads: dict = {}
        self._seq_head = b""
        self._fresh = False
        self._info = StreamInfo()
        self._track_field = b""
        self._pending_track = None
        self._legacy: RecordChunker | None = None
        self.slices = 0
        self.instants = 0

    def _process(self, pid: int, pname: str) -> int:
        puuid = self._processes.get(pid)
        if puuid is None:
            puuid = self._processes[pid] = (1 << 40) + len(self._processes)
            desc = f_varint(_TD_UUID, puuid) + f_bytes(
                _TD_PROCESS, f_varint(_PD_PID, pid) + f_str(_PD_NAME, pname))
            self._fp.write(_packet(f_bytes(_PKT_TRACK_DESC, desc)))
        return puuid

    def _thread_track(self, uuid: int, pid: int, tid: int, pname: str,
                      tname: str) -> None:
        puuid = self._process(pid, pname)
        thread = (f_varint(_THD_PID, pid) + f_varint(_THD_TID, tid)
                  + f_str(_THD_NAME, tname))
        desc = (f_varint(_TD_UUID, uuid) + f_varint(_TD_PARENT, puuid)
                + f_bytes(_TD_THREAD, thread))
        self._fp.write(_packet(f_bytes(_PKT_TRACK_DESC, desc)))

    def begin_stream(self, info: StreamInfo, unit: str | None = "insns") -> None:
        self._flush_legacy()
        self._seq += 1
        self._iids = {}
        self._nid_iid = np.zeros(0, np.int64)
        self._nid_names = None
        self._sent: dict[str, bool] = {}
        self._info = info
        pid, tid, pname, tname = track_of(info, CPU_PID)
        self._track = (2 << 40) + self._seq
        # described where first used (a CPU's stream that follows its
        # threads may never use its own track)
        self._pending_track = (self._track, pid, tid, pname, tname)
        self._seq_head = f_varint(_PKT_SEQ, self._seq)
        self._fresh = True
        self._track_field = f_varint(_TE_TRACK, self._track)

    def _thread_uuid(self, pid: int, tid: int) -> int:
        """The track of a thread a CPU's stream follows (one per thread)."""
        u = self._threads.get((pid, tid))
        if u is None:
            u = self._threads[(pid, tid)] = (3 << 40) + len(self._threads)
            self._thread_track(u, pid, tid, process_name(self._info, pid), f"thread {tid}")
        return u

    # -- chunks ----------------------------------------------------------------------
    def add_slices(self, chunk, ctx) -> None:
        """A chunk of activations (``ctx``: its builder's ``names``)."""
        names = ctx.names
        E, X, M = chunk.enters, chunk.exits, chunk.markers
        ne, nx, nm = len(E), len(X), len(M)
        n = ne + nx + nm
        if not n:
            return
        kind = np.concatenate((np.zeros(ne, np.int8), np.ones(nx, np.int8),
                               np.full(nm, 2, np.int8)))
        seq = np.concatenate((E["eseq"], X["xseq"],
                              np.array([s for s, _m in M], np.int64)))
        order = np.argsort(seq, kind="stable")
        kind = kind[order]
        src = np.concatenate((np.arange(ne), np.arange(nx), np.arange(nm)))[order]
        ts = np.concatenate((E["begin"], X["end"],
                             np.array([m.time for _s, m in M], np.float64)))[order]
        ts = np.maximum(np.round(ts), 0).astype(np.uint64)
        isb, ise = kind == 0, kind == 1
        track_ids, track_tab = self._tracks(E, X, kind, src)
        if self._pending_track is not None and (track_ids == 0).any():
            self._thread_track(*self._pending_track)
            self._pending_track = None
        # names: interned on first use in this sequence -- those packets,
        # the markers' and the sequence's first are made one by one
        iid = np.zeros(n, np.int64)
        special: dict[int, bytes] = {}
        if ne:
            bpos = np.flatnonzero(isb)
            bn = E["name"][src[bpos]]
            # the iid of every name id this sequence has met (0: not yet):
            # only names new here go through Python, in ascending id order
            # as a sort of the chunk's names would take them
            tab = self._nid_iid
            if self._nid_names is not names:    # a cache of one name table's ids
                tab = self._nid_iid = np.zeros(0, np.int64)
                self._nid_names = names
            if len(tab) < len(names.names):
                tab = self._nid_iid = np.concatenate(
                    (tab, np.zeros(len(names.names) - len(tab), np.int64)))
            new = np.flatnonzero(tab[bn] == 0)
            if len(new):
                u, first = np.unique(bn[new], return_index=True)
                for nid, f in zip(u.tolist(), first.tolist()):
                    label = names.names[nid]
                    v = self._iids.get(label)
                    if v is None:
                        v = self._iids[label] = len(self._iids) + 1
                        special[int(bpos[new[f]])] = None   # made below, with its blob
                    tab[nid] = v
            iid[bpos] = tab[bn]
        for p in np.flatnonzero(kind == 2).tolist():
            special[p] = None
        if self._fresh:
            special[0] = None
        insns = np.zeros(n, np.int64)
        flg = np.zeros(n, np.int64)
        if nx:
            xs = src[ise]
            insns[ise] = X["end_idx"][xs] - X["begin_idx"][xs]
            flg[ise] = X["flags"][xs]
        for p in sorted(special):
            special[p] = self._one(int(kind[p]), int(ts[p]), track_tab[track_ids[p]],
                                   int(iid[p]), int(insns[p]), int(flg[p]),
                                   M[src[p]][1] if kind[p] == 2 else None,
                                   names.names[E["name"][src[p]]] if kind[p] == 0 else None)
        self.slices += nx
        core = _textcols_impl.core_for(self.impl)
        if core is not None and isinstance(self._fp, io.BufferedIOBase):
            # a megabyte at a time from the core's buffer, every row's
            # columns as they are: the one-by-one packets go where their
            # rows are (``end`` 2 there: no plain packet), none gathered
            sp = sorted(special)
            end = kind.astype(np.uint8)
            end[sp] = 2
            ftab, finv = _flag_table(flg)
            core.slice_packets(
                ts, end, track_ids, iid, insns, finv, track_tab, ftab,
                self._parts(), self._fp.write, np.array(sp, np.int64),
                [special[p] for p in sp])
            return
        plain = np.ones(n, bool)
        if special:
            plain[list(special)] = False
        pb = plain & isb
        pe = plain & ise
        out = self._encode(ts, track_ids, track_tab, iid, insns, flg, pb, pe,
                           self.impl)
        if not special:
            self._fp.write(out[0])
            return
        # splice the one-by-one packets in, in order
        data, lens = out
        pos = np.flatnonzero(plain)
        sp = sorted(special)
        ks = np.searchsorted(pos, sp)               # plain packets before each
        offs = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=offs[1:])
        at = offs[ks].tolist()                      # ... and their bytes
        view = memoryview(data)                     # (slices without copies)
        done = 0
        write = self._fp.write
        for p, a in zip(sp, at):
            if a > done:
                write(view[done:a])
                done = a
            write(special[p])
        write(view[done:])

    def _encode(self, ts, track_ids, track_tab, iid, insns, flg, pb, pe,
                impl: str | None = None):
        """The plain packets (BEGIN without interning, END): bytes and
        each packet's length (for splicing) -- by the compiled core
        (``slice_packets``) or the twin below (:class:`.textcols.Lines`)."""
        sel = pb | pe
        idx = slice(None) if sel.all() else np.flatnonzero(sel)   # (no copies)
        n = len(sel) if isinstance(idx, slice) else len(idx)
        if not n:
            return b"", np.zeros(0, np.int64)
        b = pb[idx]
        e = ~b
        tr = track_ids[idx]
        ftab, finv = _flag_table(flg[idx])
        core = _textcols_impl.core_for(impl)
        if core is not None:
            out = core.slice_packets(
                np.ascontiguousarray(ts[idx], np.uint64), np.ascontiguousarray(e, np.uint8),
                np.ascontiguousarray(tr, np.int64), np.ascontiguousarray(iid[idx], np.int64),
                np.ascontiguousarray(insns[idx], np.int64),
                np.ascontiguousarray(finv, np.int64), track_tab, ftab,
                self._parts())
            data, lens = out
            return data, np.frombuffer(lens, np.int64)
        te = Lines(n)
        te.strs([_TYPE_FIELD[SLICE_BEGIN], _TYPE_FIELD[SLICE_END]], e.astype(np.int64))
        te.strs(track_tab, tr)
        te.when(b, _IID_TAG)
        te.extend(_masked_varint(iid[idx], b))
        ins = insns[idx]
        alen = len(_INSNS_NAME) + len(_DA_INT_TAG) + _varint_len(ins)
        te.when(e, _ANNOT_TAG)
        te.extend(_masked_varint(alen, e))
        te.when(e, _INSNS_NAME + _DA_INT_TAG)
        te.extend(_masked_varint(ins, e))
        if len(ftab) > 1 or ftab[0]:
            te.strs(ftab, finv)
        body = Lines(n)
        body.lit(_TS_TAG).varint(ts[idx]).lit(self._seq_head)
        body.lit(_TE_TAG).varint(te.lengths()).extend(te)
        body.lit(_NEEDS_STATE)
        blen = body.lengths()
        pkt = Lines(n)
        pkt.lit(_PACKET_TAG).varint(blen).extend(body)
        return pkt.render(), blen + 1 + _varint_len(blen)

    def _parts(self) -> tuple:
        """The constant pieces of a plain packet (slice_packets' ``parts``)."""
        return (_TYPE_FIELD[SLICE_BEGIN], _TYPE_FIELD[SLICE_END], _IID_TAG, _ANNOT_TAG,
                _INSNS_NAME + _DA_INT_TAG, _TS_TAG, self._seq_head, _TE_TAG,
                _NEEDS_STATE, _PACKET_TAG)

    def _one(self, kind, ts, track_field, iid, insns, flags, marker, name) -> bytes:
        """One packet, made the plain way (rare ones: interning, markers,
        the sequence's first)."""
        te = _TYPE_FIELD[(SLICE_BEGIN, SLICE_END, INSTANT)[kind]] + track_field
        interned = b""
        if kind == 0:
            te += f_varint(_TE_NAME_IID, iid)
            if self._iids.get(name) == iid and not self._sent.get(name):
                self._sent[name] = True
                interned = f_bytes(_PKT_INTERNED, f_bytes(
                    _ID_EVENT_NAMES, f_varint(_EN_IID, iid) + f_str(_EN_NAME, name)))
        elif kind == 1:
            te += f_bytes(_TE_ANNOT, _INSNS_NAME + f_varint(_DA_INT, insns))
            if flags:
                te += _flags_annot(flags)
        else:
            v = self._iids.get(marker.kind)
            if v is None:
                v = self._iids[marker.kind] = len(self._iids) + 1
                interned = f_bytes(_PKT_INTERNED, f_bytes(
                    _ID_EVENT_NAMES, f_varint(_EN_IID, v) + f_str(_EN_NAME, marker.kind)))
            te += f_varint(_TE_NAME_IID, v)
            te += f_bytes(_TE_ANNOT, f_str(_DA_NAME, "detail") + f_str(_DA_STR, marker.detail))
            self.instants += 1
        body = _TS_TAG + varint(ts) + self._seq_head + f_bytes(_PKT_TRACK_EVENT, te) + interned
        if self._fresh:
            self._fresh = False
            body += _FIRST_FLAGS
        else:
            body += _NEEDS_STATE
        return _PACKET_TAG + varint(len(body)) + body

    def _tracks(self, E, X, kind, src):
        """Track-uuid field per event (ids into the returned table)."""
        info = self._info
        if not (info.tid is None and info.cpu is not None):
            return np.zeros(len(kind), np.int64), [self._track_field]
        n = len(kind)
        one = _one_thread(E, X, kind)
        if one is not None:
            # one thread (a chunk between two switches): no per-event
            # gathers, no sort
            table = [self._track_field]
            if one[1] < 0:
                return np.zeros(n, np.int64), table
            table.append(f_varint(_TE_TRACK, self._thread_uuid(max(one[0], 0), one[1])))
            return np.ones(n, np.int64), table
        pid = np.full(n, -1, np.int64)
        tid = np.full(n, -1, np.int64)
        for k, A in ((0, E), (1, X)):
            sel = kind == k
            if sel.any():
                pid[sel] = A["pid"][src[sel]]
                tid[sel] = A["tid"][src[sel]]
        has = tid >= 0
        ids = np.zeros(n, np.int64)
        table = [self._track_field]
        if has.any():
            key = (np.maximum(pid[has], 0) << 32) | tid[has]
            u, inv = np.unique(key, return_inverse=True)
            for k in u.tolist():
                table.append(f_varint(_TE_TRACK, self._thread_uuid(k >> 32, k & 0xFFFFFFFF)))
            ids[has] = np.asarray(inv).reshape(-1) + 1
        return ids, table

    # -- records one at a time (tests, old callers) ----------------------------------------
    def add(self, rec) -> None:
        if self._legacy is None:
            self._legacy = RecordChunker()
        self._legacy.add(rec)

    def _flush_legacy(self) -> None:
        if self._legacy is not None:
            self.add_slices(self._legacy.take(), self._legacy)

    def close(self) -> None:
        self._flush_legacy()
        self._fp.flush()


def _one_thread(E, X, kind) -> tuple[int, int] | None:
    """(pid, tid) where every begin and end of a chunk (and a marker, if
    any: no thread) is one thread's, else None."""
    if (kind == 2).any():
        return None
    first = E if len(E) else X
    p, t = int(first["pid"][0]), int(first["tid"][0])
    for A in (E, X):
        if len(A) and not ((A["tid"] == t).all() and (A["pid"] == p).all()):
            return None
    return p, t


def _flag_table(f: np.ndarray) -> tuple[list, np.ndarray]:
    """The flags annotations of rows' flags ``f``: (table, each row's id
    in it; b"" where none)."""
    if f.any():
        uf, finv = small_ids(f)
        return [_flags_annot(x) if x else b"" for x in uf.tolist()], finv
    return [b""], np.zeros(len(f), np.int64)


def _flags_annot(flags: int) -> bytes:
    return f_bytes(_TE_ANNOT, f_str(_DA_NAME, "flags")
                   + f_str(_DA_STR, flag_names(Flag(flags))))


def _varint_len(v: np.ndarray) -> np.ndarray:
    a = np.asarray(v).astype(np.uint64)
    n = np.ones(len(a), np.int64)
    for k in range(1, 10):
        n += (a >> np.uint64(7 * k)) != 0
    return n


def _masked_varint(v: np.ndarray, cond: np.ndarray) -> Lines:
    t = Lines(len(v))
    t.varint(np.where(cond, v, 0)).only(cond)
    return t
