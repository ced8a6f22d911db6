"""Intel PT time tracking (TSC/TMA/MTC/CYC/CBR) and CYC calibration.

Implements the SDM's timing rules ("Timing Information", "Calculating the
TSC from MTC/TMA/CYC") with libipt's pt_time/pt_time_cal semantics, so the
flow decoder and ``hwtrace dump --time`` estimate the same TSC as the
reference decoder:

- TSC sets the time and the base of the current MTC period;
- TMA (right after a TSC) gives the CTC and FastCounter at that TSC: the
  base moves back by FC, and the CTC bits seed the MTC arithmetic;
- MTC advances by ``ctc_delta * cpuid[0x15].ebx / cpuid[0x15].eax``
  (CTC counts in units of 2^mtc_freq, payload bits [mtc_freq+7:mtc_freq]);
- CYC adds ``cyc * fcr`` FastCounter ticks, fcr (fast-counter ratio, fixed
  point with ``FCR_SHIFT`` fraction bits) coming from calibration;
- calibration (:class:`TimeCal`) derives fcr from the nominal frequency and
  CBR (``nom_freq / cbr``), from CYCs between MTCs, or between TSCs in PSB+.

Both classes are small mutable state holders with one method per packet
(``update_tsc`` ...).  Methods return ``None`` or a PtError describing why
the packet could not be used (the state stays consistent either way), so
callers decide whether to report it (ptdump does, as "error updating time").

:class:`TimingConfig` carries the configuration: ``mtc_freq``
(IA32_RTIT_CTL.MTCFreq), ``nom_freq`` (MSR_PLATFORM_INFO[15:8]),
``cpuid_0x15_eax``/``ebx`` (TSC/core crystal clock ratio) and the CPU
errata (``skl168`` affects calibration).
"""

from __future__ import annotations

from collections import namedtuple

from hwtrace.pt import errors as E
from hwtrace.pt.cpu import NO_ERRATA
from hwtrace.pt.errors import PtError

FCR_SHIFT = 8
_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1
_TMA_CTC_BITS = 16
_TMA_CTC_MASK = 0xffff
_MTC_BITS = 8
_TSC_BITS = 56

_BAD_PACKET = PtError(E.BAD_PACKET, 0)
_BAD_CONTEXT = PtError(E.BAD_CONTEXT, 0)
_BAD_CONFIG = PtError(E.BAD_CONFIG, 0)
_INTERNAL = PtError(E.INTERNAL, 0)
_NO_TIME = PtError(E.NO_TIME, 0)
_NO_CBR = PtError(E.NO_CBR, 0)


class TimingConfig(namedtuple("TimingConfig", "mtc_freq nom_freq "
                              "cpuid_0x15_eax cpuid_0x15_ebx errata",
                              defaults=(0, 0, 0, 0, NO_ERRATA))):
    """``mtc_freq``, ``nom_freq``, ``cpuid_0x15_eax``, ``cpuid_0x15_ebx``
    (ints, default 0) and ``errata`` (an :class:`hwtrace.pt.cpu.Errata`).
    A NamedTuple, not a frozen dataclass: created at start-up (see
    hwtrace._records)."""
    __slots__ = ()


def ctc_delta(ctc: int, last_ctc: int, config: TimingConfig):
    """CTC distance, correcting one wrap-around; int or PtError."""
    if ctc < last_ctc:
        ctc = (ctc + (1 << (config.mtc_freq + _MTC_BITS))) & _U32
        if ctc < last_ctc:
            return _BAD_PACKET
    return ctc - last_ctc


def ctc_to_fc(ctc: int, config: TimingConfig):
    """CTC ticks in FastCounter units (times cpuid[0x15].ebx/eax)."""
    eax, ebx = config.cpuid_0x15_eax, config.cpuid_0x15_ebx
    if not eax or not ebx:
        return _BAD_CONFIG
    return ((ctc * ebx) & _U64) // eax


