"""The QEMU user-mode execution source: build the TCG plugin, run a program.

The plugin (``qemu_plugin.c``, shipped with the package) is compiled with
gcc at first use into ``$XDG_CACHE_HOME/hwtrace/`` (default
``~/.cache/hwtrace``), named by the hash of its source, so a changed plugin
is rebuilt and concurrent first uses don't clash (atomic rename).

The plugin keeps each guest thread's not-yet-written records in a file
next to the log (``LOG.buf.PID.TID``, mapped shared), so they survive
QEMU dying without its exit callback (an uncaught guest signal, SIGKILL).
:func:`merge_buffers` appends what they hold to the log; :func:`spawn`'s
process does it once QEMU has ended, before ``wait`` returns.
"""

from __future__ import annotations

import glob
import mmap
import os
import struct
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from .buildcache import BuildError, build, cache_dir

PLUGIN_SOURCE = Path(__file__).with_name("qemu_plugin.c")
#: compiled together with it; with the header, what the build is named after
PLUGIN_SOURCES = tuple(PLUGIN_SOURCE.with_name(f"qemu_plugin{part}.c")
                       for part in ("", "_ctl", "_elf", "_exec", "_guest", "_insn"))
PLUGIN_HEADERS = tuple(PLUGIN_SOURCE.with_name(f"qemu_plugin_{part}.h")
                       for part in ("api", "ctl", "elf", "exec", "guest", "insn"))
QEMU = "qemu-x86_64"


class QemuError(RuntimeError):
    """The QEMU engine cannot run here (one line, for the user)."""


def plugin_path() -> Path:
    """The built plugin, compiling it first if needed (QemuError, one
    line, when the build cache can't be read or written)."""
    try:
        return _plugin_path()
    except OSError as e:
        where = e.filename or cache_dir()
        raise QemuError(f"the QEMU plugin cache {where}: {e.strerror} "
                        f"(set XDG_CACHE_HOME to a writable directory)") from None


def _plugin_path() -> Path:
    try:
        return build("qemu_plugin", [*PLUGIN_SOURCES, *PLUGIN_HEADERS],
                     ["-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall",
                      *map(str, PLUGIN_SOURCES), "-lpthread"], suffix=".so")
    except BuildError as e:
        if e.missing_gcc:
            raise QemuError("the QEMU engine needs gcc to build its plugin "
                            "(apt-get install gcc)") from None
        raise QemuError(f"building the QEMU plugin failed: {e}") from None


def qemu_binary() -> str:
    exe = shutil.which(QEMU)
    if exe is None:
        raise QemuError(f"the QEMU engine needs {QEMU} (apt-get install qemu-user)")
    return exe


@dataclass(frozen=True)
class Program:
    """A program ready to run: the argv to hand to qemu (after scripts'
    interpreters are resolved) and the ELF that is executed first."""
    argv: list[str]
    elf: str


def resolve_program(argv: list[str]) -> Program:
    """Find the program as the shell would and check it is x86-64 Linux.

    Raises QemuError with one line when it doesn't exist or can't run.
    """
    if not argv:
        raise QemuError("no program given")
    name = argv[0]
    path = name if "/" in name else shutil.which(name)
    if path is None or not os.path.exists(path):
        raise QemuError(f"{name}: no such program")
    if os.path.isdir(path):
        raise QemuError(f"{name}: is a directory")
    if not os.access(path, os.X_OK):
        raise QemuError(f"{name}: permission denied")
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError as e:
        raise QemuError(f"{name}: {e.strerror}") from None
    if head.startswith(b"#!"):
        line = head[2:].split(b"\n", 1)[0].strip().decode(errors="replace")
        parts = line.split(None, 1)
        if not parts:
            raise QemuError(f"{name}: bad interpreter line")
        inner = resolve_program([parts[0]])
        return Program(inner.argv + parts[1:] + [path] + argv[1:], inner.elf)
    check_elf(head, name)
    return Program([path] + argv[1:], path)


def check_elf(head: bytes, name: str) -> None:
    if head[:4] != b"\x7fELF":
        raise QemuError(f"{name}: not an executable (no ELF header)")
    if head[4] != 2 or head[5] != 1:
        raise QemuError(f"{name}: not an x86-64 Linux program (not 64-bit little-endian ELF)")
    machine = int.from_bytes(head[18:20], "little")
    if machine != 62:
        raise QemuError(f"{name}: not an x86-64 program (ELF machine {machine})")
    etype = int.from_bytes(head[16:18], "little")
    if etype not in (2, 3):
        raise QemuError(f"{name}: not an executable ELF (type {etype})")


