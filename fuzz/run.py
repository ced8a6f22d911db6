"""Run a fuzz target (see fuzz/targets.py) with the hang and memory limits.

    python fuzz/run.py TARGET --mutate N [--seed S]     # deterministic loop
    python fuzz/run.py TARGET --atheris [LIBFUZZER ARGS]  # coverage-guided

Limits, the same in both modes:
- hang: more than 1 s of CPU time per started 64 KiB of input and decoding
  pass (CPU time, so a loaded machine does not count as a hang; the flow
  target adds 1 s per 100,000 decoded items it may emit, see
  targets.budget) is a ``Hang``;
- memory: the address space may grow by at most ``--mem-mb`` (default
  1024) MiB over the start (RLIMIT_AS): a reader allocating out of
  proportion to its input fails with MemoryError, which is a finding.

``--mutate`` runs the seeds, then N seeded mutations of them (bit flips,
byte sets, inserts, deletes, duplications, splices, interesting values),
prints one JSON line of totals and exits 1 if any input broke an
invariant; each distinct finding is saved under ``build/fuzz/TARGET/``.
``--atheris`` writes the seeds to ``build/fuzz/TARGET/seeds`` and hands
over to libFuzzer; with ``--keep-going`` findings are saved and counted
instead of stopping the run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import resource
import signal
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import targets  # noqa: E402

OUT = Path(os.environ.get("HWTRACE_FUZZ_OUT") or HERE.parent / "build" / "fuzz")

INTERESTING = [b"\x02\x82" * 8, b"\x02\x03", b"\x02\x23", b"\x99\x00",
               b"\xff", b"\x00", b"\x7f", b"\x80", b"\xff\xff\xff\xff",
               b"\x00\x00\x00\x80", b"\xff\xff\xff\xff\xff\xff\xff\x7f",
               b"\x01\x00\x00\x00\x00\x00\x00\x00", b"\x02\xc3\x88",
               b"\x71", b"\x0d", b"\x19", b"\x59", b"\xc8", b'"', b"{", b"]",
               b'"size":', b"../", b"/", b"-1", b"1e999", b"\n"]


class Hang(Exception):
    """CPU time for one input exceeded its budget."""


def budget_seconds(n: int) -> int:
    """1 s of CPU per started 64 KiB of input (per decoding pass)."""
    return max(1, math.ceil(n / 65536))


def limit_memory(extra_mb: int) -> None:
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    cap = vm * 1024 + extra_mb * (1 << 20)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


#: how far past its budget an input may run before it is interrupted (the
#: overrun is reported either way; the interrupt only ends endless loops).
BACKSTOP = 10


def guarded(check, budget=budget_seconds):
    """``check`` under a CPU-time budget (``budget(data)`` seconds, default
    1 s per 64 KiB): an input that used more is a Hang, measured with
    process_time after it returns; one running BACKSTOP times over budget
    is interrupted by SIGPROF (a blocked syscall by SIGALRM at 60 s + the
    backstop).  A late signal from an earlier input is ignored, so every
    Hang names the input that caused it."""
    state = {"start": 0.0, "limit": 0.0, "wall": 0.0}

    def on_signal(signum, frame):
        if signum == signal.SIGALRM:
            if time.monotonic() >= state["wall"]:
                raise Hang("blocked: no progress in wall-clock time")
        elif time.process_time() - state["start"] >= 0.9 * state["limit"]:
            raise Hang("interrupted: far over the CPU budget")
    signal.signal(signal.SIGPROF, on_signal)
    signal.signal(signal.SIGALRM, on_signal)

    def run(data: bytes) -> None:
        b = budget(data)
        state["limit"] = BACKSTOP * b
        state["wall"] = time.monotonic() + 60 + BACKSTOP * b
        state["start"] = t0 = time.process_time()
        # repeating: a tick that comes early (timer granularity) is ignored
        signal.setitimer(signal.ITIMER_PROF, BACKSTOP * b, b)
        signal.setitimer(signal.ITIMER_REAL, 60 + BACKSTOP * b)
        try:
            check(data)
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.setitimer(signal.ITIMER_REAL, 0)
        used = time.process_time() - t0
        if used > b:
            raise Hang(f"{used:.2f} s of CPU for {len(data)} bytes (budget {b:.2f} s)")
    return run


def signature(exc: BaseException) -> str:
    """Exception type and the innermost hwtrace frame: one per bug."""
    tb = traceback.extract_tb(exc.__traceback__)
    frames = [f for f in tb if "/hwtrace/" in f.filename] or tb[-1:]
    f = frames[-1] if frames else None
    where = f"{Path(f.filename).name}:{f.lineno}" if f else "?"
    return f"{type(exc).__name__}@{where}"


class Findings:
    def __init__(self, target: str):
        self.dir = OUT / target
        self.seen: dict[str, int] = {}

    def add(self, data: bytes, exc: BaseException) -> bool:
        sig = signature(exc)
        first = sig not in self.seen
        self.seen[sig] = self.seen.get(sig, 0) + 1
        if first:
            self.dir.mkdir(parents=True, exist_ok=True)
            h = hashlib.sha1(data).hexdigest()[:12]
            (self.dir / f"finding-{h}").write_bytes(data)
            (self.dir / f"finding-{h}.txt").write_text(
                sig + "\n" + "".join(traceback.format_exception(exc)))
            print(f"FINDING {sig} -> {self.dir / f'finding-{h}'}", file=sys.stderr)
        return first


def mutate(rng: random.Random, data: bytes, pool: list[bytes], max_len: int) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3, 5))):
        op = rng.randrange(9)
        n = len(b)
        if op == 0 and n:                                   # bit flip
            i = rng.randrange(n)
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and n:                                 # byte set
            b[rng.randrange(n)] = rng.randrange(256)
        elif op == 2:                                       # insert random
            i = rng.randrange(n + 1)
            b[i:i] = rng.randbytes(rng.randrange(1, 9))
        elif op == 3 and n:                                 # delete range
            i = rng.randrange(n)
            del b[i:i + rng.randrange(1, 33)]
        elif op == 4 and n:                                 # duplicate range
            i = rng.randrange(n)
            j = min(n, i + rng.randrange(1, 65))
            k = rng.randrange(n + 1)
            b[k:k] = b[i:j]
        elif op == 5:                                       # interesting value
            v = rng.choice(INTERESTING)
            i = rng.randrange(n + 1)
            if rng.random() < 0.5:
                b[i:i + len(v)] = v
            else:
                b[i:i] = v
        elif op == 6 and pool:                              # splice
            o = rng.choice(pool)
            if o:
                i = rng.randrange(len(o))
                j = min(len(o), i + rng.randrange(1, 257))
                k = rng.randrange(n + 1)
                b[k:k] = o[i:j]
        elif op == 7 and n:                                 # truncate
            del b[rng.randrange(n):]
        elif op == 8 and n >= 4:                            # int field
            i = rng.randrange(n - 3)
            b[i:i + 4] = rng.choice((0, 1, 0x7fffffff, 0xffffffff,
                                     rng.randrange(1 << 32))).to_bytes(4, "little")
    return bytes(b[:max_len])


def run_mutations(target: str, n: int, seed: int, max_len: int = 65536,
                  report_every: float = 0.0) -> dict:
    check, seeds = targets.make(target)
    run = guarded(check, targets.budget(target))
    pool = [s[:max_len] for s in seeds()]
    findings = Findings(target)
    rng = random.Random(seed)
    done = 0
    t0 = time.monotonic()
    last = t0

    def one(data):
        nonlocal done
        try:
            run(data)
        except Exception as e:          # noqa: BLE001 -- every escape is a finding
            findings.add(data, e)
        done += 1

    for s in pool:
        one(s)
    current = list(pool) or [b""]
    for _ in range(n):
        parent = rng.choice(current)
        child = mutate(rng, parent, pool, max_len)
        one(child)
        if len(current) < 4096 and rng.random() < 0.05:
            current.append(child)       # let mutations accumulate a little
        if report_every and time.monotonic() - last > report_every:
            last = time.monotonic()
            print(json.dumps({"target": target, "inputs": done,
                              "seconds": round(last - t0, 1)}), flush=True)
    dt = time.monotonic() - t0
    return {"target": target, "mode": "mutate", "seed": seed, "seeds": len(pool),
            "inputs": done, "seconds": round(dt, 2),
            "inputs_per_s": round(done / dt, 1) if dt else None,
            "findings": findings.seen}


def run_atheris(target: str, argv: list[str], keep_going: bool) -> None:
    import atheris
    with atheris.instrument_imports():
        import hwtrace.bundle  # noqa: F401
        import hwtrace.engines.perf.perfdata  # noqa: F401
        import hwtrace.flow.block  # noqa: F401
        import hwtrace.flow.insn  # noqa: F401
        import hwtrace.flow.session  # noqa: F401
        import hwtrace.pt.decoder  # noqa: F401
        import hwtrace.pt.ptdump_format  # noqa: F401
    check, seeds = targets.make(target)
    run = guarded(check, targets.budget(target))
    sd = OUT / target / "seeds"
    sd.mkdir(parents=True, exist_ok=True)
    for s in seeds():
        (sd / hashlib.sha1(s).hexdigest()).write_bytes(s)
    findings = Findings(target)

    def one(data: bytes) -> None:
        if not keep_going:
            run(data)
            return
        try:
            run(data)
        except Exception as e:          # noqa: BLE001
            findings.add(data, e)
    (OUT / target / "corpus").mkdir(parents=True, exist_ok=True)
    # libFuzzer's own limits are wall-clock backstops only (a loaded, shared
    # machine starves a niced fuzzer); the CPU budget above is the real one.
    defaults = [f"-artifact_prefix={OUT / target}/", "-timeout=600", "-rss_limit_mb=4096"]
    given = {a.split("=", 1)[0] for a in argv}
    argv = [d for d in defaults if d.split("=", 1)[0] not in given] + argv
    atheris.Setup([sys.argv[0]] + argv + [str(OUT / target / "corpus"), str(sd)], one)
    atheris.Fuzz()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", choices=targets.TARGETS)
    ap.add_argument("--mutate", type=int, metavar="N")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-len", type=int, default=65536)
    ap.add_argument("--mem-mb", type=int, default=1024)
    ap.add_argument("--report-every", type=float, default=0.0)
    ap.add_argument("--atheris", action="store_true")
    ap.add_argument("--keep-going", action="store_true")
    a, rest = ap.parse_known_args(argv)
    rest = [r for r in rest if r != "--"]
    if rest and not a.atheris:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    limit_memory(a.mem_mb)
    if a.atheris:
        run_atheris(a.target, rest, a.keep_going)
        return 0
    res = run_mutations(a.target, a.mutate or 0, a.seed, a.max_len, a.report_every)
    print(json.dumps(res), flush=True)
    return 1 if res["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
