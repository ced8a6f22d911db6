"""What a killed recorder leaves behind, made usable again.

``hwtrace record`` with an emulated engine keeps the execution log in its
output directory while the program runs (``DIR/hwtrace-xlog-*/exec.xlog``,
next to it ``recording.json``: the mode, buffer configuration and CPU count
the recorder would have generated the streams with, written by the engine
before the program starts).  If the recorder is killed, the traced QEMU or
stepper dies with it and the log stays there, cut wherever the kill fell.

This module finds such logs (:func:`find_logs`), reads their settings
(:func:`read_settings`) and prepares a usable copy of one
(:func:`prepare`): the records the QEMU plugin's per-thread buffer files
kept merged in (:func:`gather`, or :func:`snapshot` while the recorder
still runs), cut to the longest prefix made of whole records
(:func:`complete_prefix`: a truncated last record is dropped, never
misread), and without the trailing blocks of a killed thread that the
generator can't end a stream after (:func:`unended_transfers`).
:class:`ReplayEngine` is the emulated engine with the execution already
done: its ``run`` generates the streams and sideband from the log with the
engine's own code, so a recovered bundle is what the recorder would have
written had it been stopped at that point (``hwtrace recover`` runs it
through ``hwtrace record``'s own bundle-making code).
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hwtrace.control.config import BufferConfig, validate
from hwtrace.control.ctl import Mode
from hwtrace.control.errors import TraceError

from . import execlog as xl
from .engine import EMULATED_CAPS, LOG_DIR_PREFIX, LOG_NAME, META_NAME, EmulatedEngine
from .ptgen import K_CALL, K_CALL_IND, K_FAR, K_JCC, K_JMP, K_JMP_IND, K_RET

MAX_META = 1 << 16
MAX_BUFFER = 1 << 36        # recorded buffers (all CPUs) larger than this are not believed

# Record payload sizes (without the type byte), execlog format version 1.
_FIXED = {
    xl.T_CTX: 12, xl.T_TIME: 8, xl.T_EXEC_PART: 6, xl.T_THREAD_START: 4,
    xl.T_THREAD_EXIT: 4, xl.T_PROC_START: 4, xl.T_PROC_EXIT: 4, xl.T_REAPED: 8, xl.T_SYSCALL: 8,
    xl.T_SYSRET: 16, xl.T_SIGNAL: 21, xl.T_SIGACTION: 20, xl.T_MUNMAP: 20,
}
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_BLOCK_HEAD = struct.Struct("<IIQHH")     # pid, id, pc, ninsn, nbytes
_MMAP_HEAD = struct.Struct("<IQQQIH")     # pid, addr, size, offset, prot, len
_SOURCES = {xl.SOURCE_QEMU: "qemu", xl.SOURCE_PTRACE: "ptrace"}


class SalvageError(ValueError):
    """Nothing usable in the log (one-line message)."""


def find_logs(directory: str | os.PathLike) -> list[Path]:
    """The execution logs a recorder left in ``directory``, oldest first
    (``hwtrace-xlog-*/exec.xlog``; symlinks are not followed)."""
    d = Path(directory)
    out = []
    try:
        entries = list(d.iterdir())
    except OSError:
        return []
    for p in entries:
        if not p.name.startswith(LOG_DIR_PREFIX) or p.is_symlink() or not p.is_dir():
            continue
        log = p / LOG_NAME
        if log.is_file() and not log.is_symlink():
            out.append(log)
    return sorted(out, key=lambda q: (q.stat().st_mtime_ns, q.parent.name))


def complete_prefix(data) -> int:
    """The length of the longest prefix of ``data`` (a whole log, header
    included) that is the header and whole records: where a record is cut
    short, or where the bytes stop being records (a zero type byte, as in a
    file extended but never written, or an unknown type), the log ends.
    0: not even a whole header."""
    try:
        _, off = xl.parse_header(data)
    except xl.ExecLogError:
        return 0
    end = len(data)
    while off < end:
        n = record_size(data, off)
        if n is None or off + n > end:
            break
        off += n
    return off


def record_size(data, off: int) -> int | None:
    """The size (type byte included) of the record at ``off``, as far as the
    bytes present tell; None if its type is not a record type or its
    length fields are cut off or inconsistent."""
    end = len(data)
    t = data[off]
    p = off + 1
    fixed = _FIXED.get(t)
    if fixed is not None:
        return 1 + fixed
    try:
        if t == xl.T_EXEC:
            (n,) = _U32.unpack_from(data, p)
            return 1 + 4 + 4 * n
        if t == xl.T_BLOCK:
            _pid, _id, _pc, ninsn, nbytes = _BLOCK_HEAD.unpack_from(data, p)
            q = p + _BLOCK_HEAD.size
            if q + ninsn > end:
                return None
            if sum(data[q:q + ninsn]) != nbytes:
                return None         # sizes that don't add up: not a record
            return 1 + _BLOCK_HEAD.size + ninsn + nbytes
        if t == xl.T_INSN:
            return 1 + 9 + data[p + 8]
        if t == xl.T_PROC_EXEC:
            (n,) = _U16.unpack_from(data, p + 1)
            return 1 + 3 + n
        if t == xl.T_MMAP:
            *_, n = _MMAP_HEAD.unpack_from(data, p)
            q = p + _MMAP_HEAD.size + n
            return q + 1 + data[q] - off
    except (struct.error, IndexError):
        return None
    return None


@dataclass(frozen=True)
class Settings:
    """How the recorder would have made the bundle (``recording.json``);
    ``recorded`` False: the file was missing or unreadable and these are
    ``hwtrace record``'s defaults."""
    mode: str = "cpu"
    config: dict = field(default_factory=dict)
    num_cpus: int = 0
    copy_images: bool = False
    elf_ranges: dict = field(default_factory=dict)    # n -> (path, begin, end)
    exe: str = ""
    recorded: bool = False
    recorder: dict | None = None    # {"pid", "start"} of the recording process
    command: list | None = None     # the program's argv as given (None: not said)


