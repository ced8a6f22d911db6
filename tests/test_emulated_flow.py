"""The flow layer on hand-written execution logs: signal deliveries found
without SIGNAL records (as from QEMU), nested at rt_sigreturn, decoded by
libipt to exactly the observed instructions."""

import json
import subprocess

from hwtrace.engines.emulated import execlog as xl, flow, ptgen

LOOP = 0x1000       # nop; je LOOP      (every iteration needs a TNT bit)
EXIT = 0x1003       # syscall (exit)
HANDLER = 0x2000    # nop; syscall (rt_sigreturn)
CODE_LOOP = bytes.fromhex("9074fd")
CODE_EXIT = bytes.fromhex("0f05")
CODE_HANDLER = bytes.fromhex("900f05")


def image(tmp_path):
    img = bytearray(0x1010)
    img[0:3] = CODE_LOOP
    img[3:5] = CODE_EXIT
    img[0x1000:0x1003] = CODE_HANDLER
    p = tmp_path / "img.bin"
    p.write_bytes(bytes(img))
    return ["--raw", f"{p}:{LOOP:#x}"]


def log_with_signals(nested: bool) -> bytes:
    w = xl.Writer(source=xl.SOURCE_QEMU, clock=xl.CLOCK_HOST_TSC)
    w.ctx(10, 10, 0)
    w.time(1000)
    w.proc_start(0)
    w.thread_start(0)
    w.block(10, 1, LOOP, b"\x01\x02", CODE_LOOP)
    w.block(10, 2, HANDLER, b"\x01\x02", CODE_HANDLER)
    w.block(10, 3, EXIT, b"\x02", CODE_EXIT)
    w.sigaction(14, HANDLER, 0)
    w.exec([1, 1, 1, 2])            # interrupted after a taken je: handler runs
    w.syscall(15)
    w.sysret(15, 0)
    if nested:                       # pending at sigreturn: delivered again
        w.exec([2])
        w.syscall(15)
        w.sysret(15, 0)
    w.exec([1, 1, 3])                # back where the first signal interrupted
    w.syscall(60)
    w.thread_exit(0)
    return bytes(w)


def test_signals_found_and_decoded(tmp_path, ptoracle):
    for nested in (False, True):
        trace = flow.load(log_with_signals(nested))
        items = trace.threads[10].segments[0].items
        sigs = [it for it in items if type(it) is xl.Signal]
        assert sigs == [xl.Signal(0, True, HANDLER, LOOP)]
        for ctl in ((1 << 13) | (1 << 3), (1 << 13) | (1 << 3) | (1 << 11)):
            (res,) = flow.generate(trace, ptgen.TraceConfig(ctl=ctl), mode="thread")
            pt = tmp_path / "s.pt"
            pt.write_bytes(bytes(res.tracer.buf))
            out = subprocess.run([str(ptoracle), "insn", str(pt), *image(tmp_path),
                                  "--max-insns", "1000"],
                                 capture_output=True, text=True, check=True, timeout=60).stdout
            lines = [json.loads(x) for x in out.splitlines()]
            assert not [x for x in lines if "error" in x]
            ips = [x["ip"] for x in lines if "iclass" in x]
            handler_runs = 2 if nested else 1
            assert len(ips) == res.tracer.insns == 11 + 2 * handler_runs
            assert ips.count(HANDLER) == handler_runs
            assert [x["at"] for x in lines if x.get("event") == "async_disabled"] == [LOOP]


# EXEC_PART from QEMU: the block it names ran only so far (the plugin
# counted up to an instruction that faulted; no SIGNAL record follows).
LOAD = 0x1010       # nop; mov (%rax),%eax; je LOAD
CODE_LOAD = bytes.fromhex("908b0074fb")


def _oracle(ptoracle, tmp_path, res):
    img = bytearray(0x1020)
    img[0x10:0x15] = CODE_LOAD
    img[0x1000:0x1003] = CODE_HANDLER
    mem = tmp_path / "img.bin"
    mem.write_bytes(bytes(img))
    pt = tmp_path / "p.pt"
    pt.write_bytes(bytes(res.tracer.buf))
    out = subprocess.run([str(ptoracle), "insn", str(pt), "--raw", f"{mem}:{0x1000:#x}"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    lines = [json.loads(x) for x in out.splitlines()]
    assert not [x for x in lines if "error" in x]
    return [x["ip"] for x in lines if "iclass" in x], lines


def _part_log(handled: bool) -> bytes:
    w = xl.Writer(source=xl.SOURCE_QEMU, clock=xl.CLOCK_HOST_TSC)
    w.ctx(10, 10, 0)
    w.time(1000)
    w.proc_start(0)
    w.thread_start(0)
    w.block(10, 1, LOAD, b"\x01\x02\x02", CODE_LOAD)
    w.block(10, 2, HANDLER, b"\x01\x02", CODE_HANDLER)
    if handled:
        w.sigaction(11, HANDLER, 0)
        w.exec([1, 1, 1])
        w.exec_part(1, 1)           # nop retired, the load faulted
        w.exec([2])                 # the handler, which exits
        w.syscall(60)
        w.thread_exit(0)
    else:
        w.exec([1, 1])
        w.exec_part(1, 0)           # the taken je's target faulted: the thread died
    return bytes(w)


def test_exec_part_faults_where_it_says(tmp_path, ptoracle):
    """A thread that died at the first instruction after a taken je, and
    one whose load faulted after the nop of its block into a handler that
    never returns: FUP + TIP.PGD at exactly that instruction; the compiled
    generator writes the same bytes."""
    from hwtrace.engines.emulated import fast
    cfg = ptgen.TraceConfig(ctl=(1 << 13) | (1 << 3) | (1 << 10))
    log = tmp_path / "x.log"
    log.write_bytes(_part_log(False))
    (res,) = flow.generate(flow.load(log.read_bytes()), cfg, mode="thread")
    ips, lines = _oracle(ptoracle, tmp_path, res)
    assert ips == [LOAD, LOAD + 1, LOAD + 3] * 2 == ips[:res.tracer.insns]
    assert [x["at"] for x in lines if x.get("event") == "async_disabled"] == [LOAD]
    index = flow.load(log.read_bytes(), index_only=True)
    assert fast.eligible(index, cfg)
    streams, _sw, _ex = fast.generate(log, index, cfg, "thread", 1, flow.assign_cr3(index.processes))
    assert streams[res.key] == (bytes(res.tracer.buf), res.tracer.insns)

    trace = flow.load(_part_log(True))
    (sig,) = [it for it in trace.threads[10].segments[0].items if type(it) is xl.Signal]
    assert sig.ip == LOAD + 1
    (res,) = flow.generate(trace, cfg, mode="thread")
    ips, lines = _oracle(ptoracle, tmp_path, res)
    assert ips == [LOAD, LOAD + 1, LOAD + 3] * 3 + [LOAD, HANDLER, HANDLER + 1]
    assert len(ips) == res.tracer.insns
    assert [x["at"] for x in lines if x.get("event") == "async_disabled"] == [LOAD + 1]
    # the compiled generator infers the delivery right after the cut too
    log.write_bytes(_part_log(True))
    index = flow.load(log.read_bytes(), index_only=True)
    assert fast.eligible(index, cfg)
    streams, _sw, _ex = fast.generate(log, index, cfg, "thread", 1, flow.assign_cr3(index.processes))
    assert streams[res.key] == (bytes(res.tracer.buf), res.tracer.insns)
