"""Shared test fixtures: where ../shared is, the reference oracle, the CLI.

**The shared material** (``../shared`` beside the clone, or
``HWTRACE_SHARED=DIR``): Intel's decoder test suite (``corpus/libipt``),
real hardware captures (``fixtures/hardware``) and the reference oracle's
source (``oracle/ptoracle.c``).  A test that needs one of them asks for it
by fixture -- ``corpus``, ``hardware`` (both the directory) or ``ptoracle``
(the built oracle) -- or with ``@pytest.mark.usefixtures(...)``.  Where it
is missing, the run says so once, before the first test, and those tests
are skipped with one reason each; under ``CI=true`` they fail instead (CI
installs everything, so absence is a bug).  Everything else a test needs
that can be made on the spot (recordings, synthetic traces, text to
compress) it makes itself.

**Slow tests** (``@pytest.mark.slow``: exhaustive and long system runs)
run only with ``HWTRACE_SLOW=1``, which ``.ci/run`` sets; without it they
are skipped and the run says how to turn them on.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("HWTRACE_SHARED") or REPO.parent / "shared").absolute()
CORPUS = SHARED / "corpus" / "libipt"
FIXTURES = SHARED / "fixtures" / "hardware"
ORACLE_SRC = SHARED / "oracle" / "ptoracle.c"
BUILD = REPO / "build"
IN_CI = os.environ.get("CI") == "true"
SLOW = os.environ.get("HWTRACE_SLOW", "").strip().lower() not in (
    "", "0", "no", "false", "off")

#: fixture name -> (path, what it is) for the material in ../shared
MATERIAL = {
    "corpus": (CORPUS, "Intel's decoder test suite"),
    "hardware": (FIXTURES, "real Intel PT hardware captures"),
}


def _missing_material() -> dict[str, str]:
    """fixture name -> skip reason, for what is missing here.  ``ptoracle``
    is missing when it is neither built nor buildable from ../shared."""
    out = {name: f"needs {path} ({what}): not found; see the note at the "
                 f"top of the run"
           for name, (path, what) in MATERIAL.items() if not path.is_dir()}
    if not (BUILD / "ptoracle").exists() and not ORACLE_SRC.exists():
        out["ptoracle"] = (f"needs the reference oracle: build/ptoracle is not "
                           f"built and {ORACLE_SRC} is not there to build it")
    return out


MISSING = _missing_material()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: long, exhaustive runs: only with HWTRACE_SLOW=1 "
        "(CI sets it)")


@pytest.hookimpl(trylast=True)        # after -k/-m deselection
def pytest_collection_modifyitems(config, items):
    need = {name: 0 for name in MISSING}
    anyone = slow = 0
    for item in items:
        uses = [n for n in MISSING if n in getattr(item, "fixturenames", ())]
        for name in uses:
            need[name] += 1
        anyone += bool(uses)
        if not SLOW and item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.skip(
                reason="slow: run with HWTRACE_SLOW=1 (CI does)"))
            slow += 1
    config._hwtrace_notes = _notes(need, anyone, slow)


#: what each missing piece is called in the note
_LABEL = {"corpus": "corpus/libipt", "hardware": "fixtures/hardware",
          "ptoracle": "the oracle"}


def _notes(need: dict, anyone: int, slow: int) -> list[str]:
    lines = []
    if anyone:
        where = (f"HWTRACE_SHARED={SHARED}" if os.environ.get("HWTRACE_SHARED")
                 else f"../shared, looked for {SHARED}")
        what = ", ".join(f"{_LABEL[k]}: {v}" for k, v in need.items() if v)
        verdict = "FAIL (CI=true)" if IN_CI else "are skipped"
        lines += [
            f"hwtrace: the shared material is missing ({where}): {anyone} "
            f"tests that need it {verdict} ({what}).",
            "hwtrace: to run them, put the project's shared directory "
            "(corpus/libipt: Intel's libipt test suite compiled with pttc; "
            "fixtures/hardware: real Intel PT captures; oracle/ptoracle.c: "
            "the libipt-based oracle) beside this clone as ../shared, or set "
            "HWTRACE_SHARED=DIR; then bash scripts/install.sh builds the oracle.",
        ]
    if slow:
        lines.append(f"hwtrace: {slow} slow test{'s' * (slow > 1)} skipped: "
                     f"HWTRACE_SLOW=1 runs {'them' if slow > 1 else 'it'} "
                     f"too (CI does).")
    return lines


def pytest_collection_finish(session):
    notes = getattr(session.config, "_hwtrace_notes", [])
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if notes and tr is not None:
        tr.write_line("")
        for line in notes:
            tr.write_line(line, yellow=True, bold=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for line in getattr(config, "_hwtrace_notes", []):
        terminalreporter.write_line(line, yellow=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before any skip mark (an empty parameter list over a missing corpus
    is one): the material a test asks for by fixture is there, or the test
    is skipped (failed in CI) saying what is missing."""
    for name, why in MISSING.items():
        if name in item.fixturenames:
            _need(name, why)


def corpus_variants(kind: str | None = None):
    """Yield (test_dir, variant_dict, meta_dict) for every corpus variant.

    kind: None for all, "ptxed" for those with an expected ptxed output.
    """
    if not CORPUS.is_dir():
        return
    for d in sorted(CORPUS.iterdir()):
        meta_path = d / "meta.json"
        if not meta_path.is_file():
            continue
        meta = json.loads(meta_path.read_text())
        for v in meta["variants"]:
            if kind == "ptxed" and not v.get("ptxed_exp"):
                continue
            yield d, v, meta


