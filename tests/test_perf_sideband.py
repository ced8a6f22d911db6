"""A synthetic pipe-layout perf.data exercising what the real captures
don't: thread-mode (per-thread) AUX streams with a gap, a truncated AUX
buffer, LOST records, HEADER_BUILD_ID / TRACING_DATA / HEADER_FEATURE
records inline, MMAP2 carrying its build-id, FORK of a new process, plain
SWITCH records, and an Intel PT AUXTRACE_INFO with an address filter.
Built byte by byte from the documented record layouts."""

from __future__ import annotations

import shutil
import struct

import pytest

from hwtrace import bundle as B
from hwtrace.engines.perf import abi
from hwtrace.engines.perf.attrs import SAMPLE_TYPE
from hwtrace.engines.perf.errors import PerfDataError
from hwtrace.buildid import build_id as elf_build_id
from hwtrace.engines.perf.importer import import_perf_data
from hwtrace.engines.perf.intel_pt import PtInfo
from hwtrace.engines.perf.perfdata import PerfData

TRUE = shutil.which("true")
BID = elf_build_id(TRUE) if TRUE else ""
PT_A = bytes([0x02, 0x82] * 8) + b"\x00" * 16        # PSB + pads
PT_B = bytes([0x02, 0x82] * 8) + b"\x00" * 8


def rec(rtype, body=b"", misc=0, sid=None):
    trailer = b""
    if sid is not None:
        pid, tid, time, cpu = sid
        trailer = struct.pack("<IIQIIQ", pid, tid, time, cpu, 0, 77)
    return struct.pack("<IHH", rtype, misc, 8 + len(body) + len(trailer)) + body + trailer


def cstr(s, align=8):
    raw = s.encode() + b"\0"
    return raw + b"\0" * (-len(raw) % align)


def perf_string(s):
    raw = cstr(s, 64)
    return struct.pack("<I", len(raw)) + raw


def build(filter_str="filter main @ /bin/x"):
    attr = abi.PerfEventAttr(type=8, size=112, config=0x2001, sample_period=1,
                             sample_type=SAMPLE_TYPE,
                             flags=abi.attr_flags(sample_id_all=True, exclude_kernel=True))
    out = [b"PERFILE2", struct.pack("<Q", 16)]
    out.append(rec(abi.HEADER_ATTR, attr.pack() + struct.pack("<2Q", 77, 78)))
    out.append(rec(abi.HEADER_FEATURE, struct.pack("<Q", abi.FEAT["HOSTNAME"]) + perf_string("box")))
    out.append(rec(abi.HEADER_FEATURE, struct.pack("<Q", abi.FEAT["CPUID"])
                   + perf_string("GenuineIntel,6,85,4")))
    tracing = b"T" * 13
    out.append(rec(abi.HEADER_TRACING_DATA, struct.pack("<II", len(tracing), 0))
               + tracing + b"\0" * (-len(tracing) % 8))
    bid = bytes.fromhex("ab" * 20)
    out.append(rec(abi.HEADER_BUILD_ID,
                   struct.pack("<i", 100) + bid + bytes([20, 0, 0, 0]) + cstr("/lib/libq.so"),
                   abi.MISC_BUILD_ID_SIZE | abi.MISC_USER))
    out.append(rec(abi.TIME_CONV, struct.pack("<3Q", 0, 1, 0)))
    priv = [8, 0, 1, 0, 1, 1 << 10, 1 << 11, 0, 0, 0, 1 << 9, 0xF << 14, 188, 2, 2, 28]
    fb = cstr(filter_str)
    priv += [len(filter_str)] + list(struct.unpack(f"<{len(fb) // 8}Q", fb))
    out.append(rec(abi.AUXTRACE_INFO, struct.pack("<II", 1, 0) + struct.pack(f"<{len(priv)}Q", *priv)))
    sid = lambda t, tid=100, pid=100: (pid, tid, t, 1)        # noqa: E731
    out.append(rec(abi.COMM, struct.pack("<II", 100, 100) + cstr("prog"), abi.MISC_COMM_EXEC, sid(10)))
    out.append(rec(abi.MMAP2, struct.pack("<IIQQQ", 100, 100, 0x400000, 0x1000, 0)
                   + bytes([20, 0, 0, 0]) + bytes.fromhex(BID or "00" * 20)
                   + struct.pack("<II", 5, 2) + cstr("/gone/true"),
                   abi.MISC_MMAP_BUILD_ID | abi.MISC_USER, sid(11)))
    out.append(rec(abi.MMAP2, struct.pack("<IIQQQIIQQII", 100, 100, 0x7f0000000000, 0x2000,
                                          0x1000, 8, 1, 99, 1, 5, 2) + cstr("/lib/libq.so"),
                   abi.MISC_USER, sid(12)))
    out.append(rec(abi.MMAP2, struct.pack("<IIQQQIIQQII", 100, 100, 0x600000, 0x1000, 0,
                                          8, 1, 98, 1, 3, 2) + cstr("/gone/data"),
                   abi.MISC_USER, sid(13)))                             # not executable
    out.append(rec(abi.ITRACE_START, struct.pack("<II", 100, 100), 0, sid(14)))
    out.append(rec(abi.SWITCH, b"", 0, sid(15)))                              # in
    out.append(rec(abi.FORK, struct.pack("<IIIIQ", 101, 100, 101, 100, 16), 0, sid(16)))
    out.append(rec(abi.AUX, struct.pack("<3Q", 0, 32, abi.AUX_FLAG_TRUNCATED), 0, sid(17)))
    out.append(rec(abi.SWITCH, b"", abi.MISC_SWITCH_OUT | abi.MISC_SWITCH_OUT_PREEMPT, sid(18)))
    out.append(rec(abi.LOST, struct.pack("<QQ", 77, 5), 0, sid(19)))
    out.append(rec(abi.EXIT, struct.pack("<IIIIQ", 100, 1, 100, 1, 20), 0, sid(20)))
    for off, data in ((0, PT_A), (48, PT_B)):                 # bytes 32..47 never saved
        out.append(rec(abi.AUXTRACE, struct.pack("<QQQIIII", len(data), off, 5, 0, 100,
                                                 0xffffffff, 0)) + data)
    out.append(rec(abi.FINISHED_ROUND))
    return b"".join(out)


