"""Run the libipt corpus's ptxed variants through ``hwtrace decode``
in-process and compare with the expected output under ``diff -ub`` rules.

Shared by tests/test_corpus_ptxed.py and handy from the shell:

    python tests/ptxed_corpus.py [--insn|--block] [NAME-SUBSTRING]
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import CORPUS, corpus_variants  # noqa: E402


def variant_id(v: dict) -> str:
    return Path(v["ptxed_exp"] if "ptxed_exp" in v else
                v["exp"]["ptxed"]).name.removesuffix(".exp")


def ptxed_variants():
    for d, v, meta in corpus_variants():
        exp = v.get("exp", {}).get("ptxed")
        if exp:
            yield d, v, meta


def argv_for(d: Path, v: dict, decoder: str) -> list[str]:
    argv = ["decode"]
    for r in v["raw"]:
        argv += ["--raw", str(d / r)]
    if v.get("cpu"):
        argv += ["--cpu", v["cpu"]]
    opts = shlex.split(v.get("ptxed_opts") or "")
    # Relative file names in options refer to the test directory.
    fixed = []
    prev = None
    for o in opts:
        if prev in ("--raw", "--elf") and not o.startswith("/"):
            o = str(d / o)
        fixed.append(o)
        prev = o
    if "--insn-decoder" not in fixed and "--block-decoder" not in fixed:
        fixed.insert(0, f"--{decoder}-decoder")
    argv += fixed + ["--no-inst", "--check", "--pt", str(d / v["pt"])]
    return argv


def decode_inputs(d: Path, v: dict, decoder: str):
    """What ``hwtrace decode`` would decode for this variant: (data, image,
    FlowConfig, decoder name, resync, parsed args) -- for tests that drive
    the decoders or the batch producers directly."""
    from hwtrace.cli import Parser
    from hwtrace.cli import decode as D
    sub = Parser(prog="hwtrace").add_subparsers(parser_class=Parser)
    D.register(sub)
    args = sub.choices["decode"].parse_args(argv_for(d, v, decoder)[1:])
    cfg = D._config(args, lambda s: None)
    return (D._trace(args.pt), D._image(args), cfg,
            "insn" if args.decoder == "insn" else "block", args.resync, args)


def normalize(text: str) -> list[str]:
    return [re.sub(r"[ \t]+", " ", line).rstrip()
            for line in text.splitlines()]


def run_variant(d: Path, v: dict, decoder: str) -> tuple[bool, str, str]:
    from hwtrace.cli import main
    out = io.StringIO()
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv_for(d, v, decoder))
        except Exception as e:  # a crash is a failure, with its reason
            import traceback
            return False, "", "CRASH " + "".join(
                traceback.format_exception(e))[-2000:]
    got = out.getvalue()
    exp = (d / v["exp"]["ptxed"]).read_text()
    ok = rc == 0 and normalize(got) == normalize(exp)
    return ok, got, err.getvalue()


def main(argv):
    decoder = "insn"
    pattern = ""
    verbose = False
    for a in argv:
        if a in ("--insn", "--block"):
            decoder = a[2:]
        elif a == "-v":
            verbose = True
        else:
            pattern = a
    npass = nfail = 0
    for d, v, meta in ptxed_variants():
        vid = variant_id(v)
        if pattern and pattern not in vid:
            continue
        ok, got, err = run_variant(d, v, decoder)
        if ok:
            npass += 1
        else:
            nfail += 1
            print("FAIL", vid)
            if verbose:
                print("  cmd:", " ".join(argv_for(d, v, decoder)))
                exp = (d / v["exp"]["ptxed"]).read_text()
                import difflib
                for line in difflib.unified_diff(
                        normalize(exp), normalize(got), "exp", "got",
                        lineterm="", n=2):
                    print("   ", line)
                if err:
                    print("  stderr:", err[-1500:])
    print(f"{decoder}: {npass} passed, {nfail} failed")


if __name__ == "__main__":
    main(sys.argv[1:])
