"""The seam between exports and the rest of hwtrace: "decode a bundle (or
a file of flow items) into per-stream items".

:func:`open_source` returns a :class:`Source`: a symbolizer for the traced
address space and a list of :class:`Job` s, one per stream, each able to
``run(consumer)``: push that stream's items into a consumer with
``insn(ip, size, iclass)`` and ``feed(item)`` (a
:class:`~hwtrace.export.pipeline.StreamExporter`).

Inputs:

* a trace bundle directory (``hwtrace.bundle``), decoded with the
  instruction-flow decoder (``hwtrace.flow``): code images and symbols
  come from the sideband's memory maps (files found through the bundle:
  stored copies, ``image_path``, or the recorded paths on this machine
  when they are ELF files with the recorded build-id: ``Bundle.find_image``);
* a ``.jsonl`` file of ``ptoracle insn``-shaped items (one stream), with
  symbols from ``elf`` arguments (``FILE[:BIAS]``);
* a ``.jsonl`` file of branch records (``spec/branch-trace.md``: pid, tid,
  kind, from, to, time): one stream per thread;
* (:func:`pt_source`) a raw ``.pt`` stream with its code from ``elf``
  arguments, decoded with the instruction-flow decoder.

Besides symbols and jobs a :class:`Source` lists the code its decoder read
(``Source.code``: file mappings), so a consumer that needs instruction
bytes (``hwtrace.branches``) reads the very same files.

Everything that can go wrong is a :class:`SourceError` with a one-line
message (the CLI prints it), including "the decoder is not available".
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, NamedTuple

from hwtrace.analysis.records import StreamInfo
from hwtrace.analysis.symbols import Symbolizer, SymbolError


class SourceError(Exception):
    """The input cannot be decoded (one line, for the user)."""


class Job:
    def __init__(self, info: StreamInfo, run: Callable, tsc_hz=None,
                 size: int = 0):
        self.info = info
        self.run = run
        self.tsc_hz = tsc_hz
        self.size = size            # bytes of trace (for progress), 0 unknown


class CodeMap(NamedTuple):
    """``size`` bytes of ``path`` from ``offset`` are code at ``start``."""

    start: int
    size: int
    path: str
    offset: int


class Source:
    def __init__(self, symbolizer: Symbolizer, jobs: list[Job], mode: str,
                 description: str, code: list[CodeMap] = ()):
        self.symbolizer = symbolizer
        self.jobs = jobs
        self.mode = mode
        self.description = description
        self.code = list(code)


def parse_elf_arg(arg: str) -> tuple[str, int]:
    """``FILE`` or ``FILE:BIAS`` (a FILE whose name has a colon is taken
    whole when it exists)."""
    path, sep, bias = arg.rpartition(":")
    if sep and path and os.path.exists(path) and not os.path.exists(arg):
        try:
            return path, int(bias, 0)
        except ValueError:
            raise SourceError(f"--elf {arg}: bad bias") from None
    return arg, 0


def elf_code(path: str, bias: int = 0, executable_only: bool = True) -> list[CodeMap]:
    """An ELF file's PT_LOAD segments (with file bytes) as loaded at
    ``bias``: the executable ones, or all of them."""
    from elftools.elf.elffile import ELFFile
    out = []
    with open(path, "rb") as f:
        for seg in ELFFile(f).iter_segments():
            h = seg.header
            if h.p_type == "PT_LOAD" and h.p_filesz and \
                    (h.p_flags & 1 or not executable_only):
                out.append(CodeMap(h.p_vaddr + bias, h.p_filesz, str(path), h.p_offset))
    return out


def _elf_args_code(elf) -> list[CodeMap]:
    code = []
    for arg in elf:
        f, bias = parse_elf_arg(arg)
        try:
            code += elf_code(f, bias)
        except Exception as e:          # OSError, pyelftools' own errors
            raise SourceError(f"--elf {arg}: {e}") from None
    return code


def open_source(path, elf: list[str] = (), image_path=()) -> Source:
    p = Path(path)
    sym = Symbolizer()
    for arg in elf:
        f, bias = parse_elf_arg(arg)
        try:
            sym.add_image(f, bias)
        except SymbolError as e:
            raise SourceError(f"--elf: {e}") from None
    if p.is_file():
        src = _jsonl_source(p, sym)
    elif not p.is_dir():
        raise SourceError(f"{path}: no such bundle or file")
    else:
        src = _bundle_source(p, sym, image_path)
    src.code[:0] = _elf_args_code(elf)
    return src


def pt_source(path, elf: list[str]) -> Source:
    """A raw ``.pt`` stream decoded against ``elf`` images (``FILE[:BIAS]``;
    at least one)."""
    p = Path(path)
    if not elf:
        raise SourceError(f"{p}: a raw trace needs its code: --elf FILE[:BIAS]")
    try:
        from hwtrace.flow import session
        from hwtrace.flow.config import FlowConfig
        from hwtrace.flow.image import Image, Section
        from hwtrace.flow.insn import InsnDecoder
        from hwtrace.flow.sinks import event_json
    except ImportError as e:
        raise SourceError(f"cannot decode raw traces yet: {e}") from None
    sym = Symbolizer()
    image = Image()
    for arg in elf:
        f, bias = parse_elf_arg(arg)
        try:
            sym.add_image(f, bias)
            for m in elf_code(f, bias, executable_only=False):
                image.add(Section.from_file(m.path, m.offset, m.size), m.start)
        except (OSError, SymbolError) as e:
            raise SourceError(f"--elf {arg}: {e}") from None
        except Exception as e:          # the flow image's own errors
            raise SourceError(f"--elf {arg}: cannot load: {e}") from None

    def run(consumer):
        try:
            data = p.read_bytes()
        except OSError as e:
            raise SourceError(f"{p}: {e.strerror}") from None
        session.run_insn(InsnDecoder(data, image, FlowConfig()),
                         FlowSink(consumer, event_json))
    try:
        size = p.stat().st_size
    except OSError as e:
        raise SourceError(f"{p}: {e.strerror}") from None
    return Source(sym, [Job(StreamInfo(name=p.name), run, None, size)],
                  "thread", str(p), _elf_args_code(elf))


def _first_object(p: Path):
    try:
        with open(p) as f:
            for line in f:
                if line.strip():
                    try:
                        return json.loads(line)
                    except ValueError:
                        return None
    except OSError as e:
        raise SourceError(f"{p}: {e.strerror}") from None
    return None


def _is_branch_record(d) -> bool:
    return isinstance(d, dict) and "kind" in d and "from" in d and "to" in d \
        and "iclass" not in d


def _branch_source(p: Path, sym: Symbolizer) -> Source:
    """Branch records, one job per thread (each re-reads the file)."""
    threads: dict = {}
    for n, d in _iter_json(p):
        if not _is_branch_record(d):
            raise SourceError(f"{p}:{n}: not a branch record")
        threads.setdefault(d.get("tid"), d.get("pid"))
    jobs = []
    for tid, pid in threads.items():
        def run(consumer, tid=tid):
            for _n, d in _iter_json(p):
                if d.get("tid") == tid:
                    consumer.branch(str(d["kind"]), d["from"], d["to"], d.get("time"))
        jobs.append(Job(StreamInfo(pid=pid, tid=tid), run, None, 0))
    return Source(sym, jobs, "thread", str(p))


def _iter_json(p: Path):
    try:
        with open(p) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                except ValueError:
                    raise SourceError(f"{p}:{n}: not JSON") from None
                if not isinstance(d, dict):
                    raise SourceError(f"{p}:{n}: not a JSON object")
                yield n, d
    except OSError as e:
        raise SourceError(f"{p}: {e.strerror}") from None


def _jsonl_source(p: Path, sym: Symbolizer) -> Source:
    if _is_branch_record(_first_object(p)):
        return _branch_source(p, sym)

    def run(consumer):
        for n, item in _iter_json(p):
            if "iclass" in item and "error" not in item:
                if not isinstance(item.get("ip"), int) or \
                        not isinstance(item.get("size", 0), int):
                    raise SourceError(f"{p}:{n}: instruction without ip/size")
            consumer.feed(item)
    return Source(sym, [Job(StreamInfo(name=p.name), run, None,
                            p.stat().st_size)], "thread", str(p))


class FlowSink:
    """hwtrace.flow.session's sink protocol -> the consumer protocol
    (``insn(ip, size, iclass)``, ``feed(item)``)."""

    def __init__(self, consumer, event_json):
        self.c = consumer
        self._insn = consumer.insn
        self._event_json = event_json

    def insn(self, insn, offset):
        self._insn(insn.ip, insn.size, insn.iclass_name)

    def block(self, block, offset):
        for i in block.insns:
            self._insn(i.ip, i.size, i.iclass_name)

    def event(self, ev, offset):
        self.c.feed(self._event_json(ev, offset))

    def error(self, kind, offset, ip, code):
        self.c.feed({"error": str(code), "kind": kind, "offset": offset,
                     "ip": ip})

    def status(self, name, offset):
        self.c.feed({"status": name, "offset": offset})


def _bundle_source(p: Path, sym: Symbolizer, image_path) -> Source:
    try:
        from hwtrace.bundle import Bundle, BundleError, Mmap, Switch, tsc_per_insn
        from hwtrace.flow import session
        from hwtrace.flow.config import FlowConfig
        from hwtrace.flow.image import Image, Section
        from hwtrace.flow.insn import InsnDecoder
        from hwtrace.flow.sinks import event_json
    except ImportError as e:
        raise SourceError(f"cannot decode bundles yet: {e}") from None
    try:
        b = Bundle(p, image_path=image_path)
        maps = []
        switches = []
        for r in b.iter_sideband():
            if isinstance(r, Mmap):
                maps.append(r)
            elif isinstance(r, Switch):
                switches.append(r)
        switches = tuple(switches)
        streams = list(b.streams)
        tsc_hz = b.manifest.get("tsc_hz") or None
        cfg = FlowConfig()
        cfg.mtc_freq = int(b.manifest.get("mtc_freq") or 0)
        cfg.nom_freq = int(b.manifest.get("nom_freq") or 0)
        cfg.cpuid_0x15_eax = int(b.manifest.get("cpuid_0x15_eax") or 0)
        cfg.cpuid_0x15_ebx = int(b.manifest.get("cpuid_0x15_ebx") or 0)
        cfg.enable_tick_events = True
        _set_cpu(cfg, b)
    except BundleError as e:
        raise SourceError(f"{p}: {e}") from None
    except (AttributeError, TypeError, ValueError) as e:
        raise SourceError(f"{p}: cannot read bundle: {e}") from None
    if not streams:
        raise SourceError(f"{p}: bundle has no streams")

    images: dict = {}
    code: list[CodeMap] = []
    missing = []
    seen = set()
    union = Image()
    for m in maps:
        f = b.find_image(m.file, m.build_id)
        if f is None:
            missing.append(m.file)
            continue
        try:
            size = min(m.size, os.path.getsize(f) - m.offset)
        except OSError:
            size = 0
        if size <= 0:
            continue
        img = images.setdefault(m.pid, Image())
        try:
            img.add(Section.from_file(str(f), m.offset, size), m.start)
            union.add(Section.from_file(str(f), m.offset, size), m.start)
        except Exception as e:          # a foreign module's error types
            raise SourceError(f"{m.file}: cannot load: {e}") from None
        code.append(CodeMap(m.start, size, str(f), m.offset))
        if (str(f), m.start) not in seen:
            seen.add((str(f), m.start))
            try:
                sym.add_mapping(f, m.start, m.offset)
            except SymbolError:
                pass
    if not images:
        why = f" (not found: {missing[0]})" if missing else ""
        raise SourceError(f"{p}: no code images to decode with{why}")

    jobs = []
    for s in streams:
        image = images.get(s.pid, union) if s.pid is not None else union
        # a CPU's stream: the context switches, for per-thread call stacks
        per_cpu = s.tid is None and s.cpu is not None
        info = StreamInfo(pid=s.pid, tid=s.tid, cpu=s.cpu,
                          switches=switches if per_cpu else (),
                          tsc_per_insn=tsc_per_insn(b.manifest))

        def run(consumer, s=s, image=image):
            try:
                data = b.read_stream(s)
            except BundleError as e:
                raise SourceError(f"{p}: {e}") from None
            dec = InsnDecoder(data, image, cfg)
            session.run_insn(dec, FlowSink(consumer, event_json))

        jobs.append(Job(info, run, tsc_hz, s.size))
    return Source(sym, jobs, b.mode, str(p), code)


def _set_cpu(cfg, b) -> None:
    c = b.cpu
    if not (getattr(c, "family", 0) and getattr(c, "vendor", "") == "GenuineIntel"):
        return
    try:
        from hwtrace.flow.config import Errata
        from hwtrace.pt import cpu as cpumod
        cpu = cpumod.Cpu.parse(f"{c.family}/{c.model}/{getattr(c, 'stepping', 0)}")
        cfg.cpu = cpu
        errata = cpumod.errata(cpu)
        if not isinstance(errata, Exception) and hasattr(Errata, "from_flags"):
            cfg.errata = Errata.from_flags(errata)
    except (ImportError, ValueError, AttributeError, TypeError):
        pass
