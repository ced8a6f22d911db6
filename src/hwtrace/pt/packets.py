"""Intel PT packet records: one immutable NamedTuple per packet type.

Every record has ``offset`` (byte offset of the packet in the trace),
``size`` (its length in bytes) and the payload fields named exactly like
libipt's ``struct pt_packet_*`` members, which are also the JSON keys of
the reference oracle (``ptoracle pkt``).  The class attribute ``type`` is
the oracle's type name and :meth:`to_json` returns the oracle's object
(:meth:`to_jsonl` its compact JSON line, much faster than json.dumps)::

    >>> Tip(offset=7, size=7, ipc=3, ip=0x1000).to_json()
    {'offset': 7, 'size': 7, 'type': 'tip', 'ipc': 3, 'ip': 4096}
    >>> Tip(offset=7, size=7, ipc=3, ip=0x1000).to_jsonl()
    '{"offset":7,"size":7,"type":"tip","ipc":3,"ip":4096}'

Payloads are the *raw* packet contents (an IP packet's ``ip`` is still
compressed as ``ipc`` says; see :mod:`hwtrace.pt.lastip`).

===========  ==========  ==========================================
type         class       payload fields
===========  ==========  ==========================================
pad          Pad
psb          Psb
psbend       Psbend
ovf          Ovf
stop         Stop
tnt8         Tnt8        bit_size, payload (oldest branch in the MSB)
tnt64        Tnt64       bit_size, payload
tip          Tip         ipc, ip
tip.pge      TipPge      ipc, ip
tip.pgd      TipPgd      ipc, ip
fup          Fup         ipc, ip
mode.exec    ModeExec    csl, csd, iflag
mode.tsx     ModeTsx     intx, abrt
pip          Pip         cr3, nr
tsc          Tsc         tsc
cbr          Cbr         ratio
tma          Tma         ctc, fc
mtc          Mtc         ctc
cyc          Cyc         value
vmcs         Vmcs        base
mnt          Mnt         payload
exstop       Exstop      ip
mwait        Mwait       hints, ext
pwre         Pwre        state, sub_state, hw
pwrx         Pwrx        last, deepest, interrupt, store, autonomous
ptw          Ptw         plc, payload, ip
cfe          Cfe         cfe_type, vector, ip
evd          Evd         evd_type, payload
trig         Trig        trbv, icnt, ip, icntv, mult
invalid      Invalid     raw_type (SKZ84: a corrupt TMA, skipped)
===========  ==========  ==========================================

IP compression values (``ipc``, libipt's ``enum pt_ip_compression``):
0 suppressed, 1 update-16, 2 update-32, 3 sext-48, 4 update-48, 6 full.
"""

# No ``from __future__ import annotations`` here: NamedTuple checks each
# field's annotation, and a string one (as that import makes them all) is
# compiled as a forward reference -- ~6 M instructions (~2 ms) over these
# ~110 fields at import, on every decode that reads packets in Python.
from typing import NamedTuple

# enum pt_ip_compression
IPC_SUPPRESSED = 0
IPC_UPDATE_16 = 1
IPC_UPDATE_32 = 2
IPC_SEXT_48 = 3
IPC_UPDATE_48 = 4
IPC_FULL = 6

#: payload bytes per IP compression (5 and 7 are reserved).
IPC_SIZE = {0: 0, 1: 2, 2: 4, 3: 6, 4: 6, 6: 8}


def _to_json(self) -> dict:
    d = {"offset": self[0], "size": self[1], "type": self.type}
    for name, value in zip(self._fields[2:], self[2:]):
        d[name] = value
    return d


class Pad(NamedTuple):
    offset: int
    size: int
    type = "pad"
    to_json = _to_json


class Psb(NamedTuple):
    offset: int
    size: int
    type = "psb"
    to_json = _to_json


class Psbend(NamedTuple):
    offset: int
    size: int
    type = "psbend"
    to_json = _to_json


class Ovf(NamedTuple):
    offset: int
    size: int
    type = "ovf"
    to_json = _to_json


class Stop(NamedTuple):
    offset: int
    size: int
    type = "stop"
    to_json = _to_json


class Tnt8(NamedTuple):
    offset: int
    size: int
    bit_size: int
    payload: int
    type = "tnt8"
    to_json = _to_json


class Tnt64(NamedTuple):
    offset: int
    size: int
    bit_size: int
    payload: int
    type = "tnt64"
    to_json = _to_json


class Tip(NamedTuple):
    offset: int
    size: int
    ipc: int
    ip: int
    type = "tip"
    to_json = _to_json


class TipPge(NamedTuple):
    offset: int
    size: int
    ipc: int
    ip: int
    type = "tip.pge"
    to_json = _to_json


class TipPgd(NamedTuple):
    offset: int
    size: int
    ipc: int
    ip: int
    type = "tip.pgd"
    to_json = _to_json


