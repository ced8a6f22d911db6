"""Properties through the whole device: random buffer configs and random
packet byte streams written by the test engine, read back through
get_buffer_handle / get_buffer_info exactly as the spec says."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings, strategies as st

import hwtrace
from hwtrace import BufferConfig, Ctl, Mode
from hwtrace.engines.testing import TestEngine
from hwtrace.topa import DATA_PER_TABLE, ptrs_index, ptrs_offset

configs = st.builds(BufferConfig, num_chunks=st.integers(1, 6), chunk_order=st.integers(0, 1),
                    is_circular=st.booleans(),
                    ctl=st.sampled_from([Ctl.BRANCH_EN | Ctl.USER, Ctl.BRANCH_EN | Ctl.OS | Ctl.TSC_EN,
                                         Ctl.BRANCH_EN | Ctl.USER | Ctl.DIS_RETC]))
streams = st.lists(st.binary(min_size=1, max_size=6000), max_size=10)


@settings(max_examples=60, deadline=None)
@given(cfg=configs, writes=streams, mode=st.sampled_from([Mode.CPU, Mode.THREAD]))
def test_handles_reconstruct_what_the_output_unit_kept(cfg, writes, mode):
    with tempfile.TemporaryDirectory() as tmp:
        target = 0 if mode == Mode.CPU else 4321
        eng = TestEngine({target: writes}, num_cpus=1)
        with hwtrace.open_device(engine=eng, directory=Path(tmp) / "t",
                                 lock_path=Path(tmp) / "lock") as dev:
            dev.set_mode(mode)
            d = dev.alloc_buffer(cfg)
            assert dev.get_buffer_config(d) == cfg
            if mode == Mode.CPU:
                dev.cpu_mode_alloc()
                dev.cpu_mode_start()
                dev.run(["w"])
                dev.cpu_mode_stop()
            else:
                dev.assign_thread_buffer(d, target)
                dev.run(["w"])
            info = dev.get_buffer_info(d)
            chunks = b"".join(bytes(dev.get_buffer_handle(d, k)) for k in range(cfg.num_chunks))
            stream = b"".join(writes)
            total = cfg.total_size
            assert len(chunks) == total
            # capture_end: regions before the current one + offset in it
            t = (info.output_base - ((d + 1) << 32)) // (2048 * 8)
            assert info.capture_end == (t * DATA_PER_TABLE + ptrs_index(info.output_mask_ptrs)) \
                * cfg.chunk_size + ptrs_offset(info.output_mask_ptrs)
            if not cfg.is_circular:
                # stop-on-full keeps exactly the first bytes, Stopped when full
                assert info.capture_end == min(len(stream), total)
                assert chunks[:info.capture_end] == stream[:total]
                assert info.stopped == (len(stream) >= total) and not info.wrapped
                assert info.lost_bytes == len(stream) - info.capture_end
            else:
                # circular keeps exactly the newest bytes and reports wrapped
                assert not info.stopped and info.lost_bytes == 0
                assert info.wrapped == (len(stream) >= total)
                assert info.capture_end == len(stream) % total
                oldest_first = chunks[info.capture_end:] + chunks[:info.capture_end] \
                    if info.wrapped else chunks[:info.capture_end]
                assert oldest_first == (stream[-total:] if info.wrapped else stream)
                assert dev.read_buffer(d, start_at_psb=False) == oldest_first


ops = st.lists(st.tuples(
    st.sampled_from(["set_mode", "alloc", "free", "config", "info", "handle", "read",
                     "cpu_alloc", "cpu_start", "cpu_stop", "cpu_free", "assign", "release",
                     "run", "save"]),
    st.integers(-1, 4), st.integers(-1, 3)), max_size=40)


@settings(max_examples=60, deadline=None)
@given(seq=ops)
def test_random_operation_sequences_fail_only_cleanly(seq):
    """Any sequence of operations with good and bad arguments: every failure
    is a TraceError that leaves the device exactly as it was, and the device
    stays usable afterwards."""
    psb = b"\x02\x82" * 8
    with tempfile.TemporaryDirectory() as tmp:
        eng = TestEngine({0: [psb], 1: [psb, b"\x00" * 5000]}, num_cpus=2)
        with hwtrace.open_device(engine=eng, directory=Path(tmp) / "t", max_buffers=4,
                                 lock_path=Path(tmp) / "lock") as dev:
            cfg = BufferConfig(num_chunks=1, is_circular=True)
            for n, (op, a, b) in enumerate(seq):
                call = {
                    "set_mode": lambda: dev.set_mode(a),
                    "alloc": lambda: dev.alloc_buffer(cfg if a >= 0 else replace_chunks(cfg)),
                    "free": lambda: dev.free_buffer(a),
                    "config": lambda: dev.get_buffer_config(a),
                    "info": lambda: dev.get_buffer_info(a),
                    "handle": lambda: dev.get_buffer_handle(a, b),
                    "read": lambda: dev.read_buffer(a),
                    "cpu_alloc": dev.cpu_mode_alloc, "cpu_start": dev.cpu_mode_start,
                    "cpu_stop": dev.cpu_mode_stop, "cpu_free": dev.cpu_mode_free,
                    "assign": lambda: dev.assign_thread_buffer(a, b + 1),
                    "release": lambda: dev.release_thread_buffer(a, b + 1),
                    "run": lambda: dev.run(["w"]),
                    "save": lambda: dev.save_bundle(Path(tmp) / f"b{n}"),
                }[op]
                before = (dev.state, sorted(dev._buffers), dev.thread_buffers,
                          {d: dev._buffers[d].store.registers() for d in dev._buffers})
                try:
                    call()
                except hwtrace.TraceError:
                    after = (dev.state, sorted(dev._buffers), dev.thread_buffers,
                             {d: dev._buffers[d].store.registers() for d in dev._buffers})
                    assert after == before
            # still usable: bring it to a clean cpu-mode session
            if dev.tracing:
                dev.cpu_mode_stop()
            dev.cpu_mode_free()
            for tid, d in dev.thread_buffers.items():
                dev.release_thread_buffer(d, tid)
            for d in list(dev._buffers):
                dev.free_buffer(d)
            dev.set_mode(Mode.CPU)
            ds = [dev.alloc_buffer(cfg) for _ in range(2)]
            dev.cpu_mode_alloc()
            dev.cpu_mode_start()
            assert dev.run(["w"]) == 0
            dev.cpu_mode_stop()
            assert dev.read_buffer(ds[0]) == psb
            assert dev.get_buffer_info(ds[1]).wrapped


def replace_chunks(cfg):
    from dataclasses import replace
    return replace(cfg, num_chunks=0)
