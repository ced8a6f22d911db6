"""The device's legal state transitions: two tables, checked in one place.

Every device operation calls :func:`check` with the device's state and the
operation, and :func:`check_buffer` with the state of each buffer it
touches (unbound, bound to a CPU, assigned to a thread); an operation
missing from a state's row is refused with ``BAD_STATE`` here and nowhere
else. (Argument and resource checks -- bad descriptors, a CPU without a
buffer, a thread that already has one -- are the operations' own.)
"""

from __future__ import annotations

from enum import Enum, StrEnum

from .errors import bad_state


class State(Enum):
    CPU_IDLE = "cpu mode"
    CPU_ALLOCATED = "cpu mode, per-CPU state allocated"
    CPU_TRACING = "cpu mode, tracing"
    THREAD_IDLE = "thread mode"
    THREAD_TRACING = "thread mode, tracing"
    CPU_SNAPSHOT = "cpu mode, a snapshot of the running workload"
    THREAD_SNAPSHOT = "thread mode, a snapshot of the running workload"
    CLOSED = "closed"


class Op(StrEnum):
    SET_MODE_CPU = "set_mode(CPU)"
    SET_MODE_THREAD = "set_mode(THREAD)"
    ALLOC_BUFFER = "alloc_buffer"
    FREE_BUFFER = "free_buffer"
    GET_BUFFER_CONFIG = "get_buffer_config"
    GET_BUFFER_INFO = "get_buffer_info"
    GET_BUFFER_HANDLE = "get_buffer_handle"
    READ_BUFFER = "read_buffer"
    CPU_MODE_ALLOC = "cpu_mode_alloc"
    CPU_MODE_START = "cpu_mode_start"
    CPU_MODE_STOP = "cpu_mode_stop"
    CPU_MODE_FREE = "cpu_mode_free"
    ASSIGN_THREAD_BUFFER = "assign_thread_buffer"
    RELEASE_THREAD_BUFFER = "release_thread_buffer"
    RUN = "run"            # start of dev.run / dev.attach
    RUN_END = "run end"    # its end
    SNAPSHOT = "snapshot"              # the engine stopped tracing mid-run: buffers readable
    SNAPSHOT_END = "snapshot end"      # back to the run (the workload goes on untraced)
    SAVE = "save_bundle"


S, O = State, Op
_BUFFER_OPS = {O.ALLOC_BUFFER: None, O.FREE_BUFFER: None, O.GET_BUFFER_CONFIG: None,
               O.GET_BUFFER_INFO: None, O.GET_BUFFER_HANDLE: None, O.READ_BUFFER: None,
               O.SAVE: None}

#: state -> {operation: next state (None: unchanged)}. The whole state machine.
TRANSITIONS: dict[State, dict[Op, State | None]] = {
    S.CPU_IDLE: {
        **_BUFFER_OPS,
        O.SET_MODE_CPU: None, O.SET_MODE_THREAD: S.THREAD_IDLE,
        O.CPU_MODE_ALLOC: S.CPU_ALLOCATED, O.CPU_MODE_FREE: None,
    },
    S.CPU_ALLOCATED: {
        **_BUFFER_OPS,
        O.SET_MODE_CPU: None,
        O.CPU_MODE_START: S.CPU_TRACING, O.CPU_MODE_FREE: S.CPU_IDLE,
    },
    S.CPU_TRACING: {
        O.ALLOC_BUFFER: None, O.GET_BUFFER_CONFIG: None, O.GET_BUFFER_HANDLE: None,
        O.CPU_MODE_STOP: S.CPU_ALLOCATED, O.RUN: None, O.RUN_END: None,
        O.SNAPSHOT: S.CPU_SNAPSHOT,
    },
    S.CPU_SNAPSHOT: {
        O.GET_BUFFER_CONFIG: None, O.GET_BUFFER_INFO: None, O.GET_BUFFER_HANDLE: None,
        O.READ_BUFFER: None, O.SAVE: None, O.SNAPSHOT_END: S.CPU_TRACING,
    },
    S.THREAD_IDLE: {
        **_BUFFER_OPS,
        O.SET_MODE_THREAD: None, O.SET_MODE_CPU: S.CPU_IDLE, O.CPU_MODE_FREE: None,
        O.ASSIGN_THREAD_BUFFER: None, O.RELEASE_THREAD_BUFFER: None,
        O.RUN: S.THREAD_TRACING,
    },
    S.THREAD_TRACING: {
        O.ALLOC_BUFFER: None, O.GET_BUFFER_CONFIG: None, O.GET_BUFFER_HANDLE: None,
        O.GET_BUFFER_INFO: None, O.READ_BUFFER: None, O.ASSIGN_THREAD_BUFFER: None,
        O.RUN_END: S.THREAD_IDLE, O.SNAPSHOT: S.THREAD_SNAPSHOT,
    },
    S.THREAD_SNAPSHOT: {
        O.GET_BUFFER_CONFIG: None, O.GET_BUFFER_INFO: None, O.GET_BUFFER_HANDLE: None,
        O.READ_BUFFER: None, O.SAVE: None, O.SNAPSHOT_END: S.THREAD_TRACING,
    },
    S.CLOSED: {},
}

