"""Address spaces: which process's code a trace runs at each point.

A cpu-mode stream runs whatever the scheduler put on that CPU; a bundle's
sideband says what that was (``Process`` records with their CR3, ``Mmap``
records with the files each process mapped, ``Switch`` records per CPU
with their time).  This module turns that into one lazily loaded
:class:`~hwtrace.flow.image.Image` per address space and switches a flow
decoder between them:

* :class:`AddressSpaces` builds the spaces: one per process, and a new one
  after an exec (a later ``Process`` record of the same pid with a new
  CR3 or a new executable).  A fork child starts with its parent's
  mappings as they were at the fork, then its own on top (a record that
  repeats one it inherited changes nothing).  Mappings of pid -1 (the
  kernel) are in every space.  Files are located by the caller's
  ``resolve(file, build_id)`` (a bundle's trust rules); sections are read
  on first use and shared between spaces that map the same bytes.
* :class:`Timeline` says which space a stream runs at a time: for a CPU
  stream the ``Switch`` records of that CPU (of a CR3-filtered trace, the
  processes of other CR3s ran nothing it shows: their stretches are no
  one's), for a thread stream its process's exec epochs.
* :class:`SpaceSwitcher` wraps an instruction or block decoder (same
  verbs).  When the decoder reports a paging event (PIP) whose CR3 the
  sideband knows, it selects that CR3's space (and from then on PIPs
  decide).  Otherwise, when tracing (re)starts (an enable, an overflow
  with IP, a synchronization), it selects by time, the way a user-only
  cpu-wide trace must (context switches happen while tracing is off):

  - on an instruction-count clock (the emulated engine's: one tick per
    traced instruction, :class:`InsnClock`), at its exact time: the
    last TSC's plus the instructions decoded since (the last switch at
    or before);
  - with CYC packets, at a cycle-accurate time (:class:`CycClock`: last
    TSC + CYC cycles; libipt's time model re-anchors at MTCs and trails
    the true time by a few cycles, too much where a process runs only a
    dozen instructions between switches) of the packet that published
    the event (not of where the decoder has read to: the CYCs after it
    count code run after it): the last switch at or before;
  - at a PSB+ inside a run (a status update: tracing goes on), at its
    own TSC packet's time, taken where its FUP's IP runs;
  - else within the window the time stamps allow (the event's time and
    the first timing packet's after the enable, a PSB+'s TSC too; a
    window that ends in an idle stretch ends before it, nothing being
    traced there): if several processes
    fit, the one that left user code exactly at the enable's IP (learnt
    from the disables; one switched out at or before the event's time is
    no candidate); else the switch before the window's end -- where more
    than one of them left at that IP this is a guess, noted
    (:attr:`SpacePlan.ambiguous`) for ``hwtrace decode`` to warn of;
  - and if that space doesn't map the IP, the next one in the timeline
    that does.

  Coarse timing (TSC only) can't place switches that fall between two
  PSBs; ``hwtrace decode`` warns then.  Switching sets the decoder's
  image; the decoded instructions stay with each image
  (:class:`~hwtrace.flow.fetch.InsnCache`), so a switch costs nothing and
  one space's code is never served for another's.

No I/O besides reading image files (lazily); no printing: the switcher
reports each switch through a callback.
"""

from __future__ import annotations

import bisect
import os
from collections import deque, namedtuple
from collections.abc import Callable, Iterable

from hwtrace._records import Fields, Typed

from .image import Image, ImageError, Section

_CR3_MASK = 0xFFFFFFFFFFFFFFE0      # PIP carries CR3[63:5]
LOOKAHEAD = 64                      # timeline entries tried for an IP
PEEK_PACKETS = 256                  # packets searched for the next time stamp
RECENT_PACKETS = 8                  # CycClock: packet starts it keeps the time of
_TIMING = frozenset(("tsc", "mtc", "cyc", "tma", "cbr"))


# Records as NamedTuples and plain classes, not dataclasses: every command
# that opens a bundle creates them at start-up (see hwtrace._records).


class MappedFile(Typed, namedtuple("MappedFile",
                                   "start size offset path file")):
    """Bytes ``[offset, offset+size)`` of local file ``path`` at ``start``;
    ``file``: the name the sideband recorded."""
    __slots__ = ()


