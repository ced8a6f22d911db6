"""The on-disk trace bundle: per-CPU / per-thread ``.pt`` streams, manifest, sideband.

A bundle is a directory::

    DIR/manifest.json     what the streams are and how to decode them
    DIR/cpu0.pt ...       raw Intel PT bytes, exactly as the hardware writes
    DIR/tid1234.pt        them (any libipt tool reads them), oldest byte first
    DIR/sideband.jsonl    one JSON object per line: processes + CR3s, threads,
                          memory maps (file, offset, build-id), context
                          switches, exits -- all with time
    DIR/images/...        copies of mapped executables (``--copy-images``)

``manifest.json`` (format ``hwtrace-bundle``, version 1) holds: ``engine``,
``mode`` ("cpu" | "thread"), ``config`` (the buffer config:
``num_chunks``, ``chunk_order``, ``is_circular``, ``ctl``, ``cr3_match``,
``addr_ranges``), ``capabilities`` (CPUID 0x14 fields), ``cpu``
(``vendor``, ``family``, ``model``, ``stepping``), ``nom_freq``,
``cpuid_0x15_eax``/``cpuid_0x15_ebx`` (TSC/crystal ratio), ``mtc_freq``
(the MTCFreq encoding), ``timebase``, ``tsc_hz``, ``sideband`` (file name),
``images`` and ``streams``: a list of ``{"file", "cpu" | "tid" (+ "pid"),
"instructions_observed", "size", "capture_end", "wrapped", "stopped",
"lost_bytes", "config"?}``.

Writers (the emulated engine via the device's ``save_bundle``, ``hwtrace
record``, ``hwtrace import``, ``hwtrace recover``) use :class:`BundleWriter`;
decoders use :class:`Bundle`. The reader treats a bundle as hostile: stream and
image names must be plain names inside the bundle (no ``..``, no absolute
paths, no symlinks out), sizes are checked against the files, JSON inputs are
size-limited, and nothing outside the bundle is read unless the caller allows
it (``image_path`` / ``allow_outside``). Every problem is a :class:`BundleError`.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections import namedtuple
from collections.abc import Iterable, Iterator, Mapping

from hwtrace import _pathstr as P
from hwtrace._records import Fields, Typed

FORMAT = "hwtrace-bundle"
VERSION = 1
MANIFEST = "manifest.json"
SIDEBAND = "sideband.jsonl"
IMAGES = "images"

MAX_MANIFEST_BYTES = 16 << 20
MAX_STREAMS = 1 << 16
MAX_SIDEBAND_LINE = 1 << 16
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,200}$")
_U64 = 1 << 64


class BundleError(ValueError):
    """A bundle that is missing, malformed or hostile (one-line message)."""


#: how the manifest's ``timebase`` of an emulated recording begins: its TSC
#: advances one tick per retired user instruction (time nothing traced ran
#: in shows as a TSC packet: idle), the same clock for every stream
INSN_CLOCK = "instruction count"


def tsc_per_insn(manifest: Mapping[str, object]) -> float | None:
    """TSC ticks per traced instruction when the manifest's timebase is the
    instruction-count clock (1); None for a real clock (it varies)."""
    tb = manifest.get("timebase") if isinstance(manifest, Mapping) else None
    return 1.0 if isinstance(tb, str) and tb.startswith(INSN_CLOCK) else None


def insn_clock_counted(manifest: Mapping[str, object], config: object = None) -> bool:
    """Whether a stream's clock counts exactly its traced instructions: the
    instruction-count clock (:func:`tsc_per_insn`), every instruction
    retired on the stream traced (no CR3 filter, no address ranges: an
    untraced stretch advances the clock unseen) and TSC packets on (TSCEn:
    a jump while tracing is off -- an idle CPU -- is told by one).  Its
    time then moves only by the traced instructions, or jumps at an enable.
    ``config``: the stream's recording config (default: the manifest's)."""
    if tsc_per_insn(manifest) is None:
        return False
    cfg = config if isinstance(config, Mapping) else manifest.get("config")
    if not isinstance(cfg, Mapping):
        return False
    ctl = cfg.get("ctl")
    if type(ctl) is not int:
        return False
    tsc_en, cr3_filter = 1 << 10, 1 << 7
    addr_cfg = 0xFFFF << 32
    return bool(ctl & tsc_en) and not ctl & (cr3_filter | addr_cfg) \
        and not cfg.get("cr3_match") and not cfg.get("addr_ranges")


def insn_clock_exact(manifest: Mapping[str, object], config: object = None) -> bool:
    """Whether a stream's time is known at every instruction: its clock
    counts exactly the traced instructions (:func:`insn_clock_counted`)
    and TSC packets alone tell it (no MTC or CYC, whose times libipt's
    model lets trail the clock, or lead it: an instruction's time includes
    the timing packets read ahead to the next TNT/TIP).  The last TSC plus
    the instructions since is then the time."""
    if not insn_clock_counted(manifest, config):
        return False
    cfg = config if isinstance(config, Mapping) else manifest.get("config")
    cyc_en, mtc_en = 1 << 1, 1 << 9
    return not cfg["ctl"] & (cyc_en | mtc_en)


# ---------------------------------------------------------------- sideband
#
# The records are immutable NamedTuples equal only to their own type
# (hwtrace._records.Typed), not frozen dataclasses: every command that
# opens a bundle creates these classes at start-up (hwtrace._records says
# what a dataclass costs there).  ``_replace`` makes a changed copy;
# ``_strings`` names the fields that are strings (the others are ints).


class Process(Typed, namedtuple("Process", "pid cr3 comm exe ppid time",
                                defaults=("", "", 0, 0))):
    """A process (or a new address space after exec) and its CR3 from ``time`` on."""
    __slots__ = ()
    _strings = ("comm", "exe")


class Thread(Typed, namedtuple("Thread", "tid pid time parent_tid",
                               defaults=(0, 0))):
    """A thread that started (or was first seen) at ``time``."""
    __slots__ = ()
    _strings = ()


class Mmap(Typed, namedtuple("Mmap", "pid start size offset file build_id "
                             "prot time", defaults=("", "r-x", 0))):
    """An executable mapping: [start, start+size) maps ``file`` at ``offset``."""
    __slots__ = ()
    _strings = ("file", "build_id", "prot")


class Switch(Typed, namedtuple("Switch", "cpu time prev_pid prev_tid "
                               "next_pid next_tid")):
    """On ``cpu`` at ``time``, ``prev_tid`` was switched out for ``next_tid``.

    A tid of -1 is the idle task / nothing traced.
    """
    __slots__ = ()
    _strings = ()


class Exit(Typed, namedtuple("Exit", "pid tid time status", defaults=(0, 0))):
    """A thread (or, with tid == pid, a process) ended at ``time``."""
    __slots__ = ()
    _strings = ()


SIDEBAND_TYPES: dict[str, type] = {
    "process": Process, "thread": Thread, "mmap": Mmap, "switch": Switch, "exit": Exit,
}
_TYPE_NAMES = {cls: name for name, cls in SIDEBAND_TYPES.items()}


def sideband_to_json(rec: object) -> str:
    """One JSON line (no newline) for a sideband record."""
    name = _TYPE_NAMES.get(type(rec))
    if name is None:
        raise TypeError(f"not a sideband record: {type(rec).__name__}")
    d = {"type": name}
    d.update(zip(rec._fields, rec))
    return json.dumps(d, separators=(",", ":"))


def sideband_from_json(obj: object) -> object:
    """The record for one decoded JSON object; BundleError if malformed."""
    if not isinstance(obj, dict):
        raise BundleError("sideband: record is not an object")
    cls = SIDEBAND_TYPES.get(obj.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise BundleError(f"sideband: unknown record type {str(obj.get('type'))[:40]!r}")
    kw = {}
    strings = cls._strings
    for name in cls._fields:
        if name not in obj:
            continue
        v = obj[name]
        if name in strings:
            if not isinstance(v, str) or len(v) > 4096:
                raise BundleError(f"sideband: {name} is not a string")
        elif isinstance(v, bool) or not isinstance(v, int) or not -_U64 < v < _U64:
            raise BundleError(f"sideband: {name} is not an integer")
        kw[name] = v
    try:
        return cls(**kw)
    except TypeError as e:
        raise BundleError(f"sideband: {cls.__name__} record lacks a field") from e


class SidebandWriter:
    """Appends sideband records to a JSON-lines file, one flushed line each,
    so a crash of the writer loses nothing already added."""

    def __init__(self, path: str | os.PathLike, *, append: bool = True):
        from pathlib import Path
        self.path = Path(path)
        self._f = _open_append(self.path) if append else _create(self.path, "w")

    def add(self, rec: object) -> None:
        self._f.write(sideband_to_json(rec) + "\n")
        self._f.flush()

    def extend(self, recs: Iterable[object]) -> None:
        for r in recs:
            self.add(r)

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def iter_sideband_file(path: str | os.PathLike) -> Iterator[object]:
    """Records of a sideband JSON-lines file; a torn last line (crash) is skipped."""
    with open(path, "rb") as f:
        while True:
            line = f.readline(MAX_SIDEBAND_LINE + 1)
            if not line:
                return
            if len(line) > MAX_SIDEBAND_LINE:
                raise BundleError("sideband: line too long")
            if not line.endswith(b"\n"):
                return  # torn final line of a crashed writer
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as e:
                raise BundleError(f"sideband: bad JSON line: {e}") from None
            yield sideband_from_json(obj)


class Sideband(Fields):
    """All sideband of a bundle, by kind, in file order."""
    __slots__ = _fields = ("processes", "threads", "mmaps", "switches",
                           "exits")

    def __init__(self, processes: list[Process], threads: list[Thread],
                 mmaps: list[Mmap], switches: list[Switch],
                 exits: list[Exit]):
        self.processes = processes
        self.threads = threads
        self.mmaps = mmaps
        self.switches = switches
        self.exits = exits

    @classmethod
    def from_records(cls, recs: Iterable[object]) -> "Sideband":
        sb = cls([], [], [], [], [])
        dest = {Process: sb.processes, Thread: sb.threads, Mmap: sb.mmaps,
                Switch: sb.switches, Exit: sb.exits}
        for r in recs:
            dest[type(r)].append(r)
        return sb

    def cr3_of(self, pid: int) -> list[int]:
        """CR3 values of process ``pid`` in time order."""
        return [p.cr3 for p in self.processes if p.pid == pid]

    def pid_of_cr3(self, cr3: int) -> int | None:
        for p in self.processes:
            if p.cr3 == cr3:
                return p.pid
        return None

    def mmaps_of(self, pid: int) -> list[Mmap]:
        return [m for m in self.mmaps if m.pid == pid]


# ---------------------------------------------------------------- streams


class StreamInfo(Typed, namedtuple(
        "StreamInfo", "file cpu tid pid instructions_observed size "
        "capture_end wrapped stopped lost_bytes config generated_bytes",
        defaults=(None, None, None, 0, 0, 0, False, False, 0, None, None))):
    """One ``.pt`` stream of a bundle (as listed in the manifest): its
    ``file``; ``cpu`` or ``tid`` (and ``pid``); ``instructions_observed``,
    ``size``, ``capture_end``, ``wrapped``, ``stopped``, ``lost_bytes``,
    ``config`` (a mapping or None) and ``generated_bytes``: the bytes the
    tracer produced for this stream, stored (a wrapped buffer overwrote the
    oldest of them) plus lost (a stopped buffer dropped them); None in
    bundles that don't say.  An immutable record (see the sideband's)."""
    __slots__ = ()

    @property
    def complete(self) -> bool:
        """Every byte the tracer produced is in the stream (nothing dropped
        by a full stop-on-full buffer nor overwritten by a wrapped one)."""
        return not (self.wrapped or self.stopped or self.lost_bytes)

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"file": self.file}
        if self.cpu is not None:
            d["cpu"] = self.cpu
        if self.tid is not None:
            d["tid"] = self.tid
        if self.pid is not None:
            d["pid"] = self.pid
        d.update(instructions_observed=self.instructions_observed, size=self.size,
                 capture_end=self.capture_end, wrapped=self.wrapped,
                 stopped=self.stopped, lost_bytes=self.lost_bytes)
        if self.generated_bytes is not None:
            d["generated_bytes"] = self.generated_bytes
        if self.config is not None:
            d["config"] = dict(self.config)
        return d


def _check_name(name: object, what: str) -> str:
    """A plain file name (or images/NAME) safe to join to the bundle dir."""
    if not isinstance(name, str):
        raise BundleError(f"{what}: file name is not a string")
    parts = name.split("/")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != IMAGES) \
            or not all(_NAME.match(p) for p in parts):
        raise BundleError(f"{what}: unsafe file name {name[:80]!r}")
    return name


def _uint(d: Mapping[str, object], key: str, what: str, default: int | None = 0,
          limit: int = _U64) -> int:
    v = d.get(key, default)
    if v is None and default is None:
        return None  # type: ignore[return-value]
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < limit:
        raise BundleError(f"{what}: {key} is not an unsigned integer")
    return v


def _bool(d: Mapping[str, object], key: str, what: str) -> bool:
    v = d.get(key, False)
    if not isinstance(v, bool):
        raise BundleError(f"{what}: {key} is not a boolean")
    return v


# ---------------------------------------------------------------- writer


def _replace_entry(path: Path) -> None:
    """Make room for a new file at ``path`` inside an output directory:
    an existing symbolic link, FIFO or other non-directory there is
    removed (never followed), so writing can't land outside the directory
    or block on a planted FIFO."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise BundleError(f"{path.name}: is a directory")
    os.unlink(path)


