"""ptdump's text output: format decoded packets exactly like Intel's ptdump.

:class:`PtdumpOptions` mirrors ptdump's command-line switches and
:class:`TimingConfig` (``hwtrace.pt.timing``) its ``--mtc-freq``,
``--nom-freq`` and ``--cpuid-0x15.*`` values.  :func:`ptdump_lines` runs the
whole ptdump loop over a buffer (synchronize, dump packets, report errors as
``[offset: what: why]`` and resynchronize at the next PSB) and yields output
lines without newlines::

    for line in ptdump_lines(data, PtdumpOptions(show_time=True), cfg):
        print(line)

:class:`PtdumpFormatter` formats one packet at a time and keeps ptdump's
per-stream tracking state (last IP, time, calibration); it is reusable by
anything that wants ptdump-style lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterator

from hwtrace.pt import errors as E
from hwtrace.pt.decoder import PacketDecoder, SKD007_OVF  # noqa: F401
from hwtrace.pt.errors import PtError
from hwtrace.pt.lastip import LastIp, sext48
from hwtrace.pt.packets import Pad, Tnt8
from hwtrace.pt.timing import FCR_SHIFT, Time, TimeCal, TimingConfig


@dataclass(frozen=True, slots=True)
class PtdumpOptions:
    show_offset: bool = True
    show_raw_bytes: bool = False
    show_last_ip: bool = False
    show_exec_mode: bool = False
    show_time: bool = False
    show_tcal: bool = False
    show_time_as_delta: bool = False
    quiet: bool = False
    no_pad: bool = False
    no_sync: bool = False
    no_tcal: bool = False
    no_wall_clock: bool = False
    no_timing: bool = False
    no_cyc: bool = False
    keep_tcal_on_ovf: bool = False

    @property
    def track_time(self) -> bool:
        return self.show_time or self.show_tcal


def diag(offset: int, what: str, code: str | None = None) -> str:
    """ptdump's diagnostic line."""
    if code:
        return f"[{offset:x}: {what}: {code}]"
    return f"[{offset:x}: {what}]"


_CFE_NAMES = {1: "intr", 2: "iret", 3: "smi", 4: "rsm", 5: "sipi",
              6: "init", 7: "vmentry", 8: "vmexit", 9: "vmexit_intr",
              10: "shutdown", 12: "uintr", 13: "uiret", 14: "swintr",
              15: "syscall"}
_CFE_VECTOR_DEC = {1, 9, 12, 14}
_CFE_VECTOR_HEX = {5}
_EVD_NAMES = {0: "cr2", 1: "vmxq", 2: "vmxr"}
_EXEC_MODE = {(0, 0): "16-bit", (0, 1): "32-bit", (1, 0): "64-bit",
              (1, 1): "unknown"}


def _ip_payload(ipc: int, ip: int) -> str:
    if ipc == 0:
        return "0: ????????????????"
    if ipc == 1:
        return f"1: ????????????{ip:04x}"
    if ipc == 2:
        return f"2: ????????{ip:08x}"
    if ipc == 4:
        return f"4: ????{ip:012x}"
    if ipc == 3:
        return f"3: {sext48(ip):016x}"
    return f"{ipc:x}: {ip:016x}"


def _tnt_text(bit_size: int, payload: int) -> str:
    return "".join("!" if payload >> i & 1 else "."
                   for i in range(bit_size - 1, -1, -1))


# every TNT-8 payload's text, precomputed (TNT-8 is the commonest packet)
_TNT8_TEXT = {(n, v): _tnt_text(n, v) for n in range(7) for v in range(1 << n)}


def _tnt(bit_size: int, payload: int) -> str:
    s = _TNT8_TEXT.get((bit_size, payload))
    return _tnt_text(bit_size, payload) if s is None else s


def _pwrx_wr(p) -> str:
    wr = None
    if p.interrupt:
        wr = "int"
    if p.store:
        if wr:
            return "bad"
        wr = " st"
    if p.autonomous:
        if wr:
            return "bad"
        wr = " hw"
    return wr or "bad"