class AddressSpace(Fields):
    """A process's address space from ``time`` on (until its next exec);
    equal only to itself."""

    _fields = ("pid", "cr3", "time", "comm", "exe", "ppid", "mappings",
               "_image", "_sections", "_extra")

    def __init__(self, pid: int, cr3: int = 0, time: int = 0, comm: str = "",
                 exe: str = "", ppid: int = 0, mappings: list | None = None,
                 _image: Image | None = None, _sections: dict | None = None,
                 _extra: tuple = ()):
        self.pid = pid
        self.cr3 = cr3
        self.time = time
        self.comm = comm
        self.exe = exe
        self.ppid = ppid
        self.mappings = [] if mappings is None else mappings
        self._image = _image
        self._sections = _sections
        self._extra = _extra

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    @property
    def image(self) -> Image:
        """The space's image, built on first use (sections load lazily)."""
        if self._image is None:
            self._image = _build_image(self, self._sections
                                       if self._sections is not None else {})
            for extend in self._extra:
                extend(self._image)
        return self._image

    def maps(self, ip: int) -> bool:
        return self.image.find(ip) is not None

    @property
    def label(self) -> str:
        return f"{self.pid} ({self.comm})" if self.comm else str(self.pid)


def _build_image(space: AddressSpace, sections: dict) -> Image:
    image = Image(name=f"pid {space.pid}")
    for m in space.mappings:
        key = (m.path, m.offset, m.size)
        sec = sections.get(key)
        if sec is None:
            try:
                fsize = os.path.getsize(m.path)
            except OSError:
                continue
            size = min(m.size, fsize - m.offset)
            if size <= 0:
                continue
            try:
                sec = Section.from_file(m.path, m.offset, size)
            except ImageError:
                continue
            sections[key] = sec
        # A shared section keeps the isid of the first image it joined.
        image.add(sec, m.start)
    return image


def _cr3_excluded(space: AddressSpace, cr3_match: int) -> bool:
    """Whether a CR3 filter for ``cr3_match`` keeps ``space`` out of the
    trace: its CR3 is known (0: the sideband doesn't say, e.g. perf's) and
    differs in the bits the filter compares (63:5)."""
    return bool(space.cr3) and (space.cr3 ^ cr3_match) & _CR3_MASK != 0


def _at(lst, time):
    """The last of ``lst`` (spaces in time order) begun at or before
    ``time`` (None: the latest; before them all: the first)."""
    if not lst:
        return None
    if time is None:
        return lst[-1]
    best = lst[0]
    for s in lst:
        if s.time <= time:
            best = s
    return best


