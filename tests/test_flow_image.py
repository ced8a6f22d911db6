"""Memory images: raw/ELF/page-dump loading, overlap rules, bounded reads."""

import struct

import pytest

from hwtrace.flow.image import Image, ImageError, Section
from hwtrace.flow.loaders import (elf_segments, load_elf, load_pagedump,
                                  load_raw, parse_c_number, split_base,
                                  split_range)
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



@pytest.mark.parametrize("offset,size", [(0, None), (5, 9000), (4097, None),
                                         (8192, 100)])
def test_buffer_maps_the_bytes_that_bytes_reads(tmp_path, offset, size):
    # buffer() (the compiled fill's view of a file section) maps the file
    # instead of reading it: the same bytes from any offset, nothing read
    f = tmp_path / "code.bin"
    blob = bytes(range(256)) * 48
    f.write_bytes(blob)
    sec = Section.from_file(str(f), offset, size)
    view = sec.buffer()
    assert sec.data is None
    want = blob[offset:offset + size] if size is not None else blob[offset:]
    assert bytes(view) == want
    assert sec.buffer() is view                     # mapped once
    assert sec.bytes() == want
    assert sec.buffer() == want                     # read: the bytes themselves


def test_buffer_of_a_shrunk_file_ends_where_bytes_ends(tmp_path):
    f = tmp_path / "code.bin"
    f.write_bytes(b"\x90" * 64)
    sec = Section.from_file(str(f), 16)
    f.write_bytes(b"\x90" * 20)                     # shrank after loading
    assert bytes(sec.buffer()) == b"\x90" * 4
    sec2 = Section.from_file(str(f), 8)
    f.write_bytes(b"\x90" * 4)                      # now before the offset
    assert bytes(sec2.buffer()) == b""
    assert Section(name="m", size=3, data=b"abc").buffer() == b"abc"

def _elf64(segments):
    """A minimal little-endian ELF64 with the given (vaddr, bytes) PT_LOADs."""
    phoff, phentsize = 64, 56
    data_off = phoff + phentsize * len(segments)
    hdr = bytearray(64)
    hdr[:4] = b"\x7fELF"
    hdr[4], hdr[5], hdr[6] = 2, 1, 1
    struct.pack_into("<H", hdr, 18, 62)             # e_machine: x86-64
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


def test_elf_segments_read_as_struct_reads_them(tmp_path):
    """elf_segments reads the headers' fields with int.from_bytes (no
    struct at start-up): the same values as struct.unpack_from, for both
    classes; a program header too short for its fields is an ImageError,
    not a crash."""
    f = tmp_path / "a.elf"
    segs = [(0x400000, b"\x01\x02"), (0xFFFFFFFFFFFF0000, b"\x03"),
            (0x8000000000000000, b"")]
    data = _elf64(segs)
    f.write_bytes(data)
    want = [struct.unpack_from("<Q", data, 64 + 56 * k + 8)
            + (len(blob),) + (vaddr,) for k, (vaddr, blob) in enumerate(segs)]
    assert elf_segments(str(f)) == want
    # ELF32: e_phoff at 28, e_phentsize/e_phnum at 42/44; PT_LOAD's
    # p_offset, p_vaddr at 4, 8 and p_filesz at 16
    hdr = bytearray(52)
    hdr[:4], hdr[4], hdr[5] = b"\x7fELF", 1, 1
    struct.pack_into("<H", hdr, 18, 3)              # EM_386
    struct.pack_into("<I", hdr, 28, 52)
    struct.pack_into("<HH", hdr, 42, 32, 2)
    phs = struct.pack("<IIIIIIII", 1, 84, 0x8048000, 0, 3, 3, 5, 0x1000) + \
        struct.pack("<IIIIIIII", 6, 0, 0, 0, 0, 0, 0, 0)
    f32 = tmp_path / "b.elf"
    f32.write_bytes(bytes(hdr) + phs + b"abc")
    assert elf_segments(str(f32)) == [(84, 3, 0x8048000)]
    short = bytearray(data)
    struct.pack_into("<H", short, 54, 12)            # e_phentsize 12
    f.write_bytes(bytes(short))
    with pytest.raises(ImageError):
        elf_segments(str(f))


def test_elf_hardware_fixture_hello(hardware):
    hello = FIXTURES / "drpt2trace_simple" / "hello"
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


# -- per-process address spaces (hwtrace.flow.spaces) ---------------------------

from hwtrace.bundle import Mmap, Process, Switch, Thread  # noqa: E402
from hwtrace.flow.spaces import AddressSpaces, SpaceSwitcher, Timeline  # noqa: E402


def _files(tmp_path, **contents):
    out = {}
    for name, data in contents.items():
        p = tmp_path / name
        p.write_bytes(data)
        out[name] = str(p)
    return out


def test_decode_tables_live_with_the_image():
    """Two images with different code at the same address: a decoder
    switched between them decodes each image's bytes, and switching back
    finds the earlier decodes still there (nothing decoded twice)."""
    from hwtrace.flow.fetch import InsnCache
    a, b = Image(), Image()
    a.add_bytes(b"\x90\xc3", 0x1000)            # nop; ret
    b.add_bytes(b"\xff\xe0", 0x1000)            # jmp rax
    ca = InsnCache(a)
    assert ca.decode(0x1000, "64bit").insn.size == 1
    cb = InsnCache(b)
    assert cb.decode(0x1000, "64bit").insn.size == 2
    again = InsnCache(a)
    assert 0x1000 in again.tables["64bit"]
    assert again.decode(0x1000, "64bit") is ca.decode(0x1000, "64bit")
    a.add_bytes(b"\xcc", 0x1000)                # the image changed: redecode
    assert InsnCache(a).decode(0x1000, "64bit").insn.size == 1
    assert a.decoded["64bit"][0x1000].x86.size == 1
    assert 0x1001 not in a.decoded["64bit"]


