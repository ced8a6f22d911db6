"""Differential tests of the flow decoder against the reference decoder.

* the corpus against the stored output of ``ptoracle insn`` over libipt
  2.3 (``<variant>.insn.jsonl``);
* the corpus against a live ``ptoracle insn`` over Debian's libipt 2.0.5,
  where that library implements what the variant needs (where its output
  differs from 2.3's, 2.0.5 lacks the feature: CFE/EVD/TRIG packets,
  event-trace events, resync, newer errata and event orders);
* a real program recorded by the emulated engine, and seeded mutations of
  that recording, against a live ``ptoracle insn`` (our decoder set to
  report errors at libipt 2.0's offsets, ``--error-offsets 2.0``: 2.3
  reports them where its event decoder stands, one event further), with
  the emulator's CPU and with CPUs whose errata workarounds are on.

test_flow_errata_oracle.py compares time stamps (SKL168) and
test_flow_lossless.py the PSB+ patterns of VM entries.

What must agree: the instruction IPs and the error offsets, in order;
against the stored 2.3 output, the whole JSON (events, statuses, offsets)
except for the variants in ``oracle_json_known_differences.txt``.
"""

from __future__ import annotations

import json
import random
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import IN_CI, record_static_program, run_hwtrace
from oracle_corpus import (essentials, load_expected, oracle_variants, run,
                           variant_id)

HERE = Path(__file__).resolve().parent

# Variants whose instruction/error sequence does not match libipt 2.3 yet
# (event trace, resync details, MODE.EXEC+FUP); see ptxed_known_failures.txt.
KNOWN_23 = {
    line.split()[0] for line in
    (HERE / "oracle_known_failures.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")}

# Variants whose whole JSON output is not identical to 2.3's yet.
KNOWN_JSON = {
    line.split()[0] for line in
    (HERE / "oracle_json_known_differences.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")}

VARIANTS = [(variant_id(v), d, v) for d, v in oracle_variants()]

ERRATA_CPUS = ("6/78", "6/61", "6/92", "6/85")


@pytest.mark.parametrize(
    "d,v", [pytest.param(d, v, id=vid, marks=[pytest.mark.xfail(
        strict=True, reason="known difference")] if vid in KNOWN_23 else [])
        for vid, d, v in VARIANTS])
def test_corpus_matches_libipt_2_3(d, v, corpus):
    got, exp = run(d, v), load_expected(d, v)
    assert essentials(got) == essentials(exp)
    # Beyond the essentials: events, statuses and their offsets too.
    if variant_id(v) in KNOWN_JSON:
        assert got != exp, "identical now: remove it from " \
            "oracle_json_known_differences.txt"
    else:
        assert got == exp


def _oracle_args(d: Path, v: dict) -> list[str]:
    words = shlex.split(v["oracle_insn"]["cmd"])[1:]
    args, prev = [], None
    for w in words:
        if prev in ("--raw", "--elf") or w.endswith(".pt"):
            w = str(d / w)
        args.append(w)
        prev = w
    return args


def test_corpus_matches_live_ptoracle(ptoracle, corpus):
    """Where libipt 2.0.5 decodes a variant like 2.3 does, so do we."""
    compared, differ = 0, []
    for vid, d, v in VARIANTS:
        r = subprocess.run([str(ptoracle), *_oracle_args(d, v)],
                           capture_output=True, text=True)
        old = essentials([json.loads(x) for x in r.stdout.splitlines()
                          if x.strip()])
        if old != essentials(load_expected(d, v)):
            continue            # 2.0.5 lacks what this variant tests
        compared += 1
        if essentials(run(d, v)) != old and vid not in KNOWN_23:
            differ.append(vid)
    assert compared > 300
    assert differ == []


_PROGRAM = r"""
static int collatz(long n) { int k = 0; while (n != 1) { n = n & 1 ? 3 * n + 1 : n / 2; k++; } return k; }
int main(void) { long s = 0; for (long i = 1; i < 300; i++) s += collatz(i); return (int) (s & 1); }
"""