def _create(path: Path, mode: str = "wb"):
    """A new regular file at ``path`` for writing (never through a link)."""
    _replace_entry(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def _open_append(path: Path):
    """``path`` for appending text, refusing a link or non-regular file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK
                     | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as e:
        raise BundleError(f"{path.name}: cannot append: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BundleError(f"{path.name}: not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a", encoding="utf-8")


class BundleWriter:
    """Writes a bundle directory; :meth:`close` writes ``manifest.json`` last
    (atomically), so a directory with a manifest is a complete bundle.

    ``meta`` are the manifest's top-level fields (``engine``, ``mode``,
    ``config`` as a dict or BufferConfig, ``capabilities`` as a dict or
    Capabilities, ``cpu`` as a dict or CpuInfo — whose ``nom_freq``,
    ``cpuid_0x15_*``, ``timebase``, ``tsc_hz`` are lifted to the top level —
    ``mtc_freq`` …). Streams go in with :meth:`add_stream` (bytes or an
    iterable of byte chunks), sideband with ``writer.sideband.add(record)``
    (a sideband file already there is replaced unless ``keep_sideband``).
    """

    def __init__(self, path: str | os.PathLike, *, exist_ok: bool = False,
                 keep_sideband: bool = False, **meta: object):
        from pathlib import Path
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        if (self.path / MANIFEST).exists() and not exist_ok:
            raise BundleError(f"{self.path} already holds a bundle")
        self.meta: dict[str, object] = {}
        self.update(**meta)
        self.streams: list[StreamInfo] = []
        self.images: list[dict[str, object]] = []
        self.sideband = SidebandWriter(self.path / SIDEBAND, append=keep_sideband)
        self._closed = False

    def update(self, **meta: object) -> None:
        for k, v in meta.items():
            if hasattr(v, "to_dict"):
                v = v.to_dict()
            if k == "cpu" and isinstance(v, dict):
                v = dict(v)
                for lift in ("nom_freq", "cpuid_0x15_eax", "cpuid_0x15_ebx", "timebase", "tsc_hz"):
                    if lift in v:
                        self.meta.setdefault(lift, v.pop(lift))
            self.meta[k] = v
        cfg = self.meta.get("config")
        if isinstance(cfg, dict) and "ctl" in cfg and "mtc_freq" not in self.meta:
            self.meta["mtc_freq"] = (int(cfg["ctl"]) >> 14) & 0xF

    def add_stream(self, data: bytes | bytearray | memoryview | Iterable[bytes], *,
                   cpu: int | None = None, tid: int | None = None, pid: int | None = None,
                   instructions_observed: int = 0, file: str | None = None,
                   **info: object) -> StreamInfo:
        """Write one stream; ``file`` defaults to ``cpuN.pt`` / ``tidN.pt``."""
        if (cpu is None) == (tid is None):
            raise ValueError("a stream belongs to exactly one cpu or one tid")
        name = file or (f"cpu{cpu}.pt" if cpu is not None else f"tid{tid}.pt")
        _check_name(name, "stream")
        if any(s.file == name for s in self.streams):
            raise ValueError(f"stream {name} added twice")
        size = 0
        with _create(self.path / name) as f:
            chunks = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
            for c in chunks:
                f.write(c)
                size += len(memoryview(c).cast("B"))
        cfg = info.pop("config", None)
        if hasattr(cfg, "to_dict"):
            cfg = cfg.to_dict()
        s = StreamInfo(file=name, cpu=cpu, tid=tid, pid=pid,
                       instructions_observed=instructions_observed, size=size,
                       capture_end=info.pop("capture_end", size),
                       wrapped=info.pop("wrapped", False), stopped=info.pop("stopped", False),
                       lost_bytes=info.pop("lost_bytes", 0), config=cfg,
                       generated_bytes=info.pop("generated_bytes", None))
        if info:
            raise TypeError(f"unknown stream fields: {sorted(info)}")
        self.streams.append(s)
        return s

    def add_image(self, src: str | os.PathLike, *, path: str | None = None,
                  build_id: str = "") -> str:
        """Copy an executable into ``images/``; returns its name in the bundle."""
        from pathlib import Path
        src = Path(src)
        base = re.sub(r"[^A-Za-z0-9_.+-]", "_", src.name) or "image"
        name = f"{IMAGES}/{build_id or len(self.images)}-{base}"[:200]
        name = IMAGES + "/" + re.sub(r"^[^A-Za-z0-9_]", "_", name.split("/", 1)[1])
        idir = self.path / IMAGES
        if idir.is_symlink() or (idir.exists() and not idir.is_dir()):
            idir.unlink()           # never copy through a link out of the bundle
        idir.mkdir(exist_ok=True)
        if not any(i["file"] == name for i in self.images):
            import shutil
            with open(src, "rb") as fin, _create(self.path / name) as fout:
                shutil.copyfileobj(fin, fout)
            self.images.append({"file": name, "path": path or str(src), "build_id": build_id})
        return name

    def manifest(self) -> dict[str, object]:
        m = {"format": FORMAT, "version": VERSION}
        m.update(self.meta)
        m["sideband"] = SIDEBAND
        m["images"] = list(self.images)
        m["streams"] = [s.to_dict() for s in self.streams]
        return m

    def close(self) -> Path:
        if not self._closed:
            self.sideband.close()
            tmp = self.path / (MANIFEST + ".tmp")
            with _create(tmp, "w") as f:
                f.write(json.dumps(self.manifest(), indent=1) + "\n")
            os.replace(tmp, self.path / MANIFEST)
            self._closed = True
        return self.path

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
        else:
            self.sideband.close()


# ---------------------------------------------------------------- reader


def _open_regular(path: Path) -> int:
    """A read-only fd, opened without following a final symbolic link and
    without blocking (a FIFO or device planted in a bundle must not hang
    the reader: the caller checks S_ISREG on the fd before reading)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    os.set_blocking(fd, True)
    return fd


