"""The execution log: what an execution source saw a real program do.

Both emulated execution sources write this format (the QEMU TCG plugin in
``qemu_plugin.c`` and the ptrace stepper); the PT generator (``ptgen``)
turns it into the Intel PT byte stream the hardware would have written.
This module has no I/O: :func:`parse` takes bytes and yields records,
:class:`Writer` builds bytes.

Format, version 1 (all integers little-endian)
===============================================

Header, 32 bytes::

    0  char[4] magic     b"HWXL"
    4  u16     version   1
    6  u16     hdr_size  32 (a reader skips to this offset)
    8  u8      source    1 = QEMU TCG plugin, 2 = ptrace stepper
    9  u8      clock     what TIME records hold: 1 = host TSC (rdtsc),
                         2 = instruction count of the thread, 0 = none
   10  u16     reserved  0
   12  u32     reserved  0
   16  u64     clock_hz  ticks per second of that clock (0 = unknown)
   24  u64     reserved  0

Then records until the end of the data, each a ``u8`` type followed by a
fixed layout (sizes below are without the type byte).  A log may be the
concatenation of chunks written by several threads (and, after fork, by
several processes) to one file: each chunk starts with a CTX record, and
every record that is about "the current thread" refers to the last CTX.

====  ==========  =========================================================
type  name        payload
====  ==========  =========================================================
0x01  CTX         u32 pid, u32 tid, i32 cpu (-1 unknown).  The following
                  thread records are about this thread, which ran on
                  logical CPU ``cpu`` (of the host) when they began.
0x02  TIME        u64 value: the clock (header ``clock``) for the current
                  thread, read before the records that follow.
0x03  BLOCK       u32 pid, u32 id, u64 pc, u16 ninsn, u16 nbytes,
                  u8 sizes[ninsn], u8 code[nbytes] (nbytes = sum(sizes)).
                  Instruction info at translation time: block ``id`` of
                  process ``pid`` is the straight-line run of ``ninsn``
                  instructions starting at ``pc`` with those sizes and
                  bytes.  A BLOCK record precedes every EXEC naming it.
                  Re-translated or self-modified code gets a new BLOCK
                  record; one with an id already defined in that process
                  replaces the old definition from then on.
0x04  EXEC        u32 n, u32 ids[n]: the current thread executed these
                  blocks, every instruction of each, in this order.
0x05  EXEC_PART   u32 id, u16 count: the current thread executed only the
                  first ``count`` instructions of block ``id``: the next
                  one faulted (a SIGNAL record with async=0 may follow; a
                  source that sees no signals, like QEMU, writes none), or
                  the thread's log ends here (it died or was stopped
                  before that instruction retired).
0x06  INSN        u64 pc, u8 size, u8 code[size]: the current thread
                  executed this one instruction (a source that sees single
                  instructions, like a stepper, may use this instead of
                  BLOCK/EXEC; both may be mixed).
0x10  THREAD_START u32 parent_tid (0 for a process's first thread).
0x11  THREAD_EXIT  i32 status.
0x12  PROC_START  u32 parent_pid (0 for the first traced process).  For a
                  fork child (this CTX's pid) the block table starts as a
                  copy of the parent's at this point of the log.
0x13  PROC_EXEC   u8 followed, u16 len, u8 path[len]: execve of ``path``.
                  followed=1: it succeeded and the source goes on tracing
                  the new image (the process's block table and maps are
                  reset); followed=0: the process left the traced world
                  here.  A source that can't see the outcome (QEMU) writes
                  it at the execve entry: a SYSRET that follows means the
                  execve failed and the record is void.
0x14  PROC_EXIT   i32 status (exit code, or -signal).
0x15  REAPED      u32 pid, i32 status (exit code, or -signal): the current
                  thread's wait reaped child ``pid``, which ended so (a
                  source that logs no PROC_EXIT for a process a signal
                  killed, like QEMU, says it here: before the wait's
                  SYSRET).
0x20  SYSCALL     u64 nr: the last executed instruction (a syscall)
                  entered the kernel.
0x21  SYSRET      u64 nr, i64 ret: the kernel returned to user mode; the
                  next executed instruction is where user code resumed
                  (after a signal was set up, that is the handler).
0x22  SIGNAL      u32 signo, u8 async, u64 handler, u64 ip: the kernel
                  delivered a signal to a handler.  async=1: an interrupt
                  between two instructions; ``ip`` is the next instruction
                  that would have executed (0 = the source doesn't know;
                  the generator then infers it).  async=0: the instruction
                  at ``ip`` faulted and did not retire.  The next executed
                  instruction is the first one of the handler; handler 0:
                  there is none, the signal killed the thread there.
0x23  SIGACTION   u32 signo, u64 handler, u64 flags: rt_sigaction
                  installed a handler (0 = SIG_DFL, 1 = SIG_IGN).
0x30  MMAP        u32 pid, u64 addr, u64 size, u64 offset, u32 prot,
                  u16 len, u8 path[len], u8 bidlen, u8 build_id[bidlen]:
                  ``[addr, addr+size)`` of process ``pid`` maps ``path``
                  (empty: anonymous) from file ``offset``; prot as mmap's.
0x31  MUNMAP      u32 pid, u64 addr, u64 size.
====  ==========  =========================================================

Unknown record types are an error (the size is not known), so a newer
writer bumps ``version``.  Rules a writer must keep so the generator can
reconstruct what the hardware would show:

* Every instruction that retired in user mode is in an EXEC, EXEC_PART or
  INSN record of its thread, in program order.
* The instruction before SYSCALL is the ``syscall`` instruction; after
  SYSCALL comes SYSRET (or THREAD_EXIT / PROC_EXIT / PROC_EXEC).
* Control leaving user code other than by a branch (signal, a context
  switch recorded as a new chunk of another thread) is visible: as a
  SIGNAL, a SYSCALL, or the end of a chunk (the thread was interrupted
  there and resumes at its next chunk's first instruction).
"""

