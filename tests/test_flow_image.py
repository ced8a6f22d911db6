"""Memory images: raw/ELF/page-dump loading, overlap rules, bounded reads."""

import struct

import pytest

from hwtrace.flow.image import Image, ImageError, Section
from hwtrace.flow.loaders import (load_elf, load_pagedump, load_raw,
                                  parse_c_number, split_base, split_range)
from conftest import FIXTURES


def test_parse_c_number_like_strtoull():
    assert parse_c_number("0x1000") == 0x1000
    assert parse_c_number("010") == 8
    assert parse_c_number("42") == 42
    assert parse_c_number("0") == 0
    assert parse_c_number("") is None
    assert parse_c_number("x1") is None
    assert parse_c_number("12z") is None


def test_split_raw_argument_like_ptxed():
    assert split_base("a.bin:0x1000") == ("a.bin", 0x1000)
    assert split_base("a.bin") == ("a.bin", None)
    assert split_range("a.bin:0x2") == ("a.bin", 2, None)
    assert split_range("a.bin:2-6") == ("a.bin", 2, 4)
    assert split_range("c:dir/a.bin") == ("c:dir/a.bin", 0, None)
    with pytest.raises(ImageError):
        split_range("a.bin:6-2")


def test_later_sections_overwrite_earlier_ones():
    im = Image()
    im.add_bytes(b"A" * 16, 0x1000)
    im.add_bytes(b"B" * 4, 0x1004)
    assert im.read(0x1000, 16) == b"AAAA"          # bounded by the mapping
    assert im.read(0x1004, 16) == b"BBBB"
    assert im.read(0x1008, 16) == b"A" * 8
    assert im.read(0x0fff, 1) is None
    assert im.read(0x1010, 1) is None
    assert [(m.begin, m.end) for m in im.mappings()] == [
        (0x1000, 0x1004), (0x1004, 0x1008), (0x1008, 0x1010)]
    assert im.isid(0x1000) == im.isid(0x1008) != im.isid(0x1004)


def test_raw_file_with_range(tmp_path):
    f = tmp_path / "code.bin"
    f.write_bytes(bytes(range(16)))
    im = Image()
    load_raw(im, f"{f}:4-8:0x2000")
    assert im.read(0x2000, 15) == bytes([4, 5, 6, 7])
    im2 = Image()
    load_raw(im2, f"{f}:0x100")
    assert im2.read(0x10f, 4) == bytes([15])
    with pytest.raises(ImageError):
        load_raw(Image(), f"{f}")                      # no address
    with pytest.raises(ImageError):
        load_raw(Image(), f"{tmp_path / 'missing'}:0x100")
    with pytest.raises(ImageError):
        load_raw(Image(), f"{f}:4-64:0x100")           # beyond the file


def test_sections_load_lazily(tmp_path):
    f = tmp_path / "code.bin"
    f.write_bytes(b"\x90" * 8)
    sec = Section.from_file(str(f))
    assert sec.data is None
    im = Image()
    im.add(sec, 0x10)
    assert sec.data is None
    assert im.read(0x12, 2) == b"\x90\x90"
    assert sec.data == b"\x90" * 8


def _elf64(segments):
    """A minimal little-endian ELF64 with the given (vaddr, bytes) PT_LOADs."""
    phoff, phentsize = 64, 56
    data_off = phoff + phentsize * len(segments)
    hdr = bytearray(64)
    hdr[:4] = b"\x7fELF"
    hdr[4], hdr[5], hdr[6] = 2, 1, 1
    struct.pack_into("<Q", hdr, 32, phoff)
    struct.pack_into("<HH", hdr, 54, phentsize, len(segments))
    phs, blobs, off = b"", b"", data_off
    for vaddr, blob in segments:
        phs += struct.pack("<IIQQQQQQ", 1, 5, off, vaddr, vaddr, len(blob),
                           len(blob), 0x1000)
        blobs += blob
        off += len(blob)
    return bytes(hdr) + phs + blobs


def test_elf_segments_and_base(tmp_path):
    f = tmp_path / "a.elf"
    f.write_bytes(_elf64([(0x400000, b"\x01\x02"), (0x401000, b"\x03")]))
    im = Image()
    load_elf(im, str(f))
    assert im.read(0x400000, 4) == b"\x01\x02"
    assert im.read(0x401000, 4) == b"\x03"
    im2 = Image()
    load_elf(im2, f"{f}:0x10000")
    assert im2.read(0x10000, 4) == b"\x01\x02"
    assert im2.read(0x11000, 4) == b"\x03"
    f2 = tmp_path / "not.elf"
    f2.write_bytes(b"hello" * 20)
    with pytest.raises(ImageError):
        load_elf(Image(), str(f2))


def test_elf_hardware_fixture_hello():
    hello = FIXTURES / "drpt2trace_simple" / "hello"
    if not hello.exists():
        pytest.skip("fixture missing")
    im = Image()
    load_elf(im, str(hello))
    assert [(m.begin, m.end) for m in im.mappings()] == [
        (0x400000, 0x4000e8), (0x401000, 0x401027), (0x402000, 0x40200e)]


def test_page_dump(tmp_path):
    addrs = tmp_path / "pages.addr"
    pages = tmp_path / "pages.bin"
    addrs.write_bytes(struct.pack("<QQ", 0x7000, 0x3000))
    pages.write_bytes(b"\xaa" * 4096 + b"\xbb" * 4096)
    im = Image()
    assert load_pagedump(im, str(addrs), str(pages)) == 2
    assert im.read(0x7ffe, 4) == b"\xaa\xaa"
    assert im.read(0x3000, 2) == b"\xbb\xbb"
    assert im.read(0x4000, 1) is None
    pages.write_bytes(b"\xaa" * 4096)
    with pytest.raises(ImageError):
        load_pagedump(Image(), str(addrs), str(pages))
