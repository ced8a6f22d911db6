"""``hwtrace record``: run (or attach to) a program while tracing it into a bundle."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

from hwtrace.cli import CliError, help_of

DEFAULT_CONFIG = "branch;user;retc;tsc;mtc"
DEFAULT_BUFFER = 64 << 20

_FLAGS = {  # config name -> IA32_RTIT_CTL bit
    "cyc": 1 << 1, "os": 1 << 2, "user": 1 << 3, "cr3": 1 << 7, "mtc": 1 << 9,
    "tsc": 1 << 10, "branch": 1 << 13, "ptw": 1 << 12, "pwr": 1 << 4,
}
_FIELDS = {"mtc-freq": 14, "cyc-thresh": 19, "psb-freq": 24}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "record", help=help_of("record"),
        description="Run PROGRAM (or attach to --pid) while tracing it, and write "
                    "a trace bundle to DIR: the per-CPU or per-thread .pt streams "
                    "exactly as Intel PT hardware writes them, manifest.json and "
                    "sideband. The program's stdout, stderr and exit status pass "
                    "through unchanged; hwtrace says on stderr what it wrote, and "
                    "warns when a buffer filled or wrapped. Stop any time: Ctrl-C "
                    "(SIGINT), SIGTERM or the end of --duration ends the recording -- "
                    "a program hwtrace started is killed (with the processes it "
                    "started), one it attached to (--pid) is detached and runs on -- "
                    "and the bundle holds everything until then (exit status 130 "
                    "after SIGINT, 143 after SIGTERM, 0 after --duration). SIGUSR2 "
                    "takes a snapshot (qemu engine): the bundle is written at once and "
                    "the program runs on untraced. If hwtrace itself is killed, DIR "
                    "keeps what 'hwtrace recover DIR' needs; otherwise its working "
                    "files are removed.")
    p.add_argument("--engine", default=None, metavar="ENGINE",
                   help="qemu (QEMU user mode; the default for a PROGRAM), ptrace "
                        "(native single stepping; the default with --pid), perf (Intel "
                        "PT hardware), auto")
    p.add_argument("--mode", choices=("cpu", "thread"), default="cpu",
                   help="one stream per logical CPU (default) or per thread")
    p.add_argument("--num-chunks", type=int, metavar="N", help="chunks per buffer")
    p.add_argument("--chunk-order", type=int, metavar="K",
                   help="a chunk is 2**K pages of 4 KiB (0..8)")
    p.add_argument("--buffer-size", metavar="SIZE",
                   help="bytes per buffer, e.g. 64M (default 64M)")
    p.add_argument("--circular", action="store_true",
                   help="wrap around when full (keep the newest trace)")
    p.add_argument("--config", default=DEFAULT_CONFIG, metavar="SPEC",
                   help="';'-separated: branch;user;os;tsc;retc;cyc;cyc-thresh=N;"
                        "mtc;mtc-freq=N;psb-freq=N;cr3-match=V|off;addrN=filter|stop|off;"
                        "addrN-range=[ELF,]BEGIN,END (BEGIN/END: addresses, or "
                        "symbols of ELF); a flag with a 'no' prefix is off "
                        "(e.g. noretc). Replaces the default %(default)s. With the "
                        "emulated engines process CR3 values are 0x1000, 0x2000, ... "
                        "in pid order (see the sideband)")
    p.add_argument("--copy-images", action="store_true",
                   help="store the mapped executables in the bundle")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="bundle directory")
    p.add_argument("--pid", type=int, help="attach to this running process (ptrace "
                   "engine); detach when it exits, at --duration's end or on Ctrl-C")
    p.add_argument("--duration", type=float, metavar="S",
                   help="stop after S seconds of the program's run (see above); "
                        "the qemu engine starts the clock when QEMU has loaded the "
                        "program and its first thread is traced")
    p.add_argument("--trigger", action="append", default=[], metavar="FUNC",
                   help="snapshot mode (qemu engine): record into circular buffers and "
                        "save them when function FUNC (a symbol of the program or of "
                        "any shared library it loads) is first entered: the trace ends "
                        "with FUNC's first instruction and the program runs on untraced. "
                        "If FUNC is never entered, the bundle holds the end of the run "
                        "(e.g. the path to a crash)")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM ARGS",
                   help="the program to run")
    p.set_defaults(func=run)


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)[iI]?[bB]?\s*", text or "")
    if not m:
        raise CliError(f"bad size {text!r} (e.g. 4096, 64K, 16M)")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def buffer_geometry(args) -> tuple[int, int]:
    """(num_chunks, chunk_order) from the options."""
    from hwtrace.control.config import MAX_BUFFER_BYTES, MAX_CHUNK_ORDER, MAX_NUM_CHUNKS
    if args.buffer_size is not None:
        if args.num_chunks is not None or args.chunk_order is not None:
            raise CliError("give --buffer-size or --num-chunks/--chunk-order, not both")
        size = parse_size(args.buffer_size)
        if size < 4096 or size % 4096:
            raise CliError("--buffer-size must be a positive multiple of 4K")
        pages = size // 4096
        order = min(MAX_CHUNK_ORDER, (pages & -pages).bit_length() - 1)
        if size > MAX_BUFFER_BYTES:
            raise CliError(f"--buffer-size {args.buffer_size}: a buffer holds at most "
                           f"{MAX_BUFFER_BYTES >> 20}M")
        if pages >> order > MAX_NUM_CHUNKS:
            raise CliError(f"--buffer-size {args.buffer_size}: more than {MAX_NUM_CHUNKS} "
                           f"chunks of {4 << order}K (give a multiple of 1M)")
        return pages >> order, order
    if args.num_chunks is None and args.chunk_order is None:
        return DEFAULT_BUFFER >> 20, 8
    # said with the options' names (the control API's are num_chunks...)
    if args.num_chunks is not None and not 1 <= args.num_chunks <= MAX_NUM_CHUNKS:
        raise CliError(f"--num-chunks must be 1..{MAX_NUM_CHUNKS}")
    if args.chunk_order is not None and not 0 <= args.chunk_order <= MAX_CHUNK_ORDER:
        raise CliError(f"--chunk-order must be 0..{MAX_CHUNK_ORDER}")
    return (args.num_chunks if args.num_chunks is not None else 1,
            args.chunk_order if args.chunk_order is not None else 0)


def _int(text: str, what: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise CliError(f"--config: {what} needs a number, not {text!r}") from None


def parse_config(spec: str):
    """(ctl, cr3_match, ranges) where ranges maps n -> (elf or None, begin, end)
    with begin/end ints or symbol names."""
    ctl = 0
    cr3 = 0
    retc = False
    ranges: dict[int, tuple] = {}
    cfgs: dict[int, int] = {}
    for item in spec.split(";"):
        item = item.strip()
        if not item:
            continue
        name, _, value = item.partition("=")
        name = name.strip().lower()
        value = value.strip()
        neg = name.startswith("no") and not value and (name[2:] in _FLAGS or name[2:] == "retc")
        if neg:
            name = name[2:]
        if name in _FLAGS and not value:
            ctl = (ctl & ~_FLAGS[name]) if neg else (ctl | _FLAGS[name])
        elif name == "retc" and not value:
            retc = not neg
        elif name == "cr3-match" and value.lower() == "off":
            cr3 = 0
            ctl &= ~_FLAGS["cr3"]
        elif name in _FIELDS:
            v = _int(value, name)
            if not 0 <= v <= 15:
                raise CliError(f"--config: {name} must be 0..15")
            ctl |= v << _FIELDS[name]
        elif name == "cr3-match":
            cr3 = _int(value, name)
            ctl |= _FLAGS["cr3"]
        elif m := re.fullmatch(r"addr([0-3])", name):
            kinds = {"filter": 1, "stop": 2, "off": 0}
            if value not in kinds:
                raise CliError(f"--config: {name} must be filter or stop")
            cfgs[int(m.group(1))] = kinds[value]
        elif m := re.fullmatch(r"addr([0-3])-range", name):
            parts = [x.strip() for x in value.split(",")]
            if len(parts) == 2:
                elf, begin, end = None, parts[0], parts[1]
            elif len(parts) == 3:
                elf, begin, end = parts
            else:
                raise CliError(f"--config: {name}=[ELF,]BEGIN,END")
            conv = []
            for x in (begin, end):
                try:
                    conv.append(int(x, 0))
                except ValueError:
                    if elf is None:
                        raise CliError(f"--config: {name}: {x!r} is a symbol; give the ELF") from None
                    conv.append(x)
            ranges[int(m.group(1))] = (elf, conv[0], conv[1])
        else:
            raise CliError(f"--config: unknown item {item!r}")
    if not retc:
        ctl |= 1 << 11   # DisRETC
    for n, c in cfgs.items():
        if n not in ranges:
            raise CliError(f"--config: addr{n}={'filter' if c == 1 else 'stop'} needs addr{n}-range")
        ctl |= c << (32 + 4 * n)
    for n in ranges:
        if n not in cfgs:
            raise CliError(f"--config: addr{n}-range needs addr{n}=filter|stop")
    return ctl, cr3, ranges


def _symbol(elf: str, name: str, end: bool) -> int:
    """The address of the first symbol (of any type) named ``name`` in
    ``elf``'s ``.symtab``, then ``.dynsym``; with ``end`` its last byte."""
    from hwtrace.analysis.symbols import symbol_tables
    try:
        tables = symbol_tables(elf)
    except OSError as e:
        raise CliError(f"--config: {elf}: {e.strerror}") from None
    except Exception as e:  # not an ELF file
        raise CliError(f"--config: {elf}: not a readable ELF file ({type(e).__name__})") from None
    for syms in tables:
        hit = syms.named(name)
        if len(hit):
            k = int(hit[0])
            size = int(syms.size[k])
            return int(syms.value[k]) + (max(size, 1) - 1 if end else 0)
    raise CliError(f"--config: no symbol {name!r} in {elf}")


