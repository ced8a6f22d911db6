"""Buffers outlive the collector: another process reads them while tracing
runs, a SIGKILLed collector loses nothing, and `hwtrace recover` turns the
trace directory into a bundle whose streams decode (ptoracle)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

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


# ---------------------------------------------------------------------------
# A recorder killed mid-trace: ``hwtrace record`` (emulated engines) leaves
# the execution log in -o/hwtrace-xlog-*/exec.xlog; ``hwtrace recover``
# generates the bundle from it (engines/emulated/salvage.py).

needs_emulation = pytest.mark.skipif(
    shutil.which("qemu-x86_64") is None or shutil.which("gcc") is None,
    reason="needs qemu-user and gcc")

# No libc: a short, fully deterministic instruction sequence (a loop with
# calls and system calls: several chunks of records), so every prefix of
# its log can be checked. It exits with status 95.
TINY = r"""
static long sys3(long n, long a, long b, long c) { long r;
  __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
  return r; }
__attribute__((noinline)) int f(int x) { return x % 3 ? x * 3 + 1 : x / 2; }
void _start(void) {
  volatile int s = 0;
  for (int i = 0; i < 30; i++) { s += f(i); if (i % 5 == 4) s += sys3(39, 0, 0, 0) > 0; }
  sys3(1, 1, (long)"hi\n", 3);
  sys3(60, s & 0x7f, 0, 0);
  for (;;) ;
}
"""

# Two threads and main call fib() every 50 ms until killed; main writes
# its pid once both threads run.
SLEEPER = r"""
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((noinline)) int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
static void *work(void *a) { for (;;) { volatile int r = fib(8 + (int)(long)a); usleep(50000); } return 0; }
int main(int argc, char **argv) {
  pthread_t t[2];
  for (long i = 0; i < 2; i++) pthread_create(&t[i], 0, work, (void *)i);
  FILE *f = fopen(argv[1], "w"); fprintf(f, "%d\n", getpid()); fclose(f);
  for (;;) { volatile int r = fib(10); usleep(50000); }
}
"""


@pytest.fixture(scope="module")
def cprogs(tmp_path_factory):
    d = tmp_path_factory.mktemp("salvageprogs")
    (d / "tiny.c").write_text(TINY)
    subprocess.run(["gcc", "-O1", "-static", "-nostdlib", "-fno-pie", "-no-pie",
                    "-o", str(d / "tiny"), str(d / "tiny.c")], check=True)
    (d / "sleeper.c").write_text(SLEEPER)
    subprocess.run(["gcc", "-O1", "-o", str(d / "sleeper"), str(d / "sleeper.c"), "-lpthread"],
                   check=True)
    return d


@pytest.fixture(scope="module")
def tiny_logs(cprogs, tmp_path_factory):
    """{source: bytes of a whole real execution log of ``tiny``}, written
    by each execution source the way the engine runs it."""
    from hwtrace.engines.emulated import qemu, stepper
    d = tmp_path_factory.mktemp("tinylogs")
    out = {}
    log = d / "qemu.xlog"
    proc = qemu.spawn(qemu.command(qemu.resolve_program([str(cprogs / "tiny")]), log),
                      stdout=subprocess.DEVNULL)
    assert proc.wait() == 95
    out["qemu"] = log.read_bytes()
    log = d / "ptrace.xlog"
    assert stepper.run([str(cprogs / "tiny")], str(log), stepper.Options()) == 95
    out["ptrace"] = log.read_bytes()
    return out


def _boundaries(data: bytes) -> list[int]:
    """The prefix lengths that xl.parse reads without error: the oracle for
    where records end (independent of salvage's own size table)."""
    from hwtrace.engines.emulated import execlog as xl
    ok = []
    for n in range(xl.HEADER.size, len(data) + 1):
        try:
            for _ in xl.parse(data[:n]):
                pass
        except xl.ExecLogError:
            continue
        ok.append(n)
    return ok


@needs_emulation
@pytest.mark.parametrize("source", ["qemu", "ptrace"])
def test_complete_prefix_every_byte(tiny_logs, source):
    """For every byte prefix of a real log the usable length is the last
    record end at or before it; a zero-filled or garbage tail is not read."""
    from hwtrace.engines.emulated import execlog as xl
    from hwtrace.engines.emulated.salvage import complete_prefix
    data = tiny_logs[source]
    ends = _boundaries(data)
    records = list(xl.parse(data))
    assert ends[0] == xl.HEADER.size and ends[-1] == len(data) and len(ends) == len(records) + 1
    want = 0
    for n in range(len(data) + 1):
        if ends and want < len(ends) and n == ends[want]:
            want += 1
        expect = ends[want - 1] if want else 0
        assert complete_prefix(data[:n]) == expect, n
        assert complete_prefix(memoryview(data)[:n]) == expect, n
    # a file extended but never written, or bytes that are not records
    assert complete_prefix(data + bytes(4096)) == len(data)
    assert complete_prefix(data + b"\x7f" + data[32:]) == len(data)
    assert complete_prefix(b"HWXL") == 0 and complete_prefix(b"junk" * 20) == 0
    # a BLOCK whose sizes don't add up to its code length is not a record
    w = xl.Writer()
    w.block(1, 1, 0x1000, b"\x01", b"\x90")
    bad = bytearray(bytes(w))
    bad[-2] = 2     # sizes[0] = 2, nbytes = 1
    assert complete_prefix(bytes(bad)) == xl.HEADER.size


def _salvage_in_process(src_dir, out_dir, capsys):
    """``hwtrace recover SRC -o OUT`` in this process (fast enough to run
    for every record boundary of a log); returns its stdout."""
    import argparse
    from hwtrace.cli import recover
    capsys.readouterr()
    assert recover.run(argparse.Namespace(directory=str(src_dir), output=str(out_dir),
                                          force=False, copy_images=False)) == 0
    return capsys.readouterr().out


def _ips(ptoracle, bundle: Path, stream: dict, elf: Path) -> list[int]:
    """Decoded instruction addresses (ptoracle), asserting no errors and
    exactly instructions_observed of them."""
    o = subprocess.run([str(ptoracle), "insn", str(bundle / stream["file"]), "--elf", str(elf)],
                       capture_output=True, text=True, check=True)
    ips, other = [], []
    for line in o.stdout.splitlines():
        if line.startswith('{"ip":'):
            ips.append(int(line[6:line.index(",")]))
        else:
            other.append(json.loads(line))
    assert [x for x in other if "error" in x] == []
    assert len(ips) == stream["instructions_observed"]
    return ips


@needs_emulation
@pytest.mark.parametrize("source", ["qemu", "ptrace"])
def test_every_prefix_of_a_log_decodes_to_a_prefix(tmp_path, tiny_logs, cprogs, ptoracle,
                                                   capsys, source):
    """A log cut at any byte (its last record cut short where the cut is not
    at a record end) recovers into a bundle whose stream decodes (libipt)
    with zero errors to a prefix of the whole run's instructions; the whole
    log gives exactly what ``hwtrace record`` gives for the same program."""
    from hwtrace.cli.record import parse_config
    data = tiny_logs[source]
    ends = _boundaries(data)
    ctl, _, _ = parse_config("branch;user;tsc;retc")
    meta = {"format": "hwtrace-recording", "version": 1, "mode": "thread", "num_cpus": 2,
            "config": {"num_chunks": 4, "chunk_order": 0, "is_circular": False, "ctl": ctl,
                       "cr3_match": 0, "addr_ranges": []}}
    rec = tmp_path / "rec"
    r = run_hwtrace("record", "--engine", source, "--mode", "thread", "--num-chunks", "4",
                    "--chunk-order", "0", "--config", "branch;user;tsc;retc", "-o", rec,
                    "--", cprogs / "tiny")
    assert r.returncode == 95, r.stderr
    (s,) = json.loads((rec / "manifest.json").read_text())["streams"]
    full = _ips(ptoracle, rec, s, cprogs / "tiny")
    assert len(full) > 150
    # cut each record short by one byte (the longest cut-off record), and keep
    # the whole log; every other cut gives the same bytes as one of these
    cuts = [b - 1 for b in ends[1:]] + [len(data)]
    got = []
    for i, cut in enumerate(cuts):
        d = tmp_path / f"d{i}"
        (d / "hwtrace-xlog-x").mkdir(parents=True)
        (d / "hwtrace-xlog-x" / "exec.xlog").write_bytes(data[:cut])
        (d / "hwtrace-xlog-x" / "recording.json").write_text(json.dumps(meta))
        out = _salvage_in_process(d, tmp_path / f"o{i}", capsys)
        used = max(b for b in ends if b <= cut)
        man = json.loads((tmp_path / f"o{i}" / "manifest.json").read_text())
        assert man["recovered"] == {"from": "execution log", "log": "../d%d/hwtrace-xlog-x/exec.xlog" % i,
                                    "source": source, "log_bytes": cut, "used_bytes": used,
                                    "dropped_bytes": cut - used, "settings": "recorded",
                                    "unended_blocks_cut": man["recovered"]["unended_blocks_cut"]}
        assert (f"{cut - used} byte(s) of a cut-off record dropped" in out) == (cut != used)
        assert man["mode"] == "thread"
        if man["streams"]:      # (no thread yet: no buffer, no config)
            assert man["config"]["num_chunks"] == 4
        ips = []
        for st in man["streams"]:
            ips += _ips(ptoracle, tmp_path / f"o{i}", st, cprogs / "tiny")
        assert len(man["streams"]) <= 1
        assert ips == full[:len(ips)], cut
        got.append(len(ips))
    assert got == sorted(got) and got[-1] == len(full)
    assert len(set(got)) >= 8          # the prefixes really are partial runs


@needs_emulation
@pytest.mark.parametrize("source", ["qemu", "ptrace"])
def test_a_run_killed_inside_its_last_exec_decodes_to_a_prefix(tmp_path, tiny_logs, cprogs,
                                                               ptoracle, capsys, source):
    """A killed program's log ends inside a run of blocks (the plugin's
    buffer files keep every record up to the kill): for each EXEC record,
    the log cut after each distinct last block of it recovers into a
    stream that decodes (libipt, zero errors, exactly the instructions
    observed) to a prefix of the whole run. A last block ending in a branch
    is cut before it (the generator can't end a stream right after one),
    and only then."""
    import struct
    from hwtrace.engines.emulated import execlog as xl
    from hwtrace.engines.emulated.flow import split_block
    from hwtrace.engines.emulated.ptgen import K_OTHER, K_REP, K_TRAP
    from hwtrace.engines.emulated.salvage import record_size
    data = tiny_logs[source]
    meta = {"format": "hwtrace-recording", "version": 1, "mode": "thread", "num_cpus": 2,
            "config": {"num_chunks": 4, "chunk_order": 0, "ctl": 0x2408}}
    whole = tmp_path / "whole"
    (whole / "hwtrace-xlog-x").mkdir(parents=True)
    (whole / "hwtrace-xlog-x" / "exec.xlog").write_bytes(data)
    (whole / "hwtrace-xlog-x" / "recording.json").write_text(json.dumps(meta))
    _salvage_in_process(whole, tmp_path / "whole-b", capsys)
    (s,) = json.loads((tmp_path / "whole-b" / "manifest.json").read_text())["streams"]
    full = _ips(ptoracle, tmp_path / "whole-b", s, cprogs / "tiny")
    blocks = {r.id: r for r in xl.parse(data) if type(r) is xl.Block}
    cases = []
    off = xl.HEADER.size
    while off < len(data):
        n = record_size(data, off)
        if data[off] == xl.T_EXEC:
            (count,) = struct.unpack_from("<I", data, off + 1)
            ids = struct.unpack_from(f"<{count}I", data, off + 5)
            seen = set()
            for k in range(1, count + 1):
                if ids[k - 1] not in seen:
                    seen.add(ids[k - 1])
                    cases.append((off, ids[:k]))
        off += n
    assert len(cases) >= 10
    got, trimmed = [], 0
    for i, (off, ids) in enumerate(cases):
        d = tmp_path / f"d{i}"
        (d / "hwtrace-xlog-x").mkdir(parents=True)
        log = data[:off] + bytes([xl.T_EXEC]) + struct.pack(f"<I{len(ids)}I", len(ids), *ids)
        (d / "hwtrace-xlog-x" / "exec.xlog").write_bytes(log)
        (d / "hwtrace-xlog-x" / "recording.json").write_text(json.dumps(meta))
        _salvage_in_process(d, tmp_path / f"o{i}", capsys)
        man = json.loads((tmp_path / f"o{i}" / "manifest.json").read_text())
        # cut only where the last block ends in a branch
        b = blocks[ids[-1]]
        ends_branch = split_block(b.pc, b.sizes, b.code, last_only=source == "qemu")[-1].kind \
            not in (K_OTHER, K_REP, K_TRAP)
        cut = man["recovered"]["unended_blocks_cut"]
        assert (cut > 0) == ends_branch, (i, cut)
        trimmed += cut > 0
        ips = []
        for st in man["streams"]:
            ips += _ips(ptoracle, tmp_path / f"o{i}", st, cprogs / "tiny")
        assert ips == full[:len(ips)], i
        got.append(len(ips))
    assert trimmed >= 2 and len(set(got)) >= 10


@needs_emulation
def test_recover_a_directory_without_a_usable_log(tmp_path, tiny_logs):
    r = run_hwtrace("recover", tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "not a trace directory" in r.stderr and "no execution log" in r.stderr
    # a log dir without the log, a symlinked log: not logs
    (tmp_path / "hwtrace-xlog-a").mkdir()
    (tmp_path / "hwtrace-xlog-b").mkdir()
    (tmp_path / "hwtrace-xlog-b" / "exec.xlog").symlink_to(tmp_path / "elsewhere.xlog")
    (tmp_path / "elsewhere.xlog").write_bytes(tiny_logs["qemu"])
    r = run_hwtrace("recover", tmp_path)
    assert r.returncode == 2 and "no execution log" in r.stderr
    # an empty log (the recorder died before the program started)
    (tmp_path / "hwtrace-xlog-a" / "exec.xlog").write_bytes(b"")
    r = run_hwtrace("recover", tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "not an execution log (no complete header)" in r.stderr
    assert not (tmp_path / "manifest.json").exists()


@needs_emulation
def test_recover_uses_the_newest_log_and_defaults(tmp_path, tiny_logs):
    """Two logs: the newest is used, the other named. No recording.json (or
    a junk one): hwtrace record's defaults (cpu mode, 64 MiB buffers)."""
    old = tmp_path / "hwtrace-xlog-old" / "exec.xlog"
    new = tmp_path / "hwtrace-xlog-new" / "exec.xlog"
    for p, data in ((old, tiny_logs["ptrace"]), (new, tiny_logs["qemu"])):
        p.parent.mkdir()
        p.write_bytes(data)
    os.utime(old, (1_000_000, 1_000_000))
    (new.parent / "recording.json").write_text('{"format": "hwtrace-recording", "mode": 3}')
    r = run_hwtrace("recover", tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"older execution log not used: {old}" in r.stdout
    assert "default settings used" in r.stdout
    b = Bundle(tmp_path)
    assert b.mode == "cpu" and b.config.num_chunks == 64 and b.config.chunk_order == 8
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["recovered"]["source"] == "qemu" and man["recovered"]["settings"] == "defaults"
    assert man["recovered"]["log"] == "hwtrace-xlog-new/exec.xlog"
    assert man["engine_info"] == {"source": "qemu"}
    # refuses to write through a planted link
    (tmp_path / "manifest.json.tmp").symlink_to(tmp_path / "victim")
    r = run_hwtrace("recover", tmp_path, "--force")
    assert r.returncode == 2 and "symbolic link" in r.stderr and not (tmp_path / "victim").exists()
    assert (tmp_path / "manifest.json").is_file()      # the old bundle is kept


def _wait_pid(p: Path, proc, timeout=120) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if p.exists() and p.read_text().endswith("\n"):
            return int(p.read_text())
        assert proc.poll() is None, f"recorder ended early: {proc.returncode}"
        time.sleep(0.05)
    raise AssertionError("the traced program never started")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@needs_emulation
@pytest.mark.parametrize("engine,mode", [("qemu", "thread"), ("ptrace", "cpu")])
def test_recorder_killed_then_recovered(tmp_path, cprogs, ptoracle, engine, mode):
    """hwtrace record is SIGKILLed mid-trace: recover (in place) makes the
    bundle with the recorder's settings; it decodes with libipt and with
    ``hwtrace decode`` to exactly the instructions observed, ``hwtrace
    summary`` shows the loop's function; recovering again is refused,
    --force gives the same streams. While the recorder runs, recovering in
    place is refused and -o gives a snapshot."""
    from test_record import decode_bundle
    b = tmp_path / "b"
    pidf = tmp_path / "pid"
    rec = subprocess.Popen([sys.executable, "-m", "hwtrace", "record", "--engine", engine,
                            "--mode", mode, "--buffer-size", "1M", "--config",
                            "branch;user;tsc;noretc", "-o", str(b), "--",
                            str(cprogs / "sleeper"), str(pidf)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    pid = None
    try:
        pid = _wait_pid(pidf, rec)
        time.sleep(0.5)
        live = run_hwtrace("recover", b)
        snap = run_hwtrace("recover", b, "-o", tmp_path / "snap")
        rec.kill()
        rec.wait()
        end = time.monotonic() + 10
        while _running(pid) and time.monotonic() < end:
            time.sleep(0.05)
        assert not _running(pid), "the traced program outlived its recorder"
    finally:
        if pid is not None and _running(pid):
            os.kill(pid, signal.SIGKILL)
        if rec.poll() is None:
            rec.kill()
            rec.wait()
    assert live.returncode == 2 and live.stderr.count("\n") == 1
    assert f"its recorder (pid {rec.pid}) is still running" in live.stderr
    assert snap.returncode == 0, snap.stderr
    assert "is still running: a snapshot" in snap.stdout
    assert not (b / "manifest.json").exists()
    decode_bundle(ptoracle, tmp_path / "snap")

    r = run_hwtrace("recover", b)
    assert r.returncode == 0, r.stderr
    assert "recovered" in r.stdout and "default settings" not in r.stdout
    man, res = decode_bundle(ptoracle, b)
    assert man["recovered"]["settings"] == "recorded"
    assert man["recovered"]["source"] == engine
    assert man["mode"] == mode and man["engine_info"] == {"source": engine}
    assert man["config"]["num_chunks"] << (12 + man["config"]["chunk_order"]) == 1 << 20
    assert man["config"]["ctl"] & (1 << 11)                  # noretc: DisRETC
    total = sum(v[0]["instructions_observed"] for v in res.values())
    snap_total = sum(s["instructions_observed"] for s in
                     json.loads((tmp_path / "snap" / "manifest.json").read_text())["streams"])
    # (a snapshot has what the log held then: QEMU's plugin keeps a thread's
    # newest records in its buffer file until it fills or the thread ends)
    assert total >= snap_total and total > 20_000
    streams = [s for s in man["streams"] if s["instructions_observed"]]
    if mode == "thread":
        files = [s["file"] for s in man["streams"]]
        assert f"tid{pid}.pt" in files and len(files) == 3
    # hwtrace's own decoder agrees, stream by stream
    d = run_hwtrace("decode", b, "--stat", "--quiet")
    assert d.returncode == 0, d.stderr
    counts = dict(re.findall(r"\[stream (\S+)\]\ninsn: (\d+)\.", d.stdout))
    assert {k: int(v) for k, v in counts.items()} == \
        {s["file"]: s["instructions_observed"] for s in man["streams"]}
    # how it ended, as far as is known: the command recorded (it was the
    # log's path), and not "the program exited with status 0" (the replay's)
    info = run_hwtrace("info", b, check=True).stdout
    assert f"command:    {cprogs / 'sleeper'} {pidf}\n" in info, info
    assert "ended:      its recorder ended before writing the bundle: made by hwtrace " \
        "recover from what it had logged\n" in info, info
    assert man["recording"]["status"] is None
    assert "ended:      its recorder still running: the trace so far, made by hwtrace " \
        "recover\n" in run_hwtrace("info", tmp_path / "snap", check=True).stdout
    sm = run_hwtrace("summary", b)
    assert sm.returncode == 0, sm.stderr
    assert re.search(r"^fib\s+[\d,]+\s", sm.stdout, re.M), sm.stdout
    assert f"{total:,} instructions" in sm.stdout
    # again: refused; --force: the same streams
    r = run_hwtrace("recover", b)
    assert r.returncode == 2 and "--force" in r.stderr
    before = {s["file"]: (b / s["file"]).read_bytes() for s in streams}
    r = run_hwtrace("recover", b, "--force")
    assert r.returncode == 0, r.stderr
    assert {f: (b / f).read_bytes() for f in before} == before


def test_read_settings_believes_only_sane_files(tmp_path):
    """recording.json is taken as written only when every field makes
    sense; otherwise hwtrace record's defaults (never an exception)."""
    from hwtrace.engines.emulated.salvage import Settings, read_settings
    log = tmp_path / "exec.xlog"
    meta = tmp_path / "recording.json"
    good = {"format": "hwtrace-recording", "version": 1, "mode": "thread", "num_cpus": 2,
            "config": {"num_chunks": 2, "chunk_order": 1, "ctl": 0x2408},
            "elf_ranges": {"1": ["/bin/true", 16, 32]}, "exe": "/bin/true",
            "recorder": {"pid": 1, "start": 5}}
    assert read_settings(log) == Settings()
    meta.write_text(json.dumps(good))
    st = read_settings(log)
    assert (st.recorded, st.mode, st.num_cpus, st.elf_ranges, st.exe, st.recorder) == \
        (True, "thread", 2, {1: ("/bin/true", 16, 32)}, "/bin/true", {"pid": 1, "start": 5})
    bad = [{"mode": "both"}, {"num_cpus": 0}, {"num_cpus": True}, {"num_cpus": 10 ** 6},
           {"config": [1]}, {"config": {"num_chunks": 0}},
           {"config": {"num_chunks": 1 << 20, "chunk_order": 8}},
           {"elf_ranges": {"9": ["/x", 1, 2]}}, {"elf_ranges": {"0": ["/x", "a", 2]}},
           {"elf_ranges": [1]}, {"format": "other"}]
    for change in bad:
        meta.write_text(json.dumps({**good, **change}))
        assert read_settings(log) == Settings(), change
    for junk in ("[1]", "{", "null", "x" * 70000):
        meta.write_text(junk)
        assert read_settings(log) == Settings()
    meta.unlink()
    meta.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps(good))
    assert read_settings(log) == Settings()


def test_a_killed_threads_empty_last_chunk_is_left_out():
    """A chunk the source began for a thread and never wrote into (CTX and
    TIME only) is dropped when it is that thread's last; an empty chunk
    followed by more of the thread, or one holding anything else, stays."""
    from hwtrace.engines.emulated import execlog as xl
    from hwtrace.engines.emulated.salvage import unended_transfers
    w = xl.Writer()
    w.block(1, 1, 0x1000, b"\x01", b"\x90")
    w.ctx(1, 1, 0)
    w.time(5)
    w.proc_start(0)
    w.thread_start(0)
    w.exec([1])
    w.ctx(1, 2, 1)                      # thread 2: empty, but goes on later
    w.time(6)
    w.ctx(1, 2, 1)
    w.thread_start(1)
    w.exec([1])
    start = len(bytes(w))
    w.ctx(1, 1, 0)                      # thread 1's last chunk: empty
    w.time(7)
    w.time(8)
    stop = len(bytes(w))
    w.ctx(1, 2, 1)                      # thread 2's last chunk: a MUNMAP in it
    w.munmap(1, 0x5000, 0x1000)
    data = bytes(w)
    edits = unended_transfers(data, xl.HEADER.size, len(data), False)
    assert edits == [(start, stop - start, b"", 0)] and stop - start == 13 + 9 + 9


API_COLLECTOR = textwrap.dedent("""
    import sys
    import hwtrace
    engine, mode, directory, prog, pidf = sys.argv[1:]
    dev = hwtrace.open_device(engine=engine, directory=directory)
    cfg = hwtrace.BufferConfig(num_chunks=16, chunk_order=4,
                               ctl=hwtrace.Ctl.BRANCH_EN | hwtrace.Ctl.USER | hwtrace.Ctl.TSC_EN)
    if mode == "cpu":
        dev.set_mode(hwtrace.Mode.CPU)
        for _ in range(dev.num_cpus):
            dev.alloc_buffer(cfg)
        dev.cpu_mode_alloc()
        dev.cpu_mode_start()
        dev.run([prog, pidf])
    else:
        dev.set_mode(hwtrace.Mode.THREAD)
        dev.run([prog, pidf], follow_threads=cfg)
""")


@needs_emulation
@pytest.mark.parametrize("engine,mode", [("qemu", "cpu"), ("qemu", "thread"), ("ptrace", "thread")])
def test_python_api_collector_killed_then_recovered(tmp_path, cprogs, ptoracle, engine, mode):
    """A collector using the Python API (an emulated engine, a trace
    directory of its choice) is SIGKILLed mid-run: the engine's execution
    log is in the trace directory, with the device's settings, and
    ``hwtrace recover`` makes the streams from it -- not empty ones -- that
    libipt decodes to exactly the instructions observed."""
    from test_record import decode_bundle
    trace, pidf = tmp_path / "trace", tmp_path / "pid"
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmpdir")}
    (tmp_path / "tmpdir").mkdir()
    col = subprocess.Popen([sys.executable, "-c", API_COLLECTOR, engine, mode, str(trace),
                            str(cprogs / "sleeper"), str(pidf)], cwd=REPO, env=env)
    pid = None
    try:
        pid = _wait_pid(pidf, col)
        col.kill()
        col.wait()
        end = time.monotonic() + 10
        while _running(pid) and time.monotonic() < end:
            time.sleep(0.05)
        assert not _running(pid), "the traced program outlived its collector"
    finally:
        if pid is not None and _running(pid):
            os.kill(pid, signal.SIGKILL)
        if col.poll() is None:
            col.kill()
            col.wait()
    assert list((tmp_path / "tmpdir").iterdir()) == []
    r = run_hwtrace("recover", trace)
    assert r.returncode == 0, r.stderr
    man, res = decode_bundle(ptoracle, trace)
    assert man["mode"] == mode and man["recovered"]["settings"] == "recorded"
    assert man["config"]["num_chunks"] == 16 and man["config"]["chunk_order"] == 4
    assert sum(v[0]["instructions_observed"] for v in res.values()) > 10_000


@needs_emulation
@pytest.mark.parametrize("source", ["qemu", "ptrace"])
def test_prepare_in_place_is_the_copy(tmp_path, tiny_logs, source, monkeypatch):
    """``prepare(in_place=True)`` (the recorder's own log after a stop)
    leaves in the log itself exactly the bytes the usual copy holds --
    cut records dropped, unended last blocks cut -- with the same counts;
    past MAX_IN_PLACE bytes to rewrite it makes the copy instead."""
    import struct
    from hwtrace.engines.emulated import execlog as xl, salvage
    data = tiny_logs[source]
    logs, off = [], xl.HEADER.size
    while off < len(data):
        n = salvage.record_size(data, off)
        if data[off] == xl.T_EXEC:
            (count,) = struct.unpack_from("<I", data, off + 1)
            ids = struct.unpack_from(f"<{count}I", data, off + 5)
            for k in (1, count):
                log = data[:off] + bytes([xl.T_EXEC]) + struct.pack(f"<I{k}I", k, *ids[:k])
                logs += [log, log + data[off:off + min(n, 7) - 1]]     # + a cut record
        off += n
    assert len(logs) >= 8
    changed = 0
    for i, log in enumerate(logs):
        a, b = tmp_path / f"a{i}" / "exec.xlog", tmp_path / f"b{i}" / "exec.xlog"
        for p in (a, b):
            p.parent.mkdir()
            p.write_bytes(log)
        copy = salvage.prepare(a, tmp_path / f"ca{i}")
        here = salvage.prepare(b, tmp_path / f"cb{i}", in_place=True)
        assert here.path == b and copy.path != a
        assert b.read_bytes() == copy.path.read_bytes(), i
        assert (here.used, here.size, here.unended) == (copy.used, copy.size, copy.unended)
        changed += b.read_bytes() != log
    assert changed >= len(logs) // 2
    monkeypatch.setattr(salvage, "MAX_IN_PLACE", 0)
    c = tmp_path / "c" / "exec.xlog"
    c.parent.mkdir()
    c.write_bytes(logs[1])
    p = salvage.prepare(c, tmp_path / "cc", in_place=True)
    assert p.path != c and c.read_bytes() == logs[1]
