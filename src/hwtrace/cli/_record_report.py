"""What ``hwtrace record`` says about the bundle it wrote (on stderr: stdout
is the traced program's).

One line says what was written -- streams, instructions observed, bytes,
lost data -- and how the recording ended; then one warning per stream
whose buffer filled (stop-on-full: the trace ends early, the rest is lost)
or wrapped (circular: the oldest part was overwritten), because a decoder
then finds fewer instructions than were observed.
"""

from __future__ import annotations

import sys


def _n(x: int) -> str:
    return f"{x:,}"


def _bytes(x: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if x >= 1 << shift:
            v = f"{x / (1 << shift):.1f}"
            return f"{v[:-2] if v.endswith('.0') else v} {unit}"
    return f"{_n(x)} bytes"


def lines(bundle, ended: str) -> list[str]:
    """The summary line and the warnings for ``bundle`` (a Bundle)."""
    streams = bundle.streams
    insns = sum(s.instructions_observed for s in streams)
    size = sum(s.size for s in streams)
    lost = sum(s.lost_bytes for s in streams)
    full = [s for s in streams if s.stopped]
    wrapped = [s for s in streams if s.wrapped]
    loss = []
    if lost or full:
        loss.append(f"{_bytes(lost)} lost ({len(full)} buffer(s) filled)")
    if wrapped:
        over = sum(max(0, (s.generated_bytes or 0) - s.size) for s in wrapped)
        loss.append(f"{_bytes(over)} overwritten ({len(wrapped)} circular buffer(s) wrapped)")
    out = [f"hwtrace: wrote {bundle.path}: {len(streams)} stream(s), {_n(insns)} instructions "
           f"observed, {_bytes(size)}; {'; '.join(loss) if loss else 'nothing lost'}; {ended}"]
    for s in full:
        out.append(f"hwtrace: warning: {s.file}: its stop-on-full buffer filled after "
                   f"{_bytes(s.capture_end)}: the trace stops there and the "
                   f"{_bytes(s.lost_bytes)} after it were lost (a decoder finds fewer than "
                   f"the {_n(s.instructions_observed)} instructions observed; use a larger "
                   f"--buffer-size, or --circular to keep the end)")
    for s in wrapped:
        gen = f" of {_bytes(s.generated_bytes)}" if s.generated_bytes else ""
        out.append(f"hwtrace: warning: {s.file}: its circular buffer wrapped: it keeps the "
                   f"newest {_bytes(s.size)}{gen} (a decoder finds fewer than the "
                   f"{_n(s.instructions_observed)} instructions observed)")
    return out


def say(bundle, ended: str) -> None:
    for line in lines(bundle, ended):
        print(line, file=sys.stderr)