def recorder_identity(pid: int) -> dict | None:
    """{"pid", "start"} of a running process (:func:`hwtrace.control.collector.identity`)."""
    from hwtrace.control.collector import identity
    return identity(pid)


def recorder_running(st: Settings) -> int | None:
    """The pid of the recorder that wrote the log, if it still runs."""
    from hwtrace.control.collector import running
    return running(st.recorder)


def read_settings(log: str | os.PathLike) -> Settings:
    """The settings kept next to ``log`` (defaults when there are none or
    they don't make sense; never raises)."""
    p = Path(log).with_name(META_NAME)
    try:
        if p.is_symlink() or not p.is_file() or p.stat().st_size > MAX_META:
            return Settings()
        m = json.loads(p.read_text())
        if not isinstance(m, dict) or m.get("format") != "hwtrace-recording":
            return Settings()
        mode = m.get("mode")
        cfg = m.get("config")
        ncpu = m.get("num_cpus")
        ranges = {}
        for k, v in (m.get("elf_ranges") or {}).items():
            path, b, e = v
            if not (isinstance(path, str) and isinstance(b, int) and isinstance(e, int)):
                raise ValueError("bad elf range")
            if not 0 <= int(k) <= 3:
                raise ValueError("no such address range")
            ranges[int(k)] = (path, b, e)
        if mode not in ("cpu", "thread") or not isinstance(cfg, dict) \
                or isinstance(ncpu, bool) or not isinstance(ncpu, int) or not 0 < ncpu <= 4096:
            return Settings()
        exe = m.get("exe")
        try:
            c = validate(BufferConfig.from_dict(cfg), EMULATED_CAPS,
                         Mode.CPU if mode == "cpu" else Mode.THREAD)
        except TraceError:
            return Settings()
        if ncpu * (c.num_chunks << (12 + c.chunk_order)) > MAX_BUFFER:
            return Settings()
        rec = m.get("recorder")
        cmd = m.get("command")
        if not (isinstance(cmd, list) and 0 < len(cmd) <= 4096
                and all(isinstance(a, str) for a in cmd)):
            cmd = None
        return Settings(mode=mode, config=cfg, num_cpus=ncpu,
                        copy_images=bool(m.get("copy_images")), elf_ranges=ranges,
                        exe=exe if isinstance(exe, str) else "", recorded=True,
                        recorder=rec if isinstance(rec, dict) else None, command=cmd)
    except (OSError, ValueError, TypeError, AttributeError):
        return Settings()