from __future__ import annotations

import struct
from array import array
from typing import Iterator, NamedTuple

MAGIC = b"HWXL"
VERSION = 1
HEADER = struct.Struct("<4sHHBBHIQQ")
assert HEADER.size == 32

SOURCE_QEMU = 1
SOURCE_PTRACE = 2
CLOCK_NONE = 0
CLOCK_HOST_TSC = 1
CLOCK_INSN_COUNT = 2

T_CTX = 0x01
T_TIME = 0x02
T_BLOCK = 0x03
T_EXEC = 0x04
T_EXEC_PART = 0x05
T_INSN = 0x06
T_THREAD_START = 0x10
T_THREAD_EXIT = 0x11
T_PROC_START = 0x12
T_PROC_EXEC = 0x13
T_PROC_EXIT = 0x14
T_REAPED = 0x15
T_SYSCALL = 0x20
T_SYSRET = 0x21
T_SIGNAL = 0x22
T_SIGACTION = 0x23
T_MMAP = 0x30
T_MUNMAP = 0x31


class ExecLogError(ValueError):
    """The bytes are not a valid execution log (with the offset)."""


class Header(NamedTuple):
    version: int
    source: int
    clock: int
    clock_hz: int


class Ctx(NamedTuple):
    pid: int
    tid: int
    cpu: int


class Time(NamedTuple):
    value: int


class Block(NamedTuple):
    pid: int
    id: int
    pc: int
    sizes: bytes
    code: bytes


class Exec(NamedTuple):
    ids: array  # array('I')


class ExecPart(NamedTuple):
    id: int
    count: int


class Insn(NamedTuple):
    pc: int
    code: bytes


class ThreadStart(NamedTuple):
    parent_tid: int


class ThreadExit(NamedTuple):
    status: int


class ProcStart(NamedTuple):
    parent_pid: int


class ProcExec(NamedTuple):
    followed: bool
    path: str


class ProcExit(NamedTuple):
    status: int


class Reaped(NamedTuple):
    pid: int
    status: int


class Syscall(NamedTuple):
    nr: int


class Sysret(NamedTuple):
    nr: int
    ret: int


class Signal(NamedTuple):
    signo: int
    is_async: bool
    handler: int
    ip: int


class Sigaction(NamedTuple):
    signo: int
    handler: int
    flags: int


class Mmap(NamedTuple):
    pid: int
    addr: int
    size: int
    offset: int
    prot: int
    path: str
    build_id: bytes


class Munmap(NamedTuple):
    pid: int
    addr: int
    size: int


_CTX = struct.Struct("<IIi")
_U64 = struct.Struct("<Q")
_BLOCK = struct.Struct("<IIQHH")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_PART = struct.Struct("<IH")
_INSN = struct.Struct("<QB")
_EXECH = struct.Struct("<BH")
_SYSRET = struct.Struct("<Qq")
_REAPED = struct.Struct("<Ii")
_SIGNAL = struct.Struct("<IBQQ")
_SIGACTION = struct.Struct("<IQQ")
_MMAP = struct.Struct("<IQQQIH")
_MUNMAP = struct.Struct("<IQQ")


