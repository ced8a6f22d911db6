"""Streaming: traces are decoded in place from a read-only file mapping
(hwtrace.cli._tracemap) or a memoryview, never copied, with the pages
behind the decode released -- and the results are exactly those of a
decode from bytes (both implementations).  No memory numbers here: the
bench (bench/bench_memory.py) measures them; these tests check structure
(no copy, the release hook runs) and equality."""

from __future__ import annotations

import io
import mmap
import shutil
from pathlib import Path

import pytest

from conftest import CORPUS, IN_CI, run_hwtrace, sample_text

from hwtrace.cli import _tracemap
from hwtrace.cli._tracemap import TraceMap, map_trace
from hwtrace.pt import _impl
from hwtrace.pt.decoder import PacketDecoder, find_psb_backward, \
    find_psb_forward
from hwtrace.pt.errors import PtError

IMPLS = ["python", "compiled"]
REAL = Path(__file__).resolve().parent.parent / "examples" / "real-capture.pt"


def _impl_or_skip(impl):
    if impl == "compiled" and _impl.STATUS.module is None and \
            not _impl.STATUS.expected:
        pytest.skip("compiled packet scanner not built")


class Recorder(TraceMap):
    """A TraceMap that releases often and remembers where it was asked."""
    window = 4096
    keep = 0

    def release_before(self, offset):
        self.calls.append(offset)
        return super().release_before(offset)


def _recorder(path, offset=0):
    with open(path, "rb") as f:
        m = Recorder(f.fileno(), 0, access=mmap.ACCESS_READ, offset=offset)
    m.calls = []
    return m


def _corpus_pts():
    return sorted(CORPUS.glob("*/*.pt")) if CORPUS.is_dir() else []


# -- structure: no copies ----------------------------------------------------
def test_decoders_read_the_callers_buffer_in_place(tmp_path):
    from hwtrace.flow.query import QueryDecoder
    p = tmp_path / "t.pt"
    p.write_bytes(REAL.read_bytes())
    m = map_trace(p)
    assert isinstance(m, TraceMap)
    assert PacketDecoder(m).buffer is m
    assert QueryDecoder(m)._pkt.buffer is m
    data = REAL.read_bytes()
    assert PacketDecoder(data).buffer is data
    ba = bytearray(data)
    assert PacketDecoder(ba).buffer == data         # copied: it may grow
    buf = PacketDecoder(memoryview(ba)).buffer
    assert isinstance(buf, memoryview) and buf.obj is ba and buf.readonly
    import array
    words = array.array("I", [0x82028202] * 4)
    buf = PacketDecoder(words).buffer
    assert buf.obj is words and buf.format == "B" and len(buf) == 16
    assert PacketDecoder(words).sync_forward() == 0
    # a range that starts inside a page: a view of the mapping, offsets
    # counting from the range start
    v = map_trace(p, 100, 1000)
    assert isinstance(v, memoryview) and isinstance(v.obj, TraceMap)
    assert len(v) == 1000 and bytes(v) == data[100:1100]
    assert PacketDecoder(v).buffer.obj is v.obj
    # a range starting at a page boundary maps from there
    w = map_trace(p, 4096, 10)
    assert isinstance(w, TraceMap) and bytes(w) == data[4096:4106]
    assert map_trace(p, len(data) + 5) == b""


