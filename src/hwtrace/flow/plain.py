"""A batch's plain events as columns (no I/O).

A system-call-heavy recording's batches are mostly events: under
user-only filtering each system call is a ``disabled`` (TIP.PGD) and an
``enabled`` (TIP.PGE), and every PSB+ restates the tracing state, the
core-to-bus ratio and the execution mode.  Made one Python
:class:`~.events.Event` and one item tuple each (~380,000 system calls
on ``find /usr``), they cost the views more than decoding them; the
call-stack builder takes most of them in bulk anyway
(:mod:`hwtrace.analysis.roundtrips`).

So a producer asked for ``plain_events`` gives every event whose Event
a row of :data:`PLAIN` tells exactly -- no attribute beyond the common
ones but ``resumed``, ``follows``, ``mode`` and ``ratio``, no lost
MTC/CYC counts, no ``at``/``from_``/``to`` -- as a row of
``Batch.plain`` instead of an item.  Each row's ``pos`` is its place
among the batch's items and rows together: the items keep their order,
the rows fill the places between them.  :func:`event` makes a row's
Event (equal to the one the producer would have made), :func:`merged`
the items a batch without rows would have had, and :func:`split` is the
twin of the producer's choice (an items list into items and rows).
"""

from __future__ import annotations

import numpy as np

from .events import Event

#: a plain event: the record index before it, its trace offset, then
#: libipt's fields; ``flags`` PF_*, ``opt`` the optional attributes set
#: (PO_*; ``ratio``, ``mode`` and ``follows`` hold their values)
PLAIN = np.dtype({"names": ["index", "offset", "tsc", "ip", "ratio", "pos",
                            "type", "flags", "opt", "mode", "follows"],
                  "formats": ["<i8", "<i8", "<u8", "<u8", "<u8", "<u4",
                              "u1", "u1", "u1", "i1", "i1"],
                  "offsets": [0, 8, 16, 24, 32, 40, 44, 45, 46, 47, 48],
                  "itemsize": 56})

PF_IP_SUPPRESSED, PF_STATUS_UPDATE, PF_HAS_TSC, PF_STAMPED, PF_RESUMED = \
    1, 2, 4, 8, 16
PO_RESUMED, PO_FOLLOWS, PO_MODE, PO_RATIO = 1, 2, 4, 8

#: event types by number (the compiled core's EV_* order)
EVENT_TYPES = (
    "enabled", "disabled", "async_disabled", "async_branch", "paging",
    "async_paging", "overflow", "exec_mode", "tsx", "stop", "vmcs",
    "async_vmcs", "exstop", "mwait", "pwre", "pwrx", "ptwrite", "tick",
    "cbr", "mnt", "iflags", "interrupt", "iret", "smi", "rsm", "sipi",
    "init", "vmentry", "vmexit", "shutdown", "uintr", "uiret", "swintr",
    "syscall", "trig")
#: packet kinds by number (``follows``; the core's PT_K_* order)
PACKET_KINDS = (
    "pad", "psb", "psbend", "ovf", "stop", "tnt8", "tnt64", "tip",
    "tip.pge", "tip.pgd", "fup", "mode.exec", "mode.tsx", "pip", "tsc",
    "cbr", "tma", "mtc", "cyc", "vmcs", "mnt", "exstop", "mwait", "pwre",
    "pwrx", "ptw", "cfe", "evd", "trig", "invalid")
MODES = ("16bit", "32bit", "64bit")

TYPE = {t: i for i, t in enumerate(EVENT_TYPES)}
ENABLED, DISABLED = TYPE["enabled"], TYPE["disabled"]
_KIND = {k: i for i, k in enumerate(PACKET_KINDS)}
_MODE = {m: i for i, m in enumerate(MODES)}

#: the types that change what a call-stack builder knows (unless a status
#: update enabling or disabling): :func:`hwtrace.analysis.batchfeed.structural`
STRUCTURAL = np.zeros(256, bool)
for _t in ("enabled", "disabled", "async_disabled", "overflow", "stop",
           "async_branch", "tsx"):
    STRUCTURAL[TYPE[_t]] = True

#: the attributes an Event may hold and still be a row
_COMMON = frozenset({"type", "ip_suppressed", "status_update", "has_tsc",
                     "tsc", "lost_mtc", "lost_cyc", "ip", "at", "from_", "to",
                     "offset", "stamped"})
_OPTIONAL = frozenset({"resumed", "follows", "mode", "ratio"})
_OTHER = tuple(a for a in Event.__slots__ if a not in _COMMON | _OPTIONAL)