def test_fork_child_inherits_then_its_own_mappings_win(tmp_path):
    """A fork child starts with its parent's mappings and its own go on top,
    even when a recorder lists the inherited ones again after the child's
    own (as the emulated engine does); pid -1 (kernel) is in every space."""
    f = _files(tmp_path, exe=b"E" * 64, a=b"A" * 32, b=b"B" * 32, k=b"K" * 16)
    recs = [Process(pid=10, cr3=0x1000, comm="p", time=5),
            Process(pid=11, cr3=0x2000, comm="c", ppid=10, time=5),
            Thread(tid=11, pid=11, time=5),
            Mmap(pid=10, start=0x400000, size=64, offset=0, file=f["exe"], time=5),
            Mmap(pid=10, start=0x500000, size=32, offset=0, file=f["a"], time=5),
            Mmap(pid=11, start=0x500000, size=32, offset=0, file=f["b"], time=5),
            Mmap(pid=11, start=0x400000, size=64, offset=0, file=f["exe"], time=5),
            Mmap(pid=11, start=0x500000, size=32, offset=0, file=f["a"], time=5),
            Mmap(pid=-1, start=0xffff0000, size=16, offset=0, file=f["k"], time=0)]
    sp = AddressSpaces(recs)
    p, c = sp.of_pid(10), sp.of_pid(11)
    assert p.image.read(0x500000, 2) == b"AA" and c.image.read(0x500000, 2) == b"BB"
    assert p.image.read(0x400000, 1) == c.image.read(0x400000, 1) == b"E"
    assert p.image.read(0xffff0000, 1) == c.image.read(0xffff0000, 1) == b"K"
    assert sp.of_cr3(0x2000) is c and sp.of_cr3(0x2000 | 0x18) is c
    assert sp.of_cr3(0x3000) is None
    assert sp.thread_pid == {11: 11}
    # the sections of files both map are read once
    assert p.image.find(0x400000).section is c.image.find(0x400000).section
    assert sp.missing == []


def test_exec_starts_a_new_space_and_missing_files_are_listed(tmp_path):
    f = _files(tmp_path, one=b"1" * 16, two=b"2" * 16)
    recs = [Process(pid=7, cr3=0x1000, exe="/bin/one", time=100),
            Mmap(pid=7, start=0x1000, size=16, offset=0, file=f["one"], time=100),
            Process(pid=7, cr3=0x5000, exe="/bin/two", time=200),
            Mmap(pid=7, start=0x1000, size=16, offset=0, file=f["two"], time=200),
            Mmap(pid=7, start=0x9000, size=16, offset=0, file="/gone", build_id="ab",
                 time=210)]
    sp = AddressSpaces(recs, resolve=lambda file, bid: None if file == "/gone" else file)
    first, second = sp.of_pid(7, 150), sp.of_pid(7, 250)
    assert first is not second and first.cr3 == 0x1000 and second.cr3 == 0x5000
    assert first.image.read(0x1000, 1) == b"1" and second.image.read(0x1000, 1) == b"2"
    assert sp.missing == [(7, "/gone", "ab")]
    assert sp.missing_for([first]) == sp.missing     # by pid
    tl = sp.thread_timeline(7)
    assert [s for _, s in tl.entries] == [first, second]
    assert sp.cpu_timeline(0) is None


def _runs(cpu, *runs):
    """The context switches of *cpu* running each ``(time, pid)`` in turn,
    from idle (a process's one thread has tid = pid; pid -1 is idle)."""
    switches, prev = [], -1
    for time, pid in runs:
        switches.append(Switch(cpu=cpu, time=time, prev_pid=prev, prev_tid=prev,
                               next_pid=pid, next_tid=pid))
        prev = pid
    return switches


def test_timeline_choice_by_time_window_and_ip(tmp_path):
    f = _files(tmp_path, a=b"\x90" * 16, b=b"\x90" * 16)
    recs = [Process(pid=1, cr3=0x1000, time=0), Process(pid=2, cr3=0x2000, time=0),
            Mmap(pid=1, start=0x1000, size=16, offset=0, file=f["a"]),
            Mmap(pid=2, start=0x8000, size=16, offset=0, file=f["b"]),
            *_runs(0, (10, 1), (50, 2), (90, -1)), *_runs(1, (10, 2))]
    sp = AddressSpaces(recs)
    one, two = sp.of_pid(1), sp.of_pid(2)
    tl = sp.cpu_timeline(0)
    assert tl.spaces() == [one, two]
    assert tl.choose(20, None, None) is one
    assert tl.choose(50, None, None) is two             # at the switch: the new one
    assert tl.choose(45, None, one, before=55) is two   # switch inside [45, 55)
    assert tl.choose(45, None, one, before=50) is one   # ... not strictly before
    assert tl.choose(20, 0x8004, one) is two            # time lags: the IP decides
    assert tl.choose(20, 0x1004, one) is one
    assert tl.choose(95, None, two) is two              # idle: keep the current
    assert tl.choose(None, 0x8000, one) is two
    assert tl.choose(None, 0x1000, one) is one
    assert sp.cpu_timeline(1).spaces() == [two]
    assert Timeline([]).choose(5, 0x1000, one) is one


