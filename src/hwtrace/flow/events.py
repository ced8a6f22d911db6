"""Decoder events (libipt's struct pt_event) and the event queue.

An :class:`Event` is a small mutable record: ``type`` is libipt's event
type name without the ``ptev_`` prefix (``"enabled"``, ``"async_branch"``,
…, exactly ptoracle's ``event`` names), ``ip_suppressed`` and
``status_update`` are its flags, timing fields follow libipt, and the
variant's payload lives in attributes named like libipt's union members
(``ip``, ``at``, ``from_`` / ``to`` for async branches, ``cr3``, ``mode``,
…).  Events stay mutable because the decoders above the query layer
refine them (an erratum may turn an async disable into a sync one, a
PTWRITE event gets its IP filled in).
"""

from __future__ import annotations

from collections import deque

# Where a queued event is waiting to be bound (libipt's enum pt_event_binding).
BIND_PSBEND = 0
BIND_TIP = 1
BIND_FUP = 2
BIND_CFE = 3    # event-trace: an EVD waits for its CFE
BIND_EXSTOP = 4  # MWAIT and PWRE wait for EXSTOP / PWRX


class Event:
    """One event.  Attributes beyond the common ones are set per type."""

    __slots__ = ("type", "ip_suppressed", "status_update", "has_tsc", "tsc",
                 "lost_mtc", "lost_cyc", "ip", "at", "from_", "to", "cr3",
                 "non_root", "mode", "speculative", "aborted", "base",
                 "hints", "ext", "state", "sub_state", "hw", "last",
                 "deepest", "interrupt", "store", "autonomous", "size",
                 "payload", "ratio", "resumed", "iflag", "vector", "has_cr2",
                 "cr2", "has_vector", "vmxr", "has_vmxr", "vmxq", "has_vmxq",
                 "trbv", "icnt", "icntv", "mult", "bits", "offset",
                 "stamped",
                 # internal: how an event-trace event binds (.evtrace)
                 "bind",
                 # internal: for a PSB+'s enabled/disabled status, the
                 # first packet type after the PSB+ (.psb.next_kind)
                 "follows")

    def __init__(self, type: str, **fields):
        self.type = type
        self.ip_suppressed = False
        self.status_update = False
        self.has_tsc = False
        self.tsc = 0
        self.lost_mtc = 0
        self.lost_cyc = 0
        self.ip = 0
        # IP fields a corrupt trace may leave unset (an async_branch whose
        # TIP carried no IP): zero, so the decoder reports "no memory mapped"
        # at address 0 as libipt does instead of failing.
        self.at = 0
        self.from_ = 0
        self.to = 0
        self.offset = 0
        self.stamped = False
        if fields:                  # (the compiled core sets them after)
            for k, v in fields.items():
                setattr(self, k, v)

    def get(self, name: str, default=0):
        return getattr(self, name, default)

    def __repr__(self) -> str:
        fields = []
        for name in self.__slots__:
            if hasattr(self, name) and name != "type":
                fields.append(f"{name}={getattr(self, name)!r}")
        return f"Event({self.type!r}, {', '.join(fields)})"


class EventQueue:
    """Events waiting for the packet they bind to, per binding, in order."""

    __slots__ = ("_queues",)

    def __init__(self):
        self._queues = (deque(), deque(), deque(), deque(), deque())

    def clear(self, binding: int | None = None) -> None:
        if binding is None:
            for q in self._queues:
                q.clear()
        else:
            self._queues[binding].clear()

    def enqueue(self, binding: int, ev: Event) -> Event:
        self._queues[binding].append(ev)
        return ev

    def enqueue_before(self, binding: int, ev: Event, type: str) -> Event:
        """Queue ``ev`` before the first queued event of ``type`` (or
        last if there is none)."""
        q = self._queues[binding]
        for i, other in enumerate(q):
            if other.type == type:
                q.insert(i, ev)
                return ev
        q.append(ev)
        return ev

    def dequeue(self, binding: int) -> Event | None:
        q = self._queues[binding]
        return q.popleft() if q else None

    def take(self, binding: int, type: str) -> Event | None:
        """Remove and return the first queued event of ``type``."""
        q = self._queues[binding]
        for i, ev in enumerate(q):
            if ev.type == type:
                del q[i]
                return ev
        return None

    def pending(self, binding: int) -> bool:
        return bool(self._queues[binding])

    def find(self, binding: int, type: str) -> Event | None:
        for ev in self._queues[binding]:
            if ev.type == type:
                return ev
        return None
