"""The compiled generator is byte for byte the Python generator (its twin)
on real QEMU logs, in both modes and across timing/compression configs."""

import shutil
import subprocess

import pytest

from hwtrace.engines.emulated import fast, flow, ptgen, qemu

pytestmark = pytest.mark.skipif(shutil.which("qemu-x86_64") is None or shutil.which("gcc") is None,
                                reason="needs qemu-user and gcc")

THREADS = r"""
#include <pthread.h>
#include <stdio.h>
static int f(int n) { return n < 2 ? n : f(n - 1) + f(n - 2); }
static void *work(void *a) { volatile long s = 0; for (long i = 0; i < 3000; i++) s += f(i % 9); return 0; }
int main(void) { pthread_t t[3]; for (long i = 0; i < 3; i++) pthread_create(&t[i], 0, work, 0);
  for (int i = 0; i < 3; i++) pthread_join(t[i], 0); return 0; }
"""

CONFIGS = [
    (1 << 13) | (1 << 3) | (1 << 10),                                   # branch;user;retc;tsc
    (1 << 13) | (1 << 3) | (1 << 11),                                   # no retc, no tsc
    (1 << 13) | (1 << 3) | (1 << 10) | (1 << 9) | (3 << 14) | 2 | (2 << 19) | (1 << 24),
]


def _load(log):
    """An execution log as both generators take it: (the full trace, its
    index, the CR3 of each process)."""
    data = log.read_bytes()
    index = flow.load(data, index_only=True)
    return flow.load(data), index, flow.assign_cr3(index.processes)


def _generate_both(log, loaded, cfg, mode="thread", num_cpus=1, require=True):
    """The Python generator's streams and exits for *log* (loaded by
    :func:`_load`), checking that the compiled generator takes it (unless
    not *require* d: then only if it does) and writes the same: each
    stream's bytes and instruction count, the exits and (cpu mode) the
    context switches."""
    full, index, cr3 = loaded
    sw, ex = [], {}
    res = flow.generate(full, cfg, mode=mode, num_cpus=num_cpus, switches=sw, cr3=cr3,
                        exits=ex)
    if not (require or fast.eligible(index, cfg)):
        return res, ex
    assert fast.eligible(index, cfg)
    streams, csw, cex = fast.generate(log, index, cfg, mode, num_cpus, cr3)
    assert (cex, sorted(streams)) == (ex, sorted(r.key for r in res))
    for r in res:
        assert streams[r.key] == (bytes(r.tracer.buf), r.tracer.insns), (cfg.ctl, mode, r.key)
    if mode == "cpu":
        assert csw == sw
    return res, ex


def _write_log(tmp_path, writer):
    log = tmp_path / "x.log"
    log.write_bytes(bytes(writer))
    return log


def _ptoracle_insn(ptoracle, tmp_path, res, mem, *args):
    """``ptoracle insn`` over the stream of *res* with *mem* at 0x401000:
    its JSON items."""
    import json
    pt = tmp_path / "t.pt"
    pt.write_bytes(bytes(res.tracer.buf))
    image = tmp_path / "mem.bin"
    image.write_bytes(mem)
    r = subprocess.run([str(ptoracle), "insn", str(pt), "--raw", f"{image}:0x401000", *args],
                       capture_output=True, text=True, check=True)
    return [json.loads(line) for line in r.stdout.splitlines()]


def _timing_args(cfg, mtc_freq):
    tm = cfg.timing
    return ["--cpu", "6/106", "--mtc-freq", str(mtc_freq), "--nom-freq", str(tm.nom_freq),
            "--cpuid-0x15.eax", str(tm.cpuid_15_eax), "--cpuid-0x15.ebx", str(tm.cpuid_15_ebx)]


