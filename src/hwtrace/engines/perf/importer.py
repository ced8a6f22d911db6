"""perf.data -> trace bundle (``hwtrace import``).

Reads the file through an mmap, converts it with :mod:`.sideband`, and
writes a bundle with :class:`hwtrace.bundle.BundleWriter`: one ``cpuN.pt``
(or ``tidN.pt``) stream per CPU (thread), the sideband, the CPU/timing
parameters from the header and AUXTRACE_INFO, and copies of the traced
executables found here or given with ``images`` (by path or build-id).
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from hwtrace import bundle as B
from hwtrace.buildid import build_id

from . import abi
from .errors import PerfDataError
from .features import parse_cpuid
from .perfdata import PerfData
from .sideband import convert

# intel_pt config bits that are RTIT_CTL bits (everything but pt/TraceEn).
_CTL_BITS = (1 << 1) | (0xF << 4 & 0x30) | (0x1F << 9) | (0xF << 14) | (0xF << 19) | (0xF << 24)
_CTL_OS, _CTL_USER = 1 << 2, 1 << 3
AUX_FILE = "perf_aux.jsonl"
_AUX_KINDS = {2: "Intel BTS", 3: "ARM CoreSight ETM", 4: "ARM SPE", 5: "s390 CPUMSF",
              6: "HiSilicon PTT"}
MAX_LOST_LISTED = 1000


@dataclass
class ImportResult:
    path: Path
    streams: list[tuple[str, int]]               # (file, size)
    sideband_records: int
    images: list[tuple[str, str]]                # (recorded path, source used)
    missing_images: list[str] = field(default_factory=list)
    layout: str = ""


def _is_user_file(name: str) -> bool:
    return bool(name) and name.startswith("/") and not name.startswith("//")


def _is_elf_file(path: str) -> bool:
    """A regular ELF file (never a FIFO or device: opened without blocking).
    Only such files named by a perf.data are copied from this machine, so a
    foreign perf.data can't pull, say, /etc/shadow into the bundle."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        import stat
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.pread(fd, 4, 0) == b"\x7fELF"
    except OSError:
        return False
    finally:
        os.close(fd)


def _resolve_images(mmaps: Iterable[B.Mmap], given: list[Path]) -> tuple[dict, list[str]]:
    """recorded file -> (source path, build-id); plus the unresolved.

    In order: an image given with the recorded build-id; the recorded path
    itself if given; a given image of the same base name (unless both have
    build-ids and they differ); the recorded path if it exists here (and
    has the recorded build-id, when one was recorded, and is an ELF file).
    """
    by_bid: dict[str, Path] = {}
    by_name: dict[str, tuple[Path, str]] = {}
    for p in given:
        bid = build_id(p)
        if bid:
            by_bid.setdefault(bid, p)
        by_name.setdefault(p.name, (p, bid))
    given_paths = {str(p) for p in given}
    found: dict[str, tuple[Path, str]] = {}
    missing: list[str] = []
    for m in mmaps:
        if m.file in found or m.file in missing or not _is_user_file(m.file) \
                or m.pid == -1 or "x" not in m.prot:
            continue
        want = m.build_id
        src = None
        if want and want in by_bid:
            src = by_bid[want]
        elif m.file in given_paths:
            src = Path(m.file)
        elif Path(m.file).name in by_name and (
                not want or not by_name[Path(m.file).name][1]
                or by_name[Path(m.file).name][1] == want):
            src = by_name[Path(m.file).name][0]
        elif _is_elf_file(m.file) and (not want or build_id(m.file) == want):
            src = Path(m.file)
        if src is None:
            missing.append(m.file)
        else:
            found[m.file] = (src, want)
    return found, missing


def _pt_attr(pd: PerfData):
    pmu = (pd.feature("PMU_MAPPINGS") or {}).get("intel_pt")
    info = next((r.body for r in pd.records({abi.AUXTRACE_INFO})), None)
    if pmu is None and info is not None and info.priv:
        pmu = info.priv[0]                    # INTEL_PT_PMU_TYPE
    return next((a.attr for a in pd.attrs if pmu is not None and a.attr.type == pmu), None)