def test_cr3_filtered_timeline_has_only_the_matching_processes(tmp_path):
    """With a CR3 filter a process of another CR3 traces nothing (ContextEn
    needs CR3 to match): its stretch of the CPU's timeline is no one's, so
    a coarse time window never picks it, and a stream that ran it besides
    the filtered one has one space.  A CR3 the sideband doesn't know (0)
    is left in; without a filter the timeline is as before."""
    f = _files(tmp_path, a=b"\x90" * 16, b=b"\x90" * 16)
    recs = [Process(pid=1, cr3=0x1000, time=0), Process(pid=2, cr3=0x2000, time=0),
            Process(pid=3, cr3=0, time=0),
            Mmap(pid=1, start=0x1000, size=16, offset=0, file=f["a"]),
            Mmap(pid=2, start=0x1000, size=16, offset=0, file=f["b"]),
            Mmap(pid=3, start=0x1000, size=16, offset=0, file=f["b"]),
            *_runs(0, (10, 1), (50, 2), (90, 1)), *_runs(1, (10, 3))]
    sp = AddressSpaces(recs)
    one, two, three = sp.of_pid(1), sp.of_pid(2), sp.of_pid(3)
    tl = sp.cpu_timeline(0)
    assert tl.choose(45, 0x1000, one, before=60) is two     # the window says: maybe 2
    for match in (0x1000, 0x1000 | 0x1f):                   # bits 4:0 aren't compared
        tl, first = sp.for_stream(cpu=0, cr3_match=match)
        assert first is one and tl.spaces() == [one]
        assert [s for _, s in tl.entries] == [one, None, one]
        assert tl.choose(45, 0x1000, one, before=60) is one
        assert tl.choose(60, 0x1000, one) is one
    tl, first = sp.for_stream(cpu=0, cr3_match=0x2000)
    assert first is two and tl.spaces() == [two]
    assert sp.for_stream(cpu=0)[0].spaces() == [one, two]
    assert sp.for_stream(cpu=1, cr3_match=0x1000)[0].spaces() == [three]


def test_pip_switches_the_decoder_to_that_cr3s_image(tmp_path):
    """MOV CR3 with a PIP: the next instruction comes from the new CR3's
    space (there: two indirect jumps, one TIP each, the second disabling),
    not the old one's (there: nops running off the mapping)."""
    from hwtrace.flow import session
    from hwtrace.flow.insn import InsnDecoder
    from hwtrace.pt import encoder as enc
    f = _files(tmp_path, a=b"\x90\x0f\x22\xd8" + b"\x90" * 4,
               b=b"\x90\x0f\x22\xd8\xff\xe0\xff\xe0")
    recs = [Process(pid=1, cr3=0x1000), Process(pid=2, cr3=0x2000),
            Mmap(pid=1, start=0x1000, size=8, offset=0, file=f["a"]),
            Mmap(pid=2, start=0x1000, size=8, offset=0, file=f["b"])]
    sp = AddressSpaces(recs)
    trace = (enc.psb() + enc.mode_exec(csl=1) + enc.psbend() + enc.tip_pge(0x1000)
             + enc.pip(0x2000) + enc.tip(0x1006) + enc.tip_pgd())

    class Sink:
        def __init__(self):
            self.items = []

        def insn(self, insn, offset):
            self.items.append(("insn", insn.ip))

        def event(self, ev, offset):
            self.items.append((ev.type, getattr(ev, "cr3", None)))

        def error(self, kind, offset, ip, code):
            self.items.append(("error", code))

        def status(self, name, offset):
            self.items.append((name, None))

    seen = []
    dec = InsnDecoder(trace, sp.of_pid(1).image)
    sw = SpaceSwitcher(dec, sp, None, sp.of_pid(1),
                       on_switch=lambda s, off: seen.append(s.pid))
    sink = Sink()
    session.run_insn(sw, sink)
    insns = [ip for k, ip in sink.items if k == "insn"]
    assert insns == [0x1000, 0x1001, 0x1004, 0x1006]
    assert ("paging", 0x2000) in sink.items and ("disabled", None) in sink.items
    assert not [x for x in sink.items if x[0] == "error"]
    assert seen == [1, 2] and sw.space is sp.of_pid(2)
    assert sw.saw_pip
    # without the switch the old space's nops run off its mapping
    sink2 = Sink()
    session.run_insn(InsnDecoder(trace, sp.of_pid(1).image), sink2)
    assert [x for x in sink2.items if x[0] == "error"]
    # a CR3 the sideband doesn't know switches nothing and leaves the
    # choice to time stamps
    other = trace.replace(enc.pip(0x2000), enc.pip(0x9000))
    sw = SpaceSwitcher(InsnDecoder(other, sp.of_pid(1).image), sp, None, sp.of_pid(1))
    sink3 = Sink()
    session.run_insn(sw, sink3)
    assert sw.space is sp.of_pid(1) and not sw.saw_pip
    assert [x for x in sink3.items if x[0] == "error"]


def test_cycle_accurate_clock():
    """Last TSC plus the CYC cycles since, at nominal/CBR; unknown before
    the first TSC, after an overflow (until the next PSB's TSC) and
    without a CBR; asking for an earlier offset starts over."""
    from hwtrace.flow.spaces import CycClock
    from hwtrace.pt import encoder as enc
    parts = [enc.psb(), enc.tsc(1000), enc.cbr(22), enc.psbend(), enc.cyc(5),
             enc.tip_pge(0x1000), enc.cyc(7), enc.tip_pgd(), enc.ovf(), enc.cyc(3),
             enc.psb(), enc.tsc(5000), enc.psbend(), enc.cyc(1)]
    off, at = 0, []
    for p in parts:
        at.append(off)
        off += len(p)
    data = b"".join(parts)
    c = CycClock(data, 44)                      # 2 TSC ticks per cycle
    assert c.at(at[1]) is None                  # before the TSC
    assert c.at(at[4]) == 1000
    assert c.at(at[5]) == 1010
    assert c.at(at[7]) == 1024
    assert c.at(at[9]) is None                  # after the overflow
    assert c.at(len(data)) == 5002
    assert c.at(at[6]) == 1010                  # starts over
    # an event's time: at its own packet (a TIP.PGE), not counting the
    # CYC read after it; the start of a recent packet that is not a
    # timing packet is answered without starting over
    c = CycClock(data, 44)
    assert c.event_at(at[7]) == 1010 and c.at(at[7]) == 1024
    assert c.at(at[5]) == 1010 and c._pos == at[7]
    assert c.event_at(at[10]) is None           # the OVF's
    assert CycClock(data, 0).at(len(data)) is None
    nocbr = enc.psb() + enc.tsc(7) + enc.psbend() + enc.cyc(4)
    assert CycClock(nocbr, 44).at(len(nocbr)) is None