def test_compiled_equals_python(tmp_path):
    src = tmp_path / "t.c"
    src.write_text(THREADS)
    exe = tmp_path / "t"
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src), "-lpthread"], check=True)
    for argv in (["/bin/true"], [str(exe)]):
        log = tmp_path / "x.log"
        assert qemu.run(qemu.resolve_program(argv), log) == 0
        loaded = _load(log)
        for ctl in CONFIGS:
            for mode in ("thread", "cpu"):
                _generate_both(log, loaded, ptgen.TraceConfig(ctl=ctl), mode, num_cpus=2)


def test_kept_prefix_and_generated_length(tmp_path):
    """With ``keep`` (a stop-on-full buffer's size) the compiled generator
    stores only each stream's first ``keep`` bytes -- those of the full
    stream -- and says how long the stream was; instruction counts,
    switches and exits don't change."""
    src = tmp_path / "t.c"
    src.write_text(THREADS)
    exe = tmp_path / "t"
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src), "-lpthread"], check=True)
    log = tmp_path / "x.log"
    assert qemu.run(qemu.resolve_program([str(exe)]), log) == 0
    _full, index, cr3 = _load(log)
    cfg = ptgen.TraceConfig(ctl=CONFIGS[2])
    for mode in ("thread", "cpu"):
        whole, sw, ex = fast.generate(log, index, cfg, mode, 2, cr3)
        longest = max(len(b) for b, _ in whole.values())
        for keep in (1, longest // 3, longest, longest + 1):
            generated: dict = {}
            kept, ksw, kex = fast.generate(log, index, cfg, mode, 2, cr3, keep=keep,
                                           generated=generated)
            assert (ksw, kex, sorted(kept)) == (sw, ex, sorted(whole))
            for key, (data, insns) in whole.items():
                assert kept[key] == (data[:keep], insns), (mode, key, keep)
                assert generated[key] == len(data)


DYING = r"""
#include <pthread.h>
volatile unsigned long sink;
static void *worker(void *a) { for (;;) sink++; return a; }
__attribute__((noinline)) int divide(int a, int b) { int x = a * 3 + 1; x ^= b; return x / b; }
int main(int argc, char **argv) {
  pthread_t t; pthread_create(&t, 0, worker, 0);
  for (volatile int i = 0; i < 100000; i++) sink += i;
  return divide(argc, argc - 1); }
"""


def test_compiled_equals_python_when_blocks_end_early(tmp_path):
    """A program dies of a divide error in the middle of a block while a
    second thread spins: the log ends each thread with an EXEC_PART record
    (the block it was in, as far as it got); both generators cut it there,
    byte for byte, in both modes."""
    src = tmp_path / "d.c"
    src.write_text(DYING)
    exe = tmp_path / "d"
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src), "-lpthread"], check=True)
    log = tmp_path / "x.log"
    assert qemu.run(qemu.resolve_program([str(exe)]), log) == -8
    loaded = _load(log)
    assert loaded[1].features == {"exec_part"}
    for ctl in CONFIGS:
        for mode in ("thread", "cpu"):
            _generate_both(log, loaded, ptgen.TraceConfig(ctl=ctl), mode, num_cpus=2)


def test_eligibility():
    class T:
        pass
    t = T()
    t.header = type("H", (), {"source": 1})()
    t.features, t.handlers, t.blocks = set(), {}, []
    cfg = ptgen.TraceConfig(ctl=(1 << 13) | (1 << 3))
    assert fast.eligible(t, cfg)
    assert not fast.eligible(t, ptgen.TraceConfig(ctl=cfg.ctl | (1 << 32)))   # address filter
    # a signal handler ran: the compiled generator infers the deliveries too
    t.handlers = {1: {0x401000}}
    t.blocks = [[flow.BlockInfo(0x401000, 1, 0x401000, ptgen.K_OTHER, 0, 0x401001)]]
    assert fast.eligible(t, cfg)
    t.features = {"insn"}
    assert not fast.eligible(t, cfg)
    t.features = set()
    t.header.source = 2
    assert not fast.eligible(t, cfg)



