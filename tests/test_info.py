"""`hwtrace info` and the host-CPU readers behind it (CPUID driver, sysfs caps, cpuinfo)."""

from __future__ import annotations

import json
import os
import struct

import pytest

from conftest import run_hwtrace
from hwtrace.control.capabilities import NONE
from hwtrace.control.host import caps_from_cpuid, caps_from_sysfs, cpu_from_cpuinfo, host_cpu

CRASH_C = r"""
#include <stdio.h>
__attribute__((noinline)) int deref(volatile int *p) { return *p; }
int main(int argc, char **argv) { puts("before"); return deref((int *)(long)(argc - 1)); }
"""

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 85
stepping\t: 4
flags\t\t: fpu vme intel_pt hypervisor

processor\t: 1
vendor_id\t: GenuineIntel
"""


def test_cpuinfo_parsing():
    info, flags = cpu_from_cpuinfo(CPUINFO)
    assert (info.vendor, info.family, info.model, info.stepping) == ("GenuineIntel", 6, 85, 4)
    assert "intel_pt" in flags


def test_sysfs_caps(tmp_path):
    caps = tmp_path / "intel_pt" / "caps"
    caps.mkdir(parents=True)
    for name, v in {"cr3_filtering": "1", "psb_cyc": "1", "ip_filtering": "1", "mtc": "1",
                    "ptwrite": "0", "power_event_trace": "0", "topa_output": "1",
                    "topa_multiple_entries": "1", "single_range_output": "1",
                    "payloads_lip": "0", "num_address_ranges": "2",
                    "mtc_periods": "249", "cycle_thresholds": "3fff",
                    "psb_periods": "3f"}.items():
        (caps / name).write_text(v + "\n")
    # the kernel prints every cap with "%x": hex without 0x
    c = caps_from_sysfs(tmp_path / "intel_pt")
    assert c.pt and c.cr3_filtering and c.mtc and not c.ptwrite and c.topa_multiple_entries
    assert (c.num_address_ranges, c.mtc_period_mask, c.cyc_threshold_mask, c.psb_freq_mask) \
        == (2, 0x249, 0x3FFF, 0x3F)
    assert caps_from_sysfs(tmp_path / "nope") is None


def test_cpuid_device_file(tmp_path):
    # a sparse fake of /dev/cpu/0/cpuid: 16 bytes at offset (subleaf << 32 | leaf)
    dev = tmp_path / "cpuid"
    fd = os.open(dev, os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, struct.pack("<4I", 0x20, 0, 0, 0), 0)
        os.pwrite(fd, struct.pack("<4I", 0, 1 << 25, 0, 0), 7)
        os.pwrite(fd, struct.pack("<4I", 1, 0b1111, 0b11, 0), 0x14)
        os.pwrite(fd, struct.pack("<4I", 0x0249_0002, 0x003F_3FFF, 0, 0), (1 << 32) | 0x14)
    finally:
        os.close(fd)
    c = caps_from_cpuid(str(dev))
    assert c.pt and c.cr3_filtering and c.psb_cyc and c.ip_filtering and c.mtc
    assert c.topa_output and c.topa_multiple_entries and c.num_address_ranges == 2
    assert caps_from_cpuid(str(tmp_path / "missing")) is None


def test_host_without_pt_says_why(tmp_path):
    (tmp_path / "cpuinfo").write_text(CPUINFO.replace(" intel_pt", ""))
    h = host_cpu(cpuinfo=tmp_path / "cpuinfo", pmu=tmp_path / "none",
                 cpuid_dev=str(tmp_path / "none"))
    assert h.capabilities == NONE and "without Intel PT" in h.reason
    (tmp_path / "cpuinfo").write_text(CPUINFO.replace("GenuineIntel", "AuthenticAMD"))
    h = host_cpu(cpuinfo=tmp_path / "cpuinfo", pmu=tmp_path / "none",
                 cpuid_dev=str(tmp_path / "none"))
    assert "AuthenticAMD" in h.reason


def test_info_cli_lists_engines_and_reasons():
    r = run_hwtrace("info")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("cpu: ")
    lines = r.stdout.splitlines()
    eng = {ln.split()[0]: ln for ln in lines if ln.startswith("  ") and
           ("usable" in ln)}
    assert set(eng) >= {"perf", "emulated", "qemu", "ptrace"}
    if not os.path.isdir("/sys/bus/event_source/devices/intel_pt"):
        assert "not usable" in eng["perf"] and "intel_pt" in eng["perf"]
    assert any(ln.startswith("auto: ") for ln in lines)


def test_info_json_and_bad_engine():
    r = run_hwtrace("info", "--json")
    assert r.returncode == 0
    info = json.loads(r.stdout)
    assert set(info) >= {"cpu", "intel_pt", "engines", "auto"}
    for name, e in info["engines"].items():
        assert isinstance(e["available"], bool)
        assert e["available"] or e["reason"]
    r = run_hwtrace("info", "--engine", "nonesuch")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1


# -- hwtrace info DIR: what a bundle holds ----------------------------------------------



def test_info_describes_a_recorded_bundle(tmp_path):
    """A program that forks a child which execs another program: the
    command, how it ended, the process tree with the exec and the exit
    statuses, each stream, and the images (one deleted after recording:
    named as missing)."""
    from conftest import FORK_EXEC_C, build_programs
    progs = build_programs(tmp_path, {"parent": FORK_EXEC_C, "child": "int main(){return 5;}"})
    b = tmp_path / "b"
    r = run_hwtrace("record", "-o", b, "--", progs["parent"], progs["child"], "3")
    assert r.returncode == 3, r.stderr
    r = run_hwtrace("info", b)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    text = r.stdout
    assert f"command:    {progs['parent']} {progs['child']} 3" in text
    assert "ended:      the program exited with status 3" in text
    assert "engine:     emulated (qemu)" in text and "stop-on-full" in text
    lines = text.splitlines()
    parent = next(x for x in lines if x.endswith("[1 thread, exit status 3]"))
    child = next(x for x in lines if x.endswith("[1 thread, exit status 5]"))
    assert f"  {progs['parent']}  [" in parent
    assert f"{progs['child']}, exec'd from parent" in child
    assert len(child) - len(child.lstrip()) > len(parent) - len(parent.lstrip())  # nested
    assert "processes:  2, 2 thread(s)" in text
    assert "nothing lost" in text and ", 0 missing" in text

    d = json.loads(run_hwtrace("info", b, "--json", check=True).stdout)
    assert d["recording"]["command"] == [str(progs["parent"]), str(progs["child"]), "3"]
    by_pid = {p["pid"]: p for p in d["processes"]}
    kid = next(p for p in d["processes"] if p["exe"][-1] == str(progs["child"]))
    assert kid["exe"] == [str(progs["parent"]), str(progs["child"])]
    assert by_pid[kid["ppid"]]["exit_status"] == 3 and kid["exit_status"] == 5
    assert sum(s["instructions_observed"] for s in d["streams"]) == \
        d["totals"]["instructions_observed"] > 10_000
    files = {i["file"]: i for i in d["images"]}
    assert files[str(progs["child"])]["found"] == "here"

    progs["child"].unlink()
    r = run_hwtrace("info", b)
    assert r.returncode == 0, r.stderr
    assert f"  missing: {progs['child']} (build-id " in r.stdout
    assert ", 1 missing" in r.stdout and "--image-path DIR" in r.stdout


@pytest.mark.parametrize("mode", ["cpu", "thread"])
def test_info_says_a_program_a_signal_killed_was_killed(tmp_path, mode):
    """QEMU logs no exit for a process a signal kills: its sideband exit
    said ``status 0`` and ``info`` "exit status 0" for a program that died
    of SIGSEGV.  The one the recorder started has its wait() status."""
    from conftest import build_programs
    progs = build_programs(tmp_path, {"crash": CRASH_C})
    b = tmp_path / "b"
    r = run_hwtrace("record", "--mode", mode, "-o", b, "--", progs["crash"])
    assert r.returncode == 128 + 11, r.stderr
    text = run_hwtrace("info", b, check=True).stdout
    assert f"{progs['crash']}  [1 thread, killed by SIGSEGV]" in text, text
    d = json.loads(run_hwtrace("info", b, "--json", check=True).stdout)
    assert [p["exit_status"] for p in d["processes"]] == [-11]


REAP_C = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    pid_t a = fork();
    if (a == 0) { raise(SIGSEGV); return 3; }
    int st;
    waitpid(a, &st, 0);                 /* wait4 */
    pid_t b = fork();
    if (b == 0) { raise(SIGABRT); return 4; }
    siginfo_t si;
    waitid(P_PID, b, &si, WEXITED);     /* waitid */
    pid_t c = fork();
    if (c == 0) return 9;
    waitpid(c, &st, 0);
    return WIFSIGNALED(st) ? 1 : 7;
}
"""