def _two_runs_same_code(tmp_path, back=200):
    """Processes 1 and 2 map the same code at 0x1000 (nop; syscall; nop;
    syscall; jmp rax); CPU 0 runs 1 from time 100, 2 from 150, 1 from
    *back*."""
    code = b"\x90\x0f\x05\x90\x0f\x05\xff\xe0"
    f = _files(tmp_path, code=code)
    recs = [Process(pid=1, cr3=0x1000), Process(pid=2, cr3=0x2000),
            Mmap(pid=1, start=0x1000, size=8, offset=0, file=f["code"]),
            Mmap(pid=2, start=0x1000, size=8, offset=0, file=f["code"]),
            *_runs(0, (100, 1), (150, 2), (back, 1))]
    return AddressSpaces(recs)


class _NoDecoder:
    """What a SpaceSwitcher asks of its decoder when only its choice of a
    resuming process is tested (no decode)."""
    ip = 0
    offset = 0

    def set_image(self, image):
        pass


def test_coarse_time_resolved_by_where_a_process_resumes(tmp_path):
    """Without CYC the time stamps may fit several processes around an
    enable: the one that left user code exactly at the enable's IP goes on
    (if only one did).  The switcher learns those IPs from the disables."""
    from hwtrace.flow import session
    from hwtrace.flow.insn import InsnDecoder
    from hwtrace.pt import encoder as enc
    sp = _two_runs_same_code(tmp_path, back=160)
    one, two = sp.of_pid(1), sp.of_pid(2)
    tl = sp.cpu_timeline(0)
    sw = SpaceSwitcher(_NoDecoder(), sp, tl, one)
    sw._resume = {one: 0x1003, two: 0x1006}
    assert sw._resuming(120, 170, 0x1006) is two
    assert sw._resuming(120, 170, 0x1003) is one
    assert sw._resuming(120, 140, 0x1006) is None       # only pid 1 fits
    assert sw._resuming(120, 170, 0x1000) is None       # nobody left there
    assert sw.ambiguous == set()
    sw._resume = {one: 0x1003, two: 0x1003}
    assert sw._resuming(120, 170, 0x1003) is None       # both did
    assert sw.ambiguous == {0}          # noted (at the decoder's offset)
    assert sw._resuming(None, None, 0x1003) is None
    # a decode: the disables tell where each process left
    trace = (enc.psb() + enc.tsc(100) + enc.cbr(22) + enc.mode_exec(csl=1)
             + enc.psbend() + enc.tip_pge(0x1000) + enc.tip_pgd()
             + enc.tip_pge(0x1003) + enc.fup(0x1004) + enc.tip_pgd())
    dec = InsnDecoder(trace, one.image)
    sw = SpaceSwitcher(dec, sp, tl, one)

    class Sink:
        def __getattr__(self, name):
            return lambda *a: None
    session.run_insn(sw, Sink())
    assert sw._resume == {one: 0x1004}


def test_coarse_time_a_switched_out_process_resumes_nothing(tmp_path):
    """Where the process that ran last stopped exactly at the enable's IP,
    it still does not resume there if a switch at or before the enable's
    time stamp (which is never later than the enable) replaced it -- e.g.
    it exited; a fork child and its parent stop at the same libc IPs."""
    sp = _two_runs_same_code(tmp_path)
    one, two = sp.of_pid(1), sp.of_pid(2)
    sw = SpaceSwitcher(_NoDecoder(), sp, sp.cpu_timeline(0), two)
    sw._resume = {two: 0x1003}
    # switched out at 200, before the enable (time 205): only 1 can run
    assert sw._resuming(205, 250, 0x1003) is None
    # the window still allows 2 (the switch at 200 may come after it)
    sw._resume = {two: 0x1003, one: 0x1006}
    assert sw._resuming(160, 250, 0x1003) is two
    assert sw._resuming(160, 250, 0x1006) is one


def test_coarse_time_bound_is_the_timing_packet_after_the_enable(tmp_path):
    """Without CYC an enable lies between its time stamp and the next
    timing packet's.  The query decoder reads ahead past a timing packet
    right after the TIP.PGE (and a flow decoder may query on before it
    reports the enable): that packet is the bound, not the next one after
    the decoder's position -- else a switch between the two counts as
    possibly before the enable and (nobody stopped at its IP) is taken.
    Twin and compiled core alike."""
    from hwtrace.flow import fast
    from hwtrace.flow.batches import python_batches
    from hwtrace.flow.insn import InsnDecoder
    from hwtrace.flow.spaces import SpacePlan
    from hwtrace.pt import encoder as enc
    sp = _two_runs_same_code(tmp_path)
    one = sp.of_pid(1)
    tl = sp.cpu_timeline(0)
    # 1 runs to its syscall; enabled again at 0x1000 (where no one
    # stopped) at time 140, bounded by 145: still 1 (2 comes at 150); the
    # third enable, at 160, is 2's
    head = (enc.psb() + enc.tsc(100) + enc.cbr(22) + enc.mode_exec(csl=1)
            + enc.psbend() + enc.tip_pge(0x1000) + enc.fup(0x1001) + enc.tip_pgd()
            + enc.tsc(140) + enc.tip_pge(0x1000) + enc.tsc(145)
            + enc.fup(0x1001) + enc.tip_pgd() + enc.tsc(160))
    third = len(head)
    trace = head + enc.tip_pge(0x1000) + enc.fup(0x1001) + enc.tip_pgd() + enc.tsc(190)
    producers = ["twin"] + (["core"] if fast.STATUS.module is not None else [])
    for producer in producers:
        got = []
        plan = SpacePlan(sp, tl, one, on_switch=lambda s, o: got.append((s.pid, o)))
        if producer == "twin":
            list(python_batches(trace, one.image, decoder="insn",
                                dec=plan.wrap(InsnDecoder(trace, one.image)), plan=plan))
        else:
            list(fast.compiled_batches(fast.STATUS.module, trace, one.image,
                                       decoder="insn", spaces=plan))
        # 1 from the start; 2 only once the third enable is decoded (the
        # switch is told at the decoder's offset: past that TIP.PGE)
        assert [p for p, _ in got] == [1, 2], producer
        assert got[1][1] > third, (producer, got)