class Time:
    """The current time estimate (libipt's struct pt_time)."""

    __slots__ = ("tsc", "base", "fc", "ctc", "ctc_cyc", "lost_mtc",
                 "lost_cyc", "cbr", "have_tsc", "have_cbr", "have_tma",
                 "have_mtc")

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.tsc = self.base = self.fc = 0
        self.ctc = self.ctc_cyc = 0
        self.lost_mtc = self.lost_cyc = 0
        self.cbr = 0
        self.have_tsc = self.have_cbr = self.have_tma = self.have_mtc = False

    def query_tsc(self):
        """The estimated TSC, or PtError "no timing information"."""
        if not self.have_tsc:
            return _NO_TIME
        return self.tsc

    def query_cbr(self):
        if not self.have_cbr:
            return _NO_CBR
        return self.cbr

    def update_tsc(self, tsc: int, config: TimingConfig = None):
        self.have_tsc = True
        self.have_tma = self.have_mtc = False
        self.tsc = self.base = tsc
        self.ctc = 0
        self.fc = 0
        self.lost_mtc = self.lost_cyc = 0
        return None

    def update_cbr(self, ratio: int, config: TimingConfig = None):
        if not ratio:
            return _BAD_PACKET
        self.have_cbr = True
        self.cbr = ratio
        return None

    def update_tma(self, ctc: int, fc: int, config: TimingConfig):
        if not self.have_tsc or self.have_tma:
            return _BAD_CONTEXT
        if self.have_mtc:
            return _INTERNAL
        mtc_hi = config.mtc_freq + _MTC_BITS
        ctc_mask = (1 << mtc_hi) - 1
        self.have_tma = True
        self.base = (self.base - fc) & _U64
        self.fc = (self.fc + fc) & _U64
        if mtc_hi <= _TMA_CTC_BITS:
            self.have_mtc = True
        self.ctc = self.ctc_cyc = ctc & ctc_mask & _U32
        return None

    def update_mtc(self, ctc_payload: int, config: TimingConfig):
        have_tsc, have_tma, have_mtc = \
            self.have_tsc, self.have_tma, self.have_mtc
        if have_tsc and not have_tma:
            return None
        base = self.base
        last_ctc = self.ctc
        mtc_freq = config.mtc_freq
        ctc = (ctc_payload << mtc_freq) & _U32
        if self.fc or self.lost_cyc or not have_mtc:
            self.ctc_cyc = ctc
        self.have_mtc = True
        self.fc = 0
        self.ctc = ctc
        self.lost_cyc = 0
        if not have_mtc:
            if not have_tma:
                return None
            if last_ctc & ~_TMA_CTC_MASK:
                return _INTERNAL
            ctc_lo = ctc & _TMA_CTC_MASK
            ctc_hi = ctc & ~_TMA_CTC_MASK & _U32
            if ctc_lo < last_ctc:
                ctc_hi = (ctc_hi - (1 << _TMA_CTC_BITS)) & _U32
                ctc_hi &= (0xff << mtc_freq) & _U32
            last_ctc |= ctc_hi
        delta = ctc_delta(ctc, last_ctc, config)
        if delta.__class__ is PtError:
            self.lost_mtc += 1
            return delta
        tsc = ctc_to_fc(delta, config)
        if tsc.__class__ is PtError:
            return tsc
        base = (base + tsc) & _U64
        self.tsc = self.base = base
        return None

    def _adjust_cyc(self, cyc: int, config: TimingConfig, fcr: int):
        last_ctc = self.ctc_cyc
        ctc = self.ctc
        if ctc == last_ctc:
            return cyc
        delta = ctc_delta(ctc, last_ctc, config)
        if delta.__class__ is PtError:
            return delta
        fc = ctc_to_fc(delta, config)
        if fc.__class__ is PtError:
            return fc
        old_cyc = ((fc << FCR_SHIFT) & _U64) // fcr
        if cyc < old_cyc:
            cyc = old_cyc
        return cyc - old_cyc

    def update_cyc(self, cyc: int, config: TimingConfig, fcr: int):
        """Account ``cyc`` core cycles, with calibration ``fcr`` (0: not
        calibrated: the CYC is counted as lost)."""
        if not fcr:
            self.lost_cyc += 1
            return None
        fc = self.fc
        if not fc:
            cyc = self._adjust_cyc(cyc, config, fcr)
            if cyc.__class__ is PtError:
                return cyc
        fc = (fc + (((cyc * fcr) & _U64) >> FCR_SHIFT)) & _U64
        self.fc = fc
        self.tsc = (self.base + fc) & _U64
        return None


