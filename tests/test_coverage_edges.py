"""Edge coverage (hwtrace.flow.fast.edges, hwtrace coverage --edges): exact
edge counts equal those computed here from the Python instruction decode,
on the ptxed corpus and on emulated-engine recordings; the AFL-style
bitmap; the CLI."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pytest

from conftest import CORPUS, compiled_flow_core, run_hwtrace
from ptxed_corpus import argv_for, ptxed_variants, variant_id
from test_flow_fast import gzip_trace, true_trace  # noqa: F401

from hwtrace.flow import fast, session
from hwtrace.flow.insn import InsnDecoder
from hwtrace.x86.insn import IClass

_NOT_BRANCH = (int(IClass.OTHER), int(IClass.PTWRITE))


class _Stream:
    """The instruction decode as a list of segments (split at errors)."""

    needs_offset = False

    def __init__(self):
        self.segments = [[]]

    def insn(self, insn, offset):
        self.segments[-1].append((insn.ip, insn.iclass))

    def error(self, kind, offset, ip, code):
        self.segments.append([])

    def event(self, ev, offset):
        pass

    def status(self, name, offset):
        pass


def reference_edges(data, image, cfg) -> dict:
    """Edges from the Python instruction decoder's instruction list: each
    branch and the instruction after it, within an error-free stretch."""
    s = _Stream()
    session.run_insn(InsnDecoder(data, image, cfg), s)
    out = {}
    for seg in s.segments:
        for (ip, c), (nip, _) in zip(seg, seg[1:]):
            if c not in _NOT_BRANCH:
                out[(ip, nip)] = out.get((ip, nip), 0) + 1
    return out


def _variant_inputs(d, v):
    from hwtrace.cli import build_parser
    from hwtrace.cli import decode as D
    args = build_parser().parse_args(argv_for(d, v, "insn"))
    cfg = D._config(args, lambda s: None)
    return D._trace(args.pt), D._image(args), cfg


def _core_selected():
    """Skip where HWTRACE_NO_EXTENSIONS=1 selected the twin: the test is
    about what the default (compiled) path gives."""
    compiled_flow_core()
    if fast.CORE is None:
        pytest.skip("HWTRACE_NO_EXTENSIONS=1 selected the Python twin")


def test_corpus_edges_exact(corpus):
    _core_selected()
    compiled = total = 0
    for d, v, meta in ptxed_variants():
        data, image, cfg = _variant_inputs(d, v)
        e = fast.edges(data, image, cfg)
        ref = reference_edges(data, image, cfg)
        assert e.counts == ref, variant_id(v)
        p = fast.edges(data, image, cfg, impl="python")
        assert p.counts == ref and p.insns == e.insns, variant_id(v)
        compiled += e.compiled
        total += 1
    assert total > 200
    assert compiled >= 35, (compiled, total)    # 37 of 430 when written


@pytest.mark.parametrize("which", ["true_trace", "gzip_trace"])
def test_recorded_edges_exact(which, request):
    data, image, cfg = request.getfixturevalue(which)
    compiled_flow_core()
    e = fast.edges(data, image, cfg, impl="compiled")
    assert e.compiled
    ref = reference_edges(data, image, cfg)
    assert e.counts == ref
    assert len(ref) > 1000
    assert e.insns == fast.count(data, image, cfg, "insn",
                                 impl="python").insns


def test_bitmap_hash_and_saturation():
    counts = {(0x401000, 0x401020): 3, (0x401020, 0x401000): 300}
    bm = fast.edge_bitmap(counts)
    assert len(bm) == 65536

    def h(x):
        return ((x * 0x9E3779B97F4A7C15) % (1 << 64)) >> 48
    i = h(0x401000) ^ (h(0x401020) >> 1)
    j = h(0x401020) ^ (h(0x401000) >> 1)
    assert i != j
    assert fast.edge_index(0x401000, 0x401020) == i
    assert bm[i] == 3 and bm[j] == 255
    assert sum(1 for b in bm if b) == 2
    small = fast.edge_bitmap(counts, 256)
    assert len(small) == 256 and small[i % 256] == 3


def test_cli_edges(true_trace, tmp_path):
    data, image, cfg = true_trace
    pt = tmp_path / "t.pt"
    pt.write_bytes(data)
    argv = ["coverage", "--edges", "--pt", pt]
    for m in image.mappings():
        argv += ["--raw", f"{m.section.name}:{m.offset:#x}-"
                          f"{m.offset + m.end - m.begin:#x}:{m.begin:#x}"]
    if cfg.errata.bdm70:
        argv += ["--cpu", "6/106"]
    bm = tmp_path / "map.bin"
    r = run_hwtrace(*argv, "--bitmap", bm)
    assert r.returncode == 0, r.stderr
    ref = reference_edges(data, image, cfg)
    ninsn = fast.count(data, image, cfg, "insn").insns
    want = [f"{f:016x} {t:016x} {n}" for (f, t), n in sorted(ref.items())]
    want.append(f"edges: {len(ref)}, taken: {sum(ref.values())}, "
                f"insns: {ninsn}.")
    assert r.stdout.splitlines() == want
    assert bm.read_bytes() == bytes(fast.edge_bitmap(ref))
    q = run_hwtrace(*argv, "--quiet", env={"HWTRACE_NO_EXTENSIONS": "1"})
    assert q.stdout.splitlines() == want[-1:]
    q = run_hwtrace(*argv, env={"HWTRACE_NO_EXTENSIONS": "1"})
    assert q.stdout.splitlines() == want
    # edges are the default (the only kind so far): `coverage DIR` works
    q = run_hwtrace(*[a for a in argv if a != "--edges"])
    assert q.returncode == 0 and q.stdout.splitlines() == want, q.stderr
    # the lines go to stdout's binary buffer where its encoding writes
    # ASCII as itself; through the text layer otherwise (UTF-16 here, a
    # StringIO in process), in order with the summary line
    u = subprocess.run([sys.executable, "-m", "hwtrace", *map(str, argv)],
                       capture_output=True, timeout=600,
                       env=dict(os.environ, PYTHONIOENCODING="utf-16"))
    assert u.returncode == 0
    assert u.stdout.decode("utf-16").splitlines() == want
    from hwtrace.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([str(a) for a in argv]) == 0
    assert out.getvalue().splitlines() == want


def test_packed_edges_and_text(true_trace, monkeypatch):
    """The packed table (sorted by the core) and its lines (formatted by
    the core) equal the twin's and the dict's, to the last byte; the whole
    u64 range formats as Python formats it."""
    _core_selected()
    data, image, cfg = true_trace
    e = fast.edges(data, image, cfg)
    c = fast.packed_edges(data, image, cfg)
    p = fast.packed_edges(data, image, cfg, impl="python")
    assert c.compiled and not p.compiled
    assert c.table == p.table == fast.pack_edges(e.counts)
    assert len(c.table) == fast.EDGE_BYTES * len(e.counts) > 0
    assert fast.unpack_edges(c.table) == e.counts
    assert c.insns == p.insns == e.insns and c.errors == p.errors == e.errors
    want = "".join(f"{f:016x} {t:016x} {n}\n"
                   for (f, t), n in sorted(e.counts.items()))
    taken = sum(e.counts.values())
    assert fast.edge_text(c.table) == (want, taken)
    assert fast.edge_text(c.table, False) == (None, taken)
    assert fast.edge_text(c.table, binary=True) == (want.encode(), taken)
    assert fast.edge_text(c.table, False, binary=True) == (None, taken)
    m = (1 << 64) - 1
    big = {(m, 0): m - 5, (0, m): 1, (0x401000, 0x401000): 10 ** 12,
           (0x401000, 0x400fff): 9, (5, 6): 3}
    table = fast.pack_edges(big)
    compiled = fast.edge_text(table)
    assert fast.edge_text(b"") == ("", 0)
    monkeypatch.setattr(fast, "CORE", None)
    assert fast.edge_text(c.table) == (want, taken)
    assert fast.edge_text(c.table, binary=True) == (want.encode(), taken)
    assert fast.edge_text(c.table, False, binary=True) == (None, taken)
    assert fast.edge_text(table) == compiled
    assert compiled[0] == "".join(f"{f:016x} {t:016x} {n}\n"
                                  for (f, t), n in sorted(big.items()))
    assert fast.edge_text(b"") == ("", 0)


def test_cli_errors(tmp_path):
    # --edges is the default: without it, the same one-line errors
    r = run_hwtrace("coverage", "--pt", tmp_path / "x.pt")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "cannot read" in r.stderr
    r = run_hwtrace("coverage")
    assert r.returncode == 2 and "no trace" in r.stderr
    r = run_hwtrace("coverage", "--edges", "--pt", tmp_path / "missing.pt")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "cannot read" in r.stderr
    r = run_hwtrace("coverage", "--edges")
    assert r.returncode == 2 and "no trace" in r.stderr
    r = run_hwtrace("coverage", "--edges", tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_cli_bundle_same_as_pt(tmp_path):
    """`coverage --edges DIR` (images and CPU from the bundle) prints what
    the --pt form with the same images prints."""
    from test_flow_fast import _load, _record
    bundle = _record(tmp_path, ["/bin/true"])
    data, image, cfg = _load(bundle)
    ref = reference_edges(data, image, cfg)
    r = run_hwtrace("coverage", "--edges", bundle)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:-1] == [f"{f:016x} {t:016x} {n}"
                          for (f, t), n in sorted(ref.items())]
    assert lines[-1].startswith(f"edges: {len(ref)}, taken: "
                                f"{sum(ref.values())}, insns: ")
    r = run_hwtrace("coverage", "--edges", bundle, "--stream", "nope.pt")
    assert r.returncode == 2 and "no stream" in r.stderr


def test_cli_timing_options_same_as_bundle(tmp_path):
    """`coverage --edges --pt` takes decode's timing options (the bundle
    form reads them from the manifest) and prints the same coverage."""
    import json
    out = tmp_path / "b"
    r = run_hwtrace("record", "--mode", "thread", "--copy-images", "--config",
                    "branch;user;tsc;retc;cyc;mtc;mtc-freq=3", "-o", out,
                    "--", "/bin/true", timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "manifest.json").read_text())
    stream = max(m["streams"], key=lambda s: s.get("size", 0))["file"]
    assert m["mtc_freq"] == 3 and m["nom_freq"] > 0
    images = run_hwtrace("images", "--pt", stream, out, check=True).stdout.split()
    timing = ["--mtc-freq", str(m["mtc_freq"]), "--nom-freq", str(m["nom_freq"]),
              "--cpuid-0x15.eax", str(m["cpuid_0x15_eax"]),
              "--cpuid-0x15.ebx", str(m["cpuid_0x15_ebx"])]
    whole = run_hwtrace("coverage", "--edges", out, check=True).stdout
    one = run_hwtrace("coverage", "--edges", "--pt", out / stream, *images,
                      *timing, check=True, cwd=out).stdout
    assert one == whole and whole.splitlines()[-1].startswith("edges: ")
    r = run_hwtrace("coverage", "--edges", "--pt", out / stream,
                    "--mtc-freq", "x")
    assert r.returncode == 2 and r.stderr.strip() == \
        "hwtrace: --mtc-freq: bad argument: x"


#: an indirect call (a TIP) into functions whose loop runs a pseudo-random
#: 0-7 times: the walk's chains start at the same IPs with the next TNT
#: packet's bits -- the same bit values in keys of different lengths
#: ("0", "00", "000" ...), and different values of one length
_KEYED_C = r"""
static volatile int sink;
__attribute__((noinline)) static void run(int n)
{
    for (int i = 0; i < n; i++)
        sink += i;
}
__attribute__((noinline)) static void a(int n) { run(n); }
__attribute__((noinline)) static void b(int n) { run(n & 3); if (n & 4) sink++; }
void (*volatile tab[2])(int) = {a, b};
int main(void)
{
    unsigned x = 12345;
    for (int k = 0; k < 20000; k++) {
        x = x * 1103515245u + 12345u;
        tab[(x >> 16) & 1]((x >> 20) & 7);
    }
    return sink & 1;
}
"""


def test_chain_keys_of_every_length_exact(tmp_path):
    """The walk's chains are keyed by an IP and the TNT bits left (chain.h:
    the bits under a leading one, so that "0" and "00" are two keys): edge
    counts over an indirect call into loops of varying trip counts equal
    the instruction decode's (a key that lost the bit count, or the bits,
    would apply one chain's path to another's trace)."""
    from conftest import record_static_program
    from test_flow_fast import _load
    b = record_static_program(tmp_path, _KEYED_C)
    if b is None:
        pytest.skip("gcc -static or the emulated engine not usable here")
    data, image, cfg = _load(b)
    compiled_flow_core()
    e = fast.edges(data, image, cfg, impl="compiled")
    assert e.compiled
    ref = reference_edges(data, image, cfg)
    assert e.counts == ref
    # the loops' edges: more than one a call on the busiest
    assert max(ref.values()) > 20000