class PtdumpFormatter:
    """Format packets as ptdump does, tracking last IP and time.

    :meth:`format` returns the list of lines one packet produces
    (diagnostics first, then the packet line unless it is skipped).
    """

    def __init__(self, options: PtdumpOptions = PtdumpOptions(),
                 config: TimingConfig = TimingConfig(),
                 data: bytes | None = None):
        self.options = options
        self.config = config
        self.data = data
        self.last_ip = LastIp()
        self.time = Time()
        self.tcal = TimeCal()
        self.tsc = 0
        self.fcr = 0
        self.in_header = False

    def reset(self) -> None:
        """Forget tracking state (ptdump does this after a resync)."""
        self.last_ip.reset()
        self.time.reset()
        self.tcal.reset()
        self.tsc = 0
        self.fcr = 0
        self.in_header = False

    # -- tracking helpers ----------------------------------------------------
    def _track_time(self, off, out, buf):
        o = self.options
        if o.show_tcal and not buf["skip_tcal"]:
            buf["id"] = "fcr"
            fcr = self.tcal.query_fcr()
            if fcr.__class__ is PtError:
                buf["track"] = "<unavailable>"
                out.append(diag(off, "error printing time", fcr.code))
            else:
                dfcr = fcr / (1 << FCR_SHIFT)
                if o.show_time_as_delta:
                    buf["track"] = "%+.3f" % (dfcr - self.fcr /
                                               (1 << FCR_SHIFT))
                    self.fcr = fcr
                else:
                    buf["track"] = "%.3f" % dfcr
        if o.show_time and not buf["skip_time"]:
            buf["id"] = "tsc"
            t = self.time
            if not t.have_tsc and not o.no_wall_clock:
                out.append(diag(off, "error printing time", E.NO_TIME))
                buf["track"] = "<unavailable>"
                return
            tsc = t.tsc
            if o.show_time_as_delta:
                old = self.tsc
                buf["track"] = (f"+{tsc - old:x}" if old <= tsc
                                else f"-{old - tsc:x}")
                self.tsc = tsc
            else:
                buf["track"] = f"{tsc:016x}"

    def _check(self, r, off, out, what):
        if r is not None:
            out.append(diag(off, what, r.code))

    def _timing(self, p, off, out, buf):
        o, cfg, t, tc = self.options, self.config, self.time, self.tcal
        typ = p.type
        if typ == "tsc":
            if not o.no_tcal:
                r = (tc.header_tsc(p.tsc, cfg) if self.in_header
                     else tc.update_tsc(p.tsc, cfg))
                self._check(r, off, out, "error calibrating time")
            self._check(t.update_tsc(p.tsc, cfg), off, out,
                        "error updating time")
        elif typ == "cbr":
            if not o.no_tcal:
                r = (tc.header_cbr(p.ratio, cfg) if self.in_header
                     else tc.update_cbr(p.ratio, cfg))
                self._check(r, off, out, "error calibrating time")
            self._check(t.update_cbr(p.ratio, cfg), off, out,
                        "error updating time")
            buf["skip_time"] = True
        elif typ == "tma":
            if not o.no_tcal:
                self._check(tc.update_tma(p.ctc, p.fc, cfg), off, out,
                            "error calibrating time")
            self._check(t.update_tma(p.ctc, p.fc, cfg), off, out,
                        "error updating time")
            buf["skip_tcal"] = True
        elif typ == "mtc":
            if not o.no_tcal:
                self._check(tc.update_mtc(p.ctc, cfg), off, out,
                            "error calibrating time")
            self._check(t.update_mtc(p.ctc, cfg), off, out,
                        "error updating time")
        else:  # cyc
            fcr = 0
            if not o.no_tcal:
                r = tc.query_fcr()
                if r.__class__ is PtError:
                    out.append(diag(off, "calibration error", r.code))
                else:
                    fcr = r
                self._check(tc.update_cyc(p.value, cfg), off, out,
                            "error calibrating time")
            r = t.update_cyc(p.value, cfg, fcr)
            if r is not None:
                out.append(diag(off, "error updating time", r.code))
            elif not fcr:
                out.append(diag(off, "error updating time: no calibration"))
            buf["skip_tcal"] = True
        self._track_time(off, out, buf)

    def _track_ip(self, p, off, out, buf):
        buf["id"] = "ip"
        r = self.last_ip.update(p.ipc, p.ip)
        if r is not None:
            buf["track"] = "<unavailable>"
            out.append(diag(off, "error tracking last-ip", r.code))
            return
        ip = self.last_ip.query()
        if ip.__class__ is PtError:
            if ip.code == E.IP_SUPPRESSED:
                buf["track"] = "<suppressed>"
            else:
                buf["track"] = "<unavailable>"
                out.append(diag(off, "error tracking last-ip", ip.code))
        else:
            buf["track"] = f"{ip:016x}"

    # -- one packet ----------------------------------------------------------
    def format(self, p) -> list[str]:
        o = self.options
        off = p.offset
        out: list[str] = []
        buf = {"opcode": "", "std": "", "id": "", "track": "",
               "skip": False, "skip_time": False, "skip_tcal": False}
        typ = p.type
        std = ""
        if typ == "tnt8" or typ == "tnt64":     # the commonest first
            opcode = "tnt.8" if typ == "tnt8" else "tnt.64"
            std = _tnt(p.bit_size, p.payload)
        elif typ in ("tip", "fup", "tip.pge", "tip.pgd"):
            opcode = typ
            std = _ip_payload(p.ipc, p.ip)
            if o.show_last_ip:
                self._track_ip(p, off, out, buf)
        elif typ == "pad":
            opcode = "pad"
            buf["skip"] = o.no_pad
        elif typ in ("tsc", "cbr", "tma", "mtc", "cyc"):
            opcode = typ
            if typ == "tsc":
                std = f"{p.tsc:x}"
            elif typ == "cbr":
                std = f"{p.ratio:x}"
            elif typ == "tma":
                std = f"{p.ctc:x}, {p.fc:x}"
            elif typ == "mtc":
                std = f"{p.ctc:x}"
            else:
                std = f"{p.value:x}"
            if o.track_time and not (typ == "cyc" and o.no_cyc):
                self._timing(p, off, out, buf)
            if o.no_timing or (typ == "cyc" and o.no_cyc):
                buf["skip"] = True
        elif typ == "psb":
            opcode = "psb"
            if o.track_time:
                self.tcal.update_psb(self.config)
            self.in_header = True
        elif typ == "psbend":
            opcode = "psbend"
            self.in_header = False
        elif typ == "ovf":
            opcode = "ovf"
            if o.track_time:
                if o.keep_tcal_on_ovf:
                    self.tcal.update_ovf(self.config)
                else:
                    self.tcal.reset()
        elif typ == "mode.exec":
            opcode = "mode.exec"
            parts = [s for s in ("cs.d" if p.csd else "",
                                 "cs.l" if p.csl else "") if s]
            std = ", ".join(parts)
            if p.iflag:
                std = std + ", if" if std else "if"
            if o.show_exec_mode:
                buf["id"] = "em"
                buf["track"] = _EXEC_MODE[(p.csl, p.csd)]
        elif typ == "mode.tsx":
            opcode = "mode.tsx"
            std = ", ".join(s for s in ("intx" if p.intx else "",
                                        "abrt" if p.abrt else "") if s)
        elif typ == "pip":
            opcode = "pip"
            std = f"{p.cr3:x}" + (", nr" if p.nr else "")
            buf["id"] = "cr3"
            buf["track"] = f"{p.cr3:016x}"
        elif typ == "vmcs":
            opcode = "vmcs"
            std = f"{p.base:x}"
            buf["id"] = "vmcs"
            buf["track"] = f"{p.base:016x}"
        elif typ == "stop":
            opcode = "stop"
        elif typ == "mnt":
            opcode = "mnt"
            std = f"{p.payload:x}"
        elif typ == "exstop":
            opcode = "exstop"
            std = "ip" if p.ip else ""
        elif typ == "mwait":
            opcode = "mwait"
            std = f"{p.hints:08x}, {p.ext:08x}"
        elif typ == "pwre":
            opcode = "pwre"
            std = (f"c{(p.state + 1) & 0xf}.{(p.sub_state + 1) & 0xf}"
                   + (", hw" if p.hw else ""))
        elif typ == "pwrx":
            opcode = "pwrx"
            std = (f"{_pwrx_wr(p)}: c{(p.last + 1) & 0xf}, "
                   f"c{(p.deepest + 1) & 0xf}")
        elif typ == "ptw":
            opcode = "ptw"
            std = f"{p.plc:x}: {p.payload:x}" + (", ip" if p.ip else "")
        elif typ == "cfe":
            opcode = "cfe"
            std = f"{p.cfe_type}"
            if p.cfe_type in _CFE_VECTOR_DEC:
                std += f": {p.vector}"
            elif p.cfe_type in _CFE_VECTOR_HEX:
                std += f": {p.vector:x}"
            if p.ip:
                std += ", ip"
            buf["id"] = "type"
            buf["track"] = _CFE_NAMES.get(p.cfe_type, "unknown")
        elif typ == "evd":
            opcode = "evd"
            std = f"{p.evd_type}: {p.payload:x}"
            buf["id"] = "type"
            buf["track"] = _EVD_NAMES.get(p.evd_type, "unknown")
        elif typ == "trig":
            opcode = "trig"
            std = f"{p.trbv:02x}"
            if p.ip:
                std += ", ip"
            if p.mult:
                std += ", mult"
            if p.icntv:
                std += f", icnt: {p.icnt}"
        elif typ == "invalid":
            opcode = "<invalid>"
        else:
            opcode = "<unknown>"
        if not buf["skip"] and not o.quiet:
            out.append(self._line(p, opcode, std, buf))
        return out

    def _line(self, p, opcode, std, buf) -> str:
        # ptdump's print_buffer(): fixed-width columns (offset 17, raw 33,
        # opcode 10, payload 25, tracking id 5), separated by one blank.
        o = self.options
        s = ""
        sep = ""
        if o.show_offset:
            s = f"{p.offset:016x} "
            sep = " "
        if o.show_raw_bytes and self.data is not None:
            raw = self.data[p.offset:p.offset + p.size].hex()
            s += f"{sep}{raw:<33s}"
            sep = " "
        if std:
            s += f"{sep}{opcode:<10s}"
        else:
            s += sep + opcode
        if buf["id"]:
            s += f" {std[:24]:<25s} {buf['id']:<5s}{buf['track']}"
        elif std:
            s += " " + (std if opcode.startswith("tnt") else std[:24])
        return s


