"""Where the views' later CPU streams wait for their turn (the I/O side of
:mod:`hwtrace.export.interleave`): chunks of activations kept in memory
up to a limit, the rest pickled to an unnamed temporary file and read
back, in order, when their stream's turn comes -- so a view's memory
stays bounded however long the streams are.  What goes to the file is
packed first (:mod:`hwtrace.analysis.packed`: on a system-call-dense
recording half the bytes, and writing and reading them back cost more
than packing)."""

from __future__ import annotations

import pickle

from hwtrace.analysis.packed import pack, unpack

#: bytes of chunks kept in memory, per stream, before spooling
MEMORY = 32 << 20


def _temporary(prefix: str):
    """An unnamed temporary file (tempfile, and shutil and random with it,
    imported only by a view that spills: ~3 ms of every start-up else)."""
    import tempfile
    return tempfile.TemporaryFile(prefix=prefix)


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
            self._file = _temporary("hwtrace-spool-")
        pickle.dump(pack(chunk), self._file, pickle.HIGHEST_PROTOCOL)
        self._n += 1

    def __iter__(self):
        yield from self._mem
        self._mem = []
        f = self._file
        if f is not None:
            f.seek(0)
            for _ in range(self._n):
                yield unpack(pickle.load(f))

    def close(self) -> None:
        self._mem = []
        if self._file is not None:
            self._file.close()
            self._file = None


class TextSpools:
    """Where ``calls``' later threads' sections wait for their turn (the
    ``hold`` of :class:`hwtrace.branches.threadcalls.ThreadCalls`): each
    call makes a sink taking text (str, or UTF-8 bytes) in order; all of
    them together keep up to ``memory`` bytes in memory, the rest goes to
    one unnamed temporary file and is read back, in order, when the
    sink's turn comes."""

    def __init__(self, memory: int = MEMORY):
        self.memory = memory
        self.used = 0
        self.file = None

    def __call__(self) -> "_TextSpool":
        return _TextSpool(self)

    def _spill(self, part) -> tuple:
        """Part to the file: (is bytes, offset, length)."""
        if self.file is None:
            self.file = _temporary("hwtrace-calls-")
        f = self.file
        f.seek(0, 2)
        raw = isinstance(part, bytes)
        data = part if raw else part.encode("utf-8", "surrogatepass")
        at = f.tell()
        f.write(data)
        return (raw, at, len(data))


class _TextSpool:
    encoding = "utf-8"

    def __init__(self, pool: TextSpools):
        self._pool = pool
        self._parts: list = []          # text, or (is bytes, offset, length)
        self.buffer = self

    def write(self, part) -> None:
        if not part:
            return
        pool = self._pool
        if pool.used + len(part) <= pool.memory:
            pool.used += len(part)
            self._parts.append(part)
        else:
            self._parts.append(pool._spill(part))

    def flush(self) -> None:
        pass

    def __iter__(self):
        pool = self._pool
        for p in self._parts:
            if isinstance(p, tuple):
                raw, at, n = p
                f = pool.file
                f.seek(at)
                data = f.read(n)
                yield data if raw else data.decode("utf-8", "surrogatepass")
            else:
                yield p

    def close(self) -> None:
        pool = self._pool
        for p in self._parts:
            if not isinstance(p, tuple):
                pool.used -= len(p)
        self._parts = []
