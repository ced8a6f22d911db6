"""Waiting for a traced workload while the user may ask to stop or snapshot.

:func:`wait` blocks until the execution source's process ends, or the
session asks to stop or to take a snapshot, or one of the caller's
descriptors becomes readable (the QEMU plugin's trigger notice) -- on a
pidfd and the session's wake-up descriptor, so it reacts at once without
polling. :func:`kill_tree` ends a process with every process it started
(QEMU runs each forked guest process as a QEMU process of its own): all are
stopped first, so none forks away while the others are killed.
:func:`adopting_orphans` makes this process the one the program's orphans
are handed to, and :func:`orphan_status` reads how such a one ended (QEMU
logs no exit for a process a signal killed: unless its parent waited for
it, only its new parent can know).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from contextlib import contextmanager
from typing import NamedTuple

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


class Woken(NamedTuple):
    kind: str               # "exit", "stop", "snapshot", "notice"
    detail: object = None   # snapshot: its reason; notice: the readable descriptor


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None         # old kernel or Python: fall back to polling


def wait(proc: subprocess.Popen, session, fds=(), *, snapshots: bool = True,
         timeout: float | None = None) -> Woken:
    """What happened first: the process ended ("exit"; not reaped), a stop
    ("stop") or -- with ``snapshots`` -- a snapshot ("snapshot", its
    reason) was requested, a descriptor of ``fds`` became readable
    ("notice", the descriptor), or -- with ``timeout`` -- that many seconds
    passed ("timeout")."""
    wake = getattr(session, "wake_fd", None)
    deadline = None if timeout is None else time.monotonic() + timeout
    pidfd = _pidfd(proc.pid)
    try:
        while True:
            if session.should_stop():
                return Woken("stop", session.stop_reason)
            if snapshots:
                reason = session.snapshot_requested()
                if reason is not None:
                    return Woken("snapshot", reason)
            if _ended(proc):
                return Woken("exit")
            watch = [f for f in (pidfd, wake, *fds) if f is not None]
            poll = None if pidfd is not None and wake is not None else 0.05
            if timeout is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return Woken("timeout")
                poll = left if poll is None else min(poll, left)
            try:
                ready, _, _ = select.select(watch, [], [], poll)
            except InterruptedError:
                continue
            if wake is not None and wake in ready:
                session.drain_wake()
            for f in fds:
                if f in ready:
                    return Woken("notice", f)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _ended(proc: subprocess.Popen) -> bool:
    """Whether the process has ended, without reaping it."""
    if proc.returncode is not None:
        return True
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


@contextmanager
def adopting_orphans():
    """Inside: this process is a child subreaper -- a process the traced
    program started and left (its parent ended without waiting for it)
    becomes a child of ours, so that :func:`orphan_status` can read its
    end.  The setting before is restored after (the processes adopted
    meanwhile stay ours)."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        before = ctypes.c_int(0)
        ok = libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(before), 0, 0, 0) == 0 \
            and libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        ok = False
    try:
        yield
    finally:
        if ok and not before.value:
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def orphan_status(pid: int, *, block: bool = False) -> int | None:
    """How ``pid`` ended -- its exit code, or minus the signal that killed
    it -- if it is a child of ours that has ended (it is reaped; with
    ``block``, once it has); None if it is not ours (never adopted, or
    already reaped) or still runs."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | (0 if block else os.WNOHANG))
    except (ChildProcessError, OSError):
        return None
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _children() -> dict[int, list[int]]:
    """ppid -> its children, of every process there is."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return children
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    return children


def own_children() -> set[int]:
    """This process's children (ended ones not yet reaped included)."""
    return set(_children().get(os.getpid(), ()))


class Adopted:
    """A process handed to us (:func:`adopting_orphans`), for :func:`wait`."""
    returncode = None

    def __init__(self, pid: int):
        self.pid = pid


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started that still run (children first)."""
    children = _children()
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in out:
                out.append(c)
                todo.append(c)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants, stopping them all first."""
    stopped: list[int] = []
    for _ in range(16):
        new = [p for p in [pid, *descendants(pid)] if p not in stopped]
        if not new:
            break
        for p in new:
            _signal(p, signal.SIGSTOP)
            stopped.append(p)
    for p in stopped:
        _signal(p, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
