"""The perf engine without Intel PT: ABI bytes, config translation, filter
strings, ring buffers, the probe, and the engine's logic against a fake
kernel (FakeOps) that fills AUX areas and rings as perf does.

Facts checked against: include/uapi/linux/perf_event.h (attr and mmap-page
offsets, flag bits), the intel_pt PMU's documented format/ terms, and the
attrs perf 4.14/4.15 itself wrote into the hardware fixtures.
"""

from __future__ import annotations

import errno
import mmap
import shutil
import os
import struct
from pathlib import Path

import pytest

from conftest import FIXTURES
from hwtrace import bundle as B
from hwtrace.control.config import BufferConfig
from hwtrace.control.ctl import Ctl, Mode
from hwtrace.control.errors import TraceError
from hwtrace.engines.perf import abi
from hwtrace.engines.perf.attrs import SAMPLE_TYPE, pt_attr, sideband_attr
from hwtrace.engines.perf.engine import PerfEngine, aux_pages_for
from hwtrace.engines.perf.errors import PerfDataError
from hwtrace.engines.perf.intel_pt import (DEFAULT_FORMAT, AddrFilter, FileMap, ctl_to_config,
                                           ctl_to_terms, encode_terms, filter_string,
                                           parse_format, ranges_to_filters)
from hwtrace.engines.perf.perfdata import PerfData, iter_records
from hwtrace.engines.perf.pmu import PmuInfo, diagnose, parse_cpuinfo, probe, read_pmu
from hwtrace.engines.perf.ring import (MmapPage, aux_read, aux_snapshot, read_records,
                                       ring_copy)
from hwtrace.engines.perf.sysops import PAGE_SIZE

HASE = FIXTURES / "hase_loopy" / "loopy-20180404T162955.perf"
PT_SKYLAKE_CTL = int(Ctl.BRANCH_EN | Ctl.TSC_EN | Ctl.MTC_EN | Ctl.USER) | 3 << 14 | 3 << 24


# -- perf_event_attr bytes --------------------------------------------------
def test_attr_offsets_follow_the_uapi_header():
    a = abi.PerfEventAttr(type=0x11223344, config=0x0102030405060708, sample_period=9,
                          sample_type=0x10087, read_format=4, flags=1 << 18,
                          wakeup_events=7, bp_type=8, config1=0xaa, config2=0xbb,
                          branch_sample_type=0xcc, sample_regs_user=0xdd,
                          sample_stack_user=0xee, clockid=-1, sample_regs_intr=0xff,
                          aux_watermark=0x1234, sample_max_stack=127,
                          aux_sample_size=0x55, sig_data=0x66, config3=0x77)
    raw = a.pack()
    assert len(raw) == 136
    q = lambda off: struct.unpack_from("<Q", raw, off)[0]  # noqa: E731
    i = lambda off: struct.unpack_from("<I", raw, off)[0]  # noqa: E731
    assert (i(0), i(4), q(8), q(16), q(24), q(32), q(40)) == (
        0x11223344, 136, 0x0102030405060708, 9, 0x10087, 4, 1 << 18)
    assert (i(48), i(52), q(56), q(64), q(72), q(80), i(88)) == (7, 8, 0xaa, 0xbb, 0xcc, 0xdd, 0xee)
    assert struct.unpack_from("<i", raw, 92)[0] == -1
    assert (q(96), i(104), struct.unpack_from("<H", raw, 108)[0], i(112), q(120), q(128)) == (
        0xff, 0x1234, 127, 0x55, 0x66, 0x77)
    assert abi.PerfEventAttr.unpack(raw) == a
    # a VER5 (112-byte) attr, as perf 4.x writes: later fields are dropped
    short = abi.PerfEventAttr(type=6, size=112, config=1, aux_sample_size=5)
    assert len(short.pack()) == 112
    assert abi.PerfEventAttr.unpack(short.pack()).aux_sample_size == 0


def test_attr_flag_bits():
    assert abi.attr_flags(disabled=True) == 1
    assert abi.attr_flags(exclude_kernel=True) == 1 << 5
    assert abi.attr_flags(enable_on_exec=True) == 1 << 12
    assert abi.attr_flags(sample_id_all=True) == 1 << 18
    assert abi.attr_flags(mmap2=True) == 1 << 23
    assert abi.attr_flags(context_switch=True) == 1 << 26
    assert abi.attr_flags(precise_ip=2) == 2 << 15
    assert abi.PERF_EVENT_IOC_ENABLE == 0x2400
    assert abi.PERF_EVENT_IOC_DISABLE == 0x2401
    assert abi.PERF_EVENT_IOC_SET_FILTER == 0x40082406


def test_pt_attr_matches_what_perf_recorded(hardware):
    """perf record -e intel_pt//u (hase fixture): same type, config, sample
    type and exclusions as our attr for the same ctl; bytes round-trip."""
    pd = PerfData(HASE.read_bytes())
    rec = pd.attrs[0].attr
    assert abi.PerfEventAttr.unpack(rec.pack()) == rec
    ours = pt_attr(6, PT_SKYLAKE_CTL)
    assert (ours.type, ours.config, ours.sample_type, ours.sample_period) == (
        rec.type, rec.config, rec.sample_type, rec.sample_period) == (6, 0x300e601, 0x10087, 1)
    want = {"disabled", "exclude_kernel", "exclude_hv", "enable_on_exec", "sample_id_all"}
    assert want <= set(rec.set_flags()) and want <= set(ours.set_flags())
    assert not ours.flag("exclude_user") and not ours.flag("inherit")
    # the sideband dummy: same as perf's "dummy:u" for mmap/comm/task/switch
    sb = sideband_attr()
    perf_dummy = [a.attr for a in pd.attrs if a.attr.type == 1]
    assert (sb.type, sb.config, sb.sample_type) == (1, 9, 0x10087)
    for name in ("mmap", "mmap2", "comm", "comm_exec", "task", "sample_id_all",
                 "exclude_kernel"):
        assert sb.flag(name) and any(p.flag(name) for p in perf_dummy), name
    assert sb.flag("context_switch") and perf_dummy[0].flag("context_switch")
    with pytest.raises(ValueError):
        pt_attr(6, int(Ctl.BRANCH_EN))          # neither OS nor User


