"""The exported timeline opens in a real viewer: speedscope (npm package,
served from 127.0.0.1) in headless Chromium (Debian ``chromium``).

speedscope reports a file it cannot read with ``alert()``; the page we
serve replaces ``window.alert`` with a function that writes the message
into ``<html data-alert=...>``, so ``--dump-dom`` tells pass from fail.
A loaded profile sets the title to ``<title> - speedscope``.  Screenshots
go to ``build/test-output/viewer/`` (kept after the run).

Setup (scripts/install.sh): ``apt-get install -y chromium`` and
``npm install --prefix build/viewer speedscope``; ``HWTRACE_SPEEDSCOPE``
may point at another ``speedscope/dist/release`` directory.
"""

from __future__ import annotations

import functools
import html
import http.server
import io
import os
import re
import shutil
import subprocess
import tempfile
import threading
import urllib.parse
from collections import Counter
from pathlib import Path

import pytest

from conftest import BUILD, FIXTURES, _need, run_hwtrace

from hwtrace.export.chrome import ChromeTraceWriter
from hwtrace.export.folded import FoldedWriter

from test_export_cli import loopy_bundle  # noqa: F401  (a fixture)
from test_export_formats import run_export, real_fib_flow

OUT = BUILD / "test-output" / "viewer"
LOOPY_EXE = FIXTURES / "hase_loopy" / "loopy"
ALERT_HOOK = ('<base href="/speedscope/"><script>window.alert=function(m)'
              '{document.documentElement.setAttribute("data-alert",String(m));};'
              '</script>')


