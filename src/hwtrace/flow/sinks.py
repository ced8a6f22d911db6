"""Sinks for :mod:`.session`: ptxed text, ptoracle JSON lines, counting.

A sink receives decoded items and writes lines through the ``write``
callable it was given (the CLI passes ``sys.stdout.write``); it never
opens files itself.
"""

from __future__ import annotations

from . import ptxed


class CountSink:
    """Counts only (``--quiet --stat``)."""

    needs_offset = False

    def __init__(self):
        self.insns = 0
        self.blocks = 0
        self.events = 0
        self.errors = 0

    def insn(self, insn, offset):
        self.insns += 1

    def block(self, block, offset):
        self.blocks += 1
        self.insns += block.ninsn

    def event(self, ev, offset):
        self.events += 1

    def error(self, kind, offset, ip, code):
        self.errors += 1

    def status(self, name, offset):
        pass


class PtxedSink(CountSink):
    """ptxed's ``--no-inst`` text; with ``notes`` (an
    :class:`hwtrace.listing.single.InsnNotes`) each instruction line goes
    on with what it returns (function, disassembly)."""

    def __init__(self, write, *, quiet=False, event_ip=False,
                 event_time=False, print_offset=False, show_blocks=False,
                 block_ids=False, notes=None):
        super().__init__()
        self.notes = notes
        self.write = write
        self.quiet = quiet
        self.event_ip = event_ip
        self.event_time = event_time
        self.print_offset = print_offset
        self.show_blocks = show_blocks
        self.block_ids = block_ids
        self.needs_offset = print_offset

    def _line(self, insn, offset) -> str:
        s = ptxed.insn_line(insn.ip, insn.speculative,
                            offset if self.print_offset else None)
        if self.notes is not None:
            s += self.notes(insn.ip, insn.size, insn.iclass, insn.mode)
        return s + "\n"

    def insn(self, insn, offset):
        self.insns += 1
        if not self.quiet:
            self.write(self._line(insn, offset))

    def block(self, block, offset):
        self.blocks += 1
        self.insns += block.ninsn
        if self.quiet:
            return
        w = self.write
        if self.show_blocks:
            w(f"[block {self.blocks:x}]\n" if self.block_ids else "[block]\n")
        for insn in block.insns:
            w(self._line(insn, offset))

    def event(self, ev, offset):
        self.events += 1
        if self.quiet or ev.status_update:
            return
        self.write(ptxed.event_line(
            ev, self.event_ip, self.event_time,
            offset if self.print_offset else None) + "\n")

    def error(self, kind, offset, ip, code):
        self.errors += 1
        self.write(ptxed.error_line(offset, ip, kind, code) + "\n")

    def status(self, name, offset):
        if name == "end_of_trace" and not self.quiet:
            self.write("[end of trace]\n")


_MODE = {"16bit": "16bit", "32bit": "32bit", "64bit": "64bit"}

# ptoracle's event field order per type: (json name, attribute, is_ip)
_EVENT_FIELDS = {
    "enabled": (("ip", "ip", False), ("resumed", "resumed", False)),
    "disabled": (("ip", "ip", True),),
    "async_disabled": (("at", "at", False), ("ip", "ip", True)),
    "async_branch": (("from", "from_", False), ("to", "to", True)),
    "paging": (("cr3", "cr3", False), ("non_root", "non_root", False)),
    "async_paging": (("cr3", "cr3", False), ("non_root", "non_root", False),
                     ("ip", "ip", False)),
    "overflow": (("ip", "ip", True),),
    "exec_mode": (("mode", "mode", False), ("ip", "ip", True)),
    "tsx": (("speculative", "speculative", False),
            ("aborted", "aborted", False), ("ip", "ip", True)),
    "stop": (),
    "vmcs": (("base", "base", False),),
    "async_vmcs": (("base", "base", False), ("ip", "ip", False)),
    "exstop": (("ip", "ip", True),),
    "mwait": (("hints", "hints", False), ("ext", "ext", False),
              ("ip", "ip", True)),
    "pwre": (("state", "state", False), ("sub_state", "sub_state", False),
             ("hw", "hw", False)),
    "pwrx": (("last", "last", False), ("deepest", "deepest", False),
             ("interrupt", "interrupt", False), ("store", "store", False),
             ("autonomous", "autonomous", False)),
    "ptwrite": (("size", "size", False), ("payload", "payload", False),
                ("ip", "ip", True)),
    "tick": (("ip", "ip", True),),
    "cbr": (("ratio", "ratio", False),),
    "mnt": (("payload", "payload", False),),
    "iflags": (("iflag", "iflag", False), ("ip", "ip", True)),
    "iret": (("ip", "ip", True),),
    "smi": (("ip", "ip", True),),
    "rsm": (("ip", "ip", True),),
    "sipi": (("vector", "vector", False),),
    "init": (("ip", "ip", True),),
    "vmentry": (("ip", "ip", True),),
    "shutdown": (("ip", "ip", True),),
    "uintr": (("vector", "vector", False), ("ip", "ip", True)),
    "uiret": (("ip", "ip", True),),
    "trig": (("trbv", "trbv", False), ("icnt", "icnt", False),
             ("mult", "mult", False), ("ip", "ip", True)),
    "swintr": (("vector", "vector", False), ("ip", "ip", True)),
    "syscall": (("ip", "ip", True),),
}


