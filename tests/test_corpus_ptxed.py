"""System test: the 430 ptxed variants of libipt's corpus, each with the
instruction decoder and with the block decoder (as libipt's own suite runs
them), compared with their ``-ptxed*.exp`` under ``diff -ub`` rules.

Variants listed in ``ptxed_known_failures.txt`` are expected to fail
(strict xfail: a fix makes the test fail until the line is removed).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ptxed_corpus import normalize, ptxed_variants, run_variant, variant_id

HERE = Path(__file__).resolve().parent


def _known_failures() -> dict:
    known = {}
    for line in (HERE / "ptxed_known_failures.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        known[name] = reason.strip()
    return known


KNOWN = _known_failures()
VARIANTS = [(variant_id(v), d, v) for d, v, _ in ptxed_variants()]


def _params():
    out = []
    for vid, d, v in VARIANTS:
        for decoder in ("insn", "block"):
            reason = KNOWN.get(f"{vid}@{decoder}", KNOWN.get(vid))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] \
                if reason is not None else []
            out.append(pytest.param(d, v, decoder, id=f"{vid}-{decoder}",
                                    marks=marks))
    return out


def test_corpus_is_complete(corpus):
    assert len(VARIANTS) == 430
    ids = {vid for vid, _, _ in VARIANTS}
    stale = {k.partition("@")[0] for k in KNOWN} - ids
    assert not stale, f"known failures that are not variants: {stale}"


@pytest.mark.parametrize("d,v,decoder", _params())
def test_ptxed_variant(d, v, decoder, corpus):
    ok, got, err = run_variant(d, v, decoder)
    if not ok:
        exp = (d / v["exp"]["ptxed"]).read_text()
        import difflib
        diff = "\n".join(difflib.unified_diff(
            normalize(exp), normalize(got), "expected", "hwtrace",
            lineterm="", n=2))
        pytest.fail(f"output differs:\n{diff}\n{err}")


@pytest.mark.slow
def test_report_pass_count(corpus, capsys):
    """Not a check: prints how many variants pass per decoder."""
    counts = {}
    for decoder in ("insn", "block"):
        counts[decoder] = sum(run_variant(d, v, decoder)[0]
                              for _, d, v in VARIANTS)
    with capsys.disabled():
        print(f"\nptxed corpus: insn {counts['insn']}/430, "
              f"block {counts['block']}/430")