# -- config terms -----------------------------------------------------------
def test_ctl_to_config_terms():
    assert ctl_to_config(PT_SKYLAKE_CTL) == {"config": 0x300e601}
    terms = ctl_to_terms(int(Ctl.CYC_EN | Ctl.PWR_EVT_EN | Ctl.FUP_ON_PTW | Ctl.PTW_EN
                             | Ctl.DIS_RETC | Ctl.USER) | 5 << 19 | 0xF << 14)
    assert terms == {"pt": 1, "cyc": 1, "pwr_evt": 1, "fup_on_ptw": 1, "mtc": 0, "tsc": 0,
                     "noretcomp": 1, "ptw": 1, "branch": 0, "mtc_period": 15,
                     "cyc_thresh": 5, "psb_period": 0}
    assert ctl_to_config(int(Ctl.CYC_EN | Ctl.USER) | 5 << 19)["config"] == 1 | 2 | 5 << 19
    # a PMU whose format puts terms elsewhere (format/ is authoritative)
    fmt = dict(DEFAULT_FORMAT, psb_period="config1:0-3", branch="config2:7")
    got = ctl_to_config(int(Ctl.BRANCH_EN | Ctl.USER) | 3 << 24, fmt)
    assert got == {"config": 1, "config1": 3, "config2": 1 << 7}
    # an older kernel without ptw: asking for it is an error, not silence
    old = {k: v for k, v in DEFAULT_FORMAT.items() if k not in ("ptw", "fup_on_ptw", "pwr_evt")}
    with pytest.raises(ValueError, match="ptw"):
        ctl_to_config(int(Ctl.PTW_EN | Ctl.USER), old)
    assert ctl_to_config(PT_SKYLAKE_CTL, old) == {"config": 0x300e601}


def test_parse_format_and_encode_terms():
    assert parse_format("config:14-17") == ("config", [(14, 4)])
    assert parse_format("config1:0,4-5") == ("config1", [(0, 1), (4, 2)])
    assert encode_terms({"x": 0b101}, {"x": "config1:0,4-5"}) == {"config1": 1 | 0b10 << 4}
    for bad in ("config:", "cfg:1", "config:5-3", "config:64"):
        with pytest.raises(ValueError):
            parse_format(bad)
    with pytest.raises(ValueError):
        encode_terms({"mtc_period": 16}, DEFAULT_FORMAT)


# -- address filters --------------------------------------------------------
def test_filter_strings():
    assert str(AddrFilter("filter", 0x1000, 0x200, "/bin/ls")) == "filter 0x1000/0x200@/bin/ls"
    assert str(AddrFilter("stop", 0xffffffff81000000)) == "stop 0xffffffff81000000"
    assert str(AddrFilter("start", 0x40, 0, "/x")) == "start 0x40@/x"
    assert filter_string([AddrFilter("filter", 0, 0x10, "/a"), AddrFilter("stop", 0x8, 1, "/a")]) \
        == "filter 0x0/0x10@/a,stop 0x8/0x1@/a"
    for bad in (AddrFilter("trace", 0), AddrFilter("filter", 0, 1, "/a b"),
                AddrFilter("filter", 0, 1, "/a,b"), AddrFilter("filter", 0, 1, "")):
        with pytest.raises(ValueError):
            str(bad)


def test_ranges_to_filters_use_file_offsets():
    maps = [FileMap(0x400000, 0x401000, 0x0, "/t/prog"),
            FileMap(0x401000, 0x405000, 0x1000, "/t/prog")]
    got = ranges_to_filters([(0x401100, 0x4011ff), (0x400010, 0x40001f),
                             (0xffffffff81000000, 0xffffffff81000fff)], [1, 2, 1], maps)
    assert filter_string(got) == ("filter 0x1100/0x100@/t/prog,stop 0x10/0x10@/t/prog,"
                                  "filter 0xffffffff81000000/0x1000")
    assert ranges_to_filters([(1, 2)], [0], maps) == []          # ADDR0_CFG off
    with pytest.raises(ValueError, match="not inside one mapped file"):
        ranges_to_filters([(0x400ff0, 0x401010)], [1], maps)
    with pytest.raises(ValueError):
        ranges_to_filters([(0x400000, 0x400001)], [3], maps)


# -- ring buffers -----------------------------------------------------------
def _rec(rtype, body=b"", misc=0, sid=None):
    trailer = b""
    if sid is not None:
        pid, tid, time, cpu, ident = sid
        trailer = struct.pack("<IIQIIQ", pid, tid, time, cpu, 0, ident)
    size = 8 + len(body) + len(trailer)
    return struct.pack("<IHH", rtype, misc, size) + body + trailer


def _comm(pid, name, sid, exec_=False):
    raw = name.encode() + b"\0"
    raw += b"\0" * (-len(raw) % 8)
    return _rec(abi.COMM, struct.pack("<II", pid, pid) + raw,
                abi.MISC_COMM_EXEC if exec_ else 0, sid)


def _mmap2(pid, addr, ln, pgoff, name, sid, prot=5):
    raw = name.encode() + b"\0"
    raw += b"\0" * (-len(raw) % 8)
    body = struct.pack("<IIQQQIIQQII", pid, pid, addr, ln, pgoff, 8, 1, 1234, 5, prot, 2) + raw
    return _rec(abi.MMAP2, body, abi.MISC_USER, sid)


def _aux(off, size, flags, sid):
    return _rec(abi.AUX, struct.pack("<QQQ", off, size, flags), 0, sid)


def test_ring_records_with_wraparound():
    size = 128
    recs = [_comm(7, "a", (7, 7, 1, 0, 1)), _aux(0, 16, 0, (7, 7, 2, 0, 1)),
            _rec(abi.FINISHED_ROUND)]
    stream = b"".join(recs)                    # 56 + 64 + 8 = 128
    tail = 1000                                # ever-growing positions
    ring = bytearray(size)
    for k, b in enumerate(stream):
        ring[(tail + k) % size] = b
    data, new_tail = read_records(ring, size, tail, tail + len(stream))
    assert data == stream and new_tail == tail + len(stream)
    got = list(iter_records(data, sample_type=SAMPLE_TYPE))
    assert [r.name for r in got] == ["COMM", "AUX", "FINISHED_ROUND"]
    assert got[1].body.aux_size == 16 and got[1].sample_id.time == 2
    # a partial record at the head is left for later
    data, t2 = read_records(ring, size, tail, tail + len(stream) - 4)
    assert data == stream[:len(recs[0]) + len(recs[1])]
    with pytest.raises(PerfDataError):
        read_records(ring, size, tail, tail + size + 8)          # overran
    bad = bytearray(size)
    with pytest.raises(PerfDataError):
        read_records(bad, size, 0, 16)                           # size-0 header


