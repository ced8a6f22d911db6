"""Perfetto's native protobuf trace format, streamed packet by packet.

Each stream gets a thread track (a process track above it; in cpu mode a
"CPUs" process with a track per CPU) and its own packet sequence.  An
activation is a ``TYPE_SLICE_BEGIN`` when it begins and a
``TYPE_SLICE_END`` when it ends, markers are ``TYPE_INSTANT`` events; event
names are interned per sequence (``InternedData.event_names``, the packets
flagged ``SEQ_NEEDS_INCREMENTAL_STATE``).  Timestamps are nanoseconds (TSC
ticks of unknown frequency and instruction counts are written 1 unit = 1 ns).

Writing needs no protobuf runtime (see :mod:`._pb`); reading it back is
what ``perfetto_trace_pb2.Trace.FromString`` (PyPI ``perfetto``) or the
Perfetto UI do.
"""

from __future__ import annotations

from hwtrace.analysis.records import Activation, Enter, Marker, StreamInfo
from hwtrace.export import flag_names
from hwtrace.export.chrome import CPU_PID
from hwtrace.export._pb import f_bytes, f_str, f_varint, varint

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


def _packet(body: bytes) -> bytes:
    return f_bytes(1, body)


class PerfettoTraceWriter:
    def __init__(self, fp):
        self._fp = fp
        self._seq = 0
        self._track = 0
        self._iids: dict[str, int] = {}
        self._processes: dict = {}
        self._seq_head = b""
        self._fresh = False
        self.slices = 0
        self.instants = 0

    def begin_stream(self, info: StreamInfo, unit: str | None = "insns") -> None:
        self._seq += 1
        self._iids = {}
        if info.tid is None and info.cpu is not None:
            pid, tid, pname = CPU_PID, info.cpu, "CPUs"
        else:
            pid = info.pid if info.pid is not None else 0
            tid = info.tid if info.tid is not None else 0
            pname = f"process {pid}"
        puuid = self._processes.get(pid)
        if puuid is None:
            puuid = self._processes[pid] = (1 << 40) + len(self._processes)
            desc = f_varint(_TD_UUID, puuid) + f_bytes(
                _TD_PROCESS, f_varint(_PD_PID, pid) + f_str(_PD_NAME, pname))
            self._fp.write(_packet(f_bytes(_PKT_TRACK_DESC, desc)))
        self._track = (2 << 40) + self._seq
        thread = (f_varint(_THD_PID, pid) + f_varint(_THD_TID, tid)
                  + f_str(_THD_NAME, info.label()))
        desc = (f_varint(_TD_UUID, self._track) + f_varint(_TD_PARENT, puuid)
                + f_bytes(_TD_THREAD, thread))
        self._fp.write(_packet(f_bytes(_PKT_TRACK_DESC, desc)))
        self._seq_head = f_varint(_PKT_SEQ, self._seq)
        self._fresh = True
        self._track_field = f_varint(_TE_TRACK, self._track)

    def _emit(self, ts: float, etype: int, name: str, annotations: bytes = b"",
              with_name: bool = True) -> None:
        body = _TS_TAG + varint(int(round(ts))) + self._seq_head
        te = _TYPE_FIELD[etype] + self._track_field + annotations
        interned = b""
        if with_name:
            iid = self._iids.get(name)
            if iid is None:
                iid = self._iids[name] = len(self._iids) + 1
                interned = f_bytes(_ID_EVENT_NAMES, f_varint(_EN_IID, iid)
                                   + f_str(_EN_NAME, name))
            te += f_varint(_TE_NAME_IID, iid)
        body += f_bytes(_PKT_TRACK_EVENT, te)
        if interned:
            body += f_bytes(_PKT_INTERNED, interned)
        if self._fresh:
            self._fresh = False
            body += _FIRST_FLAGS
        else:
            body += _NEEDS_STATE
        self._fp.write(_PACKET_TAG + varint(len(body)) + body)

    def add(self, rec) -> None:
        t = type(rec)
        if t is Enter:
            self._emit(rec.begin, SLICE_BEGIN, rec.name)
        elif t is Activation:
            ann = f_bytes(_TE_ANNOT, _INSNS_NAME
                          + f_varint(_DA_INT, rec.end_idx - rec.begin_idx))
            if rec.flags:
                ann += f_bytes(_TE_ANNOT, f_str(_DA_NAME, "flags")
                               + f_str(_DA_STR, flag_names(rec.flags)))
            self._emit(rec.end, SLICE_END, rec.name, ann, with_name=False)
            self.slices += 1
        elif t is Marker:
            ann = f_bytes(_TE_ANNOT, f_str(_DA_NAME, "detail")
                          + f_str(_DA_STR, rec.detail))
            self._emit(rec.time, INSTANT, rec.kind, ann)
            self.instants += 1

    def close(self) -> None:
        self._fp.flush()