def _elf_relative(elf: str, begin, end) -> tuple[int, int, bool]:
    """(begin, end, is_pie) as ELF virtual addresses."""
    b = _symbol(elf, begin, False) if isinstance(begin, str) else begin
    e = _symbol(elf, end, True) if isinstance(end, str) else end
    with open(elf, "rb") as f:
        head = f.read(18)
    pie = len(head) == 18 and int.from_bytes(head[16:18], "little") == 3
    if b > e:
        raise CliError("--config: address range begin is above its end")
    return b, e, pie


def run(args) -> int:
    from hwtrace.control.config import BufferConfig
    from hwtrace.control.errors import TraceError

    prog = list(args.program)
    if prog and prog[0] == "--":
        prog = prog[1:]
    if args.pid is not None and prog:
        raise CliError("give a PROGRAM or --pid, not both")
    if args.pid is None and not prog:
        raise CliError("no program given (hwtrace record -o DIR -- PROGRAM ARGS...)")
    engine = args.engine or ("ptrace" if args.pid is not None else "qemu")
    if args.pid is not None and engine == "qemu":
        raise CliError("the qemu engine cannot attach to a running process (it traces "
                       "programs it starts); use --engine ptrace")
    if args.duration is not None and not 0 <= args.duration < 1e9:
        raise CliError("--duration must be a number of seconds >= 0")
    triggers = list(getattr(args, "trigger", None) or [])
    if triggers and engine != "qemu":
        raise CliError(f"--trigger needs the qemu engine (engine {engine} can't stop "
                       "tracing mid-run)")
    for t in triggers:
        if not re.fullmatch(r"[A-Za-z_.$@][A-Za-z0-9_.$@]*", t):
            raise CliError(f"--trigger: {t!r} is not a function symbol name")
    out = Path(args.output)
    num_chunks, chunk_order = buffer_geometry(args)
    ctl, cr3, ranges = parse_config(args.config)

    elf_ranges = {}
    abs_ranges = []
    for n in range(max(ranges) + 1 if ranges else 0):
        if n not in ranges:
            abs_ranges.append((0, 0))
            continue
        elf, b, e = ranges[n]
        if elf is None:
            if b > e:
                raise CliError("--config: address range begin is above its end")
            abs_ranges.append((b, e))
        else:
            b, e, pie = _elf_relative(elf, b, e)
            abs_ranges.append((b, e))
            if pie:
                elf_ranges[n] = (os.path.realpath(elf), b, e)
    try:
        cfg = BufferConfig(num_chunks=num_chunks, chunk_order=chunk_order,
                           is_circular=bool(args.circular or triggers), ctl=ctl,
                           cr3_match=cr3, addr_ranges=tuple(abs_ranges))
    except TraceError as e:
        raise CliError(e.message) from None
    try:
        status, ended = _record(engine, args, cfg, prog, out, elf_ranges,
                                engine_options={"triggers": triggers} if triggers else None)
    except TraceError as e:
        raise CliError(e.message) from None
    if ended.stop is not None:
        from ._stop import EXIT_STATUS
        return EXIT_STATUS.get(ended.stop, 0)
    if status < 0:
        return 128 - status
    return status


