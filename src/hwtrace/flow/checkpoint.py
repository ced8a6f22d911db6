"""Checkpoints of a running flow decode: where two decodes of the same
trace are provably in the same state (the stitch of :mod:`.parallel`).

A decode driven by :func:`hwtrace.flow.session.run_insn` / ``run_blocks``
is deterministic: what it emits from an instruction (or block) on depends
only on the decoder's state after it decoded that item, the status
``next()`` returned with it, the item itself (its IP is the session's
``last_ip``) and the trace offset it is reported at.  :class:`Recorder`
records, at chosen PSBs, a :class:`Checkpoint` at the first item decoded
after the PSB: a digest of that whole state, the position of the output
written so far and the sink's counters.  Two decodes with equal digests at
a checkpoint emit the same output from it on.

What the digest leaves out, and why that is safe:

* caches (``cache`` -- the per-address instruction cache, ``_runs`` --
  the block decoder's walks between branches, and any attribute whose
  name contains "cache": by convention a pure function of the image; a
  cache of trace state must be named otherwise), the memory
  image, the configuration and the trace buffer itself (``_pkt``, ``_buf``,
  ``_end``, ``tconfig``): identical inputs, or pure functions of them;
* the query decoder's ``sync`` offset: it is only ever compared with the
  current position (``sync_forward`` skips a PSB it stands on), so the
  digest holds ``pos == sync`` instead;
* values that are dead where they stand (``_DEAD``): the bits of an empty
  TNT cache and the end of the TNT packet in use while none is;
* the return-address stack (``retstack``), which is kept apart
  (:attr:`Checkpoint.stack`): a decoder that synchronized later may lack
  entries pushed before its PSB.  If its stack is a suffix of the other's,
  both pop the same addresses until it would pop past its bottom -- which
  it reports as ``RETSTACK_EMPTY``; :class:`Recorder` notes every such
  error (:attr:`Recorder.underflows`) so the stitch can refuse a segment
  where that happened.

Everything else reachable from the decoder (last IP, TNT cache, event
queue, pending events and instructions, timing and its calibration, exec
mode, CR3/VMCS, ...) is in the digest, found by walking the objects, so a
field added to the decoders later is covered without a change here.
"""

from __future__ import annotations

import gc
import hashlib
from collections import deque
from typing import NamedTuple

from hwtrace.pt import errors as E

# Attributes that are inputs or caches, not decode state (see above).
EXCLUDED = frozenset(("cache", "image", "config", "tconfig", "_pkt", "_buf",
                      "_end", "retstack", "sync", "_runs"))


def _excluded(name: str) -> bool:
    """Inputs and caches (``_runs``: the block decoder's per-address walks
    between branches; anything named ``*cache*``: a pure function of the
    image, by this module's convention)."""
    return name in EXCLUDED or name.startswith("_runs") or \
        "cache" in name.lower()


# Objects that are the image or derived from it alone, wherever found.
_INPUT_TYPES = frozenset(("InsnCache", "Image", "FlowConfig"))


def _tnt_empty(obj) -> bool:
    tnt = getattr(obj, "tnt", obj)
    return not getattr(tnt, "index", 1)


# Values that are dead while a test holds: never read before they are set
# again.  The TNT cache's bits when it is empty (tnt.py: index 0 means
# empty; fill() sets the bits), and the query decoder's ``tnt_end``, the
# end of the TNT packet whose bits are in use, while none are (read only
# when the cache holds bits; set with them).  A decoder that ran through
# a PSB holds the last TNT packet's values there, one synchronized at it
# zeros: without this they would only meet where both saw the same TNT.
_DEAD = {("TntCache", "bits"): _tnt_empty,
         ("QueryDecoder", "tnt_end"): _tnt_empty}

_PLAIN = (int, str, bytes, float, type(None), bool)


class Unhashable(Exception):
    """The decoder holds an object the digest cannot describe."""


class Checkpoint(NamedTuple):
    pos: int            # the query decoder's trace position
    key: bytes          # digest of the state (without the return stack)
    stack: tuple        # the return-address stack, oldest first
    out: int            # bytes of output written before this item
    counts: tuple       # the sink's (insns, blocks, events, errors) before it


def attribute_names() -> frozenset:
    """Every name the flow and packet layers' code uses as an attribute
    (a superset of the decoders' instance attributes).

    Why not ``vars(obj)``: reading ``__dict__`` makes CPython (3.11+) move
    an object's inline attribute values into a real dict, which slows
    every later attribute access of the decoder by a third."""
    import importlib
    import pkgutil
    import sys

    import hwtrace.flow
    import hwtrace.pt

    for pkg in (hwtrace.flow, hwtrace.pt):
        for m in pkgutil.iter_modules(pkg.__path__):
            try:
                importlib.import_module(f"{pkg.__name__}.{m.name}")
            except ImportError:
                pass
    names: set = set()
    seen: set = set()

    def code(co):
        names.update(co.co_names)
        for c in co.co_consts:
            if hasattr(c, "co_names"):
                code(c)

    def visit(obj):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            for f in (obj.fget, obj.fset, obj.fdel):
                if f is not None:
                    visit(f)
        elif hasattr(obj, "__code__"):
            code(obj.__code__)
        elif isinstance(obj, type):
            for v in obj.__dict__.values():
                visit(v)

    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith(("hwtrace.flow", "hwtrace.pt")):
            continue
        for v in list(vars(mod).values()):
            if getattr(v, "__module__", None) == name:
                visit(v)
    return frozenset(names)