def parse_header(data: bytes) -> tuple[Header, int]:
    """The header and the offset of the first record."""
    if len(data) < HEADER.size:
        raise ExecLogError("execution log: truncated header")
    magic, version, hsize, source, clock, _r, _r2, hz, _r3 = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise ExecLogError("execution log: bad magic")
    if version != VERSION:
        raise ExecLogError(f"execution log: unsupported version {version}")
    if hsize < HEADER.size or hsize > len(data):
        raise ExecLogError("execution log: bad header size")
    return Header(version, source, clock, hz), hsize


def parse(data: bytes | memoryview, start: int | None = None, *,
          first_ids: bool = False) -> Iterator[object]:
    """Yield the records of ``data`` (a whole log, header included).

    With ``start`` the header is not read and records begin there.
    ``first_ids``: each Exec holds only its first id (none if it has
    none): an index needs no more, and the ids are most of a long log's
    bytes (a mapped log's pages are then never touched).
    Raises :class:`ExecLogError` (with the offset) on malformed input.
    """
    mv = memoryview(data)
    if start is None:
        _, off = parse_header(data)
    else:
        off = start
    end = len(mv)
    try:
        while off < end:
            t = mv[off]
            off += 1
            if t == T_EXEC:
                (n,) = _U32.unpack_from(mv, off)
                off += 4
                stop = off + 4 * n
                if stop > end:
                    raise ExecLogError(f"execution log: truncated EXEC at {off - 5}")
                ids = array("I")
                ids.frombytes(mv[off:min(stop, off + 4)] if first_ids else mv[off:stop])
                off = stop
                yield Exec(ids)
            elif t == T_CTX:
                yield Ctx(*_CTX.unpack_from(mv, off))
                off += _CTX.size
            elif t == T_TIME:
                yield Time(_U64.unpack_from(mv, off)[0])
                off += 8
            elif t == T_BLOCK:
                pid, bid, pc, ninsn, nbytes = _BLOCK.unpack_from(mv, off)
                off += _BLOCK.size
                sizes = bytes(mv[off:off + ninsn])
                off += ninsn
                code = bytes(mv[off:off + nbytes])
                off += nbytes
                if off > end or sum(sizes) != nbytes:
                    raise ExecLogError(f"execution log: bad BLOCK at {off}")
                yield Block(pid, bid, pc, sizes, code)
            elif t == T_EXEC_PART:
                yield ExecPart(*_PART.unpack_from(mv, off))
                off += _PART.size
            elif t == T_INSN:
                pc, size = _INSN.unpack_from(mv, off)
                off += _INSN.size
                code = bytes(mv[off:off + size])
                off += size
                if off > end:
                    raise ExecLogError(f"execution log: truncated INSN at {off}")
                yield Insn(pc, code)
            elif t == T_SYSCALL:
                yield Syscall(_U64.unpack_from(mv, off)[0])
                off += 8
            elif t == T_SYSRET:
                yield Sysret(*_SYSRET.unpack_from(mv, off))
                off += _SYSRET.size
            elif t == T_THREAD_START:
                yield ThreadStart(_U32.unpack_from(mv, off)[0])
                off += 4
            elif t == T_THREAD_EXIT:
                yield ThreadExit(_I32.unpack_from(mv, off)[0])
                off += 4
            elif t == T_PROC_START:
                yield ProcStart(_U32.unpack_from(mv, off)[0])
                off += 4
            elif t == T_PROC_EXEC:
                followed, n = _EXECH.unpack_from(mv, off)
                off += _EXECH.size
                path = bytes(mv[off:off + n]).decode("utf-8", "surrogateescape")
                off += n
                yield ProcExec(bool(followed), path)
            elif t == T_PROC_EXIT:
                yield ProcExit(_I32.unpack_from(mv, off)[0])
                off += 4
            elif t == T_REAPED:
                yield Reaped(*_REAPED.unpack_from(mv, off))
                off += _REAPED.size
            elif t == T_SIGNAL:
                signo, is_async, handler, ip = _SIGNAL.unpack_from(mv, off)
                off += _SIGNAL.size
                yield Signal(signo, bool(is_async), handler, ip)
            elif t == T_SIGACTION:
                yield Sigaction(*_SIGACTION.unpack_from(mv, off))
                off += _SIGACTION.size
            elif t == T_MMAP:
                pid, addr, size, foff, prot, n = _MMAP.unpack_from(mv, off)
                off += _MMAP.size
                path = bytes(mv[off:off + n]).decode("utf-8", "surrogateescape")
                off += n
                blen = mv[off]
                off += 1
                bid = bytes(mv[off:off + blen])
                off += blen
                if off > end:
                    raise ExecLogError(f"execution log: truncated MMAP at {off}")
                yield Mmap(pid, addr, size, foff, prot, path, bid)
            elif t == T_MUNMAP:
                yield Munmap(*_MUNMAP.unpack_from(mv, off))
                off += _MUNMAP.size
            else:
                raise ExecLogError(f"execution log: unknown record type {t:#x} at {off - 1}")
    except struct.error:
        raise ExecLogError(f"execution log: truncated record at {off - 1}") from None
    except IndexError:
        raise ExecLogError(f"execution log: truncated record at {off - 1}") from None


