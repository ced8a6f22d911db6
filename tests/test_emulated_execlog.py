"""The execution-log format: writer and parser agree, errors carry offsets."""

import struct

import pytest

from hwtrace.engines.emulated import execlog as xl


def _sample():
    w = xl.Writer(source=xl.SOURCE_QEMU, clock=xl.CLOCK_HOST_TSC, clock_hz=2_000_000_000)
    w.ctx(100, 101, 1)
    w.proc_start(0)
    w.thread_start(0)
    w.time(12345)
    w.mmap(100, 0x400000, 0x2000, 0x1000, 5, "/bin/true", b"\xab\xcd")
    w.block(100, 7, 0x401000, bytes([1, 2]), b"\x90\x66\x90")
    w.exec([7, 7, 7])
    w.exec_part(7, 1)
    w.signal(11, False, 0x401100, 0x401001)
    w.insn(0x401100, b"\xc3")
    w.syscall(60)
    w.reaped(102, -11)
    w.sysret(60, -4)
    w.sigaction(10, 0x401100, 0x4000000)
    w.proc_exec("/bin/ls", False)
    w.munmap(100, 0x400000, 0x1000)
    w.thread_exit(0)
    w.proc_exit(-9)
    return bytes(w)


def test_roundtrip_every_record():
    data = _sample()
    hdr, off = xl.parse_header(data)
    assert hdr == xl.Header(1, xl.SOURCE_QEMU, xl.CLOCK_HOST_TSC, 2_000_000_000)
    assert off == 32
    recs = list(xl.parse(data))
    assert recs[0] == xl.Ctx(100, 101, 1)
    assert recs[1] == xl.ProcStart(0)
    assert recs[2] == xl.ThreadStart(0)
    assert recs[3] == xl.Time(12345)
    assert recs[4] == xl.Mmap(100, 0x400000, 0x2000, 0x1000, 5, "/bin/true", b"\xab\xcd")
    assert recs[5] == xl.Block(100, 7, 0x401000, b"\x01\x02", b"\x90\x66\x90")
    assert list(recs[6].ids) == [7, 7, 7]
    assert recs[7:] == [
        xl.ExecPart(7, 1), xl.Signal(11, False, 0x401100, 0x401001),
        xl.Insn(0x401100, b"\xc3"), xl.Syscall(60), xl.Reaped(102, -11),
        xl.Sysret(60, -4),
        xl.Sigaction(10, 0x401100, 0x4000000), xl.ProcExec(False, "/bin/ls"),
        xl.Munmap(100, 0x400000, 0x1000), xl.ThreadExit(0), xl.ProcExit(-9)]


def test_first_ids_only():
    """``first_ids``: every record as before, but an EXEC's ids are its
    first one only (an index's view); a cut EXEC is still an error."""
    w = xl.Writer()
    w.ctx(1, 2, -1)
    w.exec([5, 6, 7])
    w.exec([])
    w.time(9)
    data = bytes(w)
    whole, heads = list(xl.parse(data)), list(xl.parse(data, first_ids=True))
    assert [type(r) for r in heads] == [type(r) for r in whole]
    assert [list(r.ids) for r in heads if type(r) is xl.Exec] == [[5], []]
    assert [r for r in heads if type(r) is not xl.Exec] == [r for r in whole if type(r) is not xl.Exec]
    with pytest.raises(xl.ExecLogError, match="truncated EXEC"):
        list(xl.parse(data[:-9 - 5 - 4], first_ids=True))     # into the first EXEC


def test_exact_bytes_of_hot_records():
    w = xl.Writer()
    w.take()
    w.ctx(1, 2, -1)
    w.exec([3, 4])
    assert w.take() == (b"\x01" + struct.pack("<IIi", 1, 2, -1)
                        + b"\x04" + struct.pack("<III", 2, 3, 4))


def test_errors():
    data = _sample()
    with pytest.raises(xl.ExecLogError, match="magic"):
        xl.parse_header(b"XXXX" + data[4:])
    with pytest.raises(xl.ExecLogError, match="truncated"):
        list(xl.parse(data[:40]))
    with pytest.raises(xl.ExecLogError, match="unknown record type 0x7f at 32"):
        list(xl.parse(data[:32] + b"\x7f"))
    with pytest.raises(ValueError):
        xl.Writer().block(1, 1, 0, b"\x02", b"\x90")


def test_generator_rejects_inconsistent_logs():
    from hwtrace.engines.emulated import flow
    w = xl.Writer(source=xl.SOURCE_QEMU)
    w.exec([1])
    with pytest.raises(xl.ExecLogError, match="before any CTX"):
        flow.load(bytes(w))
    w = xl.Writer(source=xl.SOURCE_QEMU)
    w.ctx(1, 1, 0)
    w.exec([5])
    for index_only in (False, True):
        with pytest.raises(xl.ExecLogError, match="undefined block"):
            flow.load(bytes(w), index_only=index_only)
