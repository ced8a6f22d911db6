"""Export speed and memory on a large synthetic flow (flow items, one at
a time, through the item path).  The views over a real recording, against
libipt in the same run, are bench/bench_views.py.

A flow of N instructions (main calling fib(15) over and over, a TSC tick
every 64 instructions) goes through the call-stack builder into the Chrome
JSON, Perfetto and folded writers at once, in a fresh process per size so
peak RSS is that run's.  Memory must stay flat as N grows (streaming):
the last column is peak RSS relative to the smallest run.  There is no
reference exporter to race, so the baseline printed alongside is the
bare cost of iterating the same items (what any consumer pays).

    python bench/bench_export.py                # 1M and 10M instructions
    python bench/bench_export.py --sizes 1e6,2e6
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def flow(n_insns: int):
    from hwtrace.analysis.synth import FlowSynth, play_fib

    s = FlowSynth(["__libc_start_call_main", "main", "fib"])
    s.call("fib")
    play_fib(s, 15)
    s.body(2)
    tree = s.take()
    per = sum(1 for it in tree if "iclass" in it)
    head = [{"event": "enabled", "offset": 0, "ip_suppressed": False,
             "ip": s.addr["main"], "resumed": False, "tsc": 1000}]
    tsc = 1000

    def gen():
        nonlocal tsc
        yield from head
        done = 0
        while done < n_insns:
            k = 0
            for it in tree:
                if "iclass" in it:
                    if not k & 63:
                        yield {"event": "tick", "offset": 0, "ip_suppressed": False,
                               "ip": it["ip"], "tsc": tsc}
                    k += 1
                    tsc += 3
                yield it
            done += per
    # main's own instructions: the tree starts with its call
    for it in tree:
        if "iclass" in it:
            it.setdefault("mode", "64bit")
    return s, gen()


def child(n: int, what: str) -> dict:
    from hwtrace.analysis.records import StreamInfo
    from hwtrace.export.chrome import ChromeTraceWriter
    from hwtrace.export.folded import FoldedWriter
    from hwtrace.export.perfetto import PerfettoTraceWriter
    from hwtrace.export.pipeline import Stream, export_streams

    s, items = flow(n)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        if what == "iterate":
            count = 0
            for it in items:
                count += 1
            totals = {"insns": n, "activations": 0}
            sizes = {}
        else:
            with open(os.path.join(d, "t.json"), "w", buffering=1 << 20) as cj, \
                    open(os.path.join(d, "t.pftrace"), "wb", buffering=1 << 20) as pf, \
                    open(os.path.join(d, "t.folded"), "w") as fo:
                wc, wp, wf = ChromeTraceWriter(cj), PerfettoTraceWriter(pf), FoldedWriter(fo)
                totals = export_streams([Stream(StreamInfo(1, 1), items)],
                                        [wc, wp, wf], lookup=s.lookup)
                wc.close(); wp.close(); wf.close()
            sizes = {f: os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)}
    dt = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"n": totals["insns"], "acts": totals["activations"], "time": dt,
            "rss": rss, "sizes": sizes}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1e6,1e7")
    ap.add_argument("--child", nargs=2, metavar=("N", "WHAT"))
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(int(float(a.child[0])), a.child[1])))
        return 0
    sizes = [int(float(x)) for x in a.sizes.split(",")]
    base_rss = None
    print(f"{'instructions':>13} {'activations':>12} {'export s':>9} {'Minsn/s':>8} "
          f"{'iterate s':>9} {'export/iter':>11} {'peak RSS MB':>11} {'RSS ratio':>9}  outputs")
    for n in sizes:
        runs = {}
        for what in ("iterate", "export"):
            r = subprocess.run([sys.executable, __file__, "--child", str(n), what],
                               capture_output=True, text=True, check=True)
            runs[what] = json.loads(r.stdout)
        e, it = runs["export"], runs["iterate"]
        base_rss = base_rss or e["rss"]
        outs = ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in sorted(e["sizes"].items()))
        print(f"{e['n']:>13,} {e['acts']:>12,} {e['time']:>9.1f} {e['n'] / e['time'] / 1e6:>8.2f} "
              f"{it['time']:>9.1f} {e['time'] / it['time']:>11.1f} {e['rss'] / 1e6:>11.1f} "
              f"{e['rss'] / base_rss:>9.2f}  {outs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