def command(program: Program, log_path: str | os.PathLike,
            control: "Control | None" = None) -> list[str]:
    """The qemu-user command line that runs ``program`` writing ``log_path``
    (made absolute: the buffer files go next to it whatever QEMU's cwd);
    with ``control``, the recorder can stop the logging mid-run and the
    plugin stops it at ``control``'s triggers."""
    arg = f"{plugin_path()}"
    if control is not None:
        arg += f",ctl={control.path},fifo={control.fifo}"
        for name in control.triggers:
            if not name or any(c in name for c in ",= \t\n\0"):
                raise QemuError(f"bad trigger symbol name {name!r}")
            arg += f",trigger={name}"
    arg += f",out={os.path.abspath(log_path)}"      # last: the rest of the argument
    return [qemu_binary(), "-plugin", arg, "--", *program.argv]


def log_of(cmd: list[str]) -> str | None:
    """The execution log a :func:`command` line writes (None: not one)."""
    for i, a in enumerate(cmd[:-1]):
        if a == "-plugin" and ",out=" in cmd[i + 1]:
            return cmd[i + 1].rsplit(",out=", 1)[1]
    return None


# ---- the page shared with the plugin (struct hwctl in qemu_plugin.c) ----
CTL_MAGIC = b"HWXC"
CTL_HEADER = struct.Struct("<4sIIIIIQ128sII")  # magic, version, stop, fired, pid, tid, pc, name, tty, recorder
_CTL_TTY = 160


class Fired(NamedTuple):
    """Where a trigger fired: the process, thread, entry address, symbol."""
    pid: int
    tid: int
    pc: int
    name: str


class Control:
    """The recorder's side of the control page (``LOG.ctl``) and the FIFO
    (``LOG.fifo``) the plugin writes a byte to when a trigger fires
    (:attr:`fd` becomes readable). :meth:`stop` ends the logging of every
    process of the run; the program runs on."""

    def __init__(self, log_path: str | os.PathLike, triggers=()):
        base = os.path.abspath(log_path)
        self.path, self.fifo = base + ".ctl", base + ".fifo"
        self.triggers = tuple(triggers)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, CTL_HEADER.pack(CTL_MAGIC, 1, 0, 0, 0, 0, 0, b"", 0, os.getpid()).ljust(_PAGE, b"\0"))
            self._map = mmap.mmap(fd, _PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        os.mkfifo(self.fifo, 0o600)
        # a reader held open: the plugin's non-blocking open for writing works
        self.fd = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)

    def stop(self) -> None:
        struct.pack_into("<I", self._map, 8, 1)

    def fired(self) -> Fired | None:
        _, _, _, fired, pid, tid, pc, name, _, _ = CTL_HEADER.unpack_from(self._map, 0)
        if not fired:
            return None
        return Fired(pid, tid, pc, name.split(b"\0", 1)[0].decode(errors="replace"))

    def tty_signal(self) -> int:
        """The signal (SIGINT, SIGHUP) from the terminal, or sent from outside
        the program, that stopped the logging, or 0."""
        return struct.unpack_from("<I", self._map, _CTL_TTY)[0]

    def drain(self) -> None:
        try:
            while os.read(self.fd, 64):
                pass
        except OSError:
            pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._map.close()


# ---- the plugin's buffer files (struct shdr in qemu_plugin.c) ----
BUF_MAGIC = b"HWXB"
BUF_HEADER = struct.Struct("<4sIQQQIII")   # magic, version, valid, hdr_end, flush_at, flushing, pid, tid
BUF_DATA = 4096                            # the records start here
_PAGE = 4096
_U32 = struct.Struct("<I")
_CHUNK_TIME = 14                           # CTX (1+12), then TIME's u64


def buffer_files(log_path: str | os.PathLike) -> list[Path]:
    log = Path(log_path)
    return sorted(log.parent.glob(glob.escape(log.name) + ".buf.*"))


