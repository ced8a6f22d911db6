"""The QEMU execution source: plugin build, log contents, and the generated
PT decoding with libipt (ptoracle) to exactly the observed instructions."""

import json
import os
import shutil
import struct
import subprocess

import pytest

from hwtrace.engines.emulated import execlog as xl, flow, ptgen, qemu

pytestmark = pytest.mark.skipif(shutil.which("qemu-x86_64") is None,
                                reason="qemu-user not installed")


def raw_args(trace):
    out = []
    for m in trace.mmaps:
        if not m.path.startswith("/") or not os.path.exists(m.path):
            continue
        size = min(m.size, os.path.getsize(m.path) - m.offset)
        out += ["--raw", f"{m.path}:{m.offset:#x}-{m.offset + size:#x}:{m.addr:#x}"]
    return out


def oracle_count(ptoracle, pt_path, args):
    r = subprocess.run([str(ptoracle), "insn", str(pt_path), *args],
                       capture_output=True, text=True, check=True)
    n, errors = 0, []
    for line in r.stdout.splitlines():
        o = json.loads(line)
        if "error" in o:
            errors.append(o)
        elif "iclass" in o:
            n += 1
    return n, errors


def test_true_log_and_decode(tmp_path, ptoracle):
    log = tmp_path / "x.log"
    assert qemu.run(qemu.resolve_program(["true"]), log) == 0
    data = log.read_bytes()
    hdr, _ = xl.parse_header(data)
    assert (hdr.source, hdr.clock) == (xl.SOURCE_QEMU, xl.CLOCK_HOST_TSC)
    recs = list(xl.parse(data))
    kinds = [type(r) for r in recs]
    assert kinds[kinds.index(xl.Ctx) + 2:kinds.index(xl.Ctx) + 4] == [xl.ProcStart, xl.ThreadStart]
    assert recs[-1] == xl.ProcExit(0)
    assert any(type(r) is xl.Mmap and r.path.endswith("/true") for r in recs)
    trace = flow.load(data)
    ctl = (1 << 13) | (1 << 3) | (1 << 10)
    for mode in ("thread", "cpu"):
        res = flow.generate(trace, ptgen.TraceConfig(ctl=ctl), mode=mode, num_cpus=os.cpu_count())
        total = 0
        for r in res:
            p = tmp_path / f"{mode}{r.key[1]}.pt"
            p.write_bytes(r.tracer.buf)
            n, errors = oracle_count(ptoracle, p, raw_args(trace))
            assert errors == []
            assert n == r.tracer.insns
            total += n
        assert total > 50_000


def test_resolve_program_errors(tmp_path):
    with pytest.raises(qemu.QemuError, match="no such program"):
        qemu.resolve_program(["/nonexistent/prog"])
    f = tmp_path / "f"
    f.write_bytes(b"\x7fELF\x01\x01" + b"\0" * 60)
    f.chmod(0o755)
    with pytest.raises(qemu.QemuError, match="not an x86-64"):
        qemu.resolve_program([str(f)])
    s = tmp_path / "s.sh"
    s.write_text("#!/bin/sh\necho hi\n")
    s.chmod(0o755)
    p = qemu.resolve_program([str(s), "a"])
    assert p.argv[-2:] == [str(s), "a"] and p.elf.endswith("sh")