@dataclass(frozen=True)
class Prepared:
    """A log cut to its whole records: ``path`` is the log to generate from
    (the original when nothing was cut), ``used``/``size`` its bytes,
    ``merged`` the bytes :func:`gather` appended to it first, ``unended``
    the blocks :func:`unended_transfers` cut or dropped."""
    path: Path
    source: str
    used: int
    size: int
    merged: int = 0
    unended: int = 0        # blocks cut or dropped (unended_transfers)

    @property
    def dropped(self) -> int:
        return self.size - self.used


#: the most bytes an in-place :func:`prepare` rewrites (from its first
#: edit to the end); more, and it makes a copy as usual
MAX_IN_PLACE = 64 << 20


def prepare(log: str | os.PathLike, scratch: str | os.PathLike, *,
            live: bool = False, in_place: bool = False) -> Prepared:
    """The usable log, as a copy in ``scratch`` (never generated from the
    file itself: a writer still running would change it under the
    generator): the records the QEMU plugin's buffer files hold first
    merged into ``log`` as the recorder would have (:func:`gather`; with
    ``live`` -- its recorder still runs -- or where ``log`` can't be
    written, added to the copy only: :func:`snapshot`), then cut to its
    whole records, without the blocks :func:`unended_transfers` drops; the
    ``.vdso`` next to it is copied too.

    ``in_place`` (not ``live``): nothing will want ``log`` as it is (its
    recorder is done with it): cut and edit ``log`` itself when that means
    rewriting at most :data:`MAX_IN_PLACE` bytes at its end (a long run's
    log is gigabytes; its edits are where its threads stopped, at the end).
    It is cut at its first edit before the edited tail is appended, so if
    this is interrupted it still is a log of whole records."""
    log = Path(log)
    merged = 0
    if not live:
        try:
            merged = gather(log)
        except SalvageError:
            live = True         # e.g. a read-only directory: leave it as it is
    Path(scratch).mkdir(parents=True, exist_ok=True)
    out = Path(scratch) / LOG_NAME
    src = log
    if live:
        # a writer still runs: copy first, add the buffer files to the copy
        shutil.copyfile(log, out)
        merged = snapshot(log, out)
        src = out
    # mapped, not read (a long recording's log is gigabytes): only the
    # records' heads are looked at, and the copy is made by the kernel
    with open(src, "rb") as f:
        total = os.fstat(f.fileno()).st_size
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if total else b""
        try:
            used = complete_prefix(data)
            if used == 0:
                raise SalvageError(f"{log}: not an execution log (no complete header)")
            header, start = xl.parse_header(data)
            source = _SOURCES.get(header.source)
            if source is None:
                raise SalvageError(f"{log}: unknown execution source {header.source}")
            edits = unended_transfers(data, start, used, header.source == xl.SOURCE_QEMU)
        finally:
            if total:
                data.close()
        if in_place and not live and used - (edits[0][0] if edits else used) <= MAX_IN_PLACE:
            _edit_in_place(f, used, edits)
            out = log
        elif src is not out or used != total or edits:
            tmp = out.with_name(LOG_NAME + ".tmp")
            with open(tmp, "wb") as g:
                at = 0
                for off, n, repl, _ in edits:
                    _copy_range(f.fileno(), g, at, off)
                    g.write(repl)
                    at = off + n
                _copy_range(f.fileno(), g, at, used)
            os.replace(tmp, out)
    vdso = log.with_name(LOG_NAME + ".vdso")
    if out != log and vdso.is_file() and not vdso.is_symlink():
        shutil.copyfile(vdso, out.with_name(LOG_NAME + ".vdso"))
    return Prepared(out, source, used, total, merged, sum(e[3] for e in edits))