class Ended:
    """How a recording ended: ``stop`` the stop request's reason (SIGINT,
    SIGTERM, SIGHUP, duration), ``snapshot`` the snapshot's, ``status``
    the program's exit status (subprocess convention; None: still running
    when the bundle was written)."""

    def __init__(self, stop=None, snapshot=None, status=None, attached=None, command=None):
        self.stop, self.snapshot, self.status, self.attached = stop, snapshot, status, attached
        self.command = command      # the program's argv as given (None: attached)

    def text(self) -> str:
        if self.snapshot is not None:
            if self.status is None and self.stop is None:
                return f"snapshot: {self.snapshot}; the program runs on untraced"
            after = Ended(self.stop, None, self.status, self.attached, self.command).text()
            return f"snapshot: {self.snapshot}; then, untraced, {after}"
        if self.stop is not None:
            how = "after --duration" if self.stop == "duration" else f"by {self.stop}"
            if self.attached is not None:
                return f"stopped {how}: detached from pid {self.attached}, which runs on"
            return f"stopped {how}: the program was killed"
        if self.status is None:
            return "the program was still running"
        if self.status < 0:
            import signal
            try:
                name = signal.Signals(-self.status).name
            except ValueError:
                name = f"signal {-self.status}"
            return f"the program died of {name}: the trace ends there"
        return f"the program exited with status {self.status}"

    def to_dict(self) -> dict:
        d = {"stop": self.stop, "snapshot": self.snapshot, "status": self.status,
             "ended": self.text()}
        if self.command:
            d["command"] = list(self.command)
        if self.attached is not None:
            d["attached"] = self.attached
        return d


