"""perf.data reader on real Intel PT captures (file and pipe layout).

Expected numbers were derived once, independently, with Debian's
linux-perf 6.1 (``perf report -D --stdio -i FILE``; for the pipe layout
``cat FILE | perf report -D -i -``, because perf 6.1 mis-seeks AUXTRACE
payloads when given a pipe-layout file by name), and from perf's hex dump
of the AUX data (SHA-256 of the bytes it printed).  They are constants
here: the package never reads perf's text.
"""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
from collections import Counter, defaultdict

import pytest

from conftest import FIXTURES
from hwtrace.engines.perf import abi
from hwtrace.engines.perf.errors import PerfDataError
from hwtrace.engines.perf.features import parse_cpuid
from hwtrace.engines.perf.perfdata import PerfData, iter_records

PDC = FIXTURES / "perf_data_converter"
FILE = PDC / "perf.data.intel_pt-4.14"
PIPE = PDC / "perf.data.piped.intel_pt-4.14"
HASE = FIXTURES / "hase_loopy" / "loopy-20180404T162955.perf"
DRPT = FIXTURES / "drpt2trace_simple"

# perf report -D "Aggregated stats" (+ ATTR/FEATURE records of the pipe)
COUNTS = {
    FILE: {"MMAP": 56, "COMM": 3, "EXIT": 1, "SAMPLE": 15, "MMAP2": 10,
           "AUX": 10, "ITRACE_START": 2, "SWITCH_CPU_WIDE": 152,
           "FINISHED_ROUND": 4, "AUXTRACE_INFO": 1, "AUXTRACE": 2,
           "TIME_CONV": 1},
    PIPE: {"MMAP": 56, "COMM": 3, "EXIT": 1, "SAMPLE": 11, "MMAP2": 10,
           "AUX": 8, "ITRACE_START": 2, "SWITCH_CPU_WIDE": 552,
           "HEADER_ATTR": 4, "FINISHED_ROUND": 4, "AUXTRACE_INFO": 1,
           "AUXTRACE": 2, "TIME_CONV": 1, "HEADER_FEATURE": 12},
    HASE: {"COMM": 2, "EXIT": 1, "MMAP2": 5, "AUX": 7, "ITRACE_START": 1,
           "SWITCH_CPU_WIDE": 228, "FINISHED_ROUND": 2, "AUXTRACE_INFO": 1,
           "AUXTRACE": 1, "TIME_CONV": 1},
}
# (cpu, size, reference, idx, tid, sha256[:16] of the payload)
AUXTRACES = {
    FILE: [(0, 0x2fd0, 0xbc4cd519a6, 0, 3174, "e18fc84b18c807ac"),
           (3, 0x21a00, 0xbc4cd584c2, 3, 3174, "0e44c53fe5082aea")],
    PIPE: [(0, 0x12a70, 0x3a717781f00, 0, 3587, "21712c2d990519a6"),
           (3, 0x10a60, 0x3a71779173a, 3, 3587, None)],
    HASE: [(2, 0x570, 0xafe29e3ab9540, 2, 19233, "1065c41eec719b5e")],
}


def _load(path):
    return PerfData(path.read_bytes())


@pytest.mark.parametrize("path", [FILE, PIPE, HASE], ids=lambda p: p.name)
def test_record_counts(path, hardware):
    pd = _load(path)
    assert pd.layout == ("pipe" if path == PIPE else "file")
    assert dict(pd.record_counts()) == COUNTS[path]
    # decoding every record agrees with the header-only walk
    assert Counter(r.name for r in pd.records()) == Counter(COUNTS[path])


@pytest.mark.parametrize("path", [FILE, PIPE, HASE], ids=lambda p: p.name)
def test_auxtrace_records_and_aux_sizes(path, hardware):
    pd = _load(path)
    got = []
    for r in pd.records({abi.AUXTRACE}):
        b = r.body
        data = pd.aux_data(r)
        assert len(data) == b.size
        got.append((b.cpu, b.size, b.reference, b.idx, b.tid,
                    hashlib.sha256(data).hexdigest()[:16]))
    exp = AUXTRACES[path]
    assert [g[:5] for g in got] == [e[:5] for e in exp]
    for g, e in zip(got, exp):
        if e[5]:
            assert g[5] == e[5]
    # the AUX records (kernel's "this much was written") add up per CPU to
    # what perf saved in the AUXTRACE records, with no truncation/collision
    aux = defaultdict(int)
    for r in pd.records({abi.AUX}):
        assert r.body.flags == 0
        aux[r.sample_id.cpu] += r.body.aux_size
    assert dict(aux) == {e[0]: e[1] for e in exp}