def test_a_pipe_is_read_not_mapped():
    import subprocess
    import sys
    from hwtrace.pt import encoder as enc
    r = subprocess.run([sys.executable, "-m", "hwtrace", "dump", "/dev/stdin",
                        "--stat"], input=enc.psb() + enc.psbend(),
                       capture_output=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split()[:2] == [b"packets:", b"2"]
    # an empty pipe holds nothing to dump: one line says so
    r = run_hwtrace("dump", "/dev/stdin", "--stat", input="")
    assert r.returncode == 2 and "/dev/stdin: empty file" in r.stderr


@pytest.mark.parametrize("impl", IMPLS)
def test_release_hook_runs_as_the_decode_moves_forward(tmp_path, impl):
    _impl_or_skip(impl)
    p = tmp_path / "t.pt"
    data = REAL.read_bytes() * 3
    p.write_bytes(data)
    want = list(PacketDecoder(data, impl=impl).packets())
    m = _recorder(p)
    assert list(PacketDecoder(m, impl=impl).packets()) == want
    assert m.calls[0] == 0 and m.calls == sorted(m.calls)
    assert len(m.calls) >= len(data) // Recorder.window
    assert all(b - a >= Recorder.window for a, b in zip(m.calls, m.calls[1:]))
    m2 = _recorder(p)
    assert PacketDecoder(m2, impl=impl).count() == \
        PacketDecoder(data, impl=impl).count()
    assert len(m2.calls) >= len(data) // Recorder.window


# -- equality: corpus ---------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
def test_corpus_packets_from_a_mapping_equal_bytes(corpus, impl):
    """Every corpus trace: packets() and count() from bytes, from a mapping
    releasing every page and from a memoryview of a bytearray agree (and
    the packet decoder's sync verbs)."""
    _impl_or_skip(impl)
    n = 0
    for pt in _corpus_pts():
        data = pt.read_bytes()
        if not data:
            continue
        for no_sync in (False, True):
            want = list(PacketDecoder(data, impl=impl).packets(no_sync=no_sync))
            cwant = PacketDecoder(data, impl=impl).count(no_sync=no_sync)
            for buf in (_recorder(pt), memoryview(bytearray(data))):
                got = list(PacketDecoder(buf, impl=impl).packets(
                    no_sync=no_sync))
                assert got == want, (pt.name, type(buf))
                assert PacketDecoder(buf, impl=impl).count(
                    no_sync=no_sync) == cwant, pt.name
        m = _recorder(pt)
        a, b = PacketDecoder(data, impl=impl), PacketDecoder(m, impl=impl)
        for _ in range(3):
            assert a.sync_forward() == b.sync_forward()
        a.sync_set(len(data))
        b.sync_set(len(data))
        for _ in range(3):
            assert a.sync_backward() == b.sync_backward()
        n += 1
    assert n >= 200 or not CORPUS.is_dir()


def test_psb_search_in_a_memoryview_equals_bytes():
    """The twin's PSB search over a memoryview (no .find: searched in
    windows) finds what bytes.find finds, across window boundaries."""
    from hwtrace.pt import decoder as D
    data = REAL.read_bytes()
    big = b"\x00" * ((1 << 20) - 5) + data + b"\x00" * 3 + data
    mv = memoryview(big)
    for start in (0, 5, (1 << 20) - 16, (1 << 20) + 17, len(big) - 40):
        assert find_psb_forward(mv, start) == find_psb_forward(big, start)
    for pos in (len(big), (1 << 20) + 20, 100):
        assert find_psb_backward(mv, pos) == find_psb_backward(big, pos)
    # the window edge splitting a pattern word
    at = D._FIND_CHUNK - 3
    buf = bytearray(at + 64)
    buf[at:at + 16] = b"\x02\x82" * 8
    assert D._find_in_view(memoryview(buf), b"\x02\x82" * 4, 0) == \
        bytes(buf).find(b"\x02\x82" * 4)


@pytest.mark.parametrize("impl", IMPLS)
def test_errors_and_resync_from_a_mapping_equal_bytes(tmp_path, impl):
    """Mutated traces (decode errors, resynchronization across released
    pages): the same packets and errors at the same offsets."""
    import random
    _impl_or_skip(impl)
    base = REAL.read_bytes() * 2
    for seed in range(6):
        rnd = random.Random(seed)
        data = bytearray(base)
        for _ in range(40):
            data[rnd.randrange(len(data))] = rnd.randrange(256)
        data = bytes(data)
        p = tmp_path / f"m{seed}.pt"
        p.write_bytes(data)
        want = list(PacketDecoder(data, impl=impl, cpu="6/92").packets())
        assert any(x.__class__ is PtError for x in want)
        m = _recorder(p)
        assert list(PacketDecoder(m, impl=impl, cpu="6/92").packets()) == want
        assert PacketDecoder(_recorder(p), impl=impl, cpu="6/92").count() \
            == PacketDecoder(data, impl=impl, cpu="6/92").count()


# -- equality: the flow decoders over a recording -------------------------------
def _decode_cli(argv, monkeypatch, mapped: bool) -> str:
    """``hwtrace decode ARGV`` in-process; the trace mapped by the CLI
    (releasing every page) or, with ``mapped=False``, read into bytes."""
    from hwtrace.cli import Parser
    from hwtrace.cli import decode as D
    from hwtrace.cli._tracemap import map_trace as real_map

    def as_bytes(path, offset=0, size=None):
        buf = real_map(path, offset, size)
        return bytes(buf)
    monkeypatch.setattr(_tracemap, "map_trace", real_map if mapped else
                        as_bytes)
    monkeypatch.setattr(TraceMap, "window", 4096)
    monkeypatch.setattr(TraceMap, "keep", 0)
    sub = Parser(prog="hwtrace").add_subparsers(parser_class=Parser)
    D.register(sub)
    args = sub.choices["decode"].parse_args(argv)
    out = io.StringIO()
    import contextlib
    with contextlib.redirect_stdout(out):
        assert D._run_one(args, write=out.write) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """A small emulated recording of gzip (skipped without the engine,
    except in CI, which installs it)."""
    import subprocess
    import sys
    def need(why):
        (pytest.fail if IN_CI else pytest.skip)(why)
    if shutil.which("gzip") is None:
        need("gzip missing")
    work = tmp_path_factory.mktemp("rec")
    (work / "in.txt").write_bytes(sample_text(3000))
    r = run_hwtrace("record", "--copy-images", "-o", work / "b", "--",
                    shutil.which("gzip"), "-9", "-k", "-f", work / "in.txt")
    if r.returncode != 0:
        need(f"recording failed: {r.stderr.strip()[-200:]}")
    pt = max((work / "b").glob("*.pt"), key=lambda p: p.stat().st_size)
    img = subprocess.run([sys.executable, "-m", "hwtrace", "images", "--pt",
                          pt.name, work / "b"], capture_output=True,
                         text=True, check=True).stdout.split()
    return pt, img


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
def test_recording_decodes_the_same_from_a_mapping(recording, monkeypatch,
                                                   impl):
    """The insn and block decoders (jsonl, every item) and the compiled
    counts path over a recording: the mapped decode equals the bytes one
    (both packet scanners; the release hook runs all along)."""
    _impl_or_skip(impl)
    monkeypatch.setattr(_impl, "CORE", _impl.core_for(impl))
    pt, images = recording
    for extra in (["--format", "jsonl", "--insn-decoder"],
                  ["--block-decoder", "--offset"],
                  ["--quiet", "--stat"]):
        argv = ["--pt", str(pt), *images, *extra]
        want = _decode_cli(argv, monkeypatch, mapped=False)
        assert _decode_cli(argv, monkeypatch, mapped=True) == want, extra
        if "--stat" in extra:
            assert want.startswith("insn: ") and int(want.split()[1][:-1]) > 1000
        else:
            assert want.count("\n") > 1000


def test_recording_range_decodes_the_same(recording, monkeypatch):
    """--pt FILE:FROM-TO with an unaligned start: a view of the mapping."""
    pt, images = recording
    from hwtrace.pt.decoder import find_psb_forward as psb
    data = pt.read_bytes()
    a = psb(data, 100)
    b = psb(data, len(data) // 2)
    assert 0 < a < b and a % mmap.PAGESIZE
    argv = ["--pt", f"{pt}:{a:#x}-{b:#x}", *images, "--block-decoder",
            "--offset"]
    want = _decode_cli(argv, monkeypatch, mapped=False)
    assert _decode_cli(argv, monkeypatch, mapped=True) == want
    assert want.count("\n") > 100


# -- the CLI: dump and decode from mappings, bad input --------------------------
def test_dump_ranges_and_whole_file_from_a_mapping(tmp_path):
    data = REAL.read_bytes()
    p = tmp_path / "t.pt"
    p.write_bytes(data)
    q = tmp_path / "r.pt"
    psb2 = find_psb_forward(data, 17)
    q.write_bytes(data[psb2:psb2 + 3000])
    whole = run_hwtrace("dump", p, "--format", "jsonl")
    assert whole.returncode == 0 and whole.stdout.count("\n") == 7966
    rng = run_hwtrace("dump", f"{p}:{psb2:#x}-{psb2 + 3000:#x}")
    ref = run_hwtrace("dump", q)
    assert rng.returncode == 0 and rng.stdout == ref.stdout
    assert rng.stdout.count("\n") > 100


@pytest.mark.parametrize("cmd", ["dump", "decode"])
def test_missing_file_and_bad_range_are_one_line(tmp_path, cmd):
    p = tmp_path / "t.pt"
    p.write_bytes(REAL.read_bytes())
    size = p.stat().st_size

    def call(spec):
        if cmd == "dump":
            return run_hwtrace("dump", spec)
        return run_hwtrace("decode", "--pt", spec, "--raw",
                           f"{p}:0x1000")
    for spec in (tmp_path / "nope.pt", f"{p}:{size + 10:#x}-{size + 20:#x}",
                 f"{p}:0x10-{size + 1:#x}", tmp_path):
        r = call(spec)
        assert r.returncode == 2, (spec, r.stdout[-300:], r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("hwtrace:"), \
            (spec, r.stderr)
        assert "Traceback" not in r.stderr


def test_tracemap_release_keeps_the_window_behind_and_pages_aligned(tmp_path):
    """release_before(offset) drops whole pages up to ``keep`` bytes
    behind the offset (in mapping coordinates: a view's base added) and
    asks to be called again a window later; reading after a release gives
    the same bytes (pages come back from the page cache)."""
    data = REAL.read_bytes() * 8
    p = tmp_path / "t.pt"
    p.write_bytes(data)
    calls = []

    class Spy(TraceMap):
        window = 10000
        keep = 5000

        def madvise(self, option, start=0, length=None):
            calls.append((option, start, length))
            return super().madvise(option, start, length)

    with open(p, "rb") as f:
        m = Spy(f.fileno(), 0, access=mmap.ACCESS_READ)
    assert m.release_before(0) == 10000 and calls == []
    assert m.release_before(5000 + mmap.PAGESIZE + 7) == 15000 + \
        mmap.PAGESIZE + 7
    assert calls == [(mmap.MADV_DONTNEED, 0, mmap.PAGESIZE)]
    m.view_base = 100
    m.release_before(len(data))
    assert calls[-1] == (mmap.MADV_DONTNEED, 0,
                         (len(data) + 100 - 5000) & ~(mmap.PAGESIZE - 1))
    assert m[:] == data


@pytest.mark.parametrize("impl", IMPLS)
def test_a_finished_decode_lets_go_of_the_mapping(tmp_path, impl):
    """An exhausted packets() iterator holds no buffer export: the caller
    can close its mapping."""
    _impl_or_skip(impl)
    p = tmp_path / "t.pt"
    p.write_bytes(REAL.read_bytes())
    m = map_trace(p)
    it = PacketDecoder(m, impl=impl).packets()
    assert sum(1 for _ in it) == 7966
    m.close()
    assert m.closed


@pytest.mark.parametrize("impl", IMPLS)
def test_query_decoder_syncs_the_same_over_a_releasing_mapping(tmp_path,
                                                               monkeypatch,
                                                               impl):
    """The query decoder's sync verbs over a mapping releasing every page
    behind it: forward through every PSB, then backward from the end
    (reading pages released before), the same statuses and offsets."""
    from hwtrace.flow.query import QueryDecoder
    _impl_or_skip(impl)
    monkeypatch.setattr(_impl, "CORE", _impl.core_for(impl))
    data = REAL.read_bytes() * 2
    p = tmp_path / "t.pt"
    p.write_bytes(data)
    m = _recorder(p)
    a, b = QueryDecoder(data), QueryDecoder(m)
    fwd = 0
    while True:
        ra, rb = a.sync_forward(), b.sync_forward()
        assert ra == rb and a.offset == b.offset
        if ra.__class__ is PtError:
            break
        # a few queries between syncs move the packet decoder on
        for _ in range(3):
            assert a.cond_branch() == b.cond_branch()
        fwd += 1
    psbs, at = 0, find_psb_forward(data, 0)
    while at >= 0:
        psbs += 1
        at = find_psb_forward(data, at + 16)
    assert fwd == psbs >= 4 and m.calls
    for _ in range(fwd + 1):
        ra, rb = a.sync_backward(), b.sync_backward()
        assert ra == rb and a.offset == b.offset


def test_compiled_flow_core_releases_behind_it(recording, tmp_path):
    """The compiled flow core (``decode --quiet --stat``) calls a mapping's
    release_before as it passes PSBs, forward only, and counts exactly what
    it counts over bytes; an exception from the hook comes back as that
    exception, not a crash or a wrong count."""
    from hwtrace.flow import fast
    from hwtrace.flow.loaders import load_raw
    from hwtrace.flow.image import Image
    if fast.CORE is None:
        pytest.skip("compiled flow core not loaded")
    pt, images = recording
    image = Image()
    for i in range(0, len(images), 2):
        assert images[i] == "--raw"
        load_raw(image, images[i + 1])
    big = tmp_path / "big.pt"
    data = pt.read_bytes() * max(1, (3 * Recorder.window) // pt.stat().st_size + 1)
    big.write_bytes(data)
    want = fast.count(data, image, impl="compiled")
    assert want.compiled and want.insns > 1000
    m = _recorder(big)
    assert fast.count(m, image, impl="compiled") == want
    assert m.calls[0] == 0 and m.calls == sorted(m.calls)
    assert len(m.calls) >= len(data) // Recorder.window
    assert all(b - a >= Recorder.window for a, b in zip(m.calls, m.calls[1:]))

    class Boom(Recorder):
        def release_before(self, offset):
            raise OSError("boom")
    with open(big, "rb") as f:
        b = Boom(f.fileno(), 0, access=mmap.ACCESS_READ)
    with pytest.raises(OSError, match="boom"):
        fast.count(b, image, impl="compiled")
