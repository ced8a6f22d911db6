"""``hwtrace record``: run (or attach to) a program while tracing it into a bundle."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
from pathlib import Path

from hwtrace.cli import CliError

DEFAULT_CONFIG = "branch;user;retc;tsc"
DEFAULT_BUFFER = 64 << 20

_FLAGS = {  # config name -> IA32_RTIT_CTL bit
    "cyc": 1 << 1, "os": 1 << 2, "user": 1 << 3, "cr3": 1 << 7, "mtc": 1 << 9,
    "tsc": 1 << 10, "branch": 1 << 13, "ptw": 1 << 12, "pwr": 1 << 4,
}
_FIELDS = {"mtc-freq": 14, "cyc-thresh": 19, "psb-freq": 24}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "record", help="record a program's execution as an Intel PT trace bundle",
        description="Run PROGRAM (or attach to --pid) while tracing it, and write "
                    "a trace bundle to DIR: the per-CPU or per-thread .pt streams "
                    "exactly as Intel PT hardware writes them, manifest.json and "
                    "sideband. The program's stdout, stderr and exit status pass "
                    "through unchanged.")
    p.add_argument("--engine", default="qemu", metavar="ENGINE",
                   help="qemu (QEMU user mode, default), ptrace (native single "
                        "stepping), perf (Intel PT hardware), auto")
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
    p.add_argument("--pid", type=int, help="attach to this running process")
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
    if args.buffer_size is not None:
        if args.num_chunks is not None or args.chunk_order is not None:
            raise CliError("give --buffer-size or --num-chunks/--chunk-order, not both")
        size = parse_size(args.buffer_size)
        if size < 4096 or size % 4096:
            raise CliError("--buffer-size must be a multiple of 4K")
        pages = size // 4096
        order = min(8, (pages & -pages).bit_length() - 1)
        return pages >> order, order
    if args.num_chunks is None and args.chunk_order is None:
        return DEFAULT_BUFFER >> 20, 8
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
    from elftools.elf.elffile import ELFFile
    try:
        with open(elf, "rb") as f:
            e = ELFFile(f)
            for secname in (".symtab", ".dynsym"):
                sec = e.get_section_by_name(secname)
                if sec is None:
                    continue
                syms = sec.get_symbol_by_name(name)
                if syms:
                    s = syms[0]
                    return s["st_value"] + (max(s["st_size"], 1) - 1 if end else 0)
    except OSError as e:
        raise CliError(f"--config: {elf}: {e.strerror}") from None
    except Exception as e:  # not an ELF file
        raise CliError(f"--config: {elf}: not a readable ELF file ({type(e).__name__})") from None
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
    from hwtrace.control.ctl import Mode
    from hwtrace.control.errors import TraceError

    prog = list(args.program)
    if prog and prog[0] == "--":
        prog = prog[1:]
    if args.pid is not None and prog:
        raise CliError("give a PROGRAM or --pid, not both")
    if args.pid is None and not prog:
        raise CliError("no program given (hwtrace record -o DIR -- PROGRAM ARGS...)")
    out = Path(args.output)
    try:
        if (out / "manifest.json").exists():
            raise CliError(f"{out} already holds a trace bundle")
    except OSError as e:
        raise CliError(f"{out}: {e.strerror}") from None
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
    engine = args.engine
    try:
        cfg = BufferConfig(num_chunks=num_chunks, chunk_order=chunk_order,
                           is_circular=bool(args.circular), ctl=ctl, cr3_match=cr3,
                           addr_ranges=tuple(abs_ranges))
    except TraceError as e:
        raise CliError(e.message) from None
    try:
        status = _record(engine, args, cfg, prog, out, elf_ranges)
    except TraceError as e:
        raise CliError(e.message) from None
    if status < 0:
        return 128 - status
    return status


def _record(engine, args, cfg, prog, out: Path, elf_ranges) -> int:
    import hwtrace
    from hwtrace.control.ctl import Mode
    dev = hwtrace.open_device(engine=engine) if hasattr(hwtrace, "open_device") else None
    if dev is None:
        from hwtrace.control.device import open_device
        dev = open_device(engine=engine)
    made = False
    try:
        eng = dev.engine
        if elf_ranges and hasattr(eng, "elf_ranges"):
            eng.elf_ranges = elf_ranges
        elif elf_ranges:
            raise CliError(f"engine {eng.name}: ELF-relative address ranges need the emulated engine")
        if hasattr(eng, "log_dir"):
            # the execution log lives in -o while the program runs (removed
            # once the bundle is written): a recorder killed mid-trace leaves
            # it where the user looks, not in /tmp
            made = not out.exists()
            try:
                out.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise CliError(f"{out}: {e.strerror}") from None
            eng.log_dir = str(out)
            from hwtrace.engines.emulated.salvage import recorder_identity
            # and, next to it, how this recording makes its bundle, for
            # 'hwtrace recover' if the recorder is killed before it does
            eng.log_meta = {"format": "hwtrace-recording", "version": 1,
                            "mode": args.mode, "config": cfg.to_dict(),
                            "num_cpus": dev.num_cpus, "copy_images": bool(args.copy_images),
                            "elf_ranges": {str(n): list(r) for n, r in elf_ranges.items()},
                            "recorder": recorder_identity(os.getpid())}
        if args.mode == "cpu":
            dev.set_mode(Mode.CPU)
            descs = [dev.alloc_buffer(cfg) for _ in range(dev.num_cpus)]
            dev.cpu_mode_alloc()
            dev.cpu_mode_start()
            try:
                status = (dev.attach(args.pid) if args.pid is not None else dev.run(prog))
            finally:
                dev.cpu_mode_stop()
        else:
            dev.set_mode(Mode.THREAD)
            descs = []
            status = (dev.attach(args.pid, follow_threads=cfg) if args.pid is not None
                      else dev.run(prog, follow_threads=cfg))
        dev.save_bundle(out)
        _finish_bundle(out, eng, args.copy_images)
        return status
    except BaseException:
        if made:
            try:
                out.rmdir()     # made for the execution log, still empty
            except OSError:
                pass
        raise
    finally:
        dev.close()


def _finish_bundle(out: Path, eng, copy_images: bool) -> None:
    """Record resolved address ranges and copy the images (manifest edit)."""
    from hwtrace.bundle import Bundle
    mpath = out / "manifest.json"
    man = json.loads(mpath.read_text())
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
