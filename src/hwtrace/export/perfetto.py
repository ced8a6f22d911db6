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

import numpy as np

from hwtrace.analysis.records import Flag, StreamInfo
from hwtrace.analysis.slices import RecordChunker
from hwtrace.export import flag_names, track_of
from hwtrace.export._pb import f_bytes, f_str, f_varint, varint
from hwtrace.export.chrome import CPU_PID
from hwtrace.export.textcols import Lines

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
    def __init__(self, fp):
        self._fp = fp
        self._seq = 0
        self._track = 0
        self._iids: dict[str, int] = {}
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
            self._thread_track(u, pid, tid, f"process {pid}", f"thread {tid}")
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
        isb, ise, ism = kind == 0, kind == 1, kind == 2
        # tracks: a thread's own, where the stream follows its threads
        track_ids, track_tab = self._tracks(E, X, kind, src)
        if self._pending_track is not None and (track_ids == 0).any():
            self._thread_track(*self._pending_track)
            self._pending_track = None
        # names: interned on first use in this sequence
        name = np.zeros(n, np.int64)
        name[isb] = E["name"][src[isb]]
        iid = np.zeros(n, np.int64)
        intern = np.zeros(n, np.int64)     # 0: nothing, else blob index
        blobs = [b""]
        if ne:
            bn = name[isb]
            u, first, inv = np.unique(bn, return_index=True, return_inverse=True)
            uiids = np.empty(len(u), np.int64)
            bpos = np.flatnonzero(isb)
            for j, nid in enumerate(u.tolist()):
                label = names.names[nid]
                v = self._iids.get(label)
                if v is None:
                    v = self._iids[label] = len(self._iids) + 1
                    blobs.append(f_bytes(_PKT_INTERNED, f_bytes(
                        _ID_EVENT_NAMES, f_varint(_EN_IID, v) + f_str(_EN_NAME, label))))
                    intern[bpos[first[j]]] = len(blobs) - 1
                uiids[j] = v
            iid[isb] = uiids[inv]
        # markers: names interned too, annotated with the detail
        mark = [b""]
        mark_id = np.zeros(n, np.int64)
        for j, p in enumerate(np.flatnonzero(ism).tolist()):
            m = M[src[p]][1]
            v = self._iids.get(m.kind)
            blob = b""
            if v is None:
                v = self._iids[m.kind] = len(self._iids) + 1
                blob = f_bytes(_PKT_INTERNED, f_bytes(
                    _ID_EVENT_NAMES, f_varint(_EN_IID, v) + f_str(_EN_NAME, m.kind)))
            iid[p] = v
            ann = f_bytes(_TE_ANNOT, f_str(_DA_NAME, "detail") + f_str(_DA_STR, m.detail))
            mark.append((ann, blob))
            mark_id[p] = j + 1
            self.instants += 1
        # END annotations: instructions, and flags where any
        insns = np.zeros(n, np.int64)
        flg = np.zeros(n, np.int64)
        if nx:
            xs = src[ise]
            insns[ise] = X["end_idx"][xs] - X["begin_idx"][xs]
            flg[ise] = X["flags"][xs]
        uf, finv = np.unique(flg, return_inverse=True)
        ftab = [f_bytes(_TE_ANNOT, f_str(_DA_NAME, "flags")
                        + f_str(_DA_STR, flag_names(Flag(f)))) if f else b""
                for f in uf.tolist()]
        # the TrackEvent
        te = Lines(n)
        te.strs([_TYPE_FIELD[SLICE_BEGIN], _TYPE_FIELD[SLICE_END],
                 _TYPE_FIELD[INSTANT]], kind.astype(np.int64))
        te.strs(track_tab, track_ids)
        te.when(~ise, _IID_TAG)
        te_iid = np.where(ise, 0, iid)
        te.extend(_masked_varint(te_iid, ~ise))
        # insns annotation: tag, length, name, int tag, varint
        vl = _varint_len(insns)
        alen = len(_INSNS_NAME) + len(_DA_INT_TAG) + vl
        te.when(ise, _ANNOT_TAG)
        te.extend(_masked_varint(alen, ise))
        te.when(ise, _INSNS_NAME + _DA_INT_TAG)
        te.extend(_masked_varint(insns, ise))
        te.strs(ftab, finv)
        te.strs([b""] + [m[0] for m in mark[1:]], mark_id)
        te_len = te.lengths()
        # the packet body
        body = Lines(n)
        body.lit(_TS_TAG).varint(ts).lit(self._seq_head)
        body.lit(_TE_TAG).varint(te_len).extend(te)
        body.strs(blobs, intern)
        body.strs([b""] + [m[1] for m in mark[1:]], mark_id)
        first = np.zeros(n, np.int64)
        if self._fresh:
            first[0] = 1
            self._fresh = False
        body.strs([_NEEDS_STATE, _FIRST_FLAGS], first)
        pkt = Lines(n)
        pkt.lit(_PACKET_TAG).varint(body.lengths()).extend(body)
        self._fp.write(pkt.render())
        self.slices += nx

    def _tracks(self, E, X, kind, src):
        """Track-uuid field per event (ids into the returned table)."""
        info = self._info
        if not (info.tid is None and info.cpu is not None):
            return np.zeros(len(kind), np.int64), [self._track_field]
        n = len(kind)
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
            pairs, inv = np.unique(np.stack((np.maximum(pid[has], 0), tid[has]), 1),
                                   axis=0, return_inverse=True)
            for p, t in pairs.tolist():
                table.append(f_varint(_TE_TRACK, self._thread_uuid(p, t)))
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


def _varint_len(v: np.ndarray) -> np.ndarray:
    a = np.asarray(v).astype(np.uint64)
    n = np.ones(len(a), np.int64)
    for k in range(1, 10):
        n += (a >> np.uint64(7 * k)) != 0
    return n


def _masked_varint(v: np.ndarray, cond: np.ndarray) -> Lines:
    t = Lines(len(v))
    t.varint(np.where(cond, v, 0))
    m, k = t._cols[0]
    t._cols[0] = (m, k & np.asarray(cond, bool)[:, None])
    return t
