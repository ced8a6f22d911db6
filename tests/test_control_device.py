"""The trace-control device: every operation's success path and every error
row of the spec's table (../shared/spec/trace-control.md), with the test engine."""

from __future__ import annotations

import pytest

import hwtrace
from hwtrace import BufferConfig, Ctl, Mode, TraceError
from hwtrace.control.capabilities import FULL
from hwtrace.control.states import State
from hwtrace.engines.testing import TestEngine
from dataclasses import replace

PSB = b"\x02\x82" * 8
PSBEND = b"\x02\x23"
CFG = BufferConfig(num_chunks=4, chunk_order=0, is_circular=False,
                   ctl=Ctl.BRANCH_EN | Ctl.USER | Ctl.TSC_EN)


@pytest.fixture
def make(tmp_path):
    devs = []

    def _make(engine=None, **kw):
        kw.setdefault("lock_path", tmp_path / f"lock{len(devs)}")
        d = hwtrace.open_device(engine=engine or TestEngine({}), **kw)
        devs.append(d)
        return d
    yield _make
    for d in devs:
        d.close()


def err(status, fn, *a, **kw):
    with pytest.raises(TraceError) as e:
        fn(*a, **kw)
    assert e.value.status == status, str(e.value)
    assert isinstance(e.value.status, str) and str(e.value.status) == status
    return e.value


def cpu_session(dev, cfg=CFG):
    ds = [dev.alloc_buffer(cfg) for _ in range(dev.num_cpus)]
    dev.cpu_mode_alloc()
    dev.cpu_mode_start()
    return ds


def still_usable(dev):
    """A full cpu-mode session works after whatever went wrong before."""
    if dev.state == State.CPU_TRACING:
        dev.cpu_mode_stop()
    if dev.state == State.CPU_ALLOCATED:
        dev.cpu_mode_free()         # buffers stay bound to their CPUs until then
    for d in list(dev._buffers):
        if dev.state != State.THREAD_TRACING:
            for tid, dd in dev.thread_buffers.items():
                dev.release_thread_buffer(dd, tid)
            dev.free_buffer(d)
    if dev.state == State.CPU_ALLOCATED:
        dev.cpu_mode_free()
    dev.set_mode(Mode.CPU)
    dev.engine.writes = {c: [PSB + PSBEND] for c in range(dev.num_cpus)}
    ds = cpu_session(dev)
    assert dev.run(["x"]) == 0
    dev.cpu_mode_stop()
    assert dev.get_buffer_info(ds[0]).capture_end == 18
    dev.cpu_mode_free()
    for d in ds:
        dev.free_buffer(d)


# ---------------------------------------------------------------- public names

def test_public_api_names():
    assert Mode.CPU == 0 and Mode.THREAD == 1
    assert Ctl.TRACE_EN == 1 and Ctl.BRANCH_EN == 1 << 13 and Ctl.TSC_EN == 1 << 10
    assert Ctl.OS == 4 and Ctl.USER == 8 and Ctl.DIS_RETC == 1 << 11
    assert {"INVALID_ARGS", "BAD_STATE", "NOT_SUPPORTED", "NO_RESOURCES", "NO_MEMORY",
            "BUFFER_TOO_SMALL", "ALREADY_BOUND"} == {s.value for s in hwtrace.Status}
    assert hwtrace.Capabilities is type(FULL)


# ---------------------------------------------------------------- open

def test_open_and_properties(make):
    dev = make(TestEngine({}, num_cpus=3))
    assert dev.num_cpus == 3 and dev.capabilities == FULL and dev.mode == Mode.CPU
    assert (dev.directory / "device.json").is_file()


def test_open_no_pt_or_no_topa_is_not_supported(make, tmp_path):
    err("NOT_SUPPORTED", make, TestEngine(capabilities=replace(FULL, pt=False)))
    err("NOT_SUPPORTED", make, TestEngine(capabilities=replace(FULL, topa_output=False)))
    make()  # the lock was not taken by the refused opens