FATAL = {
    # ud2 after a loop of 1001 iterations: SIGILL, a guest CPU exception
    "ill": ("""
        __attribute__((noinline)) int f(int n) { int s = 0; for (int i = 0; i < n; i++) s += i; if (n > 5) __builtin_trap(); return s; }
        int main(int argc, char **argv) { return f(1000 + argc); }
    """, 4, 1001),
    # divide by zero after a loop of 1000 iterations: SIGFPE
    "fpe": ("""
        __attribute__((noinline)) int f(int d, int n) { int s = 0; for (int i = 0; i < n; i++) s += i; return s / d; }
        int main(int argc, char **argv) { return f(argc - 1, 1000); }
    """, 8, 1000),
}


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("name", sorted(FATAL))
def test_fatal_guest_signal_keeps_every_record(tmp_path, name):
    """QEMU kills itself with the guest's uncaught signal (no exit
    callback): the log gets the thread's buffered records from its buffer
    file, up to the block that faulted, and the buffer file is gone.  That
    block is an EXEC_PART record whose count is the instructions that
    retired before the faulting one (the plugin's per-instruction count)."""
    src, sig, iters = FATAL[name]
    c = tmp_path / f"{name}.c"
    c.write_text(src)
    exe = tmp_path / name
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(c)], check=True)
    log = tmp_path / "x.log"
    assert qemu.run(qemu.resolve_program([str(exe)]), log) == -sig
    assert qemu.buffer_files(log) == []
    blocks, ran, tail = {}, [], []
    for r in xl.parse(log.read_bytes()):
        if type(r) is xl.Block:
            blocks[r.id] = r
        elif type(r) is xl.Exec:
            ran += r.ids
        tail.append(r)
    assert not [r for r in tail if type(r) in (xl.ProcExit, xl.ThreadExit)]
    loop = [i for i, b in blocks.items() if len(b.sizes) == 4 and b.code.endswith(b"\x75\xf7")]
    # the first iteration runs in the block that enters the loop
    assert len(loop) == 1 and ran.count(loop[0]) == iters - 1
    part = tail[-1]
    assert type(part) is xl.ExecPart and part.id not in ran
    last = blocks[part.id]
    if name == "ill":
        assert (last.code, part.count) == (b"\x0f\x0b", 0)   # the ud2 block, ud2 not retired
    else:
        # cltd; idiv; ret: cltd retired, idiv faulted
        assert last.code[:3] == b"\x99\xf7\xff" and last.code.endswith(b"\xc3")
        assert part.count == 1


def test_normal_exit_leaves_no_buffer_files(tmp_path):
    """At a normal exit the exit callback writes everything to the log and
    removes the buffer files: nothing for merge_buffers to add."""
    log = tmp_path / "x.log"
    assert qemu.run(qemu.resolve_program(["true"]), log) == 0
    assert qemu.buffer_files(log) == []
    data = log.read_bytes()
    assert list(xl.parse(data))[-1] == xl.ProcExit(0)
    assert qemu.merge_buffers(log) == 0
    assert log.read_bytes() == data


def _chunk(tid: int, t: int, n: int) -> bytes:
    w = xl.Writer()
    w.take()
    w.ctx(4242, tid, 0)
    w.time(t)
    w.exec(range(1, n + 1))
    return w.take()


def _buf_file(log, tid, chunk, *, flushing=0, flush_at=0, pid=None):
    """A plugin buffer file (struct shdr, then the records) holding ``chunk``."""
    pid = pid if pid is not None else 2 ** 22 + 7      # no such process
    p = log.with_name(f"{log.name}.buf.{pid}.{tid}")
    head = qemu.BUF_HEADER.pack(qemu.BUF_MAGIC, 1, len(chunk), 22, flush_at, flushing, pid, tid)
    p.write_bytes(head.ljust(qemu.BUF_DATA, b"\0") + chunk + b"\xee" * 64)
    return p


def test_merge_buffers_appends_unwritten_chunks_in_start_order(tmp_path):
    log = tmp_path / "x.log"
    base = bytes(xl.Writer())
    log.write_bytes(base)
    a, b = _chunk(7, 200, 10), _chunk(8, 100, 3)
    _buf_file(log, 7, a)
    _buf_file(log, 8, b)
    empty = _buf_file(log, 9, _chunk(9, 50, 0)[:22])    # header only: nothing
    mine = _buf_file(log, 10, _chunk(10, 10, 5), pid=os.getpid())   # still running
    assert qemu.merge_buffers(log) == len(a) + len(b)
    assert log.read_bytes() == base + b + a
    assert qemu.buffer_files(log) == [mine] and not empty.exists()
    assert qemu.merge_buffers(log) == 0


