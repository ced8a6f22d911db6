"""IA32_RTIT_CTL as an IntFlag with the SDM's bit names, its fields, and the modes."""

from __future__ import annotations

from enum import KEEP, IntEnum, IntFlag


class Mode(IntEnum):
    """Trace mode: every logical CPU (0) or chosen threads (1)."""

    CPU = 0
    THREAD = 1


class Ctl(IntFlag, boundary=KEEP):
    """IA32_RTIT_CTL (SDM Vol. 3C, "IA32_RTIT_CTL MSR").

    Single-bit members are the SDM's flags; the multi-bit members
    (``MTC_FREQ``, ``CYC_THRESH``, ``PSB_FREQ``, ``ADDRn_CFG``) are masks of
    the fields; use :func:`field` / :func:`with_field` to read and set them.
    """

    TRACE_EN = 1 << 0
    CYC_EN = 1 << 1
    OS = 1 << 2
    USER = 1 << 3
    PWR_EVT_EN = 1 << 4
    FUP_ON_PTW = 1 << 5
    FABRIC_EN = 1 << 6
    CR3_FILTER = 1 << 7
    TOPA = 1 << 8
    MTC_EN = 1 << 9
    TSC_EN = 1 << 10
    DIS_RETC = 1 << 11
    PTW_EN = 1 << 12
    BRANCH_EN = 1 << 13
    MTC_FREQ = 0xF << 14
    CYC_THRESH = 0xF << 19
    PSB_FREQ = 0xF << 24
    ADDR0_CFG = 0xF << 32
    ADDR1_CFG = 0xF << 36
    ADDR2_CFG = 0xF << 40
    ADDR3_CFG = 0xF << 44


#: name -> (shift, width) of IA32_RTIT_CTL's multi-bit fields.
FIELDS: dict[str, tuple[int, int]] = {
    "mtc_freq": (14, 4),
    "cyc_thresh": (19, 4),
    "psb_freq": (24, 4),
    "addr0_cfg": (32, 4),
    "addr1_cfg": (36, 4),
    "addr2_cfg": (40, 4),
    "addr3_cfg": (44, 4),
}

#: ADDRn_CFG values.
ADDR_CFG_OFF = 0
ADDR_CFG_FILTER = 1
ADDR_CFG_STOP = 2

#: Bits with a meaning in IA32_RTIT_CTL; everything else is reserved.
DEFINED_BITS = 0x0000_FFFF_0F7B_FFFF


def field(ctl: int, name: str) -> int:
    """The value of field ``name`` (see :data:`FIELDS`) in ``ctl``."""
    shift, width = FIELDS[name]
    return (int(ctl) >> shift) & ((1 << width) - 1)


def with_field(ctl: int, name: str, value: int) -> Ctl:
    """``ctl`` with field ``name`` set to ``value``."""
    shift, width = FIELDS[name]
    mask = (1 << width) - 1
    if not 0 <= value <= mask:
        raise ValueError(f"{name} must be 0..{mask}")
    return Ctl((int(ctl) & ~(mask << shift)) | (value << shift))


def addr_cfg(ctl: int, n: int) -> int:
    """ADDRn_CFG of ``ctl`` (0 off, 1 filter, 2 TraceStop)."""
    return field(ctl, f"addr{n}_cfg")


def describe(ctl: int) -> str:
    """A ``"branch;user;tsc;mtc-freq=3"``-like text of ``ctl`` for people."""
    names = []
    for member in Ctl:
        if member.value & (member.value - 1) == 0 and int(ctl) & member.value:
            names.append(member.name.lower())
    for name in FIELDS:
        v = field(ctl, name)
        if v:
            names.append(f"{name}={v}")
    return ";".join(names)
