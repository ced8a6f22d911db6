"""Readers of traces other tools saved, written out as hwtrace bundles.

- :mod:`.lldb`: LLDB's ``trace save`` directories (``trace.json``, Intel PT
  per thread or per CPU with perf context-switch traces).

(``perf.data`` is read by the perf engine's own importer,
:mod:`hwtrace.engines.perf.importer`.)
"""