def test_open_unknown_engine_and_bad_args(make):
    err("INVALID_ARGS", hwtrace.open_device, engine="nonesuch")
    err("INVALID_ARGS", hwtrace.open_device, engine=42)
    err("INVALID_ARGS", make, max_buffers=0)


def test_second_opener_is_already_bound(make, tmp_path):
    dev = make(lock_path=tmp_path / "the.lock")
    e = err("ALREADY_BOUND", hwtrace.open_device, engine=TestEngine(), lock_path=tmp_path / "the.lock")
    assert "already open" in str(e)
    still_usable(dev)
    dev.close()
    make(lock_path=tmp_path / "the.lock").close()   # free again after close


def test_default_lock_is_per_process(tmp_path):
    a = hwtrace.open_device(engine=TestEngine())
    try:
        err("ALREADY_BOUND", hwtrace.open_device, engine=TestEngine())
    finally:
        a.close()
    hwtrace.open_device(engine=TestEngine()).close()


def test_close_releases_engine_and_temp_dir_but_keeps_given_dir(make, tmp_path):
    eng = TestEngine()
    dev = make(eng)
    tmp = dev.directory
    dev.close()
    assert eng.closed and not tmp.exists()
    err("BAD_STATE", dev.alloc_buffer, CFG)
    dev2 = make(directory=tmp_path / "keep")
    dev2.alloc_buffer(CFG)
    dev2.close()
    assert (tmp_path / "keep" / "buf-0" / "data").is_file()


# ---------------------------------------------------------------- set_mode

def test_set_mode(make):
    dev = make()
    dev.set_mode(Mode.CPU)           # same mode: no-op
    dev.set_mode(Mode.THREAD)
    assert dev.mode == Mode.THREAD
    dev.set_mode(1)
    dev.set_mode(0)
    assert dev.mode == Mode.CPU


@pytest.mark.parametrize("bad", [2, -1, "cpu", None, True, 1.0])
def test_set_mode_unknown_is_invalid_args(make, bad):
    dev = make()
    err("INVALID_ARGS", dev.set_mode, bad)
    still_usable(dev)


def test_set_mode_while_cpu_state_allocated_or_tracing_is_bad_state(make):
    dev = make()
    dev.alloc_buffer(CFG), dev.alloc_buffer(CFG)
    dev.cpu_mode_alloc()
    err("BAD_STATE", dev.set_mode, Mode.THREAD)
    dev.set_mode(Mode.CPU)           # same mode stays a no-op
    dev.cpu_mode_start()
    err("BAD_STATE", dev.set_mode, Mode.THREAD)
    err("BAD_STATE", dev.set_mode, Mode.CPU)
    assert dev.state == State.CPU_TRACING
    still_usable(dev)


def test_set_mode_the_engine_lacks_is_not_supported(make):
    dev = make(TestEngine(modes=[Mode.CPU]))
    err("NOT_SUPPORTED", dev.set_mode, Mode.THREAD)
    assert dev.mode == Mode.CPU
    still_usable(dev)


# ---------------------------------------------------------------- alloc / config / free

def test_alloc_takes_lowest_free_slot(make):
    dev = make()
    assert [dev.alloc_buffer(CFG) for _ in range(3)] == [0, 1, 2]
    dev.free_buffer(1)
    assert dev.alloc_buffer(CFG) == 1
    dev.free_buffer(0)
    assert dev.alloc_buffer(CFG) == 0
    assert dev.alloc_buffer(CFG) == 3


def test_get_buffer_config_returns_it_as_stored(make):
    dev = make()
    cfg = BufferConfig(num_chunks=3, chunk_order=1, is_circular=True,
                       ctl=Ctl.BRANCH_EN | Ctl.OS | Ctl.ADDR0_CFG & (1 << 32),
                       cr3_match=0x1000, addr_ranges=[(0x400000, 0x401000)])
    d = dev.alloc_buffer(cfg)
    got = dev.get_buffer_config(d)
    assert got == cfg and got.addr_ranges == ((0x400000, 0x401000),)