_MISSING = object()


def _class_attr(t, name):
    for klass in t.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return _MISSING


class Fields:
    """The attribute names that may hold state, per type: its slots and,
    for objects with a ``__dict__``, every name of :func:`attribute_names`
    that is not a class attribute (memoized: one digest walks the same few
    types many times)."""

    def __init__(self, names: frozenset):
        self.names = names
        self._of = {}

    def of(self, t) -> tuple[frozenset, tuple]:
        got = self._of.get(t)
        if got is None:
            slots = []
            for klass in t.__mro__:
                sl = klass.__dict__.get("__slots__", ())
                slots.extend((sl,) if isinstance(sl, str) else sl)
            has_dict = t.__dictoffset__ != 0
            if not has_dict and not slots:
                raise Unhashable(t.__name__)    # a C object: state unknown
            candidates = set(slots)
            if has_dict:
                # dir() of a class: the names in the __dict__ of its MRO
                candidates.update(self.names.difference(dir(t)))
            got = self._of[t] = (frozenset(slots), tuple(sorted(candidates)))
        return got


def _describe(obj, names: Fields, seen: set, depth: int = 0):
    t = obj.__class__
    if t in _PLAIN:
        return obj if t is not bool else ("b", obj)
    if depth > 40:
        raise Unhashable("too deep")
    d = depth + 1
    if isinstance(obj, int):                # IntEnum, IntFlag
        return (t.__name__, int(obj))
    if isinstance(obj, (tuple, list, deque)):
        return (t.__name__, tuple(_describe(x, names, seen, d) for x in obj))
    if isinstance(obj, dict):
        return ("dict", tuple(sorted(
            ((repr(_describe(k, names, seen, d)), _describe(v, names, seen, d))
             for k, v in obj.items()), key=lambda kv: kv[0])))
    if isinstance(obj, (set, frozenset)):
        return ("set", tuple(sorted(repr(_describe(x, names, seen, d))
                                    for x in obj)))
    if t.__name__ in _INPUT_TYPES:
        return ("<input>", t.__name__)
    if id(obj) in seen:
        return ("<seen>", t.__name__)
    seen.add(id(obj))
    slots, candidates = names.of(t)
    fields = []
    for name in candidates:
        if name in ("__dict__", "__weakref__"):
            continue
        v = getattr(obj, name, _MISSING)
        if v is _MISSING:
            if name in slots:
                fields.append((name, "<unset>"))
            continue
        if name == "sync" and hasattr(obj, "pos"):
            fields.append(("sync==pos", v == obj.pos))
            continue
        if _excluded(name):
            continue
        dead = _DEAD.get((t.__name__, name))
        if dead is not None and dead(obj):
            fields.append((name, "<dead>"))
            continue
        if callable(v) and (hasattr(v, "__self__") or hasattr(v, "__code__")):
            continue                        # a method bound as an attribute
        fields.append((name, _describe(v, names, seen, d)))
    return (t.__name__, tuple(fields))


def digest(dec, names, extra=()) -> bytes:
    """The digest of decoder ``dec``'s state (plus ``extra``); ``names``:
    :func:`attribute_names` or a :class:`Fields` of them (faster when it
    is kept for the next digest)."""
    if not isinstance(names, Fields):
        names = Fields(names)
    # The walk makes many small tuples: without this, the collections they
    # set off would traverse the whole (large) decoder heap each time.
    was = gc.isenabled()
    gc.disable()
    try:
        desc = (_describe(dec, names, set()),
                _describe(tuple(extra), names, set()))
        return hashlib.blake2b(repr(desc).encode(), digest_size=20).digest()
    finally:
        if was:
            gc.enable()


def _insn_decoder(dec):
    return getattr(dec, "insn", dec) if not hasattr(dec, "query") else dec


class SpoolWriter:
    """Collects text output, flushing it to a binary file; ``tell()`` is
    the byte position of everything written so far."""

    def __init__(self, f):
        self.f = f
        self.pieces = []

    def write(self, s: str) -> None:
        p = self.pieces
        p.append(s)
        if len(p) >= 4096:
            self.flush()

    def flush(self) -> None:
        if self.pieces:
            self.f.write("".join(self.pieces).encode())
            self.pieces = []

    def tell(self) -> int:
        self.flush()
        return self.f.tell()


class Stop(Exception):
    """Raised through the session when a job has recorded enough."""


_NEVER = 1 << 64


