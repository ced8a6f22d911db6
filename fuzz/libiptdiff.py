"""The ``libiptdiff`` fuzz target: hwtrace's instruction decoder against
libipt 2.0.5 itself (``build/ptoracle insn``).

flowdiff holds the compiled flow core to its Python twin; a gap both
twins share (a branch packet cut by the end of the trace, da78ad6) slips
through it.  Here every input is decoded by libipt and by ``hwtrace
decode --pt ... --format jsonl --insn-decoder --error-offsets 2.0`` (the
CLI's own code, in process) and the instruction IPs and error offsets
(tests/oracle_corpus.py ``essentials``), in order, must agree.

An input is a processor, a memory image and a trace::

    header  <BBBBBBHHHB flags, family, model, stepping, mtc_freq,
                        nom_freq, cpuid_0x15_eax, cpuid_0x15_ebx (low 16
                        bits each), addr_cfg, sections
    [if flags & FILTERS] 8 x <Q: addr0_a, addr0_b, ..., addr3_b
    sections x (<IQ length, vaddr; bytes)
    the trace: the rest

``flags``: keep the calibration over OVF 1, FILTERS 2.  ``family`` 0:
no CPU (no erratum workarounds), else ``--cpu family/model[/stepping]``
on both sides.  Both decode at most :func:`max_insns` instructions; if
either stops there, the part both produced is compared.

Known, intentional differences (README "Lossless by default") are
decoded libipt's way here: both sides see a bare trace without a
bundle, so nothing VM- or sideband-related is in play.

Seeds: PSB-started windows (256 B .. 4 KiB) of libipt's corpus streams,
of the real captures in ../shared/fixtures/hardware and, if
``HWTRACE_FUZZ_BUNDLE`` names recorded bundles (``:``-separated), of
their streams, each with the pages its decode executes.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import tempfile
import weakref
from pathlib import Path

HDR = struct.Struct("<BBBBBBHHHB")
SEC = struct.Struct("<IQ")
FILTERS = struct.Struct("<8Q")
F_KEEP_TCAL, F_FILTERS = 1, 2
MAX_SECTION = 64 << 10
MAX_SECTIONS = 32
PSB = b"\x02\x82" * 8
WINDOWS = (256, 700, 1500, 4096)

HERE = Path(__file__).resolve().parent
ORACLE = Path(os.environ.get("HWTRACE_PTORACLE",
                             HERE.parent / "build" / "ptoracle"))


from flowdiff import Violation, _Stop  # noqa: E402  (fuzz/ is on the path)
from flowdiff import flow_items as max_insns  # noqa: E402  (flowdiff's item budget)


_PREFIXES = frozenset((0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65, 0x66, 0x67, 0xF0,
                       0xF2, 0xF3, *range(0x40, 0x50)))


def _old_far(it: dict) -> bool:
    """A far branch by opcode 9A, EA or CE: invalid in 64-bit mode, where
    libipt 2.0.5 still calls them far branches (later libipt, whose
    reading hwtrace and the 2.3 corpus follow, does not).  What follows
    one is not compared."""
    if it.get("iclass") not in ("far_jump", "far_call") or "raw" in it and \
            not it["raw"]:
        return False
    raw = bytes.fromhex(it.get("raw", ""))
    i = 0
    while i < len(raw) and raw[i] in _PREFIXES:
        i += 1
    return i < len(raw) and raw[i] in (0x9A, 0xEA, 0xCE)


def _lossless(it: dict, trace: bytes) -> bool:
    """hwtrace's reading of a PSB+ whose status disagrees with the decoder
    (README "Lossless by default": the packets after it decide): an
    enabled event at its PSBEND (a PSB+ FUP while the decoder knows
    tracing is off, TNT/TIP next: libipt 2.0.5 says "expected tracing
    enabled event"), or a disabled one (a PSB+ FUP, TIP.PGE next: libipt
    "unexpected packet context").  What follows is not compared."""
    off = it.get("offset", -1)
    ev = it.get("event")
    if trace[off:off + 2] != b"\x02\x23":
        return False
    if ev == "enabled":         # not the sync's (resumed)
        return it.get("resumed") is False
    return ev == "disabled" and bool(it.get("status_update"))


# Packets libipt 2.0.5 does not know (2.1 and later decode them): TRIG,
# CFE, EVD.  It stops at them ("unknown opcode"), hwtrace decodes on.
_NEWER_PACKETS = frozenset(("trig", "cfe", "evd"))


def newer_packet(trace: bytes) -> int | None:
    """The offset of the first packet libipt 2.0.5 does not know, where
    both decoders would meet it (from each PSB on, as they synchronize;
    after a packet that does not decode, from the next PSB); None if
    there is none.  The trace is cut there: what follows is the later
    releases' to judge (tests/test_flow_oracle.py holds the corpus to
    2.3)."""
    from hwtrace.pt.decoder import PacketDecoder, find_psb_forward
    dec = PacketDecoder(trace)
    pos = find_psb_forward(trace, 0)
    while pos >= 0:
        dec.sync_set(pos)
        while True:
            p = dec.next()
            if p.type == "error":
                break
            if p.type in _NEWER_PACKETS:
                return p.offset
        if p.offset >= len(trace):
            return None
        if trace[p.offset] == 0xd9 or trace[p.offset:p.offset + 2] in (
                b"\x02\x13", b"\x02\x53"):
            return p.offset         # one malformed or cut by the end
        pos = find_psb_forward(trace, p.offset + 1)
    return None


# Packets that start an event waiting for a later TIP or FUP, the packets
# that end one, and those that come between without changing that.
_STARTS = frozenset(("fup", "mode.exec", "mode.tsx", "pip", "vmcs", "ovf"))
_ENDS = frozenset(("tip", "tip.pge", "tip.pgd", "psbend"))


def _partial_event_at_psb(it: dict, trace: bytes) -> bool:
    """hwtrace's "unexpected packet context" at a PSB that an event waits
    across (a FUP's async branch or a MODE.EXEC still waiting for its
    TIP, a MODE.TSX or OVF for its FUP): libipt 2.1 and later refuse to
    carry a partial event across a PSB (pt_evt_decode_psb), as hwtrace
    does; 2.0.5 carries it on.  What follows is not compared."""
    off = it.get("offset", -1)
    if it.get("kind") != "error" or \
            it.get("error") != "unexpected packet context" or \
            trace[off:off + 16] != PSB:
        return False
    return _last_packet(trace, off, _STARTS | _ENDS) in _STARTS


def _last_packet(trace: bytes, off: int, kinds) -> str | None:
    """The type of the last packet of ``kinds`` before ``off``, decoding
    from the PSB both decoders synchronize at (after a packet that does
    not decode, from the next PSB)."""
    from hwtrace.pt.decoder import PacketDecoder, find_psb_forward
    dec = PacketDecoder(trace)
    pos = find_psb_forward(trace, 0)
    last = None
    while 0 <= pos < off:
        dec.sync_set(pos)
        last = None
        while True:
            p = dec.next()
            if p.type == "error" or p.offset >= off:
                break
            if p.type in kinds:
                last = p.type
        if p.type != "error" or p.offset >= off:
            break
        pos = find_psb_forward(trace, p.offset + 1)
    return last


_NOT_TIMING = frozenset(("psb", "psbend", "fup", "tip", "tip.pge", "tip.pgd",
                         "tnt8", "tnt64", "mode.exec", "mode.tsx", "pip",
                         "vmcs", "ovf", "stop", "exstop", "mwait", "pwre",
                         "pwrx", "ptw"))


def _mode_exec_wants_tip(it: dict, trace: bytes) -> bool:
    """libipt 2.0.5's "trace stream does not match query" at a TNT right
    after a MODE.EXEC outside a PSB+: 2.0.5 takes the MODE.EXEC for an
    event that waits for its TIP and refuses the TNT; 2.3 (and hwtrace)
    bind it to the next IP packet and read the TNT.  What follows is not
    compared."""
    off = it.get("offset", -1)
    if it.get("error") != "trace stream does not match query" or \
            off >= len(trace):
        return False
    b = trace[off]
    if not (b & 1 == 0 and b not in (0, 2) or trace[off:off + 2] == b"\x02\xa3"):
        return False                        # not a TNT
    return _last_packet(trace, off, _NOT_TIMING) == "mode.exec"


def _traceless_loop(it: dict) -> bool:
    """hwtrace's "endless loop without trace" (README): a loop of direct
    branches the trace can never leave, where libipt decodes for ever (up
    to the item budget here).  What follows is not compared."""
    return it.get("error") == "endless loop without trace"


def essentials(items) -> list:
    """tests/oracle_corpus.py's: instruction IPs and error offsets (an
    error also carries its message, which :func:`compare` looks at only
    where the offsets differ)."""
    out = []
    for it in items:
        if "ip" in it and "iclass" in it and "error" not in it:
            out.append(("insn", it["ip"]))
        elif "error" in it:
            out.append(("error", it["offset"], it["error"]))
    return out


def _mode_exec(trace: bytes, off: int) -> bool:
    return trace[off:off + 1] == b"\x99" and off + 1 < len(trace) and \
        trace[off + 1] >> 5 == 0


def _read_ahead_apart(trace: bytes, old: int, new: int) -> bool:
    """Error offsets libipt 2.0.5 and hwtrace (2.3's event model; its
    ``--error-offsets 2.0`` is where its query decoder stands) give for
    the same error, apart only by how far each read ahead:

    - a MODE.EXEC stops 2.0.5's read-ahead (it is an event packet there:
      pdff_event) at ``old``; 2.3 and hwtrace read it ahead as a status
      packet that binds to the next IP packet, on to ``new``;
    - the PSB+'s enabled/disabled status event (2.3's event decoder
      queues it first at PSBEND; 2.0.5 has none) holds hwtrace's
      read-ahead at that PSBEND, ``new``; 2.0.5 reads on to ``old``."""
    if old < new:
        return _mode_exec(trace, old)
    return trace[new:new + 2] == b"\x02\x23"



# -- inputs ---------------------------------------------------------------------

def make_input(trace: bytes, sections, cpu: str | None = None, cfg=None) -> bytes:
    """An input from a trace, [(vaddr, bytes)], a ``--cpu`` string and a
    FlowConfig (its timing, keep-tcal and filter settings)."""
    fam = mod = step = 0
    if cpu and cpu != "none":
        parts = [int(x, 0) for x in cpu.split("/")]
        fam, mod = parts[0] & 0xff, parts[1] & 0xff
        step = parts[2] & 0xff if len(parts) > 2 else 0
    flags = mtc = nom = eax = ebx = addr_cfg = 0
    f = None
    if cfg is not None:
        flags |= F_KEEP_TCAL if cfg.keep_tcal_on_ovf else 0
        mtc, nom = cfg.mtc_freq & 0xff, cfg.nom_freq & 0xff
        eax, ebx = cfg.cpuid_0x15_eax & 0xffff, cfg.cpuid_0x15_ebx & 0xffff
        f = cfg.addr_filter
        if f.addr_cfg:
            flags |= F_FILTERS
            addr_cfg = f.addr_cfg & 0xffff
    sections = [(v, bytes(b[:MAX_SECTION])) for v, b in sections][:MAX_SECTIONS]
    out = [HDR.pack(flags, fam, mod, step, mtc, nom, eax, ebx, addr_cfg,
                    len(sections))]
    if flags & F_FILTERS:
        out.append(FILTERS.pack(*(v & (2**64 - 1) for n in range(4)
                                  for v in (f.a[n], f.b[n]))))
    for vaddr, b in sections:
        out.append(SEC.pack(len(b), vaddr) + b)
    out.append(trace)
    return b"".join(out)


def parse(data: bytes):
    """(trace, [(vaddr, bytes)], options): ``options`` are the command
    line options both decoders take (without the image)."""
    data = data.ljust(HDR.size, b"\0") if len(data) < HDR.size else data
    flags, fam, mod, step, mtc, nom, eax, ebx, addr_cfg, nsec = \
        HDR.unpack_from(data)
    pos = HDR.size
    opts = []
    if fam:
        opts += ["--cpu", f"{fam}/{mod}" + (f"/{step}" if step else "")]
    for name, v in (("--mtc-freq", mtc), ("--nom-freq", nom),
                    ("--cpuid-0x15.eax", eax), ("--cpuid-0x15.ebx", ebx)):
        if v:
            opts += [name, str(v)]
    if flags & F_KEEP_TCAL:
        opts.append("--keep-tcal-on-ovf")
    if flags & F_FILTERS:
        raw = data[pos:pos + FILTERS.size].ljust(FILTERS.size, b"\0")
        v = FILTERS.unpack(raw)
        pos += FILTERS.size
        for n in range(4):
            c = addr_cfg >> (4 * n) & 0xf
            if c:
                opts += [f"--filter:addr{n}_cfg", str(c),
                         f"--filter:addr{n}_a", hex(v[2 * n]),
                         f"--filter:addr{n}_b", hex(v[2 * n + 1])]
    sections = []
    for _ in range(min(nsec, MAX_SECTIONS)):
        if pos + SEC.size > len(data):
            break
        n, vaddr = SEC.unpack_from(data, pos)
        pos += SEC.size
        n = min(n, MAX_SECTION, len(data) - pos)
        if n > 0:
            sections.append((vaddr, data[pos:pos + n]))
        pos += max(n, 0)
    return data[pos:], sections, opts


# -- the two decoders -------------------------------------------------------------

def _hwtrace_options(opts: list) -> list:
    return ["--insn:keep-tcal-on-ovf" if o == "--keep-tcal-on-ovf" else o
            for o in opts]


class Target:
    """Per-run state: the scratch directory the trace and image files go
    to, and the parsed ``decode`` command line."""

    def __init__(self, scratch: str | None = None):
        import shutil
        if scratch:
            self.dir = Path(scratch)
        else:
            self.dir = Path(tempfile.mkdtemp(prefix="hwtrace-libiptdiff-"))
            weakref.finalize(self, shutil.rmtree, self.dir, True)
        self._parser = None
        self.skipped = 0            # inputs libipt 2.0.5 cannot configure

    def _decode_parser(self):
        if self._parser is None:
            from hwtrace.cli import Parser
            from hwtrace.cli import decode as D
            sub = Parser(prog="fuzz").add_subparsers(parser_class=Parser)
            D.register(sub)
            self._parser = sub.choices["decode"]
        return self._parser

    def files(self, data: bytes):
        """(trace path, image args, options) of an input, written out."""
        trace, sections, opts = parse(data)
        pt = self.dir / "t.pt"
        pt.write_bytes(trace)
        raw = []
        for i, (vaddr, b) in enumerate(sections):
            p = self.dir / f"s{i}.bin"
            p.write_bytes(b)
            raw += ["--raw", f"{p}:{vaddr:#x}"]
        return pt, raw, opts

    def libipt(self, pt: Path, raw: list, opts: list, cap: int):
        r = subprocess.run([str(ORACLE), "insn", str(pt), *raw, *opts,
                            "--max-insns", str(cap)],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise Violation(f"ptoracle exit {r.returncode}: "
                            f"{r.stderr.strip()[-300:]}")
        items = [json.loads(x) for x in r.stdout.splitlines()]
        if any(it.get("kind") == "config error" for it in items):
            return None, False      # e.g. a CPU 2.0.5 does not know
        cut = next((i for i, it in enumerate(items) if _old_far(it)), None)
        if cut is not None:     # its error (a TIP it waits for) not either
            items = items[:cut + ("error" not in items[cut])]
        trace = pt.read_bytes()
        tip = next((i for i, it in enumerate(items)
                    if _mode_exec_wants_tip(it, trace)), None)
        if tip is not None:
            items = items[:tip]
            cut = tip
        ess = essentials(items)
        return ess, cut is not None or \
            sum(1 for x in ess if x[0] == "insn") >= cap

    def hwtrace(self, pt: Path, raw: list, opts: list, cap: int):
        """The CLI's decode, in process; stops after ``cap`` insns."""
        from hwtrace.cli import decode as D
        argv = ["--pt", str(pt), *raw, *_hwtrace_options(opts), "--format",
                "jsonl", "--insn-decoder", "--error-offsets", "2.0"]
        a = self._decode_parser().parse_args(argv)
        buf = io.StringIO()
        trace = pt.read_bytes()
        out = []
        ninsn = 0

        def write(s: str) -> None:
            nonlocal ninsn
            buf.write(s)
            if "\n" not in s:
                return
            lines = buf.getvalue().split("\n")
            buf.seek(0)
            buf.truncate()
            buf.write(lines[-1])
            for x in lines[:-1]:
                if x:
                    it = json.loads(x)
                    if _lossless(it, trace) or _traceless_loop(it) or \
                            _partial_event_at_psb(it, trace):
                        raise _Stop
                    e = essentials([it])
                    out.extend(e)
                    ninsn += sum(1 for x in e if x[0] == "insn")
                    if ninsn >= cap:
                        raise _Stop

        from hwtrace.cli import CliError
        try:
            D._run_one(a, write=write)
        except _Stop:
            return out, True
        except CliError as e:
            # an empty trace or one without a PSB: the CLI says there is
            # nothing to decode instead of printing nothing
            if "nothing to decode" not in str(e) and "no PSB" not in str(e):
                raise
            return None, False
        if buf.getvalue().strip():
            out.extend(essentials([json.loads(buf.getvalue())]))
        return out, False

    def check(self, data: bytes) -> None:
        pt, raw, opts = self.files(data)
        cut = newer_packet(pt.read_bytes())
        if cut is not None:
            pt.write_bytes(pt.read_bytes()[:cut])
        cap = max_insns(data)
        old, ocapped = self.libipt(pt, raw, opts, cap)
        if old is None:
            self.skipped += 1
            return
        new, ncapped = self.hwtrace(pt, raw, opts, cap)
        if new is None:
            if any(x[0] == "insn" for x in old):
                raise Violation(f"hwtrace refuses a trace libipt decodes "
                                f"{len(old)} items of")
            return
        compare(old, ocapped, new, ncapped, pt.read_bytes())