def program_started(log_path: str | os.PathLike) -> bool:
    """Whether the plugin has logged a block the program ran: records
    follow the log's header, or a thread's buffer holds an EXEC record (the
    block after the first began).  A buffer file alone is not enough: the
    plugin makes it before the first block's record, and that record (an
    EXEC_PART) counts no instruction until the next block starts -- a
    ``--duration 0`` that stopped there recorded nothing."""
    from .execlog import HEADER, T_EXEC
    from .salvage import record_size
    try:
        if os.path.getsize(log_path) > HEADER.size:
            return True
    except OSError:
        pass
    for path in buffer_files(log_path):
        try:
            got = _pending(path, live=True)
        except OSError:
            continue
        if got is None:
            continue
        data, off = got[0], 0
        while off < len(data):
            if data[off] == T_EXEC:
                return True
            n = record_size(data, off)
            if not n:
                break
            off += n
    return False


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _pending(path: Path, live: bool = False) -> tuple[bytes, int, int] | None:
    """(records not in the log, flushing, flush_at) of one buffer file;
    None if it holds none (or is not a buffer file).  ``live``: its thread
    may still be writing it: what was read counts only if the chunk was
    not flushed and restarted meanwhile (the header read again agrees)."""
    with open(path, "rb") as f:
        head = f.read(BUF_HEADER.size)
        if len(head) < BUF_HEADER.size:
            return None
        magic, version, valid, hdr_end, flush_at, flushing, _pid, _tid = BUF_HEADER.unpack(head)
        if magic != BUF_MAGIC or version != 1 or not 0 < hdr_end < valid:
            return None
        f.seek(BUF_DATA)
        data = f.read(valid)
        if live:
            if flushing:
                return None
            f.seek(0)
            again = BUF_HEADER.unpack(f.read(BUF_HEADER.size))
            f.seek(BUF_DATA)
            if again[5] or again[2] < valid or f.read(hdr_end) != data[:hdr_end]:
                return None
    if len(data) != valid:
        return None
    data = _whole_records(data)
    if len(data) <= hdr_end:
        return None
    return data, flushing, flush_at


def _whole_records(chunk: bytes) -> bytes:
    """A buffer's published records (``chunk``) as the log can take them.
    The plugin publishes whole records but for one window: when a block
    finishes, its id joins the open EXEC record, whose count is raised
    before the new end is published (two stores that can't be one), so a
    kill there (or a live read) finds the count one above the ids
    published.  That record keeps the ids present, with their count (none:
    it goes); anything after the last whole record is cut off."""
    from .execlog import T_EXEC
    from .salvage import record_size    # the execution log's record walker
    off, end = 0, len(chunk)
    while off < end:
        n = record_size(chunk, off)
        if n is None:
            break
        if off + n > end:
            ids, rest = divmod(end - off - 5, 4)
            if chunk[off] == T_EXEC and ids > 0 and rest == 0:
                return chunk[:off + 1] + _U32.pack(ids) + chunk[off + 5:]
            break
        off += n
    return chunk[:off]


def _place(log, chunk: bytes, flush_at: int) -> tuple[int, int] | None:
    """Where an interrupted append of ``chunk`` left the log ``log``
    (bytes-like): None if all of it is there; else (offset, written): the
    chunk goes at ``offset`` replacing the ``written`` bytes of it already
    there (a write cut by the kill stops at a page boundary)."""
    size = len(log)
    head = chunk[:_CHUNK_TIME + 8]             # CTX + TIME: unique per chunk
    at = log.find(head, min(flush_at, size)) if flush_at <= size else -1
    if at < 0:
        tail = bytes(log[flush_at:]) if flush_at < size else b""
        if tail and chunk.startswith(tail):
            return flush_at, len(tail)         # cut inside the chunk's header
        return size, 0                         # never written
    if log[at:at + len(chunk)] == chunk:
        return None
    n = min(len(chunk), size - at)
    same = len(head)
    while same < n and log[at + same] == chunk[same]:
        same += 1
    if at + same == size:
        return at, same                        # cut at the end of the log
    # Other processes appended after the cut, which is at a page boundary
    # (the common prefix may run a few bytes into what follows).
    written = (at + same) // _PAGE * _PAGE - at
    return at, written if written >= len(head) else same


def _drop_cut_record(f, anywhere: bool = False) -> None:
    """A kill can cut the last write to the log (a BLOCK record, a chunk)
    at a page boundary: if the log ends on one, cut it back to its last
    whole record, so what is appended is not read as part of it.  (A chunk
    cut this way is appended again whole by merge_buffers.)  ``anywhere``:
    the log is a copy taken while it was written, which may end anywhere."""
    size = f.seek(0, os.SEEK_END)
    if size == 0 or (size % _PAGE and not anywhere):
        return
    try:
        from .salvage import complete_prefix  # the execution log's record walker
    except ImportError:
        return
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        whole = complete_prefix(m)
    if 0 < whole < size:
        f.truncate(whole)


