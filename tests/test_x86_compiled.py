"""The compiled x86 decoder (flow/core/x86.c) against its twin, the
Python decoder (hwtrace.x86), and the compiled fill path of
hwtrace.flow.fast.filler against the pure-Python one.

The C decoder must give the same size, class, kind, rel, the flags
fast._flags_of derives from the instruction cache's record, and the same
error kind ("truncated" with the same ``needed``, or "invalid") for any
bytes in 16-, 32- and 64-bit mode: every 1- and 2-byte pattern, every
third byte after the escapes, prefixes and groups that change the
decoding, 200k seeded random byte strings, and every offset of every
code .bin of the libipt corpus.
"""

from __future__ import annotations

import hashlib
import random

import pytest

from conftest import CORPUS
from hwtrace.flow import fast
from hwtrace.flow.image import Image, Section
from hwtrace.x86 import X86Error, decode
from hwtrace.x86.insn import Kind

CORE = fast.CORE
pytestmark = pytest.mark.skipif(
    CORE is None or not hasattr(CORE, "x86_decode"),
    reason="compiled flow core not built")

MODES = (1, 2, 3)
# tails that let a pattern decode in full: zeros (ModRM 00: no SIB, no
# displacement), SIB + disp32, and ones whose ModRM has mod 11 / rm 4
TAILS = (b"", bytes(14), b"\x84" + bytes(13), b"\xff" * 14,
         b"\x44\x25" + b"\x80" * 12, b"\xc0\xf8" + bytes(12))


def py_decode(code: bytes, mode: int):
    """The twin's answer in the compiled decoder's form."""
    try:
        x = decode(code, mode)
    except X86Error as e:
        return (e.reason, e.needed if e.truncated else 0)
    if x.kind == Kind.JMPABS:               # as fetch.InsnCache records it
        x = x._replace(is_indirect=True)
    return (x.size, int(x.iclass), int(x.kind), x.rel,
            fast._flags_of(x, False))


def check(codes):
    cdec = CORE.x86_decode
    bad = []
    for code in codes:
        for mode in MODES:
            want = py_decode(code, mode)
            got = cdec(code, mode)
            if got != want:
                bad.append((code.hex(), mode, want, got))
                if len(bad) >= 20:
                    break
    assert not bad, bad


def test_one_and_two_byte_patterns():
    codes = []
    for a in range(256):
        for tail in TAILS:
            codes.append(bytes([a]) + tail)
    for a in range(256):
        for b in range(256):
            codes.append(bytes([a, b]))
            codes.append(bytes([a, b]) + TAILS[1])
            codes.append(bytes([a, b]) + TAILS[4])
    check(codes)


# first two bytes after which the third one selects the decoding: escapes
# and maps, VEX/EVEX/XOP/REX2 payloads, groups decoded by their ModRM,
# prefixes before the 0F map
_PAIRS = [bytes([0x0F, b]) for b in (0x01, 0x22, 0x38, 0x3A, 0xAE, 0xC7,
                                     0x78, 0x0F, 0x80)]
_PAIRS += [bytes([p, 0x0F]) for p in (0x66, 0xF2, 0xF3, 0x48, 0x44, 0x67)]
_PAIRS += [bytes([e, b]) for e in (0xC4, 0x8F, 0x62)
           for b in (0xE1, 0xE2, 0xE3, 0x61, 0x08, 0xE8, 0xC5, 0x05)]
_PAIRS += [bytes([0xC5, b]) for b in (0xF8, 0x78, 0x40)]
_PAIRS += [bytes([0xD5, b]) for b in (0x00, 0x08, 0x80, 0x88, 0x44)]
_PAIRS += [bytes([p, op]) for p in (0x66, 0x67, 0x48, 0xF3)
           for op in (0xC7, 0xC6, 0xF6, 0xF7, 0xFF, 0xE8, 0xE9, 0xA1, 0x9A,
                      0xEA, 0xB8, 0x81, 0x0F, 0xD5)]
_PAIRS += [bytes([op, m]) for op in (0xFF, 0xC7, 0xC6) for m in (0xF8, 0xD0)]


@pytest.mark.parametrize("pair", _PAIRS, ids=lambda p: p.hex())
def test_three_byte_patterns(pair):
    codes = []
    for c in range(256):
        for tail in TAILS:
            codes.append(pair + bytes([c]) + tail)
    check(codes)


def test_random_bytes():
    rng = random.Random(20261201)
    rb = rng.randbytes
    codes = [rb(rng.randint(0, 17)) for _ in range(200_000)]
    check(codes)


def _corpus_bins():
    seen = {}
    for p in sorted(CORPUS.glob("*/*.bin")):
        data = p.read_bytes()
        seen.setdefault(hashlib.sha256(data).digest(), (p, data))
    return [v for v in seen.values()]


def test_corpus_bins_every_offset():
    bins = _corpus_bins()
    assert bins
    codes = []
    for _, data in bins:
        for off in range(len(data)):
            codes.append(data[off:off + 16])
    check(codes)