def _need(what: str, why: str):
    """Skip locally, fail in CI: CI installs everything, so absence is a bug."""
    if IN_CI:
        pytest.fail(f"{what} missing in CI: {why}")
    pytest.skip(f"{what} unavailable: {why}")


@pytest.fixture(scope="session")
def ptoracle() -> Path:
    """Path to the reference oracle built against Debian's libipt."""
    exe = BUILD / "ptoracle"
    if not exe.exists() and ORACLE_SRC.exists():
        BUILD.mkdir(exist_ok=True)
        r = subprocess.run(["sh", str(SHARED / "oracle" / "build.sh"), str(exe)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            _need("ptoracle", r.stderr.strip().splitlines()[-1] if r.stderr else "build failed")
    if not exe.exists():
        _need("ptoracle", MISSING.get("ptoracle", "run scripts/install.sh"))
    return exe


@pytest.fixture(scope="session")
def corpus() -> Path:
    """../shared/corpus/libipt (Intel's decoder test suite)."""
    if not CORPUS.is_dir():
        _need("corpus", MISSING["corpus"])
    return CORPUS


@pytest.fixture(scope="session")
def hardware() -> Path:
    """../shared/fixtures/hardware (real Intel PT captures)."""
    if not FIXTURES.is_dir():
        _need("hardware", MISSING["hardware"])
    return FIXTURES


def sample_text(size: int, seed: int = 18) -> bytes:
    """``size`` bytes of text-like input for recorded workloads (gzip and
    the like): the same in every run, and made here, not read from
    ../shared.  Lines of words from a small vocabulary (so it compresses
    like text) and numbers."""
    rnd = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    words = ["".join(rnd.choice(letters[:12 + k % 14])
                     for _ in range(2 + k % 9)) for k in range(300)]
    out = bytearray()
    while len(out) < size:
        line = " ".join(rnd.choice(words) if rnd.random() < 0.85
                        else f"{rnd.randrange(1 << 16):#x}"
                        for _ in range(rnd.randint(2, 12)))
        out += line.encode() + b"\n"
    return bytes(out[:size])


#: a C program that forks a child which execs ``argv[1]``, waits for it,
#: and exits with ``argv[2]`` (default 0): a recording with two processes,
#: one of which runs a second program
FORK_EXEC_C = r"""
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    pid_t pid = fork();
    if (pid == 0) {
        execl(argv[1], argv[1], (char *)0);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    return argc > 2 ? atoi(argv[2]) : 0;
}
"""


def build_programs(directory: Path, sources: dict, *libs: str) -> dict:
    """Compile each of ``sources`` ({name: C source, dedented here}) with
    ``gcc -O1`` (then ``libs``) into ``directory``: {name: executable}."""
    out = {}
    for name, src in sources.items():
        c = directory / f"{name}.c"
        c.write_text(textwrap.dedent(src))
        exe = directory / name
        subprocess.run(["gcc", "-O1", "-o", str(exe), str(c), *libs], check=True)
        out[name] = exe
    return out


def compiled_flow_core():
    """The compiled flow core (``fast.STATUS``'s module), also where
    HWTRACE_NO_EXTENSIONS=1 selected the Python twin, for tests about the
    core; skips the test where it can't be loaded."""
    from hwtrace import _ext
    from hwtrace.flow import fast
    if fast.STATUS.module is not None:
        return fast.STATUS.module
    probe = _ext.probe(fast.NAME, fast.ABI)
    if probe.module is None:
        pytest.skip(f"compiled flow core unavailable: {probe.reason}")
    return probe.module


def jsonl_in_process(argv) -> list[dict]:
    """``hwtrace *argv`` run in this process (no interpreter start-up), its
    output's JSON lines parsed; asserts it exits 0 (its stderr is dropped)."""
    from hwtrace.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == 0
    return [json.loads(x) for x in out.getvalue().splitlines()]


def run_hwtrace(*args, input=None, check=False, timeout=600, env=None, cwd=None):
    """Run the CLI as a user would (python -m hwtrace) and capture its output."""
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-m", "hwtrace", *map(str, args)],
                          input=input, capture_output=True, text=True,
                          check=check, timeout=timeout, env=e, cwd=cwd)


def record_static_program(tmp_path: Path, source: str) -> Path | None:
    """``source`` built with ``gcc -O1 -static`` and recorded with the
    emulated engine (``--copy-images``) into ``tmp_path / "b"``; None if
    gcc or the recording is not usable here."""
    gcc = shutil.which("gcc")
    if not gcc:
        return None
    src = tmp_path / "prog.c"
    src.write_text(source)
    exe = tmp_path / "prog"
    r = subprocess.run([gcc, "-O1", "-static", "-o", str(exe), str(src)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None
    r = run_hwtrace("record", "--copy-images", "-o", tmp_path / "b", "--",
                    exe, timeout=600)
    if r.returncode not in (0, 1):
        return None
    return tmp_path / "b"


@pytest.fixture
def hwtrace_cli():
    return run_hwtrace


def have(tool: str) -> bool:
    return shutil.which(tool) is not None