class AddressSpaces:
    """All address spaces of a sideband, located through ``resolve``.

    ``resolve(file, build_id)`` returns a local path (str / PathLike) or
    None; files it can't find are listed in :attr:`missing` as
    ``(pid, file, build_id)`` and left out of the images.
    """

    def __init__(self, records: Iterable, resolve: Callable | None = None,
                 extend: Callable | None = None):
        from hwtrace.bundle import Mmap, Process, Switch, Thread
        self.resolve = resolve or (lambda file, build_id: file)
        # extend(image) adds to every space's image (e.g. --raw/--elf).
        self._extra = (extend,) if extend is not None else ()
        self.spaces: list[AddressSpace] = []
        self.missing: list[tuple[int, str, str]] = []
        self._missing: set = set()
        self._by_pid: dict[int, list[AddressSpace]] = {}
        self._by_cr3: dict[int, list[AddressSpace]] = {}
        self._sections: dict = {}
        self._resolved: dict = {}
        self.switches: dict[int, list] = {}
        self.thread_pid: dict[int, int] = {}
        procs, mmaps = [], []
        for r in records:
            t = type(r)
            if t is Process:
                procs.append(r)
            elif t is Mmap:
                mmaps.append(r)
            elif t is Switch:
                self.switches.setdefault(r.cpu, []).append(r)
            elif t is Thread:
                self.thread_pid.setdefault(r.tid, r.pid)
        for sw in self.switches.values():
            sw.sort(key=lambda s: s.time)           # stable: file order on ties
        self._build(procs, mmaps)

    # -- construction ---------------------------------------------------------
    def _new_space(self, pid, cr3=0, time=0, comm="", exe="", ppid=0):
        s = AddressSpace(pid, cr3, time, comm, exe, ppid, [], None,
                         self._sections, self._extra)
        self.spaces.append(s)
        self._by_pid.setdefault(pid, []).append(s)
        return s

    def _build(self, procs, mmaps) -> None:
        procs = sorted(procs, key=lambda p: p.time)
        for p in procs:
            cur = self._by_pid.get(p.pid)
            if cur:
                last = cur[-1]
                new_cr3 = p.cr3 and p.cr3 != last.cr3
                new_exe = p.exe and p.exe != last.exe       # an exec
                if not (new_cr3 or new_exe):
                    if p.comm:
                        last.comm = p.comm
                    if p.exe and not last.exe:
                        last.exe = p.exe
                    continue
            self._new_space(p.pid, p.cr3, p.time, p.comm, p.exe, p.ppid)
        kernel = []
        own: dict[int, list] = {}
        for m in sorted(mmaps, key=lambda m: m.time):
            if m.pid == -1:
                kernel.append(m)
                continue
            sp = self.of_pid(m.pid, m.time)
            if sp is None:
                sp = self._new_space(m.pid, time=m.time)
            own.setdefault(id(sp), []).append(m)
        # (MappedFile or None, time it appeared) per space, in add order.
        entries: dict[int, list] = {}

        def fill(sp, depth=0):
            if id(sp) in entries:
                return entries[id(sp)]
            out = entries[id(sp)] = [(self._mapped(sp.pid, m), m.time)
                                     for m in kernel]
            inherited = set()
            first = self._by_pid[sp.pid][0] is sp
            parent = self.of_pid(sp.ppid, sp.time) if first and sp.ppid else None
            if parent is not None and parent is not sp and depth < 64:
                for mf, t in fill(parent, depth + 1)[len(kernel):]:
                    if t <= sp.time:
                        out.append((mf, t))
                        if mf is not None:
                            inherited.add(mf)
            for m in own.get(id(sp), ()):
                mf = self._mapped(sp.pid, m)
                if mf is not None and mf in inherited:
                    continue        # listed again for the child: no change
                out.append((mf, m.time))
            sp.mappings = [mf for mf, _ in out if mf is not None]
            return out

        for sp in self.spaces:
            fill(sp)
        for sp in self.spaces:
            if sp.cr3:
                self._by_cr3.setdefault(sp.cr3 & _CR3_MASK, []).append(sp)

    def _mapped(self, pid: int, m) -> MappedFile | None:
        key = (m.file, m.build_id)
        if key not in self._resolved:
            path = self.resolve(m.file, m.build_id)
            self._resolved[key] = None if path is None else os.fspath(path)
        path = self._resolved[key]
        if path is None:
            key = (pid, m.file, m.build_id)
            if key not in self._missing:
                self._missing.add(key)
                self.missing.append(key)
            return None
        return MappedFile(m.start, m.size, m.offset, path, m.file)

    # -- queries --------------------------------------------------------------
    def of_pid(self, pid: int, time: int | None = None) -> AddressSpace | None:
        """The space of ``pid`` at ``time`` (None: its latest)."""
        lst = self._by_pid.get(pid)
        return _at(lst, time)

    def of_cr3(self, cr3: int, time: int | None = None) -> AddressSpace | None:
        lst = self._by_cr3.get(cr3 & _CR3_MASK)
        return _at(lst, time)

    def cr3_spaces(self) -> list:
        """The spaces a paging event (PIP) can select: those whose CR3
        the sideband gives."""
        return [s for lst in self._by_cr3.values() for s in lst]

    def union(self) -> AddressSpace:
        """Every mapping of every space in one (what a decoder without
        sideband switching would use); later spaces win overlaps."""
        u = AddressSpace(-1, comm="all", _sections=self._sections,
                         _extra=self._extra)
        seen = set()
        for s in self.spaces:
            for mf in s.mappings:
                if mf not in seen:
                    seen.add(mf)
                    u.mappings.append(mf)
        return u

    def missing_for(self, spaces) -> list[tuple[int, str, str]]:
        pids = {s.pid for s in spaces if s is not None}
        return [m for m in self.missing if m[0] in pids]

    def cpu_timeline(self, cpu: int, cr3_match: int | None = None) -> "Timeline | None":
        """Who ran on ``cpu`` when (None without switch records for it).

        ``cr3_match``: the trace was CR3-filtered (CR3Filter, with this
        IA32_RTIT_CR3_MATCH): ContextEn, and so every packet of code, needs
        CR3 to match, so a process whose recorded CR3 differs ran nothing
        the stream shows -- its stretches are entries of no space, like the
        idle task's, and a coarse time stamp can't put an enable in them."""
        sw = self.switches.get(cpu)
        if not sw:
            return None
        entries = []
        for i, s in enumerate(sw):
            entries.append((s.time, self.of_pid(s.next_pid, s.time)
                            if s.next_pid >= 0 else None))
            # the process execs while it runs here: its new image from then on
            end = sw[i + 1].time if i + 1 < len(sw) else None
            for sp in self._by_pid.get(s.next_pid, ()) if s.next_pid >= 0 else ():
                if s.time < sp.time and (end is None or sp.time < end):
                    entries.append((sp.time, sp))
        if cr3_match is not None:
            entries = [(t, sp if sp is None or not _cr3_excluded(sp, cr3_match) else None)
                       for t, sp in entries]
        return Timeline(entries)

    def for_stream(self, cpu: int | None = None, tid: int | None = None,
                   pid: int | None = None, cr3_match: int | None = None) -> tuple:
        """``(timeline or None, initial space)`` for a bundle stream: a cpu
        stream follows that CPU's switches (``cr3_match``: of the processes
        a CR3 filter let through, :meth:`cpu_timeline`), a thread stream
        its process (``pid``, else the tid's from its Thread record);
        without sideband to go by, the one space there is, or all mappings
        in one."""
        if tid is not None:
            if pid is None:
                pid = self.thread_pid.get(tid)
            timeline = self.thread_timeline(pid) if pid is not None else None
        else:
            timeline = self.cpu_timeline(cpu, cr3_match) if cpu is not None else None
        if timeline is not None:
            first = next((s for _, s in timeline.entries if s is not None), None)
            if first is not None:
                return timeline, first
        if len(self.spaces) == 1:
            return None, self.spaces[0]
        return None, self.union()

    def thread_timeline(self, pid: int) -> "Timeline | None":
        lst = self._by_pid.get(pid)
        if not lst:
            return None
        return Timeline([(s.time, s) for s in lst])