def event(row) -> Event:
    """The Event of a row (a tuple: ``rows.tolist()``'s)."""
    (_index, _off, tsc, ip, ratio, _pos, typ, flags, opt, mode,
     follows) = row
    ev = Event(EVENT_TYPES[typ])
    if flags & PF_IP_SUPPRESSED:
        ev.ip_suppressed = True
    if flags & PF_STATUS_UPDATE:
        ev.status_update = True
    if flags & PF_HAS_TSC:
        ev.has_tsc = True
    if tsc:
        ev.tsc = tsc
    if ip:
        ev.ip = ip
    if flags & PF_STAMPED:
        ev.stamped = True
    if opt:
        if opt & PO_MODE:
            ev.mode = MODES[mode] if 0 <= mode < 3 else None
        if opt & PO_RATIO:
            ev.ratio = ratio
        if opt & PO_RESUMED:
            ev.resumed = bool(flags & PF_RESUMED)
        if opt & PO_FOLLOWS:
            ev.follows = PACKET_KINDS[follows] if 0 <= follows < len(PACKET_KINDS) \
                else None
    return ev


def items_of(rows: np.ndarray) -> list:
    """The (index, offset, Event) items of rows, in their order."""
    return [(r[0], r[1], event(r)) for r in rows.tolist()]


def item_positions(nitems: int, rows: np.ndarray) -> np.ndarray:
    """The places of a batch's ``nitems`` items among its items and
    ``rows`` (the places no row holds)."""
    free = np.ones(nitems + len(rows), bool)
    free[rows["pos"]] = False
    return np.flatnonzero(free)


def merged(items: list, rows: np.ndarray | None,
           at: np.ndarray | None = None) -> list:
    """The items of a batch with ``rows`` as items, in order: what the
    producer gives without ``plain_events``.  ``at``: the items' places
    (:func:`item_positions`; where some items or rows were left out)."""
    if rows is None or not len(rows):
        return items
    if at is None:
        out = [None] * (len(items) + len(rows))
        for p, it in zip(rows["pos"].tolist(), items_of(rows)):
            out[p] = it
        it = iter(items)
        return [x if x is not None else next(it) for x in out]
    order = np.argsort(np.concatenate((at, rows["pos"])), kind="stable").tolist()
    both = items + items_of(rows)
    return [both[i] for i in order]


def structural(rows: np.ndarray) -> np.ndarray:
    """Which rows change what a call-stack builder knows (the others only
    tell the time): :func:`hwtrace.analysis.batchfeed.structural`."""
    t = rows["type"]
    return STRUCTURAL[t] & ~((rows["flags"] & PF_STATUS_UPDATE).astype(bool)
                             & ((t == ENABLED) | (t == DISABLED)))


def count(batch) -> int:
    """A batch's items, its rows counted in."""
    rows = getattr(batch, "plain", None)
    return len(batch.items) + (0 if rows is None else len(rows))


def classic(batch):
    """``batch`` with its rows as items (itself where it has none)."""
    rows = getattr(batch, "plain", None)
    if rows is None:
        return batch
    return batch._replace(items=merged(batch.items, rows), plain=None)


def _row(ev):
    """The row fields of an Event a row tells exactly, else None."""
    if type(ev) is not Event or ev.lost_mtc or ev.lost_cyc or ev.at or \
            ev.from_ or ev.to or ev.offset:
        return None
    for a in _OTHER:
        if hasattr(ev, a):
            return None
    opt = flags = 0
    mode = follows = -1
    ratio = 0
    if hasattr(ev, "mode"):
        opt |= PO_MODE
        mode = _MODE.get(ev.mode, -1)
    if hasattr(ev, "ratio"):
        opt |= PO_RATIO
        ratio = ev.ratio
    if hasattr(ev, "resumed"):
        opt |= PO_RESUMED
        flags |= PF_RESUMED if ev.resumed else 0
    if hasattr(ev, "follows"):
        opt |= PO_FOLLOWS
        follows = _KIND.get(ev.follows, -1)
    flags |= (PF_IP_SUPPRESSED if ev.ip_suppressed else 0) | \
        (PF_STATUS_UPDATE if ev.status_update else 0) | \
        (PF_HAS_TSC if ev.has_tsc else 0) | (PF_STAMPED if ev.stamped else 0)
    return ev.tsc, ev.ip, ratio, TYPE[ev.type], flags, opt, mode, follows


def split(items: list) -> tuple[list, np.ndarray]:
    """The producer's choice, in Python: (the items no row tells, the
    rows of the others)."""
    keep, rows = [], []
    for p, (j, off, it) in enumerate(items):
        f = _row(it) if type(it) is Event else None
        if f is None:
            keep.append((j, off, it))
        else:
            tsc, ip, ratio, typ, flags, opt, mode, follows = f
            rows.append((j, off, tsc, ip, ratio, p, typ, flags, opt, mode,
                         follows))
    return keep, np.array(rows, PLAIN) if rows else np.zeros(0, PLAIN)
