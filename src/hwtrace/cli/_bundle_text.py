"""``hwtrace info DIR``: a bundle described for people (or as one JSON
object), from :func:`hwtrace.bundleinfo.describe`."""

from __future__ import annotations

import json
import os
import signal

from hwtrace.cli import CliError
from hwtrace.cli._record_report import _bytes, _n


#: missing images listed by name (the rest counted)
MAX_MISSING = 12


def _open(path: str):
    from hwtrace.bundle import Bundle, BundleError
    if not os.path.exists(path):
        raise CliError(f"{path}: no such bundle")
    if not os.path.isdir(path):
        raise CliError(f"{path}: not a trace bundle directory (hwtrace info DIR describes "
                       f"a bundle; 'hwtrace dump' shows a raw trace's packets)")
    if not os.path.exists(os.path.join(path, "manifest.json")):
        from hwtrace.control.recover import is_trace_dir
        from hwtrace.engines.emulated.salvage import find_logs
        from pathlib import Path
        if is_trace_dir(Path(path)) or find_logs(Path(path)):
            raise CliError(f"{path}: an unfinished recording, not a bundle: "
                           f"'hwtrace recover {path}' makes it one")
        raise CliError(f"{path}: not a trace bundle (no manifest.json)")
    try:
        return Bundle(path)
    except BundleError as e:
        msg = str(e)
        raise CliError(msg if msg.startswith(path) else f"{path}: {msg}") from None
    except OSError as e:
        raise CliError(f"{path}: {e.strerror or e}") from None


def describe_bundle(path: str, as_json: bool) -> int:
    from hwtrace.bundle import BundleError
    from hwtrace.bundleinfo import describe
    b = _open(path)
    try:
        d = describe(b)
    except BundleError as e:
        raise CliError(f"{path}: {e}") from None
    except OSError as e:
        raise CliError(f"{path}: {e.strerror or e}") from None
    if as_json:
        print(json.dumps(d, indent=1))
    else:
        for line in lines(d):
            print(line)
    return 0


def _status(st: int) -> str:
    if st < 0:
        try:
            return f"killed by {signal.Signals(-st).name}"
        except ValueError:
            return f"killed by signal {-st}"
    return f"exit status {st}"


def _stream_line(s: dict, width: int, counted: bool) -> str:
    where = f"cpu {s['cpu']}" if "cpu" in s else f"tid {s['tid']}"
    if "file_size" in s:
        state = "the file is missing" if s["file_size"] is None else \
            f"the file has {_n(s['file_size'])} bytes, the manifest says {_n(s['size'])}"
    elif s.get("stopped"):
        state = f"buffer filled at {_bytes(s['capture_end'])}: {_bytes(s['lost_bytes'])} lost"
    elif s.get("wrapped"):
        gen = s.get("generated_bytes")
        state = "circular buffer wrapped: the newest part kept" + \
            (f" (of {_bytes(gen)})" if gen else "")
    elif s.get("lost_bytes"):
        state = f"{_bytes(s['lost_bytes'])} lost"
    else:
        state = "complete"
    insns = f"{_n(s['instructions_observed']):>15} insns observed  " if counted else ""
    return f"  {s['file']:<{width}}  {where:<9} {_bytes(s['size']):>10}  {insns}{state}"


def _config_lines(c: dict) -> list[str]:
    out = []
    kind = "circular" if c["is_circular"] else "stop-on-full"
    out.append(f"buffer:     {c['num_chunks']} chunk(s) of {_bytes(c['chunk_size'])} "
               f"({_bytes(c['total_size'])}), {kind}")
    f = c["filters"]
    what = [w for w, on in (("user", f["user"]), ("kernel", f["kernel"])) if on]
    filt = [" and ".join(what) or "no privilege level (nothing is traced)"]
    if f["cr3"] is not None:
        filt.append(f"CR3 {f['cr3']:#x} only")
    for r in f["ranges"]:
        filt.append(f"{'only' if r['kind'] == 'filter' else 'stop at'} "
                    f"{r['from']:#x}-{r['to']:#x} (ADDR{r['n']})")
    out.append(f"traced:     {', '.join(filt)}")
    t = c["timing"]
    clock = []
    if t["tsc"]:
        clock.append("TSC" + (f" at {t['tsc_hz'] / 1e9:.3g} GHz" if t["tsc_hz"] else ""))
    if t["mtc"]:
        clock.append(f"MTC (MTCFreq {t['mtc_freq']})")
    if t["cyc"]:
        clock.append(f"CYC (CycThresh {t['cyc_thresh']})")
    out.append(f"timing:     {', '.join(clock) or 'none'}; a PSB every "
               f"{_bytes(c['psb_every'])}")
    out.append(f"ctl:        {c['ctl']:#x} ({c['describe'] or 'nothing set'})")
    return out


