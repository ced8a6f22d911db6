"""Just enough protobuf wire encoding for Perfetto trace packets.

Varints, length-delimited fields; field numbers are those of Perfetto's
``perfetto_trace.proto`` (checked against ``perfetto_trace_pb2`` in the
tests).  Hand-rolled so the writer needs no protobuf runtime and stays fast.
"""

from __future__ import annotations


_SMALL = [bytes([i]) for i in range(128)]


def varint(v: int) -> bytes:
    if 0 <= v < 128:
        return _SMALL[v]
    if v < 0:
        v &= (1 << 64) - 1
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def f_varint(field: int, v: int) -> bytes:
    return varint(field << 3) + varint(v)


def f_bytes(field: int, data: bytes) -> bytes:
    return varint((field << 3) | 2) + varint(len(data)) + data


def f_str(field: int, s: str) -> bytes:
    return f_bytes(field, s.encode("utf-8", "replace"))