def ptdump_lines(data: bytes, options: PtdumpOptions = PtdumpOptions(),
                 config: TimingConfig = TimingConfig(), *,
                 cpu=None) -> Iterator[str]:
    """Run ptdump over ``data`` and yield its output lines."""
    dec = PacketDecoder(data, cpu=cpu)
    if dec.cpu_error is not None:
        yield diag(0, "failed to determine errata", dec.cpu_error.code)
    if config.errata != dec.errata:
        config = TimingConfig(config.mtc_freq, config.nom_freq,
                              config.cpuid_0x15_eax, config.cpuid_0x15_ebx,
                              dec.errata)
    fmt = PtdumpFormatter(options, config, dec.buffer)
    # TNT-8 and PAD (most packets) touch no formatter state: their lines
    # are made here unless raw bytes or quiet change the layout.
    fast = not options.quiet and not options.show_raw_bytes
    head = "{:016x}  " if options.show_offset else ""
    tnt8 = head + f"{'tnt.8':<10s} " + "{}"
    pad = None if options.no_pad else head + "pad"
    for p in dec.packets(no_sync=options.no_sync):
        cls = p.__class__
        if fast:
            if cls is Tnt8:
                yield tnt8.format(p[0], _TNT8_TEXT[p[2], p[3]])
                continue
            if cls is Pad:
                if pad is not None:
                    yield pad.format(p[0])
                continue
        if cls is PtError:
            if p.kind:
                yield diag(0, "sync error", p.code)
            else:
                yield diag(p.offset, "error decoding packet", p.code)
                fmt.reset()
            continue
        yield from fmt.format(p)