@pytest.mark.parametrize("bad", [-1, 7, "0", None, 1.0, True])
def test_bad_descriptors_are_invalid_args(make, bad):
    dev = make()
    dev.alloc_buffer(CFG)
    for op in (dev.get_buffer_config, dev.get_buffer_info, dev.free_buffer,
               lambda d: dev.get_buffer_handle(d, 0)):
        err("INVALID_ARGS", op, bad)
    dev.set_mode(Mode.THREAD)
    err("INVALID_ARGS", dev.assign_thread_buffer, bad, 100)
    err("INVALID_ARGS", dev.release_thread_buffer, bad, 100)
    dev.free_buffer(0)
    still_usable(dev)


def test_freed_descriptor_is_invalid_args(make):
    dev = make()
    d = dev.alloc_buffer(CFG)
    dev.free_buffer(d)
    err("INVALID_ARGS", dev.get_buffer_config, d)
    err("INVALID_ARGS", dev.free_buffer, d)
    assert not (dev.directory / f"buf-{d}").exists()


def test_alloc_no_free_slot_is_no_resources(make):
    dev = make(max_buffers=2)
    dev.alloc_buffer(CFG), dev.alloc_buffer(CFG)
    err("NO_RESOURCES", dev.alloc_buffer, CFG)
    still_usable(dev)


def test_alloc_out_of_memory_is_no_memory(make):
    dev = make(memory_limit=3 * CFG.total_size)
    dev.alloc_buffer(CFG), dev.alloc_buffer(CFG), dev.alloc_buffer(CFG)
    err("NO_MEMORY", dev.alloc_buffer, CFG)
    for d in (0, 1, 2):
        dev.free_buffer(d)
    still_usable(dev)


def test_alloc_where_files_cannot_be_made_is_no_memory(make, tmp_path):
    dev = make(directory=tmp_path / "t")
    (tmp_path / "t" / "buf-0").write_text("a file where the buffer's directory goes")
    err("NO_MEMORY", dev.alloc_buffer, CFG)
    (tmp_path / "t" / "buf-0").unlink()
    assert dev.alloc_buffer(CFG) == 0


def test_multiple_regions_without_multi_entry_topa_is_not_supported(make):
    dev = make(TestEngine(capabilities=replace(FULL, topa_multiple_entries=False)))
    err("NOT_SUPPORTED", dev.alloc_buffer, replace(CFG, num_chunks=2))
    assert dev.alloc_buffer(replace(CFG, num_chunks=1)) == 0


def test_alloc_invalid_config_is_invalid_args(make):
    dev = make()
    err("INVALID_ARGS", dev.alloc_buffer, {"num_chunks": 1})
    err("INVALID_ARGS", dev.alloc_buffer, replace(CFG, num_chunks=0))
    err("INVALID_ARGS", dev.alloc_buffer, replace(CFG, ctl=CFG.ctl | Ctl.TRACE_EN))
    still_usable(dev)


def test_cpu_mode_buffers_have_one_size(make):
    dev = make()
    dev.alloc_buffer(CFG)
    err("INVALID_ARGS", dev.alloc_buffer, replace(CFG, num_chunks=5))
    dev.set_mode(Mode.THREAD)
    assert dev.alloc_buffer(replace(CFG, num_chunks=5)) == 1


def test_free_while_tracing_or_assigned_is_bad_state(make):
    dev = make()
    ds = cpu_session(dev)
    err("BAD_STATE", dev.free_buffer, ds[0])
    dev.cpu_mode_stop()
    dev.cpu_mode_free()
    dev.set_mode(Mode.THREAD)
    dev.assign_thread_buffer(ds[0], 500)
    err("BAD_STATE", dev.free_buffer, ds[0])
    dev.release_thread_buffer(ds[0], 500)
    dev.free_buffer(ds[0])
    still_usable(dev)


# ---------------------------------------------------------------- cpu mode

