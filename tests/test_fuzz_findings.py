"""Fuzzing findings, each a named regression test with a minimal
reproducer (issue 9).  Findings fixed in the bundle reader are next to
their fix (test_hostile_bundles.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import run_hwtrace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
import targets  # noqa: E402

# fuzz flow finding f65a1e985977 (60 bytes), as image + trace
IMAGE = bytes.fromhex("90eb02236106")          # at 0x1000
TRACE = bytes.fromhex("001000000001f490f40282028202820282028202820282028299017d"
                      "00100000000002233d05100d")


def test_flow_async_branch_event_without_to_api():
    """Regression: an 'async_branch' reached through this trace was an Event
    without 'to', and AttributeError escaped the decoder."""
    targets.check_flow(targets.flow_input(IMAGE, 0x1000, TRACE))


def test_flow_async_branch_event_without_to_cli(tmp_path):
    """Regression: the same finding through the CLI was a traceback."""
    (tmp_path / "img.bin").write_bytes(IMAGE)
    (tmp_path / "t.pt").write_bytes(TRACE)
    r = run_hwtrace("decode", "--insn-decoder", "--raw", f"{tmp_path / 'img.bin'}:0x1000",
                    "--pt", tmp_path / "t.pt")
    assert "Traceback" not in r.stderr
    assert r.returncode == 0


# -- fuzz flow finding (Hang@block.py:148), seed 11 of the 1,000,000-input
# run: the block decoder followed `jmp $` (e9 fb ff ff ff) forever inside
# one next() without reading trace (end-on-jump off), so no output budget
# ever got control.  libipt ends a block at 0xffff instructions (a uint16_t
# count) and then loops forever block by block; hwtrace ends blocks the
# same way and reports the proven endless loop as an error.
JMP_SELF_INPUT = bytes.fromhex(
    "0500090000000000100000000000e9fbfffffffff490f40282028202820282028202"
    "820282027d00001000000099019921022399225d0600100000000002233d04100110"
    "002d07003d080001")


def _in_subprocess(fn_src: str, timeout: float = 120) -> str:
    """Run a snippet in a child with a deadline: a regression of a hang
    fails the test instead of hanging the suite."""
    import subprocess
    r = subprocess.run([sys.executable, "-c", fn_src], capture_output=True,
                       text=True, timeout=timeout,
                       cwd=str(Path(__file__).resolve().parent.parent / "fuzz"))
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_flow_jmp_self_block_decoder_hang_api():
    """Regression: the fuzz input itself, through the harness, returns."""
    out = _in_subprocess(
        "import targets\n"
        f"targets.check_flow(bytes.fromhex({JMP_SELF_INPUT.hex()!r}))\n"
        "print('done')\n")
    assert out.strip() == "done"


# A clean reproducer: `nop; jmp 0x1000` at 0x1000 (a 2-instruction loop
# that needs no trace), entered by TIP.PGE, while the trace goes on with a
# TNT: the image is not the code that ran (a wrong binary, code patched at
# run time).  libipt decodes on without trace forever: the TNT is only
# read by a query, and no event or end of trace is ahead to stop it.
LOOP_IMAGE = bytes.fromhex("90ebfd")


def _loop_trace() -> bytes:
    from hwtrace.pt import encoder as enc
    return enc.psb() + enc.mode_exec(csl=1) + enc.psbend() + \
        enc.tip_pge(0x1000) + enc.tnt8("tt") + enc.pad() * 4


@pytest.mark.parametrize("decoder", ["block", "insn"])
def test_flow_traceless_loop_at_end_of_trace(tmp_path, decoder):
    """The endless loop is an error past the unused TNT, after the
    instructions it took to prove it (the walk needs no trace, so after
    2**16 of them the decoder watches direct branches: the loop's jmp at
    count 65538 is marked, at 65540 it is reached again).  Same with the
    compiled and the Python cores, in text and counts."""
    trace = _loop_trace()
    (tmp_path / "img.bin").write_bytes(LOOP_IMAGE)
    (tmp_path / "t.pt").write_bytes(trace)
    opts = ["--insn-decoder"] if decoder == "insn" else []
    base = ["decode", *opts, "--raw", f"{tmp_path / 'img.bin'}:0x1000",
            "--pt", tmp_path / "t.pt"]
    # at the end: the query decoder holds the TNT (libipt 2.3's offsets)
    err = f"[{len(trace):x}, 1001: error: endless loop without trace]"
    for env in ({}, {"HWTRACE_NO_EXTENSIONS": "1"}):
        r = run_hwtrace(*base, "--quiet", "--stat", env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        # blocks: 65535 (libipt's limit), then 5 up to the error
        assert r.stdout.splitlines() == [err, "insn: 65540."] + (
            ["blocks:\t2."] if decoder == "block" else [])
    r = run_hwtrace(*base, "--no-inst", timeout=300)
    lines = r.stdout.splitlines()
    assert lines[-1] == err
    assert lines[:-1] == ["[enabled]"] + \
        ["0000000000001000", "0000000000001001"] * 32770


def test_flow_traceless_loop_compiled_core():
    """The compiled flow core must not spin either: it splits the stretch
    without trace at libipt's block limit and finds the endless loop,
    exactly as the Python decoders do."""
    out = _in_subprocess(
        "import sys\n"
        "sys.path.insert(0, %r)\n"
        "from test_fuzz_findings import LOOP_IMAGE, _loop_trace\n"
        "from hwtrace.flow import fast\n"
        "from hwtrace.flow.image import Image\n"
        "if fast.CORE is None:\n"
        "    print('no core'); raise SystemExit\n"
        "img = Image(); img.add_bytes(LOOP_IMAGE, 0x1000)\n"
        "for dec in ('block', 'insn'):\n"
        "    c = fast.count(_loop_trace(), img, None, dec, impl='compiled')\n"
        "    p = fast.count(_loop_trace(), img, None, dec, impl='python')\n"
        "    print(c.compiled, c[:2] == p[:2], c.error_items == p.error_items,"
        " c.error_items[-1][3])\n" % str(Path(__file__).resolve().parent))
    if out.strip() == "no core":
        pytest.skip("compiled flow core not built")
    assert out.split("\n")[:2] == [
        "True True True endless loop without trace"] * 2