@pytest.mark.parametrize("cut", ["whole", "none", "in_header", "at_end", "mid"])
def test_merge_buffers_completes_an_interrupted_flush(tmp_path, cut):
    """flushing=1: the append of the chunk at flush_at may be whole, not
    done, or cut (a SIGKILL stops a write at a page boundary) at the end of
    the log or before what other processes appended later."""
    log = tmp_path / "x.log"
    head = bytes(xl.Writer()) + _chunk(1, 5, 1000)
    other = _chunk(2, 6, 50)
    chunk = _chunk(3, 7, 3000)
    at = len(head)
    written = {"whole": len(chunk), "none": 0, "in_header": 9, "at_end": 4096 - at % 4096,
               "mid": 2 * 4096 - at % 4096}[cut]
    after = other if cut == "mid" else b""
    log.write_bytes(head + chunk[:written] + after)
    _buf_file(log, 3, chunk, flushing=1, flush_at=at)
    qemu.merge_buffers(log)
    want = head + chunk + after
    assert log.read_bytes() == want
    assert [type(r) for r in xl.parse(want)].count(xl.Ctx) == (3 if after else 2)


THREADED_FPE = r"""
#include <pthread.h>
volatile int ready;
volatile unsigned long sink;
__attribute__((noinline)) void spin(int n) { for (int i = 0; i < n; i++) sink += i; }
static void *worker(void *arg) { (void)arg; spin(30000); ready = 1; for (;;) sink++; return 0; }
__attribute__((noinline)) int divide(int a, int b) { return a / b; }
int main(int argc, char **argv) {
  pthread_t t;
  pthread_create(&t, 0, worker, 0);
  while (!ready) sink--;
  return divide(argc, argc - 1);
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_fatal_signal_keeps_every_thread_records(tmp_path):
    """Two threads with records only in their buffers (no system call since
    the clone) when the main thread's divide error kills QEMU: both buffer
    files are merged, each a chunk of its own thread, in the order they
    began, and the worker's whole spin loop is there."""
    c = tmp_path / "t.c"
    c.write_text(THREADED_FPE)
    exe = tmp_path / "t"
    subprocess.run(["gcc", "-O1", "-no-pie", "-pthread", "-o", str(exe), str(c)], check=True)
    log = tmp_path / "x.log"
    assert qemu.run(qemu.resolve_program([str(exe)]), log) == -8
    assert qemu.buffer_files(log) == []
    blocks, ran, tids, times, last = {}, {}, [], [], {}
    tid = None
    for r in xl.parse(log.read_bytes()):
        if tid is not None and type(r) is not xl.Ctx:
            last[tid] = r
        if type(r) is xl.Ctx:
            tid = r.tid
            tids.append(tid)
        elif type(r) is xl.Time and tids and len(times) < len(tids):
            times.append(r.value)
        elif type(r) is xl.Block:
            blocks[r.id] = r
        elif type(r) is xl.Exec:
            ran.setdefault(tid, []).extend(r.ids)
    assert len(set(tids)) == 2
    # the merged chunks end the log, one per thread, oldest first
    assert tids[-1] != tids[-2] and times[-2] <= times[-1]
    # spin()'s loop: its back edge (the last conditional jump in it)
    # retired once per iteration, all in the worker's records
    from elftools.elf.elffile import ELFFile
    with open(exe, "rb") as f:
        (sym,) = ELFFile(f).get_section_by_name(".symtab").get_symbol_by_name("spin")
    lo, hi = sym["st_value"], sym["st_value"] + sym["st_size"]
    jumps = [int(line.split(":")[0], 16) for line in subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", f"--start-address={lo}", f"--stop-address={hi}",
         str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
        if line.startswith(" ") and ":\tj" in line and ":\tjmp" not in line]
    back = jumps[-1]

    def edges(ids):
        n = 0
        for i in ids:
            b = blocks[i]
            at = b.pc
            for size in b.sizes:
                n += at == back
                at += size
        return n
    worker = next(t for t in set(tids) if t != tids[0])
    assert edges(ran[worker]) == 30000 and edges(ran[tids[0]]) == 0
    # the main thread's log ends in divide(), before its idiv (which
    # faulted): its block ran only so far
    part = last[tids[0]]
    assert type(part) is xl.ExecPart
    b = blocks[part.id]
    assert b.code[sum(b.sizes[:part.count])] == 0xF7       # idiv