def test_typical_cpu_mode_session(make, tmp_path):
    """The spec's typical session (also the README's example)."""
    eng = TestEngine({0: [PSB + PSBEND, b"\x00" * 5, 120], 1: [PSB + PSBEND, 80]})
    dev = make(eng)
    dev.set_mode(hwtrace.Mode.CPU)
    cfg = hwtrace.BufferConfig(num_chunks=16, chunk_order=2, is_circular=False,
                               ctl=hwtrace.Ctl.BRANCH_EN | hwtrace.Ctl.USER | hwtrace.Ctl.TSC_EN,
                               cr3_match=0, addr_ranges=())
    descs = [dev.alloc_buffer(cfg) for _ in range(dev.num_cpus)]
    assert descs == [0, 1]
    dev.cpu_mode_alloc()
    dev.cpu_mode_start()
    assert dev.run(["prog", "arg"]) == 0
    dev.cpu_mode_stop()
    saved = {}
    for d in descs:
        info = dev.get_buffer_info(d)
        assert not info.wrapped and not info.stopped
        data = b"".join(bytes(dev.get_buffer_handle(d, c)) for c in range(cfg.num_chunks))
        saved[d] = data[:info.capture_end]
    assert saved == {0: PSB + PSBEND + b"\x00" * 5, 1: PSB + PSBEND}
    assert dev.get_buffer_info(0).instructions_observed == 120
    assert eng.runs[0]["argv"] == ["prog", "arg"]
    assert eng.runs[0]["targets"][0]["ctl"] == cfg.ctl | Ctl.TOPA | Ctl.TRACE_EN
    dev.cpu_mode_free()
    for d in descs:
        dev.free_buffer(d)


def test_run_returns_exit_status_and_checks_argv(make):
    dev = make(TestEngine({}, exit_status=3))
    cpu_session(dev)
    assert dev.run(["prog"]) == 3
    for bad in ([], "prog", [1, 2], None, iter(["prog"])):
        err("INVALID_ARGS", dev.run, bad)
    from pathlib import Path
    assert dev.run((Path("/bin/prog"), b"arg")) == 3
    assert dev.engine.runs[-1]["argv"] == ["/bin/prog", "arg"]


def test_run_outside_tracing_in_cpu_mode_is_bad_state(make):
    dev = make()
    err("BAD_STATE", dev.run, ["prog"])
    dev.alloc_buffer(CFG), dev.alloc_buffer(CFG)
    dev.cpu_mode_alloc()
    err("BAD_STATE", dev.run, ["prog"])
    still_usable(dev)


def test_cpu_mode_alloc_errors(make):
    dev = make()
    dev.set_mode(Mode.THREAD)
    err("BAD_STATE", dev.cpu_mode_alloc)            # wrong mode
    dev.set_mode(Mode.CPU)
    dev.alloc_buffer(CFG), dev.alloc_buffer(CFG)
    dev.cpu_mode_alloc()
    err("BAD_STATE", dev.cpu_mode_alloc)            # already allocated
    dev.cpu_mode_start()
    err("BAD_STATE", dev.cpu_mode_alloc)            # tracing
    still_usable(dev)


def test_cpu_mode_start_errors(make):
    dev = make()
    err("BAD_STATE", dev.cpu_mode_start)            # not allocated
    dev.set_mode(Mode.THREAD)
    err("BAD_STATE", dev.cpu_mode_start)            # wrong mode
    dev.set_mode(Mode.CPU)
    dev.alloc_buffer(CFG)
    dev.cpu_mode_alloc()
    e = err("BAD_STATE", dev.cpu_mode_start)        # CPU 1 has no buffer
    assert "CPU 1" in str(e)
    assert dev.state == State.CPU_ALLOCATED
    dev.alloc_buffer(CFG)
    dev.cpu_mode_start()
    err("BAD_STATE", dev.cpu_mode_start)            # tracing
    still_usable(dev)


def test_cpu_mode_stop_when_not_tracing_is_bad_state(make):
    dev = make()
    err("BAD_STATE", dev.cpu_mode_stop)
    dev.alloc_buffer(CFG), dev.alloc_buffer(CFG)
    dev.cpu_mode_alloc()
    err("BAD_STATE", dev.cpu_mode_stop)
    still_usable(dev)


