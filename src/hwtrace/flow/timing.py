"""Time as the flow decoders see it: an adapter over the packet layer's
tracker (:mod:`hwtrace.pt.timing`, libipt's pt_time / pt_time_cal) that
applies timing packets the way libipt's event decoder does, remembers the
time of the last query (``mark``) and stamps events.
"""

from __future__ import annotations

from hwtrace.pt import errors as E
from hwtrace.pt.cpu import Errata
from hwtrace.pt.errors import PtError
from hwtrace.pt.timing import Time, TimeCal, TimingConfig


class TimeError(Exception):
    def __init__(self, code: str):
        self.code = code


def _check(r) -> None:
    # Configuration errors only make timing imprecise; others are errors.
    if r.__class__ is PtError and r.code != E.BAD_CONFIG:
        raise TimeError(r.code)


class FlowTime:
    def __init__(self, config):
        e = config.errata
        self.tconfig = TimingConfig(
            mtc_freq=config.mtc_freq, nom_freq=config.nom_freq,
            cpuid_0x15_eax=config.cpuid_0x15_eax,
            cpuid_0x15_ebx=config.cpuid_0x15_ebx,
            errata=Errata(skl168=e.skl168))
        self.keep_tcal = config.keep_tcal_on_ovf
        self.time = Time()
        self.tcal = TimeCal()
        self._marked = (0, 0, 0, False)

    def reset(self) -> None:
        self.time.reset()
        self.tcal.reset()
        self._marked = (0, 0, 0, False)

    @property
    def cbr(self) -> int:
        return self.time.cbr

    def update(self, pkt, header: bool = False) -> None:
        """Apply a timing packet (TSC, CBR, TMA, MTC, CYC)."""
        t = pkt.type
        cfg = self.tconfig
        time, tcal = self.time, self.tcal
        if t == "tsc":
            _check(tcal.header_tsc(pkt.tsc, cfg) if header
                   else tcal.update_tsc(pkt.tsc, cfg))
            _check(time.update_tsc(pkt.tsc, cfg))
        elif t == "cbr":
            _check(tcal.header_cbr(pkt.ratio, cfg) if header
                   else tcal.update_cbr(pkt.ratio, cfg))
            _check(time.update_cbr(pkt.ratio, cfg))
        elif t == "tma":
            _check(tcal.update_tma(pkt.ctc, pkt.fc, cfg))
            _check(time.update_tma(pkt.ctc, pkt.fc, cfg))
        elif t == "mtc":
            _check(tcal.update_mtc(pkt.ctc, cfg))
            _check(time.update_mtc(pkt.ctc, cfg))
        elif t == "cyc":
            _check(tcal.update_cyc(pkt.value, cfg))
            fcr = tcal.query_fcr()
            if fcr.__class__ is PtError:
                fcr = 0
            _check(time.update_cyc(pkt.value, cfg, fcr))

    def psb(self) -> None:
        self.tcal.update_psb(self.tconfig)

    def overflow(self) -> None:
        """At OVF: keep the time; keep calibration only if asked to."""
        if self.keep_tcal:
            self.tcal.update_ovf(self.tconfig)
        else:
            self.tcal.reset()

    def mark(self) -> None:
        t = self.time
        self._marked = (t.tsc, t.lost_mtc, t.lost_cyc, t.have_tsc)

    def query(self):
        """(tsc, lost_mtc, lost_cyc, have_tsc) at the last query."""
        return self._marked

    def stamp(self, ev) -> None:
        t = self.time
        ev.tsc = t.tsc
        ev.lost_mtc = t.lost_mtc
        ev.lost_cyc = t.lost_cyc
        ev.has_tsc = t.have_tsc
