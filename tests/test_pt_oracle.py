"""``hwtrace dump --format jsonl`` against the live reference oracle
(``ptoracle pkt``, Debian's libipt 2.0.5) on every distinct corpus stream
and on 1,000 seeded random mutations of them: same packets, same fields,
same error offsets.

libipt 2.0.5 predates some of what the corpus (libipt 2.3) and hwtrace
decode.  We compare against it by configuring our decoder like 2.0.5 --
precisely, not by skipping inputs:

- CFE (02 13), EVD (02 53) and TRIG (d9) do not exist there: 2.0.5 reports
  "unknown opcode" and resynchronizes; we decode with those packet types
  disabled (``PacketDecoder(disabled=NEWER_PACKETS)``), which does the same;
- MODE.Exec has no ``iflag`` field in 2.0.5's JSON: dropped before comparing;
- the SKD007 workaround (CYC+OVF) is not in 2.0.5's packet decoder: we
  decode with that erratum off (SKZ84, which 2.0.5 has, stays on);
- an SKZ84 invalid packet (8 bytes) that runs past the end of the buffer
  ends decoding silently in 2.3, while 2.0.5 then reports "decoder out of
  sync" at the packet's end: that record is added to our output.

The stored 2.3 output of every corpus variant (with CFE/EVD/TRIG, iflag
and SKD007) is compared in tests/test_pt_packets.py.
"""

from __future__ import annotations

import json
import random
import subprocess

from conftest import CORPUS
from hwtrace.pt.cpu import Cpu, errata as cpu_errata
from hwtrace.pt.decoder import PacketDecoder
from hwtrace.pt.packets import NEWER_PACKETS

SEED = 20240607
N_MUTATIONS = 1000
CPUS = [None, None, "6/78", "6/85"]


def _ours_as_libipt_2_0(data: bytes, cpu, no_sync: bool) -> list[dict]:
    err = cpu_errata(Cpu.parse(cpu)) if cpu else cpu_errata(None)
    err = err._replace(skd007=False)
    dec = PacketDecoder(data, errata=err, disabled=NEWER_PACKETS)
    out = []
    for p in dec.packets(no_sync=no_sync):
        j = p.to_json()
        if j.get("type") == "mode.exec":
            del j["iflag"]
        out.append(j)
    if out and out[-1].get("type") == "invalid" and \
            out[-1]["offset"] + out[-1]["size"] > len(data):
        out.append({"offset": out[-1]["offset"] + out[-1]["size"],
                    "error": "decoder out of sync"})
    return out


def _oracle(ptoracle, path, cpu, no_sync) -> list[dict]:
    cmd = [str(ptoracle), "pkt", str(path)]
    if cpu:
        cmd += ["--cpu", cpu]
    if no_sync:
        cmd.append("--no-sync")
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    # The config-error line (a CPU 2.0.5 does not know) is not a packet.
    return [json.loads(line) for line in r.stdout.splitlines()
            if '"config error"' not in line]


def mutate(data: bytes, rng: random.Random) -> bytes:
    """1-4 random edits: byte overwrite, bit flip, insert, delete, cut."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not b:
            break
        k = rng.random()
        pos = rng.randrange(len(b))
        if k < 0.5:
            b[pos] = rng.randrange(256)
        elif k < 0.7:
            b[pos] ^= 1 << rng.randrange(8)
        elif k < 0.8:
            b.insert(pos, rng.randrange(256))
        elif k < 0.9:
            del b[pos]
        else:
            del b[pos:]
    return bytes(b)


def _distinct_streams():
    seen = {}
    for path in sorted(CORPUS.glob("*/*.pt")):
        seen.setdefault(path.read_bytes(), path)
    return [(data, path) for data, path in seen.items()]


def test_jsonl_matches_oracle_on_corpus_and_mutations(ptoracle, corpus,
                                                      tmp_path):
    streams = _distinct_streams()
    assert len(streams) > 150
    cases = [(data, path, None, False) for data, path in streams]
    rng = random.Random(SEED)
    for i in range(N_MUTATIONS):
        data, _ = rng.choice(streams)
        m = mutate(data, rng)
        path = tmp_path / f"m{i}.pt"
        path.write_bytes(m)
        cases.append((m, path, rng.choice(CPUS), rng.random() < 0.2))
    mismatches = []
    errors_seen = 0
    for data, path, cpu, no_sync in cases:
        ours = _ours_as_libipt_2_0(data, cpu, no_sync)
        ref = _oracle(ptoracle, path, cpu, no_sync)
        errors_seen += sum("error" in r for r in ref)
        if ours != ref:
            mismatches.append((path.name, cpu, no_sync))
    assert mismatches == []
    assert errors_seen > 100  # the mutations do exercise error recovery


def test_cli_jsonl_is_the_oracle_schema(ptoracle, corpus, tmp_path):
    """The CLI's jsonl output is byte-identical to the oracle's lines on a
    stream without 2.3-only packets."""
    from conftest import run_hwtrace
    path = CORPUS / "ptdump-trunc-resync" / "ptdump-trunc-resync.pt"
    r = run_hwtrace("dump", "--format", "jsonl", path)
    ref = subprocess.run([str(ptoracle), "pkt", str(path)],
                         capture_output=True, text=True, check=True)
    assert r.returncode == 0
    assert r.stdout == ref.stdout


def test_real_captures_match_oracle(ptoracle, hardware):
    """Real hardware traces (raw PT, no perf container) decode like the
    reference, with and without their CPU's errata."""
    from conftest import FIXTURES
    cases = [(FIXTURES / "raw_no_binary" / "traced_data.bin", None),
             (FIXTURES / "drpt2trace_simple" / "pt.bin", "6/85"),
             (FIXTURES / "drpt2trace_simple" / "pt.bin", None)]
    for path, cpu in cases:
        if not path.exists():
            continue
        ours = _ours_as_libipt_2_0(path.read_bytes(), cpu, False)
        ref = _oracle(ptoracle, path, cpu, False)
        assert len(ref) > 100
        assert not any("error" in r for r in ref)
        assert ours == ref, path