def test_cpu_mode_free_while_tracing_is_bad_state_and_frees_cpu_state_only(make):
    dev = make(TestEngine({0: [PSB], 1: [PSB]}))
    ds = cpu_session(dev)
    dev.run(["p"])
    err("BAD_STATE", dev.cpu_mode_free)
    dev.cpu_mode_stop()
    dev.cpu_mode_free()
    assert dev.state == State.CPU_IDLE
    for d in ds:   # buffers and their data survive cpu_mode_free
        assert dev.get_buffer_info(d).capture_end == 16
        assert bytes(dev.get_buffer_handle(d, 0)[:16]) == PSB
    dev.cpu_mode_free()   # nothing allocated: no-op
    still_usable(dev)


def test_get_buffer_info_while_tracing_in_cpu_mode_is_bad_state(make):
    dev = make()
    cpu_session(dev)
    err("BAD_STATE", dev.get_buffer_info, 0)
    err("BAD_STATE", dev.read_buffer, 0)
    dev.cpu_mode_stop()
    assert dev.get_buffer_info(0).capture_end == 0


def test_get_buffer_handle_works_while_tracing_and_is_read_only(make):
    dev = make(TestEngine({0: [PSB + b"\x01\x02"], 1: []}))
    cpu_session(dev)
    dev.run(["p"])
    h = dev.get_buffer_handle(0, 0)                 # still tracing
    assert isinstance(h, memoryview) and h.readonly and len(h) == 4096
    assert bytes(h[:18]) == PSB + b"\x01\x02"
    with pytest.raises(TypeError):
        h[0] = 1
    assert len(dev.get_buffer_handle(0, 3)) == 4096
    for bad in (4, -1, "0", None):
        err("INVALID_ARGS", dev.get_buffer_handle, 0, bad)


def test_stop_on_full_and_circular_info(make):
    cfg_stop = replace(CFG, num_chunks=2)
    big = [PSB + b"\x00" * 3000] * 4       # 12064 bytes into 8192
    dev = make(TestEngine({0: big, 1: big}))
    cpu_session(dev, cfg_stop)
    dev.run(["p"])
    dev.cpu_mode_stop()
    i = dev.get_buffer_info(0)
    assert (i.capture_end, i.stopped, i.wrapped) == (8192, True, False)
    assert i.lost_bytes == 4 * 3016 - 8192 and i.stored_bytes == 8192
    assert dev.read_buffer(0) == b"".join(big)[:8192]
    dev.cpu_mode_free(), dev.free_buffer(0), dev.free_buffer(1)

    cfg_circ = replace(cfg_stop, is_circular=True)
    cpu_session(dev, cfg_circ)
    dev.run(["p"])
    dev.cpu_mode_stop()
    i = dev.get_buffer_info(0)
    assert (i.capture_end, i.stopped, i.wrapped) == (12064 % 8192, False, True)
    stream = b"".join(big)
    oldest_first = dev.read_buffer(0)
    assert oldest_first.startswith(PSB) and stream.endswith(oldest_first)
    assert oldest_first == stream[stream.index(PSB, len(stream) - 8192):]
    assert dev.read_buffer(0, start_at_psb=False) == stream[-8192:]


def test_read_buffer_into_and_buffer_too_small(make):
    dev = make(TestEngine({0: [PSB * 3], 1: []}))
    cpu_session(dev)
    dev.run(["p"])
    dev.cpu_mode_stop()
    out = bytearray(48)
    assert dev.read_buffer(0, out) == 48 and bytes(out) == PSB * 3
    err("BUFFER_TOO_SMALL", dev.read_buffer, 0, bytearray(47))
    err("INVALID_ARGS", dev.read_buffer, 0, b"x" * 100)
    err("INVALID_ARGS", dev.read_buffer, 0, 5)
    still_usable(dev)


