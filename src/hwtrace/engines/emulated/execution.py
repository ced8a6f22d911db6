"""Running the execution sources under the user's control.

:func:`qemu_run` and :func:`stepper_run` run the program (or attach to a
process) writing the execution log, and wait -- for its end, or for the
session's stop or snapshot request:

* stop (Ctrl-C, SIGTERM, the end of a duration): a program started under
  QEMU is killed with every process it started (frozen first, then
  SIGKILL); the stepper is sent SIGTERM, and kills the program it started
  or detaches from the one it attached to. The log holds everything up to
  then, and the outcome says it is ``cut`` (each thread just stops).
* snapshot (SIGUSR2, or the QEMU plugin's notice that a trigger function
  was entered): the plugin stops logging in every process, the streams are
  generated from the log as it is now, the session is told (the bundle is
  saved), and the program runs on untraced to its end. The stepper can't
  stop mid-run: requests stay pending and the run goes on.

On any exception the program is killed (an attached one detached): no
traced process outlives its recorder.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from hwtrace.control.errors import Status, TraceError

from . import running


@dataclass(frozen=True)
class Outcome:
    status: int                 # the program's exit status (subprocess convention)
    cut: bool = False           # the log just stops: killed, or tracing stopped mid-run
    snapshot: str | None = None  # the streams were written mid-run, for this reason
    fired: str | None = None    # a trigger fired, but the program ended before the snapshot
    #: how the processes the program left running (handed to us) ended:
    #: pid -> exit code, or -signal
    orphans: dict | None = None


def _trigger_reason(fired) -> str:
    return f"trigger {fired.name} entered (pid {fired.pid}, tid {fired.tid}, {fired.pc:#x})"


def qemu_run(engine, session, prog, log: str, env, cwd) -> Outcome:
    from . import qemu
    control = qemu.Control(log, getattr(engine, "triggers", ()))
    try:
        try:
            cmd = qemu.command(prog, log, control)
        except qemu.QemuError as e:
            raise TraceError(Status.INVALID_ARGS, str(e)) from None
        # On Ctrl-C (or `timeout -s INT`, which signals the whole process
        # group) the program gets the SIGINT too: end the logging at once,
        # before it runs its handler -- the trace ends where the user
        # stopped it, not in the program's reaction (and a program whose
        # handler never ran keeps the compiled generator's speed)
        if hasattr(session, "on_stop"):
            session.on_stop(control.stop)
        # the program's orphans come to us: a child killed by a signal
        # that its parent never waited for ends with a status only we see
        with running.adopting_orphans():
            before = running.own_children()
            proc = qemu.spawn(cmd, env=dict(env) if env is not None else None, cwd=cwd)
            try:
                out = _follow_qemu(engine, session, proc, control, log)
                if out.snapshot is None and not out.cut:
                    out = _orphans_end(session, out, before, log)
                return out
            except BaseException:
                running.kill_tree(proc.pid)
                proc.wait()
                _kill_orphans(before)
                raise
            finally:
                if session.should_stop():
                    _kill_orphans(before)
    finally:
        control.close()


def _follow_qemu(engine, session, proc, control, log: str) -> Outcome:
    from . import qemu
    snapshot = None
    # a duration's clock waits for the program's start: until the plugin
    # logs the first thread (QEMU has loaded it), look every few ms
    starting = getattr(session, "awaits_program_start", False)
    while True:
        ev = running.wait(proc, session, [control.fd] if snapshot is None else [],
                          snapshots=snapshot is None, timeout=0.005 if starting else None)
        if ev.kind == "timeout":
            if qemu.program_started(log):
                session.program_started()
                starting = False
            continue
        if ev.kind == "exit":
            status = proc.wait()
            if snapshot is not None:
                return Outcome(status, snapshot=snapshot)
            fired = control.fired()
            if fired is not None:
                return Outcome(status, cut=True, fired=_trigger_reason(fired))
            return Outcome(status)
        if ev.kind == "stop":
            running.kill_tree(proc.pid)
            status = proc.wait()
            fired = control.fired() if snapshot is None else None
            return Outcome(status, cut=snapshot is None, snapshot=snapshot,
                           fired=_trigger_reason(fired) if fired is not None else None)
        control.drain()
        tty = control.tty_signal()
        if ev.kind == "notice" and tty:
            # the terminal's Ctrl-C (or hangup), or a kill from outside the
            # program, reached it: hwtrace got it too (its handler may not
            # have run yet): the same stop
            if hasattr(session, "request_stop"):
                try:
                    session.request_stop(signal.Signals(tty).name)
                except ValueError:
                    session.request_stop("SIGINT")
            running.kill_tree(proc.pid)
            status = proc.wait()
            return Outcome(status, cut=snapshot is None, snapshot=snapshot)
        # a snapshot: asked for, or a trigger fired
        fired = control.fired()
        reason = _trigger_reason(fired) if fired is not None else str(ev.detail)
        control.stop()
        engine.snapshot_now(session, log, reason)
        snapshot = reason


def _adopted(before: set) -> list[int]:
    return sorted(running.own_children() - before)


def _kill_orphans(before: set) -> dict:
    """Kill what the program left running (and reap it): no traced process
    outlives a stopped recorder.  How each ended (pid -> -signal)."""
    ended = {}
    for pid in _adopted(before):
        running.kill_tree(pid)
        st = running.orphan_status(pid, block=True)     # (it ends at once)
        if st is not None:
            ended[pid] = st
    return ended


def _orphans_end(session, out: Outcome, before: set, log: str) -> Outcome:
    """The program's end is its last process's, as the ptrace engine
    sees it: wait for the processes it left running (they were handed to
    us), each traced to its end, and note how each ended; a stop request
    meanwhile kills them (the trace is then cut)."""
    from dataclasses import replace

    from . import qemu
    ended: dict = {}
    while True:
        left = [p for p in _adopted(before) if p not in ended]
        if not left:
            break
        ev = running.wait(running.Adopted(left[0]), session, snapshots=False)
        if ev.kind == "stop":
            ended.update(_kill_orphans(before))
            qemu.merge_buffers(log)
            return replace(out, cut=True, orphans=ended)
        st = running.orphan_status(left[0])
        if st is not None:
            ended[left[0]] = st
    if ended:
        qemu.merge_buffers(log)     # what they had not written yet
    return replace(out, orphans=ended)


def stepper_run(engine, session, target, log: str) -> Outcome:
    """The ptrace stepper on ``target`` (argv, or a pid to attach to)."""
    from . import stepper
    attach = isinstance(target, int)
    try:
        proc = stepper.start(target, log, stepper.Options())
    except stepper.StepperError as e:
        raise TraceError(Status.NOT_SUPPORTED if attach else Status.INVALID_ARGS, str(e)) from None
    stopped = False
    try:
        ev = running.wait(proc, session, snapshots=False)
        if ev.kind == "stop":
            proc.send_signal(signal.SIGTERM)    # kills a launched program, detaches from a pid
            stopped = True
        status = proc.wait()
    except BaseException:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
        raise
    try:
        status = stepper.finish(proc, log, status)
    except stepper.StepperError as e:
        raise TraceError(Status.NOT_SUPPORTED if attach else Status.INVALID_ARGS, str(e)) from None
    return Outcome(status, cut=stopped and not attach)
