"""Packet-decode throughput: hwtrace (compiled core and Python twin) vs the
reference (libipt 2.0.5 via ``ptoracle pkt --summary``), same stream, same run.

Builds a multi-megabyte stream from the bundled real capture, then times

- compiled ``count()``: ``PacketDecoder(data).count()``, the scan behind
  ``hwtrace dump --stat`` (no packet objects), in-process, and the same
  including reading the file (what ``--summary`` does too);
- compiled ``packets()``: the loop yielding packet records (what the
  text/jsonl dumps and other consumers iterate);
- the Python twin (``impl="python"``): ``count()``;
- the CLI: ``python -m hwtrace dump --stat FILE`` (interpreter start-up
  included, which is printed too: the CLI on a lone PSB+), with a warm
  bytecode cache as an installed hwtrace has it (``--cold-bytecode``:
  every module compiled in every process, as PYTHONDONTWRITEBYTECODE=1
  makes it; the output says which);
- reference: ``ptoracle pkt FILE --summary``;
- the text and jsonl dumps' formatting loops with either implementation,
  on the first 256 KiB (formatting-bound: they show what scanning costs);

checks that all count the same packets and errors, and prints MB/s and
ratios against the reference (>1: hwtrace is faster).  The fair comparison
with ``--summary`` is the scan-only ``count()``.  Times are CPU seconds
(user + sys; a process's own, the child's for the CLI and the reference),
best of N: on a shared, loaded machine wall time says little.

Usage: python bench/bench_packets.py [MEGABYTES] [REPEATS] [--cold-bytecode]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (best_cpu_of, big_stream, bytecode_note,  # noqa: E402
                     child_env, mbps, ptoracle, python, warm_up)

from hwtrace.pt import _impl  # noqa: E402
from hwtrace.pt.decoder import PacketDecoder  # noqa: E402
from hwtrace.pt.errors import PtError  # noqa: E402


def loop(data: bytes, impl: str) -> tuple[int, int]:
    npk = nerr = 0
    for p in PacketDecoder(data, impl=impl).packets():
        if p.__class__ is PtError:
            nerr += 1
        else:
            npk += 1
    return npk, nerr


def parse(argv: list[str]):
    import argparse
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0].rstrip("."))
    ap.add_argument("megabytes", nargs="?", type=float, default=4,
                    help="size of the stream built (default 4)")
    ap.add_argument("repeats", nargs="?", type=int, default=3,
                    help="best of this many runs (default 3)")
    ap.add_argument("--cold-bytecode", action="store_true",
                    help="the CLI compiles every module in every process")
    return ap.parse_args(argv[1:])


def main(argv: list[str]) -> int:
    args = parse(argv)
    cold = args.cold_bytecode
    mb = args.megabytes
    reps = args.repeats
    data = big_stream(int(mb * (1 << 20)))
    n = len(data)
    print(f"selector: {_impl.STATUS.describe()}")
    print(bytecode_note(cold))
    rows = []           # (label, seconds, (packets, errors))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "stream.pt"
        path.write_bytes(data)
        env = child_env(cold, Path(tmp) / "pycache")

        # Short measurements (~0.1 s) get more runs: best-of-N filters out
        # scheduler noise on a shared machine.
        fast = max(reps, 15)
        compiled = _impl.CORE is not None
        if not compiled:
            st = _impl._ext.probe(_impl.NAME, _impl.ABI)
            compiled = st.loaded
            if not compiled:
                print(f"compiled core unavailable: {st.reason}")
        if compiled:
            rows.append(("compiled count() in-process", *best_cpu_of(
                fast, lambda: PacketDecoder(data, impl="compiled").count())))
            rows.append(("compiled count() + file read", *best_cpu_of(
                fast, lambda: PacketDecoder(path.read_bytes(),
                                            impl="compiled").count())))
            rows.append(("compiled packets() loop", *best_cpu_of(
                reps, lambda: loop(data, "compiled"))))
        rows.append(("python twin count()", *best_cpu_of(
            reps, lambda: PacketDecoder(data, impl="python").count())))

        def cli(file=path):
            out = subprocess.run(
                [python(), "-m", "hwtrace", "dump", "--stat", str(file)],
                capture_output=True, text=True, check=True, env=env).stdout
            d = dict(line.split(": ") for line in out.splitlines())
            return int(d["packets"]), int(d["errors"])
        if not cold:
            warm_up([python(), "-m", "hwtrace", "dump", "--stat", path], env)
        rows.append(("hwtrace dump --stat (CLI)", *best_cpu_of(reps, cli)))
        # (a lone PSB+: an empty file is refused as "nothing to decode")
        empty = Path(tmp) / "psb.pt"
        empty.write_bytes(b"\x02\x82" * 8 + b"\x02\x23")
        t_start, _ = best_cpu_of(max(reps, 5), lambda: cli(empty))

        exe = ptoracle()
        ref = None
        if exe is not None:
            def oracle():
                out = subprocess.run([str(exe), "pkt", str(path), "--summary"],
                                     capture_output=True, text=True,
                                     check=True).stdout
                s = json.loads(out.splitlines()[-1])
                return s["packets"], s["errors"]
            t_ref, ref_counts = best_cpu_of(fast, oracle)
            ref = ("ptoracle pkt --summary", t_ref, ref_counts)
            rows.append(ref)

    formats = dump_formats(data[:FORMAT_SLICE], reps, compiled)
    counts = {c for _, _, c in rows}
    npk, nerr = rows[0][2]
    print(f"stream: {n} bytes ({n / 1e6:.1f} MB), {npk} packets, "
          f"{nerr} errors; best of {reps} (count() and ptoracle: best of "
          f"{max(reps, 15)})")
    print(f"{'':32s} {'MB/s':>9s} {'CPU s':>9s} {'vs reference':>13s}")
    for label, t, _c in rows:
        ratio = f"{ref[1] / t:12.2f}x" if ref else "-"
        print(f"{label:32s} {mbps(n, t):9.2f} {t:9.3f} {ratio:>13s}")
    print(f"(the CLI's fixed cost, interpreter start-up and imports: "
          f"{t_start:.3f} s CPU, measured on a lone PSB+; bytecode cache "
          f"{'cold' if cold else 'warm'})")
    if ref is None:
        print("ptoracle unavailable (needs libipt-dev and cc): "
              "no reference timing")
    if len(counts) != 1:
        print(f"COUNTS DIFFER: {sorted(counts)}")
        return 1
    print("all counts match")
    m = min(n, FORMAT_SLICE)
    print(f"dump formats, in-process, first {m} bytes ({m / 1e6:.2f} MB):")
    for label, t in formats:
        print(f"{label:32s} {mbps(m, t):9.2f} {t:9.3f}")
    return 0


FORMAT_SLICE = 1 << 18


def dump_formats(data: bytes, reps: int, compiled: bool):
    """Text (ptdump_lines) and jsonl (to_jsonl per record) throughput with
    each implementation: what the compiled scanner buys the dumps, which
    are formatting-bound."""
    from hwtrace.pt.ptdump_format import ptdump_lines

    def text():
        for _ in ptdump_lines(data):
            pass

    def jsonl():
        for p in PacketDecoder(data).packets():
            p.to_jsonl()

    out = []
    saved = _impl.CORE
    try:
        for impl in (["compiled"] if compiled else []) + ["python"]:
            _impl.CORE = _impl.core_for(impl)   # what ptdump_lines will use
            for label, fn in (("text", text), ("jsonl", jsonl)):
                t, _ = best_cpu_of(reps, fn)
                out.append((f"{label} dump, {impl}", t))
    finally:
        _impl.CORE = saved
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv))
