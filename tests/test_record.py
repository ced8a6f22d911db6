"""System tests of ``hwtrace record`` with both emulated engines (QEMU user
mode and the ptrace stepper, the ``engine`` fixture): real programs'
bundles decode with libipt (ptoracle, image arguments from ``hwtrace
images``) with zero errors and exactly ``instructions_observed`` instructions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile

import pytest

import ptpieces
from conftest import build_programs, run_hwtrace

pytestmark = pytest.mark.skipif(shutil.which("qemu-x86_64") is None or shutil.which("gcc") is None,
                                reason="needs qemu-user and gcc")

PROGRAMS = {
    "rec": r"""
        #include <stdio.h>
        static volatile int calls;
        __attribute__((noinline)) int fib(int n) { calls++; if (n < 2) return n; return fib(n - 1) + fib(n - 2); }
        int main(void) { int r = fib(15); printf("fib=%d calls=%d\n", r, calls); return 3; }
    """,
    "thr": r"""
        #include <pthread.h>
        #include <stdio.h>
        static void *work(void *a) { volatile long s = 0; for (long i = 0; i < 20000 + (long)a * 1000; i++) s += i % 7; return 0; }
        int main(void) { pthread_t t[4]; for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, work, (void *)i);
          for (int i = 0; i < 4; i++) pthread_join(t[i], 0); puts("threads done"); return 0; }
    """,
    "sig": r"""
        #include <signal.h>
        #include <stdio.h>
        #include <sys/time.h>
        static volatile int hits, usr;
        static void on_alarm(int s) { hits++; }
        static void on_usr(int s) { usr++; }
        int main(void) {
          signal(SIGALRM, on_alarm); signal(SIGUSR1, on_usr);
          struct itimerval it = {{0, 1000}, {0, 1000}}; setitimer(ITIMER_REAL, &it, 0);
          volatile unsigned long s = 0; for (unsigned long i = 0; i < 300000000 && hits < 3; i++) s += i;
          struct itimerval off = {{0, 0}, {0, 0}}; setitimer(ITIMER_REAL, &off, 0);
          raise(SIGUSR1);
          printf("alarms>=3:%d usr=%d\n", hits >= 3, usr); return 0; }
    """,
    "fe": r"""
        #include <stdio.h>
        #include <unistd.h>
        #include <sys/wait.h>
        int main(void) { fflush(stdout); pid_t p = fork(); if (p == 0) { execl("/bin/true", "true", (char *)0); _exit(127); }
          int st; waitpid(p, &st, 0); printf("child exit %d\n", WEXITSTATUS(st));
          pid_t q = fork(); if (q == 0) { volatile int x = 0; for (int i = 0; i < 1000; i++) x += i; _exit(7); }
          waitpid(q, &st, 0); printf("child2 exit %d\n", WEXITSTATUS(st)); return 0; }
    """,
}


PROGRAMS["fault"] = r"""
    #include <signal.h>
    #include <stdio.h>
    #include <sys/mman.h>
    static char *page; static volatile int n;
    static void h(int s) { n++; mprotect(page, 4096, PROT_READ | PROT_WRITE); }
    int main(void) { page = mmap(0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      signal(SIGSEGV, h);
      for (int i = 0; i < 3; i++) { page[i] = 1; page[i + 100] = 2; mprotect(page, 4096, PROT_READ); }
      printf("faults %d\n", n); return 0; }
"""


@pytest.fixture(scope="session")
def progs(tmp_path_factory):
    return build_programs(tmp_path_factory.mktemp("progs"), PROGRAMS, "-lpthread")


def symbol(exe, name):
    from elftools.elf.elffile import ELFFile
    with open(exe, "rb") as f:
        s = ELFFile(f).get_section_by_name(".symtab").get_symbol_by_name(name)[0]
        return s["st_value"], s["st_size"]


@pytest.fixture(params=["qemu", "ptrace"])
def engine(request):
    """The execution source: each system test runs with both."""
    return request.param


def record(out, *args, expect_status=0, engine=None, timeout=600):
    eng = ["--engine", engine] if engine else []
    r = run_hwtrace("record", "-o", out, *eng, *args, timeout=timeout)
    assert r.returncode == expect_status, r.stderr
    return r


def decode_bundle(ptoracle, bundle, want_ips=False):
    """{stream file: (manifest entry, [decoded ips] or None, [event lines])},
    asserting no errors and exactly instructions_observed instructions per
    stream (from ptoracle's summary; the per-instruction listing, parsed
    cheaply, only when ``want_ips``)."""
    man = json.loads((bundle / "manifest.json").read_text())
    res = {}
    spaces = ptpieces.spaces_of(bundle)
    for s in man["streams"]:
        runs = spaces.spaces if "cpu" in s else spaces._by_pid.get(s.get("pid"), [])
        if not ptpieces.consistent(runs):
            # its processes map different code at the same addresses (QEMU
            # lays every program out alike): one image per address space
            if "cpu" in s:
                cuts = ptpieces.cuts_from_hwtrace(ptoracle, bundle, s["file"], spaces)
            else:
                cuts = ptpieces.exec_cuts(ptoracle, bundle / s["file"], runs)
            with tempfile.TemporaryDirectory() as tmp:
                parts = ptpieces.decode_pieces(ptoracle, bundle / s["file"], cuts, tmp,
                                               want_ips)
            assert [p[2] for p in parts] == [0] * len(parts), s["file"]
            assert sum(p[1] for p in parts) == s["instructions_observed"], s["file"]
            ips = [ip for p in parts for ip in p[3]] if want_ips else None
            res[s["file"]] = (s, ips, [])
            continue
        r = run_hwtrace("images", bundle, "--pt", s["file"], "--lines")
        assert r.returncode == 0, r.stderr
        cmd = [str(ptoracle), "insn", str(bundle / s["file"]), *r.stdout.split()]
        if not want_ips:
            o = subprocess.run(cmd + ["--summary"], capture_output=True, text=True, check=True)
            summary = json.loads(o.stdout.splitlines()[-1])
            assert summary["errors"] == 0, s["file"]
            assert summary["insns"] == s["instructions_observed"], s["file"]
            res[s["file"]] = (s, None, [])
            continue
        o = subprocess.run(cmd, capture_output=True, text=True, check=True)
        ips, other = [], []
        for line in o.stdout.splitlines():
            if line.startswith('{"ip":'):
                ips.append(int(line[6:line.index(",")]))
            else:
                other.append(json.loads(line))
        errors = [x for x in other if "error" in x]
        assert errors == [], (s["file"], errors[:3])
        assert len(ips) == s["instructions_observed"], s["file"]
        res[s["file"]] = (s, ips, other)
    return man, res


def load_base(bundle, exe):
    """Where the program's ELF virtual address 0 is (from any of its
    mappings: QEMU reports them all, the stepper only the executable ones)."""
    from elftools.elf.elffile import ELFFile
    with open(exe, "rb") as f:
        loads = [(seg["p_offset"], seg["p_filesz"], seg["p_vaddr"])
                 for seg in ELFFile(f).iter_segments() if seg["p_type"] == "PT_LOAD"]
    for line in (bundle / "sideband.jsonl").read_text().splitlines():
        o = json.loads(line)
        if o["type"] == "mmap" and o["file"] == str(exe):
            for off, size, vaddr in loads:
                if off <= o["offset"] < off + max(size, 1):
                    return o["start"] - (vaddr + o["offset"] - off)
    raise AssertionError("no mapping of the program")


def test_true_cpu_and_thread(tmp_path, ptoracle, engine):
    for mode in ("cpu", "thread"):
        b = tmp_path / mode
        record(b, "--mode", mode, *(["--copy-images"] if mode == "thread" else []),
               "--", "/bin/true", engine=engine)
        if mode == "thread":    # the images come from the bundle's copies
            (s,) = json.loads((b / "manifest.json").read_text())["streams"]
            args = run_hwtrace("images", b, "--pt", s["file"], "--lines").stdout.split()
            raws = [a for a in args if a != "--raw"]
            assert raws and all(a.startswith(str(b / "images") + "/") for a in raws)
            assert any("/vdso-" in a for a in raws) == (engine == "ptrace")
        man, res = decode_bundle(ptoracle, b)
        assert man["mode"] == mode
        assert (man["engine"], man["engine_info"]["source"]) == ("emulated", engine)
        assert (man["cpu"]["family"], man["nom_freq"], man["cpuid_0x15_eax"],
                man["cpuid_0x15_ebx"]) == (6, 22, 2, 176)
        assert "instruction" in man["timebase"]
        assert sum(v[0]["instructions_observed"] for v in res.values()) > 50_000


def test_ls(tmp_path, ptoracle):
    b = tmp_path / "ls"
    r = record(b, "--", "ls", "-la", "/usr/bin")
    assert r.stdout == subprocess.run(["ls", "-la", "/usr/bin"], capture_output=True,
                                      text=True).stdout
    man, res = decode_bundle(ptoracle, b)
    assert sum(v[0]["instructions_observed"] for v in res.values()) > 1_000_000


def test_shell_script_takes_the_compiled_generator(tmp_path, ptoracle):
    """bash runs its SIGCHLD handler as each child exits: the deliveries
    are inferred by the compiled generator (it once left every such log to
    the Python one), and the bundle decodes exactly."""
    from hwtrace.engines.emulated import flow, qemu
    script = "for i in 1 2; do /bin/true; done; echo x | wc -c"
    log = tmp_path / "x.log"
    qemu.run(qemu.resolve_program(["/bin/bash", "-c", script]), log)
    index = flow.load(log.read_bytes(), index_only=True)
    handlers = set().union(*index.handlers.values())
    assert any(parts[0].pc in handlers for parts in index.blocks)     # a handler ran
    b = tmp_path / "sh"
    r = record(b, "--", "/bin/bash", "-c", script)
    assert r.stdout == "2\n"
    man, res = decode_bundle(ptoracle, b)
    assert man["recording"]["generator"] == "compiled"
    assert sum(v[0]["instructions_observed"] for v in res.values()) > 100_000


@pytest.mark.parametrize("mode,config", [
    ("cpu", "branch;user;retc;tsc"),
    ("thread", "branch;user;tsc"),
    ("cpu", "branch;user;retc;tsc;mtc;mtc-freq=3;cyc;cyc-thresh=2;psb-freq=1"),
    ("thread", "branch;user"),
])
def test_recursion_known_call_count(tmp_path, ptoracle, progs, mode, config, engine):
    b = tmp_path / "b"
    r = record(b, "--mode", mode, "--config", config, "--", progs["rec"], expect_status=3,
               engine=engine)
    assert r.stdout == "fib=610 calls=1973\n"
    man, res = decode_bundle(ptoracle, b, want_ips=True)
    fib = load_base(b, progs["rec"]) + symbol(progs["rec"], "fib")[0]
    assert sum(v[1].count(fib) for v in res.values()) == 1973
    ctl = man["config"]["ctl"]
    assert bool(ctl & (1 << 11)) == ("retc" not in config)


def test_threads(tmp_path, ptoracle, progs, engine):
    for mode in ("cpu", "thread"):
        b = tmp_path / mode
        r = record(b, "--mode", mode, "--", progs["thr"], engine=engine)
        assert r.stdout == "threads done\n"
        man, res = decode_bundle(ptoracle, b, want_ips=True)
        if mode == "thread":
            assert len(man["streams"]) == 5
        work = load_base(b, progs["thr"]) + symbol(progs["thr"], "work")[0]
        assert sum(v[1].count(work) for v in res.values()) == 4


def test_signals(tmp_path, ptoracle, progs, engine):
    for mode in ("cpu", "thread"):
        b = tmp_path / mode
        r = record(b, "--mode", mode, "--", progs["sig"], engine=engine)
        assert r.stdout == "alarms>=3:1 usr=1\n"
        man, res = decode_bundle(ptoracle, b, want_ips=True)
        base = load_base(b, progs["sig"])
        usr = base + symbol(progs["sig"], "on_usr")[0]
        alarm = base + symbol(progs["sig"], "on_alarm")[0]
        ips = [ip for v in res.values() for ip in v[1]]
        assert ips.count(usr) == 1 and ips.count(alarm) >= 3


def test_fork_exec(tmp_path, ptoracle, progs, engine):
    for mode in ("cpu", "thread"):
        b = tmp_path / mode
        # QEMU follows the exec of /bin/true, laid out where fe is: a CPU's
        # stream is decoded an address space at a time, whose switches the
        # timing packets place (TSC alone can't say which side of a switch
        # an enable is on)
        timing = ["--config", "branch;user;retc;tsc;mtc;cyc"] \
            if engine == "qemu" and mode == "cpu" else []
        r = record(b, "--mode", mode, *timing, "--", progs["fe"], engine=engine)
        assert r.stdout == "child exit 0\nchild2 exit 7\n"
        man, res = decode_bundle(ptoracle, b)
        procs = [json.loads(x) for x in (b / "sideband.jsonl").read_text().splitlines()
                 if json.loads(x)["type"] == "process"]
        # three processes, each with its CR3; the first child's exec of
        # /bin/true is a record of its own (new comm and executable, later)
        assert len({p["pid"] for p in procs}) == 3 and len({p["cr3"] for p in procs}) == 3
        firsts = {}
        for p in procs:
            firsts.setdefault(p["pid"], p)
        (execd,) = [p for p in procs if firsts[p["pid"]] is not p]
        assert all(p["comm"] == "fe" for p in firsts.values())
        assert execd["comm"] == "true" and execd["time"] > firsts[execd["pid"]]["time"]
        assert os.path.realpath(execd["exe"]) == os.path.realpath("/bin/true")
        procs = list(firsts.values())
        if mode == "thread":
            assert len(man["streams"]) == 3
        else:
            total = sum(v[0]["instructions_observed"] for v in res.values())
            parent = min(procs, key=lambda p: p["pid"])
            # CR3 filtering: only the process whose CR3 matches
            f = tmp_path / "cr3"
            record(f, "--config", f"branch;user;retc;tsc;cr3-match={parent['cr3']}", "--",
                   progs["fe"], engine=engine)
            _, fres = decode_bundle(ptoracle, f)
            traced = sum(v[0]["instructions_observed"] for v in fres.values())
            assert 0 < traced < total


def test_address_filter_and_tracestop(tmp_path, ptoracle, progs, engine):
    exe = progs["rec"]
    start, size = symbol(exe, "fib")
    b = tmp_path / "filter"
    record(b, "--config", f"branch;user;retc;addr0=filter;addr0-range={exe},fib,fib", "--", exe,
           expect_status=3, engine=engine)
    man, res = decode_bundle(ptoracle, b, want_ips=True)
    lo = load_base(b, exe) + start
    ips = [ip for v in res.values() for ip in v[1]]
    assert ips and all(lo <= ip < lo + size for ip in ips)
    assert ips.count(lo) == 1973
    assert man["config"]["addr_ranges"] == [[lo, lo + size - 1]]

    # TraceStop clears TraceEn on the logical processor that hit it (SDM):
    # in thread mode that state moves with the thread, so the single-threaded
    # program stops exactly once; in cpu mode the other CPU, still tracing,
    # stops again if the thread migrates there and reaches fib, so each CPU's
    # stream stops at most once.
    for mode in ("thread", "cpu"):
        b = tmp_path / f"stop-{mode}"
        record(b, "--mode", mode, "--config",
               f"branch;user;retc;addr0=stop;addr0-range={exe},fib,fib", "--", exe,
               expect_status=3, engine=engine)
        man, res = decode_bundle(ptoracle, b, want_ips=True)
        lo = load_base(b, exe) + start
        ips = [ip for v in res.values() for ip in v[1]]
        assert ips and not any(lo <= ip < lo + size for ip in ips)
        main = load_base(b, exe) + symbol(exe, "main")[0]
        assert main in ips
        stops = [sum(x.get("event") == "stop" for x in lines) for _, _, lines in res.values()]
        if mode == "thread":
            assert sorted(stops) == [1]
        else:
            assert 1 <= sum(stops) and all(n <= 1 for n in stops)


def test_status_and_errors(tmp_path):
    r = run_hwtrace("record", "-o", tmp_path / "x", "--", "/nonexistent/prog")
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "no such program" in r.stderr
    arm = tmp_path / "arm"
    arm.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\x02\x00\xb7\x00" + b"\0" * 44)
    arm.chmod(0o755)
    r = run_hwtrace("record", "-o", tmp_path / "y", "--", arm)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "x86-64" in r.stderr
    r = run_hwtrace("record", "-o", tmp_path / "z", "--config", "branch;bogus", "--", "/bin/true")
    assert r.returncode == 2 and "unknown item" in r.stderr
    r = run_hwtrace("record", "-o", tmp_path / "w", "--", "sh", "-c", "echo out; echo err >&2; exit 5")
    # the program's output and status pass through unchanged; hwtrace adds
    # one line on stderr after it saying what it wrote (issue 17)
    assert (r.returncode, r.stdout) == (5, "out\n")
    err, said = r.stderr.splitlines(keepends=True)
    assert err == "err\n" and said.startswith(f"hwtrace: wrote {tmp_path / 'w'}: ")
    assert said.rstrip().endswith("nothing lost; the program exited with status 5")


def test_killed_program_keeps_its_trace(tmp_path, ptoracle, engine):
    b = tmp_path / "k"
    r = run_hwtrace("record", "--engine", engine, "-o", b, "--", "sh", "-c", "kill -9 $$")
    assert r.returncode == 128 + 9
    man, res = decode_bundle(ptoracle, b)
    assert sum(v[0]["instructions_observed"] for v in res.values()) > 10_000


def test_faulting_instruction_retires_once(tmp_path, ptoracle, progs, engine):
    """A store faults (QEMU ends its block there; the stepper sees the
    signal at it), the SIGSEGV handler fixes the page and returns: the store
    retires exactly once per iteration, after the handler (FUP at it, then
    TIP.PGE back to it)."""
    b = tmp_path / "f"
    r = record(b, "--mode", "thread", "--", progs["fault"], engine=engine)
    assert r.stdout == "faults 3\n"
    man, res = decode_bundle(ptoracle, b, want_ips=True)
    (s, ips, events) = next(iter(res.values()))
    faults = [e["at"] for e in events if e.get("event") == "async_disabled"]
    assert len(faults) == 3 and len(set(faults)) == 1
    assert ips.count(faults[0]) == 3