def _record(tmp_path: Path) -> Path | None:
    return record_static_program(tmp_path, _PROGRAM)


def _decode_both(ptoracle, pt, args, items: bool = False):
    o = subprocess.run([str(ptoracle), "insn", str(pt), *args],
                       capture_output=True, text=True).stdout
    # error offsets as libipt 2.0 reports them (2.3's event decoder stands
    # one event further ahead: the corpus tests that default)
    h = run_hwtrace("decode", "--pt", pt, *args, "--format", "jsonl",
                    "--insn-decoder", "--error-offsets", "2.0")
    assert h.returncode == 0 and h.stderr == ""
    old = [json.loads(x) for x in o.splitlines()]
    new = [json.loads(x) for x in h.stdout.splitlines()]
    return (old, new) if items else (essentials(old), essentials(new))


def _mutation_matches(ptoracle, m: Path, args) -> str | None:
    """A mutated trace decoded by both, compared as the ``libiptdiff`` fuzz
    target compares them: a random byte can make what libipt 2.0.5 reads
    otherwise by design (an event left pending across a PSB, which 2.1+
    and hwtrace stop at and 2.0.5 carries on; the "Lossless by default"
    readings; an endless loop without trace), so the comparison ends at the
    first such item (fuzz/libiptdiff.py's named rules).  None if they
    agree, else where not."""
    sys.path.insert(0, str(HERE.parent / "fuzz"))
    try:
        import libiptdiff
    finally:
        sys.path.pop(0)
    trace = m.read_bytes()
    old, new = _decode_both(ptoracle, m, args, items=True)
    cut = next((i for i, it in enumerate(new)
                if libiptdiff._lossless(it, trace) or libiptdiff._traceless_loop(it)
                or libiptdiff._partial_event_at_psb(it, trace)), None)
    if cut is not None:
        new = new[:cut]
    try:
        libiptdiff.compare(essentials(old), cut is not None, essentials(new),
                           cut is not None, trace)
    except libiptdiff.Violation as e:
        return str(e)
    return None


def test_emulated_recording_and_mutations_match_ptoracle(ptoracle, tmp_path):
    bundle = _record(tmp_path)
    if bundle is None:
        if IN_CI:
            pytest.fail("the emulated engine could not record gzip")
        pytest.skip("emulated engine unavailable")
    manifest = json.loads((bundle / "manifest.json").read_text())
    stream = max(manifest["streams"], key=lambda s: s["size"])["file"]
    r = run_hwtrace("images", "--pt", stream, bundle)
    cpu = manifest["cpu"]
    args = r.stdout.split() + ["--cpu", f"{cpu['family']}/{cpu['model']}"]
    pt = bundle / stream
    old, new = _decode_both(ptoracle, pt, args)
    assert len(new) > 10000 and new == old
    # the same through the bundle (images and parameters from it)
    r = run_hwtrace("decode", bundle, "--stream", stream, "--quiet",
                    "--stat:insn", "--insn-decoder")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [f"[stream", f"{stream}]", "insn:",
                                f"{sum(1 for k, _ in old if k == 'insn')}."]
    # CPUs whose errata libipt works around (BDM70 and SKL168 on 6/78,
    # BDM64 on 6/61, APL11/APL12 on 6/92, SKZ84 on 6/85), not only the
    # emulator's
    images = args[:-2]
    for other in ERRATA_CPUS:
        old, new = _decode_both(ptoracle, pt, images + ["--cpu", other])
        assert len(new) > 10000 and new == old, other
    data = pt.read_bytes()
    for seed in range(6):
        rnd = random.Random(seed)
        buf = bytearray(data)
        for _ in range(1 + seed % 4):
            buf[rnd.randrange(len(buf))] = rnd.randrange(256)
        m = tmp_path / f"m{seed}.pt"
        m.write_bytes(bytes(buf))
        for a in (args, images + ["--cpu", ERRATA_CPUS[seed % 4]]):
            why = _mutation_matches(ptoracle, m, a)
            assert why is None, f"seed {seed} {a[-1]}: {why}"
