"""Who holds the device: its lock, and the collecting process's identity.

The spec's "one opener at a time" is a lock: for an engine that drives a
machine-wide resource (real Intel PT) a file lock at a fixed path in the
user's runtime directory; for the others (one device per process) an
abstract Unix socket named after the process, which the kernel releases
when the process dies -- so a collector, even a SIGKILLed one, leaves no
file behind in ``$TMPDIR``.  An explicit ``lock_path`` is always a file lock.

:func:`identity` tells a process apart from a later one with the same pid
(by its start time); trace directories keep their collector's, so
``hwtrace recover`` can tell a live recording from a dead one.
"""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
from pathlib import Path

from .errors import Status, TraceError


class Lock:
    """A held device lock; :meth:`release` (idempotent) gives it up."""

    def __init__(self, what: str, fd: int | None = None, sock: socket.socket | None = None,
                 path: Path | None = None, unlink: bool = False):
        self.what = what
        self._fd, self._sock, self._path, self._unlink = fd, sock, path, unlink

    def release(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            if self._unlink and self._path is not None:
                try:
                    self._path.unlink()
                except OSError:
                    pass


def lock_dir() -> Path:
    """The user's directory for machine-wide locks (made 0700 if missing)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    d = Path(base) / f"hwtrace-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(d)
    if not os.path.isdir(d) or os.path.islink(d) or st.st_uid != os.getuid():
        raise TraceError(Status.NO_RESOURCES, f"lock directory {d} is not this user's")
    return d


def take(engine_name: str, machine_wide: bool, lock_path=None) -> Lock:
    """The device lock for an engine; ALREADY_BOUND if another opener holds it."""
    if lock_path is not None:
        return _file_lock(Path(lock_path), unlink=False)
    if machine_wide:
        return _file_lock(lock_dir() / f"device-{engine_name}.lock", unlink=False)
    name = f"\0hwtrace-device-{os.getuid()}-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(name)
    except OSError:
        sock.close()
        raise TraceError(Status.ALREADY_BOUND,
                         f"the device is already open in this process (pid {os.getpid()})") from None
    return Lock(f"process {os.getpid()}", sock=sock)


def _file_lock(path: Path, unlink: bool) -> Lock:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise TraceError(Status.ALREADY_BOUND, f"the device is already open ({path})") from None
    return Lock(str(path), fd=fd, path=path, unlink=unlink)


def identity(pid: int) -> dict | None:
    """{"pid", "start"}: a process, told apart from a later one with the same
    pid by its start time (``/proc/PID/stat`` field 22); None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return None
        return {"pid": pid, "start": int(fields[19])}
    except (OSError, IndexError, ValueError):
        return None


def running(ident) -> int | None:
    """The pid of the process ``ident`` (an :func:`identity`) if it still runs."""
    if not isinstance(ident, dict):
        return None
    pid = ident.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    now = identity(pid)
    return pid if now is not None and now["start"] == ident.get("start") else None
