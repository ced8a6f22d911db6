"""Where hwtrace's block decoder ends a block, against libipt 2.0.5's.

Both decoders give the same instructions, but not always in the same
blocks: libipt's block decoder (pt_blk_next; what ``ptxed --stat`` and
``ptoracle blk`` count) cuts a block also where its *block cache* is being
filled.  The first time it runs through code it has no cache entry for, it
decodes instruction by instruction and ends the block

* after a direct near call or a backward direct jump (where its cache
  puts a "decode" stop),
* before an instruction it already has a cache entry for (the fill met
  code it filled before),
* after 1,024 instructions of one fill (a trampoline entry),
* where the next instruction is in another section,

besides the decision points, events and section changes every block ends
at.  Once the code is cached, it runs through those stops without ending
the block.  A block it proceeds to an event (tracing disabled, an
asynchronous branch, a PSB+'s status updates, the end of the trace) is
decoded without its cache and fills nothing.  hwtrace's blocks are the
warm-cache blocks: it never makes the fill stops, so on a real recording
its ``blocks:`` count is lower than libipt's by about the number of
distinct stops the program reached for the first time (its ``insn:``
count is the same).

The test records a small program, models libipt's cache fill on top of
hwtrace's blocks (both flow cores: they must agree) and checks that the
model gives ``ptoracle blk``'s block list exactly, block for block: so
every other block end is libipt's, and the only difference is the fill.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import IN_CI, record_static_program, run_hwtrace

# libipt 2.0.5, pt_block_decoder.c: bcache_fill_steps
FILL_STEPS = 0x400

_PROGRAM = r"""
__attribute__((noinline)) static long step(long n)
{ return n & 1 ? 3 * n + 1 : n / 2; }
__attribute__((noinline)) static int collatz(long n)
{ int k = 0; while (n != 1) { n = step(n); k++; } return k; }
__attribute__((noinline)) static long twice(long i)
{ return collatz(i) + collatz(i + 1); }
int main(void)
{ long s = 0;
  for (long i = 1; i < 200; i++) s += i & 3 ? collatz(i) : twice(i);
  return (int) (s & 1); }
"""

_DIRECT = re.compile(r"(call|jmp) 0x([0-9a-f]+)")
_RAW = re.compile(r"--raw \S+?:0x([0-9a-f]+)-0x([0-9a-f]+):0x([0-9a-f]+)")


def _record(tmp_path: Path) -> Path | None:
    return record_static_program(tmp_path, _PROGRAM)


def hwtrace_blocks(text: str, plain: list[bool]) -> list[dict]:
    """``decode --block:show-blocks``'s blocks: their instructions (IP,
    disassembly, whether it is of class OTHER: ``plain``, the instructions'
    classes in order) and whether an event line comes before them."""
    blocks, events, k = [], False, 0
    for line in text.splitlines():
        if line.startswith("[block"):
            blocks.append({"insns": [], "after_event": events})
            events = False
        elif line.startswith("["):
            events = True
        elif line and not line.startswith(("insn:", "blocks:")):
            cols = re.split(r"\s{2,}", line.strip())
            blocks[-1]["insns"].append((int(cols[0], 16), cols[-1],
                                        plain[k]))
            k += 1
    assert k == len(plain)
    return blocks


def _stop(ip: int, disasm: str) -> bool:
    """A direct near call or a backward direct jump: where libipt's cache
    fill stops (pt_blk_proceed_no_event_fill_cache)."""
    m = _DIRECT.match(disasm)
    return m is not None and (m.group(1) == "call" or int(m.group(2), 16) < ip)


def libipt_blocks(blocks: list[dict], sections: list[tuple[int, int]]):
    """hwtrace's blocks cut as libipt 2.0.5's block decoder cuts them while
    it fills its block cache: [(ip, end_ip, ninsn)]."""
    def section(ip):
        return next((s for s in sections if s[0] <= ip < s[1]), None)

    cached: set[int] = set()
    out = []
    for k, b in enumerate(blocks):
        insns = b["insns"]
        # proceeded to an event (libipt's uncached event flow): the end of
        # the trace, an event line next, or -- a PSB+'s status updates,
        # which print nothing -- a block that ends at a plain instruction
        # with the next one in its section
        if k + 1 == len(blocks):
            to_event = True
        else:
            nip = blocks[k + 1]["insns"][0][0]
            to_event = blocks[k + 1]["after_event"] or (
                insns[-1][2] and section(nip) == section(insns[-1][0]))
        start, filling, steps = 0, None, 0
        for p, (ip, disasm, _) in enumerate(insns):
            last = p + 1 == len(insns)
            end = last
            if not to_event:
                if filling is None:
                    filling, steps = ip not in cached, 0
                stop = _stop(ip, disasm)
                if filling:
                    cached.add(ip)
                    steps += 1
                    nip = None if last else insns[p + 1][0]
                    end = last or stop or section(nip) != section(ip) or \
                        nip in cached or steps >= FILL_STEPS
                elif stop:
                    filling = None      # the next instruction: look it up
            if end:
                out.append((insns[start][0], ip, p + 1 - start))
                start, filling = p + 1, None
    return out


def test_blocks_are_libipts_without_its_cache_fill_stops(ptoracle, tmp_path):
    bundle = _record(tmp_path)
    if bundle is None:
        if IN_CI:
            pytest.fail("the emulated engine could not record a program")
        pytest.skip("emulated engine unavailable")
    manifest = json.loads((bundle / "manifest.json").read_text())
    stream = max(manifest["streams"], key=lambda s: s["size"])["file"]
    images = run_hwtrace("images", "--pt", stream, bundle).stdout.split()
    sections = [(int(base, 16), int(base, 16) + int(hi, 16) - int(lo, 16))
                for lo, hi, base in _RAW.findall(" ".join(images))]
    pt = bundle / stream

    r = subprocess.run([str(ptoracle), "blk", str(pt), *images],
                       capture_output=True, text=True)
    theirs = [(d["ip"], d["end_ip"], d["ninsn"]) for d in
              map(json.loads, r.stdout.splitlines()) if "ninsn" in d]
    assert not any("error" in x for x in r.stdout.splitlines())

    args = ["decode", "--pt", pt, *images, "--block:show-blocks", "--stat"]
    compiled = run_hwtrace(*args)
    twin = run_hwtrace(*args, env={"HWTRACE_NO_EXTENSIONS": "1"})
    assert compiled.returncode == 0, compiled.stderr
    assert twin.stdout == compiled.stdout
    jsonl = run_hwtrace("decode", "--pt", pt, *images, "--format", "jsonl")
    plain = [d["iclass"] == "other" for d in
             map(json.loads, jsonl.stdout.splitlines()) if "iclass" in d]
    ours = hwtrace_blocks(compiled.stdout, plain)

    ninsn = sum(len(b["insns"]) for b in ours)
    assert ninsn > 10000
    assert ninsn == sum(n for _, _, n in theirs)
    assert f"blocks:\t{len(ours)}." in compiled.stdout
    # the program runs its calls and loops many times: libipt made fill
    # stops the first time only
    assert len(ours) < len(theirs) < len(ours) + len(ours) // 10
    assert libipt_blocks(ours, sections) == theirs
