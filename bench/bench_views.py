"""The views over a bundle against ``ptoracle insn --summary`` over the same
streams, in the same run (issue 15: ratio >= 1.0 on >= 50 M instructions).

    python bench/bench_views.py BUNDLE                 # end to end
    python bench/bench_views.py BUNDLE --cache DIR     # the views' own cost
    python bench/batch_cache.py save BUNDLE DIR        # (make DIR once)

Views timed: ``summary``, ``calls``, ``export --perfetto``, ``export
--chrome``, ``export --folded`` and ``branches --kinds all --format
jsonl``, each in a fresh process (wall time, CPU time and peak RSS of that
process; output to a temporary file or /dev/null).  With ``--repeat N``
the wall and CPU columns are each the best of the N runs (the reference's
too) and the peak RSS the largest.  The reference is libipt's
instruction decoder counting every stream (``ptoracle insn FILE --raw
... --summary``, images from ``hwtrace images``), timed the same way;
ratio = reference time / view time (>= 1: the view is no slower).

Which producer made the batches is printed: the compiled core, the Python
twin, or batches cached on disk (``--cache``: decoded once beforehand, so
the time is the view's own -- the call stacks, the formatting, the
writing -- on top of batches that cost nothing).  Without ``--cache`` the
bench fails loudly when the batches would come from the Python twin (the
compiled core has no batch producer), unless ``--allow-python``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

VIEWS = {
    "summary": ["summary", "{b}"],
    "calls": ["calls", "{b}"],
    "perfetto": ["export", "{b}", "--perfetto", "{o}.pftrace"],
    "chrome": ["export", "{b}", "--chrome", "{o}.json"],
    "folded": ["export", "{b}", "--folded", "{o}.folded"],
    "branches": ["branches", "--kinds", "all", "--format", "jsonl", "{b}"],
}


def _timed(argv, stdout=subprocess.DEVNULL, env=None):
    """(wall seconds, peak RSS bytes, exit status, stderr, cpu seconds) of
    one process."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, env=env)
    err = p.stderr.read()
    _pid, status, ru = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        sys.stderr.write(err.decode(errors="replace"))
    return (dt, ru.ru_maxrss * 1024, p.returncode, err.decode(errors="replace"),
            ru.ru_utime + ru.ru_stime)


def reference(bundle: str, oracle: str, env) -> tuple[float, int, int, float]:
    """ptoracle insn --summary over every stream: (seconds, insns, peak,
    cpu seconds)."""
    m = json.load(open(os.path.join(bundle, "manifest.json")))
    total, insns, peak, cpu = 0.0, 0, 0, 0.0
    for s in m["streams"]:
        name = s["file"]
        r = subprocess.run([sys.executable, "-m", "hwtrace", "images", bundle,
                            "--pt", name], capture_output=True, text=True, env=env)
        if r.returncode:
            raise SystemExit(f"hwtrace images {name}: {r.stderr.strip()}")
        argv = [oracle, "insn", os.path.join(bundle, name), *r.stdout.split(),
                "--summary"]
        for k in ("mtc_freq", "nom_freq"):
            if m.get(k):
                argv += [f"--{k.replace('_', '-')}", str(m[k])]
        if m.get("cpuid_0x15_eax"):
            argv += ["--cpuid-0x15.eax", str(m["cpuid_0x15_eax"]),
                     "--cpuid-0x15.ebx", str(m["cpuid_0x15_ebx"])]
        c = m.get("cpu") or {}
        if c.get("family"):
            argv += ["--cpu", f"{c['family']}/{c.get('model', 0)}"]
        with tempfile.TemporaryFile() as out:
            dt, rss, rc, _e, c = _timed(argv, stdout=out)
            out.seek(0)
            line = out.read().decode().strip().splitlines()[-1]
        if rc:
            raise SystemExit(f"ptoracle failed on {name}")
        total += dt
        cpu += c
        insns += json.loads(line)["insns"]
        peak = max(peak, rss)
    return total, insns, peak, cpu


def producer(cache: str | None) -> str:
    if cache:
        return "cached batches (decoded beforehand: the view's own cost)"
    from hwtrace.flow import batches, fast
    core = fast.CORE
    if core is not None and hasattr(core, "decode_batches"):
        return "compiled"
    if os.environ.get("HWTRACE_NO_EXTENSIONS") == "1":
        return "python (HWTRACE_NO_EXTENSIONS=1)"
    _ = batches
    return "python"


def _helpers():
    """The views' own compiled helpers: the call-stack matcher, the text
    columns of the exporters, the branch formatter."""
    from hwtrace.analysis import _runs_impl
    from hwtrace.branches import _impl as branches_impl
    from hwtrace.export import _textcols_impl
    return [_runs_impl.STATUS, _textcols_impl.STATUS, branches_impl.STATUS]


