"""Branch records from a live process, through the ptrace stepper
(``hwtrace.engines.emulated.stepper``): the trigger addresses go to the
stepper's debug-register windows, so code outside them runs natively; the
execution log it writes is then turned into records by the shared
:class:`~hwtrace.branches.tracker.Tracker`.

    run = trace_live(["./prog", "10"], workdir, TriggerSpec(within="fib"),
                     MaskSpec(kinds=frozenset({"call", "return"})))

Trigger addresses: symbols (``fib``, ``fib+0x10``), ``+OFF`` from the main
executable's load base, or numbers: absolute for a non-PIE program or an
attached process, link-time addresses (objdump's) for a PIE about to be
launched.  Only the executable's own symbols exist before a launch.
    run.status                 # the program's exit status (Popen style)
    for rec in run.records(): ...
"""

from __future__ import annotations

import mmap
import os
import shutil
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from hwtrace.analysis.symbols import SymbolError
from hwtrace.engines.emulated import execlog as X
from hwtrace.x86 import Mode, X86Error, decoder_for

from . import resolve
from .classify import TO_KERNEL, is_transfer
from .livesyms import ImageCache, LazySymbolizer, proc_mappings
from .mask import MaskSpec
from .records import Branch
from .tracker import Tracker
from .triggers import TriggerSpec


class LiveError(Exception):
    """The process cannot be traced (one line, for the user)."""


# ---------------------------------------------------------------- checks

def _scope() -> str:
    try:
        v = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return "kernel.yama.ptrace_scope: not present (Yama off)"
    return f"kernel.yama.ptrace_scope = {v}"


def check_attach(pid: int) -> None:
    """Refuse, naming the reason, a pid that does not exist or may not be
    traced by this process."""
    if pid <= 0:
        raise LiveError(f"bad pid {pid}")
    if pid == os.getpid():
        raise LiveError(f"pid {pid} is this process: it cannot trace itself")
    st = Path(f"/proc/{pid}/status")
    try:
        text = st.read_text()
    except FileNotFoundError:
        raise LiveError(f"no process with pid {pid}") from None
    except OSError as e:
        raise LiveError(f"pid {pid}: cannot read {st}: {e.strerror}") from None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    tracer = fields.get("TracerPid", "0").strip()
    if tracer not in ("", "0"):
        raise LiveError(f"cannot trace pid {pid}: already traced by pid {tracer} "
                        f"(TracerPid in {st}); a process has one tracer at a time")
    if fields.get("State", "").strip().startswith("Z"):
        raise LiveError(f"cannot trace pid {pid}: it is a zombie (exited, not yet reaped)")
    scope = _scope()
    euid = os.geteuid()
    if scope.endswith("= 3"):
        raise LiveError(f"cannot trace pid {pid}: ptrace attach is disabled by {scope} "
                        "(no process may attach until reboot)")
    if euid != 0:
        uids = fields.get("Uid", "").split()
        if uids and any(int(u) != euid for u in uids[:3]):
            raise LiveError(f"cannot trace pid {pid}: it runs as uid {uids[0]}, not "
                            f"{euid}; tracing another user's process needs "
                            f"CAP_SYS_PTRACE (root) [{scope}]")
        if scope.endswith("= 2"):
            raise LiveError(f"cannot trace pid {pid}: {scope} allows attaching only "
                            "with CAP_SYS_PTRACE (root)")
        if scope.endswith("= 1"):
            raise LiveError(f"cannot trace pid {pid}: {scope} allows attaching only to "
                            "descendants (run as root, or sysctl kernel.yama.ptrace_scope=0)")


def _stepper_failure(pid: int | None, msg: str) -> LiveError:
    if pid is not None and ("not permitted" in msg or "permission" in msg.lower()):
        if "ptrace_scope" not in msg:
            msg = f"{msg} [{_scope()}]"
    return LiveError(msg)


# ---------------------------------------------------------------- symbols

def program_path(argv0: str) -> str:
    if "/" in argv0:
        p = argv0
    else:
        p = shutil.which(argv0) or argv0
    if not os.path.isfile(p):
        raise LiveError(f"{argv0}: no such program")
    if not os.access(p, os.X_OK):
        raise LiveError(f"{argv0}: not executable")
    return p