def test_synthetic_pipe_parses():
    pd = PerfData(build())
    assert pd.layout == "pipe"
    assert [(a.attr.type, a.ids) for a in pd.attrs] == [(8, (77, 78))]
    assert pd.feature("HOSTNAME") == "box" and pd.feature("CPUID") == "GenuineIntel,6,85,4"
    assert pd.build_ids() == {"/lib/libq.so": bytes.fromhex("ab" * 20)}
    names = [r.name for r in pd.records()]
    assert names.count("AUXTRACE") == 2 and names[-1] == "FINISHED_ROUND"
    assert "HEADER_TRACING_DATA" in names
    info = next(pd.records({abi.AUXTRACE_INFO})).body
    pt = PtInfo.from_priv(info.priv)
    assert pt.filter == "filter main @ /bin/x"
    assert (pt.pmu_type, pt.per_cpu_mmaps, pt.max_non_turbo_ratio) == (8, False, 28)
    assert pt.decoder_params(0x2001 | 3 << 14 | 1 << 9) == {
        "mtc_freq": 3, "nom_freq": 28, "cpuid_0x15_eax": 2, "cpuid_0x15_ebx": 188}
    m2 = [r.body for r in pd.records({abi.MMAP2})]
    assert m2[0].build_id == bytes.fromhex(BID or "00" * 20) and m2[0].maj is None
    assert (m2[1].maj, m2[1].min, m2[1].ino, m2[1].build_id) == (8, 1, 99, None)
    sw = [r.body for r in pd.records({abi.SWITCH})]
    assert [(s.out, s.preempt) for s in sw] == [(False, False), (True, True)]


def test_auxtrace_info_filter_overrun_is_a_format_error():
    priv = [8, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1000]
    with pytest.raises(PerfDataError):
        PtInfo.from_priv(priv)
    with pytest.raises(PerfDataError):
        PtInfo.from_priv([1, 2, 3])
    old = PtInfo.from_priv([8, 0, 1, 0, 1, 0, 0, 0, 1, 1])        # perf 4.1: 10 words
    assert old.snapshot_mode and old.mtc_bit == 0 and old.filter == ""


