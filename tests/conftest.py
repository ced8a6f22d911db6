"""Shared test fixtures: where ../shared is, the reference oracle, the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
CORPUS = SHARED / "corpus" / "libipt"
FIXTURES = SHARED / "fixtures" / "hardware"
BUILD = REPO / "build"
IN_CI = os.environ.get("CI") == "true"


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
    src = SHARED / "oracle" / "ptoracle.c"
    if not exe.exists() and src.exists():
        BUILD.mkdir(exist_ok=True)
        r = subprocess.run(["sh", str(SHARED / "oracle" / "build.sh"), str(exe)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            _need("ptoracle", r.stderr.strip().splitlines()[-1] if r.stderr else "build failed")
    if not exe.exists():
        _need("ptoracle", "run scripts/install.sh")
    return exe


@pytest.fixture(scope="session")
def corpus() -> Path:
    if not CORPUS.is_dir():
        _need("corpus", f"{CORPUS} not found")
    return CORPUS


def run_hwtrace(*args, input=None, check=False, timeout=600, env=None, cwd=None):
    """Run the CLI as a user would (python -m hwtrace) and capture its output."""
    e = dict(os.environ)
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-m", "hwtrace", *map(str, args)],
                          input=input, capture_output=True, text=True,
                          check=check, timeout=timeout, env=e, cwd=cwd)


@pytest.fixture
def hwtrace_cli():
    return run_hwtrace


def have(tool: str) -> bool:
    return shutil.which(tool) is not None
