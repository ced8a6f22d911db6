"""Overflow (OVF) handling for the query decoder, with the CPU errata
that concern it (SKD010, APL11, APL12).

An OVF binds to the FUP that follows it if the overflow resolved while
packets were enabled (only timing packets may come between), otherwise
it stands alone and tracing is considered disabled.  The errata make the
trace lie about which of the two happened; each handler scans ahead for
evidence and, if it finds some, resumes decoding at a later packet.
"""

from __future__ import annotations

from hwtrace.pt import errors as E
from hwtrace.pt.errors import PtError

from .events import BIND_EXSTOP, BIND_FUP, BIND_PSBEND

_TIMING = frozenset(("tsc", "tma", "mtc", "cyc", "cbr"))
_FUP_SKIP = frozenset(("pad", "mnt", "invalid", "unknown")) | _TIMING
_FUP_NONE = frozenset(("psb", "tip.pge", "mode.exec", "mode.tsx", "pip",
                       "vmcs", "stop", "ovf", "exstop", "mwait", "pwre",
                       "pwrx", "ptw"))
_FUP_BAD = frozenset(("psbend", "tip", "tip.pgd", "tnt8", "tnt64"))

NOT_HANDLED = object()

# header_has_fup's answers that are a packet decode error (not the end)
_PACKET_ERRORS = frozenset((E.BAD_OPC, E.BAD_PACKET))


class _Found(Exception):
    pass


def _packets(q, pos):
    """Packets from ``pos`` on (stops at the first error, yielding it)."""
    while True:
        p = q.peek_after(pos)
        yield p
        if isinstance(p, PtError):
            return
        pos += p.size


def find_ovf_fup(q):
    """The FUP an OVF binds to (the packet), None if the overflow resolved
    with tracing disabled, or an error string (bad context / eos / ...)."""
    for p in _packets(q, q.pos):
        if isinstance(p, PtError):
            return p.code
        t = p.type
        if t == "fup":
            return p
        if t in _FUP_SKIP:
            continue
        if t in _FUP_BAD:
            return E.BAD_CONTEXT
        return None


def header_has_fup(q, pos):
    """Does the PSB+ whose first header packet is at ``pos`` hold a FUP?
    Returns the FUP packet, None, or an error string."""
    for p in _packets(q, pos):
        if isinstance(p, PtError):
            return p.code
        t = p.type
        if t == "fup":
            return p
        if t in ("psbend", "ovf"):
            return None
        if t in ("mode.exec", "mode.tsx", "pip", "vmcs", "mnt", "pad") or \
                t in _TIMING:
            continue
        return E.BAD_CONTEXT


def decode_ovf(q, pkt) -> None:
    """The query decoder's OVF decode step."""
    # An OVF ends a PSB+ like PSBEND: publish what is pending there.
    ev = q.evq.dequeue(BIND_PSBEND)
    if ev is not None:
        q.finish_psbend_event(ev)
        q.published = ev
        return
    # Events still waiting for their EXSTOP, PWRX or FUP will not get it:
    # report them first, without IP.
    ev = q.evq.dequeue(BIND_EXSTOP)
    if ev is None:
        ev = q.evq.dequeue(BIND_FUP)
    if ev is not None:
        if ev.type != "pwre":
            ev.ip_suppressed = True
        q.published = ev
        return

    q.overflow_reset()
    # past the OVF; SKD007's (a CYC's first byte, then the OVF) is a byte
    # longer than its size: libipt skips that byte as it decodes the CYC
    q.pos += pkt.size + (q._buf[q.pos] != 0x02)
    q._fetch()
    errata = q.config.errata

    fup = find_ovf_fup(q)
    if fup is None or isinstance(fup, str):
        if errata.skd010 and _skd010(q) is not NOT_HANDLED:
            return
        if errata.apl11 and fup == E.BAD_CONTEXT and \
                _apl11(q) is not NOT_HANDLED:
            return
        if isinstance(fup, str) and fup != E.EOS:
            from .query import Fail
            raise Fail(fup)
        ev = q._new_event("overflow")
        q.stamp(ev)
        ev.ip_suppressed = True
        q.published = ev
        return
    if errata.apl12 and _apl12(q, fup) is not NOT_HANDLED:
        return
    ev = q._new_event("overflow")
    q.stamp(ev)     # the time of the OVF, not of its FUP
    q.evq.enqueue(BIND_FUP, ev)