class TimeCal:
    """CYC-to-FastCounter calibration (libipt's struct pt_time_cal)."""

    __slots__ = ("fcr", "min_fcr", "max_fcr", "tsc", "cyc_tsc", "cyc_mtc",
                 "ctc", "lost_mtc", "have_mtc", "check_skl168")

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.fcr = 0
        self.min_fcr = _U64
        self.max_fcr = 0
        self.tsc = self.cyc_tsc = self.cyc_mtc = 0
        self.ctc = 0
        self.lost_mtc = 0
        self.have_mtc = False
        self.check_skl168 = False

    def have_fcr(self) -> bool:
        return self.min_fcr <= self.max_fcr

    def query_fcr(self):
        """The fast-counter ratio (fixed point, FCR_SHIFT fraction bits),
        or PtError "no timing information" before calibration."""
        if not self.have_fcr():
            return _NO_TIME
        return self.fcr

    def set_fcr(self, fcr: int) -> None:
        self.fcr = fcr
        if fcr < self.min_fcr:
            self.min_fcr = fcr
        if fcr > self.max_fcr:
            self.max_fcr = fcr

    def update_psb(self, config: TimingConfig):
        if config.errata.skl168:
            self.check_skl168 = True
        return None

    def update_tsc(self, tsc: int, config: TimingConfig = None):
        """A TSC outside PSB+ (may follow a loss of time: not used)."""
        self.tsc = tsc
        self.cyc_tsc = 0
        return None

    def header_tsc(self, tsc: int, config: TimingConfig = None):
        """A TSC in PSB+: calibrate from the CYCs since the last TSC."""
        last_tsc = self.tsc
        cyc = self.cyc_tsc
        self.tsc = tsc
        self.cyc_tsc = 0
        if not last_tsc or not cyc:
            return None
        if self.have_mtc:
            return None
        if tsc < last_tsc:
            tsc += 1 << _TSC_BITS
            if tsc < last_tsc:
                return _BAD_PACKET
        delta = tsc - last_tsc
        if delta & ~(_U64 >> FCR_SHIFT):
            return _INTERNAL
        self.set_fcr((delta << FCR_SHIFT) // cyc)
        return None

    def update_cbr(self, ratio: int, config: TimingConfig):
        """A CBR outside PSB+: a frequency change, restart calibration."""
        self.reset()
        return self.header_cbr(ratio, config)

    def header_cbr(self, ratio: int, config: TimingConfig):
        p1 = config.nom_freq
        if not p1:
            return None
        if not ratio:
            return _BAD_PACKET
        self.set_fcr((p1 << FCR_SHIFT) // ratio)
        return None

    def update_tma(self, ctc: int, fc: int, config: TimingConfig = None):
        return None

    def update_mtc(self, ctc_payload: int, config: TimingConfig):
        last_ctc = self.ctc
        have_mtc = self.have_mtc
        cyc = self.cyc_mtc
        check_skl168 = self.check_skl168
        self.check_skl168 = False
        ctc = (ctc_payload << config.mtc_freq) & _U32
        if not have_mtc:
            self.cyc_mtc = 0
            self.ctc = ctc
            self.have_mtc = True
            return None
        if not cyc:
            return None
        self.have_mtc = True
        self.cyc_mtc = 0
        self.ctc = ctc
        self.lost_mtc += 1
        delta = ctc_delta(ctc, last_ctc, config)
        if delta.__class__ is PtError:
            return delta
        fc = ctc_to_fc(delta, config)
        if fc.__class__ is PtError:
            return fc
        if fc & ~(_U64 >> FCR_SHIFT):
            return _INTERNAL
        fcr = (fc << FCR_SHIFT) // cyc
        if check_skl168:
            # SKL168: CYC packets can be dropped right before PSB: skip this
            # calibration if MTCs were lost or a wrap CYC looks lost.
            if (1 << config.mtc_freq) < delta:
                return None
            if config.mtc_freq < 10 and self.have_fcr():
                dfc = ((self.fcr * (cyc + 0xf00)) & _U64) >> FCR_SHIFT
                if dfc < fc:
                    return None
        self.set_fcr(fcr)
        self.lost_mtc = 0
        return None

    def update_cyc(self, cyc: int, config: TimingConfig = None):
        self.cyc_mtc = (self.cyc_mtc + cyc) & _U64
        self.cyc_tsc = (self.cyc_tsc + cyc) & _U64
        return None

    def update_ovf(self, config: TimingConfig = None):
        """Keep the calibration across an overflow, drop partial sums."""
        self.tsc = self.cyc_tsc = self.cyc_mtc = 0
        self.ctc = 0
        self.have_mtc = False
        return None
