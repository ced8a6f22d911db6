"""The QEMU user-mode execution source: build the TCG plugin, run a program.

The plugin (``qemu_plugin.c``, shipped with the package) is compiled with
gcc at first use into ``$XDG_CACHE_HOME/hwtrace/`` (default
``~/.cache/hwtrace``), named by the hash of its source, so a changed plugin
is rebuilt and concurrent first uses don't clash (atomic rename).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

PLUGIN_SOURCE = Path(__file__).with_name("qemu_plugin.c")
QEMU = "qemu-x86_64"


class QemuError(RuntimeError):
    """The QEMU engine cannot run here (one line, for the user)."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hwtrace"


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
    src = PLUGIN_SOURCE.read_bytes()
    digest = hashlib.sha256(src).hexdigest()[:16]
    out = cache_dir() / f"qemu_plugin-{digest}.so"
    if out.exists():
        return out
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise QemuError("the QEMU engine needs gcc to build its plugin (apt-get install gcc)")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".qemu_plugin-", suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        r = subprocess.run([gcc, "-O2", "-shared", "-fPIC", "-fvisibility=hidden",
                            "-Wall", "-o", tmp, str(PLUGIN_SOURCE), "-lpthread"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["gcc failed"])[-1]
            raise QemuError(f"building the QEMU plugin failed: {last}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


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


def command(program: Program, log_path: str | os.PathLike) -> list[str]:
    """The qemu-user command line that runs ``program`` writing ``log_path``."""
    return [qemu_binary(), "-plugin", f"{plugin_path()},out={os.fspath(log_path)}",
            "--", *program.argv]


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
    this process (the spawning thread) dies."""
    return subprocess.Popen(cmd, preexec_fn=_die_with(os.getpid()), **kwargs)


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
