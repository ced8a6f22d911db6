"""Decoding a stream that runs several address spaces with libipt.

libipt decodes a stream against one image.  A stream whose processes map
different code at the same addresses (QEMU lays every program out the same
way, so a process and the program it execs overlap) can't be decoded with
the union of their mappings: it is cut where the address space changes
(at the TIP.PGE where the new one's code begins), and each piece is decoded
by ptoracle with its own space's image.  A piece after the first gets a
synchronization point of its own: PSB, MODE.EXEC (64-bit), PSBEND, then the
original TIP.PGE with its IP uncompressed, then the original bytes.  Every
piece must decode without an error, and their instruction counts add up to
the stream's ``instructions_observed``.
"""

from __future__ import annotations

import json
import os
import subprocess

from conftest import run_hwtrace

PSB = bytes([0x02, 0x82] * 8)
SYNC = PSB + bytes([0x99, 0x01]) + bytes([0x02, 0x23])     # PSB, MODE.EXEC 64, PSBEND


def spaces_of(bundle):
    from hwtrace.bundle import Bundle
    from hwtrace.flow.spaces import AddressSpaces
    b = Bundle.open(bundle)
    return AddressSpaces(b.iter_sideband(), lambda f, bid: b.find_image(f, bid))


def raw_args(mappings) -> list[str]:
    from hwtrace.cli.images import _raw_args
    return _raw_args(mappings)


def consistent(spaces) -> bool:
    """Whether the union of these spaces' mappings is one image: no two
    overlapping mappings put different bytes at an address."""
    maps = sorted({(m.start, m.start + m.size, m.path, m.start - m.offset)
                   for sp in spaces for m in sp.mappings})
    for (a0, a1, p, base), (b0, b1, q, qbase) in zip(maps, maps[1:]):
        if b0 < a1 and (p != q or base != qbase):
            return False
    return True


def packets(ptoracle, path) -> list[dict]:
    """libipt's packets of a stream, each IP packet with its full IP."""
    out = subprocess.run([str(ptoracle), "pkt", str(path)], capture_output=True,
                         text=True, check=True).stdout
    last = 0
    pkts = []
    for line in out.splitlines():
        p = json.loads(line)
        if p.get("type") == "psb":
            last = 0
        elif "ipc" in p and p["ipc"]:
            ipc, ip = p["ipc"], p["ip"]
            if ipc == 1:
                ip = (last & ~0xFFFF) | ip
            elif ipc == 2:
                ip = (last & ~0xFFFFFFFF) | ip
            elif ipc == 3:
                ip = ip - (1 << 48) if ip & (1 << 47) else ip
                ip &= (1 << 64) - 1
            elif ipc == 4:
                ip = (last & ~0xFFFFFFFFFFFF) | ip
            last = ip
            p["full_ip"] = ip
        pkts.append(p)
    return pkts


def piece(data: bytes, pge: dict, end: int) -> bytes:
    """Bytes from the TIP.PGE packet ``pge`` to ``end``, synchronized."""
    ip = pge["full_ip"]
    assert 0 <= ip < 1 << 47
    return SYNC + bytes([0x71]) + ip.to_bytes(6, "little") + \
        data[pge["offset"] + pge["size"]:end]


def decode(ptoracle, data: bytes, args: list[str], tmp, name: str, want_ips=False):
    """(instructions, errors, ips or None) of ``data`` decoded by ptoracle."""
    path = os.path.join(tmp, name)
    with open(path, "wb") as f:
        f.write(data)
    cmd = [str(ptoracle), "insn", path, *args]
    if not want_ips:
        o = subprocess.run(cmd + ["--summary"], capture_output=True, text=True, check=True)
        s = json.loads(o.stdout.splitlines()[-1])
        return s["insns"], s["errors"], None
    o = subprocess.run(cmd, capture_output=True, text=True, check=True)
    ips, errors = [], 0
    for line in o.stdout.splitlines():
        if line.startswith('{"ip":'):
            ips.append(int(line[6:line.index(",")]))
        elif '"error"' in line:
            errors += 1
    return len(ips), errors, ips


def decode_pieces(ptoracle, stream_path, cuts, tmp, want_ips=False):
    """``cuts``: [(packet offset of the TIP.PGE where a space begins (0 for
    the first), its space)]; returns [(space, insns, errors, ips)]."""
    data = open(stream_path, "rb").read()
    pkts = {p["offset"]: p for p in packets(ptoracle, stream_path)}
    out = []
    for i, (at, space) in enumerate(cuts):
        end = cuts[i + 1][0] if i + 1 < len(cuts) else len(data)
        part = data[:end] if at == 0 else piece(data, pkts[at], end)
        n, errs, ips = decode(ptoracle, part, raw_args(space.mappings), tmp,
                              f"piece{i}.pt", want_ips)
        out.append((space, n, errs, ips))
    return out


def cuts_from_hwtrace(ptoracle, bundle, stream: str, spaces) -> list:
    """Where hwtrace's decoder switched address spaces in ``stream`` (its
    ``process`` lines; a switch belongs to the TIP.PGE it happened at)."""
    r = run_hwtrace("decode", bundle, "--stream", stream, "--format", "jsonl", "--offset")
    assert r.returncode == 0, r.stderr
    pges = [p for p in packets(ptoracle, os.path.join(bundle, stream))
            if p.get("type") == "tip.pge"]
    chosen: dict[int, int] = {}
    cuts = []
    for line in r.stdout.splitlines():
        if not line.startswith('{"process"'):
            continue
        o = json.loads(line)
        lst = spaces._by_pid.get(o["process"], [])
        k = chosen.get(o["process"], 0)
        while k < len(lst) - 1 and lst[k].comm != o["comm"]:
            k += 1
        chosen[o["process"]] = k
        at = max((p["offset"] for p in pges if p["offset"] < o["offset"]), default=0) \
            if o["offset"] else 0
        if cuts and cuts[-1][1] is lst[k]:
            continue
        if cuts and cuts[-1][0] == at:
            cuts[-1] = (at, lst[k])
        else:
            cuts.append((at, lst[k]))
    return cuts


def _entries(space) -> set[int]:
    """Where the space's program starts: the entry of every ELF file it maps
    at offset 0 (the dynamic loader's, or a static program's own)."""
    import struct

    from hwtrace.engines.emulated.images import load_segments
    out = set()
    for m in space.mappings:
        try:
            with open(m.path, "rb") as f:
                h = f.read(64)
        except OSError:
            continue
        if len(h) < 64 or h[:4] != b"\x7fELF":
            continue
        etype, = struct.unpack_from("<H", h, 16)
        entry, = struct.unpack_from("<Q", h, 24)
        if not entry or etype != 3:
            if entry:
                out.add(entry)
            continue
        for off, size, va in load_segments(m.path):     # where its vaddr 0 is
            if off <= m.offset < off + max(size, 1):
                out.add(m.start - (va + m.offset - off) + entry)
    return out


def exec_cuts(ptoracle, stream_path, spaces_of_pid) -> list:
    """A thread stream of a process that exec'd: each image from the first
    TIP.PGE at its program's entry (after the stream's first disable)."""
    pkts = packets(ptoracle, stream_path)
    first_pgd = next((p["offset"] for p in pkts if p.get("type") == "tip.pgd"), 0)
    cuts = [(0, spaces_of_pid[0])]
    for sp in spaces_of_pid[1:]:
        entries = _entries(sp)
        at = next(p["offset"] for p in pkts if p.get("type") == "tip.pge"
                  and p["offset"] > max(first_pgd, cuts[-1][0]) and p["full_ip"] in entries)
        cuts.append((at, sp))
    return cuts