def test_stepper_migrations_switch_to_idle(tmp_path):
    """A ptrace stepper log (the Python generator: stepper logs are not for
    the compiled one), where a single thread migrates between CPUs: the CPU
    it leaves gets a switch to idle (-1) in the sideband, as the compiled
    twin writes it for QEMU logs."""
    from hwtrace.engines.emulated import stepper
    log = tmp_path / "s.log"
    assert stepper.run(["/bin/date", "+%s"], log, stepper.Options(cpu_every=64)) == 0
    full = flow.load(log.read_bytes())
    assert not fast.eligible(full, ptgen.TraceConfig(ctl=CONFIGS[0]))
    cr3 = flow.assign_cr3(full.processes)
    sw = []
    flow.generate(full, ptgen.TraceConfig(ctl=CONFIGS[0]), mode="cpu", num_cpus=2,
                  switches=sw, cr3=cr3, exits={})
    (th,) = full.threads.values()
    cpus = [seg.cpu % 2 if seg.cpu >= 0 else 0 for seg in th.segments]
    migrations = sum(1 for a, b in zip(cpus, cpus[1:]) if a != b)
    idle = [s for s in sw if s[4:] == (-1, -1)]
    assert len(idle) == migrations
    # per CPU, the switches alternate: thread in, idle (out), thread in, ...
    for c in (0, 1):
        nxt = [s[5] for s in sw if s[0] == c]
        assert all(a != b for a, b in zip(nxt, nxt[1:]))


