"""The JSON-lines listing: ptoracle's ``insn`` schema (what
:class:`hwtrace.flow.sinks.JsonSink` writes), byte for byte.

An instruction is ``{"ip":..,"size":..,"iclass":..,"mode":..,
"speculative":..}`` plus ``"truncated":true`` on a truncated one and
``"offset"`` with ``--offset``.  With annotations (``--annotate``) the
optional ``"function"``, ``"function_offset"``, ``"disasm"`` and, with
``--lines``, ``"file"``/``"line"`` keys follow ``"iclass"`` where known.
"""

from __future__ import annotations

import json

from hwtrace.flow.batches import MODE_NAME, SPECULATIVE, TRUNCATED
from hwtrace.flow.sinks import event_json
from hwtrace.x86.insn import IClass

_ICLASS = {int(c): c.oracle_name for c in IClass}
_SEP = (",", ":")


def note_fields(note, lines: bool) -> str:
    """The annotation keys of one instruction (leading comma), or ""."""
    out = ""
    if note.function:
        out += ',"function":%s,"function_offset":%d' % (
            json.dumps(note.function), note.function_offset)
    out += ',"disasm":%s' % json.dumps(note.disasm)
    if lines and note.line:
        out += ',"file":%s,"line":%d' % (json.dumps(note.file), note.line)
    return out


def insn_head(ip: int, size: int, iclass: int, mode: int,
              extra: str = "") -> str:
    """An instruction's line up to its ``"speculative":`` value."""
    return '{"ip":%d,"size":%d,"iclass":"%s"%s,"mode":"%s","speculative":' % (
        ip, size, _ICLASS.get(iclass, "unknown"), extra,
        MODE_NAME.get(mode) or "unknown")


def insn_tail(speculative: bool, truncated: bool, offset: int | None) -> str:
    s = "true" if speculative else "false"
    if truncated:
        s += ',"truncated":true'
    if offset is not None:
        s += ',"offset":%d' % offset
    return s + "}\n"


class JsonFormat:
    """``annotate``/``lines`` add the optional keys."""

    columns = 2         # whole lines, and heads for decorated records
    lines = True

    def __init__(self, *, print_offset=False, quiet=False, annotate=False,
                 lines=False):
        self.print_offset = print_offset
        self.quiet = quiet          # no [process] objects
        self.annotate = annotate
        self.src_lines = lines

    def make(self, annot, ips, sizes, iclasses, mode):
        if annot is None:
            extras = [""] * len(ips)
        else:
            sl = self.src_lines
            extras = [note_fields(n, sl)
                      for n in annot.notes(ips, sizes, iclasses, mode)]
        heads = [insn_head(ip, s, c, mode, x).encode()
                 for ip, s, c, x in zip(ips, sizes, iclasses, extras)]
        return [h + b"false}\n" for h in heads], heads

    def per_record(self, block: bool) -> bool:
        return False

    def decorated(self, recs, block: bool):
        if self.print_offset:
            return True
        return recs["flags"] & (SPECULATIVE | TRUNCATED)

    def record(self, offset: int, flags: int, lines, heads, nblock: int):
        off = offset if self.print_offset else None
        spec = bool(flags & SPECULATIVE)
        tail = insn_tail(spec, False, off).encode()
        if not flags & TRUNCATED:
            return tail.join(heads) + tail
        last = heads[-1] + insn_tail(spec, True, off).encode()
        if len(heads) == 1:
            return last
        return tail.join(heads[:-1]) + tail + last

    def item(self, offset: int, item) -> bytes | None:
        t = item.type
        if t == "error":
            d = {"error": item.code, "kind": item.kind,
                 "offset": item.offset, "ip": item.ip}
        elif t == "status":
            d = {"status": item.name, "offset": item.offset}
            if item.ip_suppressed is not None:
                d["ip_suppressed"] = item.ip_suppressed
        elif t == "space":
            sp = item.space
            if self.quiet or sp is None or sp.pid == -1:
                return None
            d = {"process": sp.pid, "comm": sp.comm, "cr3": sp.cr3,
                 "offset": item.offset}
        else:
            d = event_json(item, offset)
        return (json.dumps(d, separators=_SEP) + "\n").encode()