def test_header_and_features_file_layout(hardware):
    pd = _load(FILE)
    assert (pd.data.offset, pd.data.size) == (744, 168128)
    assert pd.feature_names() == [
        "BUILD_ID", "HOSTNAME", "OSRELEASE", "VERSION", "ARCH", "NRCPUS",
        "CPUDESC", "CPUID", "TOTAL_MEM", "CMDLINE", "EVENT_DESC",
        "CPU_TOPOLOGY", "PMU_MAPPINGS", "AUXTRACE", "CACHE"]
    assert pd.feature("HOSTNAME") == "localhost"
    assert pd.feature("OSRELEASE") == "4.14.18"
    assert pd.feature("CPUDESC") == "Intel(R) Core(TM) m7-6Y75 CPU @ 1.20GHz"
    assert parse_cpuid(pd.feature("CPUID")) == ("GenuineIntel", 6, 78, 3)
    assert pd.feature("NRCPUS") == {"nr_cpus_avail": 4, "nr_cpus_online": 4}
    assert pd.feature("TOTAL_MEM") == 16299868
    assert pd.feature("PMU_MAPPINGS")["intel_pt"] == 6
    assert pd.feature("CMDLINE") == (
        "/usr/bin/perf", "record", "-e", "cycles", "-e", "intel_pt//", "-o",
        "/tmp/perf.data.intel_pt-4.14", "--", "echo", "Hello, World!")
    names = [e.name for e in pd.feature("EVENT_DESC")]
    assert names == ["intel_pt//", "cycles", "dummy:u", "dummy:u"]
    # the AUXTRACE index points at the two AUXTRACE records
    assert [o for o, _s in pd.feature("AUXTRACE")] == [
        r.offset for r in pd.records({abi.AUXTRACE})]
    # attrs: ids and config as perf report --header-only shows them
    assert [(a.attr.type, a.attr.config, a.attr.sample_type, a.ids) for a in pd.attrs] == [
        (6, 0x300e601, 0x10087, (124, 125, 126, 127)),
        (0, 0, 0x10107, (128, 129, 130, 131)),
        (1, 9, 0x10087, (132, 133, 134, 135)),
        (1, 9, 0x10087, (136, 137, 138, 139))]
    pt = pd.attrs[0].attr
    assert pt.size == 112
    assert set(pt.set_flags()) == {"disabled", "inherit", "enable_on_exec",
                                   "sample_id_all", "exclude_guest"}


def test_build_ids_match_buildids_listing(hardware):
    pd = _load(FILE)
    listed = {}
    for line in (PDC / "perf.data.intel_pt-4.14.buildids").read_text().splitlines():
        bid, name = line.split(None, 1)
        listed[name] = bid
    got = {name: b.hex() for name, b in pd.build_ids().items()}
    assert got == listed and len(got) == 66


def test_pipe_features_and_attrs_match_file_recording_machine(hardware):
    # Two different recordings (different pids, sizes) on the same machine
    # with the same command: the machine-level data must agree.
    f, p = _load(FILE), _load(PIPE)
    for name in ("HOSTNAME", "OSRELEASE", "ARCH", "NRCPUS", "CPUDESC", "CPUID",
                 "TOTAL_MEM", "PMU_MAPPINGS"):
        assert p.feature(name) == f.feature(name), name
    assert p.feature("BUILD_ID") is None and p.build_ids() == {}
    assert [(a.attr.type, a.attr.config, a.attr.sample_type) for a in p.attrs] == \
        [(a.attr.type, a.attr.config, a.attr.sample_type) for a in f.attrs]
    assert [a.ids for a in p.attrs] == [(148, 149, 150, 151), (152, 153, 154, 155),
                                        (156, 157, 158, 159), (160, 161, 162, 163)]
    info = [r.body for r in f.records({abi.AUXTRACE_INFO})]
    assert info == [r.body for r in p.records({abi.AUXTRACE_INFO})]
    assert info[0].type == 1


