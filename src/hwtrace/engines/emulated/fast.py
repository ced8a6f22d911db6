"""The compiled generator (``ptgen_fast.c``) behind a narrow boundary.

:func:`eligible` says whether a log and configuration are in the subset the
C twin implements (QEMU logs -- signal deliveries included, inferred as
flow._find_signals does -- no address ranges, no INSN / SIGNAL records, no
block with a branch inside);
:func:`generate` then runs it and returns ``{key: (bytes, insns)}`` and the
cpu-mode switches, exactly what :func:`flow.generate` gives for the same
input (the tests compare the two).  ``HWTRACE_NO_EXTENSIONS=1`` disables it.
"""

from __future__ import annotations

import os
import struct
import subprocess
import tempfile
from pathlib import Path

from . import execlog as xl
from .buildcache import BuildError, build
from .ptgen import TraceConfig

SOURCE = Path(__file__).with_name("ptgen_fast.c")
#: every file of the build (a change to any one rebuilds)
SOURCES = [SOURCE, SOURCE.with_name("ptgen_signals.c"), SOURCE.with_name("ptgen_signals.h")]
_BLK = struct.Struct("<QQQQIB3x")


class FastUnavailable(RuntimeError):
    pass


def binary_path() -> Path:
    try:
        return _binary_path()
    except OSError as e:    # the build cache can't be used: the Python generator runs
        raise FastUnavailable(f"{e.filename}: {e.strerror}") from None


def _binary_path() -> Path:
    try:
        return build("ptgen_fast", SOURCES,
                     ["-O2", "-Wall", *(str(p) for p in SOURCES if p.suffix == ".c")])
    except BuildError as e:
        raise FastUnavailable(str(e)) from None


def eligible(trace, cfg: TraceConfig) -> bool:
    if os.environ.get("HWTRACE_NO_EXTENSIONS") == "1":
        return False
    if trace.header.source != xl.SOURCE_QEMU or trace.features - {"exec_part"}:
        return False
    if (int(cfg.ctl) >> 32) & 0xFFFF:
        return False
    return True


def generate(log_path, trace, cfg: TraceConfig, mode: str, num_cpus: int, cr3: dict,
             starts: dict | None = None, execs: dict | None = None,
             keep: int | None = None, generated: dict | None = None):
    """Run the C generator; returns ({("cpu"|"tid", n): (bytes, insns)},
    switches, {tid: exit time}); ``starts`` and ``execs`` (dicts) get what
    flow.generate's do.  ``keep``: each stream's bytes are its first
    ``keep`` only (what a stop-on-full buffer of that size can store: a
    long run generates gigabytes it would drop); ``generated`` (a dict)
    gets each stream's full length."""
    exe = binary_path()
    tm = cfg.timing
    # next to the log (the recording's working directory), not in $TMPDIR:
    # a generator killed mid-way leaves nothing behind elsewhere
    with tempfile.TemporaryDirectory(prefix="hwtrace-gen-",
                                     dir=os.path.dirname(os.path.abspath(log_path))) as tmp:
        blocks = os.path.join(tmp, "blocks.bin")
        with open(blocks, "wb") as f:
            for parts in trace.blocks:
                b = parts[0]
                f.write(_BLK.pack(b.pc, b.last, b.target, b.nlip, b.ninsn, b.kind))
        cr3f = os.path.join(tmp, "cr3.txt")
        with open(cr3f, "w") as f:
            for pid, v in cr3.items():
                f.write(f"{pid} {v}\n")
        out = os.path.join(tmp, "out")
        os.mkdir(out)
        r = subprocess.run([str(exe), os.fspath(log_path), blocks, out, mode, str(num_cpus),
                            str(int(cfg.ctl)), str(cfg.cr3_match), str(tm.t0 or trace.t0),
                            str(tm.nom_freq), str(tm.cpuid_15_eax), str(tm.cpuid_15_ebx),
                            str(int(cfg.long_tnt)), cr3f, str(keep or 0)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise FastUnavailable((r.stderr.strip().splitlines() or ["failed"])[-1])
        streams, switches, exits = {}, [], {}
        with open(os.path.join(out, "summary.txt")) as f:
            for line in f:
                w = line.split()
                if w[0] == "stream":
                    key = (w[1], int(w[2]))
                    name = f"{w[1]}{w[2]}.pt"
                    with open(os.path.join(out, name), "rb") as g:
                        streams[key] = (g.read(), int(w[3]))
                    if generated is not None:
                        generated[key] = int(w[4])
                elif w[0] == "switch":
                    switches.append(tuple(int(x) for x in w[1:]))
                elif w[0] == "exit":
                    exits[int(w[1])] = int(w[2])
                elif w[0] == "start" and starts is not None:
                    starts[int(w[1])] = int(w[2])
                elif w[0] == "exec" and execs is not None:
                    execs.setdefault(int(w[1]), []).append(int(w[2]))
        return streams, switches, exits
