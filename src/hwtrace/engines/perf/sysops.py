"""The system calls of the perf engine, behind one small class.

:class:`SysOps` is the real thing (ctypes ``perf_event_open``, ``ioctl``,
``mmap``, fork/exec of a held workload); the engine takes any object with
the same methods, which is how its logic is tested without Intel PT.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import platform
import select
import signal

from . import abi

SYS_PERF_EVENT_OPEN = {"x86_64": 298, "i386": 336, "i686": 336}
PAGE_SIZE = mmap.PAGESIZE


class SysOps:
    """Real perf syscalls via ctypes (x86 Linux only)."""

    def __init__(self):
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self._nr = SYS_PERF_EVENT_OPEN.get(platform.machine())

    def perf_event_open(self, attr: abi.PerfEventAttr, pid: int, cpu: int,
                        group_fd: int = -1) -> int:
        if self._nr is None:
            raise OSError(errno.ENOSYS, f"perf_event_open on {platform.machine()}")
        raw = attr.pack()
        buf = ctypes.create_string_buffer(raw, len(raw))
        fd = self._libc.syscall(ctypes.c_long(self._nr), buf, ctypes.c_int(pid),
                                ctypes.c_int(cpu), ctypes.c_int(group_fd),
                                ctypes.c_ulong(abi.PERF_FLAG_FD_CLOEXEC))
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"perf_event_open: {os.strerror(e)}")
        return fd

    def ioctl(self, fd: int, request: int, arg: int = 0) -> None:
        r = self._libc.ioctl(ctypes.c_int(fd), ctypes.c_ulong(request), ctypes.c_ulong(arg))
        if r < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"ioctl {request:#x}: {os.strerror(e)}")

    def set_filter(self, fd: int, text: str) -> None:
        s = ctypes.create_string_buffer(text.encode())
        r = self._libc.ioctl(ctypes.c_int(fd), ctypes.c_ulong(abi.PERF_EVENT_IOC_SET_FILTER),
                             s)
        if r < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"PERF_EVENT_IOC_SET_FILTER {text!r}: {os.strerror(e)}")

    def mmap(self, fd: int, length: int, offset: int, writable: bool):
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=prot, offset=offset)

    def close(self, fd: int) -> None:
        os.close(fd)

    def spawn_held(self, argv, env=None, cwd=None) -> tuple[int, int]:
        """Fork a child that waits on a pipe, then execs ``argv``.

        Returns (pid, write end): writing one byte releases it.  Exec
        failure shows as exit status 127.
        """
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                                   # child
            try:
                os.close(w)
                os.read(r, 1)
                os.close(r)
                if cwd:
                    os.chdir(cwd)
                os.execvpe(argv[0], list(argv), dict(env) if env is not None else os.environ)
            except BaseException:
                pass
            os._exit(127)
        os.close(r)
        return pid, w

    def release(self, handle: int) -> None:
        os.write(handle, b"x")
        os.close(handle)

    def discard(self, handle: int) -> None:
        """Drop the release pipe without releasing (the child is killed)."""
        try:
            os.close(handle)
        except OSError:
            pass

    def wait(self, pid: int, block: bool) -> int | None:
        """Exit status (negative signal) or None if still running."""
        p, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        if p == 0:
            return None
        return os.waitstatus_to_exitcode(status)

    def kill(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def threads_of(self, pid: int) -> list[int]:
        """Thread ids of a live process (empty once it is gone)."""
        try:
            return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit())
        except OSError:
            return []

    def process_sideband(self, pid: int) -> list:
        """Process and executable maps of a running process (/proc)."""
        from .kernel import process_sideband
        return process_sideband(pid)

    def poll(self, fds, timeout: float) -> None:
        if fds:
            select.select(list(fds), [], [], timeout)
        else:
            select.select([], [], [], timeout)      # nothing to watch: just wait