def test_a_psb_inside_a_run_is_placed_at_its_own_tsc(tmp_path):
    """A PSB+ while a process runs (tracing on) restates the state with
    a TSC packet taken where its FUP's IP runs: its time is that TSC's,
    no window up to the next timing packet.  Placed in that window, a
    switch recorded just after the PSB (before the next timing packet)
    was taken for one before it, and the process switched in there
    decoded the rest of the run (a script's cat, just before the shell
    ran again, at an IP its libc maps too: a decode error).  Here 1 runs
    through a PSB at 148; 2 is switched in at 150, the next timing packet
    says 155: 1 goes on up to its syscall; 2 comes with the next enable.
    Twin and compiled core alike."""
    from hwtrace.flow import fast
    from hwtrace.flow.batches import python_batches
    from hwtrace.flow.insn import InsnDecoder
    from hwtrace.flow.spaces import SpacePlan
    from hwtrace.pt import encoder as enc
    sp = _two_runs_same_code(tmp_path)
    one = sp.of_pid(1)
    tl = sp.cpu_timeline(0)
    trace = (enc.psb() + enc.tsc(100) + enc.cbr(22) + enc.mode_exec(csl=1)
             + enc.psbend() + enc.tip_pge(0x1000)
             + enc.psb() + enc.tsc(148) + enc.cbr(22) + enc.mode_exec(csl=1)
             + enc.fup(0x1001) + enc.psbend() + enc.tsc(155)
             + enc.fup(0x1001) + enc.tip_pgd() + enc.tsc(160))
    last = len(trace)                                           # 2's
    trace += enc.tip_pge(0x1003) + enc.fup(0x1004) + enc.tip_pgd() + enc.tsc(190)
    producers = ["twin"] + (["core"] if fast.STATUS.module is not None else [])
    for producer in producers:
        got = []
        plan = SpacePlan(sp, tl, one, on_switch=lambda s, o: got.append((s.pid, o)))
        if producer == "twin":
            list(python_batches(trace, one.image, decoder="insn",
                                dec=plan.wrap(InsnDecoder(trace, one.image)), plan=plan))
        else:
            list(fast.compiled_batches(fast.STATUS.module, trace, one.image,
                                       decoder="insn", spaces=plan))
        assert [p for p, _ in got] == [1, 2], (producer, got)
        assert got[1][1] > last, (producer, got)


def test_a_window_ending_idle_is_the_process_before_it(tmp_path):
    """A coarse time stamp's window that ends in an idle stretch (nothing
    traced there) is of the process that ran before it in the window, not
    of the next one after the window that maps the IP (a shell, switched
    out to wait for its child, was taken for the child's exec'd cat)."""
    code = b"\x90\x0f\x05\x90\x0f\x05\xff\xe0"
    f = _files(tmp_path, code=code)
    sp = AddressSpaces([Process(pid=1, cr3=0x1000), Process(pid=2, cr3=0x2000),
                        Mmap(pid=1, start=0x1000, size=8, offset=0, file=f["code"]),
                        Mmap(pid=2, start=0x1000, size=8, offset=0, file=f["code"]),
                        *_runs(0, (100, 1), (150, -1), (200, 2))])
    one, two = sp.of_pid(1), sp.of_pid(2)
    tl = sp.cpu_timeline(0)
    assert tl.choose(140, 0x1003, one, before=200) is one
    assert tl.choose(140, 0x1003, None, before=200) is one
    assert tl.choose(140, 0x1003, one, before=201) is two   # 2 in the window
    assert tl.choose(160, 0x1003, one, before=200) is two   # all idle: the next


