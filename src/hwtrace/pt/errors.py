"""Decode errors of the Intel PT layers, as values.

A :class:`PtError` is what a decoder hands back instead of a packet when
the bytes at ``offset`` cannot be decoded.  ``code`` is libipt's error
string (``pt_errstr``) so that output compares 1:1 with the reference
tools; the module-level constants name them.  Nothing in ``hwtrace.pt``
raises for bad trace data: callers test ``isinstance(x, PtError)`` (or
``x.type == "error"``).
"""

from collections import namedtuple

# libipt's pt_errstr() strings, by libipt's enum pt_error_code names.
INTERNAL = "internal error"
INVALID = "invalid argument"
NOSYNC = "decoder out of sync"
BAD_OPC = "unknown opcode"
BAD_PACKET = "unknown packet"
BAD_CONTEXT = "unexpected packet context"
EOS = "reached end of trace stream"
BAD_QUERY = "trace stream does not match query"
NOMEM = "out of memory"
BAD_CONFIG = "bad configuration"
NOIP = "no ip"
IP_SUPPRESSED = "ip has been suppressed"
NOMAP = "no memory mapped at this address"
BAD_INSN = "unknown instruction"
NO_TIME = "no timing information"
NO_CBR = "no core:bus ratio"
BAD_IMAGE = "bad image"
BAD_LOCK = "locking error"
NOT_SUPPORTED = "not supported"
RETSTACK_EMPTY = "compressed return without call"
BAD_RETCOMP = "bad compressed return"
BAD_STATUS_UPDATE = "bad status update"
NO_ENABLE = "expected tracing enabled event"
EVENT_IGNORED = "event ignored"
OVERFLOW = "overflow"
BAD_FILE = "bad file"
BAD_CPU = "unknown cpu"
# hwtrace's own: the decode reached a loop of instructions that need no
# trace (e.g. ``jmp $``) and would run forever without reading more trace
# (libipt's decoders loop there).
TRACELESS_LOOP = "endless loop without trace"


# A collections.namedtuple, not a typing.NamedTuple: every command that
# decodes imports this module, and typing costs ~3 ms of its start-up.

class PtError(namedtuple("PtError", "code offset kind", defaults=("",))):
    """A decode error: libipt's error string ``code`` (str) at trace
    ``offset`` (int).

    ``kind`` is empty for a packet decode error and ``"sync error"`` when
    re-synchronization itself failed (the oracle's ``kind`` field).
    """

    __slots__ = ()

    type = "error"

    def to_json(self) -> dict:
        d = {"offset": self.offset, "error": self.code}
        if self.kind:
            d["kind"] = self.kind
        return d

    def to_jsonl(self) -> str:
        """The compact JSON line of :meth:`to_json`."""
        import json     # only where an error is written as JSON
        return json.dumps(self.to_json(), separators=(",", ":"))
