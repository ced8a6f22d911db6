"""Every instruction of the libipt corpus listings decodes to its length.

The .lst files are NASM listings of the corpus' .ptt sources: per statement
a line number, the offset, the bytes (a trailing '-' continues them on the
next listing line at the same offset) and the source. `[bits N]` selects
the mode (NASM's default is 16).
"""

from __future__ import annotations

import re

import pytest

from conftest import CORPUS
from hwtrace.x86 import Mode, X86Error, decode

_LINE = re.compile(r"^\s*\d+ ([0-9A-F]{8}) ([0-9A-F]+)(-?)(?:<rept>)?\s*(.*)$")
_BITS = re.compile(r"\[bits (16|32|64)\]")
_DATA = re.compile(r"^(?:\w+:\s*)?(?:db|dw|dd|dq)\b")


def parse_listing(text: str):
    """Yield (bits, offset, bytes, source) per statement that emits bytes."""
    bits = 16
    cur = None
    for line in text.splitlines():
        m = _BITS.search(line)
        if m:
            bits = int(m.group(1))
            continue
        m = _LINE.match(line)
        if not m:
            continue
        off, hexs, cont, src = m.groups()
        off = int(off, 16)
        if cur is not None and cur[1] == off and not src:
            cur[2] += bytes.fromhex(hexs)
            cur[4] = bool(cont)
            if not cont:
                yield tuple(cur[:4])
                cur = None
            continue
        if cur is not None:
            yield tuple(cur[:4])
        cur = [bits, off, bytearray(bytes.fromhex(hexs)), src, bool(cont)]
        if not cont:
            yield tuple(cur[:4])
            cur = None
    if cur is not None:
        yield tuple(cur[:4])


def corpus_statements():
    out = []
    for lst in sorted(CORPUS.glob("*/*.lst")):
        for bits, off, code, src in parse_listing(lst.read_text()):
            if "<rept>" in src or "times" in src:
                continue
            out.append((lst.name, bits, off, bytes(code), src))
    return out


def test_listing_parser_handles_continuations():
    text = ("    44 00000003 D500A1101000000000-    l2: db 0xd5, 0x00\n"
            "    45 00000003 0000               \n"
            "    46 0000000E F4                     l3: hlt\n")
    got = list(parse_listing("[bits 64]\n" + text))
    assert got == [(64, 3, bytearray.fromhex("D500A1101000000000" "0000"),
                    "l2: db 0xd5, 0x00"),
                   (64, 14, bytearray(b"\xf4"), "l3: hlt")]


def test_every_corpus_instruction_has_its_listed_length(corpus):
    stmts = corpus_statements()
    if not stmts:
        pytest.skip("corpus not available")
    bad = []
    n = 0
    for name, bits, off, code, src in stmts:
        mode = Mode.from_name(bits)
        try:
            insn = decode(code, mode)
        except X86Error as e:
            bad.append((name, off, code.hex(), src, str(e)))
            continue
        n += 1
        if insn.size != len(code):
            bad.append((name, off, code.hex(), src, insn.size))
    assert not bad, bad[:20]
    assert n > 1500


def _oracle_classes():
    """(bytes, mode) -> set of iclass names seen in the oracle's insn output."""
    import json
    seen = {}
    for lst in sorted(CORPUS.glob("*/*.lst")):
        d = lst.parent
        stem = lst.stem
        byaddr = {}
        text = lst.read_text()
        org = re.search(r"\[org (0x[0-9a-fA-F]+)\]", text)
        base = int(org.group(1), 16) if org else 0
        for bits, off, code, src in parse_listing(text):
            byaddr[base + off] = (bytes(code), bits)
        for jl in d.glob(stem + "*.insn.jsonl"):
            for line in jl.read_text().splitlines():
                rec = json.loads(line)
                if "iclass" not in rec or rec["ip"] not in byaddr:
                    continue
                code, bits = byaddr[rec["ip"]]
                if len(code) != rec["size"]:
                    continue
                seen.setdefault((code, bits), set()).add(
                    (rec["iclass"], rec["size"]))
    return seen


def test_corpus_classes_agree_with_libipt_oracle_output(corpus):
    """The .insn.jsonl files hold libipt 2.0.5's verdict per executed insn."""
    seen = _oracle_classes()
    if not seen:
        pytest.skip("corpus not available")
    new_in_21 = {"f30f01ca", "f20f01ca", "f30f01ec"}   # ERETU/ERETS/UIRET
    bad = []
    for (code, bits), verdicts in seen.items():
        insn = decode(code, Mode.from_name(bits))
        for iclass, size in verdicts:
            want = iclass
            if code.hex() in new_in_21 or code.startswith(b"\xd5"):
                continue
            if (insn.iclass.oracle_name, insn.size) != (want, size):
                bad.append((code.hex(), bits, insn.iclass.oracle_name,
                            insn.size, want, size))
    assert not bad, bad
    assert len(seen) > 50
