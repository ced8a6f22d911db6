"""The QEMU execution source: plugin build, log contents, and the generated
PT decoding with libipt (ptoracle) to exactly the observed instructions."""

import json
import os
import shutil
import subprocess

import pytest

from hwtrace.engines.emulated import execlog as xl, flow, ptgen, qemu

pytestmark = pytest.mark.skipif(shutil.which("qemu-x86_64") is None,
                                reason="qemu-user not installed")


def raw_args(trace):
    out = []
    for m in trace.mmaps:
        if not m.path.startswith("/") or not os.path.exists(m.path):
            continue
        size = min(m.size, os.path.getsize(m.path) - m.offset)
        out += ["--raw", f"{m.path}:{m.offset:#x}-{m.offset + size:#x}:{m.addr:#x}"]
    return out


def oracle_count(ptoracle, pt_path, args):
    r = subprocess.run([str(ptoracle), "insn", str(pt_path), *args],
                       capture_output=True, text=True, check=True)
    n, errors = 0, []
    for line in r.stdout.splitlines():
        o = json.loads(line)
        if "error" in o:
            errors.append(o)
        elif "iclass" in o:
            n += 1
    return n, errors


def test_true_log_and_decode(tmp_path, ptoracle):
    log = tmp_path / "x.log"
    assert qemu.run(qemu.resolve_program(["true"]), log) == 0
    data = log.read_bytes()
    hdr, _ = xl.parse_header(data)
    assert (hdr.source, hdr.clock) == (xl.SOURCE_QEMU, xl.CLOCK_HOST_TSC)
    recs = list(xl.parse(data))
    kinds = [type(r) for r in recs]
    assert kinds[kinds.index(xl.Ctx) + 2:kinds.index(xl.Ctx) + 4] == [xl.ProcStart, xl.ThreadStart]
    assert recs[-1] == xl.ProcExit(0)
    assert any(type(r) is xl.Mmap and r.path.endswith("/true") for r in recs)
    trace = flow.load(data)
    ctl = (1 << 13) | (1 << 3) | (1 << 10)
    for mode in ("thread", "cpu"):
        res = flow.generate(trace, ptgen.TraceConfig(ctl=ctl), mode=mode, num_cpus=os.cpu_count())
        total = 0
        for r in res:
            p = tmp_path / f"{mode}{r.key[1]}.pt"
            p.write_bytes(r.tracer.buf)
            n, errors = oracle_count(ptoracle, p, raw_args(trace))
            assert errors == []
            assert n == r.tracer.insns
            total += n
        assert total > 50_000


def test_resolve_program_errors(tmp_path):
    with pytest.raises(qemu.QemuError, match="no such program"):
        qemu.resolve_program(["/nonexistent/prog"])
    f = tmp_path / "f"
    f.write_bytes(b"\x7fELF\x01\x01" + b"\0" * 60)
    f.chmod(0o755)
    with pytest.raises(qemu.QemuError, match="not an x86-64"):
        qemu.resolve_program([str(f)])
    s = tmp_path / "s.sh"
    s.write_text("#!/bin/sh\necho hi\n")
    s.chmod(0o755)
    p = qemu.resolve_program([str(s), "a"])
    assert p.argv[-2:] == [str(s), "a"] and p.elf.endswith("sh")
