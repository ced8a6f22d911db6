"""How the instruction decoder treats event-trace events (interrupt,
iret, vmexit, …), TRIG and iflags: where they bind and what they change."""

from __future__ import annotations


def check_insn_event(dec, ev, insn, x):
    """Status if ``ev`` binds to the instruction just decoded, else None."""
    return None


def check_ip_event(dec, ev, pending: int) -> int:
    """Status for ``ev`` at the current IP (``pending`` if it binds)."""
    return pending


def process_event(dec, ev) -> None:
    """Apply ``ev`` to the decoder state when the user fetches it."""
    return None
