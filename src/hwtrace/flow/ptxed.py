"""ptxed's text format for instructions, events, errors and statistics.

Pure formatting (strings in, strings out): the decoders know nothing of
it and the CLI only prints what these functions return.
"""

from __future__ import annotations

_MODE_TEXT = {"16bit": "16-bit", "32bit": "32-bit", "64bit": "64-bit",
              None: "<unknown>"}


def insn_line(ip: int, speculative: bool, offset: int | None = None,
              time: int | None = None) -> str:
    s = ""
    if offset is not None:
        s += f"{offset:016x}  "
    if time is not None:
        s += f"{time:016x}  "
    if speculative:
        s += "? "
    return s + f"{ip:016x}"


def error_line(offset: int, ip: int, kind: str, message: str) -> str:
    return f"[{offset:x}, {ip:x}: {kind}: {message}]"


def _ip(ev, show_ip: bool, name: str = "ip") -> str:
    if show_ip and not ev.ip_suppressed:
        return f", ip: {getattr(ev, name, 0):016x}"
    return ""


def event_line(ev, show_ip: bool = False, show_time: bool = False,
               offset: int | None = None) -> str:
    """The bracketed line ptxed prints for ``ev`` (status updates are not
    printed by ptxed; callers skip them)."""
    s = "["
    if offset is not None:
        s += f"{offset:016x}  "
    if show_time and ev.has_tsc:
        s += f"{ev.tsc:016x}  "
    t = ev.type
    if t == "enabled":
        s += "resumed" if ev.get("resumed", False) else "enabled"
        if show_ip:
            s += f", ip: {ev.ip:016x}"
    elif t == "disabled":
        s += "disabled" + _ip(ev, show_ip)
    elif t == "async_disabled":
        s += "disabled"
        if show_ip:
            s += f", at: {ev.at:016x}" + _ip(ev, True)
    elif t == "async_branch":
        s += "interrupt"
        if show_ip:
            s += f", from: {ev.from_:016x}"
            if not ev.ip_suppressed:
                s += f", to: {ev.get('to', 0):016x}"
    elif t in ("paging", "async_paging"):
        s += f"paging, cr3: {ev.cr3:016x}" + (", nr" if ev.non_root else "")
        if t == "async_paging" and show_ip:
            s += f", ip: {ev.ip:016x}"
    elif t == "overflow":
        s += "overflow" + _ip(ev, show_ip)
    elif t == "exec_mode":
        s += f"exec mode: {_MODE_TEXT.get(ev.mode, '<invalid>')}"
        s += _ip(ev, show_ip)
    elif t == "tsx":
        if ev.aborted:
            s += "aborted"
        elif ev.speculative:
            s += "begin transaction"
        else:
            s += "committed"
        s += _ip(ev, show_ip)
    elif t == "stop":
        s += "stopped"
    elif t in ("vmcs", "async_vmcs"):
        s += f"vmcs, base: {ev.base:016x}"
        if t == "async_vmcs" and show_ip:
            s += f", ip: {ev.ip:016x}"
    elif t == "exstop":
        s += "exstop" + _ip(ev, show_ip)
    elif t == "mwait":
        s += f"mwait {ev.hints:x} {ev.ext:x}" + _ip(ev, show_ip)
    elif t == "pwre":
        s += f"pwre c{(ev.state + 1) & 0xf}.{(ev.sub_state + 1) & 0xf}"
        if ev.hw:
            s += " hw"
    elif t == "pwrx":
        s += "pwrx "
        if ev.interrupt:
            s += "int: "
        if ev.store:
            s += "st: "
        if ev.autonomous:
            s += "hw: "
        s += f"c{(ev.last + 1) & 0xf} (c{(ev.deepest + 1) & 0xf})"
    elif t == "ptwrite":
        s += f"ptwrite: {ev.payload:x}" + _ip(ev, show_ip)
    elif t == "tick":
        s += "tick" + _ip(ev, show_ip)
    elif t == "cbr":
        s += f"cbr: {ev.ratio:x}"
    elif t == "mnt":
        s += f"mnt: {ev.payload:x}"
    elif t == "tip":
        s += f"tip: {ev.ip:x}"
    elif t == "tnt":
        s += "tnt: "
        index = ev.size
        while index:
            s += "!" if ev.bits & index else "."
            index >>= 1
    elif t == "iflags":
        s += "interrupts " + ("enabled" if ev.iflag else "disabled")
        s += _ip(ev, show_ip)
    elif t == "interrupt":
        s += f"interrupt {ev.vector}"
        if ev.get("has_cr2", False):
            s += f", cr2: {ev.cr2:016x}"
        s += _ip(ev, show_ip)
    elif t in ("iret", "smi", "rsm", "init", "vmentry", "shutdown", "uiret",
               "syscall"):
        s += t + _ip(ev, show_ip)
    elif t == "sipi":
        s += f"sipi: {ev.vector:x}"
    elif t == "vmexit":
        s += "vmexit"
        if ev.get("has_vector", False):
            s += f", intr: {ev.vector}"
        if ev.get("has_vmxr", False):
            s += f", vmxr: {ev.vmxr:016x}"
        if ev.get("has_vmxq", False):
            s += f", vmxq: {ev.vmxq:016x}"
        s += _ip(ev, show_ip)
    elif t == "uintr":
        s += f"uintr {ev.vector}" + _ip(ev, show_ip)
    elif t == "swintr":
        s += f"swintr {ev.vector}" + _ip(ev, show_ip)
    elif t == "trig":
        s += f"trig {ev.trbv:02x}"
        if ev.get("mult", False):
            s += ", mult"
        s += _ip(ev, show_ip)
        if ev.get("icnt", 0):
            s += f", icnt: {ev.icnt}"
    return s + "]"


def stats_lines(insn: int | None, blocks: int | None) -> list[str]:
    out = []
    if insn is not None:
        out.append(f"insn: {insn}.")
    if blocks is not None:
        out.append(f"blocks:\t{blocks}.")
    return out