def test_ovf_written_after_internal_overflow(make):
    dev = make(TestEngine({0: [PSB, "overflow", b"\x99"], 1: []}))
    cpu_session(dev)
    dev.run(["p"])
    dev.cpu_mode_stop()
    assert dev.read_buffer(0) == PSB + b"\x02\xf3\x99"


def test_address_ranges_and_filters_reach_the_engine(make):
    eng = TestEngine({0: [PSB], 1: [PSB]})
    dev = make(eng)
    cfg = replace(CFG, ctl=CFG.ctl | Ctl.CR3_FILTER | (1 << 32) | (2 << 36),
                  cr3_match=0x1234000, addr_ranges=((0x400000, 0x4fffff), (0x7f0000, 0x7f0fff)))
    cpu_session(dev, cfg)
    dev.run(["p"])
    t = eng.runs[0]["targets"][1]
    assert t["addr_ranges"] == ((0x400000, 0x4fffff), (0x7f0000, 0x7f0fff))
    assert t["cr3_match"] == 0x1234000
    assert t["ctl"] & Ctl.ADDR0_CFG == 1 << 32 and t["ctl"] & Ctl.ADDR1_CFG == 2 << 36


def test_free_buffer_with_a_live_handle(make):
    dev = make(TestEngine({0: [PSB], 1: []}))
    cpu_session(dev)
    dev.run(["p"])
    dev.cpu_mode_stop()
    h = dev.get_buffer_handle(0, 0)
    dev.cpu_mode_free()
    dev.free_buffer(0)
    assert bytes(h[:16]) == PSB            # the view stays valid
    err("INVALID_ARGS", dev.get_buffer_handle, 0, 0)
    del h


def test_request_stop_reaches_the_engine(make):
    eng = TestEngine({0: [PSB, b"\x01", b"\x02"], 1: []})
    dev = make(eng)
    cpu_session(dev)
    dev.request_stop()
    dev.run(["p"])          # run clears a stale request first
    dev.cpu_mode_stop()
    assert dev.read_buffer(0) == PSB + b"\x01\x02"


# ---------------------------------------------------------------- thread mode

def test_thread_mode_assign_run_release(make, tmp_path):
    eng = TestEngine({101: [PSB + b"\x11"], 102: [PSB + b"\x22"], 103: [PSB]},
                     pids={101: 100, 102: 100, 103: 100})
    dev = make(eng)
    dev.set_mode(Mode.THREAD)
    a, b = dev.alloc_buffer(CFG), dev.alloc_buffer(replace(CFG, num_chunks=1))
    dev.assign_thread_buffer(a, 101)
    dev.assign_thread_buffer(b, 102)
    assert dev.thread_buffers == {101: a, 102: b}
    assert dev.run(["p"]) == 0
    assert dev.untraced_threads == [103]
    assert dev.read_buffer(a) == PSB + b"\x11" and dev.read_buffer(b) == PSB + b"\x22"
    assert dev.get_buffer_info(a).capture_end == 17
    dev.release_thread_buffer(a, 101)
    dev.release_thread_buffer(b, 102)
    assert dev.thread_buffers == {}
    from hwtrace.bundle import Bundle
    bundle = Bundle(dev.save_bundle(tmp_path / "b"))
    assert bundle.mode == "thread"
    assert [(s.file, s.tid, s.pid) for s in bundle.streams] == [
        ("tid101.pt", 101, 100), ("tid102.pt", 102, 100)]
    assert bundle.read_stream(bundle.stream(tid=102)) == PSB + b"\x22"


def test_thread_mode_follows_new_threads(make):
    eng = TestEngine({7: [PSB + b"\x07"], 8: [PSB + b"\x08"], 9: [PSB]})
    dev = make(eng, max_buffers=3)
    dev.set_mode(Mode.THREAD)
    d = dev.alloc_buffer(CFG)
    dev.assign_thread_buffer(d, 7)
    dev.run(["p"], follow_threads=replace(CFG, num_chunks=1))
    assert dev.thread_buffers == {7: 0, 8: 1, 9: 2}
    assert dev.read_buffer(1) == PSB + b"\x08"
    assert dev.get_buffer_config(1).num_chunks == 1
    # out of slots: the next new thread is reported as untraced
    eng.writes = {10: [PSB]}
    dev.run(["p"], follow_threads=CFG)
    assert dev.untraced_threads == [10]
    err("INVALID_ARGS", dev.run, ["p"], follow_threads=replace(CFG, num_chunks=0))


