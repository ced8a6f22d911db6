"""Packet layer against the corpus: decoding equals the reference decoder's
packets (the corpus' stored ``pkt.jsonl``, made by libipt 2.3), and
re-encoding every decoded packet gives back the original bytes."""

from __future__ import annotations

import json

import pytest

from conftest import corpus_variants
from hwtrace.pt import encoder as enc
from hwtrace.pt.decoder import PacketDecoder
from hwtrace.pt.errors import PtError
from hwtrace.pt import packets as P


def _variants():
    return list(corpus_variants())


def _oracle_args(v):
    cmd = v["oracle_pkt"]["cmd"].split()
    cpu = cmd[cmd.index("--cpu") + 1] if "--cpu" in cmd else None
    return cpu, "--no-sync" in cmd


def test_corpus_packets_match_stored_oracle(corpus):
    mismatches = []
    n = 0
    for d, v, _meta in _variants():
        cpu, no_sync = _oracle_args(v)
        data = (d / v["pt"]).read_bytes()
        dec = PacketDecoder(data, cpu=cpu)
        got = []
        if dec.cpu_error:
            got.append({"error": dec.cpu_error.code, "kind": "config error",
                        "offset": 0, "ip": 0})
        got += [p.to_json() for p in dec.packets(no_sync=no_sync)]
        exp = [json.loads(line) for line in
               (d / v["oracle_pkt"]["file"]).read_text().splitlines()]
        n += 1
        if got != exp:
            mismatches.append(v["pt"])
    assert n == 479
    assert mismatches == []


def test_reencode_every_corpus_packet(corpus):
    count = 0
    for d, v, _meta in _variants():
        data = (d / v["pt"]).read_bytes()
        for no_sync in (False, True):
            for p in PacketDecoder(data).packets(no_sync=no_sync):
                if isinstance(p, PtError):
                    continue
                assert enc.encode(p) == data[p.offset:p.offset + p.size], p
                count += 1
    assert count > 8000


def test_decoder_verbs():
    data = (enc.pad() * 3 + enc.psb() + enc.mode_exec(mode="64bit")
            + enc.fup(0x1000, 6) + enc.psbend() + enc.tnt8("tnt")
            + enc.psb() + enc.psbend())
    dec = PacketDecoder(data)
    assert dec.offset is None
    assert dec.next() == PtError("decoder out of sync", 0)
    assert dec.sync_forward() == 3
    assert (dec.offset, dec.sync_offset) == (3, 3)
    assert dec.next() == P.Psb(3, 16)
    assert dec.next() == P.ModeExec(19, 2, 1, 0, 0)
    assert dec.next() == P.Fup(21, 9, 6, 0x1000)
    assert dec.next() == P.Psbend(30, 2)
    assert dec.next() == P.Tnt8(32, 1, 3, 0b101)
    assert dec.sync_forward() == 33
    assert dec.sync_forward() == PtError("reached end of trace stream", 33)
    assert dec.sync_backward() == 3
    assert dec.sync_set(32) == 32
    assert dec.next().type == "tnt8"
    assert dec.sync_set(33 + 18) == 51
    assert dec.next() == PtError("reached end of trace stream", 51)
    assert dec.sync_set(52).code == "reached end of trace stream"


def test_to_json_schema():
    assert P.Tip(7, 7, 3, 4096).to_json() == {
        "offset": 7, "size": 7, "type": "tip", "ipc": 3, "ip": 4096}
    assert PtError("unknown opcode", 23).to_json() == {
        "offset": 23, "error": "unknown opcode"}
    assert P.from_json({"offset": 1, "size": 2, "type": "mtc", "ctc": 5}) \
        == P.Mtc(1, 2, 5)


@pytest.mark.parametrize("data,first", [
    (b"\x02\x82" * 8 + b"\xc9", PtError("unknown opcode", 16)),
    (b"\x02\x82" * 8 + b"\xad", PtError("unknown packet", 16)),
    (b"\x02\x82" * 8 + b"\x02\x73\x00\x00\x01\x00\x00",
     PtError("unknown packet", 16)),
])
def test_bad_packets_are_values(data, first):
    out = list(PacketDecoder(data).packets())
    assert out == [P.Psb(0, 16), first]


def test_truncated_packet_ends_silently():
    data = enc.psb() + enc.tsc(5)[:4]
    assert list(PacketDecoder(data).packets()) == [P.Psb(0, 16)]
    dec = PacketDecoder(data)
    dec.sync_forward()
    dec.next()
    assert dec.next() == PtError("reached end of trace stream", 16)


def test_encoder_picks_compression():
    e = enc.Encoder()
    e.psb().tip_pge(0x401000).tip(0x401234).tip(0x7fff00001000).psbend()
    pk = [p for p in PacketDecoder(e.getvalue()).packets()]
    assert [(p.type, getattr(p, "ipc", None)) for p in pk] == [
        ("psb", None), ("tip.pge", 3), ("tip", 1), ("tip", 4),
        ("psbend", None)]
