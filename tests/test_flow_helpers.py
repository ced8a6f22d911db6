"""Small flow state helpers: TNT cache, return stack, address filter,
ptxed text formatting."""

from hwtrace.flow.config import AddrFilter
from hwtrace.flow.events import Event
from hwtrace.flow.ptxed import error_line, event_line, insn_line
from hwtrace.flow.retstack import CAPACITY, RetStack
from hwtrace.flow.tnt import TntCache


def test_tnt_cache_hands_out_oldest_bit_first():
    c = TntCache()
    assert c.empty() and c.take() == -1
    assert c.fill(0b101, 3)          # taken, not taken, taken
    assert not c.fill(0b1, 1)        # bits still cached
    assert [c.take(), c.take(), c.take()] == [1, 0, 1]
    assert c.empty() and c.take() == -1


def test_retstack_overwrites_oldest_when_full():
    s = RetStack()
    assert s.pop() is None
    for i in range(CAPACITY + 2):
        s.push(i)
    assert len(s) == CAPACITY
    assert s.pop() == CAPACITY + 1
    for _ in range(CAPACITY - 1):
        last = s.pop()
    assert last == 2                 # 0 and 1 were overwritten
    assert s.pop() is None


def test_addr_filter_check():
    f = AddrFilter()
    assert f.check(0x1234)           # no filter: everything passes
    f.addr_cfg = 1
    f.a[0], f.b[0] = 0x1000, 0x10ff
    assert f.check(0x1000) and f.check(0x10ff)
    assert not f.check(0x1100)
    f.addr_cfg = 2                   # a stop range is not a filter
    assert f.check(0x1100)


def test_ptxed_lines():
    assert insn_line(0x1000, False) == "0000000000001000"
    assert insn_line(0x1000, True) == "? 0000000000001000"
    assert error_line(0x1b, 0x100000, "error",
                      "trace stream does not match query") == \
        "[1b, 100000: error: trace stream does not match query]"
    ev = Event("async_branch", from_=0x10, to=0x20)
    assert event_line(ev) == "[interrupt]"
    assert event_line(ev, show_ip=True) == \
        "[interrupt, from: 0000000000000010, to: 0000000000000020]"
    ev = Event("pwre", state=0, sub_state=0, hw=True)
    assert event_line(ev) == "[pwre c1.1 hw]"
    ev = Event("pwrx", last=0, deepest=5, interrupt=True, store=False,
               autonomous=False)
    assert event_line(ev) == "[pwrx int: c1 (c6)]"
    ev = Event("tsx", speculative=False, aborted=True, ip=0x30)
    ev.ip_suppressed = True
    assert event_line(ev, show_ip=True) == "[aborted]"


def test_cpu_errata_applied_alike_by_every_command():
    """FlowConfig.set_cpu: a known CPU turns its erratum workarounds on,
    an unknown one leaves none and is returned (decode prints ptxed's
    config error line for it), ``none`` is no CPU -- the same from decode's
    --cpu, coverage's --cpu and a bundle manifest's cpu."""
    from hwtrace.cli import build_parser
    from hwtrace.cli.coverage import _config as coverage_config
    from hwtrace.cli.decode import _config as decode_config
    from hwtrace.flow.config import Errata, FlowConfig
    from hwtrace.pt.cpu import Cpu
    from hwtrace.streams import flow_config
    skl = FlowConfig()
    assert skl.set_cpu(Cpu.parse("6/85")) is None
    assert skl.errata.bdm70 and skl.errata.skz84 and not skl.errata.bdm64
    odd = FlowConfig()
    assert odd.set_cpu(Cpu.parse("6/1")).code == "unknown cpu"
    assert odd.errata == Errata() and str(odd.cpu) == "6/1/0"
    for text, errata, said in (("6/85", skl.errata, []),
                               ("6/1", Errata(), ["[0, 0: config error: unknown cpu]\n"]),
                               ("none", Errata(), [])):
        lines = []
        args = build_parser("decode").parse_args(["decode", "--cpu", text, "--pt", "x"])
        got = [decode_config(args, lines.append), coverage_config(text),
               flow_config({"cpu": text})]
        assert [c.errata for c in got] == [errata] * 3, text
        assert len({str(c.cpu) for c in got}) == 1 and lines == said, text
