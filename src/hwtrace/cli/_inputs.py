"""What a view reads: the I/O side of ``calls``, ``summary``, ``export``
and ``branches``.

:func:`open_input` takes what the user named and returns an
:class:`Input`: a symbolizer for the traced code and one
:class:`InputStream` per stream, each of which feeds a consumer (the
call-stack builder, the branch tracker) in order:

* a trace bundle directory: its streams through :mod:`hwtrace.streams`
  (images, decoder parameters, address-space switches from the bundle;
  what the recorder said about loss in ``InputStream.entry``), decoded
  into batches with every branch ending a record;
* a raw ``.pt`` trace with its code from ``--elf FILE[:BIAS]``, the same
  way;
* a ``.jsonl`` file of ``ptoracle insn`` / ``hwtrace decode --format
  jsonl`` flow items (one stream; symbols from ``--elf``);
* a ``.jsonl`` file of branch records (``spec/branch-trace.md``: pid,
  tid, kind, from, to, time): one stream per thread.

Everything that can go wrong is a :class:`~hwtrace.cli.CliError` with one
line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, NamedTuple

from hwtrace.analysis.records import StreamInfo
from hwtrace.cli import CliError, _gc, _malloc, warn


class CodeMap(NamedTuple):
    """``size`` bytes of ``path`` from ``offset`` are code at ``start``."""

    start: int
    size: int
    path: str
    offset: int


class InputStream:
    """One stream of an input.  ``batches(**kw)`` for decoded traces,
    ``items()`` for flow-item files, ``branches()`` for branch records
    (exactly one of them is set)."""

    def __init__(self, info: StreamInfo, *, batches: Callable | None = None,
                 items: Callable | None = None, branches: Callable | None = None,
                 entry=None, size: int = 0, tsc_hz=None, stream=None):
        self.info = info
        self.batches = batches
        self.items = items
        self.branches = branches
        self.entry = entry              # hwtrace.streams.Entry or None
        self.size = size                # bytes (progress)
        self.tsc_hz = tsc_hz
        self.stream = stream            # hwtrace.streams.Stream or None


class Input:
    def __init__(self, symbolizer, streams: list, mode: str, description: str,
                 code: list | None = None, traces=None, timebase: str = ""):
        self.symbolizer = symbolizer
        self.streams = streams
        self.mode = mode
        self.description = description
        self.code = list(code or [])     # the files the decoder read code from
        self.traces = traces             # hwtrace.streams.TraceSet or None
        self.timebase = timebase         # the manifest's word on its clock


def parse_elf_arg(arg: str) -> tuple[str, int]:
    """``FILE`` or ``FILE:BIAS`` (a FILE whose name has a colon is taken
    whole when it exists)."""
    path, sep, bias = arg.rpartition(":")
    if sep and path and os.path.exists(path) and not os.path.exists(arg):
        try:
            return path, int(bias, 0)
        except ValueError:
            raise CliError(f"--elf {arg}: bad bias") from None
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


def _symbolizer(elf):
    from hwtrace.analysis.symbols import Symbolizer, SymbolError
    sym = Symbolizer()
    for arg in elf:
        f, bias = parse_elf_arg(arg)
        if os.path.isdir(f):
            raise CliError(f"--elf {arg}: is a directory")
        try:
            sym.add_image(f, bias)
        except SymbolError as e:
            raise CliError(f"--elf: {e}") from None
    return sym


def _elf_args_code(elf) -> list[CodeMap]:
    code = []
    for arg in elf:
        f, bias = parse_elf_arg(arg)
        try:
            code += elf_code(f, bias)
        except Exception as e:          # OSError, pyelftools' own errors
            raise CliError(f"--elf {arg}: {e}") from None
    return code


def open_input(path, elf=(), image_path=(), *, pt_needs_elf: bool = True) -> Input:
    from hwtrace.cli._tracemap import check_view_input
    check_view_input(path, elf, raw_trace=True)     # empty, junk, a bad --elf
    p = Path(path)
    if p.is_dir():
        inp = _bundle(p, list(elf), list(image_path))
    elif not p.exists():
        raise CliError(f"{path}: no such bundle or file")
    elif p.suffix == ".jsonl":
        inp = _jsonl(p, list(elf))
    else:
        inp = _raw(p, list(elf))
    _gc.settle()        # the input (symbols, code) lives as long as the command
    if _gc.in_command():
        _malloc.keep_freed()    # the views' chunks: freed memory reused
    return inp


# -- bundles and raw traces ---------------------------------------------------------

def _view_batches(st):
    def batches(**kw):
        kw.setdefault("view", True)
        return st.batches(**kw)
    return batches


def _bundle(p: Path, elf: list, image_path: list) -> Input:
    from hwtrace.streams import StreamsError, open_bundle
    try:
        ts = open_bundle(p, image_path=image_path, warn=warn)
    except StreamsError as e:
        raise CliError(str(e)) from None
    ts.report(warn)
    sym = ts.symbolizer
    for arg in elf:
        f, bias = parse_elf_arg(arg)
        try:
            ts.add_elf_symbols(f, bias)
        except StreamsError as e:
            raise CliError(f"--elf: {e}") from None
    code = []
    for path, start, offset, _file in ts._mapped:
        try:
            size = os.path.getsize(path) - offset
        except OSError:
            continue
        if size > 0:
            code.append(CodeMap(start, size, path, offset))
    code[:0] = _elf_args_code(elf)
    manifest = ts.bundle.manifest if ts.bundle is not None else {}
    streams = [InputStream(st.info, batches=_view_batches(st), entry=st.entry,
                           size=st.entry.size, tsc_hz=ts.tsc_hz, stream=st)
               for st in ts.streams]
    timebase = manifest.get("timebase") if isinstance(manifest.get("timebase"), str) else ""
    return Input(sym, streams, ts.mode, str(p), code, ts, timebase or "")


def _raw(p: Path, elf: list) -> Input:
    from hwtrace.flow.image import Image, Section
    from hwtrace.streams import StreamsError, open_trace
    if not elf:
        raise CliError(f"{p}: a raw trace needs its code: --elf FILE[:BIAS]")
    sym = _symbolizer(elf)
    image = Image()
    for arg in elf:
        f, bias = parse_elf_arg(arg)
        try:
            for m in elf_code(f, bias, executable_only=False):
                image.add(Section.from_file(m.path, m.offset, m.size), m.start)
        except OSError as e:
            raise CliError(f"--elf {arg}: {e.strerror or e}") from None
        except Exception as e:          # the flow image's and pyelftools' errors
            raise CliError(f"--elf {arg}: cannot load: {e}") from None
    try:
        ts = open_trace(str(p), image)
    except StreamsError as e:
        raise CliError(str(e)) from None
    ts._symbolizer = sym
    st = ts.streams[0]
    info = StreamInfo(name=p.name)
    s = InputStream(info, batches=_view_batches(st), entry=st.entry,
                    size=st.entry.size, stream=st)
    return Input(sym, [s], "thread", str(p), _elf_args_code(elf), ts)


# -- .jsonl files -------------------------------------------------------------------------

def _iter_json(p: Path):
    try:
        with open(p) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                except ValueError:
                    raise CliError(f"{p}:{n}: not JSON") from None
                if not isinstance(d, dict):
                    raise CliError(f"{p}:{n}: not a JSON object")
                yield n, d
    except OSError as e:
        raise CliError(f"{p}: {e.strerror}") from None


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
        raise CliError(f"{p}: {e.strerror}") from None
    return None


def is_branch_record(d) -> bool:
    return isinstance(d, dict) and "kind" in d and "from" in d and "to" in d \
        and "iclass" not in d


def _jsonl(p: Path, elf: list) -> Input:
    sym = _symbolizer(elf)
    code = _elf_args_code(elf)
    size = p.stat().st_size
    if is_branch_record(_first_object(p)):
        threads: dict = {}
        for n, d in _iter_json(p):
            if not is_branch_record(d):
                raise CliError(f"{p}:{n}: not a branch record")
            threads.setdefault(d.get("tid"), d.get("pid"))
        streams = []
        for tid, pid in threads.items():
            def branches(tid=tid):
                for _n, d in _iter_json(p):
                    if d.get("tid") == tid:
                        yield str(d["kind"]), d["from"], d["to"], d.get("time")
            streams.append(InputStream(StreamInfo(pid=pid, tid=tid),
                                       branches=branches))
        return Input(sym, streams, "thread", str(p), code)

    def items():
        for n, item in _iter_json(p):
            if "iclass" in item and "error" not in item:
                if not isinstance(item.get("ip"), int) or \
                        not isinstance(item.get("size", 0), int):
                    raise CliError(f"{p}:{n}: instruction without ip/size")
            yield item
    return Input(sym, [InputStream(StreamInfo(name=p.name), items=items, size=size)],
                 "thread", str(p), code)
