"""Trace offsets as libipt 2.3 reports them with an error.

libipt 2.3 builds its instruction and block decoders on an event decoder
and always holds one event fetched ahead (the next TNT, TIP or event); the
offset it reports is where that event decoder stands: at the packet that
produced the event fetched ahead when that packet may still produce more
(PSBEND, FUP, TIP, TIP.PGE and bound events), otherwise right after it
(PAD packets skipped).

The query decoder reads ahead differently (up to the next branch or event
packet), so these functions work it out: from an event just published
(:func:`after_event`), for the bits of a TNT packet still in use
(:func:`after_packet`), or for the event the decoder would fetch next from
its current state (:func:`lookahead`, on a throw-away copy).
"""

from __future__ import annotations

import copy

from hwtrace.pt.errors import PtError

_TNT = frozenset(("tnt8", "tnt64"))
# Packets at which the event decoder stays after delivering an event.
_STAY = frozenset(("psbend", "fup", "tip", "tip.pge"))


def skip_pads(q, pos: int) -> int:
    """``pos``, moved past PAD packets."""
    while True:
        p = q.peek_after(pos)
        if p.__class__ is PtError or p.type != "pad":
            return pos
        pos += p.size


def after_packet(q, pos: int, size: int) -> int:
    """Where the event decoder stands once done with the packet at
    ``pos``."""
    return skip_pads(q, pos + size)


def stays(ptype: str, ev) -> bool:
    """Does the event decoder stay at the packet of type ``ptype`` that
    published ``ev`` (it may publish more), rather than move past it?"""
    if ptype in _STAY or ev.status_update:     # PSB+ ends at PSBEND or OVF
        return True
    t = ev.type
    if ptype == "tip.pgd" and t != "disabled":
        return True
    if ptype == "exstop" and t == "mwait":
        return True
    if ptype == "pwrx" and t != "pwrx":
        return True
    return False


def after_event(q, stay: bool, pos: int, end: int) -> int:
    """Where the event decoder stands after delivering an event published
    by the packet at ``pos``, the decoder having moved on to ``end`` (past
    the packet, or further where an erratum workaround skipped packets);
    ``stay`` from :func:`stays`."""
    return pos if stay else skip_pads(q, end)


def clone(q):
    """A copy of query decoder ``q`` that can decode on without changing
    ``q`` (the packet decoder and buffer are shared; it is repositioned on
    every fetch)."""
    c = copy.copy(q)
    memo = {id(q.config): q.config}
    c.tnt = copy.copy(q.tnt)
    c.evq = copy.deepcopy(q.evq, memo)
    c.evt = copy.deepcopy(q.evt, memo)
    c.time = copy.deepcopy(q.time, memo)
    return c


def lookahead(q) -> int:
    """Where the event decoder stands after fetching the next TNT, TIP or
    event from ``q``'s current state."""
    from .query import Fail
    if q.pos is None:
        return 0
    c = clone(q)
    try:
        while True:
            nxt = c.next
            if nxt.__class__ is PtError:
                return c.pos
            t = nxt.type
            if t in _TNT:
                return after_packet(c, c.pos, nxt.size)
            if t == "tip":
                return c.pos
            start = c.pos
            c.published = None
            c._decode(nxt)
            ev = c.published
            if ev is not None:
                return after_event(c, stays(t, ev), start,
                                   max(c.pos, start + nxt.size))
            if c.pos == start and c.next is nxt:
                return start
    except Fail:
        return c.pos