def test_an_enable_just_before_a_psb_is_bounded_by_its_tsc(tmp_path):
    """An enable followed by a PSB+ before any other timing packet: the
    PSB+'s TSC bounds its time (there was no bound: the MTC-estimated
    time stamp, trailing, put the enable before a switch that came before
    it, and the process switched out decoded the next one's code -- a
    decode error).  Processes 1 and 2 map different code at 0x1000 (1: a
    syscall at 0x1003, 2: a jz, its syscall at 0x1005); CPU 0 runs 1
    from 100, 2 from 150.  Twin and compiled core alike."""
    from hwtrace.flow import fast
    from hwtrace.flow.batches import ErrorItem, python_batches
    from hwtrace.flow.insn import InsnDecoder
    from hwtrace.flow.spaces import SpacePlan
    from hwtrace.pt import encoder as enc
    f = _files(tmp_path, a=b"\x90\x0f\x05\x0f\x05\x90\xff\xe0",
               b=b"\x90\x0f\x05\x74\x00\x0f\x05\x90")
    sp = AddressSpaces([Process(pid=1, cr3=0x1000), Process(pid=2, cr3=0x2000),
                        Mmap(pid=1, start=0x1000, size=8, offset=0, file=f["a"]),
                        Mmap(pid=2, start=0x1000, size=8, offset=0, file=f["b"]),
                        *_runs(0, (100, 1), (150, 2))])
    one = sp.of_pid(1)
    tl = sp.cpu_timeline(0)
    trace = (enc.psb() + enc.tsc(100) + enc.cbr(22) + enc.mode_exec(csl=1)
             + enc.psbend() + enc.tip_pge(0x1000) + enc.fup(0x1001) + enc.tip_pgd()
             + enc.tsc(140) + enc.tip_pge(0x1003) + enc.tnt8("!")
             + enc.psb() + enc.tsc(160) + enc.cbr(22) + enc.mode_exec(csl=1)
             + enc.fup(0x1005) + enc.psbend() + enc.fup(0x1005) + enc.tip_pgd())
    producers = ["twin"] + (["core"] if fast.STATUS.module is not None else [])
    for producer in producers:
        got = []
        plan = SpacePlan(sp, tl, one, on_switch=lambda s, o: got.append(s.pid))
        if producer == "twin":
            out = list(python_batches(trace, one.image, decoder="insn",
                                      dec=plan.wrap(InsnDecoder(trace, one.image)),
                                      plan=plan))
        else:
            out = list(fast.compiled_batches(fast.STATUS.module, trace, one.image,
                                             decoder="insn", spaces=plan))
        errors = [it for b in out for _, _, it in b.items if isinstance(it, ErrorItem)]
        assert got == [1, 2] and errors == [], (producer, got, errors)


def test_cycle_accurate_enable_time_is_its_own_not_the_next_packets(tmp_path):
    """With CYC an enable is placed at the time of its TIP.PGE.  The query
    decoder reads ahead past the CYC right after it, which counts the
    cycles of the enabled code up to the next packet: counted in, a
    process that ran only a few instructions before the next switch
    looked as late as that switch, and the process switched in there was
    taken for it.  Here 1 stops at its syscall at 150, 2 (a fork child:
    the same code, stopped at the same IP) runs from 150 to 160, 1 again
    from 160 -- a dozen instructions, as a fork child's first run up to
    its first system call.  Twin and compiled core alike."""
    from hwtrace.flow import fast
    from hwtrace.flow.batches import python_batches
    from hwtrace.flow.config import FlowConfig
    from hwtrace.flow.insn import InsnDecoder
    from hwtrace.flow.spaces import SpacePlan
    from hwtrace.pt import encoder as enc
    sp = _two_runs_same_code(tmp_path, back=160)
    one = sp.of_pid(1)
    tl = sp.cpu_timeline(0)
    cfg = FlowConfig(nom_freq=22)           # CBR 22: one TSC tick per cycle
    trace = (enc.psb() + enc.tsc(100) + enc.cbr(22) + enc.mode_exec(csl=1)
             + enc.psbend() + enc.tip_pge(0x1000) + enc.cyc(50)
             + enc.fup(0x1001) + enc.tip_pgd())                 # 1 up to 150
    second = len(trace)
    trace += enc.tip_pge(0x1003) + enc.cyc(10) + enc.fup(0x1004) + enc.tip_pgd()
    third = len(trace)                                          # 2 up to 160
    trace += enc.tip_pge(0x1003) + enc.cyc(5) + enc.fup(0x1004) + enc.tip_pgd()
    producers = ["twin"] + (["core"] if fast.STATUS.module is not None else [])
    for producer in producers:
        got = []
        plan = SpacePlan(sp, tl, one, cyc=True,
                         on_switch=lambda s, o: got.append((s.pid, o)))
        if producer == "twin":
            list(python_batches(trace, one.image, cfg, decoder="insn",
                                dec=plan.wrap(InsnDecoder(trace, one.image, cfg)),
                                plan=plan))
        else:
            list(fast.compiled_batches(fast.STATUS.module, trace, one.image, cfg,
                                       decoder="insn", spaces=plan))
        # each switch is told at the decoder's offset once it has the
        # enable: past that enable's TIP.PGE and CYC (placed by the next
        # packets' time, 2 came one enable early: at the end of 1's run)
        assert [p for p, _ in got] == [1, 2, 1], (producer, got)
        assert second < got[1][1] <= third < got[2][1], (producer, got)