def test_thread_mode_errors(make):
    dev = make()
    d = dev.alloc_buffer(CFG)
    err("BAD_STATE", dev.assign_thread_buffer, d, 5)        # cpu mode
    err("BAD_STATE", dev.release_thread_buffer, d, 5)
    dev.set_mode(Mode.THREAD)
    for bad in (0, -5, "5", None, 1 << 40, True):
        err("INVALID_ARGS", dev.assign_thread_buffer, d, bad)
    dev.assign_thread_buffer(d, 5)
    e = dev.alloc_buffer(CFG)
    err("BAD_STATE", dev.assign_thread_buffer, d, 6)        # buffer taken
    err("BAD_STATE", dev.assign_thread_buffer, e, 5)        # thread has one
    err("INVALID_ARGS", dev.release_thread_buffer, e, 5)    # not assigned
    err("INVALID_ARGS", dev.release_thread_buffer, d, 6)
    dev.release_thread_buffer(d, 5)
    err("INVALID_ARGS", dev.release_thread_buffer, d, 5)
    dev.free_buffer(e)
    still_usable(dev)


def test_thread_mode_rejects_cr3_filtering(make):
    dev = make()
    dev.set_mode(Mode.THREAD)
    err("INVALID_ARGS", dev.alloc_buffer, replace(CFG, ctl=CFG.ctl | Ctl.CR3_FILTER))
    err("INVALID_ARGS", dev.alloc_buffer, replace(CFG, cr3_match=0x1000))
    still_usable(dev)


def test_sideband_goes_into_the_bundle(make, tmp_path):
    from hwtrace.bundle import Bundle, Mmap, Process, Switch
    sb = [Process(pid=5, cr3=0x3000, comm="p"),
          Mmap(pid=5, start=0x400000, size=0x1000, offset=0, file="/bin/p"),
          Switch(cpu=0, time=9, prev_pid=-1, prev_tid=-1, next_pid=5, next_tid=5)]
    dev = make(TestEngine({0: [PSB], 1: [PSB]}, sideband=sb))
    cpu_session(dev)
    dev.run(["p"])
    err("BAD_STATE", dev.save_bundle, tmp_path / "b")    # still tracing
    dev.cpu_mode_stop()
    b = Bundle(dev.save_bundle(tmp_path / "b"))
    assert list(b.iter_sideband()) == sb
    assert [s.cpu for s in b.streams] == [0, 1]
    assert b.cpu.model == 0x4E and b.config == CFG


