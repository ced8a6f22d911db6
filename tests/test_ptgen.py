"""The PT generator's packets for hand-built flows, byte for byte (SDM rules)."""

from hwtrace.engines.emulated import ptgen as G
from hwtrace.pt import encoder as E

BR, USER, TSC, DISRETC = 1 << 13, 1 << 3, 1 << 10, 1 << 11
PSB_PLUS = E.psb() + E.cbr(22) + E.psbend()


def tracer(ctl=BR | USER, **kw):
    return G.Tracer(G.TraceConfig(ctl=ctl, **kw))


def test_enable_syscall_and_return():
    t = tracer()
    t.enter(0x401000)                       # first user instruction
    t.retire(3)
    t.branch(G.K_JCC, 0x401010, 0x401020)   # taken
    t.retire(2)
    t.branch(G.K_JCC, 0x401030, 0x401030)   # not taken
    t.leave_sync()                          # syscall
    t.enter(0x401040)                       # sysret
    t.finish()
    assert bytes(t.buf) == (PSB_PLUS + E.mode_exec(csl=1) + E.tip_pge(0x401000, ipc=3)
                            + E.tnt8("tn") + E.tip_pgd()
                            + E.tip_pge(0x1040, ipc=1)
                            + E.fup(0x1040, ipc=1) + E.tip_pgd())   # TraceEn cleared
    assert t.insns == 5


def test_return_compression_and_disretc():
    for ctl, tail in ((BR | USER, E.tnt8("t")),
                      (BR | USER | DISRETC, E.tip(0x2005, ipc=1))):
        t = tracer(ctl)
        t.enter(0x401000)
        t.branch(G.K_CALL, 0x402005, 0x403000)
        t.branch(G.K_RET, 0x403001, 0x402005)
        t.leave_sync()
        assert bytes(t.buf) == (PSB_PLUS + E.mode_exec(csl=1) + E.tip_pge(0x401000, ipc=3)
                                + tail + E.tip_pgd())


def test_call_next_is_not_pushed_and_mismatch_is_tip():
    t = tracer()
    t.enter(0x401000)
    t.branch(G.K_CALL, 0x401005, 0x401005)  # call next (PIC)
    t.branch(G.K_RET, 0x401100, 0x401005)
    assert bytes(t.buf).endswith(E.tip(0x1005, ipc=1))


def test_async_leave_and_filter_and_tracestop():
    t = tracer()
    t.enter(0x401000)
    t.leave_async(0x401004)
    assert bytes(t.buf).endswith(E.fup(0x1004, ipc=1) + E.tip_pgd())
    ctl = BR | USER | (1 << 32) | (2 << 36)
    t = tracer(ctl, addr_ranges=((0x401000, 0x401fff), (0x500000, 0x500fff)))
    t.enter(0x400000)                         # outside the filter: nothing
    assert bytes(t.buf) == PSB_PLUS
    t.branch(G.K_JMP, 0x400005, 0x401000)     # into the range
    t.retire(1)
    t.branch(G.K_JCC, 0x401002, 0x600000)     # leaves: PGD(target), no TNT
    t.branch(G.K_JMP, 0x600005, 0x401000)
    t.branch(G.K_JMP, 0x401005, 0x500000)     # TraceStop
    t.retire(10)
    assert bytes(t.buf) == (PSB_PLUS + E.mode_exec(csl=1) + E.tip_pge(0x401000, ipc=3)
                            + E.tip_pgd(0x600000, ipc=2) + E.tip_pge(0x401000, ipc=2)
                            + E.tip_pgd(0x500000, ipc=2) + E.stop())
    assert t.insns == 1


