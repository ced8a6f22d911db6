"""From decoded flow to what a person looks at: call stacks, per-function
totals, coverage, symbols.

Input contract (what the flow decoder hands us)
----------------------------------------------

Per stream (one per thread, or one per CPU in cpu mode) an iterable of
*items* in decode order, each equivalent to one line of
``ptoracle insn`` (``/work/shared/oracle/ptoracle.c``; names are libipt's):

* instruction ``{ip, size, iclass, mode, speculative}``; ``iclass`` one of
  ``other call return jump cond_jump far_call far_return far_jump ptwrite
  indirect unknown``;
* event ``{event, offset, ip_suppressed, [tsc], ...variant fields}`` with
  ``event`` one of libipt's names (``enabled`` [ip, resumed], ``disabled``
  [ip], ``async_disabled`` [at, ip], ``async_branch`` [from, to],
  ``overflow`` [ip], ``tsx`` [speculative, aborted], ``exec_mode``,
  ``tick``, ``stop``, ``paging``, ``cbr``, ...); ``tsc`` where the
  event carries a timestamp (a value repeated from the previous event is
  taken as "no new timing"); ``status_update`` events (PSB+ restating
  the state) change nothing;
* status ``{status, offset}`` (``end_of_trace``, ``resynced``,
  ``resync_stalled``);
* error ``{error, kind, offset, [ip]}``.

Each item may be a ``dict`` (as parsed from the JSON) or any object with
attributes of those names; enums are accepted for ``iclass``/``event``
(their name, lower-cased, libipt prefix removed), and the flow decoder's
own records plug in as they are (``FlowInsn.iclass_name``, ``Event.type``
with ``has_tsc``/``ip_suppressed``/``from_``).  See :mod:`.flowitems`.
The CLI's bridge from ``hwtrace.flow.session``'s sink protocol is
:mod:`hwtrace.export.source`.  Per-stream context: :class:`.records.StreamInfo`
(pid/tid/cpu from the bundle manifest; a stream with a ``cpu`` and no
``tid`` is a CPU's: with the recording's context switches
(``StreamInfo.switches``: the bundle's ``Switch`` sideband records) its call stacks follow the threads, one stack each (slices
``SWITCHED_OUT``/``SWITCHED_IN`` where a thread leaves and comes back);
without them tracing resuming elsewhere after an asynchronous exit is
taken as a context switch, a gap) and a symbolizer callback
``lookup(addr) -> (function start, name) | None`` (e.g.
:meth:`.symbols.Symbolizer.lookup`).

The simpler branch-record stream of ``spec/branch-trace.md`` (pid, tid,
kind, from, to, time, depth) is accepted too:
:func:`.callstack.reconstruct_branches`.

Output
------

:func:`.callstack.reconstruct` yields, in execution order, :class:`Enter`
(an activation begins), :class:`Activation` (it ended: function start,
name, depth, begin/end time and instruction index, callee totals, flags
such as ``TRUNCATED``) and :class:`Marker` (gap, overflow, error).
Memory is bounded (stack depth, clock queue, symbol cache).
"""

from hwtrace.analysis.callstack import (CallStackBuilder, reconstruct,
                                        reconstruct_branches)
from hwtrace.analysis.records import (Activation, Enter, Flag, Marker,
                                      StreamInfo)

__all__ = ["Activation", "CallStackBuilder", "Enter", "Flag", "Marker",
           "StreamInfo", "reconstruct", "reconstruct_branches"]