def test_aux_read_and_snapshot():
    area = bytes(range(256)) * 2                                  # 512-byte AUX area
    assert ring_copy(area, 512, 500, 520) == area[500:512] + area[:8]
    c = aux_read(area, 512, 100, 300)
    assert c.data == area[100:300] and c.lost == 0
    c = aux_read(area, 512, 0, 700)                               # wrote > size: oldest lost
    assert c.lost == 188 and c.data == area[188:512] + area[:188]
    assert aux_snapshot(area, 512, 40).data == area[:40]
    s = aux_snapshot(area, 512, 1000)
    assert s.data == area[1000 % 512:] + area[:1000 % 512] and s.lost == 488
    with pytest.raises(PerfDataError):
        aux_read(area, 512, 10, 5)


def test_mmap_page_fields(hardware):
    page = bytearray(PAGE_SIZE)
    struct.pack_into("<Q", page, 40, 1 << 4 | 1 << 3)             # cap_user_time(_zero)
    struct.pack_into("<HI", page, 50, 31, 672770566)
    struct.pack_into("<Q", page, 64, 18446744061102431664)
    struct.pack_into("<8Q", page, 1024, 4096, 2048, 4096, 262144, 900, 800, 266240, 65536)
    p = MmapPage.unpack(page)
    assert (p.data_head, p.data_tail, p.data_offset, p.data_size) == (4096, 2048, 4096, 262144)
    assert (p.aux_head, p.aux_tail, p.aux_offset, p.aux_size) == (900, 800, 266240, 65536)
    tc = p.time_conv()
    assert (tc.time_shift, tc.time_mult, tc.time_zero) == (31, 672770566, 18446744061102431664)
    # same numbers as the hase recording's TIME_CONV
    pd = PerfData(HASE.read_bytes())
    rec = next(pd.records({abi.TIME_CONV})).body
    assert (rec.time_shift, rec.time_mult, rec.time_zero) == (tc.time_shift, tc.time_mult,
                                                              tc.time_zero)
    struct.pack_into("<Q", page, 40, 0)
    assert MmapPage.unpack(page).time_conv() is None


def test_aux_pages_power_of_two():
    assert aux_pages_for(0) == 16
    assert aux_pages_for(17 * PAGE_SIZE) == 32
    assert aux_pages_for(64 * PAGE_SIZE) == 64


# -- PMU discovery and the probe --------------------------------------------
def _fake_sysfs(root: Path, caps=None, fmt=None):
    d = root / "bus/event_source/devices/intel_pt"
    (d / "format").mkdir(parents=True)
    (d / "caps").mkdir()
    (d / "type").write_text("8\n")
    (d / "max_nonturbo_ratio").write_text("32\n")
    (d / "tsc_art_ratio").write_text("266:2\n")
    (d / "nr_addr_filters").write_text("2\n")
    for k, v in (fmt or DEFAULT_FORMAT).items():
        (d / "format" / k).write_text(v + "\n")
    for k, v in (caps or {"psb_cyc": "1", "mtc": "1", "ip_filtering": "1",
                          "num_address_ranges": "2", "mtc_periods": "249",
                          "cycle_thresholds": "3fff", "psb_periods": "3f",
                          "topa_multiple_entries": "1", "ptwrite": "0"}).items():
        (d / "caps" / k).write_text(v + "\n")
    return root


def test_read_pmu_from_sysfs(tmp_path):
    pmu = read_pmu(_fake_sysfs(tmp_path))
    assert pmu.type == 8 and pmu.format == DEFAULT_FORMAT
    assert (pmu.max_nonturbo_ratio, pmu.tsc_art_ratio, pmu.nr_addr_filters) == (32, (266, 2), 2)
    caps = pmu.capabilities()
    assert (caps.psb_cyc, caps.mtc, caps.ip_filtering, caps.ptwrite) == (True, True, True, False)
    assert (caps.num_address_ranges, caps.mtc_period_mask, caps.cyc_threshold_mask,
            caps.psb_freq_mask) == (2, 0x249, 0x3fff, 0x3f)
    assert read_pmu(tmp_path / "nothing") is None


AMD = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n" \
      "model name\t: AMD EPYC 7763 64-Core Processor\nstepping\t: 1\nflags\t\t: fpu hypervisor\n\n"
INTEL_VM = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\nstepping\t: 4\n" \
           "model name\t: Intel(R) Xeon(R)\nflags\t\t: fpu hypervisor\n"
INTEL_OLD = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 58\nstepping\t: 9\n" \
            "flags\t\t: fpu vmx\n"
INTEL_PT = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 94\nstepping\t: 3\n" \
           "flags\t\t: fpu intel_pt\n"


def test_diagnose_reasons():
    ok, why = diagnose(None, parse_cpuinfo(AMD), 2, 0)
    assert not ok and why.startswith("no intel_pt PMU")
    assert "AMD CPU, AuthenticAMD 25/1/1 (AMD EPYC 7763 64-Core Processor)" in why
    ok, why = diagnose(None, parse_cpuinfo(INTEL_VM), 2, 0, have_cpu_pmu=False)
    assert not ok and "virtual machine (hypervisor flag)" in why and "passthrough" in why
    assert "GenuineIntel 6/85/4" in why and "no hardware PMU" in why
    ok, why = diagnose(None, parse_cpuinfo(INTEL_OLD), 2, 0)
    assert not ok and "no intel_pt flag" in why and "6/58/9" in why
    ok, why = diagnose(None, parse_cpuinfo(INTEL_PT), 2, 0)
    assert not ok and "CONFIG_PERF_EVENTS_INTEL_PT" in why
    pmu = PmuInfo(type=8, format=dict(DEFAULT_FORMAT), caps={})
    cpu = parse_cpuinfo(INTEL_PT)
    ok, why = diagnose(pmu, cpu, 3, 0)
    assert not ok and "perf_event_paranoid is 3" in why and "CAP_PERFMON" in why
    ok, why = diagnose(pmu, cpu, 3, 1 << 38)                # CAP_PERFMON
    assert ok and why == "intel_pt PMU type 8 on GenuineIntel 6/94/3"
    ok, why = diagnose(pmu, cpu, 2, 0)
    assert ok and "thread mode and user space only" in why and "paranoid=0" in why
    ok, why = diagnose(pmu, cpu, 1, 0)
    assert ok and "thread mode only" in why
    ok, why = diagnose(pmu, cpu, -1, 0)
    assert ok and why == "intel_pt PMU type 8 on GenuineIntel 6/94/3"