def test_sideband_records_decoded_file(hardware):
    pd = _load(FILE)
    recs = list(pd.records())
    tc = [r.body for r in recs if r.type == abi.TIME_CONV]
    assert [(t.time_shift, t.time_mult, t.time_zero) for t in tc] == [
        (31, 1789569706, 18446744041015200657)]
    it = [(r.body.pid, r.body.tid, r.sample_id.cpu, r.sample_id.time)
          for r in recs if r.type == abi.ITRACE_START]
    assert it == [(3174, 3174, 0, 641257926901), (3174, 3174, 3, 641256844131)]
    mm = recs[2].body
    assert (recs[2].type, mm.pid, mm.addr, mm.len, mm.pgoff, mm.filename) == (
        abi.MMAP, 0xffffffff, 0xffffffffb9600000, 0x6cf0000, 0xffffffffb9600000,
        "[kernel.kallsyms]_text")
    sw = [r for r in recs if r.type == abi.SWITCH_CPU_WIDE]
    last = sw[-1]
    assert (last.offset, last.body.out, last.body.next_prev_pid,
            last.sample_id.cpu, last.sample_id.time) == (0x29370, False, 1760, 3, 641258090053)
    assert sum(r.body.out for r in sw) == 76
    # samples of the cycles event (sample_type IP|TID|TIME|PERIOD|IDENTIFIER)
    s = [r.body for r in recs if r.type == abi.SAMPLE]
    assert all(x.identifier in (128, 129, 130, 131) and x.period for x in s)


def test_hase_sideband_records(hardware):
    pd = _load(HASE)
    recs = list(pd.records())
    m2 = [(r.body.pid, r.body.addr, r.body.len, r.body.pgoff, r.body.prot,
           r.body.filename) for r in recs if r.type == abi.MMAP2]
    assert m2 == [
        (19233, 0x7fffffffd000, 0x2000, 0x7fffffffd000, 7, "//anon"),
        (19233, 0x7fffa441c000, 0x22000, 0x7ffffffdd000, 7, "[stack]"),
        (19233, 0x400000, 0x1000, 0, 5, "/home/joerg/git/angr/hase/tests/bin/loopy/loopy"),
        (19233, 0x600000, 0x1000, 0, 7, "/home/joerg/git/angr/hase/tests/bin/loopy/loopy"),
        (19233, 0x7fffa44b1000, 0x2000, 0, 5, "[vdso]")]
    comm = [(r.body.comm, r.body.exec) for r in recs if r.type == abi.COMM]
    assert comm == [(".perf-wrapped", False), ("loopy", True)]
    assert parse_cpuid(pd.feature("CPUID")) == ("GenuineIntel", 6, 94, 3)


def test_drpt2trace_sideband_files(hardware):
    prim = list(iter_records((DRPT / "primary.sideband.pevent").read_bytes(),
                             sample_type=0x10086))
    assert [r.name for r in prim] == ["SWITCH", "ITRACE_START", "COMM", "MMAP2",
                                      "MMAP2", "AUX", "EXIT"]
    assert all(r.sample_id.cpu == 9 and r.sample_id.pid == 223991 for r in prim)
    mm = prim[3].body
    assert (mm.addr, mm.len, mm.pgoff, mm.prot, mm.filename) == (
        0x401000, 0x1000, 0x1000, 5, "/hello")
    assert (prim[5].body.aux_size, prim[5].body.flags) == (2272, 0)
    assert prim[5].body.aux_size == (DRPT / "pt.bin").stat().st_size
    sec = list(iter_records((DRPT / "secondary.sideband.pevent").read_bytes(),
                            sample_type=0x10086))
    assert [r.name for r in sec] == ["TIME_CONV", "ID_INDEX", "THREAD_MAP",
                                     "CPU_MAP", "COMM"]
    tc = sec[0].body
    assert (tc.time_shift, tc.time_mult, tc.time_zero) == (31, 581029125,
                                                           18444502336406842448)
    assert [e.cpu for e in sec[1].body.entries] == list(range(12)) * 2
    assert sec[2].body.entries == ((223991, ""),)
    assert sec[3].body.cpus == tuple(range(12))


@pytest.mark.parametrize("path", [FILE, PIPE, HASE], ids=lambda p: p.name)
def test_streams_decode_at_packet_level(path, ptoracle, tmp_path, hardware):
    pd = _load(path)
    for r in pd.records({abi.AUXTRACE}):
        f = tmp_path / f"cpu{r.body.cpu}.pt"
        f.write_bytes(pd.aux_data(r))
        out = subprocess.run([str(ptoracle), "pkt", str(f), "--summary"],
                             capture_output=True, text=True, check=True).stdout
        summary = json.loads(out.splitlines()[-1])
        assert summary["errors"] == 0 and summary["bytes"] == r.body.size