def import_perf_data(data, out_dir: str | os.PathLike, *, images: Iterable[str | os.PathLike] = (),
                     source: str = "", exist_ok: bool = False) -> ImportResult:
    """Write the bundle for perf.data bytes ``data`` into ``out_dir``."""
    pd = PerfData(data)
    counts = pd.record_counts()
    if counts.get("COMPRESSED") or counts.get("COMPRESSED2"):
        raise PerfDataError("zstd-compressed perf.data (perf record -z) is not supported: "
                            "decompress it with 'perf inject -i IN -o OUT'", pd.data.offset)
    pt_attr = _pt_attr(pd)
    conv = convert(pd.records(), pd.aux_data, build_ids=pd.build_ids(),
                   pt_attr_config=pt_attr.config if pt_attr else None)
    if conv.pt_info is None:
        kinds = {r.body.type for r in pd.records({abi.AUXTRACE_INFO})}
        what = ", ".join(_AUX_KINDS.get(k, f"type {k}") for k in sorted(kinds))
        raise PerfDataError("no Intel PT trace in this perf.data ("
                            + (f"its AUX area data is {what}" if what else "no AUXTRACE_INFO")
                            + ")", 0)

    cpu = {"vendor": "GenuineIntel", "family": 0, "model": 0, "stepping": 0}
    ident = parse_cpuid(pd.feature("CPUID") or "")
    if ident:
        cpu.update(vendor=ident[0], family=ident[1], model=ident[2], stepping=ident[3])
    info = conv.pt_info
    meta: dict = {"engine": "perf", "mode": conv.mode}
    ctl = 0
    if info is not None and pt_attr is not None:
        cfg = pt_attr.config
        ctl = cfg & _CTL_BITS
        ctl |= 0 if pt_attr.flag("exclude_kernel") else _CTL_OS
        ctl |= 0 if pt_attr.flag("exclude_user") else _CTL_USER
        cpu.update(nom_freq=info.max_non_turbo_ratio,
                   cpuid_0x15_eax=info.tsc_ctc_ratio_d,
                   cpuid_0x15_ebx=info.tsc_ctc_ratio_n)
        meta["mtc_freq"] = info.mtc_freq(cfg) if info.mtc_enabled(cfg) else 0
    tc = conv.time_conv
    if tc is not None:
        cpu["timebase"] = "host TSC"
        if tc.time_mult:
            cpu["tsc_hz"] = (10**9 << tc.time_shift) // tc.time_mult
    meta["cpu"] = cpu
    meta["config"] = {"num_chunks": 1, "chunk_order": 0,
                      "is_circular": bool(info and info.snapshot_mode),
                      "ctl": ctl, "cr3_match": 0, "addr_ranges": []}
    meta["capabilities"] = {"pt": True, "mtc": bool(info and info.mtc_bit),
                            "psb_cyc": bool(info and info.cyc_bit),
                            "ip_filtering": bool(info and info.filter)}
    nrcpus = pd.feature("NRCPUS")
    meta["perf"] = {
        "source": source, "layout": pd.layout,
        "hostname": pd.feature("HOSTNAME") or "", "os_release": pd.feature("OSRELEASE") or "",
        "cpuid": pd.feature("CPUID") or "", "cpu_desc": pd.feature("CPUDESC") or "",
        "nr_cpus": nrcpus["nr_cpus_online"] if nrcpus else 0,
        "cmdline": list(pd.feature("CMDLINE") or ()),
        "pt_config": pt_attr.config if pt_attr else 0,
        "pt_attr_flags": list(pt_attr.set_flags()) if pt_attr else [],
        "auxtrace_info": asdict(info) if info else None,
        "time_conv": asdict(tc) if tc else None,
        "itrace_start": conv.itrace_starts,
        # every AUX record (cpu, tid, time, aux_offset/size, flags) is in
        # AUX_FILE, one JSON object a line: a long recording has too many
        # for the manifest; lost-data events are listed here up to a bound
        "aux_file": AUX_FILE, "aux_records": len(conv.aux_events),
        "lost": conv.lost[:MAX_LOST_LISTED], "lost_total": len(conv.lost),
    }
    mmaps = [r for r in conv.sideband if isinstance(r, B.Mmap)]
    found, missing = _resolve_images(mmaps, [Path(p) for p in images])

    with B.BundleWriter(out_dir, exist_ok=exist_ok, **meta) as w:
        streams = []
        for s in conv.streams:
            st = w.add_stream([p for _o, p in s.parts], cpu=s.cpu, tid=s.tid,
                              pid=s.pid if s.tid is not None else None,
                              stopped=s.truncated, lost_bytes=s.lost_bytes,
                              wrapped=bool(info and info.snapshot_mode))
            streams.append((st.file, st.size))
        w.sideband.extend(conv.sideband)
        with open(w.path / AUX_FILE, "w", encoding="utf-8") as f:
            for ev in conv.aux_events:
                f.write(json.dumps(ev, separators=(",", ":")) + "\n")
        used = []
        for recorded, (src, bid) in found.items():
            w.add_image(src, path=recorded, build_id=bid)
            used.append((recorded, str(src)))
    return ImportResult(Path(out_dir), streams, len(conv.sideband), used, missing, pd.layout)


def import_perf_file(path: str | os.PathLike, out_dir: str | os.PathLike, **kw) -> ImportResult:
    """Import the perf.data file at ``path`` (mapped, not read into memory)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise PerfDataError("empty file", 0)
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return import_perf_data(memoryview(mm), out_dir, source=str(path), **kw)
    finally:
        try:
            mm.close()
        except BufferError:     # views still referenced (e.g. by a traceback):
            pass                # the map goes when they do
