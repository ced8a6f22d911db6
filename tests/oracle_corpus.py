"""Compare ``hwtrace decode --format jsonl`` with the reference decoder's
stored ``insn`` output (ptoracle over libipt 2.3) for the corpus variants.

    python tests/oracle_corpus.py [-v] [NAME-SUBSTRING]
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import corpus_variants  # noqa: E402

_OPT_MAP = {"--keep-tcal-on-ovf": "--insn:keep-tcal-on-ovf"}


def oracle_variants():
    for d, v, meta in corpus_variants():
        if "oracle_insn" in v:
            yield d, v


def variant_id(v: dict) -> str:
    return Path(v["oracle_insn"]["file"]).name.removesuffix(".gz") \
        .removesuffix(".insn.jsonl")


def argv_for(d: Path, v: dict) -> list[str]:
    words = shlex.split(v["oracle_insn"]["cmd"])[2:]
    argv = ["decode", "--insn-decoder", "--format", "jsonl"]
    prev = None
    for w in words:
        if prev == "--raw" or prev == "--elf":
            argv.append(str(d / w) if not w.startswith("/") else w)
        elif w.endswith(".pt") and prev is None or (
                prev is not None and not prev.startswith("--")
                and w.endswith(".pt")):
            argv += ["--pt", str(d / w)]
        else:
            argv.append(_OPT_MAP.get(w, w))
        prev = w if w.startswith("--") and w not in (
            "--event:tick", "--event:iflags", "--keep-tcal-on-ovf",
            "--resync-on-error") else None
    return argv


def load_expected(d: Path, v: dict) -> list[dict]:
    path = d / v["oracle_insn"]["file"]
    if path.suffix == ".gz":
        text = gzip.decompress(path.read_bytes()).decode()
    else:
        text = path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run(d: Path, v: dict) -> list[dict]:
    from hwtrace.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(io.StringIO()):
        main(argv_for(d, v))
    return [json.loads(line) for line in out.getvalue().splitlines()]


def essentials(items: list[dict]) -> list[tuple]:
    """What must agree: instruction IPs and error offsets, in order."""
    out = []
    for it in items:
        if "ip" in it and "iclass" in it and "error" not in it:
            out.append(("insn", it["ip"]))
        elif "error" in it:
            out.append(("error", it["offset"]))
    return out


def main(argv):
    verbose = "-v" in argv
    pattern = next((a for a in argv if not a.startswith("-")), "")
    same = full = total = 0
    for d, v in oracle_variants():
        vid = variant_id(v)
        if pattern and pattern not in vid:
            continue
        total += 1
        exp = load_expected(d, v)
        got = run(d, v)
        if exp == got:
            full += 1
        if essentials(exp) == essentials(got):
            same += 1
        elif verbose or pattern:
            print("DIFF", vid)
        if verbose and exp != got:
            import difflib
            for line in difflib.unified_diff(
                    [json.dumps(x) for x in exp], [json.dumps(x) for x in got],
                    "oracle", "hwtrace", lineterm="", n=1):
                print("   ", line)
    print(f"{total} variants: {same} same insns+error offsets, "
          f"{full} identical")


if __name__ == "__main__":
    main(sys.argv[1:])