@pytest.mark.parametrize("engine", ["qemu", "ptrace"])
def test_info_says_a_child_a_signal_killed_was_killed(tmp_path, engine):
    """A forked child that died of a signal: QEMU logs no exit for it, and
    its sideband exit said ``status 0`` (``info``: "exit status 0").  Its
    parent's wait (wait4, waitid) saw how it ended: that is its status."""
    from conftest import build_programs
    progs = build_programs(tmp_path, {"reap": REAP_C})
    b = tmp_path / "b"
    r = run_hwtrace("record", "--engine", engine, "-o", b, "--", progs["reap"])
    assert r.returncode == 7, r.stderr
    d = json.loads(run_hwtrace("info", b, "--json", check=True).stdout)
    assert sorted(p["exit_status"] for p in d["processes"]) == [-11, -6, 7, 9]
    text = run_hwtrace("info", b, check=True).stdout
    assert text.count("killed by SIGSEGV") == 1 and "killed by SIGABRT" in text, text


def test_a_stream_file_cut_short_is_named_by_info_and_the_views(tmp_path):
    """A stream file cut in half after recording: ``info`` said "complete"
    and "nothing lost", and the views refused it as "not a regular file of
    N bytes" (it is one, of fewer bytes)."""
    b = tmp_path / "b"
    run_hwtrace("record", "--mode", "thread", "-o", b, "--", "/bin/true", check=True)
    m = json.loads((b / "manifest.json").read_text())
    s = m["streams"][0]
    os.truncate(b / s["file"], s["size"] // 2)
    text = run_hwtrace("info", b, check=True).stdout
    assert "1 stream file(s) not as recorded (the views refuse them)" in text, text
    line = next(x for x in text.splitlines() if x.startswith(f"  {s['file']} "))
    assert line.endswith(f"the file has {s['size'] // 2:,} bytes, the manifest says "
                         f"{s['size']:,}"), line
    d = json.loads(run_hwtrace("info", b, "--json", check=True).stdout)
    assert d["streams"][0]["file_size"] == s["size"] // 2
    for cmd in ("summary", "calls", "decode"):
        r = run_hwtrace(cmd, b)
        assert r.returncode == 2 and r.stdout == "", (cmd, r.stdout[-300:])
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"stream {s['file']}: {s['size'] // 2} bytes, manifest says {s['size']}" \
            in r.stderr, r.stderr
    (b / s["file"]).unlink()
    line = next(x for x in run_hwtrace("info", b, check=True).stdout.splitlines()
                if x.startswith(f"  {s['file']} "))
    assert line.endswith("the file is missing"), line


def test_a_deleted_sideband_is_named(tmp_path):
    """With its sideband.jsonl deleted a bundle decodes to nothing but
    "no memory mapped" errors; ``info`` said "processes: 0" and the views
    only that.  Both now name the missing file."""
    b = tmp_path / "b"
    run_hwtrace("record", "--mode", "thread", "-o", b, "--", "/bin/true", check=True)
    (b / "sideband.jsonl").unlink()
    text = run_hwtrace("info", b, check=True).stdout
    assert "; the sideband (sideband.jsonl) is missing" in text, text
    assert json.loads(run_hwtrace("info", b, "--json", check=True).stdout)[
        "sideband_missing"] == "sideband.jsonl"
    for cmd in ("summary", "decode"):
        r = run_hwtrace(cmd, b)
        assert "Traceback" not in r.stderr
        assert r.stderr.startswith(f"hwtrace: warning: {b}: its sideband (sideband.jsonl) "
                                   "is missing: "), (cmd, r.stderr)
    (b / "sideband.jsonl").write_text("")
    for cmd in ("info", "summary"):
        assert "sideband" not in run_hwtrace(cmd, b).stderr


def test_anonymous_memory_is_not_a_missing_file(tmp_path):
    """perf's maps of anonymous memory ("//anon", "[stack]") were listed as
    missing files, with the advice to give --image-path copies of them."""
    b = tmp_path / "b"
    run_hwtrace("record", "--mode", "thread", "-o", b, "--", "/bin/true", check=True)
    pid = json.loads((b / "sideband.jsonl").read_text().splitlines()[0])["pid"]
    with open(b / "sideband.jsonl", "a") as f:
        for k, name in enumerate(("//anon", "[stack]", "[heap]")):
            f.write(json.dumps({"type": "mmap", "pid": pid, "start": 0x7000_0000 + k * 4096,
                                "size": 4096, "offset": 0, "file": name}) + "\n")
    text = run_hwtrace("info", b, check=True).stdout
    assert "  and anonymous memory: //anon, [heap], [stack] (code run there can't be " \
        "decoded)\n" in text, text
    assert "missing: //anon" not in text and ", 0 missing\n" in text, text


def test_info_describes_an_imported_perf_capture(tmp_path, hardware):
    """A real capture: no instruction counts (hardware counts none), the
    process as perf saw it (comm and exe), the files it mapped (none here)."""
    out = tmp_path / "b"
    run_hwtrace("import", hardware / "perf_data_converter" / "perf.data.intel_pt-4.14",
                "-o", out, check=True)
    r = run_hwtrace("info", out)
    assert r.returncode == 0, r.stderr
    assert "engine:     perf" in r.stdout and "insns observed" not in r.stdout
    assert "traced:     user and kernel" in r.stdout
    assert "/usr/bin/coreutils (echo)  [exited]" in r.stdout
    lines = r.stdout.splitlines()
    missing = [x for x in lines if x.startswith("  missing: ")]
    assert len(missing) == 12 and "/usr/bin/coreutils" in r.stdout.split("... and")[0]
    assert any(x.startswith("  ... and ") for x in lines)


def test_info_bundle_errors_are_one_line(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{")
    (tmp_path / "empty").mkdir()
    for arg, what in ((tmp_path / "nope", "no such bundle"),
                      (tmp_path / "f", "not a trace bundle directory"),
                      (tmp_path / "empty", "no manifest.json"),
                      (tmp_path / "bad", "not JSON")):
        r = run_hwtrace("info", arg)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert what in r.stderr and "Traceback" not in r.stderr
    r = run_hwtrace("info", tmp_path / "bad", "--engine", "qemu")
    assert r.returncode == 2 and "--engine describes this machine" in r.stderr
