"""The compiled packet scanner (hwtrace.pt._c_packets) and its Python twin
(hwtrace.pt.decoder) decode identically, and the compiled core is in use
wherever it should be.

- ``test_compiled_core_loaded_where_expected`` FAILS when the core should
  have loaded and did not: with ``HWTRACE_REQUIRE_EXTENSIONS=1`` (CI), or
  when its extension file is installed but unusable (import error, wrong
  ABI, stale build).
- Every test taking the ``impl`` fixture runs for both implementations;
  the ``compiled`` variant is skipped only where no build is expected.
- The existing packet-layer system tests (479 ptdump variants, the stored
  libipt 2.3 packets, jsonl against the live libipt 2.0.5 oracle on the
  corpus and 1,000 mutations) are re-run under each implementation.
- The twin and the core are compared directly on the corpus and seeded
  mutations with every switch (errata, libipt 2.0 packet set, no-sync):
  same records, errors, resync points, offsets, counts, and ``next()`` at
  every byte offset.
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

import test_corpus_ptdump
import test_pt_oracle
import test_pt_packets
from conftest import CORPUS, run_hwtrace
from hwtrace import _ext
from hwtrace.pt import _impl, encoder as enc, packets as P
from hwtrace.pt.cpu import Errata
from hwtrace.pt.decoder import PacketDecoder, find_psb_forward
from hwtrace.pt.errors import PtError

SEED = 20261129
IMPLS = ["python", "compiled"]


def _compiled_core():
    """The compiled core, or skip (fail where it is expected)."""
    st_ = _ext.probe(_impl.NAME, _impl.ABI)
    if st_.module is None:
        if st_.expected:
            pytest.fail(f"compiled core expected but unusable: {st_.reason}")
        pytest.skip(f"compiled core unavailable: {st_.reason}")
    return st_.module


@pytest.fixture(params=IMPLS)
def impl(request, monkeypatch):
    """Run the test under one implementation, including code that builds
    its own PacketDecoder (the CLI, ptdump_lines)."""
    core = _compiled_core() if request.param == "compiled" else None
    monkeypatch.setattr(_impl, "CORE", core)
    return request.param


# -- selection ---------------------------------------------------------------

def test_compiled_core_loaded_where_expected():
    status = _impl.STATUS
    status.check()      # raises if expected (REQUIRE or built) but unusable
    if status.disabled:
        assert _impl.CORE is None
        assert PacketDecoder(b"").impl == "python"
    elif status.expected:
        assert _impl.CORE is not None
        assert PacketDecoder(b"").impl == "compiled"


def test_selection_from_environment():
    """HWTRACE_NO_EXTENSIONS=1 selects the twin in a fresh interpreter;
    otherwise the compiled core runs when it is built."""
    code = ("import hwtrace.pt._impl as i; from hwtrace.pt.decoder import "
            "PacketDecoder as D; print(D(b'').impl, i.STATUS.reason)")
    env = {"HWTRACE_NO_EXTENSIONS": "1", "HWTRACE_REQUIRE_EXTENSIONS": ""}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, env={**_env(), **env}, check=True)
    assert r.stdout.split()[0] == "python"
    assert "HWTRACE_NO_EXTENSIONS" in r.stdout
    if _impl.STATUS.loaded or _impl.STATUS.expected:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                           text=True, env={**_env(), "HWTRACE_NO_EXTENSIONS":
                                           ""}, check=True)
        assert r.stdout.split()[0] == "compiled"


def _env():
    import os
    return dict(os.environ)


def test_status_rules(tmp_path):
    assert _ext.extensions_disabled({"HWTRACE_NO_EXTENSIONS": "1"})
    assert not _ext.extensions_disabled({"HWTRACE_NO_EXTENSIONS": "0"})
    assert not _ext.extensions_disabled({})
    missing = _ext.probe("hwtrace.pt._c_no_such_core", 1, environ={})
    assert (missing.loaded, missing.built, missing.expected) == \
        (False, False, False)
    missing.check()     # not expected: no error
    req = _ext.probe("hwtrace.pt._c_no_such_core", 1,
                     environ={"HWTRACE_REQUIRE_EXTENSIONS": "1"})
    assert req.expected and not req.loaded
    with pytest.raises(RuntimeError, match="HWTRACE_REQUIRE_EXTENSIONS"):
        req.check()
    off = _ext.select(_impl.NAME, _impl.ABI,
                      environ={"HWTRACE_NO_EXTENSIONS": "1"})
    assert off.module is None and off.disabled
    off.check()         # disabled on purpose: not an error


def test_wrong_abi_and_stale_build_are_refused(tmp_path, monkeypatch):
    core = _compiled_core()
    wrong = _ext.probe(_impl.NAME, _impl.ABI + 1, environ={})
    assert not wrong.loaded and wrong.built and "ABI" in wrong.reason
    with pytest.raises(RuntimeError, match="ABI"):
        wrong.check()
    # A copy of the built module next to an edited source is stale.
    from pathlib import Path
    so = Path(core.__file__)
    pkg = tmp_path / "stalepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / so.name).write_bytes(so.read_bytes())
    for h in so.parent.glob("*.h"):
        (pkg / h.name).write_bytes(h.read_bytes())
    src = (so.parent / "_c_packets.c").read_bytes()
    (pkg / "_c_packets.c").write_bytes(src + b"\n/* edited */\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    stale = _ext.probe("stalepkg._c_packets", _impl.ABI, environ={})
    assert not stale.loaded and stale.built and "stale" in stale.reason
    # selected, a stale core is not a silent fallback: one line says so
    said = []
    sys.modules.pop("stalepkg._c_packets", None)
    picked = _ext.select("stalepkg._c_packets", _impl.ABI, environ={},
                         warn=said.append)
    assert picked.module is None
    assert len(said) == 1 and "stalepkg._c_packets" in said[0] and \
        "stale" in said[0] and "Python twin" in said[0], said
    said.clear()
    _ext.select("stalepkg._c_packets", _impl.ABI,
                environ={"HWTRACE_NO_EXTENSIONS": "1"}, warn=said.append)
    assert said == []       # disabled on purpose: nothing to say
    (pkg / "_c_packets.c").write_bytes(src)
    fresh = _ext.probe("stalepkg._c_packets", _impl.ABI, environ={})
    assert fresh.loaded, fresh.reason
    # ... and so is one whose header changed.
    hdr = pkg / "_pt_packets.h"
    hdr.write_bytes(hdr.read_bytes() + b"\n")
    sys.modules.pop("stalepkg._c_packets", None)
    stale = _ext.probe("stalepkg._c_packets", _impl.ABI, environ={})
    assert not stale.loaded and "stale" in stale.reason


def test_build_stamp_stands_for_unchanged_sources_only(tmp_path, monkeypatch):
    """The stamp the build writes next to an extension (sizes and
    modification times of the hashed sources) spares the start-up the
    hashing while the sources are unchanged -- and only then: an edited
    source or header, or a header added, means a hash, and a stale build
    is refused as without a stamp."""
    import os
    from pathlib import Path
    from hwtrace._ext import sources
    core = _compiled_core()
    so = Path(core.__file__)
    pkg = tmp_path / "stamppkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / so.name).write_bytes(so.read_bytes())
    for f in [so.parent / "_c_packets.c", *so.parent.glob("*.h")]:
        (pkg / f.name).write_bytes(f.read_bytes())
    src = pkg / "_c_packets.c"
    digest, text = sources.stamp_text(src)
    assert digest == core.SOURCE_SHA256 == sources.fingerprint(src)
    sources.stamp_path(src).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))

    def probe():
        sys.modules.pop("stamppkg._c_packets", None)
        return _ext.probe("stamppkg._c_packets", _impl.ABI, environ={})

    hashed = []
    real_read = sources._read
    monkeypatch.setattr(sources, "_read",
                        lambda *a, **k: hashed.append(1) or real_read(*a, **k))
    assert probe().loaded and not hashed     # the stamp: nothing read

    def later(path: Path, data: bytes) -> None:
        # a new modification time even on a coarse clock
        before = path.stat().st_mtime_ns
        path.write_bytes(data)
        st = path.stat()
        if st.st_mtime_ns == before:
            os.utime(path, ns=(st.st_atime_ns, before + 1_000_000))

    old = src.read_bytes()
    later(src, old + b"\n/* edited */\n")
    st = probe()
    assert not st.loaded and "stale" in st.reason and hashed
    # the same bytes again, but touched since the stamp: hashed, fresh
    hashed.clear()
    later(src, old)
    assert sources.stamped_fingerprint(src, text) is None
    assert probe().loaded and hashed
    # a header edited to the same size: its time still tells
    sources.stamp_path(src).write_text(sources.stamp_text(src)[1])
    hdr = pkg / "_pt_packets.h"
    h = hdr.read_bytes()
    later(hdr, h[:-1] + (b"\t" if h[-1:] != b"\t" else b" "))
    st = probe()
    assert not st.loaded and "stale" in st.reason
    later(hdr, h)
    # a header added beside the sources (it could be included)
    sources.stamp_path(src).write_text(sources.stamp_text(src)[1])
    hashed.clear()
    assert probe().loaded and not hashed
    (pkg / "new.h").write_text("/* new */\n")
    assert sources.stamped_fingerprint(
        src, sources.stamp_path(src).read_text()) is None
    # a stamp of other sources than the build's is not believed
    (pkg / "new.h").unlink()
    now = sources.stamp_text(src)[1]
    assert sources.stamped_fingerprint(src, now) == digest
    sources.stamp_path(src).write_text(
        "sha256 " + "0" * 64 + "\n" + now.split("\n", 1)[1])
    hashed.clear()
    assert probe().loaded and hashed


def test_impl_argument():
    with pytest.raises(ValueError):
        PacketDecoder(b"", impl="fortran")
    assert PacketDecoder(b"", impl="python").impl == "python"


# -- the existing packet-layer system tests, under each implementation ---------

def test_ptdump_corpus(impl, corpus):
    test_corpus_ptdump.test_all_variants_match_ptdump(corpus)


def test_stored_oracle_packets(impl, corpus):
    test_pt_packets.test_corpus_packets_match_stored_oracle(corpus)


def test_jsonl_matches_live_oracle(impl, ptoracle, corpus, tmp_path):
    test_pt_oracle.test_jsonl_matches_oracle_on_corpus_and_mutations(
        ptoracle, corpus, tmp_path)


def test_real_captures_match_oracle(impl, ptoracle, hardware):
    test_pt_oracle.test_real_captures_match_oracle(ptoracle, hardware)


def test_packet_unit_tests(impl, corpus):
    test_pt_packets.test_decoder_verbs()
    test_pt_packets.test_truncated_packet_ends_silently()
    test_pt_packets.test_encoder_picks_compression()
    for data, first in [
            (b"\x02\x82" * 8 + b"\xc9", PtError("unknown opcode", 16)),
            (b"\x02\x82" * 8 + b"\xad", PtError("unknown packet", 16)),
            (b"\x02\x82" * 8 + b"\x02\x73\x00\x00\x01\x00\x00",
             PtError("unknown packet", 16))]:
        test_pt_packets.test_bad_packets_are_values(data, first)
    test_pt_packets.test_reencode_every_corpus_packet(corpus)


def test_cli_stat_and_jsonl(impl, tmp_path):
    """dump --stat (count()) and --format jsonl in-process, per impl."""
    data = (enc.psb() + enc.psbend() + enc.tnt8("tnt") + b"\xc9\x00" +
            enc.psb() + enc.tip(0x1234, 1) + b"\x02\x73\x00\x00\x01\x00")
    path = tmp_path / "t.pt"
    path.write_bytes(data)
    rc, out = test_corpus_ptdump.run_dump(["--stat", str(path)])
    assert (rc, out) == (0, "packets: 5\nbytes: 46\nerrors: 1\n")
    rc, out = test_corpus_ptdump.run_dump(["--format", "jsonl", str(path)])
    assert out.splitlines()[3] == \
        '{"offset":19,"error":"unknown opcode"}'
    assert out.splitlines()[5] == \
        '{"offset":37,"size":3,"type":"tip","ipc":1,"ip":4660}'


# -- errata and the libipt 2.0 switches, by hand --------------------------------

SKD007 = Errata(skd007=True)
SKZ84 = Errata(skz84=True)


def test_skd007_cyc_ovf(impl):
    # A 2-byte CYC whose 2nd byte is OVF's 0x02, then 0xf3: the OVF.
    data = enc.psb() + bytes([0x07, 0x02, 0xf3]) + enc.pad()
    dec = PacketDecoder(data, errata=SKD007)
    assert list(dec.packets()) == [P.Psb(0, 16), P.Ovf(16, 2), P.Pad(19, 1)]
    dec.sync_set(16)
    assert dec.next() == P.Ovf(16, 2) and dec.offset == 19
    plain = PacketDecoder(data)
    assert list(plain.packets()) == [
        P.Psb(0, 16), P.Cyc(16, 2, 0x20), P.Cyc(18, 1, 0xf3 >> 3),
        P.Pad(19, 1)]


def test_skz84_invalid_tma(impl):
    bad_tma = b"\x02\x73\x00\x00\x00\x00\x02"      # fc reserved bit set
    data = enc.psb() + bad_tma + b"\x00" + enc.pad()
    dec = PacketDecoder(data, errata=SKZ84)
    assert list(dec.packets()) == [P.Psb(0, 16), P.Invalid(16, 8, 0),
                                   P.Pad(24, 1)]
    cut = PacketDecoder(enc.psb() + bad_tma, errata=SKZ84)
    assert list(cut.packets()) == [P.Psb(0, 16), P.Invalid(16, 8, 0)]
    assert cut.offset == 24         # past the end, like libipt
    assert PacketDecoder(data).count() == (1, 1)


def test_libipt_2_0_packet_set(impl):
    data = (enc.psb() + b"\x02\x13\x01\x02" + enc.psb() +
            b"\x02\x53\x01" + bytes(8) + enc.psb() + b"\xd9\x00\x05")
    new = [p.type for p in PacketDecoder(data).packets()]
    assert new == ["psb", "cfe", "psb", "evd", "psb", "trig"]
    old = list(PacketDecoder(data, disabled=P.NEWER_PACKETS).packets())
    assert [p.type for p in old] == ["psb", "error", "psb", "error", "psb",
                                     "error"]
    assert {p.code for p in old if p.type == "error"} == {"unknown opcode"}


# -- twin vs core, directly ------------------------------------------------------

_SWITCHES = [(Errata(), ()), (Errata(skd007=True, skz84=True), ()),
             (Errata(skz84=True), P.NEWER_PACKETS)]


def _trace(data, impl, errata, disabled, no_sync):
    """Everything observable from one packets() loop."""
    dec = PacketDecoder(data, impl=impl, errata=errata, disabled=disabled)
    out = []
    for p in dec.packets(no_sync=no_sync):
        out.append(p)
        if p.__class__ is PtError:
            out.append(("offset at error", dec.offset, dec.sync_offset))
    out.append(("end", dec.offset, dec.sync_offset))
    cnt = PacketDecoder(data, impl=impl, errata=errata, disabled=disabled)
    out.append(("count", cnt.count(no_sync=no_sync), cnt.offset,
                cnt.sync_offset))
    return out


def _next_everywhere(data, impl, errata, disabled):
    dec = PacketDecoder(data, impl=impl, errata=errata, disabled=disabled)
    out = []
    for o in range(len(data) + 1):
        dec.sync_set(o)
        r = dec.next()
        peek = dec.decode_at(o)
        assert peek == r
        if r.__class__ is not PtError:
            assert dec.advance(o, peek) == dec.offset
        out.append((r, dec.offset))
    return out


def _corpus_streams():
    return sorted({p.read_bytes() for p in CORPUS.glob("*/*.pt")})


def _compare(data, kinds=("trace", "next")):
    diffs = []
    for errata, disabled in _SWITCHES:
        if "trace" in kinds:
            for no_sync in (False, True):
                a = _trace(data, "python", errata, disabled, no_sync)
                b = _trace(data, "compiled", errata, disabled, no_sync)
                if a != b:
                    diffs.append((data.hex(), errata, disabled, no_sync))
        if "next" in kinds:
            if _next_everywhere(data, "python", errata, disabled) != \
                    _next_everywhere(data, "compiled", errata, disabled):
                diffs.append((data.hex(), errata, disabled, "next"))
    return diffs


def test_twin_and_core_agree_on_corpus_and_mutations(corpus):
    _compiled_core()
    streams = _corpus_streams()
    rng = random.Random(SEED)
    diffs = []
    for data in streams:
        diffs += _compare(data)
    for _ in range(600):
        m = test_pt_oracle.mutate(rng.choice(streams), rng)
        diffs += _compare(m, ("trace",) if len(m) > 400 else
                          ("trace", "next"))
    assert diffs == []


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=96), st.sampled_from(range(len(_SWITCHES))),
       st.booleans())
def test_twin_and_core_agree_on_random_bytes(tail, sw, psb):
    _compiled_core()
    data = (enc.psb() if psb else b"") + tail
    errata, disabled = _SWITCHES[sw]
    for no_sync in (False, True):
        assert _trace(data, "python", errata, disabled, no_sync) == \
            _trace(data, "compiled", errata, disabled, no_sync)
    assert _next_everywhere(data, "python", errata, disabled) == \
        _next_everywhere(data, "compiled", errata, disabled)


def test_abandoned_loop_leaves_offset_like_the_twin():
    _compiled_core()
    data = (enc.psb() + enc.tnt8("tt") * 5 + b"\xc9" + enc.pad() * 3 +
            enc.psb() + enc.pad() * 4)
    for stop in range(1, 12):
        got = []
        for impl in IMPLS:
            dec = PacketDecoder(data, impl=impl)
            it = dec.packets()
            for _ in range(stop):
                next(it, None)
            del it
            got.append((dec.offset, dec.sync_offset))
        assert got[0] == got[1], stop


def test_psb_search_agrees():
    core = _compiled_core()
    rng = random.Random(SEED)
    for _ in range(300):
        parts = [rng.choice([enc.psb(), b"\x02\x82" * rng.randrange(1, 12),
                             bytes([rng.randrange(256)]) * rng.randrange(9),
                             b"\x82\x02" * rng.randrange(6)])
                 for _ in range(rng.randrange(1, 6))]
        data = b"".join(parts)
        for start in range(0, len(data) + 2, 3):
            assert core.find_psb_forward(data, start) == \
                find_psb_forward(data, start)


def test_cli_subprocess_same_output_both_ways(tmp_path, corpus):
    """python -m hwtrace dump with and without HWTRACE_NO_EXTENSIONS."""
    _compiled_core()
    src = CORPUS / "ptdump-trunc-resync" / "ptdump-trunc-resync.pt"
    outs = []
    for flag in ("", "1"):
        env = {"HWTRACE_NO_EXTENSIONS": flag,
               "HWTRACE_REQUIRE_EXTENSIONS": ""}
        outs.append([run_hwtrace("dump", *args, src, env=env).stdout
                     for args in ([], ["--stat"], ["--format", "jsonl"])])
    assert outs[0] == outs[1]
    assert outs[0][1].startswith("packets: ")


def test_to_jsonl_is_json_dumps(impl, corpus):
    """Record.to_jsonl() == json.dumps(to_json(), compact) on every corpus
    packet and error, with records from either implementation."""
    import json
    n = 0
    for data in _corpus_streams():
        for no_sync in (False, True):
            for p in PacketDecoder(data, errata=Errata(skz84=True)).packets(
                    no_sync=no_sync):
                assert p.to_jsonl() == json.dumps(p.to_json(),
                                                  separators=(",", ":")), p
                n += 1
    assert n > 3000
    assert PtError("no ip", 3, "sync error").to_jsonl() == \
        '{"offset":3,"error":"no ip","kind":"sync error"}'
