"""Branch tracing (spec/branch-trace.md): call/return/branch records with
filter masks and trigger windows, from a live process (the ptrace stepper)
or from any decoded trace, through one record type, one mask and one
trigger model.

Modules: :mod:`.records` (``Branch``, ``KINDS``, ``to_array``, ``iter_arrays``),
:mod:`.classify` (instruction + target -> kind), :mod:`.mask`
(``MaskSpec``/``Mask``, ``parse_kinds``), :mod:`.triggers`
(``TriggerSpec``/``Trigger``), :mod:`.resolve` (symbols/addresses as the
user writes them, ``SymbolNotFound``), :mod:`.tracker` (the shared state
machine), :mod:`.live` (``trace_live``), :mod:`.decoded`
(``decoded_records``), :mod:`.calls` (the indented call history).

    from hwtrace.branches import trace_live, decoded_records, TriggerSpec, MaskSpec
    run = trace_live(["./prog"], tmpdir, TriggerSpec(within="fib"))
    for r in run.records(): print(r.kind, hex(r.from_), hex(r.to))
"""

from __future__ import annotations

from .mask import Mask, MaskSpec, parse_kinds
from .records import ALL_KINDS, KINDS, Branch, iter_arrays, to_array
from .resolve import SymbolNotFound
from .triggers import Trigger, TriggerSpec

__all__ = ["ALL_KINDS", "KINDS", "Branch", "Mask", "MaskSpec", "SymbolNotFound",
           "Trigger", "TriggerSpec", "decoded_records", "iter_arrays", "parse_kinds",
           "to_array", "trace_live"]


def __getattr__(name):
    if name == "trace_live":
        from .live import trace_live
        return trace_live
    if name == "decoded_records":
        from .decoded import decoded_records
        return decoded_records
    raise AttributeError(name)
