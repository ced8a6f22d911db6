"""``hwtrace images DIR --pt STREAM``: STREAM is a stream's file name or the
path to it inside DIR (absolute or relative), as a user types it after
``ls DIR``; anything else is one line and exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from conftest import run_hwtrace

pytestmark = pytest.mark.skipif(shutil.which("qemu-x86_64") is None or shutil.which("gcc") is None,
                                reason="needs qemu-user and gcc")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("img")
    (d / "p.c").write_text('#include <stdio.h>\nint main(void) { puts("hi"); return 0; }\n')
    subprocess.run(["gcc", "-O1", "-o", str(d / "p"), str(d / "p.c")], check=True)
    r = run_hwtrace("record", "--mode", "thread", "-o", d / "b", "--", d / "p")
    assert r.returncode == 0, r.stderr
    return d / "b"


def test_stream_by_name_or_by_path_inside_the_bundle(bundle, ptoracle):
    (s,) = json.loads((bundle / "manifest.json").read_text())["streams"]
    want = run_hwtrace("images", bundle, "--pt", s["file"], "--lines")
    assert want.returncode == 0 and "--raw" in want.stdout, want.stderr
    for given, cwd in ((bundle / s["file"], None),                        # absolute
                       (f"{bundle.name}/{s['file']}", bundle.parent),      # relative
                       (f"./{s['file']}", bundle),
                       (f"{bundle.parent}/./{bundle.name}//{s['file']}", None)):
        got = run_hwtrace("images", bundle, "--pt", given, "--lines", cwd=cwd)
        assert got.returncode == 0, (given, got.stderr)
        assert got.stdout == want.stdout
    o = subprocess.run([str(ptoracle), "insn", str(bundle / s["file"]), *want.stdout.split(),
                        "--summary"], capture_output=True, text=True, check=True)
    summary = json.loads(o.stdout.splitlines()[-1])
    assert summary["errors"] == 0 and summary["insns"] == s["instructions_observed"]


def test_a_path_outside_the_bundle_is_one_line(bundle, tmp_path):
    (s,) = json.loads((bundle / "manifest.json").read_text())["streams"]
    copy = tmp_path / s["file"]
    shutil.copyfile(bundle / s["file"], copy)
    for given in (copy, tmp_path / "missing" / s["file"], "nope.pt"):
        r = run_hwtrace("images", bundle, "--pt", given)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "no stream" in r.stderr and s["file"] in r.stderr
