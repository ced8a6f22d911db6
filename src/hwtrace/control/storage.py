"""Trace buffers as memory-mapped files inside the trace directory.

A device's trace directory::

    TRACE/device.json          engine, mode, capabilities, CPU info, num_cpus
    TRACE/sideband.jsonl       sideband records, one flushed line each
    TRACE/buf-<d>/config.json  the buffer's config, ToPA base, its CPU or thread
    TRACE/buf-<d>/data         the chunks, back to back (chunk k at k * chunk size)
    TRACE/buf-<d>/regs         the output registers (hwtrace.topa.REGS_SIZE bytes)

``data`` and ``regs`` are mapped shared, so what the output unit writes is in
the page cache at once: another process can read a buffer while tracing runs,
and the collecting process can die without losing anything already written.
``hwtrace recover`` (:mod:`hwtrace.control.recover`) reads this layout back.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from hwtrace.topa import REGS_SIZE, OutputUnit, Registers, Topa, read_registers

from .config import BufferConfig
from .ctl import Ctl
from .errors import Status, TraceError

DEVICE_FILE = "device.json"
SIDEBAND_FILE = "sideband.jsonl"
BUFFER_PREFIX = "buf-"
MAX_DESCRIPTORS = 1 << 16
MAX_CONFIG_BYTES = 1 << 16


def write_json(path: Path, obj: Any) -> None:
    """Replace ``path`` atomically with ``obj`` as JSON."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def topa_base(descriptor: int) -> int:
    """Where buffer ``descriptor``'s ToPA lives in the model address space."""
    return (descriptor + 1) << 32


class BufferOutput:
    """An engine's view of one buffer (the :class:`hwtrace.engines.base.Output`
    protocol): its configuration plus the output unit's operations."""

    def __init__(self, unit: OutputUnit, config: BufferConfig):
        self.unit = unit
        self.config = config
        self.ctl = Ctl(int(config.ctl) | Ctl.TOPA | Ctl.TRACE_EN)
        self.cr3_match = config.cr3_match
        self.addr_ranges = config.addr_ranges
        self.write = unit.write
        self.overflow = unit.overflow
        self.add_instructions = unit.add_instructions
        self.reset_packet_byte_cnt = unit.reset_packet_byte_cnt

    @property
    def stopped(self) -> bool:
        """Nothing more is stored: STATUS.Stopped (buffer full) or an error."""
        return self.unit.halted

    @property
    def packet_byte_cnt(self) -> int:
        return self.unit.packet_byte_cnt


class BufferStore:
    """One buffer's files and mappings. Create with :meth:`create`, or open an
    existing one (read-only, e.g. for recovery) with :meth:`open`."""

    def __init__(self, path: Path, descriptor: int, config: BufferConfig, base: int,
                 data: mmap.mmap | None, regs: mmap.mmap | None, meta: dict[str, Any]):
        self.path = path
        self.descriptor = descriptor
        self.config = config
        self.topa = Topa.build(config.num_chunks, config.chunk_order,
                               stop_on_full=not config.is_circular, base=base)
        self._data = data
        self._regs = regs
        self.meta = meta
        self.unit: OutputUnit | None = None
        self.output: BufferOutput | None = None

    @classmethod
    def create(cls, trace_dir: Path, descriptor: int, config: BufferConfig) -> "BufferStore":
        """Make ``buf-<d>/`` with its files reserved on disk; NO_MEMORY if
        the space can't be had."""
        path = trace_dir / f"{BUFFER_PREFIX}{descriptor}"
        try:
            if path.exists():
                shutil.rmtree(path)
            path.mkdir()
            meta = {"descriptor": descriptor, "config": config.to_dict(),
                    "topa_base": topa_base(descriptor), "cpu": None, "tid": None, "pid": None}
            write_json(path / "config.json", meta)
            data = _mapped(path / "data", config.total_size)
            regs = _mapped(path / "regs", REGS_SIZE)
        except OSError as e:
            shutil.rmtree(path, ignore_errors=True)
            if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG, errno.EDQUOT):
                raise TraceError(Status.NO_MEMORY, f"buffer {descriptor}: {e.strerror}") from None
            raise TraceError(Status.NO_MEMORY,
                             f"buffer {descriptor}: cannot create in {trace_dir}: {e.strerror}") from None
        store = cls(path, descriptor, config, topa_base(descriptor), data, regs, meta)
        store.unit = OutputUnit(store.topa, store.chunks(writable=True), regs=regs)
        store.output = BufferOutput(store.unit, config)
        return store

    @classmethod
    def open(cls, path: Path) -> "BufferStore":
        """An existing buffer directory, read-only. ValueError if malformed."""
        # O_NONBLOCK: a FIFO planted in a trace directory must not hang
        # recovery; only a regular file is read.
        fd = os.open(path / "config.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError("config.json is not a regular file")
            os.set_blocking(fd, True)
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ValueError("config.json too large")
        meta = json.loads(raw)
        if not isinstance(meta, dict):
            raise ValueError("config.json is not an object")
        d = meta.get("descriptor")
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < MAX_DESCRIPTORS:
            raise ValueError("bad descriptor")
        try:
            config = BufferConfig.from_dict(meta.get("config"))
        except TraceError as e:
            raise ValueError(e.message) from None
        from .config import validate
        from .capabilities import FULL
        from dataclasses import replace
        try:   # geometry limits (capability checks don't matter here)
            validate(replace(config, ctl=Ctl(0), addr_ranges=(), cr3_match=0),
                     FULL)
        except TraceError as e:
            raise ValueError(e.message) from None
        if meta.get("topa_base") != topa_base(d):
            raise ValueError("bad ToPA base")
        data = _mapped(path / "data", config.total_size, readonly=True)
        regs = _mapped(path / "regs", REGS_SIZE, readonly=True)
        return cls(path, d, config, topa_base(d), data, regs, meta)

    def chunks(self, writable: bool = False) -> list[memoryview]:
        mv = memoryview(self._data)
        if not writable:
            mv = mv.toreadonly()
        size = self.config.chunk_size
        return [mv[k * size:(k + 1) * size] for k in range(self.config.num_chunks)]

    def chunk(self, k: int) -> memoryview:
        """A read-only view of chunk ``k``'s memory (valid while mapped)."""
        size = self.config.chunk_size
        return memoryview(self._data).toreadonly()[k * size:(k + 1) * size]

    def registers(self) -> Registers:
        if self.unit is not None:
            return self.unit.registers()
        return read_registers(self._regs)

    def set_binding(self, **binding: Any) -> None:
        """Record which CPU or thread this buffer traces (persisted)."""
        self.meta.update(binding)
        write_json(self.path / "config.json", self.meta)

    def close(self) -> None:
        self.unit = self.output = None
        for m in (self._data, self._regs):
            if m is not None:
                try:
                    m.close()
                except BufferError:
                    pass  # a handle still exports it; it unmaps when released
        self._data = self._regs = None

    def remove(self) -> None:
        """Delete the buffer's files, then unmap it. OSError if the files
        can't be removed (the buffer then stays intact and mapped)."""
        shutil.rmtree(self.path)
        self.close()


def _mapped(path: Path, size: int, readonly: bool = False) -> mmap.mmap:
    if readonly:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{path.name}: not a regular file")
            if st.st_size != size:
                raise ValueError(f"{path.name}: {st.st_size} bytes, expected {size}")
            return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
        try:
            os.posix_fallocate(fd, 0, size)   # disk full now, not SIGBUS later
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
