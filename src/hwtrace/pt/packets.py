"""Intel PT packet records: one immutable named tuple per packet type.

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

# collections.namedtuple subclasses (every field an int), not
# typing.NamedTuple classes: importing typing and checking ~110 field
# annotations cost ~5 ms of the start-up of every command that reads
# packets (the compiled scanner's module imports them: dump --stat too).
from collections import namedtuple

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


class Pad(namedtuple("Pad", "offset size")):
    __slots__ = ()
    type = "pad"
    to_json = _to_json


class Psb(namedtuple("Psb", "offset size")):
    __slots__ = ()
    type = "psb"
    to_json = _to_json


class Psbend(namedtuple("Psbend", "offset size")):
    __slots__ = ()
    type = "psbend"
    to_json = _to_json


class Ovf(namedtuple("Ovf", "offset size")):
    __slots__ = ()
    type = "ovf"
    to_json = _to_json


class Stop(namedtuple("Stop", "offset size")):
    __slots__ = ()
    type = "stop"
    to_json = _to_json


class Tnt8(namedtuple("Tnt8", "offset size bit_size payload")):
    __slots__ = ()
    type = "tnt8"
    to_json = _to_json


class Tnt64(namedtuple("Tnt64", "offset size bit_size payload")):
    __slots__ = ()
    type = "tnt64"
    to_json = _to_json


class Tip(namedtuple("Tip", "offset size ipc ip")):
    __slots__ = ()
    type = "tip"
    to_json = _to_json


class TipPge(namedtuple("TipPge", "offset size ipc ip")):
    __slots__ = ()
    type = "tip.pge"
    to_json = _to_json


class TipPgd(namedtuple("TipPgd", "offset size ipc ip")):
    __slots__ = ()
    type = "tip.pgd"
    to_json = _to_json


class Fup(namedtuple("Fup", "offset size ipc ip")):
    __slots__ = ()
    type = "fup"
    to_json = _to_json


class ModeExec(namedtuple("ModeExec", "offset size csl csd iflag")):
    __slots__ = ()
    type = "mode.exec"
    to_json = _to_json


class ModeTsx(namedtuple("ModeTsx", "offset size intx abrt")):
    __slots__ = ()
    type = "mode.tsx"
    to_json = _to_json


class Pip(namedtuple("Pip", "offset size cr3 nr")):
    __slots__ = ()
    type = "pip"
    to_json = _to_json


class Tsc(namedtuple("Tsc", "offset size tsc")):
    __slots__ = ()
    type = "tsc"
    to_json = _to_json


class Cbr(namedtuple("Cbr", "offset size ratio")):
    __slots__ = ()
    type = "cbr"
    to_json = _to_json


class Tma(namedtuple("Tma", "offset size ctc fc")):
    __slots__ = ()
    type = "tma"
    to_json = _to_json


class Mtc(namedtuple("Mtc", "offset size ctc")):
    __slots__ = ()
    type = "mtc"
    to_json = _to_json


class Cyc(namedtuple("Cyc", "offset size value")):
    __slots__ = ()
    type = "cyc"
    to_json = _to_json


class Vmcs(namedtuple("Vmcs", "offset size base")):
    __slots__ = ()
    type = "vmcs"
    to_json = _to_json


class Mnt(namedtuple("Mnt", "offset size payload")):
    __slots__ = ()
    type = "mnt"
    to_json = _to_json


class Exstop(namedtuple("Exstop", "offset size ip")):
    __slots__ = ()
    type = "exstop"
    to_json = _to_json


class Mwait(namedtuple("Mwait", "offset size hints ext")):
    __slots__ = ()
    type = "mwait"
    to_json = _to_json


class Pwre(namedtuple("Pwre", "offset size state sub_state hw")):
    __slots__ = ()
    type = "pwre"
    to_json = _to_json


class Pwrx(namedtuple("Pwrx", "offset size last deepest interrupt store autonomous")):
    __slots__ = ()
    type = "pwrx"
    to_json = _to_json


class Ptw(namedtuple("Ptw", "offset size plc payload ip")):
    __slots__ = ()
    type = "ptw"
    to_json = _to_json


class Cfe(namedtuple("Cfe", "offset size cfe_type vector ip")):
    __slots__ = ()
    type = "cfe"
    to_json = _to_json


class Evd(namedtuple("Evd", "offset size evd_type payload")):
    __slots__ = ()
    type = "evd"
    to_json = _to_json


class Trig(namedtuple("Trig", "offset size trbv icnt ip icntv mult")):
    __slots__ = ()
    type = "trig"
    to_json = _to_json


class Invalid(namedtuple("Invalid", "offset size raw_type", defaults=(0,))):
    """A packet libipt marks invalid (the SKZ84 workaround: a corrupted TMA,
    skipped as 8 bytes).  ``raw_type`` is libipt's ppt_invalid (0)."""
    __slots__ = ()
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
