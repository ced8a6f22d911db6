"""The compiled generator takes logs where signal handlers ran, and writes
what the Python generator does (flow._find_signals' inferred deliveries):
real QEMU logs of programs that take signals, both modes, every config."""

import shutil

import pytest

from conftest import build_programs
from hwtrace.engines.emulated import execlog as xl, flow, ptgen, qemu
from test_ptgen_fast import CONFIGS, _generate_both, _load
from test_record import PROGRAMS as RECORD_PROGRAMS
from test_record_events import SOURCES as EVENT_SOURCES

pytestmark = pytest.mark.skipif(shutil.which("qemu-x86_64") is None or shutil.which("gcc") is None,
                                reason="needs qemu-user and gcc")

SOURCES = {
    # SIGALRM every 2 ms into a tight loop (deliveries at syscall returns
    # and on another handler's rt_sigreturn too)
    "alarm": EVENT_SOURCES["alarm"],
    # handlers that return: timer, then raise(SIGUSR1)
    "sig": RECORD_PROGRAMS["sig"],
    # fault handlers that siglongjmp out (no rt_sigreturn)
    "longjmp": EVENT_SOURCES["faults"],
    # a SIGSEGV handler that fixes the page and returns: the faulting
    # store's block is cut before it, the store retires once, after
    "fault": RECORD_PROGRAMS["fault"],
    # SIGUSR1, raised in the SIGALRM handler with SIGUSR1 masked, is
    # delivered at that handler's rt_sigreturn: its own rt_sigreturn goes
    # where the SIGALRM handler's would have
    "nested": r"""
        #include <signal.h>
        #include <stdio.h>
        #include <sys/time.h>
        static volatile unsigned long alarms, usr, sink;
        static void on_usr(int s) { (void)s; usr++; }
        static void on_alarm(int s) { (void)s; alarms++; raise(SIGUSR1);
          for (volatile int i = 0; i < 500; i++) sink += i; }
        int main(void) {
          struct sigaction sa = {0};
          sa.sa_handler = on_usr; sigaction(SIGUSR1, &sa, 0);
          sa.sa_handler = on_alarm; sa.sa_flags = SA_RESTART;
          sigemptyset(&sa.sa_mask); sigaddset(&sa.sa_mask, SIGUSR1);
          sigaction(SIGALRM, &sa, 0);
          struct itimerval it = {{0, 1000}, {0, 1000}}, off = {{0, 0}, {0, 0}};
          setitimer(ITIMER_REAL, &it, 0);
          while (alarms < 5) sink++;
          setitimer(ITIMER_REAL, &off, 0);
          printf("%d\n", usr >= 5); return 0; }
    """,
    # fork + a SIGCHLD handler that reaps (the children inherit it)
    "chld": r"""
        #include <signal.h>
        #include <stdio.h>
        #include <sys/wait.h>
        #include <unistd.h>
        static volatile int got;
        static void on_chld(int s) { int st; (void)s; while (waitpid(-1, &st, WNOHANG) > 0) got++; }
        int main(void) {
          signal(SIGCHLD, on_chld);
          int go[2]; char c; if (pipe(go)) return 1;
          for (int i = 0; i < 3; i++) {
            fflush(stdout);
            if (fork() == 0) { close(go[1]); (void)!read(go[0], &c, 1);
              volatile int x = 0; for (int k = 0; k < 20000; k++) x += k; _exit(i); }
          }
          close(go[1]);     /* the children go on once the parent spins */
          volatile unsigned long s = 0;
          while (got < 3) s++;
          printf("reaped %d\n", got); return 0; }
    """,
    # threads spinning while process-wide SIGALRMs and per-thread SIGUSR1s come
    "thrsig": r"""
        #include <pthread.h>
        #include <signal.h>
        #include <stdio.h>
        #include <sys/time.h>
        static volatile int alarms, usr, stop;
        static void on_alarm(int s) { (void)s; __sync_fetch_and_add(&alarms, 1); }
        static void on_usr(int s) { (void)s; __sync_fetch_and_add(&usr, 1); }
        static void *work(void *a) { volatile unsigned long s = 0; while (!stop) s++; return a; }
        int main(void) {
          signal(SIGALRM, on_alarm); signal(SIGUSR1, on_usr);
          pthread_t t[2];
          for (int i = 0; i < 2; i++) pthread_create(&t[i], 0, work, 0);
          struct itimerval it = {{0, 1000}, {0, 1000}}, off = {{0, 0}, {0, 0}};
          setitimer(ITIMER_REAL, &it, 0);
          for (int i = 0; i < 2; i++) pthread_kill(t[i], SIGUSR1);
          volatile unsigned long s = 0;
          while (alarms < 5 || usr < 2) s++;
          setitimer(ITIMER_REAL, &off, 0);
          stop = 1;
          for (int i = 0; i < 2; i++) pthread_join(t[i], 0);
          printf("ok\n"); return 0; }
    """,
}