def test_one_candidate_space_is_never_called_back(tmp_path, monkeypatch):
    """Where the sideband leaves one space for the whole stream (one
    process on the CPU, idle between), no enable, synchronization or
    disable can change the switcher's choice: it acts on none (nor does
    the compiled core call it back), with the same records as without
    it.  Two processes on the CPU still switch by time; a one-space
    timeline with another process's CR3 known still heeds PIPs only.
    Twin and compiled core alike."""
    from hwtrace.flow import fast
    from hwtrace.flow.batches import python_batches
    from hwtrace.flow.insn import InsnDecoder
    from hwtrace.flow.spaces import SpacePlan
    from hwtrace.pt import encoder as enc
    code = b"\x90\x0f\x05\x90\x0f\x05\xff\xe0"
    f = _files(tmp_path, code=code)
    alone = AddressSpaces([Process(pid=1, cr3=0x1000),
                           Mmap(pid=1, start=0x1000, size=8, offset=0, file=f["code"]),
                           *_runs(0, (100, 1), (150, -1), (200, 1))])
    two = _two_runs_same_code(tmp_path)
    trace = (enc.psb() + enc.tsc(100) + enc.cbr(22) + enc.mode_exec(csl=1)
             + enc.psbend() + enc.tip_pge(0x1000) + enc.fup(0x1001) + enc.tip_pgd()
             + enc.tsc(140) + enc.tip_pge(0x1000) + enc.tsc(145)
             + enc.fup(0x1001) + enc.tip_pgd() + enc.tsc(160)
             + enc.tip_pge(0x1000) + enc.fup(0x1001) + enc.tip_pgd() + enc.tsc(190))
    calls = []
    by_time = SpaceSwitcher._by_time
    monkeypatch.setattr(SpaceSwitcher, "_by_time",
                        lambda self, *a, **k: (calls.append(a), by_time(self, *a, **k)))

    def records(batches):
        return [(b.first_insn, b.blocks.tobytes(),
                 repr(b.items)) for b in batches]

    producers = ["twin"] + (["core"] if fast.STATUS.module is not None else [])
    for sp, pids in ((alone, [1]), (two, [1, 2])):
        one = sp.of_pid(1)
        tl = sp.cpu_timeline(0)
        for producer in producers:
            calls.clear()
            got = []
            plan = SpacePlan(sp, tl, one, on_switch=lambda s, o: got.append(s.pid))
            def decode(plan):
                if producer == "twin":
                    return records(python_batches(trace, one.image, decoder="insn",
                                                  plan=plan))
                return records(fast.compiled_batches(fast.STATUS.module, trace, one.image,
                                                     decoder="insn", spaces=plan))
            run = decode(plan)
            assert got == pids, (producer, got)
            if sp is alone:
                assert calls == [], producer
                # the same records as a switcher acting on everything
                with monkeypatch.context() as m:
                    init = SpaceSwitcher.__init__

                    def acting(self, *a, **k):
                        init(self, *a, **k)
                        self.events, self.syncs = SpaceSwitcher.EVENTS, True
                    m.setattr(SpaceSwitcher, "__init__", acting)
                    assert decode(SpacePlan(sp, tl, one)) == run, producer
                assert len(calls) >= 3, (producer, calls)
            else:
                assert len(calls) >= 3, (producer, calls)
    assert plan.wrap(InsnDecoder(trace, one.image)).events == SpaceSwitcher.EVENTS
    # one process alone: nothing; a PIP could still select another's space
    sw = SpaceSwitcher(_NoDecoder(), alone, alone.cpu_timeline(0), alone.of_pid(1))
    assert not sw.events and not sw.syncs
    sw = SpaceSwitcher(_NoDecoder(), two, two.thread_timeline(1), two.of_pid(1))
    assert sw.events == {"paging", "async_paging"} and not sw.syncs


def test_perf_style_fork_then_exec(tmp_path):
    """perf's sideband: a fork (no exe, CR3 unknown) and later an exec of
    the same pid (with exe): the exec starts a fresh space, without the
    parent's mappings; a rename (no exe) changes nothing."""
    f = _files(tmp_path, sh=b"S" * 16, prog=b"P" * 16)
    recs = [Process(pid=1, cr3=0, comm="sh", exe="/bin/sh", time=10),
            Mmap(pid=1, start=0x1000, size=16, offset=0, file=f["sh"], time=10),
            Process(pid=2, cr3=0, comm="sh", ppid=1, time=20),
            Process(pid=2, cr3=0, comm="prog", exe="/usr/bin/prog", time=30),
            Mmap(pid=2, start=0x8000, size=16, offset=0, file=f["prog"], time=31),
            Process(pid=2, cr3=0, comm="renamed", time=40)]
    sp = AddressSpaces(recs)
    forked, execd = sp.of_pid(2, 25), sp.of_pid(2, 35)
    assert forked is not execd and sp.of_pid(2) is execd and execd.comm == "renamed"
    assert forked.image.read(0x1000, 1) == b"S" and forked.image.read(0x8000, 1) is None
    assert execd.image.read(0x1000, 1) is None and execd.image.read(0x8000, 1) == b"P"
    assert sp.of_cr3(0) is None                     # CR3 0: unknown, never matched


def test_for_stream(tmp_path):
    f = _files(tmp_path, a=b"A" * 16)
    recs = [Process(pid=1, cr3=0x1000), Process(pid=2, cr3=0x2000, ppid=1),
            Thread(tid=22, pid=2),
            Mmap(pid=1, start=0x1000, size=16, offset=0, file=f["a"]),
            Switch(cpu=3, time=5, prev_pid=-1, prev_tid=-1, next_pid=-1, next_tid=-1),
            Switch(cpu=3, time=9, prev_pid=-1, prev_tid=-1, next_pid=2, next_tid=22)]
    sp = AddressSpaces(recs)
    tl, first = sp.for_stream(cpu=3)
    assert first is sp.of_pid(2) and tl.spaces() == [first]
    assert first.image.read(0x1000, 1) == b"A"          # inherited from pid 1
    tl, first = sp.for_stream(tid=22)
    assert first is sp.of_pid(2) and tl.entries == [(0, first)]
    tl, first = sp.for_stream(cpu=0)                    # no switches on cpu 0
    assert tl is None and first.pid == -1 and first.image.read(0x1000, 1) == b"A"
    single = AddressSpaces(recs[:1] + recs[3:4])
    assert single.for_stream(cpu=0) == (None, single.of_pid(1))


def _insn_clock_decode(sp, tl, initial, trace, producer, insn_clock=True,
                       decoder="insn"):
    """Decode ``trace`` switched by a plan on an instruction-count clock:
    ``(switches as (pid, offset), error items)``."""
    from hwtrace.flow import fast
    from hwtrace.flow.batches import ErrorItem, python_batches
    from hwtrace.flow.spaces import SpacePlan
    got = []
    plan = SpacePlan(sp, tl, initial, insn_clock=insn_clock,
                     on_switch=lambda s, o: got.append((s.pid, o)))
    if producer == "twin":
        out = list(python_batches(trace, initial.image, decoder=decoder, plan=plan))
    else:
        out = list(fast.compiled_batches(fast.STATUS.module, trace, initial.image,
                                         decoder=decoder, spaces=plan))
    errors = [it for b in out for _, _, it in b.items if isinstance(it, ErrorItem)]
    return got, errors


