"""Writers that turn reconstructed activations into the formats people's
viewers read.  Each writer is streaming: ``begin_stream(info, unit)`` per
stream, ``add(record)`` per record (Enter/Activation/Marker, in the order
the builder emits them), ``close()`` at the end.

* :mod:`.chrome`   Chrome trace-event JSON (Perfetto UI, chrome://tracing,
                   speedscope)
* :mod:`.perfetto` Perfetto native protobuf (TrackEvent, interned names)
* :mod:`.folded`   flame-graph folded stacks
* :mod:`.drcov`    basic-block coverage, drcov format
* :mod:`.lcov`     line coverage through DWARF line tables
"""

#: how many time units a microsecond has, per clock unit: TSC ticks of an
#: unknown frequency are shown as if 1 tick = 1 ns, instructions as 1 ns each
UNITS_PER_US = {"ns": 1000.0, "tsc": 1000.0, "insns": 1000.0, None: 1000.0}


def flag_names(flags) -> str:
    return "|".join(f.name.lower() for f in type(flags) if f and f in flags
                    and f.value & (f.value - 1) == 0)


def track_label(info) -> str:
    """What a stream's track is called: its thread or CPU (a bundle's
    stream file name says less), else its name."""
    if info.tid is not None:
        return f"thread {info.tid}"
    if info.cpu is not None:
        return f"cpu {info.cpu}"
    return info.name or "trace"


def process_name(info, pid: int) -> str:
    """A process's track name: the program it ran, else ``process PID``
    (the viewers show the pid beside it)."""
    program = getattr(info, "program", None)
    name = program(pid) if program is not None else ""
    return name or f"process {pid}"


def track_of(info, cpu_pid: int):
    """(pid, tid, process name, thread name) of a stream's own track: a
    thread's, or in cpu mode the made-up process ``cpu_pid`` ("CPUs")
    with a track per CPU."""
    if info.tid is None and info.cpu is not None:
        return cpu_pid, info.cpu, "CPUs", track_label(info)
    pid = info.pid if info.pid is not None else 0
    tid = info.tid if info.tid is not None else 0
    return pid, tid, process_name(info, pid), track_label(info)
