"""The Linux perf ABI as data: record types, feature ids, sample_type bits,
``perf_event_attr`` (pack/unpack), ioctl numbers.

Facts from ``include/uapi/linux/perf_event.h`` and ``tools/perf`` 's
documented perf.data layout (``perf.data-file-format.txt``).  No I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# --- record types: kernel (ring buffer) ------------------------------------
MMAP = 1
LOST = 2
COMM = 3
EXIT = 4
THROTTLE = 5
UNTHROTTLE = 6
FORK = 7
READ = 8
SAMPLE = 9
MMAP2 = 10
AUX = 11
ITRACE_START = 12
LOST_SAMPLES = 13
SWITCH = 14
SWITCH_CPU_WIDE = 15
NAMESPACES = 16
KSYMBOL = 17
BPF_EVENT = 18
CGROUP = 19
TEXT_POKE = 20
AUX_OUTPUT_HW_ID = 21
# --- record types: perf tool (perf.data only) ------------------------------
HEADER_ATTR = 64
HEADER_EVENT_TYPE = 65
HEADER_TRACING_DATA = 66
HEADER_BUILD_ID = 67
FINISHED_ROUND = 68
ID_INDEX = 69
AUXTRACE_INFO = 70
AUXTRACE = 71
AUXTRACE_ERROR = 72
THREAD_MAP = 73
CPU_MAP = 74
STAT_CONFIG = 75
STAT = 76
STAT_ROUND = 77
EVENT_UPDATE = 78
TIME_CONV = 79
HEADER_FEATURE = 80
COMPRESSED = 81
FINISHED_INIT = 82
COMPRESSED2 = 83         # perf >= 6.15: zstd data with an explicit data size

RECORD_NAMES = {
    MMAP: "MMAP", LOST: "LOST", COMM: "COMM", EXIT: "EXIT",
    THROTTLE: "THROTTLE", UNTHROTTLE: "UNTHROTTLE", FORK: "FORK", READ: "READ",
    SAMPLE: "SAMPLE", MMAP2: "MMAP2", AUX: "AUX", ITRACE_START: "ITRACE_START",
    LOST_SAMPLES: "LOST_SAMPLES", SWITCH: "SWITCH",
    SWITCH_CPU_WIDE: "SWITCH_CPU_WIDE", NAMESPACES: "NAMESPACES",
    KSYMBOL: "KSYMBOL", BPF_EVENT: "BPF_EVENT", CGROUP: "CGROUP",
    TEXT_POKE: "TEXT_POKE", AUX_OUTPUT_HW_ID: "AUX_OUTPUT_HW_ID",
    HEADER_ATTR: "HEADER_ATTR", HEADER_EVENT_TYPE: "HEADER_EVENT_TYPE",
    HEADER_TRACING_DATA: "HEADER_TRACING_DATA",
    HEADER_BUILD_ID: "HEADER_BUILD_ID", FINISHED_ROUND: "FINISHED_ROUND",
    ID_INDEX: "ID_INDEX", AUXTRACE_INFO: "AUXTRACE_INFO", AUXTRACE: "AUXTRACE",
    AUXTRACE_ERROR: "AUXTRACE_ERROR", THREAD_MAP: "THREAD_MAP",
    CPU_MAP: "CPU_MAP", STAT_CONFIG: "STAT_CONFIG", STAT: "STAT",
    STAT_ROUND: "STAT_ROUND", EVENT_UPDATE: "EVENT_UPDATE",
    TIME_CONV: "TIME_CONV", HEADER_FEATURE: "HEADER_FEATURE",
    COMPRESSED: "COMPRESSED", FINISHED_INIT: "FINISHED_INIT",
    COMPRESSED2: "COMPRESSED2",
}

# --- header.misc bits ------------------------------------------------------
MISC_CPUMODE_MASK = 0x7
MISC_KERNEL = 1
MISC_USER = 2
MISC_HYPERVISOR = 3
MISC_GUEST_KERNEL = 4
MISC_GUEST_USER = 5
MISC_MMAP_DATA = 1 << 13          # MMAP/MMAP2
MISC_COMM_EXEC = 1 << 13          # COMM
MISC_SWITCH_OUT = 1 << 13         # SWITCH / SWITCH_CPU_WIDE
MISC_SWITCH_OUT_PREEMPT = 1 << 14
MISC_MMAP_BUILD_ID = 1 << 14      # MMAP2 carries a build-id
MISC_BUILD_ID_SIZE = 1 << 15      # HEADER_BUILD_ID has a size byte
MISC_EXACT_IP = 1 << 14           # SAMPLE

# --- AUX record flags ------------------------------------------------------
AUX_FLAG_TRUNCATED = 0x01
AUX_FLAG_OVERWRITE = 0x02
AUX_FLAG_PARTIAL = 0x04
AUX_FLAG_COLLISION = 0x08

# --- sample_type bits -------------------------------------------------------
SAMPLE_IP = 1 << 0
SAMPLE_TID = 1 << 1
SAMPLE_TIME = 1 << 2
SAMPLE_ADDR = 1 << 3
SAMPLE_READ = 1 << 4
SAMPLE_CALLCHAIN = 1 << 5
SAMPLE_ID = 1 << 6
SAMPLE_CPU = 1 << 7
SAMPLE_PERIOD = 1 << 8
SAMPLE_STREAM_ID = 1 << 9
SAMPLE_RAW = 1 << 10
SAMPLE_BRANCH_STACK = 1 << 11
SAMPLE_REGS_USER = 1 << 12
SAMPLE_STACK_USER = 1 << 13
SAMPLE_WEIGHT = 1 << 14
SAMPLE_DATA_SRC = 1 << 15
SAMPLE_IDENTIFIER = 1 << 16
SAMPLE_TRANSACTION = 1 << 17
SAMPLE_REGS_INTR = 1 << 18
SAMPLE_PHYS_ADDR = 1 << 19
SAMPLE_AUX = 1 << 20

# --- perf.data feature ids (bits of the header's feature bitmap) -----------
FEAT_NAMES = (
    "RESERVED", "TRACING_DATA", "BUILD_ID", "HOSTNAME", "OSRELEASE",
    "VERSION", "ARCH", "NRCPUS", "CPUDESC", "CPUID", "TOTAL_MEM", "CMDLINE",
    "EVENT_DESC", "CPU_TOPOLOGY", "NUMA_TOPOLOGY", "BRANCH_STACK",
    "PMU_MAPPINGS", "GROUP_DESC", "AUXTRACE", "STAT", "CACHE", "SAMPLE_TIME",
    "MEM_TOPOLOGY", "CLOCKID", "DIR_FORMAT", "BPF_PROG_INFO", "BPF_BTF",
    "COMPRESSED", "CPU_PMU_CAPS", "CLOCK_DATA", "HYBRID_TOPOLOGY", "PMU_CAPS",
)
FEAT = {name: i for i, name in enumerate(FEAT_NAMES)}

# --- perf_event_attr -------------------------------------------------------
PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_COUNT_SW_DUMMY = 9

ATTR_SIZE_VER0 = 64
ATTR_SIZE_VER8 = 136

# Named bits of the attr's flags word, in the kernel's bit order.
ATTR_FLAG_BITS = (
    "disabled", "inherit", "pinned", "exclusive", "exclude_user",
    "exclude_kernel", "exclude_hv", "exclude_idle", "mmap", "comm", "freq",
    "inherit_stat", "enable_on_exec", "task", "watermark", None, None,
    "mmap_data", "sample_id_all", "exclude_host", "exclude_guest",
    "exclude_callchain_kernel", "exclude_callchain_user", "mmap2",
    "comm_exec", "use_clockid", "context_switch", "write_backward",
    "namespaces", "ksymbol", "bpf_event", "aux_output", "cgroup",
    "text_poke", "build_id", "inherit_thread", "remove_on_exec", "sigtrap",
)
PRECISE_IP_SHIFT = 15
_FLAG_INDEX = {n: i for i, n in enumerate(ATTR_FLAG_BITS) if n}

# (name, struct code, offset); the attr grows by versions, the size field
# says how much of it is present.
_ATTR_FIELDS = (
    ("type", "I", 0), ("size", "I", 4), ("config", "Q", 8),
    ("sample_period", "Q", 16), ("sample_type", "Q", 24),
    ("read_format", "Q", 32), ("flags", "Q", 40),
    ("wakeup_events", "I", 48), ("bp_type", "I", 52),
    ("config1", "Q", 56), ("config2", "Q", 64),
    ("branch_sample_type", "Q", 72), ("sample_regs_user", "Q", 80),
    ("sample_stack_user", "I", 88), ("clockid", "i", 92),
    ("sample_regs_intr", "Q", 96), ("aux_watermark", "I", 104),
    ("sample_max_stack", "H", 108), ("reserved_2", "H", 110),
    ("aux_sample_size", "I", 112), ("reserved_3", "I", 116),
    ("sig_data", "Q", 120), ("config3", "Q", 128),
)


@dataclass(frozen=True, slots=True)
class PerfEventAttr:
    """``struct perf_event_attr`` with the flags word kept whole.

    ``sample_period`` doubles as ``sample_freq`` and ``wakeup_events`` as
    ``wakeup_watermark`` (unions in the kernel's struct).
    """
    type: int = 0
    size: int = ATTR_SIZE_VER8
    config: int = 0
    sample_period: int = 0
    sample_type: int = 0
    read_format: int = 0
    flags: int = 0
    wakeup_events: int = 0
    bp_type: int = 0
    config1: int = 0
    config2: int = 0
    branch_sample_type: int = 0
    sample_regs_user: int = 0
    sample_stack_user: int = 0
    clockid: int = 0
    sample_regs_intr: int = 0
    aux_watermark: int = 0
    sample_max_stack: int = 0
    reserved_2: int = 0
    aux_sample_size: int = 0
    reserved_3: int = 0
    sig_data: int = 0
    config3: int = 0

    def flag(self, name: str) -> bool:
        return bool(self.flags >> _FLAG_INDEX[name] & 1)

    @property
    def precise_ip(self) -> int:
        return self.flags >> PRECISE_IP_SHIFT & 3

    def set_flags(self) -> tuple[str, ...]:
        return tuple(n for n, i in _FLAG_INDEX.items() if self.flags >> i & 1)

    def pack(self) -> bytes:
        """The attr's bytes, ``size`` long (fields past it are dropped)."""
        buf = bytearray(max(self.size, ATTR_SIZE_VER8))
        for name, code, off in _ATTR_FIELDS:
            struct.pack_into("<" + code, buf, off, getattr(self, name))
        return bytes(buf[:self.size])

    @classmethod
    def unpack(cls, data, offset: int = 0, size: int | None = None) -> "PerfEventAttr":
        """Read an attr of ``size`` bytes (default: its own size field).

        Fields beyond ``size`` are zero, as the kernel treats them.  The
        caller checks that ``size`` bytes are there.
        """
        if size is None:
            size = struct.unpack_from("<I", data, offset + 4)[0]
        vals = {}
        for name, code, off in _ATTR_FIELDS:
            if off + struct.calcsize(code) <= size:
                vals[name] = struct.unpack_from("<" + code, data, offset + off)[0]
        return cls(**vals)


def attr_flags(**named: bool | int) -> int:
    """Build the flags word from names (``precise_ip`` takes 0..3)."""
    word = 0
    for name, val in named.items():
        if name == "precise_ip":
            word |= (int(val) & 3) << PRECISE_IP_SHIFT
        elif val:
            word |= 1 << _FLAG_INDEX[name]
    return word


ATTR_FIELD_OFFSETS = {name: off for name, _c, off in _ATTR_FIELDS}

# --- ioctls (asm-generic _IO/_IOW encoding, x86-64) -------------------------
def _ioc(direction: int, typ: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (typ << 8) | nr


PERF_EVENT_IOC_ENABLE = _ioc(0, ord("$"), 0, 0)
PERF_EVENT_IOC_DISABLE = _ioc(0, ord("$"), 1, 0)
PERF_EVENT_IOC_SET_OUTPUT = _ioc(0, ord("$"), 5, 0)
PERF_EVENT_IOC_SET_FILTER = _ioc(1, ord("$"), 6, 8)     # _IOW('$', 6, char *)
PERF_EVENT_IOC_PAUSE_OUTPUT = _ioc(1, ord("$"), 9, 4)   # _IOW('$', 9, __u32)

PERF_FLAG_FD_CLOEXEC = 1 << 3
