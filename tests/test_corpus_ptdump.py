"""System test: ``hwtrace dump`` reproduces Intel's ptdump on every corpus
variant (options from meta.json), compared under ``diff -ub`` rules.

Runs the CLI entry point in-process (one test, 479 variants) to stay fast;
tests/test_dump_cli.py covers the subprocess path."""

from __future__ import annotations

import contextlib
import io
import re
import shlex

from conftest import corpus_variants
from hwtrace.cli import main

_WS = re.compile(r"\s+")


def diff_ub_lines(text: str) -> list[str]:
    """Lines as ``diff -ub`` compares them: runs of blanks are one blank,
    trailing blanks ignored."""
    return [_WS.sub(" ", line).rstrip() for line in text.splitlines()]


def run_dump(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["dump", *args])
    return rc, out.getvalue()


def test_all_variants_match_ptdump(corpus):
    failures = []
    n = 0
    for d, v, _meta in corpus_variants():
        args = ["--cpu", v["cpu"]] if v["cpu"] else []
        args += shlex.split(v["ptdump_opts"]) + [str(d / v["pt"])]
        rc, got = run_dump(args)
        exp = (d / v["exp"]["ptdump"]).read_text()
        n += 1
        if rc != 0 or diff_ub_lines(got) != diff_ub_lines(exp):
            failures.append(" ".join(args))
    assert n == 479
    assert failures == []


def test_diff_ub_rules():
    assert diff_ub_lines("a   b  \n") == diff_ub_lines("a b")
    assert diff_ub_lines("ab") != diff_ub_lines("a b")