def test_free_buffer_reports_its_errors(make, monkeypatch):
    import shutil
    dev = make()
    d = dev.alloc_buffer(CFG)

    def fail(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(shutil, "rmtree", fail)
    e = err("BAD_STATE", dev.free_buffer, d)
    assert "could not be freed" in str(e)
    assert dev.get_buffer_config(d) == CFG          # still allocated and usable
    monkeypatch.undo()
    dev.free_buffer(d)
    err("INVALID_ARGS", dev.get_buffer_config, d)


def test_engine_options_need_a_name_and_perf_needs_hardware(tmp_path):
    import os
    err("INVALID_ARGS", hwtrace.open_device, engine=TestEngine(), lock_path=tmp_path / "l",
        source="qemu")
    if not os.path.isdir("/sys/bus/event_source/devices/intel_pt"):
        e = err("NOT_SUPPORTED", hwtrace.open_device, engine="perf", lock_path=tmp_path / "l")
        assert "intel_pt" in str(e)


def test_repr(make):
    dev = make()
    assert "engine=testing" in repr(dev) and "cpu mode" in repr(dev)


def test_attach(make):
    eng = TestEngine({0: [PSB], 1: []})
    dev = make(eng)
    cpu_session(dev)
    assert dev.attach(1234) == 0
    assert eng.runs[-1]["argv"] == ["<pid 1234>"]
    for bad in (0, -1, "1", True, None):
        err("INVALID_ARGS", dev.attach, bad)
    dev.cpu_mode_stop()
    err("BAD_STATE", dev.attach, 1234)


def test_engine_without_attach_is_not_supported(make):
    from hwtrace.engines.base import Engine

    class NoAttach(TestEngine):
        attach = Engine.attach
    dev = make(NoAttach())
    cpu_session(dev)
    err("NOT_SUPPORTED", dev.attach, 1)
    assert dev.state == State.CPU_TRACING


def test_auto_engine_and_registry_failures(monkeypatch, tmp_path):
    from hwtrace import engines
    monkeypatch.setattr(engines, "ENGINE_NAMES", ("testing",))
    with hwtrace.open_device(engine="auto", lock_path=tmp_path / "l") as dev:
        assert dev.engine.name == "testing"
    monkeypatch.setattr(engines, "ENGINE_NAMES", ("nonesuch",))
    e = err("NOT_SUPPORTED", hwtrace.open_device, engine="auto", lock_path=tmp_path / "l")
    assert "nonesuch: unknown engine" in str(e)

    def broken(name):
        raise RuntimeError("half-installed")
    monkeypatch.setattr(engines, "_module", broken)
    a = engines.probe("emulated")
    assert not a and "half-installed" in a.reason
    err("NOT_SUPPORTED", hwtrace.open_device, engine="emulated", lock_path=tmp_path / "l")


def test_save_bundle_copies_images_and_refuses_overwrite(make, tmp_path):
    from hwtrace.bundle import Bundle, Mmap
    exe = tmp_path / "prog"
    exe.write_bytes(b"\x7fELF" + bytes(60))
    sb = [Mmap(pid=5, start=0x400000, size=0x1000, offset=0, file=str(exe), build_id="ab12"),
          Mmap(pid=5, start=0x500000, size=0x1000, offset=0, file="/nonexistent/lib.so")]
    dev = make(TestEngine({0: [PSB], 1: [PSB]}, sideband=sb))
    cpu_session(dev)
    dev.run(["p"])
    dev.cpu_mode_stop()
    b = Bundle(dev.save_bundle(tmp_path / "b", copy_images=True, note="hi"))
    assert b.manifest["note"] == "hi"
    assert len(b.images) == 1 and b.images[0]["path"] == str(exe)
    exe.unlink()
    found = b.find_image(str(exe), "ab12")
    assert found and found.read_bytes()[:4] == b"\x7fELF" and found.is_relative_to(b.path)
    err("INVALID_ARGS", dev.save_bundle, tmp_path / "b")
    b = Bundle(dev.save_bundle(tmp_path / "b", overwrite=True))
    assert len(b.sideband().mmaps) == 2           # replaced, not appended


def test_a_directory_with_an_earlier_trace_is_not_overwritten(make, tmp_path):
    dev = make(TestEngine({0: [PSB], 1: [PSB]}), directory=tmp_path / "t")
    cpu_session(dev)
    dev.run(["p"])
    dev.close()
    e = err("INVALID_ARGS", make, directory=tmp_path / "t")
    assert "hwtrace recover" in str(e)
    assert (tmp_path / "t" / "buf-0" / "data").read_bytes()[:16] == PSB
    (tmp_path / "f").write_text("")
    err("INVALID_ARGS", make, directory=tmp_path / "f" / "sub")
    make()    # the refused opens released the lock


def test_import_hwtrace_stays_cheap():
    import subprocess
    import sys
    code = ("import sys, hwtrace; print(sorted(m for m in sys.modules if m.startswith('hwtrace.')));"
            "hwtrace.open_device; print('hwtrace.control.device' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.splitlines() == ["[]", "True"]
    assert "open_device" in dir(hwtrace)
    with pytest.raises(AttributeError):
        hwtrace.no_such_name
