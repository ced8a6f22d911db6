"""Packet-decode throughput: hwtrace vs the reference (libipt via ptoracle).

Builds a multi-megabyte stream from the bundled real capture, then times

- hwtrace in-process: ``PacketDecoder(data).packets()`` counted (the work of
  ``hwtrace dump --stat``, without interpreter start-up),
- hwtrace CLI: ``python -m hwtrace dump --stat FILE`` (wall clock),
- reference: ``ptoracle pkt FILE --summary`` (libipt 2.0.5, wall clock),

checks that both count the same packets and errors, and prints MB/s and the
ratios.  Usage: python bench/bench_packets.py [MEGABYTES] [REPEATS]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_of, big_stream, mbps, ptoracle, python  # noqa: E402

from hwtrace.pt.decoder import PacketDecoder  # noqa: E402
from hwtrace.pt.errors import PtError  # noqa: E402


def count(data: bytes) -> tuple[int, int]:
    npk = nerr = 0
    for p in PacketDecoder(data).packets():
        if p.__class__ is PtError:
            nerr += 1
        else:
            npk += 1
    return npk, nerr


def main(argv: list[str]) -> int:
    mb = float(argv[1]) if len(argv) > 1 else 4
    reps = int(argv[2]) if len(argv) > 2 else 3
    data = big_stream(int(mb * (1 << 20)))
    n = len(data)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "stream.pt"
        path.write_bytes(data)

        t_lib, (npk, nerr) = best_of(reps, lambda: count(data))
        t_cli, cli = best_of(reps, lambda: subprocess.run(
            [python(), "-m", "hwtrace", "dump", "--stat", str(path)],
            capture_output=True, text=True, check=True).stdout)
        cli_counts = dict(line.split(": ") for line in cli.splitlines())
        assert int(cli_counts["packets"]) == npk, cli
        print(f"stream: {n} bytes ({n / 1e6:.1f} MB), {npk} packets, "
              f"{nerr} errors")
        print(f"hwtrace  in-process : {mbps(n, t_lib):8.2f} MB/s "
              f"({t_lib:.3f} s)")
        print(f"hwtrace  dump --stat: {mbps(n, t_cli):8.2f} MB/s "
              f"({t_cli:.3f} s)")

        exe = ptoracle()
        if exe is None:
            print("ptoracle unavailable (needs libipt-dev and cc): "
                  "no reference timing")
            return 0
        t_ref, out = best_of(reps, lambda: subprocess.run(
            [str(exe), "pkt", str(path), "--summary"],
            capture_output=True, text=True, check=True).stdout)
        summary = json.loads(out.splitlines()[-1])
        same = (summary["packets"], summary["errors"]) == (npk, nerr)
        print(f"ptoracle pkt --summary: {mbps(n, t_ref):8.2f} MB/s "
              f"({t_ref:.3f} s)  counts {'match' if same else 'DIFFER'}: "
              f"{summary['packets']} packets, {summary['errors']} errors")
        print(f"ratio hwtrace/reference: in-process {t_ref / t_lib:.3f}x, "
              f"CLI {t_ref / t_cli:.3f}x  (>1 means hwtrace is faster)")
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
