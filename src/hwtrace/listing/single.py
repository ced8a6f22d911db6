"""Annotations one instruction at a time, for the session sinks
(:class:`hwtrace.flow.sinks.PtxedSink`, :class:`~hwtrace.flow.sinks.JsonSink`)
that the parallel decoder (``--jobs``, ``--dask``) drives in its worker
processes: the same text the batch listing prints, so a parallel decode's
output is the sequential one.

:class:`InsnNotes` is picklable: it carries the command line's images
and options and builds its image and annotator where it runs.
"""

from __future__ import annotations

from hwtrace.flow.batches import MODE_NUMBER


class InsnNotes:
    """``kind`` "text" (what follows the address on a line) or "jsonl"
    (the optional keys)."""

    def __init__(self, images, kind: str = "text", *, lines: bool = False,
                 syntax: str = "intel"):
        self.images = list(images)
        self.kind = kind
        self.lines = lines
        self.syntax = syntax
        self._annot = None
        self._memo: dict = {}

    def __getstate__(self):
        return {"images": self.images, "kind": self.kind,
                "lines": self.lines, "syntax": self.syntax}

    def __setstate__(self, state):
        self.__init__(state["images"], state["kind"], lines=state["lines"],
                      syntax=state["syntax"])

    def _annotator(self):
        if self._annot is None:
            from hwtrace.jobs import load_image
            from .annotate import Annotator, SymbolFiles, image_arg_symbols
            files = SymbolFiles()
            image = load_image(self.images)
            sym = files.symbolizer([image_arg_symbols(files, k, a)
                                    for k, a in self.images])
            self._annot = Annotator(image.read, sym, lines=self.lines,
                                    syntax=self.syntax)
        return self._annot

    def __call__(self, ip: int, size: int, iclass: int, mode) -> str:
        """The annotation of the instruction (``mode``: libipt's name,
        "64bit", or None)."""
        key = (ip, mode)
        s = self._memo.get(key)
        if s is None:
            m = MODE_NUMBER.get(mode, 0)
            note = self._annotator().notes([ip], [size], [int(iclass)], m)[0]
            if self.kind == "text":
                from .text import note_text
                s = note_text(note, self.lines)
            else:
                from .jsonl import note_fields
                s = note_fields(note, self.lines)
            self._memo[key] = s
        return s
