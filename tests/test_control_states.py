"""The state table is the device's only authority on BAD_STATE: for every
reachable state and operation the device refuses exactly what the table lacks."""

from __future__ import annotations

import pytest

import hwtrace
from hwtrace import BufferConfig, Mode, TraceError
from hwtrace.control.states import TRANSITIONS, Op, State, check
from hwtrace.engines.testing import TestEngine

CFG = BufferConfig(num_chunks=1)


def test_table_covers_every_state_and_unknown_ops_are_bad_state():
    assert set(TRANSITIONS) == set(State)
    for state, row in TRANSITIONS.items():
        for op in Op:
            if op in row:
                assert check(state, op) in State
            else:
                with pytest.raises(TraceError) as e:
                    check(state, op)
                assert e.value.status == "BAD_STATE" and str(op) in str(e.value)


def _ops(dev, tmp_path):
    return {
        Op.ALLOC_BUFFER: lambda: dev.alloc_buffer(CFG),
        Op.FREE_BUFFER: lambda: dev.free_buffer(1),
        Op.GET_BUFFER_CONFIG: lambda: dev.get_buffer_config(0),
        Op.GET_BUFFER_INFO: lambda: dev.get_buffer_info(0),
        Op.GET_BUFFER_HANDLE: lambda: dev.get_buffer_handle(0, 0),
        Op.READ_BUFFER: lambda: dev.read_buffer(0),
        Op.CPU_MODE_ALLOC: dev.cpu_mode_alloc,
        Op.CPU_MODE_START: dev.cpu_mode_start,
        Op.CPU_MODE_STOP: dev.cpu_mode_stop,
        Op.CPU_MODE_FREE: dev.cpu_mode_free,
        Op.ASSIGN_THREAD_BUFFER: lambda: dev.assign_thread_buffer(0, 77),
        Op.RUN: lambda: dev.run(["p"]),
        Op.SAVE: lambda: dev.save_bundle(tmp_path / "b", overwrite=True),
        Op.SET_MODE_CPU: lambda: dev.set_mode(Mode.CPU),
        Op.SET_MODE_THREAD: lambda: dev.set_mode(Mode.THREAD),
    }


def _reach(dev, state):
    dev.alloc_buffer(CFG), dev.alloc_buffer(CFG)
    if state == State.THREAD_IDLE:
        dev.set_mode(Mode.THREAD)
    if state in (State.CPU_ALLOCATED, State.CPU_TRACING):
        dev.cpu_mode_alloc()
    if state == State.CPU_TRACING:
        dev.cpu_mode_start()
    assert dev.state == state


@pytest.mark.parametrize("state", [State.CPU_IDLE, State.CPU_ALLOCATED, State.CPU_TRACING,
                                   State.THREAD_IDLE])
@pytest.mark.parametrize("op", [o for o in Op if o not in (Op.RUN_END, Op.RELEASE_THREAD_BUFFER,
                                                           Op.SNAPSHOT, Op.SNAPSHOT_END)])
def test_device_refuses_exactly_what_the_table_lacks(tmp_path, state, op):
    with hwtrace.open_device(engine=TestEngine(), lock_path=tmp_path / "l") as dev:
        _reach(dev, state)
        call = _ops(dev, tmp_path)[op]
        if op in TRANSITIONS[state]:
            try:
                call()
            except TraceError as e:
                assert e.status != "BAD_STATE", str(e)
            nxt = TRANSITIONS[state][op]
            if op not in (Op.RUN,):
                assert dev.state == (nxt or state)
        else:
            with pytest.raises(TraceError) as e:
                call()
            assert e.value.status == "BAD_STATE"
            assert dev.state == state


def test_while_thread_mode_traces(tmp_path):
    seen = {}

    class Probe(TestEngine):
        def run(self, session, argv, **kw):
            out = session.thread_output(5, 5)
            out.write(b"\x02\x82" * 8)
            seen["state"] = dev.state
            seen["info"] = dev.get_buffer_info(0).capture_end      # allowed in thread mode
            for op in (lambda: dev.free_buffer(0), lambda: dev.set_mode(Mode.CPU),
                       lambda: dev.run(["again"]), lambda: dev.release_thread_buffer(0, 5),
                       dev.cpu_mode_alloc):
                with pytest.raises(TraceError) as e:
                    op()
                seen.setdefault("bad", []).append(e.value.status)
            with pytest.raises(TraceError) as e:
                session.cpu_output(0)
            seen["cpu_output"] = e.value.status
            return 0

    with hwtrace.open_device(engine=Probe(), lock_path=tmp_path / "l") as dev:
        dev.set_mode(Mode.THREAD)
        dev.assign_thread_buffer(dev.alloc_buffer(CFG), 5)
        dev.run(["p"])
        assert seen == {"state": State.THREAD_TRACING, "info": 16, "bad": ["BAD_STATE"] * 5,
                        "cpu_output": "BAD_STATE"}
        assert dev.state == State.THREAD_IDLE


