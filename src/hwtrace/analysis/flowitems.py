"""Reading decoded-flow items, whatever their concrete type.

An item is either a ``dict`` shaped like one ``ptoracle insn`` JSON line or
any object with attributes of the same names (the flow decoder's records).
Enumerations are accepted where the JSON has a string (``iclass``, event
type, mode): their lower-case ``name`` with a ``ptic_``/``ptev_``/``ptem_``
prefix removed is used.

Kinds, checked in this order (an error line also carries ``ip``/``iclass``):

* error:  has ``error`` (message), ``offset``, maybe ``ip``
* event:  has ``event`` (or, for objects only, ``type``/``kind`` naming an
  event) plus its libipt fields (``ip``, ``tsc``, ``resumed``, ``at``, ...)
* status: has ``status`` (``end_of_trace``, ``resynced``, ...)
* insn:   has ``ip``, ``size``, ``iclass``
"""

from __future__ import annotations

from enum import Enum

INSN, EVENT, STATUS, ERROR = range(4)

_PREFIXES = ("ptic_", "ptev_", "ptem_", "pts_")


def enum_name(v) -> str | None:
    """A string, or an enum's lower-case name without libipt's prefix."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, Enum):
        n = v.name.lower()
    else:
        n = str(getattr(v, "name", v)).lower()
    for p in _PREFIXES:
        if n.startswith(p):
            return n[len(p):]
    return n


class ObjectItem:
    """A read-only mapping view of an attribute-style item.

    Understands the flow decoder's records (``hwtrace.flow``): an
    instruction's ``iclass_name``, an event's ``type``, ``has_tsc`` (no
    ``tsc`` without it), ``ip_suppressed`` (no ``ip`` then) and ``from_``;
    a decode error's ``code``."""

    __slots__ = ("_o",)

    def __init__(self, obj):
        self._o = obj

    def get(self, name, default=None):
        o = self._o
        if name == "iclass":
            v = getattr(o, "iclass_name", None)
            if v is None:
                v = getattr(o, "iclass", None)
        elif name == "tsc":
            if getattr(o, "has_tsc", True) is False:
                return default
            v = getattr(o, "tsc", None)
        elif name in ("ip", "to") and getattr(o, "ip_suppressed", False) \
                and getattr(o, "iclass", None) is None:
            return default
        elif name == "from":
            v = getattr(o, "from_", None)
            if v is None:
                v = getattr(o, "from", None)
        elif name == "error":
            v = getattr(o, "error", None)
            if v is None and getattr(o, "iclass", None) is None:
                v = getattr(o, "code", None)
        else:
            v = getattr(o, name, None)
        if v is None:
            return default
        if name in ("iclass", "event", "mode", "status", "type", "kind") \
                and not isinstance(v, str):
            v = enum_name(v)
        return v

    def __contains__(self, name):
        return getattr(self._o, name, None) is not None


def as_mapping(item):
    """``item`` itself for a dict, else an :class:`ObjectItem` view."""
    if type(item) is dict:
        return item
    if isinstance(item, dict):
        return item
    return ObjectItem(item)


def kind_of(m) -> int:
    """INSN, EVENT, STATUS or ERROR for a mapping from :func:`as_mapping`."""
    if m.get("error") is not None:
        return ERROR
    if m.get("event") is not None:
        return EVENT
    if m.get("status") is not None:
        return STATUS
    if type(m) is ObjectItem and m.get("iclass") is None:
        # an object event may name its type ``type`` or ``kind``
        if m.get("type") is not None or m.get("kind") is not None:
            return EVENT
    return INSN


def event_name(m) -> str:
    n = m.get("event")
    if n is None:
        n = m.get("type") or m.get("kind")
    return enum_name(n) or "unknown"