def _pre_symbolizer(target, cache: ImageCache):
    """Symbols to turn the triggers into stepper addresses before the run:
    (symbolizer, relative) -- relative: addresses are offsets from the main
    executable's load base (a PIE about to be launched).  Nothing is read
    but what a trigger needs (lazily)."""
    sym = LazySymbolizer(cache)
    if isinstance(target, int):
        for lo, hi, off, path in proc_mappings(target):
            sym.add_mapping(path, lo, off, hi - lo)
        return sym, False
    path = program_path(str(target[0]))
    try:
        img = sym.add_image(path, 0)
    except SymbolError:
        return sym, False          # not ELF (a script): addresses only
    return sym, img.is_pie


def _link_time(v: str | None) -> str | None:
    if v is None:
        return None
    n = resolve.parse_number(v.strip()) if not v.strip().startswith("+") else None
    return f"+{n:#x}" if n is not None else v


def _is_dynamic(sym) -> bool:
    img = next(sym.iter_images(), None)
    if img is None:
        return False
    try:
        from elftools.elf.elffile import ELFFile
        with open(img.path, "rb") as f:
            return any(seg.header.p_type == "PT_INTERP" for seg in ELFFile(f).iter_segments())
    except Exception:
        return False


def stepper_options(spec: TriggerSpec, sym, relative: bool, clock: str = "tsc",
                    libs: Sequence[str] = ()):
    """The stepper's trigger addresses: ``+OFF`` (a PIE about to run),
    absolute, or ``FILE@OFF`` (a function of a shared library ``libs``
    names, resolved by the stepper when the library is mapped)."""
    from hwtrace.engines.emulated import stepper

    def conv(v):
        if v is None:
            return None
        try:
            if relative:
                # link-time address of a PIE = offset from its load base
                return "+" + hex(resolve.address(sym, v, base=0))
            return resolve.address(sym, v, base=resolve.main_base(sym))
        except resolve.SymbolNotFound:
            hit = library_offset(libs, v, sym.cache)
            if hit is None:
                raise
            return f"{hit[0]}@{hit[1]:#x}"
    return stepper.Options(start=conv(spec.start), stop=conv(spec.stop),
                           within=conv(spec.within), clock=clock)


