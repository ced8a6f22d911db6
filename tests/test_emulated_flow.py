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