def _fork_pair_on_one_cpu(tmp_path, runs):
    """Processes 1 and 2 (a parent and its fork child) map the same code at
    0x1000 (jnz 0x1000; syscall; jnz 0x1004; syscall; jmp rax), CPU 0 runs
    them as ``runs`` says (``_runs``)."""
    code = b"\x75\xfe\x0f\x05\x75\xfe\x0f\x05\xff\xe0"
    f = _files(tmp_path, code=code)
    return AddressSpaces([Process(pid=1, cr3=0x1000), Process(pid=2, cr3=0x2000),
                          Mmap(pid=1, start=0x1000, size=10, offset=0, file=f["code"]),
                          Mmap(pid=2, start=0x1000, size=10, offset=0, file=f["code"]),
                          *_runs(0, *runs)])


def test_insn_clock_places_an_enable_at_its_exact_time(tmp_path):
    """On an instruction-count clock (the emulated engine's: one tick per
    traced instruction) the time at an enable is the last TSC's plus the
    instructions decoded since: a TSC-only trace, whose time stamps are a
    PSB apart, places each enable exactly.  CPU 0 runs 2 from 90 to 100
    (10 instructions up to its syscall), 1 from 100 to 106, 2 again from
    106; both stop at the same syscall, so where each resumes says
    nothing, and the window up to the next TSC (150) holds every switch:
    by the window the second enable was taken for 2 (the last switch in
    it), 1's code decoded as 2's.  Twin and compiled core alike, insn
    and block decoders."""
    from hwtrace.flow import fast
    from hwtrace.pt import encoder as enc
    sp = _fork_pair_on_one_cpu(tmp_path, [(90, 2), (100, 1), (106, 2)])
    two = sp.of_pid(2)
    tl = sp.cpu_timeline(0)
    trace = (enc.psb() + enc.tsc(90) + enc.cbr(22) + enc.mode_exec(csl=1)
             + enc.psbend() + enc.tip_pge(0x1000)
             + enc.tnt8("tttttt") + enc.tnt8("ttn") + enc.tip_pgd())   # 2: 10
    second = len(trace)
    trace += (enc.tip_pge(0x1004) + enc.tnt8("ttttn")              # 1: 6 to 106
              + enc.tip_pgd())
    third = len(trace)
    trace += (enc.tip_pge(0x1004) + enc.tnt8("n") + enc.tip_pgd()  # 2 again
              + enc.tsc(150))
    producers = ["twin"] + (["core"] if fast.STATUS.module is not None else [])
    for producer in producers:
        for decoder in ("insn", "block"):
            got, errors = _insn_clock_decode(sp, tl, two, trace, producer,
                                             decoder=decoder)
            assert [p for p, _ in got] == [2, 1, 2], (producer, decoder, got)
            assert second < got[1][1] <= third < got[2][1], (producer, decoder, got)
            assert errors == [], (producer, decoder, errors)
        # by the time stamps' window alone (not a counted clock): 2 stays
        got, _ = _insn_clock_decode(sp, tl, two, trace, producer, insn_clock=False)
        assert [p for p, _ in got] == [2], (producer, got)


def test_insn_clock_takes_a_jump_while_tracing_is_off(tmp_path):
    """The clock jumps only while tracing is off (an idle CPU): the TSC
    before the next enable says where to, and counting goes on from
    there; a TSC no later than the count (a PSB+'s in a run) changes
    nothing.  CPU 0 runs 1 from 100 (6 instructions), idles from 106,
    runs 2 from 300 (6 instructions up to its syscall, through a PSB+ at
    303), then 1 from 306.  Twin and compiled core alike."""
    from hwtrace.flow import fast
    from hwtrace.pt import encoder as enc
    sp = _fork_pair_on_one_cpu(tmp_path, [(100, 1), (106, -1), (300, 2), (306, 1)])
    one = sp.of_pid(1)
    tl = sp.cpu_timeline(0)
    trace = (enc.psb() + enc.tsc(100) + enc.cbr(22) + enc.mode_exec(csl=1)
             + enc.psbend() + enc.tip_pge(0x1000) + enc.tnt8("ttttn")
             + enc.tip_pgd() + enc.tsc(300) + enc.cbr(22))
    second = len(trace)
    trace += (enc.tip_pge(0x1000) + enc.tnt8("tt")
              + enc.psb() + enc.tsc(303) + enc.cbr(22) + enc.mode_exec(csl=1)
              + enc.fup(0x1000) + enc.psbend() + enc.tnt8("tn") + enc.tip_pgd())
    third = len(trace)
    trace += enc.tip_pge(0x1004) + enc.tnt8("n") + enc.tip_pgd() + enc.tsc(400)
    producers = ["twin"] + (["core"] if fast.STATUS.module is not None else [])
    for producer in producers:
        got, errors = _insn_clock_decode(sp, tl, one, trace, producer)
        assert [p for p, _ in got] == [1, 2, 1], (producer, got)
        assert second < got[1][1] <= third < got[2][1], (producer, got)
        assert errors == [], (producer, errors)


def test_insn_clock_counts():
    """InsnClock: the first time stamp anchors; later ones count only if
    they are ahead of the count (a jump); a synchronization re-anchors
    (even back: instructions may have been lost); after an overflow the
    time is unknown until then."""
    from hwtrace.flow.spaces import InsnClock
    c = InsnClock()
    assert c.at(None, 5) is None
    assert c.at(100, 5) == 100
    assert c.at(100, 12) == 107             # the same stamp: counted on
    assert c.at(104, 12) == 107             # trailing (MTC-estimated): counted
    assert c.at(200, 12) == 200             # a jump
    assert c.at(None, 20) == 208
    c.anchor(150, 30)
    assert c.at(None, 31) == 151
    c.lose()
    assert c.at(500, 40) is None
    c.anchor(None, 40)
    assert c.at(None, 41) is None
    c.anchor(600, 50)
    assert c.at(None, 50) == 600
