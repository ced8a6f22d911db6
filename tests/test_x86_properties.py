"""Properties of the decoder over arbitrary bytes (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from hwtrace.x86 import IClass, Kind, Mode, X86Error, decode

_INTERESTING = [0x66, 0x67, 0xF2, 0xF3, 0xF0, 0x2E, 0x40, 0x48, 0x4C, 0xD5,
                0x0F, 0x38, 0x3A, 0xC4, 0xC5, 0x62, 0x8F, 0xE8, 0xE9, 0xEB,
                0xFF, 0xC7, 0xF6, 0xF7, 0xA1, 0xC8, 0x9A, 0xEA, 0x01, 0xAE]
_byte = st.one_of(st.integers(0, 255), st.sampled_from(_INTERESTING))
_code = st.lists(_byte, min_size=0, max_size=24).map(bytes)
_mode = st.sampled_from(list(Mode))


@settings(max_examples=1500, deadline=None)
@given(code=_code, mode=_mode)
def test_decode_is_total_and_prefix_stable(code, mode):
    try:
        insn = decode(code, mode)
    except X86Error as e:
        assert e.reason in ("truncated", "invalid")
        if e.reason == "truncated":
            assert len(code) < 15 and e.needed > len(code)
            # more bytes can only complete it or prove it invalid/too long
            for pad in (b"\x00" * 16, b"\xff" * 16):
                try:
                    longer = decode(code + pad, mode)
                except X86Error as e2:
                    assert e2.reason == "invalid"
                else:
                    assert len(code) < longer.size <= 15
        return
    assert 1 <= insn.size <= min(15, len(code))
    # the decode depends on the instruction's bytes only
    assert decode(code[:insn.size], mode) == insn
    assert decode(code[:insn.size] + b"\xcc" * 15, mode) == insn
    assert decode(b"\x90" + code, mode, offset=1) == insn
    with pytest.raises(X86Error) as e:
        decode(code[:insn.size - 1], mode)
    assert e.value.reason == "truncated"
    # flags are consistent with the class
    c = insn.iclass
    assert insn.is_branch == (c not in (IClass.OTHER, IClass.PTWRITE))
    assert insn.is_cond == (c == IClass.COND_JUMP)
    assert insn.is_far == (c in (IClass.FAR_CALL, IClass.FAR_RETURN,
                                  IClass.FAR_JUMP))
    if insn.is_branch and not insn.is_indirect:
        assert insn.target(0x1000, mode) is not None
    if insn.rel and insn.kind != Kind.JMPABS:
        assert insn.kind != Kind.OTHER