def test_probe_on_this_machine():
    if os.path.isdir("/sys/bus/event_source/devices/intel_pt"):
        pytest.skip("this machine has Intel PT (see test_diagnose_reasons for the logic)")
    ok, why = probe()
    assert not ok
    facts = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    assert why.startswith("no intel_pt PMU (/sys/bus/event_source/devices/intel_pt is missing); ")
    assert f"{facts.vendor} {facts.family}/{facts.model}/{facts.stepping}" in why
    if facts.vendor == "AuthenticAMD":
        assert "AMD CPU" in why
    elif "hypervisor" in facts.flags:
        assert "virtual machine (hypervisor flag)" in why
    # the registry and --engine perf see the same reason
    import hwtrace.engines as E
    a = E.probe("perf")
    assert not a.available and a.reason == why
    with pytest.raises(TraceError) as ei:
        E.create("perf")
    assert why in str(ei.value)


# -- the engine against a fake kernel -----------------------------------------
class FakeOps:
    """Plays the kernel: records what the engine asks, and on release of the
    workload writes PT bytes to each PT event's AUX area (with AUX records
    in its ring) and sideband records to each dummy event's ring."""

    def __init__(self, pt_type=8, aux_payload=b"", sideband=b"", truncate_after=None):
        self.pt_type = pt_type
        self.events = {}
        self.calls = []
        self.next_fd = 100
        self.aux_payload = aux_payload
        self.sideband = sideband
        self.truncate_after = truncate_after
        self.done = False

    def perf_event_open(self, attr, pid, cpu, group_fd=-1):
        fd = self.next_fd
        self.next_fd += 1
        self.events[fd] = {"attr": attr, "pid": pid, "cpu": cpu, "filter": None}
        self.calls.append(("open", attr.type, pid, cpu))
        return fd

    def mmap(self, fd, length, offset, writable):
        m = mmap.mmap(-1, length)
        ev = self.events[fd]
        if offset == 0:
            ev["base"] = m
        else:
            page = MmapPage.unpack(ev["base"][:PAGE_SIZE])
            assert (page.aux_offset, page.aux_size) == (offset, length)
            ev["aux"], ev["aux_writable"], ev["aux_len"] = m, writable, length
        self.calls.append(("mmap", fd, length, offset, writable))
        return m

    def set_filter(self, fd, text):
        self.events[fd]["filter"] = text

    def ioctl(self, fd, req, arg=0):
        self.calls.append(("ioctl", fd, req))

    def close(self, fd):
        self.calls.append(("close", fd))

    def spawn_held(self, argv, env=None, cwd=None):
        self.calls.append(("spawn", tuple(argv)))
        return 4242, "handle"

    def release(self, handle):
        self.calls.append(("release",))
        for fd, ev in self.events.items():
            base = ev["base"]
            sid = (4242, 4242, 1000 + fd, max(ev["cpu"], 0), fd)
            if ev["attr"].type == self.pt_type:
                data = self.aux_payload
                aux = ev["aux"]
                aux[:len(data)] = data
                recs = b""
                if self.truncate_after is None:
                    recs += _aux(0, len(data), 0, sid)
                else:
                    recs += _aux(0, self.truncate_after, abi.AUX_FLAG_TRUNCATED, sid)
                    recs += _aux(self.truncate_after, len(data) - self.truncate_after, 0, sid)
                struct.pack_into("<Q", base, 1056, len(data))           # aux_head
            else:
                recs = self.sideband(sid) if callable(self.sideband) else self.sideband
            base[PAGE_SIZE:PAGE_SIZE + len(recs)] = recs
            struct.pack_into("<Q", base, 1024, len(recs))               # data_head
            struct.pack_into("<Q", base, 40, 1 << 4 | 1 << 3)
            struct.pack_into("<HI", base, 50, 31, 672770566)
            struct.pack_into("<Q", base, 64, 18446744061102431664)
        self.done = True

    def discard(self, handle):
        self.calls.append(("discard",))

    def wait(self, pid, block):
        return 0 if self.done or block else None

    def kill(self, pid):
        self.calls.append(("kill", pid))

    def process_sideband(self, pid):
        return [B.Process(pid=pid, cr3=0, comm="running"),
                B.Mmap(pid=pid, start=0x400000, size=0x1000, offset=0, file="/bin/running")]

    def poll(self, fds, timeout):
        pass


class FakeOutput:
    def __init__(self, config):
        self.config = config
        self.ctl = config.ctl
        self.cr3_match = config.cr3_match
        self.addr_ranges = config.addr_ranges
        self.items = []

    def write(self, data):
        self.items.append(bytes(data))
        return len(data)

    def overflow(self):
        self.items.append("OVF")

    stopped = False
    packet_byte_cnt = 0

    def reset_packet_byte_cnt(self):
        pass

    def add_instructions(self, n):
        pass


class FakeSession:
    def __init__(self, mode, num_cpus, config):
        self.mode = mode
        self.num_cpus = num_cpus
        self.sideband = []
        self.sideband_add = self.sideband.append
        self.outputs = {}
        self.config = config

    class _Sink(list):
        def add(self, r):
            self.append(r)

    def cpu_output(self, cpu):
        return self.outputs.setdefault(("cpu", cpu), FakeOutput(self.config))

    def thread_output(self, tid, pid, parent_tid=0):
        return self.outputs.setdefault(("tid", tid), FakeOutput(self.config))

    def thread_exited(self, tid):
        pass

    def should_stop(self):
        return False