def _process_lines(procs: list[dict]) -> list[str]:
    known = {p["pid"] for p in procs}
    kids: dict[int, list[dict]] = {}
    for p in procs:
        kids.setdefault(p["ppid"] if p["ppid"] in known and p["ppid"] != p["pid"] else 0,
                        []).append(p)
    out: list[str] = []

    def walk(parent: int, depth: int) -> None:
        for p in kids.get(parent, []):
            exe = p["exe"]
            name = exe[-1] if exe else (p["comm"] or "?")
            line = f"{'  ' * depth}  {p['pid']:>7}  {name}"
            if exe and p["comm"] and p["comm"] != os.path.basename(name)[:15]:
                line += f" ({p['comm']})"
            if len(exe) > 1:
                line += f", exec'd from {os.path.basename(exe[-2])}"
            n = len(p["threads"])
            extra = [f"{n} threads" if n != 1 else "1 thread"] if n else []
            if "exit_status" in p:
                extra.append(_status(p["exit_status"]))
            elif p.get("exited"):
                extra.append("exited")
            out.append(f"{line}  [{', '.join(extra)}]" if extra else line)
            walk(p["pid"], depth + 1)

    walk(0, 0)
    return out


def lines(d: dict) -> list[str]:
    out = [f"bundle:     {d['path']}"]
    rec = d["recording"]
    if rec.get("command"):
        import shlex
        out.append(f"command:    {shlex.join(rec['command'])}")
    eng = d["engine"] + (f" ({d['source']})" if d["source"] else "")
    if rec.get("generator"):
        eng += f", streams from the {rec['generator']} generator"
    out.append(f"engine:     {eng}")
    c = d["cpu"]
    ncpu = d.get("num_cpus")
    out.append(f"mode:       {d['mode']}" + (f", {ncpu} CPUs" if ncpu else "") +
               f"; CPU {c.get('vendor') or 'unknown'} family {c.get('family')} "
               f"model {c.get('model')} stepping {c.get('stepping')}")
    if rec.get("ended"):
        out.append(f"ended:      {rec['ended']}")
    if d["config"] is not None:
        out += _config_lines(d["config"])
    t = d["totals"]
    loss = []
    if t["lost_bytes"] or t["filled"]:
        loss.append(f"{_bytes(t['lost_bytes'])} lost ({t['filled']} buffer(s) filled)")
    if t["wrapped"]:
        loss.append(f"{t['wrapped']} circular buffer(s) wrapped")
    streams = d["streams"]
    altered = sum(1 for s in streams if "file_size" in s)
    if altered:
        loss.append(f"{altered} stream file(s) not as recorded (the views refuse them)")
    counted = t["instructions_observed"] > 0      # hardware counts none
    insns = (f"{_n(t['instructions_observed'])} instructions observed; " if counted
             else "")
    out.append(f"streams:    {len(streams)}, {_bytes(t['bytes'])}, {insns}"
               f"{'; '.join(loss) if loss else 'nothing lost'}")
    width = max((len(s["file"]) for s in streams), default=0)
    out += [_stream_line(s, width, counted) for s in streams]
    procs = d["processes"]
    nthreads = sum(len(p["threads"]) for p in procs)
    threads = f", {nthreads} thread(s)" if nthreads else ""
    out.append(f"processes:  {len(procs)}{threads}, {d['switches']} context switch(es)"
               + (f"; the sideband ({d['sideband_missing']}) is missing"
                  if d.get("sideband_missing") else ""))
    out += _process_lines(procs)
    imgs = d["images"]
    missing = [i for i in imgs if not i["found"]]
    # anonymous memory (perf's "//anon", "[stack]", "[heap]") is no file to
    # find ("[vdso]" and the kernel's image are: a bundle may store them)
    anon = [i for i in missing
            if i["file"].startswith("//anon") or i["file"] in ("[stack]", "[heap]")]
    missing = [i for i in missing if i not in anon]
    stored = sum(1 for i in imgs if i["found"] == "bundle")
    out.append(f"images:     {len(imgs) - len(anon)} file(s) mapped: {stored} stored in "
               f"the bundle, {len(imgs) - len(anon) - stored - len(missing)} found on "
               f"this machine, {len(missing)} missing")
    if anon:
        out.append(f"  and anonymous memory: {', '.join(i['file'] for i in anon[:8])}"
                   f"{', ...' if len(anon) > 8 else ''} (code run there can't be decoded)")
    for i in missing[:MAX_MISSING]:
        bid = f" (build-id {i['build_id']})" if i["build_id"] else ""
        out.append(f"  missing: {i['file']}{bid}")
    if len(missing) > MAX_MISSING:
        out.append(f"  ... and {len(missing) - MAX_MISSING} more (--json lists them all)")
    if missing:
        out.append("  (the trace through a missing file can't be decoded here: give the "
                   "views --image-path DIR with copies of them; 'hwtrace record "
                   "--copy-images' stores them in the bundle)")
    return out