@pytest.fixture(scope="module")
def progs(tmp_path_factory):
    return build_programs(tmp_path_factory.mktemp("sigprogs"), SOURCES, "-lpthread")


def _inferred(full):
    """(SIGNAL items flow._find_signals put in, blocks it cut at a fault)."""
    sigs = cuts = 0
    for th in full.threads.values():
        for seg in th.segments:
            for it in seg.items:
                if type(it) is xl.Signal:
                    sigs += 1
                elif type(it) is flow.BlockInfo and it.last == 0 and it.ninsn < len(it.sizes):
                    cuts += 1
    return sigs, cuts


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_compiled_equals_python_with_signals(tmp_path, progs, name):
    log = tmp_path / "x.log"
    # a signal that comes while the program is in a system call is
    # delivered at its return, which is no inferred delivery: on a loaded
    # machine every SIGCHLD may come so (CI saw it once); run it again then
    for _attempt in range(3):
        qemu.run(qemu.resolve_program([str(progs[name])]), log)
        loaded = _load(log)
        full, index, _cr3 = loaded
        sigs, cuts = _inferred(full)
        if index.handlers and sigs:
            break
    assert index.handlers and sigs, "no delivery inferred: the test tests nothing"
    if name == "fault":
        assert cuts, "no faulting block cut"
    for ctl in CONFIGS:
        for mode in ("thread", "cpu"):
            _generate_both(log, loaded, ptgen.TraceConfig(ctl=ctl), mode, num_cpus=2)


# A synthetic log for the corners: 0x401000 L: nop; jmp rax (to A) --
# 0x401100 A: nop; nop; nop; jmp L -- 0x402000 H (SIGSEGV) and 0x403000 U
# (SIGUSR1): nop; syscall (rt_sigreturn).  QEMU starts a block where a
# handler returns, so A's tails are blocks too.
L_, A_, H_, U_ = 0x401000, 0x401100, 0x402000, 0x403000
_BLOCKS = {
    1: (L_, b"\x01\x02", b"\x90\xff\xe0"),
    2: (A_, b"\x01\x01\x01\x05", b"\x90\x90\x90\xe9\xf8\xfe\xff\xff"),
    3: (A_ + 1, b"\x01\x01\x05", b"\x90\x90\xe9\xf8\xfe\xff\xff"),
    4: (A_ + 2, b"\x01\x05", b"\x90\xe9\xf8\xfe\xff\xff"),
    5: (H_, b"\x01\x02", b"\x90\x0f\x05"),
    6: (U_, b"\x01\x02", b"\x90\x0f\x05"),
}


def _corners_log(loops: int) -> bytes:
    w = xl.Writer(source=xl.SOURCE_QEMU, clock=xl.CLOCK_HOST_TSC)
    w.ctx(10, 10, 0)
    w.time(1000)
    w.proc_start(0)
    w.thread_start(0)
    for bid, (pc, sizes, code) in _BLOCKS.items():
        w.block(10, bid, pc, sizes, code)
    w.sigaction(11, H_, 0)
    w.sigaction(10, U_, 0)
    w.exec([1, 2] * loops + [1, 2, 5])      # SIGSEGV after A: its handler
    w.syscall(15)
    w.exec([4, 1, 2])                       # resumes at A's third nop: A is cut to 2
    w.time(2000)
    w.exec([5])                             # SIGSEGV again
    w.syscall(15)
    w.exec([2])                             # resumes at A itself: A is cut to none
    w.exec([1, 2, 5])                       # SIGSEGV
    w.syscall(15)
    w.time(3000)
    w.exec([6])                             # SIGUSR1 on its rt_sigreturn
    w.syscall(15)
    w.exec([3, 1, 2])                       # ...resumes where H would have: A cut to 1
    w.exec([6])                             # SIGUSR1 (async: no cut)
    w.syscall(15)
    w.exec([4, 1, 2, 1])
    w.syscall(60)
    w.thread_exit(0)
    return bytes(w)


@pytest.mark.parametrize("loops", [0, 1, 700])
def test_compiled_equals_python_at_fault_cuts_and_carried_resumes(tmp_path, loops):
    log = tmp_path / "x.log"
    log.write_bytes(_corners_log(loops))
    loaded = _load(log)
    sigs, cuts = _inferred(loaded[0])
    assert (sigs, cuts) == (4, 3)
    (th,) = loaded[0].threads.values()
    items = [it for seg in th.segments for it in seg.items]
    assert [it.ninsn for it in items if type(it) is flow.BlockInfo and it.pc == A_
            and it.last == 0] == [2, 0, 1]
    for ctl in CONFIGS:
        for mode in ("thread", "cpu"):
            _generate_both(log, loaded, ptgen.TraceConfig(ctl=ctl), mode, num_cpus=2)