class Writer:
    """Builds an execution log in memory; ``bytes()`` gives the result."""

    def __init__(self, source: int = SOURCE_PTRACE, clock: int = CLOCK_NONE,
                 clock_hz: int = 0):
        self._b = bytearray(HEADER.pack(MAGIC, VERSION, HEADER.size, source,
                                        clock, 0, 0, clock_hz, 0))

    def __bytes__(self) -> bytes:
        return bytes(self._b)

    def take(self) -> bytes:
        """The bytes written so far (header included the first time), emptied."""
        out = bytes(self._b)
        self._b.clear()
        return out

    def ctx(self, pid: int, tid: int, cpu: int = -1) -> None:
        self._b += b"\x01" + _CTX.pack(pid, tid, cpu)

    def time(self, value: int) -> None:
        self._b += b"\x02" + _U64.pack(value)

    def block(self, pid: int, bid: int, pc: int, sizes: bytes, code: bytes) -> None:
        if sum(sizes) != len(code):
            raise ValueError("block sizes do not add up to the code length")
        self._b += b"\x03" + _BLOCK.pack(pid, bid, pc, len(sizes), len(code))
        self._b += bytes(sizes) + bytes(code)

    def exec(self, ids) -> None:
        a = array("I", ids)
        self._b += b"\x04" + _U32.pack(len(a)) + a.tobytes()

    def exec_part(self, bid: int, count: int) -> None:
        self._b += b"\x05" + _PART.pack(bid, count)

    def insn(self, pc: int, code: bytes) -> None:
        self._b += b"\x06" + _INSN.pack(pc, len(code)) + bytes(code)

    def thread_start(self, parent_tid: int = 0) -> None:
        self._b += b"\x10" + _U32.pack(parent_tid)

    def thread_exit(self, status: int = 0) -> None:
        self._b += b"\x11" + _I32.pack(status)

    def proc_start(self, parent_pid: int = 0) -> None:
        self._b += b"\x12" + _U32.pack(parent_pid)

    def proc_exec(self, path: str, followed: bool) -> None:
        p = path.encode("utf-8", "surrogateescape")
        self._b += b"\x13" + _EXECH.pack(int(followed), len(p)) + p

    def proc_exit(self, status: int) -> None:
        self._b += b"\x14" + _I32.pack(status)

    def reaped(self, pid: int, status: int) -> None:
        self._b += b"\x15" + _REAPED.pack(pid, status)

    def syscall(self, nr: int) -> None:
        self._b += b"\x20" + _U64.pack(nr)

    def sysret(self, nr: int, ret: int) -> None:
        self._b += b"\x21" + _SYSRET.pack(nr, ret)

    def signal(self, signo: int, is_async: bool, handler: int, ip: int = 0) -> None:
        self._b += b"\x22" + _SIGNAL.pack(signo, int(is_async), handler, ip)

    def sigaction(self, signo: int, handler: int, flags: int = 0) -> None:
        self._b += b"\x23" + _SIGACTION.pack(signo, handler, flags)

    def mmap(self, pid: int, addr: int, size: int, offset: int, prot: int,
             path: str = "", build_id: bytes = b"") -> None:
        p = path.encode("utf-8", "surrogateescape")
        self._b += b"\x30" + _MMAP.pack(pid, addr, size, offset, prot, len(p))
        self._b += p + bytes([len(build_id)]) + bytes(build_id)

    def munmap(self, pid: int, addr: int, size: int) -> None:
        self._b += b"\x31" + _MUNMAP.pack(pid, addr, size)
