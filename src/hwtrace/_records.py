"""Record classes for what every command creates at start-up, without
dataclasses: creating a dataclass runs its generated methods through the
compiler (~1-2 ms each, frozen ones the most) and importing
:mod:`dataclasses` pulls in inspect, ast, dis and tokenize (~10 ms) --
together most of a small command's own start-up.

- :class:`Fields` (base of mutable records): equality field by field
  over ``_fields``, a repr naming them, unhashable, :meth:`Fields.replace`
  -- a mutable dataclass's behaviour.
- :class:`Typed` (mixed into a ``collections.namedtuple`` subclass,
  before it): equal only to a record of the same type -- a frozen
  dataclass's equality, which a bare NamedTuple lacks (two record types
  with the same values would compare equal as tuples).
"""

from __future__ import annotations


class Fields:
    """A mutable record: subclasses set ``_fields`` (the names, in order)
    and an ``__init__`` taking them as keywords."""

    __slots__ = ()
    _fields: tuple = ()

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n)
                   for n in self._fields)

    __hash__ = None         # mutable: unhashable, as a dataclass

    def __repr__(self) -> str:
        return "%s(%s)" % (self.__class__.__qualname__, ", ".join(
            f"{n}={getattr(self, n)!r}" for n in self._fields))

    def replace(self, **changes):
        """A copy with ``changes`` (as dataclasses.replace: the other
        fields' values are shared, not copied)."""
        kw = {n: getattr(self, n) for n in self._fields}
        for n in changes:
            if n not in kw:
                raise TypeError(f"{self.__class__.__name__} has no field "
                                f"{n!r}")
        kw.update(changes)
        return self.__class__(**kw)


class Typed:
    """Mixed into a namedtuple subclass (listed before it): equal only to
    the same type's records with the same values."""

    __slots__ = ()

    def __eq__(self, other):
        return other.__class__ is self.__class__ and tuple.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = tuple.__hash__
