"""Output files that appear whole or not at all.

An export of a long recording can take minutes, and a user may stop it
with Ctrl-C, or it may end on an error (a bundle's file missing half-way,
a full disk).  Written in place, what it left was a file cut anywhere: a
Chrome JSON that no viewer opens, a Perfetto protobuf cut in a message, a
folded or drcov file whose totals are silently short -- over the good file
of an earlier run, which was gone.

:class:`OutFile` writes a regular file's bytes to a temporary file beside
it (same directory, so same file system) and renames it into place only
when the writer says the output is whole (:meth:`OutFile.commit`);
otherwise (:meth:`OutFile.discard`, or leaving a ``with`` block on an
exception, KeyboardInterrupt included) the temporary file is removed and
the path is as it was.  Where that can't be (the path is a device, a
FIFO or a terminal: ``/dev/null``, ``/dev/stdout``, a named pipe; or its
directory can't take a new file), the file is written in place as
before.
"""

from __future__ import annotations

import os
import stat

from hwtrace.cli import CliError


class OutFile:
    """``path`` opened for writing (``mode`` ``"w"`` or ``"wb"``): a file
    object in :attr:`f`, the output's own bytes only once committed."""

    def __init__(self, path, mode: str, buffering: int = 1 << 20):
        self.path = os.fspath(path)
        self._tmp: str | None = None
        if os.path.isdir(self.path):
            raise CliError(f"cannot write {self.path}: is a directory")
        target = os.path.realpath(self.path)     # a symlink's file, not the link
        try:
            st = os.stat(target)
        except OSError:
            st = None
        if st is None or stat.S_ISREG(st.st_mode):
            head, tail = os.path.split(target)
            tmp = os.path.join(head, f".{tail}.hwtrace-{os.getpid()}.tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o666 if st is None else stat.S_IMODE(st.st_mode))
            except OSError:
                pass                    # no new file there: write in place
            else:
                if st is not None:
                    os.fchmod(fd, stat.S_IMODE(st.st_mode))     # not masked by umask
                self._tmp, self._target = tmp, target
                self.f = os.fdopen(fd, mode, buffering=buffering)
                return
        try:
            self.f = open(self.path, mode, buffering=buffering)
        except OSError as e:
            raise CliError(f"cannot write {self.path}: {e.strerror}") from None

    def commit(self) -> None:
        """The output is whole: close it and put it at its path."""
        if self.f.closed and self._tmp is None:
            return
        try:
            self.f.close()
        except OSError as e:
            self.discard()
            raise CliError(f"cannot write {self.path}: {e.strerror}") from None
        if self._tmp is not None:
            tmp, self._tmp = self._tmp, None
            try:
                os.replace(tmp, self._target)
            except OSError as e:
                _unlink(tmp)
                raise CliError(f"cannot write {self.path}: {e.strerror}") from None

    def discard(self) -> None:
        """Not whole: close it, and leave the path as it was (where the
        bytes went to a temporary file)."""
        try:
            self.f.close()
        except OSError:
            pass
        if self._tmp is not None:
            _unlink(self._tmp)
            self._tmp = None

    def __enter__(self):
        return self.f

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
        else:
            self.discard()
        return False


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
