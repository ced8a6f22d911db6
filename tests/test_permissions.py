"""Tracing without the privilege to: a clear one-line error that names the
setting or capability that stops it, the target left running (not
stopped, not traced), nothing escalated.

Unprivileged runs drop to uid/gid 65534 (nobody) inside a child Python
after importing what they need (nobody can't read root's interpreter
tree); the stepper binary is copied where nobody may run it.  Nothing here
changes a system setting.  Covered elsewhere already: the stepper binary
and ``hwtrace branches --attach`` as nobody (test_stepper.py,
test_branches_live.py), the perf engine's refusals at each paranoid level
with fake /proc (test_perf_engine.py).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hwtrace.engines.perf import pmu

NOBODY = 65534
YAMA = Path("/proc/sys/kernel/yama/ptrace_scope")

DROP = r"""
import importlib, os, pkgutil, sys
import hwtrace
from hwtrace.cli import build_parser, main
for pkg in ("hwtrace.control", "hwtrace.engines", "hwtrace.engines.emulated",
            "hwtrace.engines.perf", "hwtrace.cli"):
    m = importlib.import_module(pkg)
    for i in pkgutil.iter_modules(m.__path__):
        importlib.import_module(f"{pkg}.{i.name}")
hwtrace.open_device
import json, mmap, select, selectors, shlex, signal, subprocess, tempfile  # noqa
build_parser()
os.setgroups([])
os.setgid(%(uid)d)
os.setuid(%(uid)d)
sys.exit(main(sys.argv[1:]))
"""


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    return fields["State"].split()[0] + " tracer=" + fields["TracerPid"]


def _stepper_cache(tmp_path: Path) -> Path:
    """An XDG cache dir holding the built stepper, usable by nobody."""
    from hwtrace.engines.emulated import stepper
    exe = stepper.stepper_path()
    cache = tmp_path / "cache"
    (cache / "hwtrace").mkdir(parents=True)
    shutil.copy(exe, cache / "hwtrace" / exe.name)
    for p in (tmp_path, cache, cache / "hwtrace", cache / "hwtrace" / exe.name):
        os.chmod(p, 0o755 if p.is_dir() or p.name == exe.name else 0o644)
    return cache


def _run_as(uid: int, argv: list[str], tmp_path: Path, cache: Path):
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), HOME=str(tmp_path))
    return subprocess.run([sys.executable, "-c", DROP % {"uid": uid}, *argv],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=env)


@pytest.fixture
def root_only():
    if os.geteuid() != 0:
        pytest.skip("needs root to run hwtrace as another (unprivileged) user")


@pytest.fixture
def pub():
    """A scratch directory nobody can reach (pytest's tmp_path is under a
    0700 directory of root's)."""
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="hwtrace-perm-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_record_attach_to_another_users_process(root_only, pub):
    """``hwtrace record --engine ptrace --pid`` as nobody on root's process:
    exit 2, one line naming the uid rule and CAP_SYS_PTRACE; the process is
    left running, untraced; no bundle is written."""
    tmp_path = pub
    cache = _stepper_cache(tmp_path)
    out = tmp_path / "out"
    os.chmod(tmp_path, 0o777)
    victim = subprocess.Popen(["sleep", "60"])
    try:
        r = _run_as(NOBODY, ["record", "--engine", "ptrace", "--pid", str(victim.pid),
                             "-o", str(out)], tmp_path, cache)
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
        assert f"cannot trace pid {victim.pid}" in r.stderr
        assert "uid 0" in r.stderr and "CAP_SYS_PTRACE" in r.stderr
        assert victim.poll() is None
        assert _state(victim.pid) in ("S tracer=0", "R tracer=0")
        assert not (out / "manifest.json").exists()
    finally:
        victim.kill()
        victim.wait()


def test_stepper_is_not_setuid(tmp_path):
    """Nothing escalates: the stepper hwtrace builds and runs carries no
    set-user/group-id bit and is owned by whoever built it."""
    from hwtrace.engines.emulated import stepper
    st = os.stat(stepper.stepper_path())
    assert st.st_mode & (stat.S_ISUID | stat.S_ISGID) == 0
    assert st.st_uid == os.geteuid()


def test_yama_ptrace_scope_is_named(root_only, pub):
    """With Yama restricting ptrace to descendants (ptrace_scope >= 1),
    attaching to a same-user non-child names the setting and its value."""
    tmp_path = pub
    if not YAMA.exists():
        pytest.skip(f"{YAMA} absent: this kernel has no Yama LSM, so only the "
                    "uid rule applies (tested above)")
    scope = int(YAMA.read_text())
    if scope == 0:
        pytest.skip("kernel.yama.ptrace_scope is 0 here (not changed by tests)")
    cache = _stepper_cache(tmp_path)
    os.chmod(tmp_path, 0o777)
    victim = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                               "--clear-groups", "sleep", "60"])
    try:
        r = _run_as(NOBODY, ["record", "--engine", "ptrace", "--pid", str(victim.pid),
                             "-o", str(tmp_path / "out")], tmp_path, cache)
        assert r.returncode == 2, r.stderr
        assert "ptrace_scope" in r.stderr and "Traceback" not in r.stderr
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def _fake_pmu(root: Path) -> Path:
    sysfs = root / "sys"
    d = sysfs / pmu.PMU_DIR
    d.mkdir(parents=True)
    (d / "type").write_text("8\n")
    return sysfs