def speedscope_dir() -> Path:
    cands = [os.environ.get("HWTRACE_SPEEDSCOPE", ""),
             str(BUILD / "viewer" / "node_modules" / "speedscope" / "dist" / "release")]
    for c in cands:
        if c and (Path(c) / "index.html").is_file():
            return Path(c)
    _need("speedscope", "npm install --prefix build/viewer speedscope")


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    _need("chromium", "apt-get install -y chromium")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A loopback HTTP server over a directory with speedscope in it."""
    release = speedscope_dir()
    browser = chromium()
    root = tmp_path_factory.mktemp("site")
    (root / "speedscope").symlink_to(release, target_is_directory=True)
    page = (release / "index.html").read_text()
    (root / "viewer.html").write_text(page.replace("<head>", "<head>" + ALERT_HOOK, 1))
    handler = functools.partial(_Quiet, directory=str(root))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield root, f"http://127.0.0.1:{srv.server_address[1]}", browser
    finally:
        srv.shutdown()
        srv.server_close()


def open_in_speedscope(site, name: str, title: str, shot: Path | None = None,
                       view: str | None = None) -> str:
    """Load /<name> in speedscope; returns the DOM (or screenshots it)."""
    root, base, browser = site
    url = (f"{base}/viewer.html#profileURL="
           + urllib.parse.quote(f"{base}/{name}", safe="")
           + f"&title={urllib.parse.quote(title)}")
    if view:
        url += f"&view={view}"
    with tempfile.TemporaryDirectory() as prof:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-quic", "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync",
               f"--user-data-dir={prof}", "--window-size=1400,800",
               "--virtual-time-budget=10000"]
        cmd += [f"--screenshot={shot}"] if shot else ["--dump-dom"]
        r = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=120)
    if shot:
        assert shot.is_file() and shot.stat().st_size > 10000, r.stderr[-500:]
        return ""
    return r.stdout


def alert_of(dom: str) -> str | None:
    m = re.search(r'<html[^>]*data-alert="([^"]*)"', dom)
    return html.unescape(m.group(1)) if m else None


def title_of(dom: str) -> str:
    m = re.search(r"<title>([^<]*)</title>", dom)
    return html.unescape(m.group(1)) if m else ""


@pytest.fixture(scope="module")
def exports(site):
    root = site[0]
    flow = real_fib_flow()
    cj, fo = io.StringIO(), io.StringIO()
    wc = ChromeTraceWriter(cj)
    wf = FoldedWriter(fo, "insns")
    run_export(flow, [wc, wf])
    wc.close()
    wf.close()
    (root / "fib.json").write_text(cj.getvalue())
    (root / "fib.folded").write_text(fo.getvalue())
    (root / "bad.json").write_text('{"traceEvents": [{"ph": "X", ')
    return cj.getvalue(), fo.getvalue()


def test_bad_file_is_reported_by_the_hook(site, exports):
    # the negative control: the pass/fail signal really fires
    dom = open_in_speedscope(site, "bad.json", "bad")
    assert alert_of(dom)


def test_chrome_json_opens_in_speedscope(site, exports):
    dom = open_in_speedscope(site, "fib.json", "fib chrome")
    assert alert_of(dom) is None
    assert title_of(dom) == "fib chrome - speedscope"
    OUT.mkdir(parents=True, exist_ok=True)
    open_in_speedscope(site, "fib.json", "fib chrome", shot=OUT / "fib-chrome-time-order.png")
    open_in_speedscope(site, "fib.json", "fib chrome", shot=OUT / "fib-chrome-left-heavy.png",
                       view="left-heavy")


def test_folded_stacks_open_in_speedscope(site, exports):
    _, folded = exports
    # speedscope is one reader; the format's own counts are another
    weights = Counter()
    for line in folded.splitlines():
        stack, w = line.rsplit(" ", 1)
        weights[stack.split(";")[-1]] += int(w)
    assert set(weights) == {"main", "fib", "leaf"}
    dom = open_in_speedscope(site, "fib.folded", "fib folded")
    assert alert_of(dom) is None
    assert title_of(dom) == "fib folded - speedscope"
    OUT.mkdir(parents=True, exist_ok=True)
    open_in_speedscope(site, "fib.folded", "fib folded", shot=OUT / "fib-folded.png")



def test_real_recording_opens_in_speedscope(site, loopy_bundle):
    """hase's loopy, recorded with Intel PT on a Skylake: exported by the
    CLI (instruction clock: its TSC barely moves) and opened."""
    root = site[0]
    r = run_hwtrace("export", loopy_bundle, "--chrome", root / "loopy.json",
                    "--clock", "insns")
    assert r.returncode == 0, r.stderr
    dom = open_in_speedscope(site, "loopy.json", "loopy (real Intel PT)")
    assert alert_of(dom) is None
    assert title_of(dom) == "loopy (real Intel PT) - speedscope"
    OUT.mkdir(parents=True, exist_ok=True)
    open_in_speedscope(site, "loopy.json", "loopy (real Intel PT)",
                       shot=OUT / "loopy-real-recording.png")


def test_real_recording_timed_by_reference_decoder(site, loopy_bundle, ptoracle):
    """The same recording decoded by libipt (ptoracle insn), whose MTC
    timing moves: exported with the recording's TSC frequency, the
    timeline spans exactly the TSC range of the decoded flow."""
    import json as _json
    from hwtrace.bundle import Bundle

    root = site[0]
    b = Bundle(loopy_bundle)
    m = b.manifest
    flow = root / "loopy.insn.jsonl"
    with open(flow, "w") as f:
        r = subprocess.run([str(ptoracle), "insn", str(b.stream_path(b.streams[0])),
                            "--elf", str(LOOPY_EXE), *b.decoder_args()],
                           stdout=f, stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    items = [_json.loads(l) for l in flow.read_text().splitlines()]
    first_insn = next(i for i, it in enumerate(items) if "iclass" in it)
    t0 = [it["tsc"] for it in items[:first_insn] if "tsc" in it][-1]
    t1 = [it["tsc"] for it in items if "tsc" in it][-1]
    hz = m["tsc_hz"]
    out = root / "loopy-timed.json"
    r = run_hwtrace("export", flow, "--elf", LOOPY_EXE, "--tsc-hz", hz, "--chrome", out)
    assert r.returncode == 0, r.stderr
    doc = _json.loads(out.read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert Counter(e["name"] for e in xs) == Counter({"[syscall]": 7, "_start": 1, "again": 1})
    span = max(e["ts"] + e["dur"] for e in xs) - min(e["ts"] for e in xs)
    assert span == pytest.approx((t1 - t0) * 1e6 / hz, abs=0.002)
    assert doc["otherData"]["clock"] == "ns"
    dom = open_in_speedscope(site, "loopy-timed.json", "loopy, timed")
    assert alert_of(dom) is None
    assert title_of(dom) == "loopy, timed - speedscope"
    OUT.mkdir(parents=True, exist_ok=True)
    open_in_speedscope(site, "loopy-timed.json", "loopy, timed",
                       shot=OUT / "loopy-real-recording-timed.png")