def test_time_conv_round_trip(hardware):
    pd = _load(FILE)
    tc = next(pd.records({abi.TIME_CONV})).body
    # ITRACE_START on cpu 3 at perf time 641256844131: TSC -> time -> TSC
    tsc = tc.perf_time_to_tsc(641256844131)
    assert abs(tc.tsc_to_perf_time(tsc) - 641256844131) <= 1


# -- hostile input: never anything but PerfDataError, never a huge alloc ---
def _must_fail_cleanly(data):
    try:
        pd = PerfData(data)
        for _ in pd.records():
            pass
        _ = pd.attrs
        for n in pd.feature_names():
            pd.feature(n)
        for r in pd.records({abi.AUXTRACE}):
            pd.aux_data(r)
    except PerfDataError as e:
        assert isinstance(e.offset, int)


def test_truncations_raise_only_format_errors(hardware):
    for path in (FILE, PIPE, HASE):
        data = path.read_bytes()
        for cut in list(range(0, 800, 7)) + list(range(800, len(data), 997)):
            _must_fail_cleanly(data[:cut])


def test_corrupted_sizes_raise_only_format_errors(hardware):
    data = bytearray(HASE.read_bytes())
    offsets = [r.offset for r in PerfData(bytes(data)).records()]
    for off in offsets[::5]:
        for field, fmt, val in ((6, "<H", 0), (6, "<H", 0xffff), (6, "<H", 9),
                                (8, "<Q", 1 << 62), (8, "<I", 0x7fffffff)):
            bad = bytearray(data)
            struct.pack_into(fmt, bad, off + field, val)
            _must_fail_cleanly(bytes(bad))
    # header fields: attr/data/feature sections pointing anywhere
    for field in range(16, 104, 8):
        for val in (0, 1, 1 << 40, len(data) - 1):
            bad = bytearray(data)
            struct.pack_into("<Q", bad, field, val)
            _must_fail_cleanly(bytes(bad))


def test_huge_counts_do_not_allocate():
    # an ID_INDEX claiming 2**60 entries in a 24-byte record
    rec = struct.pack("<IHHQ", abi.ID_INDEX, 0, 16, 1 << 60)
    with pytest.raises(PerfDataError):
        list(iter_records(rec))
    rec = struct.pack("<IHHQ", abi.THREAD_MAP, 0, 16, 1 << 60)
    with pytest.raises(PerfDataError):
        list(iter_records(rec))


def test_not_perf_data():
    for data in (b"", b"PERFILE2", b"\0" * 200, b"2ELIFREP" + b"\0" * 200):
        with pytest.raises(PerfDataError):
            PerfData(data)


def test_random_mutations_raise_only_format_errors(hardware):
    import random
    rnd = random.Random(1234)
    for path in (PIPE, HASE):
        data = path.read_bytes()
        limit = min(len(data), 12000)
        for _ in range(150):
            bad = bytearray(data)
            for _k in range(rnd.randint(1, 4)):
                bad[rnd.randrange(limit)] = rnd.randrange(256)
            _must_fail_cleanly(bytes(bad))


# -- record-by-record agreement with perf 6.1 ----------------------------------
# SHA-256 (first 16 hex digits) of JSON lists derived once from
# ``perf report -D`` (pipe: read from stdin; its offsets count from the end
# of the 16-byte pipe header):
#   LAYOUT:  sorted (offset, size, type name) of every record
#   TIMES:   sorted (offset, cpu, time) of every record perf shows a time for
#            (cpu 4294967295 where the sample has no CPU field)
#   FIELDS:  sorted (offset, name, whitespace-normalized text perf printed
#            after the name) of MMAP, MMAP2, COMM, SWITCH_CPU_WIDE, AUX,
#            ITRACE_START, EXIT, AUXTRACE -- rebuilt here from our records
#            in perf's notation (C's %#x prints 0 as "0").
PERF_DIGESTS = {
    FILE: ("93bd6521163cb08e", "099beffebecb038a", "edb5dea2198e7486", 257, 192, 236),
    HASE: ("456d7820fbeffca3", "b8c2bf73596a6bfd", "ccba078dc5d22e1a", 249, 243, 245),
    PIPE: ("6faf3e899bd0ad4e", "c6d3ff185c72b1f7", "36ee161d8154871c", 667, 586, 634),
}
_PERF_FIELD_TYPES = {"MMAP", "MMAP2", "COMM", "SWITCH_CPU_WIDE", "AUX", "ITRACE_START",
                     "EXIT", "AUXTRACE"}