# -- the fill path ------------------------------------------------------------


def _image(sections):
    img = Image("t")
    for data, vaddr in sections:
        img.add(Section.from_bytes(data), vaddr)
    return img


def _fills(sections, ips, monkeypatch):
    """fill(ip, mode) of the compiled path and of the twin's, each on a
    fresh image."""
    comp = fast.filler(_image(sections))
    with monkeypatch.context() as mp:
        mp.setattr(fast, "CORE", None)
        twin = fast.filler(_image(sections))
    for mode in (0, 1, 2):
        for ip in ips:
            yield ip, mode, comp(ip, mode), twin(ip, mode)


def _assert_fills(sections, ips, monkeypatch):
    bad = [(hex(ip), mode, a, b)
           for ip, mode, a, b in _fills(sections, ips, monkeypatch) if a != b]
    assert not bad, bad[:5]


def test_fill_corpus_images(monkeypatch):
    rng = random.Random(3)
    for p, data in _corpus_bins():
        base = 0x1000
        n = len(data)
        if n <= 4096:
            offs = range(-1, n + 1)
        else:   # the linear-* bins: their ends and a sample between
            offs = sorted({*range(64), *range(n - 64, n + 1),
                           *rng.sample(range(n), 64)})
        _assert_fills([(data, base)], [base + o for o in offs], monkeypatch)


def test_fill_section_crossings(monkeypatch):
    rng = random.Random(7)
    for _ in range(30):
        a = rng.randbytes(rng.randint(1, 40))
        b = rng.randbytes(rng.randint(0, 40))
        # adjacent sections (truncated instructions complete from the
        # next), a gap, and a section at the top of the address space
        _assert_fills([(a, 0x1000), (b, 0x1000 + len(a))],
                      range(0x1000, 0x1000 + len(a) + len(b) + 1),
                      monkeypatch)
        _assert_fills([(a, 0x1000), (b, 0x1000 + len(a) + 3)],
                      range(0x1000, 0x1000 + len(a) + 3), monkeypatch)
        top = (1 << 64) - len(a)
        _assert_fills([(a, top)], range(top, top + len(a)), monkeypatch)


def test_fill_long_runs(monkeypatch):
    # runs of plain instructions longer than FILL_MAX, ending inside a
    # multi-byte instruction at the section end
    nops = b"\x90" * (fast.FILL_MAX + 5) + b"\x48\x8d\x84\x24\x00\x00\x00\x00"
    code = bytes(200) + b"\x0f\x1f\x84\x00\x00\x00\x00\x00" * 300 + b"\xc3"
    for data in (nops, nops[:-3], code, code[:-4]):
        _assert_fills([(data, 0x400000), (b"\x00" * 8, 0x400000 + len(data))],
                      [0x400000, 0x400001, 0x400000 + len(data) - 6],
                      monkeypatch)
        _assert_fills([(data, 0x400000)], [0x400000, 0x400003], monkeypatch)


def test_fill_short_section_data(monkeypatch):
    # a section whose bytes end before its mapping does (a shrunk file)
    sec = Section(name="short", size=64, data=b"\x90" * 20 + b"\x48\x8b")
    for mode in (0, 1, 2):
        img_c, img_p = Image("c"), Image("p")
        img_c.add(sec, 0x1000)
        sec2 = Section(name="short", size=64, data=sec.data)
        img_p.add(sec2, 0x1000)
        comp = fast.filler(img_c)
        with monkeypatch.context() as mp:
            mp.setattr(fast, "CORE", None)
            twin = fast.filler(img_p)
        for ip in range(0x1000, 0x1000 + 66):
            assert comp(ip, mode) == twin(ip, mode), (hex(ip), mode)


def test_fill_unknown_mode_goes_to_the_twin(monkeypatch):
    img = _image([(b"\x90\xc3", 0x1000)])
    comp = fast.filler(img)
    with monkeypatch.context() as mp:
        mp.setattr(fast, "CORE", None)
        twin = fast.filler(_image([(b"\x90\xc3", 0x1000)]))
    assert comp(0x1000, -1) == twin(0x1000, -1)
    with pytest.raises(IndexError):
        comp(0x1000, 3)


# -- fills in C (core/pyfill.h) --------------------------------------------------


def _probe(make_image, ips, mode, filler=None):
    """The cache entries at ``ips`` with C fills, checked against a cache
    filled by the Python fill alone: the same entries at ``ips`` and at
    every other IP the C fills added.  -> (C fills, Python fills)."""
    looked, added, counts = CORE.fill_probe(
        make_image(), filler or fast.filler, fast.mappings, ips, mode)
    more = sorted({e[0] for e in added} - set(ips))
    ref, _, (ref_c, _) = CORE.fill_probe(make_image(), fast.filler, None,
                                         [*ips, *more], mode)
    assert ref_c == 0
    assert looked == ref[:len(ips)]
    by_ip = {e[0]: e for e in ref}
    bad = [e for e in added if by_ip[e[0]] != e]
    assert not bad, bad[:3]
    return counts