def _edit_in_place(f, used: int, edits: list) -> None:
    """Make the log open (read-only) as ``f`` its first ``used`` bytes
    with ``edits`` made: cut at the first edit, then the tail appended."""
    first = edits[0][0] if edits else used
    f.seek(first)
    old = f.read(used - first)
    tail = bytearray()
    at = first
    for off, n, repl, _ in edits:
        tail += old[at - first:off - first]
        tail += repl
        at = off + n
    tail += old[at - first:]
    with open(f.name, "r+b") as g:
        g.truncate(first)
        g.seek(first)
        g.write(tail)


def _copy_range(fd: int, out, begin: int, end: int) -> None:
    """Append bytes ``[begin, end)`` of file ``fd`` to the open file ``out``."""
    out.flush()
    while begin < end:
        n = os.sendfile(out.fileno(), fd, begin, end - begin)
        if n <= 0:
            raise SalvageError(f"the log ended while being copied (at {begin})")
        begin += n


def unended_transfers(data, start: int, end: int, qemu_blocks: bool) -> list[tuple]:
    """Edits ``(offset, size, replacement, blocks changed)`` (by offset)
    that end each thread whose log just stops (killed: no exit, exec or
    system call after its last EXEC) before its last control transfer: the
    last block of that EXEC is replaced by a new BLOCK (a fresh id, defined
    just before the EXEC) without its final branch, or dropped if it is
    nothing but branches (and then the one before it is looked at); and
    each thread's last chunk is dropped if it holds nothing but CTX and
    TIME (the source began it and was killed before writing).

    Why: where a branch that ends a log went is not in the log, and the
    generator (``flow._end_thread``, ``ptgen_fast.c``) ends such a stream
    with FUP + TIP.PGD at the branch's next linear address: a decoder then
    follows a direct call or jump on past the end, or, in a cpu-mode stream
    where another thread follows, takes that thread's packets for a jcc,
    ret or indirect branch.  Whether the branch retired is unsure anyway:
    QEMU logs a block when it starts it.
    """
    from .flow import split_block
    blocks: dict = {}       # (pid, id) -> offset of its latest BLOCK record
    parent: dict = {}       # pid -> parent pid (fork: the child's table starts as the parent's)
    tail: dict = {}         # tid -> (offset, size, pid) of its last EXEC, or None
    chunk: dict = {}        # tid -> [offset of its last CTX, end of its chunk, only TIME in it]
    cur = None
    tid = pid = None
    max_id = 0
    off = start
    while off < end:
        n = record_size(data, off)
        t = data[off]
        if t == xl.T_CTX:
            if cur is not None:
                cur[1] = off
            pid, tid = _U32.unpack_from(data, off + 1)[0], _U32.unpack_from(data, off + 5)[0]
            cur = chunk[tid] = [off, end, True]
        elif t != xl.T_TIME and cur is not None:
            cur[2] = False
        if t == xl.T_BLOCK:
            bpid, bid = _U32.unpack_from(data, off + 1)[0], _U32.unpack_from(data, off + 5)[0]
            blocks[(bpid, bid)] = off
            max_id = max(max_id, bid)
        elif t == xl.T_EXEC:
            tail[tid] = (off, n, pid)
        elif t == xl.T_PROC_START:
            parent[pid] = _U32.unpack_from(data, off + 1)[0]
        elif t in _ENDS_UNKNOWN_TAIL:
            tail[tid] = None
        off += n
    # a thread's last chunk that holds nothing but its clock (the source
    # began it and was killed): it would resume the thread only to end it
    edits = [(c[0], c[1] - c[0], b"", 0) for c in chunk.values() if c[2]]
    next_id = max_id + 1
    for t in tail.values():
        if t is None:
            continue
        off, size, tpid = t
        (count,) = _U32.unpack_from(data, off + 1)
        ids = list(struct.unpack_from(f"<{count}I", data, off + 5))
        keep, cut, changed = len(ids), None, 0
        while keep:
            where = _find_block(blocks, parent, tpid, ids[keep - 1])
            if where is None:
                break
            _p, _b, pc, ninsn, nbytes = _BLOCK_HEAD.unpack_from(data, where + 1)
            q = where + 1 + _BLOCK_HEAD.size
            sizes, code = bytes(data[q:q + ninsn]), bytes(data[q + ninsn:q + ninsn + nbytes])
            shorter = False
            while sizes:
                parts = split_block(pc, sizes, code, last_only=qemu_blocks)
                if parts[-1].kind not in _UNENDED:
                    break
                sizes = sizes[:sum(b.ninsn for b in parts) - 1]     # without the branch
                code = code[:sum(sizes)]
                shorter = True
            if sizes:
                if shorter:
                    cut = (pc, sizes, code)
                    changed += 1
                break
            keep -= 1           # nothing but branches: the block goes
            changed += 1
        if not changed or next_id + 1 >= 1 << 32:
            continue
        repl = b""
        if cut is not None:
            pc, sizes, code = cut
            ids[keep - 1] = next_id
            repl = (bytes([xl.T_BLOCK]) + _BLOCK_HEAD.pack(tpid, next_id, pc, len(sizes), len(code))
                    + sizes + code)
            next_id += 1
        if keep:
            repl += bytes([xl.T_EXEC]) + _U32.pack(keep) + struct.pack(f"<{keep}I", *ids[:keep])
        edits.append((off, size, repl, changed))
    return sorted(edits)