def _engine(ops, num_cpus=2, paranoid=-1):
    pmu = PmuInfo(type=8, format=dict(DEFAULT_FORMAT), caps={"mtc": 1})
    return PerfEngine(ops=ops, pmu=pmu, num_cpus=num_cpus, paranoid=paranoid)


PSB = bytes([0x02, 0x82] * 8)


def _session(mode, cfg):
    s = FakeSession(mode, 2, cfg)
    s.sideband = FakeSession._Sink()
    return s


def test_engine_cpu_mode_streams_and_sideband():
    sb = lambda sid: (_comm(4242, "true", sid, exec_=True)                     # noqa: E731
                      + _mmap2(4242, 0x400000, 0x1000, 0, "/usr/bin/true", sid)
                      + _rec(abi.SWITCH_CPU_WIDE, struct.pack("<II", 0, 0),
                             abi.MISC_SWITCH_OUT, sid))
    ops = FakeOps(aux_payload=PSB + b"\x00" * 16, sideband=sb)
    cfg = BufferConfig(num_chunks=4, chunk_order=0, ctl=Ctl(PT_SKYLAKE_CTL))
    s = _session(Mode.CPU, cfg)
    status = _engine(ops).run(s, ["true"])
    assert status == 0
    opens = [c for c in ops.calls if c[0] == "open"]
    assert opens == [("open", 8, -1, 0), ("open", 1, -1, 0), ("open", 8, -1, 1), ("open", 1, -1, 1)]
    pt = [e for e in ops.events.values() if e["attr"].type == 8]
    assert all(e["attr"].config == 0x300e601 and not e["attr"].flag("enable_on_exec")
               for e in pt)
    assert all(e["aux_writable"] for e in pt)             # full-trace (stop-on-full)
    assert all(e["aux_len"] == 16 * PAGE_SIZE for e in pt)
    enables = [c for c in ops.calls if c[0] == "ioctl" and c[2] == abi.PERF_EVENT_IOC_ENABLE]
    assert len(enables) == 4
    assert ops.calls.index(enables[-1]) < ops.calls.index(("release",))
    for cpu in (0, 1):
        assert b"".join(s.outputs[("cpu", cpu)].items) == PSB + b"\x00" * 16
    kinds = sorted(type(r).__name__ for r in s.sideband)
    assert kinds.count("Mmap") == 2 and kinds.count("Process") == 2 and kinds.count("Switch") == 2
    m = next(r for r in s.sideband if isinstance(r, B.Mmap))
    assert (m.pid, m.start, m.size, m.file, m.prot) == (4242, 0x400000, 0x1000, "/usr/bin/true", "r-x")
    assert all(c[0] != "kill" for c in ops.calls)
    assert sorted(c[1] for c in ops.calls if c[0] == "close") == sorted(ops.events)


def test_engine_truncation_becomes_overflow_and_snapshot_reads_at_end():
    ops = FakeOps(aux_payload=PSB * 2, truncate_after=len(PSB))
    cfg = BufferConfig(num_chunks=1, chunk_order=0, ctl=Ctl(PT_SKYLAKE_CTL))
    s = _session(Mode.CPU, cfg)
    _engine(ops, num_cpus=1).run(s, ["true"])
    # the bytes before the truncation, the lost-data mark, then the rest
    assert s.outputs[("cpu", 0)].items == [PSB, "OVF", PSB]
    # circular buffer: snapshot (read-only AUX), read once at the end
    ops = FakeOps(aux_payload=PSB)
    cfg = BufferConfig(num_chunks=1, chunk_order=0, is_circular=True, ctl=Ctl(PT_SKYLAKE_CTL))
    s = _session(Mode.CPU, cfg)
    _engine(ops, num_cpus=1).run(s, ["true"])
    pt = [e for e in ops.events.values() if e["attr"].type == 8]
    assert not pt[0]["aux_writable"] and pt[0]["attr"].aux_watermark == 0
    assert s.outputs[("cpu", 0)].items == [PSB]


def test_engine_thread_mode_and_filters(tmp_path, hardware):
    ops = FakeOps(aux_payload=PSB)
    ranges = ((0x401000, 0x4010ff),)
    ctl = PT_SKYLAKE_CTL | 1 << 32                        # ADDR0_CFG = filter
    cfg = BufferConfig(num_chunks=1, chunk_order=0, ctl=Ctl(ctl), addr_ranges=ranges)
    s = _session(Mode.THREAD, cfg)
    eng = _engine(ops, paranoid=2)
    assert eng.modes == frozenset({Mode.THREAD})
    exe = FIXTURES / "drpt2trace_simple" / "hello"           # static, non-PIE
    eng.run(s, [str(exe)])
    opens = [c for c in ops.calls if c[0] == "open"]
    assert opens == [("open", 8, 4242, -1), ("open", 1, 4242, -1)]
    pt = next(e for e in ops.events.values() if e["attr"].type == 8)
    assert pt["attr"].flag("enable_on_exec")
    assert pt["filter"] == f"filter 0x1000/0x100@{os.path.realpath(exe)}"
    assert s.outputs[("tid", 4242)].items == [PSB]
    # cpu mode refused at paranoid 2 without CAP_PERFMON, with the setting named
    with pytest.raises(TraceError, match="perf_event_paranoid=0"):
        eng.run(_session(Mode.CPU, cfg), ["true"])
    # cr3_match is perf's own business
    bad = BufferConfig(num_chunks=1, chunk_order=0, ctl=Ctl(PT_SKYLAKE_CTL), cr3_match=0x1000)
    with pytest.raises(TraceError, match="CR3"):
        _engine(FakeOps()).run(_session(Mode.CPU, bad), ["true"])


def test_engine_cleans_up_when_setup_fails():
    class Failing(FakeOps):
        def perf_event_open(self, attr, pid, cpu, group_fd=-1):
            if cpu == 1:
                raise OSError(13, "Permission denied")
            return super().perf_event_open(attr, pid, cpu)
    ops = Failing()
    cfg = BufferConfig(num_chunks=1, chunk_order=0, ctl=Ctl(PT_SKYLAKE_CTL))
    with pytest.raises(TraceError, match="Permission denied"):
        _engine(ops).run(_session(Mode.CPU, cfg), ["true"])
    assert ("kill", 4242) in ops.calls
    assert sorted(c[1] for c in ops.calls if c[0] == "close") == sorted(ops.events)