def child(view_argv: list, cache: str | None) -> int:
    """Run one view (in this process), from the cache if given."""
    if os.environ.get("BENCH_VIEWS_COMPILED") == "1":
        # each timed process checks for itself: a core that stops loading
        # mid-bench (a source edited and not rebuilt: its hash no longer
        # matches) would otherwise time the Python twin unnoticed
        bad = [st.describe() for st in _helpers() if not st.loaded]
        if not cache and producer(None) != "compiled":
            bad.append(f"batches: {producer(None)}")
        if bad:
            sys.stderr.write("bench_views: a view core would run its Python twin: "
                             + "; ".join(bad) + "\n")
            return 3
    if cache:
        from batch_cache import cached_batches
        from hwtrace.cli import _inputs
        real = _inputs.open_input

        def open_input(*a, **kw):
            inp = real(*a, **kw)
            for s in inp.streams:
                name = s.stream.name
                s.batches = lambda _n=name, **k: cached_batches(cache, _n)
            return inp
        _inputs.open_input = open_input
    from hwtrace.cli import main
    return main(view_argv)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", nargs="?")
    ap.add_argument("--cache", metavar="DIR")
    ap.add_argument("--views", default=",".join(VIEWS))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--allow-python", action="store_true")
    ap.add_argument("--child", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.child is not None:
        cache = a.child[0] or None
        return child(a.child[1:], cache)
    if not a.bundle:
        ap.error("give a BUNDLE")
    from _common import ptoracle
    oracle = ptoracle()
    if oracle is None:
        raise SystemExit("no ptoracle (build/ptoracle)")
    env = dict(os.environ)
    prod = producer(a.cache)
    if prod.startswith("python") and not a.allow_python:
        raise SystemExit(f"bench_views: the batches would come from the Python twin "
                         f"({prod}): the compiled core has no batch producer here. "
                         f"Use --cache DIR to time the views' own cost, or "
                         f"--allow-python")
    helpers = _helpers()
    for st in helpers:
        print(f"view core: {st.describe()}")
    if any(not st.loaded for st in helpers) and not a.allow_python:
        raise SystemExit("bench_views: a view core would run its Python twin (above); "
                         "build the extensions (python3 setup.py build_ext --inplace) "
                         "or pass --allow-python")
    refs = [reference(a.bundle, str(oracle), env) for _ in range(a.repeat)]
    if not a.allow_python:
        env["BENCH_VIEWS_COMPILED"] = "1"
    ref_t = min(r[0] for r in refs)
    ninsn = refs[0][1]
    ref_cpu = min(r[3] for r in refs)
    print(f"bundle: {a.bundle}: {ninsn:,} instructions")
    print(f"batches: {prod}")
    print(f"reference: ptoracle insn --summary over the same streams: "
          f"{ref_t:.2f} s ({ninsn / ref_t / 1e6:.1f} M insn/s), cpu {ref_cpu:.2f} s")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores "
          f"(others share this machine: wall ratios move with it, cpu ratios less)")
    print(f"{'view':<10} {'seconds':>8} {'ratio':>6} {'cpu s':>7} {'cpu ratio':>9} "
          f"{'peak RSS':>9} {'output':>10}")
    failed = []
    with tempfile.TemporaryDirectory(prefix="bench-views-") as d:
        for v in a.views.split(","):
            argv = [x.format(b=a.bundle, o=os.path.join(d, v)) for x in VIEWS[v]]
            runs = []
            for _ in range(a.repeat):
                r = _timed([sys.executable, __file__, "--child", a.cache or "",
                            *argv], env=env)
                if r[2]:
                    print(f"{v:<10} failed (exit {r[2]})")
                    failed.append(v)
                    break
                runs.append(r)
            if len(runs) < a.repeat or not runs:
                continue
            # each column its own best of the repeats (the machine is
            # shared: the fastest wall and the least CPU are often different
            # runs, and CPU is the steadier measure); the peak RSS is the
            # largest of them, so a repeat never hides a memory spike
            wall = min(r[0] for r in runs)
            cpu = min(r[4] for r in runs)
            rss = max(r[1] for r in runs)
            out = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
                      if f.startswith(v + "."))
            print(f"{v:<10} {wall:>8.2f} {ref_t / wall:>6.2f} "
                  f"{cpu:>7.2f} {ref_cpu / cpu:>9.2f} "
                  f"{rss / 1e6:>7.0f}MB {out / 1e6:>8.0f}MB", flush=True)
            for f in os.listdir(d):
                os.unlink(os.path.join(d, f))
    if failed:
        print(f"bench_views: FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
