"""The streams a command decodes, and their batches: the I/O side of the
decoding pipeline (docs/pipeline.md).

Every command that decodes (``decode``, ``calls``, ``summary``,
``export``, ``branches``, ``coverage``, ``diff``) opens its input here and
gets a :class:`TraceSet`: one :class:`Stream` per ``.pt`` stream, each
knowing who it belongs to (:attr:`Stream.info`: pid/tid/cpu and, for a
CPU's stream, the context switches), what was lost while recording
(:attr:`Stream.entry`: lost bytes, wrapped, stopped), its decoder
configuration and its code (the initial image and, for bundles, the plan
to switch address spaces by PIP or by the sideband's context switches:
:class:`hwtrace.flow.spaces.SpacePlan`).  :meth:`Stream.batches` decodes
it (compiled core or Python twin: :func:`hwtrace.flow.batches.batches`),
reading the trace through a read-only file mapping whose pages are
released behind the decoder.

Inputs:

* a bundle directory (:func:`open_bundle`): streams from the manifest,
  decoder parameters (CPU, MTC/nominal frequency, CPUID 0x15) from the
  manifest, images from the sideband through the bundle's trust rules
  (:meth:`hwtrace.bundle.Bundle.find_image`);
* a raw trace with its images (:func:`open_trace`).

Everything that can go wrong before decoding starts is a
:class:`StreamsError` with one line for the user.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from hwtrace._records import Fields
from hwtrace.flow.config import FlowConfig


class StreamsError(Exception):
    """The input cannot be decoded (one line, for the user)."""


# Plain records, not dataclasses: every command that decodes creates them
# at start-up (see hwtrace._records).


class Entry(Fields):
    """What the recorder said about a stream (a bundle's manifest entry;
    for a raw trace, its size only)."""

    _fields = ("file", "size", "instructions_observed", "capture_end",
               "wrapped", "stopped", "lost_bytes", "ctl")

    def __init__(self, file: str, size: int = 0,
                 instructions_observed: int = 0, capture_end: int = 0,
                 wrapped: bool = False, stopped: bool = False,
                 lost_bytes: int = 0, ctl: int | None = None):
        self.file = file
        self.size = size
        self.instructions_observed = instructions_observed
        self.capture_end = capture_end
        self.wrapped = wrapped
        self.stopped = stopped
        self.lost_bytes = lost_bytes
        self.ctl = ctl              # IA32_RTIT_CTL it was recorded with

    @property
    def lossy(self) -> bool:
        return bool(self.wrapped or self.stopped or self.lost_bytes)

    def loss(self) -> str:
        """What the recorder lost, short ("" if nothing): how the views
        and coverage say it."""
        what = []
        if self.stopped:
            what.append("buffer full, tracing stopped")
        if self.wrapped:
            what.append("ring buffer wrapped, oldest data overwritten")
        if self.lost_bytes:
            what.append(f"{self.lost_bytes:,} bytes lost")
        return ", ".join(what)


class Stream(Fields):
    """One decodable stream: ``name``, ``path``, ``info`` (a
    :class:`hwtrace.analysis.records.StreamInfo`, or the keywords to make
    one when first asked: the views want it, counts and coverage do not,
    and importing hwtrace.analysis costs a command that only counts ~3 ms
    of start-up), ``entry``,
    ``config``, ``image`` (the initial hwtrace.flow.image.Image),
    ``plan`` (hwtrace.flow.spaces.SpacePlan or None), ``offset`` and
    ``length`` (--pt FILE:FROM-TO: a slice of the file), ``warn``:
    ``warn(text)`` is told, once, what a decode of this stream found the
    trace does not tell (:meth:`report`); None: nobody is told."""

    _fields = ("name", "path", "info", "entry", "config", "image", "plan",
               "offset", "length", "warn")

    def __init__(self, name: str, path: str, info, entry: Entry,
                 config: FlowConfig, image: object, plan: object = None,
                 offset: int = 0, length: int | None = None,
                 warn: Callable | None = None):
        self.name = name
        self.path = path
        self._info = info
        self.entry = entry
        self.config = config
        self.image = image
        self.plan = plan
        self.offset = offset
        self.length = length
        self.warn = warn
        self._reported = False

    @property
    def info(self):
        """Who the stream belongs to (:class:`hwtrace.analysis.records.StreamInfo`)."""
        info = self._info
        if isinstance(info, dict):
            from hwtrace.analysis.records import StreamInfo
            info = self._info = StreamInfo(**info)
        return info

    def data(self):
        """The trace bytes, mapped (see hwtrace.cli._tracemap)."""
        from hwtrace.cli._tracemap import map_trace
        try:
            return map_trace(self.path, self.offset, self.length)
        except OSError as e:
            raise StreamsError(f"{self.path}: {e.strerror or e}") from None
        except ValueError as e:
            raise StreamsError(f"{self.path}: {e}") from None

    def batches(self, decoder: str = "block", *, view: bool = False,
                want_insns: bool = False, resync: bool = False,
                max_records: int = 1 << 16, impl: str | None = None,
                on_switch: Callable | None = None, data=None,
                space_items: bool = False, plain_events: bool = False):
        """Decode into :class:`hwtrace.flow.batches.Batch` es.  ``view``:
        every branch ends a record (what call stacks, branch records and
        coverage want); ``on_switch(space, offset)`` hears address-space
        switches; ``space_items``: they are items of the batches too
        (:class:`hwtrace.flow.batches.SpaceItem`, where they happened);
        ``plain_events``: see :func:`hwtrace.flow.batches.batches`."""
        from hwtrace.flow import batches as B
        cfg = B.view_config(self.config) if view else self.config
        plan = self.plan
        if plan is not None and on_switch is not None:
            plan = plan.replace(on_switch=on_switch)
        it = B.batches(self.data() if data is None else data, self.image,
                       cfg, decoder=decoder, resync=resync,
                       want_insns=want_insns, max_records=max_records,
                       impl=impl, spaces=plan, space_items=space_items,
                       plain_events=plain_events)
        if plan is None or self.warn is None:
            return it
        return self._reporting(it)

    def _reporting(self, it):
        yield from it
        self.report()

    def report(self, warn: Callable | None = None) -> None:
        """Tell ``warn`` (default :attr:`warn`), once per stream, where a
        decode of it placed an enable by time alone although the trace and
        the sideband allowed several processes there (each had left user
        code exactly at its IP; :attr:`hwtrace.flow.spaces.SpacePlan.ambiguous`):
        what follows up to the next switch may be another process's.
        :meth:`batches` calls it when its batches end; a decode that does
        not go through them (the compiled core's counts) calls it after."""
        warn = warn or self.warn
        amb = getattr(self.plan, "ambiguous", None)
        if self._reported or warn is None or not amb:
            return
        self._reported = True
        warn(ambiguity_warning(self.name, amb))


class TraceSet(Fields):
    """What one command decodes."""

    _fields = ("streams", "mode", "description", "bundle", "spaces",
               "warnings", "tsc_hz", "_symbolizer", "_mapped")

    def __init__(self, streams: list, mode: str, description: str,
                 bundle: object = None, spaces: object = None,
                 warnings: list | None = None, tsc_hz: float | None = None,
                 _symbolizer: object = None, _mapped: list | None = None):
        self.streams = streams
        self.mode = mode                # "cpu" | "thread"
        self.description = description
        self.bundle = bundle            # hwtrace.bundle.Bundle or None
        self.spaces = spaces            # hwtrace.flow.spaces.AddressSpaces
        #: known before decoding: :meth:`report`
        self.warnings = [] if warnings is None else warnings
        self.tsc_hz = tsc_hz
        self._symbolizer = _symbolizer
        #: (path, start, offset, recorded file)
        self._mapped = [] if _mapped is None else _mapped
        self._images: dict = {}         # (path, start) -> the symbolizer's Image
        self._space_fn = False          # space_lookup()'s, once made
        self._reported = False

    def report(self, warn: Callable) -> None:
        """Tell ``warn``, once, what the bundle says before any decode
        that the decode cannot fix (:attr:`warnings`: a stream that runs
        several processes with no MTC/CYC to place the switches, ...).
        Every command that opens a bundle calls it before decoding; what
        a decode finds is each :meth:`Stream.report`'s."""
        if self._reported:
            return
        self._reported = True
        for w in self.warnings:
            warn(w)

    @property
    def symbolizer(self):
        """Symbols of every mapped file (built on first use)."""
        if self._symbolizer is None:
            from hwtrace.analysis.symbols import Symbolizer, SymbolError
            sym = Symbolizer()
            self._images = {}
            for path, start, offset, file in self._mapped:
                try:
                    self._images[(path, start)] = sym.add_mapping(path, start, offset, file)
                except SymbolError:
                    pass
            self._symbolizer = sym
        return self._symbolizer

    def space_lookup(self):
        """For the views: ``f(space)``, the lookup naming an address
        space's code (a :class:`~hwtrace.flow.batches.SpaceItem`'s) by
        the files mapped in it (and ``--elf`` symbols) -- or None where
        every space maps the same files (or there are none), and
        :attr:`symbolizer`, which holds every mapped file of every
        process, names them all.  Processes running different programs
        share addresses (under QEMU every program is loaded at the same
        base: a shell and the gzip it starts), which one table of every
        file cannot tell apart.  Made once: every caller (the views, the
        coverage beside them) gets the same lookups."""
        if self._space_fn is False:
            self._space_fn = self._make_space_lookup()
        return self._space_fn

    def _make_space_lookup(self):
        if self.spaces is None:
            return None
        files = {}
        for sp in self.spaces.spaces:
            files.setdefault(frozenset((m.path, m.start) for m in sp.mappings), sp)
        if len(files) <= 1:
            return None
        sym = self.symbolizer
        extra = [img for img in sym.images if img not in self._images.values()]
        from hwtrace.analysis.symbols import Symbolizer
        made: dict = {}

        def lookup(space):
            key = frozenset((m.path, m.start) for m in space.mappings)
            got = made.get(key)
            if got is None:
                s = Symbolizer()
                for m in space.mappings:
                    img = self._images.get((m.path, m.start))
                    if img is not None and img not in s.images:
                        s.images.append(img)
                s.images.extend(extra)
                got = made[key] = s.lookup
            return got
        return lookup

    def function_places(self):
        """For the summary: ``f(name, addr)``, the place -- (file name,
        file, link-time address) -- of the function ``name`` that starts at run-time
        ``addr``, where every process that has a function of that name
        there has the same one; None where the processes' address spaces
        all map the same files.  The processes of a shell script load
        ld.so and libc each at its own base: one function, several
        addresses, one place."""
        lookup = self.space_lookup()
        if lookup is None:
            return None
        syms = list({id(s): s for s in (lookup(sp).__self__
                                         for sp in self.spaces.spaces)}.values())

        def place(name: str, addr: int):
            got = set()
            for s in syms:
                img = s.image_for(addr)
                if img is None:
                    continue
                r = img.lookup(addr)
                if r == (addr, name) if r is not None else img.unnamed(addr) == name:
                    got.add((img.label, img.path, addr - img.bias))
            return got.pop() if len(got) == 1 else None
        return place

    def add_elf_symbols(self, path: str, bias: int = 0) -> None:
        from hwtrace.analysis.symbols import SymbolError
        try:
            self.symbolizer.add_image(path, bias)
        except SymbolError as e:
            raise StreamsError(f"{path}: {e}") from None


def ambiguity_warning(name: str, offsets) -> str:
    """The warning of :meth:`Stream.report`: stream ``name`` placed the
    enables at ``offsets`` by time alone."""
    offs = sorted(offsets)
    shown = ", ".join(f"{o:#x}" for o in offs[:5]) + (", ..." if len(offs) > 5 else "")
    return (f"{name}: {len(offs)} enable(s) (at offset {shown}) could be either of "
            f"several processes that stopped at the same IP, and the time stamps do "
            f"not separate them: placed by time alone (record with CYC, e.g. "
            f"--config 'branch;user;retc;tsc;mtc;cyc')")


# -- decoder parameters ------------------------------------------------------------

def manifest_options(manifest: dict) -> dict:
    """A bundle manifest's decoder parameters: ``cpu`` ("F/M/S") and the
    timing fields, each only where the manifest has a usable value."""
    out = {}
    cpu = manifest.get("cpu")
    cpu = cpu if isinstance(cpu, dict) else {}
    fam, mod, step = cpu.get("family"), cpu.get("model", 0), \
        cpu.get("stepping", 0)
    if fam and cpu.get("vendor", "GenuineIntel") == "GenuineIntel" and \
            all(type(v) is int and 0 <= v < 256 for v in (fam, mod, step)):
        out["cpu"] = f"{fam}/{mod}/{step}" if step else f"{fam}/{mod}"
    for key in ("mtc_freq", "nom_freq", "cpuid_0x15_eax", "cpuid_0x15_ebx"):
        v = manifest.get(key)
        if type(v) is int and 0 < v < 1 << 32:
            out[key] = v
    return out


def flow_config(options: dict, base: FlowConfig | None = None) -> FlowConfig:
    """``base`` (or a default FlowConfig) with ``options`` (as from
    :func:`manifest_options`) applied: the CPU's errata, timing."""
    cfg = base.replace() if base is not None else FlowConfig()
    cpu = options.get("cpu")
    if cpu:
        from hwtrace.pt import cpu as cpumod
        try:
            c = cpumod.Cpu.parse(cpu)
        except ValueError as e:
            raise StreamsError(f"cpu {cpu}: {e}") from None
        cfg.set_cpu(c)              # an unknown CPU: no workarounds
    for key in ("mtc_freq", "nom_freq", "cpuid_0x15_eax", "cpuid_0x15_ebx"):
        if key in options:
            setattr(cfg, key, options[key])
    return cfg


def program_names(records) -> tuple:
    """(pid, name) of every process of the sideband ``records``, in pid
    order: the base names of the files it ran (else its command names:
    perf's comm), in turn -- a forked shell that execs ``tr`` is ``dash ->
    tr``."""
    from hwtrace.bundle import Process
    names: dict = {}
    for r in records:
        if isinstance(r, Process):
            name = os.path.basename(r.exe) if r.exe else r.comm
            seen = names.setdefault(r.pid, [])
            if name and (not seen or seen[-1] != name):
                seen.append(name)
    return tuple(sorted((p, " -> ".join(n)) for p, n in names.items() if n))


def thread_creators(records) -> tuple:
    """(tid, creator's tid) of the sideband ``records``' threads: the
    thread that made each one (its ``parent_tid``), or for a process's
    first thread, the parent process's (``hwtrace diff`` pairs a CPU
    stream's threads by the same rule)."""
    from hwtrace.bundle import Process, Thread
    creators: dict = {}
    ppid: dict = {}
    for r in records:
        if isinstance(r, Thread) and r.parent_tid > 0:
            creators.setdefault(r.tid, r.parent_tid)
        elif isinstance(r, Process):
            ppid.setdefault(r.pid, r.ppid)
    for pid, pp in ppid.items():
        if pid not in creators and pp and pp in ppid:
            creators[pid] = pp
    return tuple(sorted(creators.items()))


def thread_exits(records) -> tuple:
    """(tid, time) of the sideband ``records``' exits, in tid order: when
    each thread ended (a process's record, tid == pid, may be timed at
    the process's end rather than its first thread's)."""
    from hwtrace.bundle import Exit
    return tuple(sorted((r.tid, r.time) for r in records
                        if isinstance(r, Exit) and r.tid > 0))


def _about(path, e) -> str:
    """``path: message`` unless the message names the path already."""
    msg = str(e)
    return msg if msg.startswith(str(path)) else f"{path}: {msg}"


# -- bundles -----------------------------------------------------------------------------

_CYC_EN, _MTC_EN, _CR3_FILTER = 1 << 1, 1 << 9, 1 << 7


def _cr3_filter(cfg: dict) -> int | None:
    """The CR3_MATCH a stream's buffer configuration filtered by (None: no
    CR3 filter)."""
    ctl, match = cfg.get("ctl"), cfg.get("cr3_match")
    if type(ctl) is int and ctl & _CR3_FILTER and type(match) is int:
        return match
    return None


def open_bundle(path, *, image_path=(), allow_outside: bool = False,
                only=(), config: Callable | FlowConfig | None = None,
                extend: Callable | None = None,
                require_images: bool = True,
                warn: Callable | None = None) -> TraceSet:
    """The streams of the bundle at ``path``.

    ``only``: stream names to keep (default all).  ``config``: a
    FlowConfig to use as is, or ``config(options) -> FlowConfig`` given
    the manifest's :func:`manifest_options` (a CLI merges its own options);
    default :func:`flow_config` of them.  ``extend(image)`` loads more code
    into every address space (``--raw``/``--elf`` on top).  With
    ``require_images`` a mapped file that can't be found is an error
    naming it; else its code is "no memory mapped" in the decode.
    ``warn(text)``: what a decode of a stream finds the trace does not tell
    (:meth:`Stream.report`; the warnings known before decoding are
    :attr:`TraceSet.warnings`, said by :meth:`TraceSet.report`)."""
    from hwtrace.bundle import (Bundle, BundleError, Mmap, Switch, insn_clock_counted,
                                insn_clock_exact, tsc_per_insn)
    from hwtrace.flow.spaces import AddressSpaces, SpacePlan

    for d in image_path:
        if not os.path.isdir(d):
            raise StreamsError(f"--image-path {d}: not a directory")
    try:
        b = Bundle(path, image_path=list(image_path),
                   allow_outside=allow_outside)
        entries = {s.file: s for s in b.streams}
        names = list(entries)
        if only:
            missing = [n for n in only if n not in entries]
            if missing:
                raise StreamsError(f"no stream {missing[0]!r} in {path}")
            names = list(only)
        paths = {}
        for n in names:
            paths[n] = b.stream_file(entries[n])     # refuses a symbolic link
            b.open_stream(entries[n]).close()        # a regular file of its size
        records = list(b.iter_sideband())
        manifest = b.manifest
    except BundleError as e:
        raise StreamsError(_about(path, e)) from None
    except OSError as e:
        raise StreamsError(f"{path}: {e.strerror or e}") from None
    if not names:
        raise StreamsError(f"{path}: bundle has no streams")

    options = manifest_options(manifest)
    if isinstance(config, FlowConfig):
        cfg = config
    elif config is not None:
        cfg = config(options)
    else:
        cfg = flow_config(options)

    found: dict = {}

    def resolve(file, build_id):
        key = (file, build_id)
        if key not in found:
            found[key] = b.image_file(file, build_id)
        return found[key]

    try:
        spaces = AddressSpaces(records, resolve, extend)
    except BundleError as e:
        raise StreamsError(_about(path, e)) from None
    except OSError as e:
        raise StreamsError(f"{path}: sideband: {e.strerror}") from None

    # the switches on CPUs this bundle traced: a thread switched in on an
    # untraced CPU (perf's child before its exec, on another CPU) ran
    # nothing a stream shows, and must not count as having run elsewhere
    traced = {e.cpu for e in b.streams if e.cpu is not None}
    switches = tuple(r for r in records if isinstance(r, Switch)
                     and (not traced or r.cpu in traced))
    tsc_hz = manifest.get("tsc_hz") or None
    ts = TraceSet([], b.mode, str(path), b, spaces, tsc_hz=tsc_hz)
    gone = b.sideband_missing
    if gone is not None:
        ts.warnings.append(f"{path}: its sideband ({gone}) is missing: no process, "
                           f"memory map or context switch is known, so the code "
                           f"the trace ran is not found")
    programs = program_names(records)
    creators = thread_creators(records)
    exits = thread_exits(records)
    seen = set()
    for r in records:
        if isinstance(r, Mmap):
            f = found.get((r.file, r.build_id))
            if f is None:
                f = resolve(r.file, r.build_id)
            if f is not None and (str(f), r.start) not in seen:
                seen.add((str(f), r.start))
                ts._mapped.append((str(f), r.start, r.offset, r.file))

    mcfg = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    for n in names:
        e = entries[n]
        scfg = e.config if isinstance(e.config, dict) else mcfg
        timeline, initial = spaces.for_stream(e.cpu, e.tid, e.pid, _cr3_filter(scfg))
        used = timeline.spaces() if timeline is not None else [initial]
        missing = spaces.missing_for(used) if timeline is not None else \
            list(spaces.missing)
        # Files on disk only: "[vdso]", "[kernel.kallsyms]_text", "//anon"
        # decode only if the bundle stores them; without, their code is a
        # "no memory mapped" error in the output, as for any gap.
        missing = [m for m in missing
                   if m[1].startswith("/") and not m[1].startswith("//")]
        if missing and require_images:
            pid, file, _bid = missing[0]
            k = len({m[1] for m in missing}) - 1
            more = f" (and {k} more file{'s' if k > 1 else ''})" if k else ""
            raise StreamsError(
                f"{path}: no image for {file} of process {pid}{more}: record "
                f"with --copy-images, or give --image-path DIR (or "
                f"--allow-outside for a trusted bundle)")
        ectl = e.config.get("ctl") if isinstance(e.config, dict) else None
        mctl = manifest.get("config", {}).get("ctl") \
            if isinstance(manifest.get("config"), dict) else None
        ctl = ectl if type(ectl) is int else mctl if type(mctl) is int else None
        counted = insn_clock_counted(
            manifest, e.config if isinstance(e.config, dict) else None)
        # an instruction-counted clock places every enable exactly
        # (flow.spaces.InsnClock): only a real clock needs MTC/CYC for it
        if timeline is not None and len(used) > 1 and ctl is not None and \
                not ctl & (_CYC_EN | _MTC_EN) and not counted:
            ts.warnings.append(
                f"{n} runs {len(used)} processes but its trace has no "
                f"MTC/CYC packets: process switches are placed by TSC alone "
                f"(record with e.g. --config 'branch;user;retc;tsc;mtc;cyc')")
        per_cpu = e.tid is None and e.cpu is not None
        info = dict(pid=e.pid, tid=e.tid, cpu=e.cpu, name=n,
                          switches=switches if per_cpu else (),
                          tsc_per_insn=tsc_per_insn(manifest),
                          clock_exact=insn_clock_exact(
                              manifest, e.config if isinstance(e.config, dict) else None),
                          clock_counted=counted, programs=programs,
                          creators=creators if per_cpu else (),
                          exits=exits if per_cpu else ())
        entry = Entry(n, e.size, e.instructions_observed, e.capture_end,
                      e.wrapped, e.stopped, e.lost_bytes, ctl)
        plan = SpacePlan(spaces, timeline, initial,
                         cyc=ctl is not None and bool(ctl & _CYC_EN),
                         insn_clock=info["clock_counted"])
        ts.streams.append(Stream(n, str(paths[n]), info, entry, cfg,
                                 initial.image, plan, warn=warn))
    return ts


# -- raw traces --------------------------------------------------------------------------

def open_trace(path: str, image, config: FlowConfig | None = None, *,
               offset: int = 0, length: int | None = None,
               name: str | None = None) -> TraceSet:
    """One raw trace file (or ``length`` bytes of it from ``offset``)
    decoded with ``image``."""
    from pathlib import Path
    p = Path(path)
    try:
        size = os.stat(p).st_size
    except OSError as e:
        raise StreamsError(f"{path}: {e.strerror}") from None
    if length is None:
        length_ = max(0, size - offset)
    else:
        length_ = length
    if p.is_dir():
        raise StreamsError(f"{path}: is a directory, not a trace file")
    # the checks of every command's --pt: empty, no PSB (cli/_tracemap.py)
    from hwtrace.cli._tracemap import map_trace, trace_problem
    try:
        problem = trace_problem(map_trace(p, offset, length))
    except (OSError, ValueError) as e:
        raise StreamsError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
    if problem:
        raise StreamsError(f"{path}: {problem}")
    n = name or p.name
    st = Stream(n, str(p), {"name": n}, Entry(n, length_),
                config or FlowConfig(), image, None, offset, length)
    return TraceSet([st], "thread", str(p))


def iter_batches(ts: TraceSet, **kw) -> Iterator[tuple]:
    """``(stream, batch)`` for every stream in order (a convenience for
    views that take one stream after the other)."""
    for st in ts.streams:
        for b in st.batches(**kw):
            yield st, b