def test_perf_probe_as_nobody_names_paranoid_and_cap_perfmon(root_only, pub):
    """The perf engine's probe run as nobody against this machine's real
    /proc (its real perf_event_paranoid, nobody's real CapEff = 0) and a
    fake intel_pt PMU: the verdict names the setting and the capability."""
    tmp_path = pub
    sysfs = _fake_pmu(tmp_path)
    os.chmod(tmp_path, 0o755)
    paranoid = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
    code = (f"import os, sys; from hwtrace.engines.perf import pmu\n"
            f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
            f"ok, why = pmu.probe(sysfs={str(sysfs)!r}); print(ok); print(why)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    ok, why = r.stdout.splitlines()
    assert f"perf_event_paranoid is {paranoid}" in why or paranoid <= 0
    if paranoid > 2:
        assert ok == "False" and "CAP_PERFMON" in why
    elif paranoid >= 1:
        assert ok == "True" and "CAP_PERFMON" in why and "cpu mode needs" in why


@pytest.mark.parametrize("paranoid,cap,ok,words", [
    (3, 0, False, ["perf_event_paranoid is 3", "CAP_PERFMON", "kernel.perf_event_paranoid=2"]),
    (3, 1 << pmu.CAP_PERFMON, True, []),
    (2, 0, True, ["perf_event_paranoid is 2", "thread mode and user space only", "CAP_PERFMON"]),
    (1, 0, True, ["perf_event_paranoid is 1", "thread mode only", "CAP_PERFMON"]),
    (-1, 0, True, []),
])
def test_perf_probe_verdicts(tmp_path, paranoid, cap, ok, words):
    sysfs = _fake_pmu(tmp_path)
    proc = tmp_path / "proc"
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "self").mkdir()
    (proc / "sys/kernel/perf_event_paranoid").write_text(f"{paranoid}\n")
    (proc / "self/status").write_text(f"Name:\tx\nCapEff:\t{cap:016x}\n")
    (proc / "cpuinfo").write_text("vendor_id\t: GenuineIntel\ncpu family\t: 6\n"
                                  "model\t\t: 85\nstepping\t: 4\nflags\t\t: intel_pt\n")
    got_ok, why = pmu.probe(sysfs=sysfs, proc=proc)
    assert got_ok is ok
    for w in words:
        assert w in why
    if not words:
        assert "paranoid" not in why
