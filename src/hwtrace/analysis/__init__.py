"""From decoded flow to what a person looks at: call stacks, per-function
totals, coverage, symbols.

Input contract
--------------

Per stream (one per thread, or one per CPU in cpu mode), in decode order:

* batches (:mod:`hwtrace.flow.batches`, docs/pipeline.md), decoded with
  every branch ending a record (``Stream.batches(view=True)``): what
  every view reads from a trace (:meth:`.callstack.CallStackBuilder.feed_batch`);
* or flow *items*, each equivalent to one line of ``ptoracle insn``
  (``/work/shared/oracle/ptoracle.c``; names are libipt's): instructions
  ``{ip, size, iclass, ...}``, events ``{event, offset, ip_suppressed,
  [tsc], ...}``, statuses ``{status, offset}``, errors ``{error, kind,
  offset, [ip]}`` -- dicts, or objects with those attributes (the flow
  decoder's own records plug in as they are); see :mod:`.flowitems`.
  :mod:`.itemflow` groups them into the same records;
* or branch records (spec/branch-trace.md: pid, tid, kind, from, to,
  time): :func:`.callstack.reconstruct_branches`.

Per-stream context: :class:`.records.StreamInfo` (pid/tid/cpu; a stream
with a ``cpu`` and no ``tid`` is a CPU's: with the recording's context
switches, ``StreamInfo.switches``, its call stacks follow the threads, one
stack each, every slice carrying its thread's pid/tid; without them
tracing resuming elsewhere after an asynchronous exit is a gap) and a
symbolizer callback ``lookup(addr) -> (function start, name) | None``
(:meth:`.symbols.Symbolizer.lookup`; over a Symbolizer its symbol tables
are searched as arrays, :mod:`.symtable`).

Output
------

:class:`.slices.Slices` chunks: activations begun and ended, in numpy
columns (no Python object per activation), and :class:`Marker` s (gap,
overflow, error, lost).  :func:`.callstack.reconstruct` gives the same as
:class:`Enter` / :class:`Activation` / :class:`Marker` objects, for small
inputs.  Memory is bounded (stack depth, rows waiting for a time, symbol
tables).  Views narrowed to a question: :mod:`.window`; totals:
:mod:`.profile`; coverage: :mod:`.coverage`.
"""

from hwtrace import _lazy_exports
from hwtrace.analysis.records import (Activation, Enter, Flag, Marker,
                                      StreamInfo)

# The call-stack builder (numpy and the symbol tables with it) is imported
# when first asked for: what only needs the records (a stream's StreamInfo,
# decode's counts) starts faster.
__getattr__, __dir__ = _lazy_exports(
    dict.fromkeys(("CallStackBuilder", "reconstruct", "reconstruct_branches"),
                  "hwtrace.analysis.callstack"), globals())


__all__ = ["Activation", "CallStackBuilder", "Enter", "Flag", "Marker",
           "StreamInfo", "reconstruct", "reconstruct_branches"]