def event_json(ev, offset: int) -> dict:
    """ptoracle's ``insn`` event object for ``ev``."""
    d = {"event": ev.type, "offset": offset,
         "ip_suppressed": bool(ev.ip_suppressed),
         "status_update": bool(ev.status_update)}
    if ev.has_tsc:
        d["tsc"] = ev.tsc
        d["lost_mtc"] = ev.lost_mtc
        d["lost_cyc"] = ev.lost_cyc
    if ev.type == "interrupt":
        d["vector"] = ev.get("vector", 0)
        d["has_cr2"] = bool(ev.get("has_cr2", False))
        if d["has_cr2"]:
            d["cr2"] = ev.get("cr2", 0)
        if not ev.ip_suppressed:
            d["ip"] = ev.ip
        return d
    if ev.type == "vmexit":
        for flag, name in (("has_vector", "vector"), ("has_vmxr", "vmxr"),
                           ("has_vmxq", "vmxq")):
            if ev.get(flag, False):
                d[name] = ev.get(name, 0)
        if not ev.ip_suppressed:
            d["ip"] = ev.ip
        return d
    for key, attr, is_ip in _EVENT_FIELDS.get(ev.type, ()):
        if is_ip and ev.ip_suppressed:
            continue
        v = ev.get(attr, 0)
        if isinstance(v, bool) or attr in ("resumed", "non_root",
                                            "speculative", "aborted", "hw",
                                            "interrupt", "store",
                                            "autonomous", "iflag", "mult"):
            v = bool(v)
        d[key] = v
    return d


class JsonSink(CountSink):
    """ptoracle ``insn`` JSON lines; ``notes`` (an
    :class:`hwtrace.listing.single.InsnNotes`) adds its keys after
    ``"iclass"``."""

    def __init__(self, write, *, print_offset=False, notes=None):
        super().__init__()
        self.notes = notes
        self.write = write
        self.print_offset = print_offset
        self.needs_offset = print_offset
        import json     # this sink's only: not on the counts' start-up
        self._dumps = json.dumps

    def _emit(self, d):
        self.write(self._dumps(d, separators=(",", ":")) + "\n")

    def insn(self, insn, offset):
        self.insns += 1
        if self.notes is not None:
            from hwtrace.listing.jsonl import insn_head, insn_tail
            from .batches import MODE_NUMBER
            self.write(insn_head(insn.ip, insn.size, insn.iclass,
                                 MODE_NUMBER.get(insn.mode, 0),
                                 self.notes(insn.ip, insn.size, insn.iclass,
                                            insn.mode)) +
                       insn_tail(insn.speculative, insn.truncated,
                                 offset if self.print_offset else None))
            return
        d = {"ip": insn.ip, "size": insn.size, "iclass": insn.iclass_name,
             "mode": insn.mode or "unknown", "speculative": insn.speculative}
        if insn.truncated:
            d["truncated"] = True
        if self.print_offset:
            d["offset"] = offset
        self._emit(d)

    def block(self, block, offset):
        self.blocks += 1
        for insn in block.insns:
            self.insn(insn, offset)

    def event(self, ev, offset):
        self.events += 1
        self._emit(event_json(ev, offset))

    def error(self, kind, offset, ip, code):
        self.errors += 1
        self._emit({"error": code, "kind": kind, "offset": offset, "ip": ip})

    def status(self, name, offset):
        self._emit({"status": name, "offset": offset})

    def status_ex(self, name, offset, *, ip_suppressed: bool):
        self._emit({"status": name, "offset": offset,
                    "ip_suppressed": ip_suppressed})