def _digest(rows):
    return hashlib.sha256(json.dumps(sorted(rows)).encode()).hexdigest()[:16]


def _hx(v):
    return "0" if v == 0 else hex(v)


def _s32(v):
    return v - (1 << 32) if v >= 1 << 31 else v


def _perf_text(r):
    b = r.body
    if r.type == abi.MMAP:
        return (f"{_s32(b.pid)}/{b.tid}: [{_hx(b.addr)}({_hx(b.len)}) @ {_hx(b.pgoff)}]: "
                f"{'x' if b.executable else 'r'} {b.filename}")
    if r.type == abi.MMAP2:
        p = "".join(c if b.prot & m else "-" for c, m in (("r", 1), ("w", 2), ("x", 4)))
        p += "s" if b.flags & 1 else "p"
        return (f"{_s32(b.pid)}/{b.tid}: [{_hx(b.addr)}({_hx(b.len)}) @ {_hx(b.pgoff)} "
                f"{b.maj:02x}:{b.min:02x} {b.ino} {b.ino_generation}]: {p} {b.filename}")
    if r.type == abi.COMM:
        return f"{' exec' if b.exec else ''}: {b.comm}:{b.pid}/{b.tid}".strip()
    if r.type == abi.SWITCH_CPU_WIDE:
        return (f"{'OUT' if b.out else 'IN'} {'next' if b.out else 'prev'} pid/tid: "
                f"{b.next_prev_pid}/{b.next_prev_tid}")
    if r.type == abi.AUX:
        return f"offset: {_hx(b.aux_offset)} size: {_hx(b.aux_size)} flags: {_hx(b.flags)} []"
    if r.type == abi.ITRACE_START:
        return f"pid: {b.pid} tid: {b.tid}"
    if r.type == abi.EXIT:
        return f"({b.pid}:{b.tid}):({b.ppid}:{b.ptid})"
    return (f"size: {_hx(b.size)} offset: {_hx(b.offset)} ref: {_hx(b.reference)} "
            f"idx: {b.idx} tid: {b.tid} cpu: {_s32(b.cpu)}")


@pytest.mark.parametrize("path", [FILE, PIPE, HASE], ids=lambda p: p.name)
def test_every_record_agrees_with_perf(path, hardware):
    layout, times, fields = [], [], []
    for r in _load(path).records():
        layout.append((r.offset, r.size, r.name))
        if r.type == abi.SAMPLE:
            t, cpu = r.body.time, r.body.cpu
        elif r.sample_id is not None:
            t, cpu = r.sample_id.time, r.sample_id.cpu
        else:
            t = cpu = None
        if t:
            times.append((r.offset, 4294967295 if cpu is None else cpu, t))
        if r.name in _PERF_FIELD_TYPES:
            fields.append((r.offset, r.name, " ".join(_perf_text(r).split())))
    d = PERF_DIGESTS[path]
    assert (len(layout), len(times), len(fields)) == d[3:]
    assert (_digest(layout), _digest(times), _digest(fields)) == d[:3]


def test_hypothesis_random_records_only_format_errors():
    """Any stream of well-framed records with arbitrary bodies (types the
    reader knows, random sizes/contents) decodes or fails with PerfDataError."""
    from hypothesis import given, settings, strategies as st

    types = st.sampled_from(sorted(abi.RECORD_NAMES) + [99, 1000])
    record = st.tuples(types, st.integers(0, 0xffff), st.binary(max_size=120))

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(st.lists(record, max_size=8), st.integers(0, 0x3ffff))
    def check(recs, sample_type):
        body = b""
        for t, misc, payload in recs:
            payload = payload[:0xfff0]
            body += struct.pack("<IHH", t, misc, 8 + len(payload)) + payload
        for data in (b"PERFILE2" + struct.pack("<Q", 16) + body, body):
            try:
                if data.startswith(b"PERFILE2"):
                    pd = PerfData(data)
                    list(pd.records())
                    [pd.feature(n) for n in pd.feature_names()]
                    pd.build_ids()
                else:
                    list(iter_records(data, sample_type=sample_type))
            except PerfDataError:
                pass
    check()