def test_merge_buffers_drops_a_block_record_cut_by_the_kill(tmp_path):
    """The log ends, on a page boundary, inside a BLOCK record whose write
    a kill cut short: it is cut back to its last whole record before the
    buffered chunk is appended (else the chunk would be read as its rest)."""
    log = tmp_path / "x.log"
    w = xl.Writer()
    w.ctx(4242, 1, 0)
    w.time(1)
    w.exec(range(1, 1000))
    whole = bytes(w)
    w.block(4242, 7, 0x401000, bytes([4] * 100), b"\x90\x90\x90\x90" * 100)
    full = bytes(w)
    cut = len(whole) // 4096 * 4096 + 4096
    assert len(whole) < cut < len(full)
    log.write_bytes(full[:cut])
    chunk = _chunk(1, 2, 10)
    _buf_file(log, 1, chunk)
    assert qemu.merge_buffers(log) == len(chunk)
    assert log.read_bytes() == whole + chunk


@pytest.mark.parametrize("ids", [10, 0])
def test_merge_buffers_repairs_an_exec_count_raised_before_its_id_was_published(tmp_path, ids):
    """A kill between on_exec raising the open EXEC record's count and
    publishing the id that goes with it leaves the buffer claiming one id
    more than it holds (CI saw "truncated EXEC" from a SIGKILLed program):
    the chunk goes to the log with the ids it holds and their count (an
    EXEC record left with none is dropped, and with it here the chunk: its
    CTX and TIME alone say nothing), and the log parses."""
    log = tmp_path / "x.log"
    base = bytes(xl.Writer())
    log.write_bytes(base)
    chunk = _chunk(1, 2, ids)
    at = chunk.index(bytes([xl.T_EXEC]), 14 + 8)
    claimed = chunk[:at + 1] + struct.pack("<I", ids + 1) + chunk[at + 5:]
    _buf_file(log, 1, claimed)
    want = chunk if ids else b""
    assert qemu.merge_buffers(log) == len(want)
    assert log.read_bytes() == base + want
    recs = list(xl.parse(base + want))
    assert sum(len(r.ids) for r in recs if type(r) is xl.Exec) == ids


def test_snapshot_buffers_of_a_running_program(tmp_path):
    """While QEMU runs, a copy of its log plus what its buffer files hold
    so far (the records that sit only there) parses whole; the files are
    left for QEMU."""
    import time
    log = tmp_path / "x.log"
    proc = qemu.spawn(qemu.command(qemu.resolve_program(["sh", "-c", "read x"]), log),
                      stdin=subprocess.PIPE)
    try:
        end = time.monotonic() + 60
        while not qemu.buffer_files(log) and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(1.0)     # the shell is waiting in read(): its records are buffered
        files = qemu.buffer_files(log)
        copy = tmp_path / "copy.log"
        copy.write_bytes(log.read_bytes())
        added = qemu.snapshot_buffers(log, copy)
        assert added > 0 and qemu.buffer_files(log) == files
        recs = list(xl.parse(copy.read_bytes()))
        assert recs[-2:] == [xl.Syscall(0), recs[-1]] and type(recs[-1]) is xl.Time  # in read()
    finally:
        proc.communicate(b"\n", timeout=60)
    assert proc.returncode == 0 and qemu.buffer_files(log) == []