def test_timing_packets_and_psb_interval():
    ctl = BR | USER | TSC | (1 << 9) | (0 << 14)
    t = tracer(ctl, timing=G.Timing(t0=1000))
    art = 1000 * 2 // 176
    assert bytes(t.buf) == (E.psb() + E.tsc(1000) + E.tma(art, 1000 - art * 88)
                            + E.cbr(22) + E.psbend())
    t.enter(0x401000)
    t.retire(88)                              # one ART tick: one MTC (MTCFreq 0)
    assert bytes(t.buf).endswith(E.mtc((art + 1) & 0xFF))
    # PSBFreq 0: past 2 KiB, PSB+ at the boundary after the next retired
    # instruction (mid-block), with the TSC and FUP of that boundary
    for _ in range(1100):
        t.branch(G.K_JMP_IND, 0, 0x401000)
        t.branch(G.K_JMP_IND, 0, 0x402000)
    assert bytes(t.buf).count(E.psb()) == 1
    t.run(0x402000, 3, b"\x02\x03\x01")
    assert bytes(t.buf).count(E.psb()) == 2
    assert bytes(t.buf).endswith(E.psb() + E.tsc(1089) + E.tma(12, 1089 - 12 * 88) + E.cbr(22)
                                 + E.mode_exec(csl=1) + E.fup(0x402002, ipc=3) + E.psbend())
    assert t.t == 1091 and t.insns == 91


def test_psb_lands_one_instruction_after_the_crossing_packet():
    """The packet that reaches PacketByteCnt's period is at a branch; PSB+
    follows one retired instruction later: inside the next run when it has
    two or more instructions, at the start of the one after a run of one."""
    for sizes, runs, want in (
            (b"\x01\x04\x02", [(0x401000, 3)], 0x401001),            # mid-block
            (b"\x05", [(0x401000, 1), (0x401010, 1)], 0x401010)):      # next run's start
        t = tracer(BR | USER)
        t.enter(0x400000)
        while t.since_psb < t.psb_period:
            t.branch(G.K_JMP_IND, 0, 0x400000 + (t.since_psb & 0xFFF0))
        before = len(t.buf)
        for pc, n in runs:
            t.run(pc, n, sizes)
        tail = bytes(t.buf[before:])
        assert tail == (E.psb() + E.cbr(22) + E.mode_exec(csl=1) + E.fup(want, ipc=3)
                        + E.psbend()), tail.hex()


def test_cyc_and_tnt64():
    t = tracer(BR | USER | 2, long_tnt=True)
    t.enter(0x401000)
    t.retire(5)
    for i in range(8):
        t.branch(G.K_JCC, 0x401010, 0x401020 if i % 2 else 0x401010)
    t.leave_sync()
    assert bytes(t.buf) == (PSB_PLUS + E.mode_exec(csl=1) + E.tip_pge(0x401000, ipc=3)
                            + E.cyc(5) + E.tnt64("ntntntnt") + E.tip_pgd())


def test_cyc_before_mtc_counts_to_the_art_tick():
    """An ART tick (an MTC period, MTCFreq 0: every 88 TSC ticks) falls
    inside a run of instructions: the MTC is written after the run, but the
    CYC before it counts the cycles up to the tick (the MTC's time, where a
    decoder re-anchors), and the run's cycles after the tick go into the
    next CYC.  A CYC up to the run's end put libipt's time behind the
    generator's clock (and the sideband's stamps) by up to a run's length
    until the next timing packet."""
    t0 = 1000                                   # ART 11 (tick at 968), next at 1056
    t = tracer(BR | USER | TSC | (1 << 9) | 2, timing=G.Timing(t0=t0))
    t.enter(0x401000)
    t.retire(50)                                # to 1050: no tick
    t.branch(G.K_JMP_IND, 0, 0x402000)
    t.retire(20)                                # to 1070: the tick at 1056
    t.leave_sync()
    art = t0 * 2 // 176
    head = (E.psb() + E.tsc(t0) + E.tma(art, t0 - art * 88) + E.cbr(22) + E.psbend()
            + E.mode_exec(csl=1) + E.tip_pge(0x401000, ipc=3))
    assert bytes(t.buf) == head + (E.cyc(50) + E.tip(0x402000, ipc=1) + E.cyc(6)
                                   + E.mtc(art + 1) + E.cyc(14) + E.tip_pgd())
    # with a threshold the CYC before the MTC needs it too; the cycles stay counted
    t = tracer(BR | USER | TSC | (1 << 9) | 2 | (4 << 19), timing=G.Timing(t0=t0))
    t.enter(0x401000)
    t.retire(50)
    t.branch(G.K_JMP_IND, 0, 0x402000)
    t.retire(20)
    t.leave_sync()
    assert bytes(t.buf) == head + (E.cyc(50) + E.tip(0x402000, ipc=1)
                                   + E.mtc(art + 1) + E.cyc(20) + E.tip_pgd())