def check_output(out: Path) -> None:
    """-o must not hold a bundle nor an unfinished recording."""
    from hwtrace.control.recover import is_trace_dir
    from hwtrace.engines.emulated.salvage import find_logs
    try:
        if (out / "manifest.json").exists():
            raise CliError(f"{out} already holds a trace bundle")
        if is_trace_dir(out) or find_logs(out):
            raise CliError(f"{out} holds an unfinished recording (make it a bundle with "
                           f"'hwtrace recover {out}', or remove it)")
    except OSError as e:
        raise CliError(f"{out}: {e.strerror}") from None


def _record(engine, args, cfg, prog, out: Path, elf_ranges, *, work: Path | None = None,
            engine_options=None, say: bool = True):
    """Record into the bundle ``out``: (program status, :class:`Ended`).
    While it runs the trace directory (buffers, the engine's working files,
    sideband) is ``work`` (default: ``out`` itself, checked to hold no
    bundle or recording); removed once the bundle is written, kept if the
    writing is interrupted (for ``hwtrace recover``)."""
    import hwtrace
    from hwtrace.control.ctl import Mode
    from . import _record_report, _stop

    if work is None:
        work = out
        check_output(out)
    made = [p for p in (out, work) if not p.exists()]
    dev = hwtrace.open_device(engine=engine, directory=work, **(engine_options or {}))
    keep = ok = False
    ended = Ended(attached=args.pid, command=prog or None)
    try:
        eng = dev.engine
        if elf_ranges and hasattr(eng, "elf_ranges"):
            eng.elf_ranges = elf_ranges
        elif elf_ranges:
            raise CliError(f"engine {eng.name}: ELF-relative address ranges need the emulated engine")
        if hasattr(eng, "log_meta"):
            # with the mode, buffers and CPU count the device gives, how
            # 'hwtrace recover' makes this bundle if hwtrace is killed
            eng.log_meta = {"copy_images": bool(args.copy_images),
                            "elf_ranges": {str(n): list(r) for n, r in elf_ranges.items()},
                            "command": list(prog) if prog else None}

        def on_snapshot(reason):
            ended.snapshot = reason
            _write(dev, out, eng, args.copy_images, ended)
            if say:
                _record_report.say(_bundle(out), ended.text())

        duration = getattr(args, "duration", None)
        with _stop.Steering(dev, can_snapshot=eng.can_snapshot) as steer:
            if args.mode == "cpu":
                dev.set_mode(Mode.CPU)
                for _ in range(dev.num_cpus):
                    dev.alloc_buffer(cfg)
                dev.cpu_mode_alloc()
                dev.cpu_mode_start()
                try:
                    status = (dev.attach(args.pid, duration=duration) if args.pid is not None
                              else dev.run(prog, duration=duration, on_snapshot=on_snapshot))
                finally:
                    dev.cpu_mode_stop()
            else:
                dev.set_mode(Mode.THREAD)
                status = (dev.attach(args.pid, duration=duration, follow_threads=cfg)
                          if args.pid is not None else
                          dev.run(prog, follow_threads=cfg, duration=duration,
                                  on_snapshot=on_snapshot))
            steer.writing()
            ended.stop, ended.status = dev.stop_reason, status
            if ended.snapshot is None:
                _write(dev, out, eng, args.copy_images, ended)
            else:
                _set_ended(out, ended)
        ok = True
    except KeyboardInterrupt:
        keep = True
        raise CliError(f"interrupted: the bundle was not written; 'hwtrace recover {out}' "
                       f"makes it from what was recorded", 130) from None
    finally:
        dev.close(discard=not keep)
        if not ok and not keep:
            for p in made:
                try:
                    p.rmdir()       # made for this recording, and empty again
                except OSError:
                    pass
        elif ok and work != out:
            shutil.rmtree(work, ignore_errors=True)
    if say and ended.snapshot is None:
        _record_report.say(_bundle(out), ended.text())
        triggers = (engine_options or {}).get("triggers")
        if triggers:
            print(f"hwtrace: the trigger ({', '.join(triggers)}) was never entered: the "
                  f"bundle holds the end of the run", file=sys.stderr)
    return status, ended


