"""The ptrace execution source: a native execution, stepped instruction by
instruction through the debug hardware's single-step trap.

The stepper (``stepper.c``, the tracer; ``stepper_log.c``, the log writer;
``stepper_proc.c``, /proc readers; ``stepper_ild.c``, its x86-64 length
decoder; ``stepper_debughw.c``, debug registers and the probes of what works
here; ``stepper_args.c``, its command line; shipped with the package) is compiled with gcc at first use into
``$XDG_CACHE_HOME/hwtrace/`` (default ``~/.cache/hwtrace``), named by the
hash of its sources.  It launches a program (or attaches to every thread of
a pid), follows threads, fork/vfork and exec, single-steps every thread
(``PTRACE_SINGLEBLOCK`` where a run-time probe shows the machine honours
DEBUGCTL.BTF; where it doesn't, as in this VM, straight-line code up to the
next control transfer runs natively to a per-thread debug-register
breakpoint on that instruction, which is then stepped: the same exact
instruction stream with about half the traps), and writes an execution log (``execlog``, source = ptrace
stepper): straight-line runs as BLOCK/EXEC records, SYSCALL/SYSRET around
every ``syscall``, SIGNAL for handlers entered asynchronously, SIGACTION,
MMAP/MUNMAP of executable mappings from ``/proc/PID/maps`` (with build-ids),
the CPU each thread ran on (sampled) in CTX, and TIME (host TSC, its
frequency measured over the run and stored in the header; or a per-thread
instruction count).

Trigger windows (``Options.start``/``stop``/``within``): the tracee runs at
native speed with a debug-register breakpoint (DR0 via PTRACE_POKEUSER,
enabled in DR7) on the start address, is stepped from there until the stop
address is reached or (``within``) the activation returns (return address
and stack pointer match), then runs natively again.  The log has only the
stepped instructions; where windows opened and closed is in
``LOG.windows`` (see :func:`windows`).

Besides the log the stepper writes ``LOG.info`` (JSON: stepping mode, probe
result, step count, clock), ``LOG.vdso`` (the bytes of the ``[vdso]``
mapping, which no file holds: load it as a raw image at each process's
``[vdso]`` MMAP address to decode calls into it) and, when it fails,
``LOG.err`` (one line).

API::

    status = run(["./prog", "arg"], "out.xlog", Options(within=0x401136))
    status = run(1234, "out.xlog", Options(), timeout=2.0)   # attach, detach after 2 s
    info("out.xlog")      -> {"stepping": "single", "block_step": "ignored", ...}
    windows("out.xlog")   -> [Window(on=True, pid, tid, pc, ninsn), ...]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Sequence

from .buildcache import BuildError, build, cache_dir

_HERE = Path(__file__).resolve().parent
#: The stepper's C sources (compiled together) and headers (hashed too).
C_SOURCES = tuple(_HERE / n for n in ("stepper.c", "stepper_log.c", "stepper_proc.c", "stepper_ild.c",
                                       "stepper_debughw.c", "stepper_args.c"))
SOURCES = C_SOURCES + (_HERE / "stepper.h", _HERE / "stepper_ild.h")
STEPPER_ERROR_STATUS = 125


class StepperError(RuntimeError):
    """The stepper cannot run or trace this (one line, for the user)."""


def stepper_path() -> Path:
    """The built stepper executable, compiling it first if needed
    (StepperError, one line, when the build cache can't be read or
    written)."""
    try:
        return _stepper_path()
    except OSError as e:
        where = e.filename or cache_dir()
        raise StepperError(f"the ptrace stepper cache {where}: {e.strerror} "
                           f"(set XDG_CACHE_HOME to a writable directory)") from None


def _stepper_path() -> Path:
    try:
        return build("stepper", SOURCES, ["-O2", "-Wall", *map(str, C_SOURCES)])
    except BuildError as e:
        if e.missing_gcc:
            raise StepperError("the ptrace engine needs gcc to build its stepper "
                               "(apt-get install gcc)") from None
        raise StepperError(f"building the ptrace stepper failed: {e}") from None


Address = int | str
"""An absolute address, or a string: ``"0x401000"`` (absolute),
``"+0x1139"`` (offset from the load base of the main executable, for PIE)
or ``"/lib/x.so@0x2a000"`` (file offset 0x2a000 of that file, resolved
when the process maps it: a shared library's function before it is
loaded)."""


@dataclass(frozen=True)
class Options:
    start: Address | None = None     # window opens when this address is reached
    stop: Address | None = None      # ... and closes when this one is
    within: Address | None = None    # window = each outermost activation of this function
    follow_fork: bool = True         # trace fork/vfork children (else only report them)
    clock: str = "tsc"               # TIME records: "tsc" (host TSC) or "insn" (per-thread count)
    block_step: bool = True          # use PTRACE_SINGLEBLOCK where the machine honours BTF
    accelerate: bool = True          # else run straight lines natively to a DR breakpoint
    cpu_every: int = 1024            # sample the CPU a thread runs on every N steps
                                     # (and after every syscall)
    quantum: int = 1000              # stops one thread is followed before another
                                     # (a syscall or signal ends it sooner)


class Window(NamedTuple):
    on: bool
    pid: int
    tid: int
    pc: int
    ninsn: int  # instructions the thread had retired in the log at that point


def _addr(value: Address) -> str:
    if isinstance(value, int):
        if value < 0:
            raise StepperError(f"bad address: {value}")
        return hex(value)
    s = value.strip()
    file, at, off = s.rpartition("@")
    try:
        if at and file:             # FILE@OFF: a file offset, resolved once FILE is mapped
            int(off, 0)
        else:
            int(s[1:] if s.startswith("+") else s, 0)
    except ValueError:
        raise StepperError(f"bad address: {value!r}") from None
    return s


def command(target: Sequence[str] | int, log_path: str | os.PathLike,
            options: Options | None = None) -> list[str]:
    """The stepper's command line for a program (argv) or a pid."""
    o = options or Options()
    if o.within is not None and (o.start is not None or o.stop is not None):
        raise StepperError("within excludes start/stop")
    if o.clock not in ("tsc", "insn"):
        raise StepperError(f"unknown clock {o.clock!r} (tsc or insn)")
    cmd = [str(stepper_path()), "--quiet-errors", "-o", os.fspath(log_path),
           "--clock", o.clock, "--cpu-every", str(max(1, int(o.cpu_every))),
           "--quantum", str(max(0, int(o.quantum)))]
    if not o.block_step:
        cmd += ["--block", "off"]
    if not o.accelerate:
        cmd += ["--accel", "off"]
    if not o.follow_fork:
        cmd.append("--no-follow-fork")
    for name in ("start", "stop", "within"):
        v = getattr(o, name)
        if v is not None:
            cmd += [f"--{name}", _addr(v)]
    if isinstance(target, int):
        if target <= 0:
            raise StepperError(f"bad pid: {target}")
        cmd += ["--pid", str(target)]
    else:
        argv = list(target)
        if not argv:
            raise StepperError("no program given")
        cmd += ["--", *argv]
    return cmd


