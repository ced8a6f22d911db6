"""End to end on a recorded program: ``hwtrace record`` (the default,
emulated engine) runs fib.c, ``hwtrace export`` turns the bundle into a
timeline whose fib/leaf slices equal the program's call tree, the same in
Chrome JSON, Perfetto and the summary; the timeline opens in speedscope
(screenshot kept in build/test-output/viewer/)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter

import pytest

from conftest import IN_CI, run_hwtrace

from test_export_formats import (FIB_C, fib_leaf_depths, fib_tree_depths,
                                 slices_from_chrome, slices_from_perfetto,
                                 assert_chrome_depths)
from test_viewer_speedscope import (OUT, alert_of, open_in_speedscope,
                                    site, title_of)  # noqa: F401  (site: a fixture)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("gcc missing")
    d = tmp_path_factory.mktemp("rec")
    (d / "fib.c").write_text(FIB_C)
    subprocess.run(["gcc", "-g", "-O0", "-fno-inline", "-o", d / "fib", d / "fib.c"],
                   check=True, capture_output=True)
    r = run_hwtrace("record", "--mode", "thread", "-o", d / "bundle", "--", d / "fib",
                    timeout=600)
    if r.returncode != 0:
        if IN_CI:
            pytest.fail(f"hwtrace record failed: {r.stderr.strip()}")
        pytest.skip(f"hwtrace record not usable here: {r.stderr.strip()}")
    return d


def test_recorded_fib_call_tree(recorded, tmp_path):
    cj, pf = tmp_path / "t.json", tmp_path / "t.pftrace"
    r = run_hwtrace("export", recorded / "bundle", "--chrome", cj, "--perfetto", pf)
    assert r.returncode == 0, r.stderr
    ev = json.loads(cj.read_text())["traceEvents"]
    xs = [e for e in ev if e["ph"] == "X"]
    names = Counter(e["name"] for e in xs)
    assert names["fib"] == 177 and names["leaf"] == 90 and names["main"] == 1
    sl = slices_from_chrome(ev)
    main_depth = next(d for n, d in sl if n == "main")
    fib = Counter(d - main_depth for n, d in sl if n == "fib")
    assert fib == fib_tree_depths(10)
    leaf = Counter(d - main_depth for n, d in sl if n == "leaf")
    want = Counter({1: 1})
    for d, k in fib_leaf_depths(10).items():
        want[d + 1] += k
    assert leaf == want
    # no loss in this recording: no gaps, nothing unwound or cut short
    assert [e for e in ev if e["ph"] == "i"] == []
    main = next(e for e in xs if e["name"] == "main")
    assert "flags" not in main.get("args", {})
    slices, _, instants = slices_from_perfetto(pf.read_bytes())
    assert Counter(s[0] for s in slices) == names
    assert_chrome_depths(slices, ev)
    assert instants == []


def test_recorded_fib_summary(recorded):
    r = run_hwtrace("summary", recorded / "bundle", "--sort", "calls", "--top", "500")
    assert r.returncode == 0, r.stderr
    rows = {l.split()[0]: l.split() for l in r.stdout.splitlines()[4:] if l.strip()}
    assert rows["fib"][1] == "177" and rows["leaf"][1] == "90" and rows["main"][1] == "1"
    assert "lost data / errors: none" in r.stdout



def test_recorded_fib_opens_in_speedscope(recorded, site):
    root = site[0]
    r = run_hwtrace("export", recorded / "bundle", "--chrome", root / "recorded.json")
    assert r.returncode == 0, r.stderr
    dom = open_in_speedscope(site, "recorded.json", "fib, recorded")
    assert alert_of(dom) is None
    assert title_of(dom) == "fib, recorded - speedscope"
    OUT.mkdir(parents=True, exist_ok=True)
    open_in_speedscope(site, "recorded.json", "fib, recorded",
                       shot=OUT / "fib-recorded-time-order.png")
    open_in_speedscope(site, "recorded.json", "fib, recorded",
                       shot=OUT / "fib-recorded-left-heavy.png", view="left-heavy")