#: Why an operation is refused, by state (for the one-line message).
_WHY: dict[State, str] = {
    S.CPU_IDLE: "in cpu mode without per-CPU state",
    S.CPU_ALLOCATED: "while per-CPU state is allocated",
    S.CPU_TRACING: "while tracing",
    S.THREAD_IDLE: "in thread mode",
    S.THREAD_TRACING: "while tracing",
    S.CPU_SNAPSHOT: "during a snapshot",
    S.THREAD_SNAPSHOT: "during a snapshot",
    S.CLOSED: "on a closed device",
}


class BufferState(Enum):
    UNBOUND = "unbound"
    CPU_BOUND = "bound to a CPU"              # from cpu_mode_start to cpu_mode_free
    THREAD_ASSIGNED = "assigned to a thread"  # from assign_thread_buffer to release


B = BufferState
#: buffer state -> {operation: next buffer state (None: unchanged)}. An
#: operation not listed for any state doesn't concern buffers. The spec:
#: free_buffer is BAD_STATE while a buffer is "tracing or assigned" -- a
#: buffer stays bound to its CPU after cpu_mode_stop (its STATUS and output
#: pointers are that CPU's) until cpu_mode_free; and the mode can't change
#: under a buffer assigned to a thread (it would stay assigned in cpu
#: mode, where it can be neither released nor freed).
BUFFER_TRANSITIONS: dict[BufferState, dict[Op, BufferState | None]] = {
    B.UNBOUND: {
        O.FREE_BUFFER: None, O.CPU_MODE_START: B.CPU_BOUND,
        O.ASSIGN_THREAD_BUFFER: B.THREAD_ASSIGNED,
        O.SET_MODE_CPU: None, O.SET_MODE_THREAD: None,
    },
    B.CPU_BOUND: {
        O.CPU_MODE_FREE: B.UNBOUND, O.SET_MODE_CPU: None,
    },
    B.THREAD_ASSIGNED: {
        O.RELEASE_THREAD_BUFFER: B.UNBOUND, O.SET_MODE_THREAD: None,
    },
}
_BUFFER_OPS_ALL = frozenset(op for row in BUFFER_TRANSITIONS.values() for op in row)


def check(state: State, op: Op) -> State:
    """The state after ``op`` in ``state``; TraceError BAD_STATE if illegal."""
    row = TRANSITIONS[state]
    if op not in row:
        raise bad_state(f"{op} is not allowed {_WHY[state]}")
    nxt = row[op]
    return state if nxt is None else nxt


def is_tracing(state: State) -> bool:
    return state in (S.CPU_TRACING, S.THREAD_TRACING)


def check_buffer(state: BufferState, op: Op, d: int, whom: str = "") -> BufferState:
    """The state of buffer ``d`` after ``op``; TraceError BAD_STATE if the
    operation is not allowed on a buffer in ``state`` (``whom``: the CPU or
    thread it is bound to, for the message)."""
    if op not in _BUFFER_OPS_ALL:
        return state
    row = BUFFER_TRANSITIONS[state]
    if op not in row:
        raise bad_state(f"{op} is not allowed while buffer {d} is {state.value}"
                        + (f" {whom}" if whom else ""))
    nxt = row[op]
    return state if nxt is None else nxt
