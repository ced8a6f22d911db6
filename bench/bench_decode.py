"""Benchmark: ``hwtrace decode --quiet --stat`` (the compiled flow core's
counts) against libipt's block decoder, ``ptoracle blk FILE ... --summary``
(the fastest libipt flow decoder), timed in the same run on the same
inputs; and the compiled core's batches (``hwtrace.flow.batches``) in
process, with and without every instruction (``want_insns``).

Inputs (bench/_workloads.py): the real captures in
../shared/fixtures/hardware with their code, and emulated-engine
recordings of ``gzip -9`` on ``--input-kib`` KiB of text, ``python3 -c
'print(sum(range(100000)))'`` and ``sqlite3`` (``--timing``: recorded with
TSC/MTC/CYC).  Target (issue 15): counts at least 2x libipt's block
decoder.

Prints which flow core the children run and stops with an error if it is
the Python twin.  ``--python`` also times the twin (labelled as such).

Both count the same instructions; their block counts differ by design.
libipt 2.0.5's (``ptoracle blk``: blocks with instructions; ``ptxed
--stat`` counts those and any empty ones, none on these workloads) also
ends a block where its block cache is being filled: the first time it
runs through a direct call or a backward direct jump, before code it
filled earlier, after 1,024 instructions of one fill.  hwtrace's are the
blocks libipt returns once its cache is warm (decision points, events,
section changes), so its count is lower by about the number of such
places the program reaches (tests/test_flow_block_cuts.py pins that).
A stream from a bundle (the recordings, hase_loopy) is also timed as
``hwtrace decode --quiet --stat DIR``.  The hwtrace children run with a
warm bytecode cache, as an installed hwtrace has it (``--cold-bytecode``:
compiled in every process, as PYTHONDONTWRITEBYTECODE=1 makes it); the
output says which, and the start-up floor (the interpreter alone,
``hwtrace --version``).

    python bench/bench_decode.py [--repeat N] [--input-kib N] [--timing]
                                 [--work DIR] [--only captures|recordings]
                                 [--python] [--cold-bytecode]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _workloads as W  # noqa: E402


def stat_insns(out: str) -> int:
    return int(out.split("insn:")[1].split(".")[0])


def stat_blocks(out: str) -> int:
    return int(out.split("blocks:")[1].split(".")[0])


def batch_rates(w: W.Workload, repeat: int) -> str:
    """In-process: the compiled core's batches (block decoder), records/s
    and insn/s, without and with every instruction."""
    from hwtrace.flow import batches as B
    data, image, cfg = W.load(w)
    parts = []
    for want in (False, True):
        t = None
        for _ in range(repeat):
            t0 = time.process_time()
            recs = insns = 0
            for b in B.batches(data, image, cfg, decoder="block",
                               want_insns=want, impl="compiled"):
                recs += len(b.blocks)
                insns += b.ninsn
            spent = time.process_time() - t0
            t = spent if t is None else min(t, spent)
        parts.append(f"{'with' if want else 'no'} insns: "
                     f"{recs / t / 1e6:.1f} M rec/s, "
                     f"{insns / t / 1e6:.1f} M insn/s")
    return "; ".join(parts)


def main() -> int:
    ap = W.parser(__doc__)
    ap.add_argument("--python", action="store_true",
                    help="also time the Python twin (slow)")
    a = ap.parse_args()
    with W.session(a) as (ch, loads):
        for w in loads:
            to, summary = W.oracle_blk_summary(w, a.repeat)
            ni = summary["insns"]
            th, out = ch.best(W.hwtrace("decode", "--pt", w.pt, *w.opts,
                                        "--quiet", "--stat"), a.repeat)
            n = stat_insns(out)
            mb = w.pt.stat().st_size / 1e6
            print(f"{w.name}: {mb:.2f} MB, {ni} insns (libipt 2.0.5), "
                  f"{n} (hwtrace)")
            print(f"  blocks: {summary['blocks']} (libipt 2.0.5: with its "
                  f"block-cache fill stops), {stat_blocks(out)} (hwtrace: "
                  f"as a warm cache cuts them)")
            print(f"  ptoracle blk --summary          {to:7.3f} s CPU "
                  f"{ni / to / 1e6:7.1f} M insn/s")
            print(f"  hwtrace decode --quiet --stat   {th:7.3f} s CPU "
                  f"{n / th / 1e6:7.1f} M insn/s  {to / th:5.2f}x libipt "
                  f"[compiled]")
            if w.bundle is not None:
                tb, out = ch.best(W.hwtrace("decode", "--quiet", "--stat",
                                            w.bundle), a.repeat)
                nb = sum(map(stat_insns, out.split("[stream ")[1:]))
                vs = f"{to / tb:5.2f}x libipt" if nb == ni else \
                    "(all its streams)"
                print(f"  hwtrace decode --quiet --stat DIR {tb:5.3f} s CPU "
                      f"{nb / tb / 1e6:7.1f} M insn/s  {vs} [compiled]")
            if a.python:
                tp, out = ch.best(W.hwtrace("decode", "--pt", w.pt, *w.opts,
                                            "--quiet", "--stat"), 1,
                                  HWTRACE_NO_EXTENSIONS="1")
                print(f"  the same, Python twin           {tp:7.3f} s CPU "
                      f"{stat_insns(out) / tp / 1e6:7.1f} M insn/s  "
                      f"{to / tp:5.2f}x libipt [python twin]")
            print(f"  batches in process (compiled): "
                  f"{batch_rates(w, a.repeat)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