# -- real hardware ---------------------------------------------------------------
@pytest.mark.skipif(not os.path.isdir("/sys/bus/event_source/devices/intel_pt"),
                    reason="no Intel PT here (/sys/bus/event_source/devices/intel_pt missing)")
@pytest.mark.parametrize("mode", [Mode.CPU, Mode.THREAD])
def test_record_ls_on_real_hardware(mode, tmp_path, ptoracle):
    import json
    import subprocess
    import hwtrace
    ok, why = probe()
    if not ok:
        pytest.skip(why)
    dev = hwtrace.open_device(engine="perf")
    try:
        dev.set_mode(mode)
        cfg = BufferConfig(num_chunks=16, chunk_order=0,
                           ctl=Ctl.BRANCH_EN | Ctl.USER | Ctl.TSC_EN)
        if mode == Mode.CPU:
            if Mode.CPU not in dev.engine.modes:
                pytest.skip("cpu mode needs perf_event_paranoid <= 0 or CAP_PERFMON")
            for _ in range(dev.num_cpus):
                dev.alloc_buffer(cfg)
            dev.cpu_mode_alloc()
            dev.cpu_mode_start()
            assert dev.run(["ls", "/"]) == 0
            dev.cpu_mode_stop()
        else:
            assert dev.run(["ls", "/"], follow_threads=cfg) == 0
        out = dev.save_bundle(tmp_path / "b")
    finally:
        dev.close()
    b = B.Bundle(out, allow_outside=True)
    vdso = tmp_path / "vdso.bin"
    vdso.write_bytes(_own_vdso())            # same kernel: same vDSO bytes
    total = 0
    for s in b.streams:
        if not s.size:
            continue
        total += s.size
        r = subprocess.run([str(ptoracle), "pkt", str(b.stream_path(s)), "--summary"],
                           capture_output=True, text=True, check=True)
        assert json.loads(r.stdout.splitlines()[-1])["errors"] == 0
        if mode != Mode.THREAD:
            continue                         # cpu mode traced everything: no images
        images = []
        for m in b.sideband().mmaps:
            if m.pid != s.pid:
                continue
            if m.file == "[vdso]":
                images += ["--raw", f"{vdso}:0x0-{m.size:#x}:{m.start:#x}"]
                continue
            img = b.find_image(m.file, m.build_id)
            if img is not None:
                size = min(m.size, img.stat().st_size - m.offset)
                images += ["--raw", f"{img}:{m.offset:#x}-{m.offset + size:#x}:{m.start:#x}"]
        r = subprocess.run([str(ptoracle), "insn", str(b.stream_path(s)), *b.decoder_args(),
                            *images, "--summary"], capture_output=True, text=True, check=True)
        summary = json.loads(r.stdout.splitlines()[-1])
        assert summary["errors"] == 0 and summary["insns"] > 0, summary
    assert total > 0
    assert any(isinstance(r, B.Mmap) for r in b.iter_sideband())


def _own_vdso() -> bytes:
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith("[vdso]"):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            with open("/proc/self/mem", "rb") as f:
                f.seek(lo)
                return f.read(hi - lo)
    return b""


def test_engine_through_the_trace_control_device(tmp_path):
    """The device drives the perf engine (on the fake kernel) into a bundle."""
    import hwtrace
    from hwtrace.control.capabilities import CpuInfo
    sb = lambda sid: (_comm(4242, "true", sid, exec_=True)                     # noqa: E731
                      + _mmap2(4242, 0x400000, 0x1000, 0, "/usr/bin/true", sid))
    ops = FakeOps(aux_payload=PSB + b"\x00" * 16, sideband=sb)
    pmu = PmuInfo(type=8, format=dict(DEFAULT_FORMAT),
                  caps={"mtc": 1, "psb_cyc": 1, "mtc_periods": 0x249, "psb_periods": 0x3f,
                        "cycle_thresholds": 0x3fff, "topa_multiple_entries": 1})
    eng = PerfEngine(ops=ops, pmu=pmu, num_cpus=2, paranoid=0,
                     cpu=CpuInfo(family=6, model=94, stepping=3, nom_freq=32))
    dev = hwtrace.open_device(engine=eng)
    try:
        dev.set_mode(Mode.CPU)
        cfg = BufferConfig(num_chunks=4, chunk_order=0, ctl=Ctl(PT_SKYLAKE_CTL))
        for _ in range(dev.num_cpus):
            dev.alloc_buffer(cfg)
        dev.cpu_mode_alloc()
        dev.cpu_mode_start()
        assert dev.run(["true"]) == 0
        dev.cpu_mode_stop()
        out = dev.save_bundle(tmp_path / "b")
    finally:
        dev.close()
    b = B.Bundle(out)
    assert b.engine == "perf"
    assert [(s.file, s.size) for s in b.streams] == [("cpu0.pt", 32), ("cpu1.pt", 32)]
    assert b.read_stream("cpu0.pt") == PSB + b"\x00" * 16
    assert any(isinstance(r, B.Mmap) and r.file == "/usr/bin/true" for r in b.iter_sideband())


def test_engine_thread_mode_follows_new_threads():
    """A FORK in the sideband of a traced thread opens events for the new
    thread (the kernel forbids inherit on mmapped per-thread events)."""
    class Forking(FakeOps):
        def release(self, handle):
            super().release(handle)
            if not getattr(self, "forked", False):
                self.forked = True
                ev = next(e for e in self.events.values() if e["attr"].type == 1)
                base = ev["base"]
                head = struct.unpack_from("<Q", base, 1024)[0]
                fork = _rec(abi.FORK, struct.pack("<IIIIQ", 4242, 4242, 4243, 4242, 5),
                            0, (4242, 4242, 5, 0, 1))
                base[PAGE_SIZE + head:PAGE_SIZE + head + len(fork)] = fork
                struct.pack_into("<Q", base, 1024, head + len(fork))
    ops = Forking(aux_payload=PSB)
    cfg = BufferConfig(num_chunks=1, chunk_order=0, ctl=Ctl(PT_SKYLAKE_CTL))
    s = _session(Mode.THREAD, cfg)
    _engine(ops).run(s, ["true"])
    opens = [c for c in ops.calls if c[0] == "open"]
    assert opens == [("open", 8, 4242, -1), ("open", 1, 4242, -1),
                     ("open", 8, 4243, -1), ("open", 1, 4243, -1)]
    assert set(s.outputs) == {("tid", 4242), ("tid", 4243)}
    new_pt = [fd for fd, e in ops.events.items() if e["pid"] == 4243 and e["attr"].type == 8]
    assert ("ioctl", new_pt[0], abi.PERF_EVENT_IOC_ENABLE) in ops.calls
    assert not ops.events[new_pt[0]]["attr"].flag("enable_on_exec")


