"""Call-stack reconstruction over the reference decoder's output for all
of Intel's libipt tests (the corpus stores ``ptoracle insn`` JSON lines per
variant): whatever the trace holds (overflows, TSX aborts, disabled
regions, decode errors), activations pair up and nest, every instruction
is accounted to exactly one activation, and every error and overflow
becomes one marker."""

from __future__ import annotations

import gzip
import json
from collections import Counter

from conftest import CORPUS, corpus_variants

from hwtrace.analysis import Activation, Enter, Flag, Marker, reconstruct


def load(d, v):
    f = v.get("oracle_insn", {}).get("file")
    if not f or not (d / f).is_file():
        return None
    raw = (d / f).read_bytes()
    if f.endswith(".gz"):
        raw = gzip.decompress(raw)
    return [json.loads(l) for l in raw.decode().splitlines() if l.strip()]


def check(items):
    recs = list(reconstruct(items))
    stack = []
    acts = []
    for r in recs:
        if type(r) is Enter:
            assert r.depth == len(stack)
            stack.append(r)
        elif type(r) is Activation:
            e = stack.pop()
            assert (e.name, e.depth, e.begin_idx) == (r.name, r.depth, r.begin_idx)
            assert r.end >= r.begin and r.end_idx >= r.begin_idx
            acts.append(r)
    assert stack == []
    ninsn = sum(1 for i in items if "iclass" in i and "error" not in i)
    assert sum(a.self_insns for a in acts) == ninsn
    markers = Counter(r.kind for r in recs if type(r) is Marker)
    assert markers["error"] == sum(1 for i in items if "error" in i)
    assert markers["overflow"] == sum(1 for i in items if i.get("event") == "overflow")
    return acts, markers


def test_every_corpus_variant(corpus):
    n = 0
    for d, v, _meta in corpus_variants():
        items = load(d, v)
        if items is None:
            continue
        check(items)
        n += 1
    assert n >= 200


def test_call_and_compressed_return(corpus):
    d = CORPUS / "call_direct-ret_compressed"
    v = json.loads((d / "meta.json").read_text())["variants"][0]
    acts, markers = check(load(d, v))
    # call at 0x100000 -> callee at 0x100008 returns to 0x100005; then the
    # trace ends asynchronously (an untraced region, never resumed)
    got = [(a.name, a.depth, a.insns, a.flags) for a in acts]
    assert got == [("0x100008", 1, 1, Flag.NONE),
                   ("[untraced]", 1, 0, Flag.ASYNC | Flag.TRUNCATED),
                   ("0x100000", 0, 3, Flag.BEGIN_UNKNOWN | Flag.TRUNCATED)]
    assert not markers


def test_tsx_abort_is_not_an_interrupt(corpus):
    d = CORPUS / "tsx-abort"
    v = json.loads((d / "meta.json").read_text())["variants"][0]
    acts, markers = check(load(d, v))
    assert not any(a.flags & Flag.ASYNC and a.name != "[untraced]" for a in acts)
    assert [a.depth for a in acts if a.name != "[untraced]"] == [0]


def test_overflow_markers_carry_offsets(corpus):
    d = CORPUS / "ovf-fup"
    v = json.loads((d / "meta.json").read_text())["variants"][0]
    items = load(d, v)
    recs = list(reconstruct(items))
    ovf = [r for r in recs if type(r) is Marker]
    want = [i["offset"] for i in items if i.get("event") == "overflow"]
    assert [m.offset for m in ovf if m.kind == "overflow"] == want and want
