"""What a bundle holds, without decoding it: how and what was recorded,
its streams and what they lost, the processes and threads of the
sideband, and whether each code image can be found here (``hwtrace info
DIR``).  A plain dict: :func:`describe` reads the manifest and the
sideband through :class:`~hwtrace.bundle.Bundle`; the text is the CLI's.
"""

from __future__ import annotations

from hwtrace.bundle import Bundle, BundleError, Exit, Mmap, Process, Thread


def describe(b: Bundle) -> dict:
    """The facts ``hwtrace info DIR`` shows, as one JSON-able dict."""
    m = b.manifest
    rec = m.get("recording") if isinstance(m.get("recording"), dict) else {}
    info = m.get("engine_info") if isinstance(m.get("engine_info"), dict) else {}
    cfg = b.config
    out: dict = {
        "path": str(b.path),
        "engine": b.engine,
        "source": str(info.get("source", "")),
        "mode": b.mode,
        "num_cpus": m.get("num_cpus"),
        "cpu": b.cpu.to_dict(),
        "recording": {k: rec[k] for k in ("command", "ended", "status", "stop", "snapshot",
                                          "generator") if rec.get(k) is not None},
        "config": _config(cfg, m) if cfg is not None else None,
        "streams": [_stream(b, s) for s in b.streams],
    }
    out["totals"] = {
        "instructions_observed": sum(s.instructions_observed for s in b.streams),
        "bytes": sum(s.size for s in b.streams),
        "lost_bytes": sum(s.lost_bytes for s in b.streams),
        "filled": sum(1 for s in b.streams if s.stopped),
        "wrapped": sum(1 for s in b.streams if s.wrapped),
    }
    procs: dict[int, dict] = {}
    threads: dict[int, list[int]] = {}
    mmaps: dict[tuple[str, str], set[int]] = {}
    exits: dict[tuple[int, int], int] = {}
    switches = 0
    for r in b.iter_sideband():
        if isinstance(r, Process):
            p = procs.setdefault(r.pid, {"pid": r.pid, "ppid": r.ppid, "exe": [],
                                         "comm": r.comm})
            if r.exe and (not p["exe"] or p["exe"][-1] != r.exe):
                p["exe"].append(r.exe)
            p["comm"] = r.comm or p["comm"]
            p["ppid"] = p["ppid"] or r.ppid
        elif isinstance(r, Thread):
            threads.setdefault(r.pid, [])
            if r.tid not in threads[r.pid]:
                threads[r.pid].append(r.tid)
        elif isinstance(r, Mmap):
            mmaps.setdefault((r.file, r.build_id), set()).add(r.pid)
        elif isinstance(r, Exit):
            exits[(r.pid, r.tid)] = r.status
        else:
            switches += 1
    for pid, tids in threads.items():
        procs.setdefault(pid, {"pid": pid, "ppid": 0, "exe": [], "comm": ""})
    for p in procs.values():
        p["threads"] = threads.get(p["pid"], [])
        if (p["pid"], p["pid"]) in exits:
            p["exited"] = True
            if b.engine == "emulated":      # perf's exit records carry no status
                p["exit_status"] = exits[(p["pid"], p["pid"])]
    out["processes"] = sorted(procs.values(), key=lambda p: p["pid"])
    if b.sideband_missing is not None:
        out["sideband_missing"] = b.sideband_missing
    out["switches"] = switches
    out["images"] = [_image(b, f, bid, pids)
                     for (f, bid), pids in sorted(mmaps.items(), key=_user_first)]
    return out


def _stream(b: Bundle, s) -> dict:
    """The manifest's entry, and ``file_size`` (None: no file) where the
    file is not the size the manifest says (cut short or altered since:
    the views refuse it)."""
    import os
    d = s.to_dict()
    try:
        size = os.stat(b.stream_file(s)).st_size
    except (OSError, BundleError):
        size = None
    if size != s.size:
        d["file_size"] = size
    return d


def _user_first(item) -> tuple:
    """The program's files before the kernel's (an imported perf.data maps
    every loaded module)."""
    f = item[0][0]
    return (f.startswith(("[kernel", "/lib/modules/")) or f.endswith(".ko"), f)


def _config(cfg, m: dict) -> dict:
    from hwtrace.control import ctl as C
    d = cfg.to_dict()
    d["describe"] = C.describe(cfg.ctl)
    d["total_size"] = cfg.total_size
    d["chunk_size"] = cfg.chunk_size
    d["filters"] = {
        "user": bool(cfg.ctl & C.Ctl.USER), "kernel": bool(cfg.ctl & C.Ctl.OS),
        "cr3": cfg.cr3_match if cfg.ctl & C.Ctl.CR3_FILTER else None,
        "ranges": [{"n": n, "from": a, "to": z,
                    "kind": "filter" if C.addr_cfg(cfg.ctl, n) == C.ADDR_CFG_FILTER else "stop"}
                   for n, (a, z) in enumerate(cfg.addr_ranges)
                   if n < 4 and C.addr_cfg(cfg.ctl, n) in (C.ADDR_CFG_FILTER, C.ADDR_CFG_STOP)],
    }
    d["timing"] = {"tsc": bool(cfg.ctl & C.Ctl.TSC_EN), "mtc": bool(cfg.ctl & C.Ctl.MTC_EN),
                   "mtc_freq": C.field(cfg.ctl, "mtc_freq"),
                   "cyc": bool(cfg.ctl & C.Ctl.CYC_EN),
                   "cyc_thresh": C.field(cfg.ctl, "cyc_thresh"),
                   "tsc_hz": m.get("tsc_hz") or 0}
    d["psb_every"] = 2048 << C.field(cfg.ctl, "psb_freq")
    return d


def _image(b: Bundle, file: str, build_id: str, pids: set[int]) -> dict:
    import os
    where = b.image_file(file, build_id) if file else None
    if where is None:
        found = ""
    else:
        top = os.path.abspath(b.path)
        found = "bundle" if os.path.commonpath([os.path.abspath(where), top]) == top \
            else "here"
    return {"file": file, "build_id": build_id, "pids": sorted(pids),
            "found": found, "at": str(where) if where else ""}