class Recorder:
    """Records :class:`Checkpoint` s of one decode driven by the session
    (see the module doc); build the decoder with :meth:`decoder` and the
    sink with :meth:`sink`.

    Checkpoints are only taken where the stitch of :mod:`.parallel` can
    use them, in two windows of the trace given as ``(from, until)``
    offsets: ``head`` (where the previous job's tail meets this job) and
    ``tail`` (where this job meets the next one).  A window records a
    checkpoint at each PSB from offset ``from`` on, up to and including
    the first checkpoint at or past ``until`` (None: no limit); at the end
    of the tail window, or as soon as ``done(checkpoint)`` says the next
    job is met at a tail checkpoint, the decode stops (:class:`Stop` is
    raised through the session).

    A PSB shows as the status updates its PSB+ publishes (events with
    ``status_update``); the checkpoint is taken at the first item decoded
    after them -- the item a decoder synchronized at that PSB decodes
    first.  (Where a PSB's status updates come with items between them, as
    the flow reaches their IPs, each group gets a checkpoint.)  Nothing
    runs per instruction or block elsewhere: the decoder's ``next`` is an
    instance attribute, its own bound method except for the one item after
    such a PSB.  (Objects are built as instances of the subclasses here:
    assigning ``__class__`` later, or reading ``vars()``, makes CPython
    3.11 move an object's attribute values into a dict, which slows every
    later attribute access by a third or more.)"""

    def __init__(self, out: SpoolWriter, *, head=None, tail=None,
                 done=None):
        self._out = out
        self._head = (head[0], _NEVER if head[1] is None else head[1]) \
            if head is not None else None
        self._tail = (tail[0], _NEVER if tail[1] is None else tail[1]) \
            if tail is not None else None
        self._done = done
        self._armed = False
        self._names = None
        self.dec = None
        self._idec = None
        self._sink = None
        self.checkpoints: list[Checkpoint] = []
        self.underflows: list[int] = []

    def decoder(self, plain, *args, start=None):
        """``plain(*args)`` (a block or instruction decoder) recording
        here; with ``start``, its first ``sync_forward`` synchronizes at
        the PSB at ``start``."""
        rec = self
        first = [start]

        class Recording(plain):
            def __init__(self, *a):
                plain.__init__(self, *a)
                self.next = plain.next.__get__(self)

            def sync_forward(self):
                if first[0] is not None:
                    at, first[0] = first[0], None
                    return plain.sync_set(self, at)
                return plain.sync_forward(self)

            def event(self):
                r = plain.event(self)
                if r.__class__ is tuple and r[1].status_update and \
                        not rec._armed:
                    rec._at_status_update()
                return r
        Recording.__name__ = Recording.__qualname__ = plain.__name__
        dec = Recording(*args)
        self.dec = dec
        self._idec = _insn_decoder(dec)
        self._plain_next = dec.next

        def capturing():
            offset = dec.offset
            r = rec._plain_next()
            if r.__class__ is tuple:
                rec._at_item(r[0], r[1], offset)
            return r
        self._capturing = capturing
        return dec

    def sink(self, template, write=None):
        """A copy of sink ``template`` (with ``write`` if given) that notes
        each ``RETSTACK_EMPTY`` error in :attr:`underflows` (the number of
        checkpoints recorded before it)."""
        rec = self
        plain = type(template)

        class Noting(plain):
            def error(self, kind, offset, ip, code):
                if code == E.RETSTACK_EMPTY:
                    rec.underflows.append(len(rec.checkpoints))
                plain.error(self, kind, offset, ip, code)
        Noting.__name__ = Noting.__qualname__ = plain.__name__
        sink = object.__new__(Noting)
        for k, v in vars(template).items():
            setattr(sink, k, write if k == "write" and write else v)
        self._sink = sink
        return sink

    def counts(self) -> tuple:
        s = self._sink
        return (s.insns, s.blocks, s.events, s.errors)

    # -- the hooks -----------------------------------------------------------
    def _at_status_update(self) -> None:
        at = self.dec.offset
        head, tail = self._head, self._tail
        if (head is not None and head[0] <= at) or \
                (tail is not None and tail[0] <= at):
            self._armed = True
            self.dec.next = self._capturing

    def _at_item(self, status, item, offset) -> None:
        dec = self.dec
        dec.next = self._plain_next
        self._armed = False
        pos = dec.offset
        head, tail = self._head, self._tail
        if head is not None and pos >= head[1]:
            self._head = None               # the head window is complete
        # What the session does from here on depends on the decoder's
        # state, the status and the item (its IP is the session's last_ip)
        # and the offset the item is reported at.
        if self._names is None:
            self._names = Fields(attribute_names())
        try:
            key = digest(dec, self._names, (status, offset, item))
        except Unhashable:
            key = None
        if key is not None:
            cp = Checkpoint(pos, key, tuple(self._idec.retstack._stack),
                            self._out.tell(), self.counts())
            self.checkpoints.append(cp)
        if tail is not None and pos >= tail[0] and (
                pos >= tail[1] or (key is not None and self._done is not None
                                   and self._done(cp))):
            raise Stop()