def _recover_at_ip(q, ippkt, resume_pos: int, redecode: bool) -> None:
    """Overflow resolved at ``ippkt``'s IP; go on at ``resume_pos``."""
    q._update_ip(ippkt)
    ev = q._new_event("overflow")
    q.stamp(ev)
    q._event_ip(ev)
    q.enabled = True
    q.published = ev
    q.pos = resume_pos
    q._fetch()


def _recover_disabled(q, resume_pos: int) -> None:
    ev = q._new_event("overflow")
    q.stamp(ev)
    ev.ip_suppressed = True
    q.published = ev
    q.pos = resume_pos
    q._fetch()


def _skd010(q):
    """SKD010: the FUP after an OVF may be missing although tracing was
    enabled when the overflow resolved."""
    tsx = None
    for p in _packets(q, q.pos):
        if isinstance(p, PtError):
            return NOT_HANDLED
        t = p.type
        if t == "tip.pge":
            return NOT_HANDLED
        if t == "tip.pgd":
            _recover_disabled(q, p.offset + p.size)
            return None
        if t in ("tnt8", "tnt64"):
            return NOT_HANDLED
        if t in ("pip", "vmcs", "mode.exec"):
            continue
        if t == "mode.tsx":
            if tsx is not None:
                return NOT_HANDLED
            tsx = p
            continue
        if t == "fup":
            if tsx is not None:
                ev = q._new_event("tsx", speculative=bool(tsx.intx),
                                  aborted=bool(tsx.abrt))
                q.evq.enqueue(BIND_FUP, ev)
            # Resume at the FUP itself: it binds what is queued.
            _recover_at_ip(q, p, p.offset, True)
            return None
        if t == "tip":
            _recover_at_ip(q, p, p.offset + p.size, False)
            return None
        if t == "psb":
            fup = header_has_fup(q, p.offset + p.size)
            if fup is None or isinstance(fup, str):
                return NOT_HANDLED
            _recover_at_ip(q, fup, p.offset, True)
            return None
        if t == "psbend":
            from .query import Fail
            raise Fail(E.BAD_CONTEXT)
        if t in ("ovf", "stop"):
            return NOT_HANDLED
        if t in ("pad", "mnt", "pwre", "pwrx") or t in _TIMING:
            continue
        if t in ("exstop", "ptw"):
            if not p.ip:
                continue
            return NOT_HANDLED
        return NOT_HANDLED


def _apl11(q):
    """APL11: an OVF may be followed by a spurious TIP.PGD."""
    for p in _packets(q, q.pos):
        if isinstance(p, PtError):
            return NOT_HANDLED
        t = p.type
        if t == "tip.pgd":
            _recover_disabled(q, p.offset + p.size)
            return None
        if t in ("pad", "mnt") or t in _TIMING:
            continue
        return NOT_HANDLED


def _apl12(q, fup):
    """APL12: a FUP may follow an OVF although the overflow resolved with
    tracing disabled.  A packet that does not decode before the scan
    decides fails the OVF (libipt 2.0 and later alike; the end of the
    trace does not)."""
    from .query import Fail
    after = fup.offset + fup.size
    for p in _packets(q, after):
        if isinstance(p, PtError):
            if p.code != E.EOS:
                raise Fail(p.code)
            return NOT_HANDLED
        t = p.type
        if t in ("tnt8", "tnt64", "tip", "tip.pgd", "psbend", "ovf"):
            return NOT_HANDLED
        if t == "psb":
            found = header_has_fup(q, p.offset + p.size)
            if found in _PACKET_ERRORS:
                raise Fail(found)
            if found is not None:
                return NOT_HANDLED
            _recover_disabled(q, after)
            return None
        if t in ("stop", "tip.pge"):
            _recover_disabled(q, after)
            return None
        if t in ("pad", "fup", "exstop", "mwait", "pwre", "pwrx", "ptw",
                 "mnt", "pip", "vmcs", "mode.exec", "mode.tsx") or \
                t in _TIMING:
            continue
        return NOT_HANDLED