def _probe_all(make_image, ips):
    c = p = 0
    for mode in (0, 1, 2):
        a, b = _probe(make_image, list(ips), mode)
        c, p = c + a, p + b
    return c, p


def test_c_fills_corpus_images():
    rng = random.Random(5)
    total = 0
    for p, data in _corpus_bins():
        base = 0x1000
        n = len(data)
        if n <= 4096:
            offs = range(-1, n + 1)
        else:
            offs = sorted({*range(64), *range(n - 64, n + 1),
                           *rng.sample(range(n), 64)})
        c, _ = _probe_all(lambda: _image([(data, base)]),
                          [base + o for o in offs])
        total += c
    assert total > 1000


def test_c_fills_section_crossings():
    rng = random.Random(8)
    for _ in range(30):
        a = rng.randbytes(rng.randint(1, 40))
        b = rng.randbytes(rng.randint(0, 40))
        _probe_all(lambda: _image([(a, 0x1000), (b, 0x1000 + len(a))]),
                   range(0x1000, 0x1000 + len(a) + len(b) + 1))
        _probe_all(lambda: _image([(a, 0x1000), (b, 0x1000 + len(a) + 3)]),
                   range(0x1000, 0x1000 + len(a) + 3))
        top = (1 << 64) - len(a)
        _probe_all(lambda: _image([(a, top)]), range(top, top + len(a)))
        # an overlapping add cuts the older section: a mapping that starts
        # inside its section's data
        _probe_all(lambda: _image([(a + b, 0x1000), (b[:3], 0x1002)]),
                   range(0x1000, 0x1000 + len(a) + len(b) + 1))


def test_c_fills_long_runs():
    nops = b"\x90" * (fast.FILL_MAX + 5) + b"\x48\x8d\x84\x24\x00\x00\x00\x00"
    code = bytes(200) + b"\x0f\x1f\x84\x00\x00\x00\x00\x00" * 300 + b"\xc3"
    for data in (nops, nops[:-3], code, code[:-4]):
        ips = [0x400000, 0x400001, 0x400000 + len(data) - 6,
               *range(0x400000, 0x400000 + len(data), 97)]
        _probe_all(lambda: _image([(data, 0x400000),
                                   (b"\x00" * 8, 0x400000 + len(data))]), ips)
        _probe_all(lambda: _image([(data, 0x400000)]), ips)


def test_c_fills_short_section_data():
    def make():
        img = Image("c")
        img.add(Section(name="short", size=64,
                        data=b"\x90" * 20 + b"\x48\x8b"), 0x1000)
        return img
    c, p = _probe_all(make, range(0x1000, 0x1000 + 66))
    assert c and p


def test_c_fills_follow_image_changes():
    # the Python fill of an unmapped IP maps sections (the image's
    # generation changes): later misses see the new mappings, also where
    # they cut a mapping whose bytes the C fills had loaded
    old = b"\x90" * 8 + b"\xc3" + b"\x90" * 23 + b"\xc3"
    new = ((b"\xcc" * 8 + b"\xc3", 0x1010), (b"\x48\x8b\x00\xc3", 0x5000))

    def filler(image):
        fill = fast.filler(image)

        def changing(ip, mode):
            r = fill(ip, mode)
            if ip == 0x5000:
                for data, vaddr in new:
                    image.add(Section.from_bytes(data), vaddr)
            return r
        return changing

    # 0x1000's fill caches 0x1000..0x1008 from the old bytes (they stay, as
    # with the Python fill); 0x5000 is looked up at the change (its error
    # stays); the rest is decoded from the new mappings
    ips = [0x1000, 0x5000, 0x1008, 0x5000, 0x5003, 0x1010, 0x1018, 0x1019,
           0x1020]
    for mode in (0, 1, 2):
        looked, _, (c, p) = CORE.fill_probe(_image([(old, 0x1000)]), filler,
                                            fast.mappings, ips, mode)
        before, _, _ = CORE.fill_probe(_image([(old, 0x1000)]), fast.filler,
                                       None, [0x1000, 0x1008], mode)
        after, _, _ = CORE.fill_probe(_image([(old, 0x1000), *new]),
                                      fast.filler, None, ips[4:], mode)
        assert [looked[0], looked[2]] == before
        assert looked[1][2] == 13 and looked[3] == looked[1]   # E_NOMAP
        assert looked[4:] == after, mode
        assert c >= 4 and p == 1


def test_c_fills_not_for_other_images():
    class Other:
        def __init__(self):
            self.img = _image([(b"\x90\xc3", 0x1000)])

        def find(self, addr):
            return self.img.find(addr)

    assert fast.mappings(Other()) is None
    looked, _, (c, p) = CORE.fill_probe(Other(), fast.filler, fast.mappings,
                                        [0x1000, 0x1001], 2)
    assert (c, p) == (0, 1)
    ref, _, _ = CORE.fill_probe(_image([(b"\x90\xc3", 0x1000)]), fast.filler,
                                None, [0x1000, 0x1001], 2)
    assert looked == ref
