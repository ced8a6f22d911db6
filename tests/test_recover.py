"""Buffers outlive the collector: another process reads them while tracing
runs, a SIGKILLed collector loses nothing, and `hwtrace recover` turns the
trace directory into a bundle whose streams decode (ptoracle)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, run_hwtrace
from hwtrace.bundle import Bundle, Process
from hwtrace.control.recover import RecoverError, write_bundle

PSB = b"\x02\x82" * 8
PSBEND = b"\x02\x23"
TSC = b"\x19" + bytes(range(1, 8))
SEG = PSB + PSBEND + TSC + b"\x00" * 900        # valid packets, 926 bytes

CHILD = textwrap.dedent("""
    import os, signal, sys
    import hwtrace
    from hwtrace.bundle import Process
    from hwtrace.engines.testing import TestEngine
    SEG = bytes.fromhex(sys.argv[3])
    class Crashing(TestEngine):
        def run(self, session, argv, **kw):
            session.sideband.add(Process(pid=42, cr3=0x7000, comm="victim"))
            for cpu in range(2):
                out = session.cpu_output(cpu)
                for _ in range(int(argv[0])):
                    out.write(SEG)
                out.add_instructions(1000 + cpu)
            print("ready", flush=True)
            sys.stdin.readline()
            os.kill(os.getpid(), signal.SIGKILL)
    dev = hwtrace.open_device(engine=Crashing(), directory=sys.argv[1], lock_path=sys.argv[2])
    cfg = hwtrace.BufferConfig(num_chunks=3, chunk_order=0, is_circular=sys.argv[5] == "c")
    for _ in range(dev.num_cpus):
        dev.alloc_buffer(cfg)
    dev.cpu_mode_alloc()
    dev.cpu_mode_start()
    dev.run([sys.argv[4]])
""")


def _collector(tmp_path, nseg, circular):
    trace = tmp_path / "trace"
    return trace, subprocess.Popen(
        [sys.executable, "-c", CHILD, str(trace), str(tmp_path / "lock"), SEG.hex(),
         str(nseg), "c" if circular else "s"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)


def _pkt_errors(ptoracle, path):
    r = subprocess.run([str(ptoracle), "pkt", str(path), "--no-sync"],
                       capture_output=True, text=True, check=True)
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    return [x for x in lines if "error" in x], lines


def test_read_while_tracing_then_recover_after_sigkill(tmp_path, ptoracle):
    trace, child = _collector(tmp_path, 5, circular=False)
    try:
        assert child.stdout.readline().strip() == "ready"
        # another process reads the buffers while the collector is tracing
        r = run_hwtrace("recover", trace, "-o", tmp_path / "live")
        assert r.returncode == 0, r.stderr
        live = Bundle(tmp_path / "live")
        assert live.read_stream(live.stream(cpu=1)) == SEG * 5
        # the lock is still held by the live collector
        lock = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            import hwtrace
            from hwtrace.engines.testing import TestEngine
            try:
                hwtrace.open_device(engine=TestEngine(), lock_path={str(tmp_path / 'lock')!r})
            except hwtrace.TraceError as e:
                print(e.status)
            """)], capture_output=True, text=True)
        assert lock.stdout.strip() == "ALREADY_BOUND"
        child.stdin.write("go\n")
        child.stdin.flush()
    finally:
        child.wait(timeout=60)
    assert child.returncode == -9
    r = run_hwtrace("recover", trace)
    assert r.returncode == 0, r.stderr
    assert "recovered 2 stream(s)" in r.stdout
    b = Bundle(trace)
    for cpu in (0, 1):
        s = b.stream(cpu=cpu)
        assert b.read_stream(s) == SEG * 5
        assert (s.instructions_observed, s.stopped, s.wrapped) == (1000 + cpu, False, False)
        errors, pkts = _pkt_errors(ptoracle, trace / s.file)
        assert errors == [] and pkts[0]["type"] == "psb" and len(pkts) == 5 * 903
    assert b.sideband().processes == [Process(pid=42, cr3=0x7000, comm="victim")]
    assert b.engine == "testing" and b.config.num_chunks == 3
    # a second recover refuses to overwrite, --force replaces
    r = run_hwtrace("recover", trace)
    assert r.returncode == 2 and "--force" in r.stderr and len(r.stderr.splitlines()) == 1
    assert run_hwtrace("recover", trace, "--force").returncode == 0


@pytest.mark.parametrize("circular", [False, True])
def test_recovered_full_buffers_decode(tmp_path, ptoracle, circular):
    trace, child = _collector(tmp_path, 20, circular)     # 18520 bytes into 12288
    try:
        assert child.stdout.readline().strip() == "ready"
        child.stdin.write("go\n")
        child.stdin.flush()
    finally:
        child.wait(timeout=60)
    write_bundle(trace, tmp_path / "b")
    b = Bundle(tmp_path / "b")
    s = b.stream(cpu=0)
    data = b.read_stream(s)
    stream = SEG * 20
    if circular:
        assert s.wrapped and not s.stopped and s.capture_end == len(stream) % 12288
        assert data.startswith(PSB) and stream.endswith(data) and len(data) > 12288 - len(SEG)
    else:
        assert s.stopped and not s.wrapped and s.capture_end == 12288
        assert data == stream[:12288] and s.lost_bytes == len(stream) - 12288
    errors, pkts = _pkt_errors(ptoracle, tmp_path / "b" / s.file)
    # (the stop-on-full cut, 12288 % 926 = 250, falls among one-byte PADs)
    assert errors == [] and pkts[0]["type"] == "psb"


def test_recover_bad_directories(tmp_path):
    r = run_hwtrace("recover", tmp_path / "nope")
    assert r.returncode == 2 and "no such directory" in r.stderr
    r = run_hwtrace("recover", tmp_path)
    assert r.returncode == 2 and "not a trace directory" in r.stderr
    (tmp_path / "device.json").write_text("[1]")
    with pytest.raises(RecoverError):
        write_bundle(tmp_path, tmp_path / "o")
    (tmp_path / "device.json").write_text('{"capabilities": {"mtc": 3}}')
    r = run_hwtrace("recover", tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr


def test_recover_skips_damaged_buffers(tmp_path):
    import hwtrace
    from hwtrace.engines.testing import TestEngine
    with hwtrace.open_device(engine=TestEngine({0: [SEG], 1: [SEG]}), directory=tmp_path / "t",
                             lock_path=tmp_path / "l") as dev:
        for _ in range(2):
            dev.alloc_buffer(hwtrace.BufferConfig(num_chunks=1))
        dev.cpu_mode_alloc()
        dev.cpu_mode_start()
        dev.run(["p"])
        dev.cpu_mode_stop()
    # damage: truncated data, hostile config, a symlinked buffer dir
    (tmp_path / "t" / "buf-0" / "data").write_bytes(b"short")
    (tmp_path / "t" / "buf-7").symlink_to(tmp_path / "t" / "buf-1")
    write_bundle(tmp_path / "t", tmp_path / "b")
    b = Bundle(tmp_path / "b")
    assert [s.cpu for s in b.streams] == [1] and b.read_stream(b.streams[0]) == SEG
    cfg = json.loads((tmp_path / "t" / "buf-1" / "config.json").read_text())
    cfg["config"]["num_chunks"] = 10 ** 9
    (tmp_path / "t" / "buf-1" / "config.json").write_text(json.dumps(cfg))
    write_bundle(tmp_path / "t", tmp_path / "c")
    assert Bundle(tmp_path / "c").streams == ()