def test_engine_attach_thread_mode():
    class Attaching(FakeOps):
        rounds = 0

        def threads_of(self, pid):
            self.rounds += 1
            if self.rounds == 2:
                self.release(None)              # the "kernel" produces data
            return [pid, pid + 1] if self.rounds < 3 else []
    ops = Attaching(aux_payload=PSB)
    cfg = BufferConfig(num_chunks=1, chunk_order=0, ctl=Ctl(PT_SKYLAKE_CTL))
    s = _session(Mode.THREAD, cfg)
    assert _engine(ops).attach(s, 777) == 0
    opens = [c for c in ops.calls if c[0] == "open"]
    assert opens == [("open", 8, 777, -1), ("open", 1, 777, -1),
                     ("open", 8, 778, -1), ("open", 1, 778, -1)]
    assert s.outputs[("tid", 777)].items == [PSB]
    assert [type(r).__name__ for r in s.sideband[:2]] == ["Process", "Mmap"]
    assert len([c for c in ops.calls if c[0] == "ioctl"
                and c[2] == abi.PERF_EVENT_IOC_ENABLE]) == 4
    gone = type("Gone", (FakeOps,), {"threads_of": lambda self, p: []})()
    with pytest.raises(TraceError, match="no process"):
        _engine(gone).attach(_session(Mode.THREAD, cfg), 5)


def test_cpu_lists():
    from hwtrace.engines.perf.engine import online_cpus, parse_cpu_list
    assert parse_cpu_list("0-3,5\n") == frozenset({0, 1, 2, 3, 5})
    assert parse_cpu_list("7") == frozenset({7})
    here = online_cpus()
    assert here and min(here) >= 0
    assert here == parse_cpu_list(Path("/sys/devices/system/cpu/online").read_text())


def test_engine_from_sysfs_and_proc(tmp_path):
    sysfs = _fake_sysfs(tmp_path / "sys")
    (sysfs / "devices/system/cpu").mkdir(parents=True)
    (sysfs / "devices/system/cpu/online").write_text("0-1,3\n")
    proc = tmp_path / "proc"
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "self").mkdir()
    (proc / "cpuinfo").write_text(INTEL_PT)
    (proc / "sys/kernel/perf_event_paranoid").write_text("2\n")
    (proc / "self/status").write_text("Name:\tx\nCapEff:\t0000000000000000\n")
    eng = PerfEngine(sysfs=str(sysfs), proc=str(proc), ops=FakeOps())
    c = eng.cpu_info
    assert (c.vendor, c.family, c.model, c.stepping) == ("GenuineIntel", 6, 94, 3)
    assert (c.nom_freq, c.cpuid_0x15_eax, c.cpuid_0x15_ebx) == (32, 2, 266)
    assert eng.num_cpus == 4 and eng.modes == frozenset({Mode.THREAD})
    assert eng.capabilities.num_address_ranges == 2
    (proc / "self/status").write_text("CapEff:\t000001ffffffffff\n")      # root-like
    eng = PerfEngine(sysfs=str(sysfs), proc=str(proc), ops=FakeOps())
    assert eng.modes == frozenset({Mode.CPU, Mode.THREAD})
    ops = FakeOps(aux_payload=PSB)
    eng = PerfEngine(sysfs=str(sysfs), proc=str(proc), ops=ops)
    cfg = BufferConfig(num_chunks=1, chunk_order=0, ctl=Ctl(PT_SKYLAKE_CTL))
    eng.run(_session(Mode.CPU, cfg), ["true"])
    assert sorted({c[3] for c in ops.calls if c[0] == "open"}) == [0, 1, 3]   # online only
    (proc / "sys/kernel/perf_event_paranoid").write_text("3\n")
    (proc / "self/status").write_text("CapEff:\t0\n")
    with pytest.raises(TraceError, match="perf_event_paranoid is 3"):
        PerfEngine(sysfs=str(sysfs), proc=str(proc))


def test_real_perf_ring_with_software_dummy_event():
    """No Intel PT needed: the real syscalls (ctypes perf_event_open, the
    mmap'd ring, enable_on_exec on a held child) with the sideband dummy
    event, and our ring reader on the records the kernel wrote."""
    from hwtrace.engines.perf.engine import DATA_PAGES, _Event
    from hwtrace.engines.perf.sysops import SysOps
    ops = SysOps()
    true = shutil.which("true")
    pid, handle = ops.spawn_held([true])
    try:
        fd = ops.perf_event_open(sideband_attr(enable_on_exec=True), pid, -1)
    except OSError as e:
        ops.kill(pid)
        ops.discard(handle)
        ops.wait(pid, True)
        pytest.skip(f"perf_event_open unavailable here: {e}")
    base = ops.mmap(fd, (1 + DATA_PAGES) * PAGE_SIZE, 0, True)
    ev = _Event(fd, -1, pid, base)
    try:
        # the ioctl numbers are the kernel's: ENABLE/DISABLE work, and
        # SET_FILTER is recognized (EINVAL for an event without address
        # filters, where an unknown request would be ENOTTY)
        ops.ioctl(fd, abi.PERF_EVENT_IOC_ENABLE)
        ops.ioctl(fd, abi.PERF_EVENT_IOC_DISABLE)
        with pytest.raises(OSError) as ei:
            ops.set_filter(fd, "filter 0x0/0x10@/bin/true")
        assert ei.value.errno == errno.EINVAL
        ops.release(handle)
        assert ops.wait(pid, True) == 0
        ev.drain_records()
        page = ev.page()
        assert page.data_tail == page.data_head > 0
        recs = [r for chunk in ev.raw for r in iter_records(chunk, sample_type=SAMPLE_TYPE)]
    finally:
        base.close()
        ops.close(fd)
    comm = [r for r in recs if r.type == abi.COMM]
    assert comm and comm[0].body.exec and comm[0].body.pid == pid
    assert comm[0].body.comm == os.path.basename(os.path.realpath(true))[:15]
    maps = [r.body for r in recs if r.type == abi.MMAP2 and r.body.executable]
    assert os.path.realpath(true) in {m.filename for m in maps}
    assert any(r.type == abi.EXIT and r.body.pid == pid for r in recs)
    assert all(r.sample_id.pid == pid for r in recs if r.sample_id and r.type != abi.EXIT)
    times = [r.sample_id.time for r in recs if r.sample_id]
    assert times == sorted(times) and times[0] > 0
    # the mmap page offers the TSC conversion where the clock allows it
    tc = page.time_conv()
    assert tc is None or tc.time_mult > 0