def _same(x, y, trace: bytes) -> bool:
    if x[:2] == y[:2]:
        return True
    return x[0] == y[0] == "error" and x[2] == y[2] and \
        _read_ahead_apart(trace, x[1], y[1])


def compare(old, ocapped, new, ncapped, trace: bytes = b"") -> None:
    if ocapped or ncapped:
        # the insn both reached last may be followed by an error on one
        # side only: compare up to the shorter side's last instruction
        n = min(len(old), len(new))
        old, new = old[:n], new[:n]
    i = next((i for i, (x, y) in enumerate(zip(old, new))
              if not _same(x, y, trace)), min(len(old), len(new)))
    if i < max(len(old), len(new)):
        raise Violation(f"at {i}: libipt {old[i:i + 2]} hwtrace "
                        f"{new[i:i + 2]} ({len(old)} vs {len(new)} items)")


# -- seeds ----------------------------------------------------------------------

def psb_windows(trace: bytes, count: int = 4) -> list[bytes]:
    """Up to ``count`` windows of ``trace`` starting at a PSB, spread over
    it, in the sizes of :data:`WINDOWS`."""
    offs = []
    i = trace.find(PSB)
    while i >= 0:
        offs.append(i)
        i = trace.find(PSB, i + 1)
    if not offs:
        return []
    step = max(1, len(offs) // count)
    out = []
    for k, o in enumerate(offs[::step][:count]):
        w = trace[o:o + WINDOWS[k % len(WINDOWS)]]
        if w not in out:
            out.append(w)
    return out


def executed_sections(trace: bytes, image, cfg) -> list:
    """The pages of ``image`` the decode of ``trace`` executes, merged."""
    from hwtrace.flow import batches as B
    pages = set()
    for b in B.batches(trace, image, cfg, decoder="insn", want_insns=True):
        for ip, size in zip(b.insns["ip"].tolist(), b.insns["size"].tolist()):
            pages.update((ip >> 12, (ip + size - 1) >> 12))
    sections = []
    for page in sorted(pages):
        data = image.read(page << 12, 4096)
        if not data:
            continue
        if sections and sections[-1][0] + len(sections[-1][1]) == \
                page << 12 and len(sections[-1][1]) < MAX_SECTION:
            sections[-1] = (sections[-1][0], sections[-1][1] + data)
        else:
            sections.append((page << 12, data))
    return sections


def seeds(corpus: Path, fixtures: Path) -> list[bytes]:
    out = []
    if corpus.is_dir():
        # only the variants libipt 2.0.5 decodes as hwtrace does: the rest
        # test what 2.3 added (packets, CPUs; tests/test_flow_oracle.py
        # test_corpus_matches_live_ptoracle holds the others to 2.3)
        t = Target()
        for s in _corpus_seeds(corpus):
            try:
                t.check(s)
            except Violation:
                continue
            out.append(s)
    if fixtures.is_dir():
        out += _fixture_seeds(fixtures)
    for d in filter(None, os.environ.get("HWTRACE_FUZZ_BUNDLE", "").split(":")):
        out += _bundle_seeds(Path(d))
    return out


def _bundle_seeds(bundle: Path) -> list[bytes]:
    import hwtrace.streams as S
    m = json.loads((bundle / "manifest.json").read_text())
    c = m.get("cpu") or {}
    cpu = f"{c['family']}/{c['model']}/{c.get('stepping', 0)}" \
        if c.get("family") else None
    out = []
    for st in S.open_bundle(bundle).streams:
        trace = Path(st.path).read_bytes()
        for w in psb_windows(trace, 8):
            out.append(make_input(w, executed_sections(w, st.image, st.config),
                                  cpu, st.config))
    return out


def _corpus_seeds(corpus: Path) -> list[bytes]:
    from flowdiff import corpus_variants
    out = []
    for _i, a, cfg, image, trace in corpus_variants(corpus, MAX_SECTION):
        sections = []
        for m in image.mappings():
            b = m.section.bytes()[m.offset:m.offset + (m.end - m.begin)]
            sections.append((m.begin, b[:MAX_SECTION]))
        out.append(make_input(trace, sections, a.cpu, cfg))
    return out


def _fixture_seeds(fx: Path) -> list[bytes]:
    from hwtrace.flow.config import FlowConfig
    from hwtrace.flow.image import Image
    from hwtrace.flow.loaders import load_elf
    lldb = fx / "lldb_intelpt"
    mc = lldb / "intelpt-multi-core-trace"
    mf = lldb / "intelpt-trace-multi-file"
    cases = [
        (mc / "cores" / "45.intelpt_trace", [(mc / "modules/m.out", 0x400000)],
         "6/85/4", FlowConfig()),
        (lldb / "intelpt-trace" / "3842849.trace",
         [(lldb / "intelpt-trace/a.out", 0x400000)], "6/79/1", FlowConfig()),
        (mf / "multi-file.trace", [(mf / "a.out", 0x400000),
                                   (mf / "libfoo.so", 0x7ffff7bd9000),
                                   (mf / "libbar.so", 0x7ffff79d7000)],
         "6/79/1", FlowConfig()),
        (fx / "drpt2trace_simple" / "pt.bin",
         [(fx / "drpt2trace_simple" / "hello", None)], "6/85/4",
         FlowConfig(mtc_freq=3, nom_freq=37, cpuid_0x15_eax=2,
                    cpuid_0x15_ebx=308)),
    ]
    out = []
    for trace, elfs, cpu, cfg in cases:
        if not trace.is_file():
            continue
        image = Image()
        try:
            for e, base in elfs:
                load_elf(image, f"{e}:{base:#x}" if base else str(e))
        except Exception:
            continue
        for w in psb_windows(trace.read_bytes()):
            out.append(make_input(w, executed_sections(w, image, cfg), cpu,
                                  cfg))
    return out
