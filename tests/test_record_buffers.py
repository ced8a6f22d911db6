"""Small buffers: stop-on-full keeps a prefix of the trace (Stopped), a
circular buffer a suffix that starts at a PSB (wrapped) -- checked by
decoding with libipt against the full trace of the same execution (one
QEMU log replayed through the device three times)."""

import json
import shutil
import subprocess

import pytest

from conftest import run_hwtrace
from hwtrace.control.config import BufferConfig
from hwtrace.control.ctl import Ctl, Mode
from hwtrace.control.device import open_device
from hwtrace.engines.emulated import qemu
from hwtrace.engines.emulated.engine import EmulatedEngine

pytestmark = pytest.mark.skipif(shutil.which("qemu-x86_64") is None or shutil.which("gcc") is None,
                                reason="needs qemu-user and gcc")

PROG = r"""
#include <stdio.h>
__attribute__((noinline)) int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
int main(void) { printf("%d\n", fib(21)); return 0; }
"""


class ReplayEngine(EmulatedEngine):
    """The emulated engine over an execution log recorded earlier."""

    def __init__(self, log):
        super().__init__(source="qemu")
        self._log = log

    def _execute(self, argv, log, env, cwd):
        shutil.copyfile(self._log, log)
        return 0


def decode(ptoracle, bundle):
    man = json.loads((bundle / "manifest.json").read_text())
    (s,) = man["streams"]
    images = run_hwtrace("images", bundle, "--pt", s["file"], "--lines").stdout.split()
    o = subprocess.run([str(ptoracle), "insn", str(bundle / s["file"]), *images],
                       capture_output=True, text=True, check=True).stdout
    ips = [int(x[6:x.index(",")]) for x in o.splitlines() if x.startswith('{"ip":')]
    errors = [x for x in o.splitlines() if '"error"' in x]
    return s, ips, errors


def record(log, out, cfg):
    dev = open_device(engine=ReplayEngine(log))
    try:
        dev.set_mode(Mode.THREAD)
        dev.run(["replay"], follow_threads=cfg)
        dev.save_bundle(out)
    finally:
        dev.close()


def test_stop_on_full_prefix_and_circular_suffix(tmp_path, ptoracle):
    src = tmp_path / "p.c"
    src.write_text(PROG)
    exe = tmp_path / "p"
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src)], check=True)
    log = tmp_path / "p.log"
    assert qemu.run(qemu.resolve_program([str(exe)]), log) == 0
    ctl = Ctl.BRANCH_EN | Ctl.USER | Ctl.TSC_EN
    record(log, tmp_path / "full", BufferConfig(num_chunks=16, chunk_order=4, ctl=ctl))
    full_s, full, errors = decode(ptoracle, tmp_path / "full")
    assert errors == [] and len(full) == full_s["instructions_observed"]
    assert not full_s["stopped"] and not full_s["wrapped"] and full_s["size"] > 3 * 4096

    record(log, tmp_path / "stop", BufferConfig(num_chunks=2, chunk_order=0, ctl=ctl))
    s, ips, errors = decode(ptoracle, tmp_path / "stop")
    assert s["stopped"] and not s["wrapped"] and s["size"] == 8192
    assert errors == []
    assert 0 < len(ips) < len(full) and ips == full[:len(ips)]
    assert (tmp_path / "stop" / s["file"]).read_bytes() == \
        (tmp_path / "full" / full_s["file"]).read_bytes()[:8192]

    record(log, tmp_path / "ring", BufferConfig(num_chunks=2, chunk_order=0, is_circular=True, ctl=ctl))
    s, ips, errors = decode(ptoracle, tmp_path / "ring")
    data = (tmp_path / "ring" / s["file"]).read_bytes()
    assert s["wrapped"] and not s["stopped"] and data[:16] == b"\x02\x82" * 8
    assert errors == []
    assert 0 < len(ips) < len(full) and ips == full[-len(ips):]
    assert (tmp_path / "full" / full_s["file"]).read_bytes().endswith(data)
