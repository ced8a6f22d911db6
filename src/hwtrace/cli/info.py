"""``hwtrace info``: this machine's Intel PT capabilities and which engines
work here; ``hwtrace info DIR``: what a trace bundle holds."""

from __future__ import annotations

import json

from hwtrace.cli import CliError, help_of


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "info", help=help_of("info"),
        description="Print this CPU's Intel PT capabilities (CPUID leaf 0x14), "
                    "each trace engine and whether it can run here -- and if "
                    "not, why -- and the capabilities of the engine --engine "
                    "(default: the one 'auto' picks) offers.  With a bundle "
                    "DIR: how and what it recorded (command, engine, trace "
                    "configuration, how it ended), its streams and what they "
                    "lost, its processes and threads, and whether each code "
                    "image can be found here -- without decoding it.")
    p.add_argument("bundle", nargs="?", metavar="DIR",
                   help="a trace bundle to describe instead of this machine")
    p.add_argument("--engine", default="auto", metavar="NAME",
                   help="whose capabilities to show (auto, perf, emulated, qemu, ptrace)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _engine_caps(name: str):
    """(engine name, Capabilities, CpuInfo, None) or (None, None, None, reason)."""
    from hwtrace import engines
    from hwtrace.control.errors import TraceError
    try:
        eng = engines.create(name)
    except TraceError as e:
        return None, None, None, e.message
    except Exception as e:  # an engine that fails to start is reported, not raised
        return None, None, None, f"{type(e).__name__}: {e}"
    try:
        return eng.name, eng.capabilities, eng.cpu_info, None
    except Exception as e:
        return None, None, None, f"{type(e).__name__}: {e}"
    finally:
        try:
            eng.close()
        except Exception:
            pass


def gather(engine: str = "auto") -> dict:
    from hwtrace import engines
    from hwtrace.control.host import host_cpu
    host = host_cpu()
    names = [*engines.ENGINE_NAMES, *engines.ALIASES]
    avail = {n: engines.probe(n) for n in names}
    auto = next((n for n in engines.ENGINE_NAMES if avail[n].available), None)
    if engine != "auto" and engine not in avail:
        raise CliError(f"info: unknown engine {engine!r} (known: auto, {', '.join(names)})")
    chosen = auto if engine == "auto" else engine
    out = {
        "cpu": host.cpu.to_dict(),
        "intel_pt": {"available": host.capabilities.pt, "source": host.source,
                     "reason": host.reason, "capabilities": host.capabilities.to_dict()},
        "engines": {n: {"available": a.available, "reason": a.reason} for n, a in avail.items()},
        "auto": auto,
    }
    out["debug_hardware"] = debug_hardware()
    if chosen is not None and avail[chosen].available:
        name, caps, cpu, why = _engine_caps(chosen)
        out["engine"] = {"name": chosen, "available": why is None, "reason": why or "",
                         "capabilities": caps.to_dict() if caps else None,
                         "cpu": cpu.to_dict() if cpu else None}
    elif chosen is not None:
        out["engine"] = {"name": chosen, "available": False, "reason": avail[chosen].reason}
    return out


def debug_hardware() -> dict:
    """Whether debug-register breakpoints and BTF block-stepping work here
    (what live branch tracing and the ptrace engine use), probed."""
    from hwtrace.engines.emulated import stepper
    try:
        return stepper.probe()
    except stepper.StepperError as e:
        return {"debug_registers": "unknown", "debug_registers_reason": str(e),
                "block_step": "unknown"}


def _debug_lines(d: dict):
    dr = d.get("debug_registers")
    if dr == "work":
        yield "  debug registers      work (execute breakpoints in DR0-DR3 through ptrace)"
    else:
        yield f"  debug registers      {'do not work' if dr == 'fail' else 'unknown'}: " \
              f"{d.get('debug_registers_reason') or 'not probed'}"
    bs = d.get("block_step")
    if bs == "honoured":
        yield "  BTF block-stepping   works (PTRACE_SINGLEBLOCK stops only after branches)"
    elif bs == "ignored":
        yield ("  BTF block-stepping   does not work here: DEBUGCTL.BTF is ignored "
               "(PTRACE_SINGLEBLOCK stops after every instruction, as in many VMs); "
               "single-stepping with straight lines run to a debug-register breakpoint instead")
    else:
        yield "  BTF block-stepping   unknown"


def run(args) -> int:
    from hwtrace.control.capabilities import Capabilities
    if args.bundle is not None:
        if args.engine != "auto":
            raise CliError("info: --engine describes this machine, not a bundle")
        from ._bundle_text import describe_bundle
        return describe_bundle(args.bundle, args.json)
    info = gather(args.engine)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    c = info["cpu"]
    print(f"cpu: {c['vendor'] or 'unknown'} family {c['family']} model {c['model']} "
          f"stepping {c['stepping']}")
    pt = info["intel_pt"]
    if pt["available"]:
        print(f"intel pt: yes (from {pt['source']})")
    else:
        print(f"intel pt: no ({pt['reason']})")
    print("engines:")
    for name, e in info["engines"].items():
        state = "usable" if e["available"] else f"not usable: {e['reason']}"
        print(f"  {name:<9} {state}")
    print(f"auto: {info['auto'] or 'no engine usable here'}")
    print("debug hardware (live branch tracing, ptrace engine):")
    for line in _debug_lines(info["debug_hardware"]):
        print(line)
    eng = info.get("engine")
    if pt["available"]:
        print("capabilities (this CPU, CPUID leaf 0x14):")
        for k, v in Capabilities.from_dict(pt["capabilities"]).describe():
            print(f"  {k:<24} {v}")
    if eng and eng.get("cpu"):
        ec = eng["cpu"]
        line = (f"{eng['name']} engine cpu: {ec['vendor']} {ec['family']}/{ec['model']}/"
                f"{ec['stepping']}")
        if ec.get("nom_freq"):
            line += f", nominal ratio {ec['nom_freq']}"
        if ec.get("cpuid_0x15_eax") and ec.get("cpuid_0x15_ebx"):
            line += f", TSC/crystal {ec['cpuid_0x15_ebx']}/{ec['cpuid_0x15_eax']}"
        if ec.get("timebase"):
            line += f", timebase: {ec['timebase']}"
        print(line)
    if eng and eng.get("capabilities"):
        print(f"capabilities ({eng['name']} engine, CPUID leaf 0x14 equivalent):")
        for k, v in Capabilities.from_dict(eng["capabilities"]).describe():
            print(f"  {k:<24} {v}")
    elif eng:
        print(f"{eng['name']} engine: not usable: {eng['reason']}")
    return 0