# A thread's log that ends right after a branch (the program was killed):
# a direct call went to its target; a jcc's outcome is unknown, so it is
# taken as not retired and the trace stops at it.  Both generators agree
# and libipt decodes exactly the instructions that certainly retired.
_XOR = b"\x31\xc0"                                    # xor eax, eax
_CASES = {
    "jcc": (_XOR + b"\x75\x02", [0x401000]),           # jne +2: unknown outcome
    "call": (_XOR + b"\xe8\xfb\x0f\x00\x00", [0x401000, 0x401002]),   # call 0x402002
    "plain": (_XOR + b"\x90", [0x401000, 0x401002]),   # no branch: stops after nop
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_log_ending_after_a_branch(tmp_path, ptoracle, case):
    from hwtrace.engines.emulated import execlog as xl
    code, want = _CASES[case]
    sizes = {"jcc": b"\x02\x02", "call": b"\x02\x05", "plain": b"\x02\x01"}[case]
    w = xl.Writer(source=xl.SOURCE_QEMU)
    w.ctx(1, 1, 0)
    w.block(1, 1, 0x401000, sizes, code)
    w.exec([1])
    log = _write_log(tmp_path, w)
    cfg = ptgen.TraceConfig(ctl=(1 << 13) | (1 << 3) | (1 << 10))
    (res,), _ex = _generate_both(log, _load(log), cfg, require=False)
    assert res.tracer.insns == len(want)
    items = _ptoracle_insn(ptoracle, tmp_path, res, code.ljust(0x1010, b"\x90"))
    assert not [i for i in items if "error" in i], items
    assert [i["ip"] for i in items if "insn" in i or ("ip" in i and "size" in i)] == want


@pytest.mark.parametrize("mode", ["thread", "cpu"])
def test_chunk_that_starts_with_two_times(tmp_path, mode):
    """A QEMU chunk whose first two records are TIMEs (the plugin flushed a
    thread's buffer and read the clock again before its next block): the
    first one bounds the thread's previous slice, so a slice of another
    thread that began between the two (by the host clock) starts after it
    on the emulated clock.  The compiled generator used to take the second
    TIME as the bound (a threaded program's streams then differed from the
    Python generator's in about one recording of twenty)."""
    from hwtrace.engines.emulated import execlog as xl
    # 0x401000: nop; jmp 0x401000
    code, sizes = b"\x90\xeb\xfd", b"\x01\x02"
    w = xl.Writer(source=xl.SOURCE_QEMU, clock=xl.CLOCK_HOST_TSC)
    w.ctx(1, 1, 0)
    w.time(1000)
    w.block(1, 1, 0x401000, sizes, code)
    w.exec([1] * 50)                    # thread 1: 100 instructions from host time 1000
    w.ctx(1, 2, 1)
    w.time(1100)
    w.thread_start(1)
    w.exec([1] * 3)                     # thread 2 begins beside it
    w.ctx(1, 1, 0)
    w.time(2000)                        # thread 1's first slice ended by 2000
    w.time(9000)
    w.exec([1] * 5)
    w.thread_exit(0)
    w.ctx(1, 2, 1)
    w.time(3000)                        # so thread 2's next slice starts after it
    w.exec([1] * 3)
    w.thread_exit(0)
    log = _write_log(tmp_path, w)
    cfg = ptgen.TraceConfig(ctl=CONFIGS[0])
    full = flow.load(log.read_bytes())
    from hwtrace.engines.emulated import schedule
    res, ex = _generate_both(log, _load(log), cfg, mode, num_cpus=2)
    (first,) = [s for s in schedule.slices(full) if s.tid == 1 and s.ordinal == 0]
    assert first.h1 == 2000
    # thread 2's last instruction retired after thread 1's first 100
    assert ex[2] >= 1000 + 100 + 6, ex


@pytest.mark.parametrize("timing", ["tsc;cyc", "tsc;mtc;cyc"])
def test_psb_mid_block_keeps_libipt_on_the_clock(tmp_path, ptoracle, timing):
    """A loop long enough for PSB+ to land mid-block (one instruction after
    the TNT that crossed the period), traced with TSC and CYC: the PSB's
    TSC is the clock at that boundary, so the cycles retired since the last
    CYC are in it and not reported again.  libipt's time at each PSB+ (and,
    with CYC alone, at the trace's end) is the generator's clock.
    The PSB+ used to carry a CYC for that one instruction, putting libipt's
    time one tick ahead of the generator's (and of its sideband) until the
    next TSC."""
    from hwtrace.engines.emulated import execlog as xl
    # 0x401000: add eax, 1; cmp eax, 8000; jne 0x401000
    code = b"\x83\xc0\x01" + b"\x3d\x40\x1f\x00\x00" + b"\x75\xf6"
    sizes = b"\x03\x05\x02"
    n = 8000
    t0 = 1 << 20
    w = xl.Writer(source=xl.SOURCE_QEMU, clock=xl.CLOCK_HOST_TSC)
    w.ctx(1, 1, 0)
    w.time(t0)
    w.block(1, 1, 0x401000, sizes, code)
    w.block(1, 2, 0x40100a, b"\x02", b"\x0f\x05")        # syscall
    w.exec([1] * n + [2])
    w.syscall(60)
    w.thread_exit(0)
    log = _write_log(tmp_path, w)
    ctl = (1 << 13) | (1 << 3) | (1 << 10) | 2 | ((1 << 9) if "mtc" in timing else 0)
    cfg = ptgen.TraceConfig(ctl=ctl)
    (res,), ex = _generate_both(log, _load(log), cfg)
    items = _ptoracle_insn(ptoracle, tmp_path, res, code + b"\x0f\x05", *_timing_args(cfg, 0))
    assert not [i for i in items if "error" in i]
    done = 0
    psbs = []
    for i in items:
        if "iclass" in i:
            done += 1
        elif i.get("status_update") and i["event"] == "exec_mode":
            psbs.append((done, i["tsc"] - t0))
    assert done == 3 * n + 1
    mid = [p for p in psbs if p[0] % 3]
    assert mid, psbs                    # PSB+ did land inside the loop's block
    assert all(k == t for k, t in psbs), psbs
    assert items[-1]["event"] == "disabled" and ex[1] == t0 + done
    # libipt's time at the end is the generator's clock, with MTC too: the
    # CYC before each MTC counts the cycles up to the ART tick the MTC
    # stands for (libipt re-anchors there), not to the end of the block
    # that tick fell in (which put libipt's time behind)
    assert items[-1]["tsc"] == ex[1]


@pytest.mark.parametrize("mtc_freq", [0, 3])
def test_mtc_inside_a_run_keeps_libipt_on_the_clock(tmp_path, ptoracle, mtc_freq):
    """Straight lines of 61 instructions, each ending in a syscall, traced
    with TSC, MTC and CYC: the crystal clock ticks inside most of them, and
    the MTC (emitted once the run retired) is the time of that tick.  Its
    CYC counts the cycles up to the tick only; the rest go into the next
    CYC.  libipt's time at every disable is then the generator's clock --
    the CYC used to count the whole run before the MTC, and libipt, timing
    what follows from the tick, put every disable up to the next MTC as
    many cycles early as the run had gone past it (up to 16 ticks in a
    two-thread ptrace recording, misplacing marks next to its context
    switches: test_memory_handoff_causal_order)."""
    from hwtrace.engines.emulated import execlog as xl
    # 0x401000: 60 x nop; syscall
    code = b"\x90" * 60 + b"\x0f\x05"
    sizes = b"\x01" * 60 + b"\x02"
    t0 = (1 << 20) + 5
    w = xl.Writer(source=xl.SOURCE_QEMU, clock=xl.CLOCK_HOST_TSC)
    w.ctx(1, 1, 0)
    w.time(t0)
    w.block(1, 1, 0x401000, sizes, code)
    n = 40
    for i in range(n):
        w.exec([1])
        w.syscall(39)
        if i + 1 < n:
            w.sysret(39, 1)
    w.thread_exit(0)
    log = _write_log(tmp_path, w)
    ctl = (1 << 13) | (1 << 3) | (1 << 10) | (1 << 9) | (mtc_freq << 14) | 2
    cfg = ptgen.TraceConfig(ctl=ctl)
    (res,), _ex = _generate_both(log, _load(log), cfg)
    items = _ptoracle_insn(ptoracle, tmp_path, res, code, *_timing_args(cfg, mtc_freq))
    assert not [i for i in items if "error" in i]
    done, got = 0, []
    for i in items:
        if "iclass" in i:
            done += 1
        elif i.get("event") == "disabled":
            got.append((done, i["tsc"] - t0))
    assert done == 61 * n and len(got) == n
    assert got == [(61 * (k + 1), 61 * (k + 1)) for k in range(n)]


@pytest.mark.parametrize("extra", [0, 1, 5000, (3 << 20) + 7])
def test_kept_prefix_then_discard_is_writing_it_all(extra):
    """What the engine does with a kept stream -- write the first
    ``_storable`` bytes, then ``_discard`` the rest -- leaves a stop-on-full
    buffer exactly as writing the whole stream does: bytes, registers
    (stored, lost, OVF pending, PacketByteCnt), as saved for recovery too."""
    from hwtrace.control.config import BufferConfig
    from hwtrace.control.storage import BufferOutput
    from hwtrace.engines.emulated.engine import _discard, _storable
    from hwtrace.topa import REGS_SIZE, OutputUnit, Topa, read_registers

    def output():
        t = Topa.build(3, 0, stop_on_full=True)
        mem = [bytearray(t.region_size) for _ in range(3)]
        regs = bytearray(REGS_SIZE)
        return BufferOutput(OutputUnit(t, mem, regs=regs),
                            BufferConfig(num_chunks=3, chunk_order=0)), mem, regs

    a, amem, aregs = output()
    b, bmem, bregs = output()
    keep = _storable([a, b])
    assert keep == 3 * 4096
    stream = bytes((i * 7 + 3) & 0xFF for i in range(keep + extra))
    a.write(stream)
    b.write(stream[:keep])
    _discard(b, len(stream) - keep)
    assert (amem, a.unit.registers()) == (bmem, b.unit.registers())
    assert read_registers(aregs) == read_registers(bregs) == a.unit.registers()
    circular = BufferOutput(a.unit, BufferConfig(num_chunks=3, is_circular=True))
    assert _storable([a, circular]) is None