class Fup(NamedTuple):
    offset: int
    size: int
    ipc: int
    ip: int
    type = "fup"
    to_json = _to_json


class ModeExec(NamedTuple):
    offset: int
    size: int
    csl: int
    csd: int
    iflag: int
    type = "mode.exec"
    to_json = _to_json


class ModeTsx(NamedTuple):
    offset: int
    size: int
    intx: int
    abrt: int
    type = "mode.tsx"
    to_json = _to_json


class Pip(NamedTuple):
    offset: int
    size: int
    cr3: int
    nr: int
    type = "pip"
    to_json = _to_json


class Tsc(NamedTuple):
    offset: int
    size: int
    tsc: int
    type = "tsc"
    to_json = _to_json


class Cbr(NamedTuple):
    offset: int
    size: int
    ratio: int
    type = "cbr"
    to_json = _to_json


class Tma(NamedTuple):
    offset: int
    size: int
    ctc: int
    fc: int
    type = "tma"
    to_json = _to_json


class Mtc(NamedTuple):
    offset: int
    size: int
    ctc: int
    type = "mtc"
    to_json = _to_json


class Cyc(NamedTuple):
    offset: int
    size: int
    value: int
    type = "cyc"
    to_json = _to_json


class Vmcs(NamedTuple):
    offset: int
    size: int
    base: int
    type = "vmcs"
    to_json = _to_json


class Mnt(NamedTuple):
    offset: int
    size: int
    payload: int
    type = "mnt"
    to_json = _to_json


class Exstop(NamedTuple):
    offset: int
    size: int
    ip: int
    type = "exstop"
    to_json = _to_json


class Mwait(NamedTuple):
    offset: int
    size: int
    hints: int
    ext: int
    type = "mwait"
    to_json = _to_json


class Pwre(NamedTuple):
    offset: int
    size: int
    state: int
    sub_state: int
    hw: int
    type = "pwre"
    to_json = _to_json


class Pwrx(NamedTuple):
    offset: int
    size: int
    last: int
    deepest: int
    interrupt: int
    store: int
    autonomous: int
    type = "pwrx"
    to_json = _to_json


class Ptw(NamedTuple):
    offset: int
    size: int
    plc: int
    payload: int
    ip: int
    type = "ptw"
    to_json = _to_json


class Cfe(NamedTuple):
    offset: int
    size: int
    cfe_type: int
    vector: int
    ip: int
    type = "cfe"
    to_json = _to_json


class Evd(NamedTuple):
    offset: int
    size: int
    evd_type: int
    payload: int
    type = "evd"
    to_json = _to_json


class Trig(NamedTuple):
    offset: int
    size: int
    trbv: int
    icnt: int
    ip: int
    icntv: int
    mult: int
    type = "trig"
    to_json = _to_json


class Invalid(NamedTuple):
    """A packet libipt marks invalid (the SKZ84 workaround: a corrupted TMA,
    skipped as 8 bytes).  ``raw_type`` is libipt's ppt_invalid (0)."""
    offset: int
    size: int
    raw_type: int = 0
    type = "invalid"
    to_json = _to_json


#: every packet class, by its type name.
PACKET_TYPES = {cls.type: cls for cls in (
    Pad, Psb, Psbend, Ovf, Stop, Tnt8, Tnt64, Tip, TipPge, TipPgd, Fup,
    ModeExec, ModeTsx, Pip, Tsc, Cbr, Tma, Mtc, Cyc, Vmcs, Mnt, Exstop,
    Mwait, Pwre, Pwrx, Ptw, Cfe, Evd, Trig, Invalid)}

#: the packet types with an IP payload.
IP_PACKETS = (Tip, TipPge, TipPgd, Fup)

#: packets libipt 2.0 does not know (its decoder reports "unknown opcode").
NEWER_PACKETS = frozenset({"cfe", "evd", "trig"})


def _to_jsonl(self) -> str:
    return self._jsonl_format % self


def _add_jsonl(cls) -> None:
    """``cls.to_jsonl()``: the record's oracle JSON line, exactly
    ``json.dumps(p.to_json(), separators=(",", ":"))`` (every field is an
    int), formatted with one ``%`` instead of a dict and the encoder."""
    cls._jsonl_format = ('{"offset":%d,"size":%d,"type":"' + cls.type + '"'
                         + "".join(f',"{f}":%d' for f in cls._fields[2:])
                         + "}")
    cls.to_jsonl = _to_jsonl


for _cls in PACKET_TYPES.values():
    _add_jsonl(_cls)
del _cls


def from_json(obj: dict):
    """Build a packet record from an oracle ``pkt`` object."""
    cls = PACKET_TYPES[obj["type"]]
    return cls(**{k: obj.get(k, 0) for k in cls._fields})