class Timeline:
    """``(time, space or None)`` in time order: from ``time`` on, ``space``
    runs (None: nothing traced, e.g. the idle task)."""

    def __init__(self, entries: list):
        self.entries = list(entries)
        self.times = [t for t, _ in self.entries]

    def spaces(self) -> list:
        out = []
        for _, s in self.entries:
            if s is not None and s not in out:
                out.append(s)
        return out

    def index_at(self, time: int, before: int | None = None) -> int:
        """The last entry whose time is <= ``time``, or, with ``before``
        (a later bound), the last one whose time is < ``before`` (0 if
        none)."""
        if before is not None and before > time:
            return max(bisect.bisect_left(self.times, before) - 1, 0)
        return max(bisect.bisect_right(self.times, time) - 1, 0)

    def choose(self, time: int | None, ip: int | None,
               current: AddressSpace | None,
               before: int | None = None) -> AddressSpace | None:
        """The space running at ``time`` that maps ``ip``: the timeline's
        entry at ``time`` if it maps ``ip`` (or ``ip`` is unknown), else
        the first later entry that does; without a time, the current space
        if it maps ``ip``, else the first entry from the current one on.

        ``before``: the point in question lies in ``[time, before]`` (the
        time stamps of the timing packets around it): a switch recorded
        in that window, strictly before ``before``, already happened --
        unless it switched to no one (idle: nothing traced there), then
        the window's last process before it runs."""
        ents = self.entries
        if not ents:
            return current
        if time is None:
            if current is not None and (ip is None or current.maps(ip)):
                return current
            k = 0
            for i, (_, s) in enumerate(ents):
                if s is current:
                    k = i
                    break
        else:
            k = self.index_at(time, before)
            if before is not None and ents[k][1] is None:
                # the window ends in an idle stretch (nothing traced):
                # the enable is of the process that ran before it in the
                # window, not of one after the window
                j, lo = k, self.index_at(time)
                while j > lo and ents[j][1] is None:
                    j -= 1
                if ents[j][1] is not None:
                    k = j
        first = ents[k][1]
        if ip is None:
            return first if first is not None else current
        for i in range(k, min(len(ents), k + LOOKAHEAD)):
            s = ents[i][1]
            if s is not None and s.maps(ip):
                return s
        return first if first is not None else current


