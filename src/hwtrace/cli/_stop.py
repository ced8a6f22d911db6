"""Signals that steer a recording (``hwtrace record``).

While the workload runs: SIGINT (Ctrl-C: the terminal sends it to the whole
foreground process group, the traced program included), SIGTERM and SIGHUP
ask the device to stop -- the program is ended (detached, for ``--pid``)
and the bundle is written with everything until then; SIGUSR2 asks for a
snapshot (the bundle is written now and the program runs on untraced).
Once stopping, a second SIGINT/SIGTERM/SIGHUP interrupts the writing of
the bundle (KeyboardInterrupt): the working files stay, for ``hwtrace
recover``.  The same signal again within DUPLICATE_WINDOW seconds of the
one that stopped is not a second request but the same one sent twice:
``timeout -s INT`` (and ``kill`` of a job) signals hwtrace and then its
whole process group, hwtrace included; a person's second Ctrl-C comes
later than that.
"""

from __future__ import annotations

import signal
import sys
import time

#: the signals that stop a recording, and the exit status hwtrace then has
#: (the shell's convention for "ended by that signal")
STOP_SIGNALS = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}
EXIT_STATUS = {"SIGINT": 128 + signal.SIGINT, "SIGTERM": 128 + signal.SIGTERM,
               "SIGHUP": 128 + signal.SIGHUP, "duration": 0}

#: seconds after a stop signal within which the same signal is its duplicate
DUPLICATE_WINDOW = 0.25


class Steering:
    """A context manager installing the handlers (main thread only) and
    restoring the previous ones on exit."""

    def __init__(self, dev, *, can_snapshot: bool):
        self._dev = dev
        self._can_snapshot = can_snapshot
        self._old: dict[int, object] = {}
        self.stopping = False
        self._first: tuple[int, float] | None = None   # the stop signal, when
        self.clock = time.monotonic

    def __enter__(self) -> "Steering":
        for sig in (*STOP_SIGNALS, signal.SIGUSR2):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def writing(self) -> None:
        """The workload ended: a stop signal now interrupts the writing."""
        self.stopping = True

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGUSR2:
            if self._can_snapshot:
                self._dev.request_snapshot("SIGUSR2")
            else:
                print(f"hwtrace: SIGUSR2 ignored: engine {self._dev.engine.name} "
                      f"can't take a snapshot mid-run", file=sys.stderr)
            return
        now = self.clock()
        if self._first is not None and self._first[0] == signum and \
                now - self._first[1] < DUPLICATE_WINDOW:
            return
        if self._first is None and not self.stopping and \
                self._dev.stop_reason == STOP_SIGNALS[signum]:
            # the engine saw this very signal reach the program first and
            # asked for the stop on hwtrace's behalf: the same request
            self.stopping = True
            self._first = (signum, now)
            return
        if self.stopping or self._dev.stop_reason is not None:
            raise KeyboardInterrupt
        self.stopping = True
        self._first = (signum, now)
        self._dev.request_stop(STOP_SIGNALS[signum])
