"""A trace directory -> a decodable bundle (``dev.save_bundle``, ``hwtrace recover``).

Works from what is on disk only -- the device's ``device.json``, each
``buf-<d>/`` (config, mapped chunks, persisted output registers) and
``sideband.jsonl`` -- so it gives the same result for a live device, a
finished one, or one whose collecting process was killed mid-trace. Each
buffer bound to a CPU or thread becomes a stream: its bytes oldest first (a
wrapped circular buffer from its first PSB), with capture_end, wrapped,
stopped, lost bytes and instructions observed in the manifest.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from hwtrace.bundle import MANIFEST, BundleWriter, Mmap, iter_sideband_file
from hwtrace.topa import linearize, read_registers

from .capabilities import Capabilities, CpuInfo
from .storage import BUFFER_PREFIX, DEVICE_FILE, SIDEBAND_FILE, BufferStore

MAX_DEVICE_FILE = 1 << 20


class RecoverError(ValueError):
    """The directory is not a trace directory (one-line message)."""


def is_trace_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / DEVICE_FILE).is_file()


def _device(path: Path) -> dict[str, Any]:
    p = path / DEVICE_FILE
    if not p.is_file() or p.is_symlink():
        raise RecoverError(f"{path}: not a trace directory (no {DEVICE_FILE})")
    if p.stat().st_size > MAX_DEVICE_FILE:
        raise RecoverError(f"{p}: too large")
    try:
        dev = json.loads(p.read_text())
        if not isinstance(dev, dict):
            raise ValueError("not an object")
        Capabilities.from_dict(dev.get("capabilities", {}))
        CpuInfo.from_dict(dev.get("cpu", {}))
    except (ValueError, TypeError) as e:
        raise RecoverError(f"{p}: {e}") from None
    return dev


def buffers(path: Path) -> list[BufferStore]:
    """The trace directory's buffers (read-only), by descriptor; damaged ones skipped."""
    out = []
    for p in sorted(path.iterdir(), key=lambda q: q.name):
        m = re.fullmatch(re.escape(BUFFER_PREFIX) + r"(\d{1,5})", p.name)
        if not m or not p.is_dir() or p.is_symlink():
            continue
        try:
            out.append(BufferStore.open(p))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(out, key=lambda s: s.descriptor)


def write_bundle(trace_dir: str | os.PathLike, out: str | os.PathLike, *,
                 overwrite: bool = False, copy_images: bool = False, **meta: Any) -> Path:
    """Write the bundle of ``trace_dir`` to ``out`` (which may be ``trace_dir``
    itself). ``copy_images``: store every mapped file the sideband names (that
    exists here) in the bundle. ``meta`` adds manifest fields. Returns ``out``."""
    src, dst = Path(trace_dir), Path(out)
    dev = _device(src)
    in_place = dst.exists() and os.path.samefile(src, dst)
    if (dst / MANIFEST).exists() and not overwrite:
        raise RecoverError(f"{dst} already holds a bundle")
    stores = buffers(src)
    bound = [s for s in stores if isinstance(s.meta.get("cpu"), int) or isinstance(s.meta.get("tid"), int)]
    mode = dev.get("mode") if dev.get("mode") in ("cpu", "thread") else "cpu"
    try:
        w = BundleWriter(dst, exist_ok=True, keep_sideband=in_place, engine=str(dev.get("engine", "")), mode=mode,
                         num_cpus=dev.get("num_cpus", 0),
                         capabilities=dev.get("capabilities", {}), cpu=dev.get("cpu", {}),
                         engine_info=dev.get("engine_info", {}),
                         config=bound[0].config.to_dict() if bound else None, **meta)
        for s in bound:
            try:
                r = read_registers(s._regs, allow_torn=True)
            except ValueError:
                continue  # never written: nothing to recover
            ce = s.topa.capture_end(r.output_base, r.output_mask_ptrs)
            data = linearize(s.chunks(), ce, r.wrapped)
            cpu, tid = s.meta.get("cpu"), s.meta.get("tid")
            pid = s.meta.get("pid")
            name = f"cpu{cpu}.pt" if isinstance(cpu, int) else f"tid{tid}.pt"
            if any(x.file == name for x in w.streams):
                name = name[:-3] + f"-buf{s.descriptor}.pt"
            w.add_stream(data, file=name, cpu=cpu if isinstance(cpu, int) else None,
                         tid=tid if not isinstance(cpu, int) else None,
                         pid=pid if isinstance(pid, int) else None,
                         instructions_observed=r.instructions, capture_end=ce,
                         wrapped=r.wrapped, stopped=r.stopped, lost_bytes=r.lost,
                         generated_bytes=r.stored + r.lost, config=s.config)
        sb = src / SIDEBAND_FILE
        if sb.is_file() and not sb.is_symlink():   # never read through a planted link
            seen: set[str] = set()
            for rec in iter_sideband_file(sb):
                if not in_place:
                    w.sideband.add(rec)
                if copy_images and isinstance(rec, Mmap) and rec.file not in seen:
                    seen.add(rec.file)
                    if os.path.isabs(rec.file) and os.path.isfile(rec.file):
                        w.add_image(rec.file, path=rec.file, build_id=rec.build_id)
        w.close()
    finally:
        for s in stores:
            s.close()
    return dst
