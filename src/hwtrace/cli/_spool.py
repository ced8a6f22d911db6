"""Where the views' later CPU streams wait for their turn (the I/O side of
:mod:`hwtrace.export.interleave`): chunks of activations kept in memory
up to a limit, the rest pickled to an unnamed temporary file and read
back, in order, when their stream's turn comes -- so a view's memory
stays bounded however long the streams are."""

from __future__ import annotations

import pickle
import tempfile

#: bytes of chunks kept in memory, per stream, before spooling
MEMORY = 32 << 20


def _size(chunk) -> int:
    rows = len(chunk.enters) + len(chunk.exits)
    return rows * chunk.enters.dtype.itemsize + 200 * len(chunk.markers)


class Spool:
    def __init__(self, memory: int = MEMORY):
        self.memory = memory
        self._mem: list = []
        self._used = 0
        self._file = None
        self._n = 0                 # chunks in the file

    def add(self, chunk) -> None:
        if self._file is None:
            self._used += _size(chunk)
            if self._used <= self.memory:
                self._mem.append(chunk)
                return
            self._file = tempfile.TemporaryFile(prefix="hwtrace-spool-")
        pickle.dump(chunk, self._file, pickle.HIGHEST_PROTOCOL)
        self._n += 1

    def __iter__(self):
        yield from self._mem
        self._mem = []
        f = self._file
        if f is not None:
            f.seek(0)
            for _ in range(self._n):
                yield pickle.load(f)

    def close(self) -> None:
        self._mem = []
        if self._file is not None:
            self._file.close()
            self._file = None
