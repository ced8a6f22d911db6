"""The branch record (spec/branch-trace.md): one control transfer.

``Branch`` is frozen and slotted; ``from`` is a Python keyword, so the field
is ``from_`` (the JSON key is ``from``).  :func:`to_array` packs many
records into a numpy structured array when numpy is importable (it is not
a dependency: without it the function raises ImportError).

Unknown ends.  A transfer into code the source does not trace, and the
transfer back, are two records whose unknown end is None (jsonl ``null``,
0 in the numpy array):

* ``syscall`` from the syscall/sysenter instruction, to None when the
  kernel is not traced (user-only Intel PT, or the ptrace stepper, which
  never sees the kernel); then ``sysret`` from None to where user code
  resumes, when that is the instruction after the syscall.  A syscall
  whose return lands elsewhere (a signal handler entered on the way out,
  or ``rt_sigreturn`` resuming interrupted code) comes back with ``iret``
  (Linux returns through IRET when it rewrote the user context).
* ``interrupt`` from the interrupted instruction (an interrupt,
  exception or signal delivery: the decoded trace's asynchronous disable,
  FUP+TIP.PGD, or the stepper's signal records) to None; then ``iret``
  from None to the resume address -- for a signal delivery, the handler.
  ``int n``/``int3`` instructions into an untraced kernel likewise give
  ``interrupt`` to None, then ``iret``.
* Where tracing begins with no known exit before it (the first enable of
  a process, i.e. the return from the kernel's execve, or the first
  instruction the stepper logs), the record is ``sysret`` from None to the
  first traced instruction; an enable after an unknown exit (after an
  overflow/decode error, or a disable with no transfer pending) is
  ``iret`` from None.
* A transfer leaving traced code for another reason (out of an IP filter
  range) keeps its kind, with ``to`` = the trace's address or None; when
  it was a call and tracing resumes at its fall-through, the resume is a
  ``return`` from None (the callee ran untraced), otherwise ``iret``.

Where the kernel is traced (the OS bit of a decoded trace), the records
keep both real addresses.  A record from None has the depth of the code
it resumes (after a handler's entry or a sigreturn), and the mask's
address ranges select it by ``to``.
"""

from __future__ import annotations

from dataclasses import dataclass

#: every kind of the spec's table, in its order
KINDS = ("call", "return", "jump", "cond", "cond_not_taken", "indirect_call",
         "indirect_jump", "far", "syscall", "sysret", "interrupt", "iret")
KIND_CODE = {k: i for i, k in enumerate(KINDS)}
#: what "all" means: every kind but cond_not_taken (only if asked)
ALL_KINDS = frozenset(KINDS) - {"cond_not_taken"}


@dataclass(frozen=True, slots=True)
class Branch:
    pid: int | None
    tid: int | None
    kind: str
    from_: int | None     # address of the branch instruction (None: untraced code)
    to: int | None        # address execution continued at (None: untraced code)
    # the source's latest timestamp at the branch: the stepper's TIME record
    # for the run it is in (host TSC or instruction count), or the decoded
    # trace's latest TSC; None when the source has none
    time: int | None = None
    # call depth of the code executing the branch, 0 where tracing turned
    # on (calls +1, returns -1, a signal handler +1 until its sigreturn)
    depth: int | None = None

    def key(self) -> tuple[str, int | None, int | None]:
        """(kind, from, to): what two sources of one execution agree on."""
        return (self.kind, self.from_, self.to)

    def to_json(self, lookup=None) -> dict:
        """The jsonl object: pid, tid, kind, from, to; time and depth where
        known; from_sym/to_sym when ``lookup(addr) -> str | None`` names them."""
        d = {"pid": self.pid, "tid": self.tid, "kind": self.kind,
             "from": self.from_, "to": self.to}
        if self.time is not None:
            d["time"] = self.time
        if self.depth is not None:
            d["depth"] = self.depth
        if lookup is not None:
            s = None if self.from_ is None else lookup(self.from_)
            if s is not None:
                d["from_sym"] = s
            s = None if self.to is None else lookup(self.to)
            if s is not None:
                d["to_sym"] = s
        return d


_DTYPE = None


def dtype():
    """The numpy dtype of :func:`to_array` (unknown pid/tid/time: -1;
    unknown depth: INT32_MIN; unknown from/to: 0; kind: index into KINDS).
    Made once: a structured dtype costs microseconds to build, and the
    decoded source asks for it per run of records (~17,000 times for a
    recording with as many system calls)."""
    global _DTYPE
    if _DTYPE is None:
        import numpy as np
        _DTYPE = np.dtype([("pid", "<i8"), ("tid", "<i8"), ("kind", "u1"),
                           ("from", "<u8"), ("to", "<u8"), ("time", "<i8"),
                           ("depth", "<i4")])
    return _DTYPE


def concat(parts: list):
    """Record arrays of one dtype end to end (np.concatenate checks and
    promotes a structured dtype per array: most of the time for many
    small chunks; these are copied as bytes)."""
    import numpy as np
    if len(parts) == 1:
        return parts[0]
    dt = parts[0].dtype
    if not all(p.dtype == dt and p.flags.c_contiguous for p in parts):
        return np.concatenate(parts)
    return np.frombuffer(bytearray().join(parts), dt)


def iter_arrays(records, chunk: int = 1 << 16):
    """Records (any iterable) -> numpy structured arrays of up to ``chunk``
    records each: a long trace in bounded memory."""
    import numpy as np
    dt = dtype()
    buf = []
    for r in records:
        buf.append((-1 if r.pid is None else r.pid, -1 if r.tid is None else r.tid,
                    KIND_CODE[r.kind], r.from_ or 0, r.to or 0,
                    -1 if r.time is None else r.time,
                    -(1 << 31) if r.depth is None else r.depth))
        if len(buf) >= chunk:
            yield np.array(buf, dtype=dt)
            buf = []
    if buf:
        yield np.array(buf, dtype=dt)


def to_array(records, chunk: int = 1 << 16):
    """Records (any iterable) -> one numpy structured array (built in
    chunks, so the records are never all Python objects at once)."""
    import numpy as np
    parts = list(iter_arrays(records, chunk))
    if not parts:
        return np.array([], dtype=dtype())
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