def _read_limited(path: str, limit: int, what: str) -> bytes:
    """The bytes of file ``path`` (a name joined to a bundle directory)."""
    name = os.path.basename(path)
    try:
        fd = _open_regular(path)
    except FileNotFoundError:
        raise BundleError(f"{what}: {name} not found") from None
    except OSError as e:
        raise BundleError(f"{what}: cannot open {name}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise BundleError(f"{what}: {name} is not a regular file")
        if st.st_size > limit:
            raise BundleError(f"{what}: {name} is larger than {limit} bytes")
        return f.read(st.st_size)


class Bundle:
    """A trace bundle opened for reading (see the module doc for the layout).

    ``image_path`` lists directories the caller allows images to be found in
    (by base name); ``allow_outside`` allows the absolute paths the sideband
    names on this machine whatever they are. Without it, such a path is used
    only if it is a regular ELF file with the recorded build-id (so bundles
    recorded here decode, and a foreign sideband can't make the reader load
    arbitrary files). Neither is needed for images stored in the bundle.
    """

    def __init__(self, path: str | os.PathLike, *, image_path: Iterable[str | os.PathLike] = (),
                 allow_outside: bool = False):
        self._dir = P.norm(path)         # str(self.path)
        self._path = None
        if not P.is_dir(self._dir):
            raise BundleError(f"{self._dir}: not a directory")
        raw = _read_limited(P.join(self._dir, MANIFEST), MAX_MANIFEST_BYTES,
                            "manifest")
        try:
            m = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise BundleError(f"manifest: not JSON: {e}") from None
        if not isinstance(m, dict):
            raise BundleError("manifest: not a JSON object")
        if m.get("format") != FORMAT:
            raise BundleError("manifest: not an hwtrace bundle")
        if m.get("version") != VERSION:
            raise BundleError(f"manifest: unsupported version {str(m.get('version'))[:20]}")
        self.manifest: dict[str, object] = m
        self._image_dirs = [P.norm(p) for p in image_path]
        self.allow_outside = allow_outside
        self.mode = m.get("mode", "cpu")
        if self.mode not in ("cpu", "thread"):
            raise BundleError("manifest: mode must be cpu or thread")
        for key in ("nom_freq", "cpuid_0x15_eax", "cpuid_0x15_ebx", "mtc_freq", "tsc_hz"):
            _uint(m, key, "manifest")
        self.streams: tuple[StreamInfo, ...] = tuple(self._streams(m.get("streams", [])))
        imgs = m.get("images", [])
        if not isinstance(imgs, list) or len(imgs) > MAX_STREAMS:
            raise BundleError("manifest: images must be a list")
        self.images: list[dict[str, str]] = []
        for i in imgs:
            if not isinstance(i, dict):
                raise BundleError("manifest: image entry is not an object")
            f = _check_name(i.get("file"), "image")
            p, b = i.get("path", ""), i.get("build_id", "")
            if not isinstance(p, str) or not isinstance(b, str):
                raise BundleError("manifest: image path/build_id not strings")
            self.images.append({"file": f, "path": p, "build_id": b})
        sb = m.get("sideband", SIDEBAND)
        self._sideband_name = None if sb is None else _check_name(sb, "sideband")
        self._root: str | None = None           # self.path resolved
        self._inside: dict[str, bool] = {}      # see _dir_inside

    @property
    def path(self):
        """The bundle directory (a Path; made when first asked for)."""
        if self._path is None:
            from pathlib import Path
            self._path = Path(self._dir)
        return self._path

    @property
    def image_path(self) -> list:
        """The directories images may be found in (Paths)."""
        from pathlib import Path
        return [Path(d) for d in self._image_dirs]

    @classmethod
    def open(cls, path: str | os.PathLike, **kw: object) -> "Bundle":
        return cls(path, **kw)

    def _streams(self, raw: object) -> Iterator[StreamInfo]:
        if not isinstance(raw, list) or len(raw) > MAX_STREAMS:
            raise BundleError("manifest: streams must be a list")
        seen = set()
        for i, s in enumerate(raw):
            what = f"stream {i}"
            if not isinstance(s, dict):
                raise BundleError(f"{what}: not an object")
            name = _check_name(s.get("file"), what)
            if name in seen or "/" in name:
                raise BundleError(f"{what}: bad or duplicate file {name}")
            seen.add(name)
            cpu = _uint(s, "cpu", what, None, 1 << 20)
            tid = _uint(s, "tid", what, None, 1 << 32)
            if (cpu is None) == (tid is None):
                raise BundleError(f"{what}: needs exactly one of cpu and tid")
            cfg = s.get("config")
            if cfg is not None and not isinstance(cfg, dict):
                raise BundleError(f"{what}: config is not an object")
            yield StreamInfo(
                file=name, cpu=cpu, tid=tid, pid=_uint(s, "pid", what, None, 1 << 32),
                instructions_observed=_uint(s, "instructions_observed", what),
                size=_uint(s, "size", what), capture_end=_uint(s, "capture_end", what),
                wrapped=_bool(s, "wrapped", what), stopped=_bool(s, "stopped", what),
                lost_bytes=_uint(s, "lost_bytes", what), config=cfg,
                generated_bytes=_uint(s, "generated_bytes", what, None))

    # -- manifest views
    @property
    def engine(self) -> str:
        return str(self.manifest.get("engine", ""))

    @property
    def config(self):
        """The bundle's buffer config as a BufferConfig (None if absent)."""
        from hwtrace.control.config import BufferConfig
        from hwtrace.control.errors import TraceError
        c = self.manifest.get("config")
        if c is None:
            return None
        try:
            return BufferConfig.from_dict(c)
        except TraceError as e:
            raise BundleError(f"manifest: config: {e.message}") from None

    @property
    def capabilities(self):
        from hwtrace.control.capabilities import Capabilities
        c = self.manifest.get("capabilities", {})
        try:
            return Capabilities.from_dict(c if isinstance(c, dict) else {})
        except (ValueError, TypeError) as e:
            raise BundleError(f"manifest: capabilities: {e}") from None

    @property
    def cpu(self):
        """CpuInfo with the manifest's identity and timing fields."""
        from hwtrace.control.capabilities import CpuInfo
        c = self.manifest.get("cpu", {})
        d = dict(c) if isinstance(c, dict) else {}
        for k in ("nom_freq", "cpuid_0x15_eax", "cpuid_0x15_ebx", "timebase", "tsc_hz"):
            if k in self.manifest:
                d[k] = self.manifest[k]
        try:
            return CpuInfo.from_dict(d)
        except (ValueError, TypeError) as e:
            raise BundleError(f"manifest: {e}") from None

    def decoder_args(self) -> list[str]:
        """ptxed/ptdump options describing this bundle's CPU and timing."""
        c = self.cpu
        args = []
        if c.vendor == "GenuineIntel" and c.family:
            args += ["--cpu", c.cpu_arg]
        if self.manifest.get("mtc_freq"):
            args += ["--mtc-freq", str(self.manifest["mtc_freq"])]
        if c.nom_freq:
            args += ["--nom-freq", str(c.nom_freq)]
        if c.cpuid_0x15_eax and c.cpuid_0x15_ebx:
            args += ["--cpuid-0x15.eax", str(c.cpuid_0x15_eax),
                     "--cpuid-0x15.ebx", str(c.cpuid_0x15_ebx)]
        return args

    # -- streams
    def stream(self, *, cpu: int | None = None, tid: int | None = None) -> StreamInfo:
        for s in self.streams:
            if (cpu is not None and s.cpu == cpu) or (tid is not None and s.tid == tid):
                return s
        raise KeyError(f"no stream for cpu={cpu} tid={tid}")

    def stream_path(self, s: StreamInfo | str) -> Path:
        from pathlib import Path
        return Path(self.stream_file(s))

    def stream_file(self, s: StreamInfo | str) -> str:
        """:meth:`stream_path` as a string."""
        name = _check_name(s.file if isinstance(s, StreamInfo) else s, "stream")
        p = P.join(self._dir, name)
        if P.is_symlink(p):
            raise BundleError(f"stream {name}: is a symbolic link")
        return p

    def read_stream(self, s: StreamInfo | str) -> bytes:
        """The stream's bytes; its size must match the manifest."""
        info = s if isinstance(s, StreamInfo) else next(
            (x for x in self.streams if x.file == s), None)
        if info is None:
            raise BundleError(f"no stream {s!s}")
        p = self.stream_file(info)
        try:
            actual = os.stat(p).st_size
        except OSError:
            raise BundleError(f"stream {info.file}: not found") from None
        if actual != info.size:
            raise BundleError(f"stream {info.file}: {actual} bytes, manifest says {info.size}")
        data = _read_limited(p, info.size, f"stream {info.file}")
        if len(data) != info.size:
            raise BundleError(f"stream {info.file}: {len(data)} bytes, manifest says {info.size}")
        return data

    def open_stream(self, s: StreamInfo | str):
        """The stream as a binary file (for streaming decoders); its size is
        checked against the manifest, symbolic links are refused."""
        info = s if isinstance(s, StreamInfo) else next(
            (x for x in self.streams if x.file == s), None)
        if info is None:
            raise BundleError(f"no stream {s!s}")
        try:
            fd = _open_regular(P.join(self._dir, info.file))
        except OSError as e:
            raise BundleError(f"stream {info.file}: {e.strerror}") from None
        f = os.fdopen(fd, "rb")
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != info.size:
            f.close()
            if not stat.S_ISREG(st.st_mode):
                raise BundleError(f"stream {info.file}: not a regular file")
            raise BundleError(f"stream {info.file}: {st.st_size} bytes, manifest says {info.size}")
        return f

    # -- sideband
    @property
    def sideband_missing(self) -> str | None:
        """The sideband file the manifest names, if it is not there (then
        no process, memory map or switch is known), else None."""
        if self._sideband_name is None:
            return None
        p = P.join(self._dir, self._sideband_name)
        return None if os.path.lexists(p) else self._sideband_name

    def iter_sideband(self) -> Iterator[object]:
        if self._sideband_name is None:
            return iter(())
        p = P.join(self._dir, self._sideband_name)
        if not P.exists(p):
            return iter(())
        if P.is_symlink(p) or not P.is_file(p):
            raise BundleError("sideband: not a regular file")
        return iter_sideband_file(p)

    def sideband(self) -> Sideband:
        return Sideband.from_records(self.iter_sideband())

    # -- images
    def find_image(self, filename: str, build_id: str = "") -> Path | None:
        """Where to read the executable that was ``filename`` when recorded.

        In order: a copy stored in the bundle (same build-id, else same
        path); a file of the same base name in ``image_path``; the path
        itself if ``allow_outside``. None if not found/allowed.
        """
        p = self.image_file(filename, build_id)
        if p is None:
            return None
        from pathlib import Path
        return Path(p)

    def image_file(self, filename: str, build_id: str = "") -> str | None:
        """:meth:`find_image` as a string."""
        for want_bid in (True, False):
            for i in self.images:
                if (want_bid and build_id and i["build_id"] == build_id) or \
                        (not want_bid and i["path"] == filename):
                    p = P.join(self._dir, i["file"])
                    if P.is_file(p) and not P.is_symlink(p) and \
                            self._dir_inside(P.parent(p)):
                        return p
        base = os.path.basename(filename)
        if base and base not in (".", ".."):
            for d in self._image_dirs:
                p = P.join(d, base)
                if P.is_file(p):
                    return p
        if os.path.isabs(filename) and os.path.isfile(filename):
            if self.allow_outside or _is_recorded_elf(filename, build_id):
                return P.norm(filename)
        return None


    def _dir_inside(self, d: str) -> bool:
        """Whether directory ``d`` (the bundle's or its images/, which may
        be a link) resolves to inside the bundle: an image stored there,
        a plain name and no link itself, then does too.  Resolved once
        per directory (resolving each image's path walked every
        component of both paths again)."""
        known = self._inside.get(d)
        if known is None:
            if self._root is None:
                self._root = P.resolve(self._dir)
            known = self._inside[d] = P.is_relative_to(P.resolve(d), self._root)
        return known


def _is_recorded_elf(filename: str, build_id: str) -> bool:
    """Whether ``filename`` on this machine is plausibly the executable the
    sideband recorded: a regular ELF file whose GNU build-id equals the
    recorded one (both empty only for ELF files linked without one). So a
    hostile sideband can name only ELF executables, never e.g. /etc/shadow."""
    try:
        fd = os.open(filename, os.O_RDONLY | os.O_NONBLOCK)    # a FIFO must not block
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or os.pread(fd, 4, 0) != b"\x7fELF":
            return False
    except OSError:
        return False
    finally:
        os.close(fd)
    from hwtrace.buildid import build_id as elf_build_id
    return elf_build_id(filename) == build_id.lower()


def is_bundle(path: str | os.PathLike) -> bool:
    return P.is_file(P.join(P.norm(path), MANIFEST))
