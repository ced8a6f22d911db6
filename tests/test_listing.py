"""hwtrace.listing: instruction listings from batches.

* the line cache maps addresses (and modes) to their texts exactly;
* the batch listing prints byte for byte what the session sinks print
  for the same decode (the sinks are what ``--jobs`` runs, and they are
  the reference the corpus tests were built on), with every decoration
  (offsets, speculative and truncated instructions, blocks, events);
* ``hwtrace decode DIR`` on a recorded C program lists ``main`` and
  ``fib+0x..`` with their disassembly, and ``--lines`` ``fib.c:N``.
"""

from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pytest

from conftest import CORPUS, IN_CI, run_hwtrace
from ptxed_corpus import decode_inputs, ptxed_variants, variant_id

from hwtrace.flow import batches as B
from hwtrace.flow import sinks
from hwtrace.listing.cache import LineCache
from hwtrace.listing.contexts import Contexts
from hwtrace.listing.jsonl import JsonFormat
from hwtrace.listing.single import InsnNotes
from hwtrace.listing.text import TextFormat
from hwtrace.listing.walk import Walker

VARIANTS = list(ptxed_variants()) if CORPUS.is_dir() else []


# -- the cache ------------------------------------------------------------------

def test_line_cache_maps_every_address_and_mode_to_its_text():
    made = []

    def make(ips, sizes, iclasses, mode):
        made.extend((ip, mode) for ip in ips)
        return [b"%x/%d/%d/%d" % (ip, s, c, mode)
                for ip, s, c in zip(ips, sizes, iclasses)]
    cache = LineCache(make, bits=4)         # tiny: grows, collides
    rng = np.random.default_rng(7)
    pool = np.concatenate([rng.integers(0, 1 << 47, 3000, dtype=np.uint64),
                           np.arange(0x1000, 0x1100, dtype=np.uint64),
                           np.array([0, (1 << 64) - 1, 1 << 63],
                                    dtype=np.uint64)])
    for _ in range(6):
        ips = rng.choice(pool, 5000)
        modes = rng.integers(1, 4, len(ips)).astype(np.uint8)
        sizes = (ips % 15 + 1).astype(np.uint8)
        iclass = (ips % 7).astype(np.uint8)
        for m in (modes, 3):
            ids = cache.ids(ips, sizes, iclass, m)
            mm = [3] * len(ips) if np.isscalar(m) else modes.tolist()
            want = [b"%x/%d/%d/%d" % t for t in zip(
                ips.tolist(), sizes.tolist(), iclass.tolist(), mm)]
            assert cache.lines[ids].tolist() == want
    # each (address, mode) was formatted once
    assert len(made) == len(set(made)) == cache.n


# -- batches vs. sinks ----------------------------------------------------------

def _listing(fmt, batches, decoder, image, images, annotate):
    out = []
    ctx = Contexts(fmt, annotate=annotate, images=images)
    w = Walker(fmt, out.append, lambda space: ctx.for_image(image),
               block=decoder == "block")
    for b in batches:
        w.batch(b)
    return b"".join(out).decode(), (w.insns, w.blocks, w.events, w.errors)


def _sink_text(sink_cls, batches, decoder, **kw):
    out = []
    sink = sink_cls(out.append, **kw)
    B.replay(batches, sink, decoder)
    return "".join(out), (sink.insns, sink.blocks, sink.events, sink.errors)


TEXT_OPTIONS = [dict(), dict(print_offset=True, event_ip=True),
                dict(show_blocks=True, block_ids=True, event_time=True)]


