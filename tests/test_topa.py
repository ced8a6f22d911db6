"""ToPA tables and the output unit (hwtrace.topa): structure, SDM register
semantics, and hypothesis properties over random configs and byte streams."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings, strategies as st

from hwtrace.topa import (DATA_PER_TABLE, ENTRY_END, ENTRY_STOP, OVF, PSB, REGS_SIZE,
                          STATUS_ERROR, STATUS_STOPPED, STATUS_TRIGGER_EN, TABLE_BYTES,
                          OutputUnit, Registers, Topa, entry_base, entry_size, find_psb,
                          linearize, make_entry, mask_ptrs, packet_byte_cnt, ptrs_index,
                          ptrs_offset, read_registers)


def _unit(num_chunks, order=0, circular=False, regs=True):
    t = Topa.build(num_chunks, order, stop_on_full=not circular)
    mem = [bytearray(t.region_size) for _ in range(num_chunks)]
    r = bytearray(REGS_SIZE) if regs else None
    return t, mem, r, OutputUnit(t, mem, regs=r)


# ---------------------------------------------------------------- tables

def test_single_chunk_table_is_data_then_end_to_itself():
    t = Topa.build(1, 2, stop_on_full=True)
    (table,) = t.tables
    assert len(table) == 2
    data, end = table
    assert entry_base(data) == t.region_bases[0] and entry_size(data) == 16384
    assert data & ENTRY_STOP and not data & ENTRY_END
    assert end & ENTRY_END and entry_base(end) == t.table_bases[0]
    assert (data >> 6) & 0xF == 2


@pytest.mark.parametrize("n,tables", [(2047, 1), (2048, 2), (4094, 2), (4095, 3), (4096, 3)])
def test_tables_chain_with_end_and_ring_back(n, tables):
    t = Topa.build(n, 0, stop_on_full=False)
    assert len(t.tables) == tables
    for i, table in enumerate(t.tables):
        assert len(table) <= 2048
        *data, end = table
        assert all(not e & ENTRY_END for e in data)
        assert end & ENTRY_END
        assert entry_base(end) == t.table_bases[(i + 1) % tables]
        if i < tables - 1:
            assert len(data) == DATA_PER_TABLE
    assert sum(len(x) - 1 for x in t.tables) == n
    assert not any(e & ENTRY_STOP for x in t.tables for e in x)


def test_stop_only_on_last_data_entry_and_regions_aligned():
    t = Topa.build(3000, 3, stop_on_full=True)
    stops = [(i, j) for i, x in enumerate(t.tables) for j, e in enumerate(x) if e & ENTRY_STOP]
    assert stops == [(1, 3000 - DATA_PER_TABLE - 1)]
    assert all(b % t.region_size == 0 for b in t.region_bases)
    assert len(set(t.region_bases)) == 3000
    assert all(b % 4096 == 0 for b in t.table_bases)
    raw = t.table_bytes(1)
    assert len(raw) == TABLE_BYTES
    assert struct.unpack_from("<Q", raw, 8 * (3000 - DATA_PER_TABLE))[0] & ENTRY_END


def test_entry_encoding():
    assert make_entry(0x5000, 3, stop=True, intr=True) == 0x5000 | 3 << 6 | 0x10 | 0x4
    with pytest.raises(ValueError):
        make_entry(0x5001)
    assert mask_ptrs(5, 100) == 100 << 32 | 5 << 7 | 0x7F
    assert (ptrs_index(mask_ptrs(5, 100)), ptrs_offset(mask_ptrs(5, 100))) == (5, 100)


def test_capture_end_sum_rule_across_tables():
    t = Topa.build(2100, 0, stop_on_full=False)
    assert t.capture_end(t.table_bases[0], mask_ptrs(3, 17)) == 3 * 4096 + 17
    assert t.capture_end(t.table_bases[1], mask_ptrs(2, 5)) == (DATA_PER_TABLE + 2) * 4096 + 5
    # an END entry reads as the start of the next table / of the ring
    assert t.capture_end(t.table_bases[0], mask_ptrs(DATA_PER_TABLE, 0)) == DATA_PER_TABLE * 4096
    assert t.capture_end(t.table_bases[1], mask_ptrs(2100 - DATA_PER_TABLE, 0)) == 0
    assert t.capture_end(0xdead000, mask_ptrs(0, 0)) == 0


# ---------------------------------------------------------------- output unit

def test_packet_spanning_two_regions():
    t, mem, regs, u = _unit(2)
    u.write(b"\xaa" * 4090)
    u.write(bytes(range(12)))
    assert bytes(mem[0][4090:]) == bytes(range(6))
    assert bytes(mem[1][:6]) == bytes(range(6, 12))
    assert u.capture_end == 4102
    assert (u.output_base, ptrs_index(u.output_mask_ptrs), ptrs_offset(u.output_mask_ptrs)) \
        == (t.table_bases[0], 1, 6)


def test_stop_on_full_sets_stopped_and_keeps_pointer_at_end():
    t, mem, regs, u = _unit(2)
    u.enable()
    assert u.status & STATUS_TRIGGER_EN
    assert u.write(b"\x01" * 8000) == 8000
    assert u.write(b"\x02" * 500) == 192
    assert u.stopped and u.status & STATUS_STOPPED and not u.status & STATUS_TRIGGER_EN
    assert u.capture_end == 8192
    assert ptrs_index(u.output_mask_ptrs) == 1 and ptrs_offset(u.output_mask_ptrs) == 4096
    assert u.write(b"\x03" * 10) == 0
    assert u.lost == 308 + 10
    assert bytes(mem[1][-192:]) == b"\x02" * 192
    r = read_registers(regs)
    assert r.stopped and r.lost == 318 and r.stored == 8192
    u.enable()
    assert not u.status & STATUS_TRIGGER_EN  # stays stopped


def test_circular_wraps_and_reports_it():
    t, mem, regs, u = _unit(2, circular=True)
    u.write(b"\x01" * 8192)
    assert u.wrapped and u.capture_end == 0 and not u.stopped
    u.write(b"\x02" * 10)
    assert u.capture_end == 10 and bytes(mem[0][:11]) == b"\x02" * 10 + b"\x01"
    assert read_registers(regs).wrapped


def test_ovf_after_internal_overflow():
    t, mem, regs, u = _unit(1)
    u.write(b"\x00\x00")
    u.overflow()
    assert read_registers(regs).ovf_pending
    assert u.write(b"\x99") == 1
    assert bytes(mem[0][:5]) == b"\x00\x00" + OVF + b"\x99"
    assert u.capture_end == 5 and packet_byte_cnt(u.status) == 5


def test_ovf_when_resuming_after_stop():
    t, mem, regs, u = _unit(1)
    u.write(b"\x11" * 4096)
    assert u.stopped
    u.write(b"\x22")
    r = read_registers(regs)
    assert r.ovf_pending
    # software clears Stopped and points the output back at the start
    ob, mp = t.initial_registers()
    u2 = OutputUnit(t, mem, regs=regs, initial=Registers(ob, mp, 0, ovf_pending=True))
    u2.write(b"\x33")
    assert bytes(mem[0][:3]) == OVF + b"\x33"


def test_packet_byte_cnt_counts_and_resets():
    t, mem, regs, u = _unit(4)
    u.write(b"\x00" * 1000)
    assert u.packet_byte_cnt == 1000
    u.reset_packet_byte_cnt()
    u.write(b"\x00" * 3)
    assert u.packet_byte_cnt == 3 and packet_byte_cnt(read_registers(regs).status) == 3


def _bad(entries, region_bases=(0x2_0000_0000,), size=4096, initial=None):
    t = Topa((tuple(entries),), (0x1_0000_0000,), tuple(region_bases), size, False)
    return OutputUnit(t, [bytearray(size) for _ in region_bases], initial=initial)


@pytest.mark.parametrize("entries", [
    [make_entry(0x7000_0000, 0), make_entry(0x1_0000_0000, end=True)],     # no memory there
    [make_entry(0x1_0000_0000, end=True)],                                 # END in entry 0
    [make_entry(0x2_0000_0000, 0), make_entry(0x1_0000_0000, end=True, stop=True)],
    [make_entry(0x2_0000_0000, 0), make_entry(0x1_0000_0000, end=True, intr=True)],
    [make_entry(0x2_0000_0000, 0) | 1 << 3, make_entry(0x1_0000_0000, end=True)],  # reserved
    [make_entry(0x2_0000_0000, 1), make_entry(0x1_0000_0000, end=True)],   # size mismatch
    [make_entry(0x2_0000_0000, 0), make_entry(0x5_0000_0000, end=True)],   # no table there
])
def test_malformed_topa_is_an_operational_error(entries):
    u = _bad(entries)
    if not u.status & STATUS_ERROR:    # some errors only show once output reaches them
        u.write(b"\x00" * 4096)
    assert u.status & STATUS_ERROR and u.halted and not u.stopped
    assert not u.status & STATUS_TRIGGER_EN
    assert u.write(b"\x00") == 0 and u.lost >= 1
    u.enable()
    assert not u.status & STATUS_TRIGGER_EN


def test_misaligned_region_and_bad_offset_are_errors():
    size = 8192
    u = _bad([make_entry(0x2_0000_1000, 1), make_entry(0x1_0000_0000, end=True)],
             region_bases=(0x2_0000_1000,), size=size)
    assert u.status & STATUS_ERROR
    ok = [make_entry(0x2_0000_0000, 0), make_entry(0x1_0000_0000, end=True)]
    # OutputOffset == region size is legal only with Stopped set
    assert _bad(ok, initial=Registers(0x1_0000_0000, mask_ptrs(0, 4096), 0)).status & STATUS_ERROR
    u = _bad(ok, initial=Registers(0x1_0000_0000, mask_ptrs(0, 4096), STATUS_STOPPED))
    assert u.stopped and not u.status & STATUS_ERROR and u.capture_end == 4096


def test_registers_resume_and_reject_garbage():
    t, mem, regs, u = _unit(3, circular=True)
    u.write(b"\x05" * 5000)
    u.add_instructions(42)
    r = read_registers(regs)
    assert r == u.registers() and r.instructions == 42
    u2 = OutputUnit(t, mem, regs=regs, initial=r)
    u2.write(b"\x06" * 8000)
    assert u2.wrapped and u2.capture_end == (13000 % 12288)
    with pytest.raises(ValueError):
        read_registers(bytearray(REGS_SIZE))
    with pytest.raises(ValueError):
        OutputUnit(t, mem[:2])
    with pytest.raises(ValueError):
        OutputUnit(t, [bytes(4096)] * 3)


# ---------------------------------------------------------------- read back

def test_find_psb_skips_false_prefix_pairs():
    assert find_psb(b"\x00" + PSB + b"\x23") == 1
    assert find_psb(b"\x00\x02\x82" + PSB + b"\x23") == 3
    assert find_psb(b"\x82" + PSB[:-1]) == -1


def test_linearize_wrapped_starts_at_psb():
    t, mem, regs, u = _unit(1, circular=True)
    seg = PSB + b"\x23" + b"\x00" * 1000
    for _ in range(5):
        u.write(seg)
    data = linearize(mem, u.capture_end, u.wrapped)
    stream = seg * 5
    assert data.startswith(PSB)
    assert stream.endswith(data)
    assert len(data) > 4096 - len(seg) - 1
    raw = linearize(mem, u.capture_end, u.wrapped, start_at_psb=False)
    assert raw == stream[-4096:]
    assert linearize([b"\x00" * 8], 4, True) == b""


# ---------------------------------------------------------------- properties

items = st.lists(st.one_of(st.binary(min_size=0, max_size=3000), st.just("overflow")),
                 max_size=12)


def _model(writes):
    """The byte stream the CPU emits (OVF after an internal overflow)."""
    out, pending = bytearray(), False
    for w in writes:
        if w == "overflow":
            pending = True
        elif w:
            if pending:
                out += OVF
                pending = False
            out += w
    return bytes(out)


@settings(max_examples=150, deadline=None)
@given(num_chunks=st.integers(1, 5), order=st.integers(0, 1), circular=st.booleans(),
       writes=items)
def test_output_unit_properties(num_chunks, order, circular, writes):
    t, mem, regs, u = _unit(num_chunks, order, circular)
    total = t.total_size
    for w in writes:
        if w == "overflow":
            u.overflow()
        else:
            u.write(w)
    stream = _model(writes)
    data = b"".join(mem)
    # registers on disk equal the unit's
    assert read_registers(regs) == u.registers()
    ce = u.capture_end
    # capture_end: the sum rule over the pointers
    idx, off = ptrs_index(u.output_mask_ptrs), ptrs_offset(u.output_mask_ptrs)
    tab = t.table_bases.index(u.output_base)
    assert ce == (tab * DATA_PER_TABLE + idx) * t.region_size + off
    if not circular:
        kept = stream[:total]
        assert ce == len(kept)
        assert data[:ce] == kept
        assert u.stopped == (len(stream) >= total)
        assert linearize(mem, ce, u.wrapped) == kept
        assert not u.wrapped
        assert u.stored == len(kept)
    else:
        assert not u.stopped
        assert ce == len(stream) % total
        assert u.wrapped == (len(stream) >= total)
        newest = stream[-total:] if u.wrapped else stream
        assert linearize(mem, ce, u.wrapped, start_at_psb=False) == newest
        assert u.stored == len(stream)
        assert u.lost == 0
    assert u.packet_byte_cnt == u.stored % (1 << 17)


@settings(max_examples=60, deadline=None)
@given(num_chunks=st.integers(1, 4), circular=st.booleans(),
       writes=st.lists(st.binary(max_size=5000), max_size=8), split=st.integers(0, 8))
def test_resuming_from_persisted_registers_is_seamless(num_chunks, circular, writes, split):
    t, mem, regs, u = _unit(num_chunks, 0, circular)
    for w in writes[:split]:
        u.write(w)
    u2 = OutputUnit(t, mem, regs=regs, initial=read_registers(regs))
    for w in writes[split:]:
        u2.write(w)
    t3, mem3, regs3, u3 = _unit(num_chunks, 0, circular)
    for w in writes:
        u3.write(w)
    assert mem == mem3 and u2.registers() == u3.registers()


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=6),
       cut=st.integers(0, 400), wrapped=st.booleans(), psb=st.booleans(), at=st.integers(0, 400))
def test_linearize_matches_the_naive_definition(chunks, cut, wrapped, psb, at):
    if psb:   # plant a PSB somewhere
        whole = b"".join(chunks)
        at %= len(whole) + 1
        whole = whole[:at] + PSB + whole[at:]
        chunks = [whole[i:i + 40] for i in range(0, len(whole), 40)]
    whole = b"".join(chunks)
    cut %= len(whole) + 1
    got = linearize([bytearray(c) for c in chunks], cut, wrapped, start_at_psb=False)
    assert got == (whole[cut:] + whole[:cut] if wrapped else whole[:cut])
    synced = linearize(chunks, cut, wrapped)
    if wrapped:
        i = find_psb(got)
        assert synced == (got[i:] if i >= 0 else b"")
    else:
        assert synced == whole[:cut]