def test_kernel_maps(tmp_path):
    from hwtrace.engines.perf.kernel import (kernel_maps, parse_kallsyms, parse_modules,
                                             parse_notes)
    kallsyms = ("ffffffff81000000 T _stext\nffffffff81000000 T _text\n"
                "ffffffff81e00000 T _etext\n")
    assert parse_kallsyms(kallsyms) == (0xffffffff81000000, 0xffffffff81e00000)
    assert parse_kallsyms(kallsyms.replace("ffffffff81", "0000000000")) is None  # restricted
    bid = bytes(range(20))
    notes = (struct.pack("<III", 6, 4, 0x100) + b"Linux\0\0\0" + b"\1\2\3\4"
             + struct.pack("<III", 4, 20, 3) + b"GNU\0" + bid)
    assert parse_notes(notes) == bid.hex()
    assert parse_notes(notes[:30]) == ""
    assert parse_modules("kvm 1130496 1 kvm_intel, Live 0xffffffffc0a00000\n"
                         "bad line\nx 10 0 - Live 0x0000000000000000\n") == [
        ("kvm", 0xffffffffc0a00000, 1130496)]
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    (sysfs / "kernel").mkdir(parents=True)
    proc.mkdir()
    (proc / "kallsyms").write_text(kallsyms)
    (proc / "modules").write_text("kvm 4096 1 - Live 0xffffffffc0a00000\n")
    (sysfs / "kernel/notes").write_bytes(notes)
    assert kernel_maps(proc, sysfs) == [
        B.Mmap(pid=-1, start=0xffffffff81000000, size=0xe00000, offset=0xffffffff81000000,
               file="[kernel.kallsyms]_text", build_id=bid.hex()),
        B.Mmap(pid=-1, start=0xffffffffc0a00000, size=4096, offset=0, file="[kvm]")]
    # this machine (as root, kallsyms shows addresses): the kernel map exists
    if os.geteuid() == 0 and Path("/proc/kallsyms").exists():
        here = kernel_maps()
        if here:
            assert here[0].file == "[kernel.kallsyms]_text" and here[0].size > 0


def test_engine_adds_kernel_maps_when_tracing_the_kernel(tmp_path):
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()
    (sysfs / "kernel").mkdir(parents=True)
    (proc / "kallsyms").write_text("ffffffff81000000 T _text\nffffffff81e00000 T _etext\n")
    ops = FakeOps(aux_payload=PSB)
    pmu = PmuInfo(type=8, format=dict(DEFAULT_FORMAT), caps={})
    eng = PerfEngine(ops=ops, pmu=pmu, num_cpus=1, paranoid=-1, proc=str(proc), sysfs=str(sysfs))
    os_ctl = BufferConfig(num_chunks=1, chunk_order=0, ctl=Ctl(PT_SKYLAKE_CTL | int(Ctl.OS)))
    s = _session(Mode.CPU, os_ctl)
    eng.run(s, ["true"])
    kmaps = [r for r in s.sideband if isinstance(r, B.Mmap) and r.pid == -1]
    assert [(m.file, m.start, m.size) for m in kmaps] == [
        ("[kernel.kallsyms]_text", 0xffffffff81000000, 0xe00000)]
    pt = next(e for e in ops.events.values() if e["attr"].type == 8)
    assert not pt["attr"].flag("exclude_kernel") and not pt["attr"].flag("exclude_user")
    s = _session(Mode.CPU, BufferConfig(num_chunks=1, chunk_order=0, ctl=Ctl(PT_SKYLAKE_CTL)))
    PerfEngine(ops=FakeOps(aux_payload=PSB), pmu=pmu, num_cpus=1, paranoid=-1,
               proc=str(proc), sysfs=str(sysfs)).run(s, ["true"])
    assert not [r for r in s.sideband if isinstance(r, B.Mmap) and r.pid == -1]


def test_proc_maps_synthesis():
    from hwtrace.engines.perf.kernel import parse_proc_maps, process_sideband
    text = ("556f42600000-556f42602000 r--p 00000000 fe:00 260386  /usr/bin/head\n"
            "556f42602000-556f42608000 r-xp 00002000 fe:00 260386  /usr/bin/head\n"
            "7ffd1000-7ffd3000 r-xp 00000000 00:00 0  [vdso]\n"
            "7f0000000000-7f0000001000 rwxp 00000000 00:00 0 \n"
            "7f0000002000-7f0000003000 r-xp 00001000 08:01 5  /tmp/x (deleted)\n")
    assert [(m.start, m.size, m.offset, m.file, m.prot) for m in parse_proc_maps(text, 9)] == [
        (0x556f42602000, 0x6000, 0x2000, "/usr/bin/head", "r-x"),
        (0x7ffd1000, 0x2000, 0, "[vdso]", "r-x"),
        (0x7f0000000000, 0x1000, 0, "//anon", "rwx"),
        (0x7f0000002000, 0x1000, 0x1000, "/tmp/x", "r-x")]
    me = process_sideband(os.getpid())
    assert me[0].pid == os.getpid() and me[0].exe == os.path.realpath("/proc/self/exe")
    assert any(m.file == me[0].exe for m in me[1:])
