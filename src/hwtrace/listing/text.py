"""The text listing: ptxed's lines, and with annotations a symbolized,
disassembled instruction listing.

Instruction lines::

    [OFFSET  ]["? "]IP                                   (--no-inst: ptxed)
    [OFFSET  ]["? "]IP  FUNCTION+0xOFF   DISASSEMBLY   [FILE:LINE]

``OFFSET`` with ``--offset``, ``? `` for a speculative instruction; IP
and OFFSET are 16 hex digits, as ptxed prints them.  Events, errors and
statuses are ptxed's bracketed lines (:mod:`hwtrace.flow.ptxed`); an
address-space switch is ``[process PID (COMM)]``.
"""

from __future__ import annotations

import os

from hwtrace.flow import ptxed
from hwtrace.flow.batches import SPECULATIVE

#: columns the function+offset and the disassembly are padded to
WHERE_WIDTH = 28
DISASM_WIDTH = 40


def note_text(note, lines: bool) -> str:
    """What follows the address on an annotated line."""
    if lines and note.line:
        return (f"  {note.where:<{WHERE_WIDTH}}  {note.disasm:<{DISASM_WIDTH}}"
                f"  {os.path.basename(note.file)}:{note.line}")
    return f"  {note.where:<{WHERE_WIDTH}}  {note.disasm}".rstrip()


class TextFormat:
    """``annotate``: an Annotator factory's output is used for the lines
    (None: ptxed's address-only lines, ``--no-inst``).  The remaining
    options are ptxed's / :class:`hwtrace.flow.sinks.PtxedSink`'s."""

    columns = 1

    def __init__(self, *, quiet=False, event_ip=False, event_time=False,
                 print_offset=False, show_blocks=False, block_ids=False,
                 annotate=False, lines=False):
        self.quiet = quiet
        self.event_ip = event_ip
        self.event_time = event_time
        self.print_offset = print_offset
        self.show_blocks = show_blocks and not quiet
        self.block_ids = block_ids
        self.annotate = annotate
        self.src_lines = lines
        self.lines = not quiet      # instruction lines are printed

    # -- instructions -----------------------------------------------------
    def make(self, annot, ips, sizes, iclasses, mode) -> list:
        if annot is None:
            return [b"%016x\n" % ip for ip in ips]
        notes = annot.notes(ips, sizes, iclasses, mode)
        sl = self.src_lines
        return [("%016x%s\n" % (ip, note_text(n, sl))).encode()
                for ip, n in zip(ips, notes)]

    def per_record(self, block: bool) -> bool:
        """Whether each record needs a line of its own ([block])."""
        return self.show_blocks and block

    def decorated(self, recs, block: bool):
        """Records that need record(): True for all of them."""
        if self.print_offset or (self.show_blocks and block):
            return True
        return recs["flags"] & SPECULATIVE

    def record(self, offset: int, flags: int, lines, heads, nblock):
        """A record's lines; ``nblock``: its number if it is a block
        (block decoder), else None."""
        pre = b""
        if self.print_offset:
            pre = b"%016x  " % offset
        if flags & SPECULATIVE:
            pre += b"? "
        head = b""
        if self.show_blocks and nblock is not None:
            head = b"[block %x]\n" % nblock if self.block_ids else b"[block]\n"
        if not pre:
            return head + b"".join(lines)
        return head + pre + pre.join(lines)

    # -- items ---------------------------------------------------------------
    def item(self, offset: int, item) -> bytes | None:
        t = item.type
        if t == "error":
            return (ptxed.error_line(item.offset, item.ip, item.kind,
                                     item.code) + "\n").encode()
        if t == "status":
            if item.name == "end_of_trace" and not self.quiet:
                return b"[end of trace]\n"
            return None
        if t == "space":
            sp = item.space
            if self.quiet or sp is None or sp.pid == -1:
                return None
            return f"[process {sp.label}]\n".encode()
        if self.quiet or item.status_update:
            return None
        return (ptxed.event_line(item, self.event_ip, self.event_time,
                                 offset if self.print_offset else None)
                + "\n").encode()