def test_engine_exception_ends_the_run_cleanly(tmp_path):
    class Boom(TestEngine):
        def run(self, session, argv, **kw):
            session.thread_output(5, 5)
            raise TraceError("INVALID_ARGS", "no such program")

    with hwtrace.open_device(engine=Boom(), lock_path=tmp_path / "l") as dev:
        dev.set_mode(Mode.THREAD)
        dev.assign_thread_buffer(dev.alloc_buffer(CFG), 5)
        with pytest.raises(TraceError):
            dev.run(["p"])
        assert dev.state == State.THREAD_IDLE
        assert not dev.get_buffer_info(0).status & 4       # TriggerEn off again


def test_buffer_table_covers_every_buffer_state():
    """Buffers have their own row of the table (unbound, bound to a CPU,
    assigned to a thread); an operation missing from a row is BAD_STATE
    there, naming the buffer."""
    from hwtrace.control.states import BUFFER_TRANSITIONS, BufferState, check_buffer
    assert set(BUFFER_TRANSITIONS) == set(BufferState)
    concerned = {op for row in BUFFER_TRANSITIONS.values() for op in row}
    for state, row in BUFFER_TRANSITIONS.items():
        for op in concerned:
            if op in row:
                assert check_buffer(state, op, 3) in BufferState
            else:
                with pytest.raises(TraceError) as e:
                    check_buffer(state, op, 3)
                assert e.value.status == "BAD_STATE" and "buffer 3" in str(e.value)
    assert Op.FREE_BUFFER in BUFFER_TRANSITIONS[BufferState.UNBOUND]
    assert Op.FREE_BUFFER not in BUFFER_TRANSITIONS[BufferState.CPU_BOUND]
    assert Op.SET_MODE_CPU not in BUFFER_TRANSITIONS[BufferState.THREAD_ASSIGNED]


def test_buffer_bound_to_a_cpu_until_cpu_mode_free(tmp_path):
    with hwtrace.open_device(engine=TestEngine(), lock_path=tmp_path / "l") as dev:
        ds = [dev.alloc_buffer(CFG) for _ in range(dev.num_cpus)]
        dev.cpu_mode_alloc()
        dev.free_buffer(ds[1])          # not yet bound: freed
        ds[1] = dev.alloc_buffer(CFG)
        dev.cpu_mode_start()
        dev.cpu_mode_stop()
        with pytest.raises(TraceError) as e:
            dev.free_buffer(ds[0])
        assert e.value.status == "BAD_STATE" and dev.state == State.CPU_ALLOCATED
        extra = dev.alloc_buffer(CFG)   # never bound: free any time
        dev.free_buffer(extra)
        dev.cpu_mode_free()
        for d in ds:
            dev.free_buffer(d)


@pytest.mark.parametrize("mode", [Mode.CPU, Mode.THREAD])
def test_snapshot_state_mid_run(tmp_path, mode):
    """An engine that takes a snapshot mid-run (the workload goes on
    untraced): the run's on_snapshot sees the snapshot state, where the
    buffers are readable and save_bundle works but nothing else; the run
    then goes on and ends as usual."""
    psb = b"\x02\x82" * 8
    seen = {}

    class Snap(TestEngine):
        def run(self, session, argv, **kw):
            out = session.cpu_output(0) if mode == Mode.CPU else session.thread_output(5, 5)
            out.write(psb)
            session.snapshot_taken("trigger")
            seen["after"] = dev.state
            return 4

    def on_snapshot(reason):
        seen["reason"], seen["state"] = reason, dev.state
        seen["data"] = dev.read_buffer(0)
        dev.save_bundle(tmp_path / "b")
        bad = []
        for op in (lambda: dev.free_buffer(0), lambda: dev.alloc_buffer(CFG),
                   dev.cpu_mode_stop, lambda: dev.run(["again"])):
            with pytest.raises(TraceError) as e:
                op()
            bad.append(e.value.status)
        seen["bad"] = bad

    with hwtrace.open_device(engine=Snap(), lock_path=tmp_path / "l") as dev:
        if mode == Mode.CPU:
            _reach(dev, State.CPU_TRACING)
            assert dev.run(["p"], on_snapshot=on_snapshot) == 4
            assert dev.state == State.CPU_TRACING
            dev.cpu_mode_stop()
        else:
            dev.set_mode(Mode.THREAD)
            dev.assign_thread_buffer(dev.alloc_buffer(CFG), 5)
            assert dev.run(["p"], on_snapshot=on_snapshot) == 4
            assert dev.state == State.THREAD_IDLE
        assert dev.snapshot_taken == "trigger"
        assert dev.read_buffer(0) == psb
    snap = State.CPU_SNAPSHOT if mode == Mode.CPU else State.THREAD_SNAPSHOT
    running = State.CPU_TRACING if mode == Mode.CPU else State.THREAD_TRACING
    assert seen == {"reason": "trigger", "state": snap, "data": psb,
                    "bad": ["BAD_STATE"] * 4, "after": running}
    assert (tmp_path / "b" / "manifest.json").is_file()