class CycClock:
    """Cycle-accurate time stamps of trace offsets: the last TSC packet plus
    the CYC cycles since, converted at the nominal/core ratio (``nom_freq``
    / the last CBR).  Finer than the flow decoder's time (libipt's model
    re-anchors at every MTC, so it can trail the true time by a few
    cycles): with CYC on, a context switch recorded at time T is placed at
    the first enable whose time is at or after T.  Offsets are asked in
    increasing order (a smaller one starts over, unless it is the start of
    one of the last few packets that are not timing packets, whose times
    are kept); None where the time is
    unknown (no TSC yet, after an overflow or a decode error, no CBR or
    nominal frequency).

    An event's time is :meth:`at` the offset of the packet that published
    it, not where the decoder has read to: the query decoder reads on past
    the timing packets after it (a TIP.PGE, then a CYC), and the flow
    decoder may fetch the next event (the FUP and TIP.PGD that end a
    short run) before it delivers this one; those CYCs count cycles spent
    after the event, in the enabled code.  Counted in, an enable whose
    process ran only a few instructions before the next switch looked as
    late as that switch, and the process switched in there was taken for
    it (a fork child's first dozen instructions, up to its first system
    call, given to its parent, which had stopped at the same IP).  Where
    no packet is known (after a synchronization), :meth:`event_at` the
    decoder's position: the time of the last packet before it that is
    not a timing packet."""

    def __init__(self, data, nom_freq: int):
        self.nom = nom_freq
        self._data = data
        self._restart()

    def _restart(self) -> None:
        from hwtrace.pt.decoder import PacketDecoder
        self._pk = PacketDecoder(self._data)
        self._pos = 0
        self.tsc = None
        self.cycles = 0
        self.cbr = 0
        self._synced = False
        self._event = (None, 0, 0)      # (tsc, cycles, cbr) after the last
        #                                 packet that is not a timing packet
        # (offset, tsc, cycles, cbr) at the starts of the last few packets
        # that are not timing packets (an event's packet may lie behind
        # where the clock was last asked: no walk from the start for it)
        self._recent = deque(maxlen=RECENT_PACKETS)

    def event_at(self, offset: int) -> int | None:
        """The time at the end of the last packet before ``offset`` that is
        not a timing packet (TSC, MTC, CYC, TMA, CBR): the time of the
        event a query decoder positioned at ``offset`` reported."""
        self._walk(offset)
        return self._time(*self._event)

    def at(self, offset: int) -> int | None:
        if offset < self._pos:
            for o, tsc, cycles, cbr in self._recent:
                if o == offset:
                    return self._time(tsc, cycles, cbr)
        self._walk(offset)
        return self._time(self.tsc, self.cycles, self.cbr)

    def _time(self, tsc, cycles, cbr) -> int | None:
        if tsc is None or not cbr or not self.nom:
            return None
        return tsc + cycles * self.nom // cbr

    def _walk(self, offset: int) -> None:
        from hwtrace.pt.errors import PtError
        if offset < self._pos:
            self._restart()
        pk = self._pk
        while self._pos < offset:
            if not self._synced:
                r = pk.sync_forward()
                if r.__class__ is PtError:
                    self._pos = len(self._data)
                    break
                self._synced = True
                self._pos = r
                continue
            p = pk.next()
            if p.__class__ is PtError:
                self._synced = False        # resync at the next PSB
                self.tsc = None
                self._event = (None, 0, 0)
                continue
            self._pos = p.offset + p.size
            t = p.type
            if t not in _TIMING:
                self._recent.append((p.offset, self.tsc, self.cycles, self.cbr))
            if t == "cyc":
                self.cycles += p.value
            elif t == "tsc":
                self.tsc = p.tsc
                self.cycles = 0
            elif t == "cbr":
                self.cbr = p.ratio
            elif t == "ovf":
                self.tsc = None
            if t not in _TIMING:
                self._event = (self.tsc, self.cycles, self.cbr)


class InsnClock:
    """Exact times on an instruction-count clock: where a stream's clock
    counts exactly its traced instructions (the emulated engine's:
    :func:`hwtrace.bundle.insn_clock_counted`), the time at any point of
    the trace is the last TSC packet's time plus the instructions decoded
    since -- a context switch recorded at time T is placed at the enable
    whose time is T, however far apart the trace's time stamps are (a
    TSC-only trace has one per PSB; MTCs, at 2**mtc_freq ART ticks, are
    hundreds of instructions apart).

    The clock jumps only while tracing is off (an idle CPU, the
    engine's TSC packet before the next enable says where to), so a
    time stamp later than the count's is such a jump, taken at the
    instruction count it is first seen at (the enable's: nothing ran
    since the TSC); one no later (a TSC repeating the count, or libipt's
    MTC-estimated time, which trails the clock) adds nothing.  A
    synchronization re-anchors (instructions may have been lost before
    it); after an overflow the count is unknown until then.

    ``at(tsc, n)``: the time with the decoder's time stamp ``tsc`` (None:
    unknown) after ``n`` instructions; None before the first anchor."""

    __slots__ = ("_tsc", "_n", "valid")

    def __init__(self):
        self._tsc = None
        self._n = 0
        self.valid = True

    def anchor(self, tsc: int | None, n: int) -> None:
        """A synchronization: the time is ``tsc`` (None: unknown)."""
        self._tsc = tsc
        self._n = n
        self.valid = tsc is not None

    def lose(self) -> None:
        """Instructions went by uncounted (an overflow)."""
        self.valid = False

    def at(self, tsc: int | None, n: int) -> int | None:
        if not self.valid:
            return None
        if self._tsc is None:
            if tsc is None:
                return None
            self._tsc, self._n = tsc, n
            return tsc
        now = self._tsc + n - self._n
        if tsc is not None and tsc > now:
            self._tsc, self._n = tsc, n
            return tsc
        return now


