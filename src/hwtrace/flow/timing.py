"""Time as the flow decoders see it: a thin adapter over the packet
layer's timing tracker (:mod:`hwtrace.pt.timing`, libipt's pt_time
semantics) that remembers the time of the last query and stamps events.

Until that module is available only TSC and CBR are tracked.
"""

from __future__ import annotations


class FlowTime:
    def __init__(self, config):
        self.config = config
        self.reset()

    def reset(self) -> None:
        self.tsc = 0
        self.have_tsc = False
        self.lost_mtc = 0
        self.lost_cyc = 0
        self.cbr = 0
        self._marked = (0, 0, 0, False)

    def update(self, pkt) -> None:
        t = pkt.type
        if t == "tsc":
            self.tsc = pkt.tsc
            self.have_tsc = True
        elif t == "cbr":
            self.cbr = pkt.ratio

    def overflow(self) -> None:
        pass

    def mark(self) -> None:
        self._marked = (self.tsc, self.lost_mtc, self.lost_cyc, self.have_tsc)

    def query(self):
        return (self.tsc, self.lost_mtc, self.lost_cyc, self.have_tsc)

    def stamp(self, ev) -> None:
        if self.have_tsc:
            ev.has_tsc = True
            ev.tsc = self.tsc
            ev.lost_mtc = self.lost_mtc
            ev.lost_cyc = self.lost_cyc