def needed_libraries(exe: str) -> list[str]:
    """The shared libraries the dynamic loader loads for ``exe`` at start,
    in its order ([] for a static program), as ``ld.so --list`` shows them."""
    import subprocess

    from hwtrace.engines.emulated.images import interpreter
    interp = interpreter(exe)
    if not interp:
        return []
    try:
        r = subprocess.run([interp, "--list", exe], capture_output=True, text=True,
                           timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return []
    out = []
    for line in r.stdout.splitlines():
        left, arrow, right = line.strip().partition("=>")
        path = (right if arrow else left).strip().split(" (")[0].strip()
        if path.startswith("/") and os.path.isfile(path) and path not in out:
            out.append(path)
    return out


def library_offset(libs: Sequence[str], text: str, cache: ImageCache):
    """(library, file offset) of ``NAME[+OFF]`` in the first of ``libs``
    defining it (each read only when reached); None if none does."""
    from hwtrace.engines.emulated.images import load_segments
    if resolve.parse_number(text.strip()) is not None or text.strip().startswith("+"):
        return None
    for lib in libs:
        one = LazySymbolizer(cache)
        try:
            one.add_image(lib, 0)
            addr = resolve.address(one, text, base=0)
        except (SymbolError, resolve.SymbolNotFound):
            continue
        for off, size, va in load_segments(lib):
            if va <= addr < va + max(size, 1):
                return lib, addr - va + off
    return None


# ---------------------------------------------------------------- the run

@dataclass
class LiveRun:
    status: int
    log: Path
    trigger: TriggerSpec
    mask: MaskSpec
    info: dict = field(default_factory=dict)
    _sym: LazySymbolizer | None = None
    #: what the run knew before it started: an attached process's mappings
    #: (None for a launch: its PIE was not placed yet) and the images read
    pre: LazySymbolizer | None = None
    cache: ImageCache | None = None

    @property
    def symbolizer(self) -> LazySymbolizer:
        """Symbols of what the process mapped (an attached process's
        mappings at the start, then the log's MMAP records), read lazily."""
        if self._sym is None:
            sym = LazySymbolizer(self.cache)
            if self.pre is not None:
                for path, lo, pgoff, size in self.pre.mappings():
                    sym.add_mapping(path, lo, pgoff, size)
            with _mapped(self.log) as data:
                self._sym = symbolizer_from_log(data, sym)
        return self._sym

    def records(self) -> Iterator[Branch]:
        from hwtrace.engines.emulated import stepper
        sym = self.symbolizer
        base = resolve.main_base(sym)
        tracker = Tracker(self.trigger.bind(sym, base), self.mask.bind(sym, base))
        with _mapped(self.log) as data:
            yield from records_from_log(data, stepper.windows(self.log), tracker)


class _mapped:
    """A log file's bytes, memory-mapped (a long run's log can be large)."""

    def __init__(self, path: Path):
        self.path = path
        self._f = None
        self._m = None

    def __enter__(self):
        self._f = open(self.path, "rb")
        try:
            self._m = mmap.mmap(self._f.fileno(), 0, prot=mmap.PROT_READ)
        except ValueError:            # empty file
            return b""
        return self._m

    def __exit__(self, *exc):
        if self._m is not None:
            try:
                self._m.close()
            except BufferError:       # a parser's memoryview still alive
                pass
        self._f.close()


def trace_live(target: Sequence[str] | int, workdir: str | os.PathLike,
               trigger: TriggerSpec = TriggerSpec(), mask: MaskSpec = MaskSpec(),
               *, clock: str = "tsc", timeout: float | None = None) -> LiveRun:
    """Run ``target`` (argv, or a pid to attach to) under the stepper with
    the trigger's windows; the log goes to ``workdir``.  Raises LiveError
    (one line) and resolve.SymbolNotFound / ValueError for bad triggers."""
    from hwtrace.engines.emulated import stepper

    pid = target if isinstance(target, int) else None
    if pid is not None:
        check_attach(pid)
    elif not target:
        raise LiveError("no program given")
    cache = ImageCache()
    sym, relative = _pre_symbolizer(target, cache)
    if relative:
        # a PIE about to run at an unknown base: numbers are link-time
        # addresses (as objdump shows them), i.e. offsets from the base
        trigger = TriggerSpec(*(_link_time(v) for v in (trigger.start, trigger.stop,
                                                        trigger.within)))
    # a program about to be launched: its shared libraries' functions are
    # found in the files the loader will map (and resolved when it does)
    libs = needed_libraries(sym.images[0].path) if pid is None and _is_dynamic(sym) else []
    opts = stepper_options(trigger, sym, relative, clock, libs)
    # ranges are resolved now too, so a bad one fails before the run
    check = sym
    if libs:
        check = LazySymbolizer(cache)
        check.add_image(sym.images[0].path, 0)
        for lib in libs:
            check.add_file(lib)
    mask.bind(check, 0 if relative else resolve.main_base(sym))
    log = Path(workdir) / "live.xlog"
    try:
        status = stepper.run(target if pid is not None else [str(a) for a in target],
                             log, opts, timeout=timeout)
    except stepper.StepperError as e:
        raise _stepper_failure(pid, str(e)) from None
    try:
        info = stepper.info(log)
    except (OSError, ValueError):
        info = {}
    if not log.exists():
        raise LiveError("the stepper wrote no execution log")
    return LiveRun(status, log, trigger, mask, info,
                   pre=sym if pid is not None else None, cache=cache)


# ---------------------------------------------------------------- the log

def symbolizer_from_log(data: bytes, sym: LazySymbolizer | None = None) -> LazySymbolizer:
    """``sym`` (default: a new one) with the executable file mappings of the
    log's MMAP records (read lazily)."""
    sym = sym if sym is not None else LazySymbolizer()
    for r in X.parse(data):
        if type(r) is X.Mmap and r.prot & 4 and r.path.startswith("/"):
            sym.add_mapping(r.path, r.addr, r.offset, r.size)
    return sym


def _decode_block(decode, pc: int, sizes: bytes, code: bytes) -> list:
    out = []
    off = 0
    for s in sizes:
        x = None
        try:
            d = decode(code, off)
            if is_transfer(d):
                x = d
        except X86Error:
            pass
        out.append((pc + off, x))
        off += s
    return out


#: clone, fork, vfork, clone3: a syscall that may start a process
_FORKS = frozenset((56, 57, 58, 435))


def records_from_log(data: bytes, windows, tracker: Tracker) -> Iterator[Branch]:
    """Feed an execution log (and the stepper's window edges) through the
    tracker, yielding records as they are made."""
    decode = decoder_for(Mode.BIT64)
    tracker.kernel_untraced = True        # the stepper never sees the kernel
    blocks: dict[tuple[int, int], list] = {}
    wq: dict[int, deque] = {}
    for w in windows:
        wq.setdefault(w.tid, deque()).append(w)
    counts: dict[int, int] = {}
    times: dict[int, int] = {}
    pend: dict[int, tuple] = {}     # pid -> window state at its fork syscall
    forks: dict[int, tuple] = {}    # child pid -> the window state it starts in
    out = tracker.out
    th = None
    ths = {}
    pid = tid = 0
    q = None
    n = 0
    nxt = -1

    def edges(th, q, n):
        # window edges the stepper logged at instruction count n
        while q and q[0].ninsn <= n:
            w = q.popleft()
            if not w.on:
                tracker.transfer(th, w.pc)
                tracker.close(th)
            else:
                tracker.gap(th)
        return q[0].ninsn if q else -1

    def run(insns):
        nonlocal n, nxt
        t = times.get(tid)
        step = tracker.step
        for pc, x in insns:
            if n == nxt:
                nxt = edges(th, q, n)
            step(th, pc, x, t)
            n += 1

    for r in X.parse(data):
        typ = type(r)
        if n == nxt and typ is not X.Exec:
            nxt = edges(th, q, n)       # before the thread's next event
        if typ is X.Exec:
            for bid in r.ids:
                b = blocks.get((pid, bid))
                if b is None:
                    raise X.ExecLogError(f"execution log: block {bid} of pid {pid} "
                                         "executed before it was defined")
                run(b)
            if out:
                yield from out
                out.clear()
        elif typ is X.Ctx:
            if th is not None:
                counts[tid] = n
            pid, tid = r.pid, r.tid
            th = ths[tid] = tracker.thread(pid, tid)
            n = counts.get(tid, 0)
            q = wq.get(tid)
            nxt = q[0].ninsn if q else -1
        elif typ is X.Time:
            times[tid] = r.value
        elif typ is X.Block:
            blocks[(r.pid, r.id)] = _decode_block(decode, r.pc, r.sizes, r.code)
        elif typ is X.ExecPart:
            b = blocks.get((pid, r.id))
            if b is None:
                raise X.ExecLogError(f"execution log: block {r.id} of pid {pid} "
                                     "executed before it was defined")
            run(b[:r.count])
        elif typ is X.Insn:
            run(_decode_block(decode, r.pc, bytes([len(r.code)]), r.code))
        elif typ is X.Signal:
            if r.ip:
                tracker.interrupt(th, r.ip, r.handler, times.get(tid))
            else:
                tracker.gap(th)
        elif typ is X.ProcStart:
            if r.parent_pid:
                for (p, bid), v in list(blocks.items()):
                    if p == r.parent_pid:
                        blocks[(pid, bid)] = v
                # forked inside a window: so is it (the parent's fork syscall
                # is logged before the child starts; its SYSRET, which names
                # the child, may come before or after)
                snap = forks.pop(pid, None) or pend.pop(r.parent_pid, None)
                if snap is not None:
                    tracker.inherit(th, snap)
        elif typ is X.Syscall:
            if r.nr in _FORKS and th.on:
                pend[pid] = tracker.snapshot(th)
        elif typ is X.Sysret:
            if r.nr in _FORKS and r.ret > 0 and pid in pend:
                forks[r.ret] = pend.pop(pid)
        elif typ is X.ProcExec:
            for key in [k for k in blocks if k[0] == pid]:
                del blocks[key]
            tracker.exec_(th)
        elif typ in (X.ThreadExit, X.ProcExit):
            if th is not None:
                if th.pend_x is not None and th.pend_x.kind in TO_KERNEL:
                    tracker.leave(th)       # exit/exit_group: no way back
                tracker.gap(th)
        if out:
            yield from out
            out.clear()
    # window edges after a thread's last logged instruction
    for t_id, qq in wq.items():
        if qq and t_id in ths:
            edges(ths[t_id], qq, 1 << 62)
    yield from out
    out.clear()
