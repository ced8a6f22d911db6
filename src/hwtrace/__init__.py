"""hwtrace: hardware control-flow tracing.

Collect Intel Processor Trace (real hardware through Linux perf, or an
emulation of it that observes a real execution), decode it to packets and
instruction flow, and turn it into branch records, call histories, timelines
and coverage.
"""

__version__ = "0.1.0"