def merge_buffers(log_path: str | os.PathLike) -> int:
    """Append to the execution log the records the plugin's buffer files
    hold that never reached it (QEMU died without its exit callback), one
    chunk per thread in the order the chunks began, and remove the files
    (those of processes still running are left alone).  Returns the bytes
    added.  Idempotent; a log without buffer files is untouched."""
    log = Path(log_path)
    pending = []
    for path in buffer_files(log):
        try:
            pid = int(path.name.rsplit(".", 2)[1])
        except ValueError:
            continue
        if _pid_alive(pid):
            continue
        try:
            got = _pending(path)
        except OSError:
            continue
        if got is not None:
            pending.append(got)
        try:
            path.unlink()
        except OSError:
            pass
    return _append(log, pending)


def snapshot_buffers(log_path: str | os.PathLike, copy_path: str | os.PathLike) -> int:
    """Append to ``copy_path`` (a copy of the execution log ``log_path``
    made just before) the records the buffer files of ``log_path`` hold so
    far, those of running processes included, leaving the files alone: the
    log as it would be if QEMU died now.  Returns the bytes added."""
    pending = []
    for path in buffer_files(log_path):
        try:
            got = _pending(path, live=True)
        except OSError:
            continue
        if got is not None:
            pending.append(got)
    return _append(Path(copy_path), pending, copy=True)


def _append(log: Path, pending: list, copy: bool = False) -> int:
    if not pending or not log.is_file():
        return 0
    pending.sort(key=lambda p: struct.unpack_from("<Q", p[0], _CHUNK_TIME))
    added = 0
    with open(log, "r+b") as f:
        _drop_cut_record(f, anywhere=copy)
        for chunk, flushing, flush_at in pending:
            size = f.seek(0, os.SEEK_END)
            where = (size, 0)
            if flushing and size:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                    where = _place(m, chunk, flush_at)
            if where is None:
                continue
            at, written = where
            if at + written == size:
                f.seek(at)
                f.write(chunk)
                added += len(chunk) - written
            else:
                f.seek(at + written)
                rest = f.read()
                f.seek(at)
                f.write(chunk)
                f.write(rest)
                added += len(chunk) - written
    return added


class TracedProcess(subprocess.Popen):
    """A QEMU run with the plugin: once it has ended (``wait``/``poll``),
    the records its buffer files kept are in the log."""

    def __init__(self, cmd, log: str | None, **kwargs):
        self._log = log
        super().__init__(cmd, **kwargs)

    def _merged(self) -> None:
        log, self._log = self._log, None
        if log is not None:
            try:
                merge_buffers(log)
            except (OSError, ValueError, struct.error):
                pass            # the log stays as QEMU left it

    def wait(self, timeout=None):
        rc = super().wait(timeout)
        self._merged()
        return rc

    def poll(self):
        rc = super().poll()
        if rc is not None:
            self._merged()
        return rc


_PR_SET_PDEATHSIG = 1


def _die_with(parent: int):
    """A ``preexec_fn``: the child gets SIGKILL when the process that
    spawned it dies (so a SIGKILLed recorder leaves no traced program
    running).  PR_SET_PDEATHSIG fires on the death of the spawning
    *thread*, so spawn from a thread that lives as long as the recorder
    (the main thread).  If the parent already died between fork and
    prctl, the child exits at once."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def setup() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(128 + signal.SIGKILL)
    return setup


def spawn(cmd: list[str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **kwargs)`` whose child is SIGKILLed when
    this process (the spawning thread) dies; for a :func:`command` line, a
    :class:`TracedProcess` (the log is whole once it has ended)."""
    log = log_of(cmd)
    if log is None:
        return subprocess.Popen(cmd, preexec_fn=_die_with(os.getpid()), **kwargs)
    return TracedProcess(cmd, log, preexec_fn=_die_with(os.getpid()), **kwargs)


def run(program: Program, log_path: str | os.PathLike) -> int:
    """Run the program under QEMU with the plugin; the returncode as
    subprocess reports it (negative: killed by that signal).  stdin,
    stdout and stderr are the caller's."""
    cmd = command(program, log_path)
    proc = spawn(cmd)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.kill()
        proc.wait()
        raise