#: the kinds (ptgen.K_*) of a last instruction whose outcome a stream can't
#: show when the thread's log just stops: jcc, jmp, call, indirect jmp/call,
#: ret, far transfers (not K_OTHER, K_TRAP, K_REP or a fault)
_UNENDED = frozenset((K_JCC, K_JMP, K_CALL, K_JMP_IND, K_CALL_IND, K_RET, K_FAR))

#: records after which a thread's end is not a killed run's arbitrary point
_ENDS_UNKNOWN_TAIL = frozenset((xl.T_SYSCALL, xl.T_SIGNAL, xl.T_THREAD_EXIT, xl.T_PROC_EXIT,
                                xl.T_PROC_EXEC, xl.T_INSN, xl.T_EXEC_PART))


def _find_block(blocks: dict, parent: dict, pid: int, bid: int) -> int | None:
    for _ in range(64):
        where = blocks.get((pid, bid))
        if where is not None or pid not in parent:
            return where
        pid = parent[pid]
    return None


def gather(log: str | os.PathLike) -> int:
    """Append to ``log`` the records the QEMU plugin's per-thread buffer
    files next to it hold that never reached it (its writer died before
    merging them): ``qemu.merge_buffers``, where the plugin keeps such
    files. Returns the bytes added."""
    from . import qemu
    if not qemu.buffer_files(log):
        return 0
    try:
        return int(qemu.merge_buffers(log) or 0)
    except (OSError, ValueError, struct.error) as e:
        raise SalvageError(f"{log}: merging the plugin's buffer files: {e}") from None


def snapshot(log: str | os.PathLike, copy: str | os.PathLike) -> int:
    """Append to ``copy`` (just copied from ``log``) the records the buffer
    files of ``log`` hold so far, a running thread's included, leaving them
    alone (``qemu.snapshot_buffers``). Returns the bytes added."""
    from . import qemu
    try:
        return int(qemu.snapshot_buffers(log, copy) or 0)
    except (OSError, ValueError, struct.error) as e:
        raise SalvageError(f"{log}: reading the plugin's buffer files: {e}") from None


class ReplayEngine(EmulatedEngine):
    """The emulated engine whose program already ran: ``run`` generates the
    streams and sideband of the session from the finished log ``log``
    (ignoring argv) exactly as the engine does after an execution."""

    def __init__(self, log: str | os.PathLike, source: str = "qemu",
                 num_cpus: int | None = None, exe: str = "", **kw: Any):
        super().__init__(source, num_cpus, **kw)
        self.log = os.fspath(log)
        if exe:
            self._exe = exe

    def run(self, session, argv, *, env=None, cwd=None) -> int:
        self._generate(session, self.log)
        return 0

    def attach(self, session, pid: int, *, duration: float | None = None) -> int:
        return self.run(session, [])