def _bundle(out: Path):
    from hwtrace.bundle import Bundle
    return Bundle.open(out)


def _write(dev, out: Path, eng, copy_images: bool, ended: Ended) -> None:
    dev.save_bundle(out)
    _finish_bundle(out, eng, copy_images, ended)


def _set_ended(out: Path, ended: Ended) -> None:
    """Record how the run ended in the manifest (its program ended after a snapshot)."""
    _edit_manifest(out, lambda man: man.__setitem__("recording", ended.to_dict()))


def _edit_manifest(out: Path, edit) -> None:
    mpath = out / "manifest.json"
    man = json.loads(mpath.read_text())
    edit(man)
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(man, indent=1) + "\n")
    os.replace(tmp, mpath)


def _finish_bundle(out: Path, eng, copy_images: bool, ended: Ended | None = None) -> None:
    """Record resolved address ranges, how the recording ended, and copy the
    images (manifest edit)."""
    from hwtrace.bundle import Bundle
    mpath = out / "manifest.json"
    man = json.loads(mpath.read_text())
    if ended is not None:
        man["recording"] = ended.to_dict()
        if getattr(eng, "generator", ""):
            # which generator made the streams: "compiled", or "python" (the
            # reference, far slower: e.g. address filters, ptrace logs)
            man["recording"]["generator"] = eng.generator
    resolved = getattr(eng, "resolved_ranges", None)
    if resolved:
        for where in [man.get("config")] + [s.get("config") for s in man.get("streams", [])]:
            if isinstance(where, dict) and "addr_ranges" in where:
                where["addr_ranges"] = [list(r) for r in resolved]
    vdso = getattr(eng, "vdso", None)
    if vdso is not None and getattr(eng, "vdso_pid", None) is not None:
        # no file holds the vDSO: the sideband's [vdso] maps name this copy
        images = list(man.get("images", []))
        (out / "images").mkdir(exist_ok=True)
        name = f"images/vdso-{int(eng.vdso_pid)}.bin"
        (out / name).write_bytes(vdso)
        images.append({"file": name, "path": "[vdso]", "build_id": eng.vdso_build_id})
        man["images"] = images
    if copy_images:
        b = Bundle.open(out)
        images = list(man.get("images", []))
        have = {i["path"] for i in images}
        (out / "images").mkdir(exist_ok=True)
        from hwtrace.bundle import Mmap
        for m in (r for r in b.iter_sideband() if type(r) is Mmap):
            if m.file in have or not os.path.isfile(m.file):
                continue
            have.add(m.file)
            base = re.sub(r"[^A-Za-z0-9_.+-]", "_", os.path.basename(m.file)) or "image"
            name = f"images/{m.build_id or len(images)}-{base}"[:200]
            shutil.copyfile(m.file, out / name)
            images.append({"file": name, "path": m.file, "build_id": m.build_id})
        man["images"] = images
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(man, indent=1) + "\n")
    os.replace(tmp, mpath)
