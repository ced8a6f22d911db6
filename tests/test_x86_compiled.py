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
