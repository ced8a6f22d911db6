"""LLDB's saved Intel PT traces (``trace save``): :mod:`.description`
checks ``trace.json``, :mod:`.switches` reads the per-CPU context-switch
traces, :mod:`.importer` writes the bundle."""

from .importer import (ImportResult, LldbTraceError, import_lldb_trace,
                       is_trace_json)

__all__ = ["ImportResult", "LldbTraceError", "import_lldb_trace",
           "is_trace_json"]