def _unrun_handler_log() -> bytes:
    """A handler registered but never run, no rt_sigreturn: transfers no
    instruction explains are still deliveries (flow._find_signals), at the
    IP after a plain run or a jcc (reported not taken), at a jmp's target,
    after an EXEC_PART cut."""
    j, p, m = 0x401000, 0x401100, 0x401200
    w = xl.Writer(source=xl.SOURCE_QEMU, clock=xl.CLOCK_HOST_TSC)
    w.ctx(10, 10, 0)
    w.time(1000)
    w.proc_start(0)
    w.thread_start(0)
    w.block(10, 1, j, b"\x01\x02", b"\x90\x75\xfd")                  # nop; jne j
    w.block(10, 2, p, b"\x01\x01", b"\x90\x90")                      # nop; nop
    w.block(10, 3, m, b"\x01\x05", b"\x90\xe9\xfa\xfd\xff\xff")      # nop; jmp 0x401000
    w.sigaction(10, U_, 0)
    w.exec([1, 1, 2, 3, 2, 1])
    w.time(2000)
    w.exec_part(1, 1)
    w.exec([2, 3, 1, 1, 1])
    w.syscall(60)
    w.thread_exit(0)
    return bytes(w)


def test_compiled_equals_python_where_no_handler_ran(tmp_path):
    log = tmp_path / "x.log"
    log.write_bytes(_unrun_handler_log())
    loaded = _load(log)
    assert _inferred(loaded[0]) == (6, 0)
    for ctl in CONFIGS:
        for mode in ("thread", "cpu"):
            _generate_both(log, loaded, ptgen.TraceConfig(ctl=ctl), mode, num_cpus=2)


_MORE = {
    7: (0x401300, b"\x01\x02", b"\x90\x75\xfd"),                 # nop; jne self
    8: (0x401400, b"\x02", b"\xf3\xa4"),                         # rep movsb
    9: (0x401500, b"\x01\x01", b"\x90\xc3"),                     # nop; ret
    10: (0x401600, b"\x01\x05", b"\x90\xe8\xf5\xfc\xff\xff"),    # nop; call
}


def _random_log(seed: int) -> bytes:
    """Blocks in random order: deliveries anywhere, rt_sigreturns with or
    without a handler before, EXEC_PART cuts, two threads and a child
    process on two CPUs; in half the logs no handler is a block."""
    import random
    r = random.Random(seed)
    blocks = {**_BLOCKS, **_MORE}
    w = xl.Writer(source=xl.SOURCE_QEMU, clock=xl.CLOCK_HOST_TSC)
    t = 1000
    w.ctx(10, 10, 0)
    w.time(t)
    w.proc_start(0)
    w.thread_start(0)
    no_handler = r.random() < 0.5
    ids = [b for b in blocks if not (no_handler and b in (5, 6))]
    for bid in ids:
        w.block(10, bid, *blocks[bid])
    if r.random() < 0.8:
        w.sigaction(11, H_, 0)
    if r.random() < 0.8:
        w.sigaction(10, U_, 0)
    started = {10}
    for _ in range(r.randint(1, 25)):
        c = r.random()
        if c < 0.15:
            pid, tid = r.choice([(10, 10), (10, 11), (20, 20)])
            w.ctx(pid, tid, r.randint(0, 1))
            t += r.randint(0, 50)
            w.time(t)
            if tid not in started:
                started.add(tid)
                if pid == 20:
                    w.proc_start(10)
                w.thread_start(0 if pid == 20 else 10)
        elif c < 0.25:
            t += r.randint(1, 100)
            w.time(t)
        elif c < 0.4:
            w.syscall(r.choice([1, 39] if no_handler and r.random() < 0.7 else [15, 15, 1, 39]))
        elif c < 0.47:
            w.exec_part(r.choice(ids), r.randint(0, 3))
        else:
            w.exec([r.choice(ids) for _ in range(r.randint(1, 40))])
    return bytes(w)


def test_compiled_equals_python_on_random_logs(tmp_path):
    log = tmp_path / "x.log"
    sigs = cuts = 0
    for seed in range(60):
        log.write_bytes(_random_log(seed))
        loaded = _load(log)
        s, c = _inferred(loaded[0])
        sigs, cuts = sigs + s, cuts + c
        for ctl in CONFIGS:
            for mode in ("thread", "cpu"):
                _generate_both(log, loaded, ptgen.TraceConfig(ctl=ctl), mode, num_cpus=2)
    assert sigs > 1000 and cuts > 5
