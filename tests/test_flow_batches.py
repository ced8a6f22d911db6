"""The batch pipeline (hwtrace.flow.batches, docs/pipeline.md): records and
items that reproduce exactly what the session drivers hand a sink, with
either producer, whatever the batch size."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import CORPUS
from ptxed_corpus import decode_inputs, normalize, ptxed_variants, variant_id

from hwtrace.flow import batches as B
from hwtrace.flow import session, sinks
from hwtrace.flow.block import BlockDecoder
from hwtrace.flow.insn import InsnDecoder

VARIANTS = list(ptxed_variants()) if CORPUS.is_dir() else []
pytestmark = pytest.mark.usefixtures("corpus")   # every test here reads it


class Calls:
    """A sink that writes down every call (what must be reproduced)."""

    needs_offset = True

    def __init__(self):
        self.log = []

    def insn(self, insn, offset):
        self.log.append(("insn", tuple(insn), offset))

    def block(self, block, offset):
        self.log.append(("block", block.ip, block.end_ip, block.ninsn,
                         tuple(tuple(i) for i in block.insns), block.mode,
                         block.speculative, block.truncated, block.iclass,
                         offset))

    def event(self, ev, offset):
        self.log.append(("event", repr(ev), offset))

    def error(self, kind, offset, ip, code):
        self.log.append(("error", kind, offset, ip, code))

    def status(self, name, offset):
        self.log.append(("status", name, offset))

    def status_ex(self, name, offset, *, ip_suppressed):
        self.log.append(("status", name, offset, ip_suppressed))


def _direct(data, image, cfg, decoder, resync):
    sink = Calls()
    if decoder == "block":
        session.run_blocks(BlockDecoder(data, image, cfg), sink, resync)
    else:
        session.run_insn(InsnDecoder(data, image, cfg), sink, resync)
    return sink.log


def _replayed(data, image, cfg, decoder, resync, impl, max_records=1 << 16):
    sink = Calls()
    B.replay(B.batches(data, image, cfg, decoder=decoder, resync=resync,
                       want_insns=True, max_records=max_records, impl=impl),
             sink, decoder)
    return sink.log


def _ids(x):
    d, v, _m = x
    return variant_id(v)


@pytest.mark.parametrize("decoder", ["insn", "block"])
@pytest.mark.parametrize("variant", VARIANTS, ids=[_ids(x) for x in VARIANTS])
def test_python_batches_replay_the_session(variant, decoder):
    d, v, _meta = variant
    data, image, cfg, dec, resync, _args = decode_inputs(d, v, decoder)
    want = _direct(data, image, cfg, dec, resync)
    data, image, cfg, dec, resync, _args = decode_inputs(d, v, decoder)
    assert _replayed(data, image, cfg, dec, resync, "python") == want


@pytest.mark.parametrize("decoder", ["insn", "block"])
def test_batch_size_does_not_change_records(decoder):
    if not VARIANTS:
        pytest.skip("corpus unavailable")
    for d, v, _meta in VARIANTS[::7]:
        data, image, cfg, dec, resync, _a = decode_inputs(d, v, decoder)
        one = B.flatten(B.python_batches(data, image, cfg, decoder=dec,
                                         resync=resync, want_insns=True,
                                         max_records=1))
        data, image, cfg, dec, resync, _a = decode_inputs(d, v, decoder)
        big = B.flatten(B.python_batches(data, image, cfg, decoder=dec,
                                         resync=resync, want_insns=True))
        assert np.array_equal(one[0], big[0]), variant_id(v)
        assert np.array_equal(one[1], big[1]), variant_id(v)
        assert [(i, o, repr(x)) for i, o, x in one[2]] == \
            [(i, o, repr(x)) for i, o, x in big[2]], variant_id(v)


@pytest.mark.parametrize("decoder", ["insn", "block"])
def test_replayed_batches_print_the_ptxed_corpus(decoder):
    if not VARIANTS:
        pytest.skip("corpus unavailable")
    bad = []
    for d, v, _meta in VARIANTS:
        data, image, cfg, dec, resync, args = decode_inputs(d, v, decoder)
        out = []
        sink = sinks.PtxedSink(out.append, event_ip=args.event_ip,
                               event_time=args.event_time,
                               print_offset=args.offset,
                               show_blocks=args.show_blocks,
                               block_ids=bool(args.stat or args.stat_insn
                                              or args.stat_blocks))
        if cfg.cpu is not None:
            from hwtrace.pt import cpu as cpumod
            from hwtrace.pt.errors import PtError
            if isinstance(cpumod.errata(cfg.cpu), PtError):
                continue        # the config error line comes from the CLI
        B.replay(B.batches(data, image, cfg, decoder=dec, resync=resync,
                           want_insns=True), sink, dec)
        if args.stat or args.stat_insn or args.stat_blocks:
            continue            # statistics lines come from the CLI
        exp = (d / v["exp"]["ptxed"]).read_text()
        if normalize("".join(out)) != normalize(exp):
            bad.append(variant_id(v))
    assert not bad


def test_records_are_well_formed():
    """Each record's instructions start at ip and end at end_ip; the
    insn decoder's runs end at every branch."""
    if not VARIANTS:
        pytest.skip("corpus unavailable")
    for d, v, _meta in VARIANTS[::5]:
        for decoder in ("insn", "block"):
            data, image, cfg, dec, resync, _a = decode_inputs(d, v, decoder)
            blocks, insns, _items = B.flatten(B.python_batches(
                data, image, cfg, decoder=dec, resync=resync,
                want_insns=True))
            counts = blocks["ninsn"].astype(np.int64)
            starts = np.cumsum(counts) - counts
            assert (blocks["ninsn"] >= 1).all()
            assert sum(blocks["ninsn"]) == len(insns)
            assert (insns["ip"][starts] == blocks["ip"]).all()
            ends = starts + counts - 1
            assert (insns["ip"][ends] == blocks["end_ip"]).all()
            assert (insns["iclass"][ends] == blocks["iclass"]).all()
            assert (insns["size"][ends] == blocks["size"]).all()
            if dec == "insn":
                inner = np.ones(len(insns), bool)
                inner[ends] = False
                assert (insns["iclass"][inner] == 1).all()


def test_compiled_batches_keep_their_own_records_writable():
    """The compiled core hands each batch its record buffers themselves
    (no copy): a batch kept while later ones are decoded still holds its
    own records, and numpy may write to them as to the bytearray before."""
    from hwtrace.flow.fast import _core
    if not VARIANTS:
        pytest.skip("corpus unavailable")
    if _core(None) is None:
        pytest.skip("no compiled core")
    seen = 0
    for d, v, _meta in VARIANTS[::5]:
        data, image, cfg, dec, resync, _a = decode_inputs(d, v, "block")
        kept, copies = [], []
        for b in B.batches(data, image, cfg, decoder=dec, resync=resync,
                           want_insns=True, max_records=3, impl="compiled",
                           plain_events=True):
            kept.append(b)
            copies.append((b.blocks.copy(), None if b.insns is None else b.insns.copy(),
                           None if b.plain is None else b.plain.copy()))
        for b, (blocks, insns, rows) in zip(kept, copies):
            assert b.blocks.tobytes() == blocks.tobytes(), variant_id(v)
            if insns is not None:
                assert b.insns.tobytes() == insns.tobytes(), variant_id(v)
            if rows is not None:        # (field by field: a row has padding)
                assert b.plain.tolist() == rows.tolist(), variant_id(v)
            if len(b.blocks):
                assert b.blocks.flags.writeable
                b.blocks["ip"][0] = b.blocks["ip"][0]
        seen += len(kept)
    assert seen > 10