@pytest.mark.parametrize("decoder", ["insn", "block"])
def test_batch_listing_equals_the_sinks_on_the_corpus(decoder, corpus):
    """All corpus decodes, text (annotated, with offsets, blocks, event
    IPs and times) and jsonl (plain, offsets, annotations)."""
    if not VARIANTS:
        (pytest.fail if IN_CI else pytest.skip)("corpus unavailable")
    bad = []
    for d, v, _meta in VARIANTS:
        data, image, cfg, dec, resync, args = decode_inputs(d, v, decoder)
        made = list(B.batches(data, image, cfg, decoder=dec, resync=resync,
                              want_insns=True, max_records=64))
        cases = []
        for opts in TEXT_OPTIONS:
            for annotate in (False, True):
                notes = InsnNotes(args.images, "text") if annotate else None
                cases.append((TextFormat(annotate=annotate, **opts),
                              sinks.PtxedSink, dict(opts, notes=notes),
                              annotate))
        for off in (False, True):
            for annotate in (False, True):
                notes = InsnNotes(args.images, "jsonl") if annotate else None
                cases.append((JsonFormat(print_offset=off, annotate=annotate),
                              sinks.JsonSink,
                              dict(print_offset=off, notes=notes), annotate))
        for fmt, sink_cls, kw, annotate in cases:
            got = _listing(fmt, made, dec, image, args.images, annotate)
            want = _sink_text(sink_cls, made, dec, **kw)
            if got != want:
                bad.append((variant_id(v), type(fmt).__name__, kw))
    assert not bad, bad[:5]


def test_corpus_has_the_decorations_the_listing_special_cases(corpus):
    """The equality above covers speculative and truncated instructions
    and records of several instructions next to them."""
    if not VARIANTS:
        (pytest.fail if IN_CI else pytest.skip)("corpus unavailable")
    flags = 0
    for d, v, _meta in VARIANTS:
        data, image, cfg, dec, resync, _a = decode_inputs(d, v, "block")
        blocks, _i, _it = B.flatten(B.batches(data, image, cfg, decoder=dec,
                                              resync=resync, want_insns=True))
        flags |= int(np.bitwise_or.reduce(blocks["flags"])) if len(blocks) \
            else 0
    assert flags & B.SPECULATIVE and flags & B.TRUNCATED


# -- a recorded program -----------------------------------------------------------

PROG = r"""
#include <stdio.h>
#include <stdlib.h>
static long fib(long n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
int main(int argc, char **argv) { printf("%ld\n", fib(atoi(argv[1]))); return 0; }
"""


@pytest.fixture(scope="module")
def fib(tmp_path_factory):
    d = tmp_path_factory.mktemp("listing")
    (d / "fib.c").write_text(PROG)
    r = subprocess.run(["gcc", "-O1", "-g", "-o", str(d / "fib"),
                        str(d / "fib.c")], capture_output=True, text=True)
    if r.returncode:
        (pytest.fail if IN_CI else pytest.skip)("no gcc: " + r.stderr)
    r = run_hwtrace("record", "--mode", "thread", "--config",
                    "branch;user;retc;tsc;mtc;cyc", "-o", d / "rec", "--",
                    d / "fib", "9")
    if r.returncode:
        (pytest.fail if IN_CI else pytest.skip)("record: " + r.stderr)
    return d


def _fib_lines(src: str) -> set:
    return {i + 1 for i, line in enumerate(src.splitlines())
            if "fib(" in line}


LINE = re.compile(r"^([0-9a-f]{16})  (\S*) +(\S.*?)(?:  +(\S+:\d+))?$")


def test_recorded_c_program_listing(fib):
    r = run_hwtrace("decode", fib / "rec")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("[stream ") and \
        lines[1].startswith("[process ") and lines[1].endswith("(fib)]")
    insns = [LINE.match(x) for x in lines if not x.startswith("[")]
    assert all(insns)
    where = [m.group(2) for m in insns]
    assert "main" in where and any(w.startswith("fib+0x") for w in where)
    # main calls fib: the call names its target
    assert any(m.group(2).startswith("main") and
               re.fullmatch(r"call 0x[0-9a-f]+ <fib>", m.group(3))
               for m in insns)
    assert any(m.group(2) == "fib" for m in insns)
    # the same instructions as the address-only listing
    plain = run_hwtrace("decode", fib / "rec", "--no-inst").stdout
    assert [x for x in plain.splitlines() if not x.startswith("[")] == \
        [m.group(1) for m in insns]
    assert len(insns) == json.loads(
        (fib / "rec" / "manifest.json").read_text()
    )["streams"][0]["instructions_observed"]