def error(log_path: str | os.PathLike) -> str | None:
    """The stepper's own error line for this log, if it failed."""
    p = Path(os.fspath(log_path) + ".err")
    try:
        return p.read_text().strip() or "the ptrace stepper failed"
    except FileNotFoundError:
        return None


def run(target: Sequence[str] | int, log_path: str | os.PathLike,
        options: Options | None = None, *, timeout: float | None = None) -> int:
    """Trace ``target`` (argv of a program to launch, or a pid to attach to),
    writing the execution log to ``log_path``.

    Returns the program's exit status as :class:`subprocess.Popen` does
    (``-N``: killed by signal N); the program's stdin/stdout/stderr are this
    process's.  For a pid: 0 once detached (``timeout`` seconds, or when this
    process gets SIGINT/KeyboardInterrupt), or its status if it exits first.
    Raises :class:`StepperError` (one line) when the stepper cannot start,
    trace or write the log.
    """
    proc = start(target, log_path, options)
    return finish(proc, log_path, _wait(proc, timeout if isinstance(target, int) else None))


def start(target: Sequence[str] | int, log_path: str | os.PathLike,
          options: Options | None = None) -> subprocess.Popen:
    """Start the stepper on ``target`` (see :func:`run`); wait for it (send
    it SIGTERM to end the tracing early: a launched program is killed, an
    attached one detached) and pass its status to :func:`finish`."""
    cmd = command(target, log_path, options)
    for suffix in (".err", ".info", ".windows", ".vdso"):
        side = Path(os.fspath(log_path) + suffix)
        if side.exists():
            side.unlink()
    if isinstance(target, int):
        return subprocess.Popen(cmd)    # attached: never killed with us
    from .qemu import spawn
    return spawn(cmd)                   # launched: dies with the recorder


def finish(proc: subprocess.Popen, log_path: str | os.PathLike, status: int) -> int:
    """The program's status once the stepper ended with ``status``;
    StepperError (one line) if the stepper failed."""
    msg = error(log_path)
    if msg is not None and status == STEPPER_ERROR_STATUS:
        raise StepperError(msg)
    if not Path(os.fspath(log_path) + ".info").exists():
        # it writes .info before passing on the program's status
        how = f"signal {-status}" if status < 0 else f"status {status}"
        raise StepperError(f"the ptrace stepper died ({how}) before finishing the log")
    return status


def _wait(proc: subprocess.Popen, timeout: float | None) -> int:
    try:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)      # attached: detach and exit
            return proc.wait()
    except KeyboardInterrupt:
        # a launched program got the terminal's SIGINT itself; an attached
        # one is detached by the stepper on SIGINT
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                continue


def info(log_path: str | os.PathLike) -> dict:
    """What the stepper reports about a finished run (``LOG.info``):
    ``stepping`` ("single", "single+native-runs" or "block"),
    ``block_step`` (probe result: "honoured", "ignored"; "off" if disabled),
    ``steps`` (single/block steps), ``native_runs`` (straight lines run to a
    breakpoint), ``clock``, ``clock_hz``."""
    return json.loads(Path(os.fspath(log_path) + ".info").read_text())


def windows(log_path: str | os.PathLike) -> list[Window]:
    """Where trigger windows opened and closed (``LOG.windows``), in order."""
    p = Path(os.fspath(log_path) + ".windows")
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        kind, pid, tid, pc, n = line.split()
        out.append(Window(kind == "on", int(pid), int(tid), int(pc, 16), int(n)))
    return out


def probe() -> dict:
    """What the debug hardware does here, tried on a child of the stepper:
    ``debug_registers`` ("work": an execute breakpoint set through
    PTRACE_POKEUSER in DR0/DR7 stops the program there; "fail", with
    ``debug_registers_reason``; "unknown") and ``block_step`` ("honoured":
    PTRACE_SINGLEBLOCK stops only after branches, DEBUGCTL.BTF works;
    "ignored": it stops after every instruction, as in many VMs;
    "unknown").  StepperError (one line) if the stepper can't be built or run."""
    try:
        r = subprocess.run([str(stepper_path()), "--probe"], capture_output=True, text=True,
                           timeout=60)
        return json.loads(r.stdout.splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        raise StepperError(f"the ptrace stepper's probe failed: {e}") from None