@pytest.mark.skipif(not BID, reason="system 'true' has no build-id")
def test_synthetic_import_thread_mode(tmp_path):
    res = import_perf_data(build(), tmp_path / "b", images=[TRUE])
    assert res.streams == [("tid100.pt", len(PT_A) + len(PT_B))]
    assert res.images == [("/gone/true", TRUE)]              # found by build-id
    assert res.missing_images == ["/lib/libq.so"]
    b = B.Bundle(tmp_path / "b")
    assert b.mode == "thread"
    s = b.streams[0]
    assert (s.tid, s.pid, s.stopped, s.lost_bytes) == (100, 100, True, 16)
    assert b.read_stream(s) == PT_A + PT_B
    sb = b.sideband()
    assert [(p.pid, p.comm, p.ppid) for p in sb.processes] == [(100, "prog", 0), (101, "prog", 100)]
    assert [(t.tid, t.pid, t.parent_tid, t.time) for t in sb.threads] == [(101, 101, 100, 16)]
    assert [(m.file, m.build_id, m.prot) for m in sb.mmaps] == [
        ("/gone/true", BID, "r-x"), ("/lib/libq.so", "ab" * 20, "r-x")]
    assert [(x.cpu, x.time, x.prev_tid, x.next_tid) for x in sb.switches] == [
        (1, 15, -1, 100), (1, 18, 100, -1)]
    assert [(e.pid, e.tid, e.time) for e in sb.exits] == [(100, 100, 20)]
    perf = b.manifest["perf"]
    assert [(x["kind"], x.get("count")) for x in perf["lost"]] == [("truncated", None),
                                                                    ("lost_records", 5)]
    assert perf["itrace_start"] == [{"pid": 100, "tid": 100, "time": 14, "cpu": 1}]
    assert perf["auxtrace_info"]["filter"] == "filter main @ /bin/x"
    assert b.capabilities.ip_filtering
    assert b.cpu.model == 85 and b.manifest["perf"]["hostname"] == "box"
    assert b.find_image("/gone/true", BID).read_bytes() == open(TRUE, "rb").read()


def test_no_intel_pt_is_an_error(tmp_path):
    data = b"PERFILE2" + struct.pack("<Q", 16) + rec(abi.FINISHED_ROUND)
    with pytest.raises(PerfDataError, match="no Intel PT"):
        import_perf_data(data, tmp_path / "b")


def test_compressed_records_are_refused_with_the_fix(tmp_path):
    data = b"PERFILE2" + struct.pack("<Q", 16) + rec(abi.COMPRESSED, b"\x28\xb5\x2f\xfd" + b"\0" * 4)
    with pytest.raises(PerfDataError, match="perf inject"):
        import_perf_data(data, tmp_path / "b")


def test_import_of_mutated_recordings_fails_only_with_format_errors(tmp_path):
    import random
    rnd = random.Random(99)
    base = build()
    for i in range(150):
        data = bytearray(base)
        for _ in range(rnd.randint(1, 6)):
            data[rnd.randrange(16, len(data))] = rnd.randrange(256)
        try:
            import_perf_data(bytes(data), tmp_path / f"b{i}")
        except PerfDataError:
            pass


def test_time_conv_shift_is_checked():
    data = rec(abi.TIME_CONV, struct.pack("<3Q", 1 << 60, 1, 0))
    from hwtrace.engines.perf.perfdata import iter_records
    with pytest.raises(PerfDataError, match="time_shift"):
        list(iter_records(data))


def test_other_aux_kinds_are_refused(tmp_path):
    data = (b"PERFILE2" + struct.pack("<Q", 16)
            + rec(abi.AUXTRACE_INFO, struct.pack("<II", 2, 0) + struct.pack("<2Q", 7, 0))
            + rec(abi.AUXTRACE, struct.pack("<QQQIIII", 8, 0, 1, 0, 5, 0, 0)) + b"\0" * 8)
    with pytest.raises(PerfDataError, match="Intel BTS"):
        import_perf_data(data, tmp_path / "b")
    assert not (tmp_path / "b").exists()