class SpaceSwitcher:
    """A flow decoder (:class:`~hwtrace.flow.insn.InsnDecoder` or
    :class:`~hwtrace.flow.block.BlockDecoder`) that runs each part of the
    trace in the right address space.

    ``spaces`` gives the CR3 lookup for paging events; ``timeline`` (may be
    None) the time-based choice; ``initial`` the space to start in.
    ``on_switch(space, offset)`` is called whenever the space changes.
    ``ambiguous`` (a set, may be shared): where an enable could not be
    placed -- the time stamps allow several processes and more than one
    of them left user code exactly at its IP -- the decoder's offset is
    added (the choice then falls to time alone; :attr:`SpacePlan.ambiguous`).
    ``insn_clock``: the stream's clock counts exactly its traced
    instructions; an enable is then placed at its exact time
    (:class:`InsnClock`: the switcher counts the instructions the decoder
    returns, or asks the compiled core for its count, ``decoded``).
    """

    #: the event types :meth:`event` acts on (the compiled core calls back
    #: for these only: a PSB+'s exec-mode and CBR updates are most events);
    #: an instance's :attr:`events` are those of them that can change its
    #: choice, and :attr:`syncs` whether a synchronization can
    EVENTS = frozenset({"paging", "async_paging", "enabled", "overflow",
                        "disabled", "async_disabled"})
    PAGING = frozenset({"paging", "async_paging"})

    def __init__(self, dec, spaces: AddressSpaces | None, timeline: Timeline | None,
                 initial: AddressSpace | None = None,
                 on_switch: Callable | None = None, cyc: bool = False,
                 ambiguous: set | None = None, insn_clock: bool = False):
        self.dec = dec
        self.flow = getattr(dec, "insn", dec)       # the InsnDecoder
        self.spaces = spaces
        self.timeline = timeline
        self.on_switch = on_switch
        self.space = None
        self.saw_pip = False
        self.switches = 0
        self._peek = None
        self._resume: dict = {}         # space -> IP it left user code at
        self.ambiguous = ambiguous if ambiguous is not None else set()
        # With CYC packets and a nominal frequency: cycle-accurate times.
        self._clock = None
        cfg = getattr(self.flow, "config", None)
        q = getattr(self.flow, "query", None)
        if cyc and timeline is not None and len(timeline.entries) > 1 and \
                cfg is not None and cfg.nom_freq and q is not None:
            self._clock = CycClock(q._pkt.buffer, cfg.nom_freq)
        # On an instruction-count clock: exact times from the count.
        self._iclock = None
        self._n = 0
        if insn_clock and self._clock is None and timeline is not None and \
                len(timeline.entries) > 1:
            self._iclock = InsnClock()
            if hasattr(self.flow, "decoded"):
                self._count = self._core_count
            else:
                # the twin: count what the decoder returns (the compiled
                # core counts its own)
                self.next = self._next_block if dec is not self.flow \
                    else self._next_insn
        if initial is not None:
            self._select(initial)
        # Time decides only between spaces: with a timeline of the initial
        # space alone (a one-process stream), or none, no enable,
        # synchronization or disable (which only feeds the choice by
        # time) can change the space -- only a PIP whose CR3 the sideband
        # gives another space can, and once one has, time no longer
        # decides.  The events that can't change anything are not acted
        # on (nor, in the compiled core, called back for).
        by_time = timeline is not None and (
            initial is None or any(s is not initial for s in timeline.spaces()))
        by_pip = spaces is not None and any(
            s is not initial for s in spaces.cr3_spaces())
        self.syncs = by_time
        self.events = self.EVENTS if by_time else \
            self.PAGING if by_pip else frozenset()

    # -- the decoder's verbs ---------------------------------------------------
    @property
    def offset(self) -> int:
        return self.dec.offset

    @property
    def sync_offset(self) -> int:
        return self.dec.sync_offset

    def next(self):
        return self.dec.next()

    def _next_insn(self):
        r = self.dec.next()
        if r.__class__ is tuple or getattr(r, "insn", None) is not None:
            self._n += 1
        return r

    def _next_block(self):
        r = self.dec.next()
        b = r[1] if r.__class__ is tuple else getattr(r, "block", None)
        if b is not None:
            self._n += b.ninsn
        return r

    def _count(self) -> int:
        """Instructions decoded so far (the twin's, counted by next)."""
        return self._n

    def _core_count(self) -> int:
        """Instructions decoded so far (the compiled core's count)."""
        return self.flow.decoded

    def time(self):
        return self.dec.time()

    def sync_forward(self):
        return self._after_sync(self.dec.sync_forward())

    def sync_backward(self):
        return self._after_sync(self.dec.sync_backward())

    def sync_set(self, offset: int):
        return self._after_sync(self.dec.sync_set(offset))

    def resync(self):
        return self._after_sync(self.dec.resync())

    def event(self):
        r = self.dec.event()
        if r.__class__ is tuple and r[1].type in self.events:
            ev = r[1]
            t = ev.type
            if t == "paging" or t == "async_paging":
                sp = self.spaces.of_cr3(ev.cr3, self._now(ev)) \
                    if self.spaces is not None else None
                if sp is not None:
                    # CR3s the sideband knows: PIPs decide from now on
                    # (unknown ones, e.g. perf's CR3 0, leave it to time)
                    self.saw_pip = True
                    self._select(sp)
            elif (t == "enabled" or t == "overflow") and not ev.ip_suppressed:
                if self._iclock is not None:
                    if t == "overflow":
                        self._iclock.lose()
                    elif ev.status_update and ev.has_tsc:
                        # a PSB+: its TSC is the time where its FUP's IP runs
                        self._iclock.anchor(ev.tsc, self._count())
                self._by_time(ev.tsc if ev.has_tsc else None, ev.ip, t == "enabled",
                              event=True,
                              psb=t == "enabled" and ev.status_update and ev.has_tsc)
            elif (t == "disabled" or t == "async_disabled") and \
                    not ev.status_update and self.space is not None:
                # where this process goes on when it comes back
                self._resume[self.space] = self.flow.ip
        return r

    # -- choosing ------------------------------------------------------------------
    def _now(self, ev=None):
        if ev is not None and ev.has_tsc:
            return ev.tsc
        tsc, _, _, have = self.dec.time()
        return tsc if have else None

    def _after_sync(self, r):
        if r.__class__ is int and self.syncs:
            if self._iclock is not None:
                # the time at a PSB is its TSC's, whatever went before
                self._iclock.anchor(self._now(), self._count())
            if self.flow.enabled:
                self._by_time(self._now(), self.flow.ip)
        return r

    def _by_time(self, time, ip, enable: bool = False, event: bool = False,
                 psb: bool = False) -> None:
        """Select the space that runs at ``time`` (``enable``: the time
        stamp of a TIP.PGE's enable -- the first timing packet after that
        packet bounds it, see :meth:`_time_ahead`; ``event``: of an event
        the decoder is processing, else of a synchronization; ``psb``:
        ``time`` is a PSB+'s own, the TSC packet in it, taken where its
        FUP's IP runs -- no window: a switch recorded after it, before the
        next timing packet, came after the PSB)."""
        tl = self.timeline
        if tl is None or self.saw_pip:
            return
        exact = None
        if self._clock is not None:
            # the cycle-accurate time of the event's own packet: the
            # decoder has read on (the CYCs after a TIP.PGE, or a FUP and
            # TIP.PGD that end a short run), and what it read counts the
            # cycles of code run after the event
            start = getattr(self.flow, "event_start", None) if event else None
            if start is not None:
                exact = self._clock.at(start)
            else:
                exact = self._clock.event_at(self.flow.query.pos or 0)
        elif self._iclock is not None:
            exact = self._iclock.at(time, self._count())
        if exact is None and psb:
            exact = time
        if exact is not None:
            sp = tl.choose(exact, ip, self.space)
        else:
            before = None
            if time is not None and len(tl.entries) > 1:
                before = self._time_ahead(time if enable else None)
            sp = self._resuming(time, before, ip)
            if sp is None:
                sp = tl.choose(time, ip, self.space, before)
        if sp is not None:
            self._select(sp)

    def _resuming(self, time, before, ip) -> AddressSpace | None:
        """With coarse time stamps several processes may run at an enable:
        the one that left user code exactly at ``ip``, if only one did
        (a process resumes where it stopped; a new one, or one entering a
        signal handler, doesn't tell).

        The candidates are the entries the window ``[time, before]``
        allows, and the current space only while no entry at or before
        ``time`` has replaced it: ``time`` (the last timing packet's) is
        no later than the enable, so a switch recorded at or before it
        certainly came first -- a process switched out there (e.g. one
        that exited) resumes nothing here, however exactly it stopped at
        ``ip`` (a parent and its fork child, one static binary, both stop
        in the same libc syscall wrappers)."""
        if time is None or not self._resume:
            return None
        tl = self.timeline
        lo = tl.index_at(time)
        hi = tl.index_at(time, before) if before is not None else lo
        cands = {s for _, s in tl.entries[lo:hi + 1] if s is not None}
        cur = self.space
        if cur is not None and (tl.times[lo] > time or
                                any(s is cur for _, s in tl.entries[lo:])):
            # not replaced by a switch known to be before the enable
            # (nothing is before the first entry; a space chosen from a
            # later entry is still ahead)
            cands.add(cur)
        if len(cands) < 2:
            return None
        hits = [s for s in cands if self._resume.get(s) == ip]
        if len(hits) > 1:
            # the trace and sideband do not tell which: time decides
            self.ambiguous.add(self.dec.offset)
        return hits[0] if len(hits) == 1 else None

    def _time_ahead(self, after: int | None = None) -> int | None:
        """A time stamp at a timing packet (TSC, MTC, CYC) after the one
        the decoder is at now came with (``after``: the time of the enable
        it reports, if any):
        an upper bound for its time (time stamps only move at timing
        packets).  None if there is none close by.

        The query decoder reads ahead past the timing packets that follow
        what it returned (an enable's TIP.PGE, then an MTC), and a flow
        decoder may have queried on before it reports an event: the least
        of the time at its last query and its time now that is later than
        ``after`` comes from such a packet (time stamps never go back).
        Walking on from its position instead skips them and finds a later
        one -- in an MTC-only trace an MTC period too late, which let a
        switch recorded after an enable count as possibly before it (a
        parent and its fork child, both stopped at the same libc IP: the
        wrong one resumed).  Else the next timing packet from its
        position, a PSB+'s TSC too (an enable just before a PSB: without
        it no bound, and the time stamp, MTC-estimated, may trail the
        switch that came before the enable); none past an overflow."""
        ahead = getattr(self.flow, "time_ahead", None)
        if ahead is not None:
            # the compiled core does this same over its own state (and
            # nothing of the Python packet decoder is loaded for it)
            return ahead(PEEK_PACKETS, after)
        from hwtrace.pt.decoder import PacketDecoder
        from hwtrace.pt.errors import PtError
        from .timing import TimeError
        q = getattr(self.flow, "query", None)
        if q is None:
            return None
        if after is not None:
            tsc, _, _, have = q.time_now()
            later = [t for t, h in ((tsc, have), (q.time.time.tsc, q.time.time.have_tsc))
                     if h and t > after]
            if later:
                return min(later)
        if q.pos is None:
            return None
        if self._peek is None:
            self._peek = PacketDecoder(q._pkt.buffer)
        pk = self._peek
        import copy             # here only: not on the start-up path
        t = copy.deepcopy(q.time)
        if pk.sync_set(q.pos).__class__ is PtError:
            return None
        try:
            for _ in range(PEEK_PACKETS):
                p = pk.next()
                if p.__class__ is PtError:
                    return None
                typ = p.type
                if typ in _TIMING:
                    t.update(p)
                    if typ != "tma" and typ != "cbr":
                        return t.time.tsc if t.time.have_tsc else None
                elif typ == "ovf":
                    return None         # (a PSB+'s TSC bounds it too)
        except (TimeError, AttributeError):
            return None
        return None

    def _select(self, space: AddressSpace) -> None:
        if space is self.space:
            return
        self.space = space
        self.switches += 1
        self.flow.set_image(space.image)
        if self.on_switch is not None:
            self.on_switch(space, self.dec.offset)