def test_recorded_c_program_lines(fib):
    r = run_hwtrace("decode", fib / "rec", "--lines")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    insns = [LINE.match(x) for x in r.stdout.splitlines()
             if not x.startswith("[")]
    want = {f"fib.c:{n}" for n in _fib_lines(PROG)}
    # function fib's instructions ("fib", "fib+0xOFF" from its start: not
    # the executable fib's unnamed code, "fib+0xLINK" at its own address)
    start = next(int(m.group(1), 16) for m in insns if m.group(2) == "fib")
    srcs = {m.group(4) for m in insns if m.group(2).startswith("fib") and
            int(m.group(1), 16) - int(m.group(2)[4:] or "0", 16) == start}
    assert srcs and srcs <= want
    mains = {m.group(4) for m in insns if m.group(2).startswith("main")}
    main_line = next(i + 1 for i, x in enumerate(PROG.splitlines())
                     if "int main" in x)
    assert f"fib.c:{main_line}" in mains      # (and atoi's, inlined)
    # jsonl: optional keys behind --annotate
    j = run_hwtrace("decode", fib / "rec", "--format", "jsonl",
                    "--annotate", "--lines")
    objs = [json.loads(x) for x in j.stdout.splitlines()]
    fibs = [o for o in objs if o.get("function") == "fib"]
    assert fibs and all(o["file"].endswith("/fib.c") and
                        f"fib.c:{o['line']}" in want for o in fibs)
    plain = run_hwtrace("decode", fib / "rec", "--format", "jsonl")
    assert [{k: v for k, v in o.items()
             if k not in ("function", "function_offset", "disasm", "file",
                          "line")} for o in objs] == \
        [json.loads(x) for x in plain.stdout.splitlines()[0:]]


def test_recorded_c_program_parallel_listing_is_the_same(fib):
    """The --jobs path (session sinks with the same annotations) prints
    what the batch listing prints."""
    man = json.loads((fib / "rec" / "manifest.json").read_text())
    pt = man["streams"][0]["file"]
    img = run_hwtrace("images", "--pt", pt, fib / "rec").stdout.split()
    args = ["decode", "--pt", fib / "rec" / pt, *img, "--lines"]
    seq = run_hwtrace(*args)
    par = run_hwtrace(*args, "--jobs", "2",
                      env={"HWTRACE_PARALLEL_MIN_SEGMENT": "0"})
    assert seq.returncode == 0 and par.returncode == 0, par.stderr
    assert seq.stdout == par.stdout and "fib.c:" in seq.stdout


def test_merge_time_keeps_each_stream_in_order(fib):
    r = run_hwtrace("decode", fib / "rec", "--merge-time")
    s = run_hwtrace("decode", fib / "rec")
    assert r.returncode == 0, r.stderr
    name = json.loads((fib / "rec" / "manifest.json").read_text()
                      )["streams"][0]["file"]
    assert r.stdout.splitlines() == [f"[{name}] {x}" for x in
                                     s.stdout.splitlines()[1:]]


def test_help_explains_every_option():
    from hwtrace.cli import build_parser
    sub = next(a for a in build_parser()._actions
               if a.dest == "command").choices["decode"]
    opts = [a for a in sub._actions if a.option_strings or a.dest == "bundle"]
    assert len(opts) > 40
    assert [a.option_strings or a.dest for a in opts if not a.help] == []
    r = run_hwtrace("decode", "--help")
    assert r.returncode == 0 and "--no-inst" in r.stdout and \
        "function" in r.stdout