# The plugin's instruction classifier (qemu_plugin_insn.c) on its own,
# reading "ADDR HEXBYTES..." lines.
_CLASSIFIER_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "qemu_plugin_insn.h"
int main(void) {
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        uint8_t b[16]; size_t n = 0; int k; char *p = line;
        unsigned long long pc = strtoull(p, &p, 16);
        while (n < 16 && sscanf(p, " %2hhx%n", &b[n], &k) == 1) { n++; p += k; }
        uint64_t target;
        int f = insn_info(b, n, pc, &target);
        printf("%d %llx\n", f, (unsigned long long)target);
    }
    return 0;
}
"""

_PREFIXES = ("cs ", "ds ", "ss ", "es ", "data16 ", "addr32 ", "rex.W ", "rex.WB ", "rex.B ", "rex ",
             "bnd ", "notrack ")
#: instructions that access memory without a memory operand in objdump's
#: text, or raise an exception with register operands (integer divide, x87)
_IMPLICIT = ("push", "pop", "call", "ret", "leave", "enter", "xlat", "div", "idiv", "int", "int3",
             "ud", "hlt", "in", "out", "ins", "outs", "cli", "sti", "syscall", "iret", "lret",
             "lcall", "ljmp", "lock", "xsave", "xrstor", "fxsave", "fxrstor", "(bad)")


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("objdump") is None,
                    reason="needs gcc and objdump")
def test_fault_classifier_is_conservative(tmp_path):
    """Every instruction of libc that accesses memory (objdump
    shows a memory operand, or it is one of the implicit-access kinds) or
    divides integers is one the plugin counts before (a fault can be there);
    most register-only instructions are not (no callback).  Direct branches
    get their targets."""
    import re
    drv = tmp_path / "drv.c"
    drv.write_text(_CLASSIFIER_DRIVER)
    exe = tmp_path / "drv"
    src = qemu.PLUGIN_SOURCE.with_name("qemu_plugin_insn.c")
    subprocess.run(["gcc", "-O1", "-Wall", "-I", str(src.parent), "-o", str(exe), str(drv),
                    str(src)], check=True)
    line = re.compile(r"^\s*([0-9a-f]+):\t((?:[0-9a-f]{2} )+)\s*\t?(.*)$")
    libc = subprocess.run(["gcc", "-print-file-name=libc.so.6"], capture_output=True,
                          text=True).stdout.strip()
    for lib in (os.path.realpath(libc),):
        dump = subprocess.run(["objdump", "-d", "-w", "--insn-width=16", lib],
                              capture_output=True, text=True, check=True).stdout
        rows = [m.groups() for m in map(line.match, dump.splitlines()) if m]
        out = subprocess.run([str(exe)], input="".join(f"{a} {b}\n" for a, b, _ in rows),
                             capture_output=True, text=True, check=True).stdout.split("\n")
        missed, safe = [], 0
        for (addr, raw, text), res in zip(rows, out):
            flags, target = res.split()
            t = text
            while t.startswith(_PREFIXES):
                t = t[next(len(p) for p in _PREFIXES if t.startswith(p)):]
            mn = t.split(" ")[0]
            memory = "(" in t and not mn.startswith(("lea", "nop", "prefetch"))
            implicit = mn in _IMPLICIT or mn.startswith(
                ("push", "pop", "call", "ret", "iret", "xsave", "xrstor", "fxsave", "fxrstor",
                 "idiv", "div", "ud")) or (mn.startswith("f") and not mn.startswith("fs"))
            if mn.startswith(("divs", "divp", "vdiv")):
                implicit = False        # SSE/AVX divide: #XM only when unmasked
            if (memory or implicit) and not int(flags) & 1:
                missed.append((addr, raw, text))
            safe += not int(flags) & 1
            if re.match(r"(j[a-z]+|call|loop[a-z]*|jrcxz) +[0-9a-f]+ <", t) and "*" not in t:
                assert int(target, 16) == int(t.split()[1], 16), (addr, raw, text)
        assert missed == [], missed[:20]
        assert safe > len(rows) // 2, (lib, safe, len(rows))
