"""``hwtrace record --engine ptrace`` specifics: programs that call into the
vDSO (whose bytes no file holds: the bundle keeps a copy as the image of
the sideband's ``[vdso]`` maps) and a large real program, ``ls -la``."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from conftest import run_hwtrace
from test_record import decode_bundle, record

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def _sideband(bundle):
    return [json.loads(x) for x in (bundle / "sideband.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["cpu", "thread"])
def test_vdso_calls_decode(tmp_path, ptoracle, mode):
    b = tmp_path / mode
    r = record(b, "--engine", "ptrace", "--mode", mode, "--", "date", "+%Y")
    assert r.stdout == subprocess.run(["date", "+%Y"], capture_output=True, text=True).stdout
    man = json.loads((b / "manifest.json").read_text())
    vdso = [m for m in _sideband(b) if m["type"] == "mmap" and m["file"] == "[vdso]"]
    assert vdso and all(m["offset"] == 0 for m in vdso)
    (img,) = [i for i in man["images"] if i["path"] == "[vdso]"]
    data = (b / img["file"]).read_bytes()
    assert data[:4] == b"\x7fELF" and len(data) >= vdso[0]["size"]
    assert img["build_id"] == vdso[0]["build_id"] != ""
    # hwtrace images loads the copy (a bundle path) at the [vdso] address
    for s in man["streams"]:
        args = run_hwtrace("images", b, "--pt", s["file"], "--lines").stdout.split()
        assert f"{b / img['file']}:0x0-{vdso[0]['size']:#x}:{vdso[0]['start']:#x}" in args
    man, res = decode_bundle(ptoracle, b, want_ips=True)
    lo, hi = vdso[0]["start"], vdso[0]["start"] + vdso[0]["size"]
    # clock_gettime ran in the vDSO, and decoded there
    assert sum(1 for v in res.values() for ip in v[1] if lo <= ip < hi) > 10
    # the bundle decoders (summary / export) find the vDSO image and its symbols
    r = run_hwtrace("summary", b, "--top", "1000")
    assert r.returncode == 0, r.stderr
    assert "lost data / errors: none" in r.stdout
    assert "__vdso_clock_gettime" in r.stdout