class SpacePlan(Fields):
    """How a stream switches address spaces, as data: what a
    :class:`SpaceSwitcher` is built from.  The Python twin wraps its
    decoder in one (:meth:`wrap`); the compiled core calls back into the
    same switching rules at the (rare) events that decide.

    ``spaces`` the CR3 lookup for paging events, ``timeline`` (may be
    None) the time-based choice, ``initial`` the space to start in,
    ``cyc`` whether the trace has CYC packets (cycle-accurate times),
    ``insn_clock`` whether its clock counts exactly its traced
    instructions (:class:`InsnClock`), ``on_switch(space, offset)`` told
    of every switch; ``ambiguous``
    collects, over every decoder wrapped (copies made with
    :meth:`replace` share it), the offsets of the enables
    placed by time alone because several processes the time stamps allow
    left user code exactly at the enable's IP (a user warns of them)."""

    _fields = ("spaces", "timeline", "initial", "cyc", "on_switch",
               "ambiguous", "insn_clock")

    def __init__(self, spaces: AddressSpaces | None,
                 timeline: Timeline | None, initial: AddressSpace | None,
                 cyc: bool = False, on_switch: Callable | None = None,
                 ambiguous: set | None = None, insn_clock: bool = False):
        self.spaces = spaces
        self.timeline = timeline
        self.initial = initial
        self.cyc = cyc
        self.on_switch = on_switch
        self.ambiguous = set() if ambiguous is None else ambiguous
        self.insn_clock = insn_clock

    @property
    def fixed(self) -> bool:
        """Whether nothing can switch the stream away from its initial
        space (a one-process stream: its timeline, if any, runs only the
        initial space, and no CR3 the sideband knows is another's): the
        rule :class:`SpaceSwitcher` acts on.  Its decode from any PSB is
        then one in the initial space's image (what a job decoding a
        segment of it needs)."""
        if self.initial is None:
            return False
        tl = self.timeline
        if tl is not None and any(s is not self.initial for s in tl.spaces()):
            return False
        return self.spaces is None or all(
            s is self.initial for s in self.spaces.cr3_spaces())

    def wrap(self, dec) -> "SpaceSwitcher":
        return SpaceSwitcher(dec, self.spaces, self.timeline, self.initial,
                             self.on_switch, cyc=self.cyc, ambiguous=self.ambiguous,
                             insn_clock=self.insn_clock)

