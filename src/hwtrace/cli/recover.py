"""``hwtrace recover DIR``: turn a trace directory -- even one whose collector
crashed mid-trace -- into a decodable bundle."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from hwtrace.cli import CliError, help_of


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "recover", help=help_of("recover"),
        description="Read a trace directory's buffers (memory-mapped chunks and "
                    "their persisted ToPA output registers) and sideband, and "
                    "write a bundle: one stream per CPU or thread, oldest byte "
                    "first, a wrapped circular buffer from its first PSB. "
                    "A collector of the emulated engines ('hwtrace record -o DIR', or "
                    "the Python API) killed mid-trace leaves instead the execution "
                    "log (DIR/hwtrace-xlog-*/exec.xlog): the bundle is then generated "
                    "from it as the collector would have, up to its last whole "
                    "record, with the collector's settings.")
    p.add_argument("directory", metavar="DIR", help="the trace directory")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="write the bundle here (default: into DIR itself)")
    p.add_argument("--force", action="store_true", help="replace an existing manifest")
    p.add_argument("--copy-images", action="store_true",
                   help="store the mapped files the trace names in the bundle (never "
                        "done unless asked: the directory may come from elsewhere)")
    p.set_defaults(func=run)


def run(args) -> int:
    from hwtrace.control.recover import is_trace_dir
    from hwtrace.engines.emulated.salvage import find_logs
    if not os.path.isdir(args.directory):
        raise CliError(f"recover: {args.directory}: no such directory")
    logs = find_logs(args.directory)
    if logs:
        # an emulated engine's collector died before it generated the
        # streams (its buffers are empty): generate them from the log
        return _salvage(args, logs)
    return _trace_dir(args)


def _already(out) -> CliError:
    return CliError(f"recover: {out} already holds a bundle (use --force to replace it)")


def _trace_dir(args) -> int:
    from hwtrace.bundle import Bundle, BundleError
    from hwtrace.control.recover import RecoverError, write_bundle
    out = args.output or args.directory
    try:
        path = write_bundle(args.directory, out, overwrite=args.force,
                            copy_images=bool(getattr(args, "copy_images", False)))
        b = Bundle(path)
    except (RecoverError, BundleError) as e:
        msg = str(e)
        if "already holds a bundle" in msg:
            raise _already(out) from None
        if "not a trace directory" in msg:
            msg += " and no execution log (hwtrace-xlog-*/exec.xlog) in it"
        raise CliError(f"recover: {msg}") from None
    except OSError as e:
        raise CliError(f"recover: {e.filename or out}: {e.strerror}") from None
    _report(path, b)
    return 0


def _report(path, b, note: str = "") -> None:
    print(f"recovered {len(b.streams)} stream(s) into {path}{note}")
    for s in b.streams:
        who = f"cpu {s.cpu}" if s.cpu is not None else f"tid {s.tid}"
        flags = [f for f, on in (("wrapped", s.wrapped), ("stopped", s.stopped)) if on]
        lost = f", {s.lost_bytes} bytes lost" if s.lost_bytes else ""
        print(f"  {s.file}: {who}, {s.size} bytes{', ' + ', '.join(flags) if flags else ''}{lost}")


def _salvage(args, logs: list[Path]) -> int:
    """The newest execution log a killed recorder left -> the bundle
    ``hwtrace record`` would have written (its own code does the work)."""
    from hwtrace.bundle import MANIFEST, Bundle, BundleError
    from hwtrace.control.config import BufferConfig
    from hwtrace.control.errors import TraceError
    from hwtrace.engines.emulated import salvage
    from . import record

    log = logs[-1]
    out = Path(args.output or args.directory)
    st = salvage.read_settings(log)
    live = salvage.recorder_running(st)
    if live is not None and _same(out, args.directory):
        raise CliError(f"recover: {args.directory}: its recorder (pid {live}) is still "
                       f"running (use -o OUT for a snapshot of the trace so far)")
    old = None
    try:
        _no_links(out)
        if (out / MANIFEST).exists():
            if not args.force:
                raise _already(out)
            old = (out / MANIFEST).read_bytes()     # put back if this fails
            (out / MANIFEST).unlink()
        if st.recorded:
            cfg = BufferConfig.from_dict(st.config)
        else:
            num_chunks, order = record.buffer_geometry(argparse.Namespace(
                buffer_size=None, num_chunks=None, chunk_order=None))
            ctl, cr3, _ = record.parse_config(record.DEFAULT_CONFIG)
            cfg = BufferConfig(num_chunks=num_chunks, chunk_order=order, ctl=ctl, cr3_match=cr3)
        out.mkdir(parents=True, exist_ok=True)
        # scratch space in the output directory, not in $TMPDIR
        with tempfile.TemporaryDirectory(prefix="hwtrace-salvage-", dir=out) as scratch:
            prep = salvage.prepare(log, Path(scratch) / "log", live=live is not None)
            eng = salvage.ReplayEngine(prep.path, prep.source, st.num_cpus or None, st.exe)
            rec_args = argparse.Namespace(mode=st.mode, pid=None,
                                          copy_images=bool(getattr(args, "copy_images", False)))
            record._record(eng, rec_args, cfg, [str(log)], out, st.elf_ranges,
                           work=Path(scratch) / "trace", say=False)
        if live is None and _same(out, args.directory):
            _drop_dead_trace_files(out)
        _mark(out, log, prep, st, live is not None)
        b = Bundle(out)
        old = None
    except salvage.SalvageError as e:
        raise CliError(f"recover: {e}") from None
    except TraceError as e:
        raise CliError(f"recover: {log}: {e.message}") from None
    except BundleError as e:
        raise CliError(f"recover: {e}") from None
    except OSError as e:
        raise CliError(f"recover: {e.filename or out}: {e.strerror}") from None
    finally:
        if old is not None and not (out / MANIFEST).exists():
            (out / MANIFEST).write_bytes(old)
    cut = f", {prep.dropped} byte(s) of a cut-off record dropped" if prep.dropped else ""
    merged = (f", {prep.merged} of them merged from the plugin's buffer files"
              if prep.merged else "")
    _report(out, b, f" from the execution log {log} ({prep.used} bytes{merged}{cut})")
    if prep.unended:
        print(f"  (killed threads end before their last branch: where it went is not in "
              f"the log; {prep.unended} block(s) cut)")
    if not st.recorded:
        print("  (no recording.json next to the log: hwtrace record's default settings used)")
    elif st.copy_images and not getattr(args, "copy_images", False):
        print("  (the recording asked for --copy-images: add it to store the mapped files)")
    if live is not None:
        print(f"  (its recorder, pid {live}, is still running: a snapshot)")
    for other in logs[:-1]:
        print(f"  older execution log not used: {other}")
    return 0


def _drop_dead_trace_files(d: Path) -> None:
    """The dead collector's device file and (never filled) buffers: the
    log they would have been generated from is kept, they are not."""
    import shutil
    from hwtrace.control.storage import BUFFER_PREFIX, DEVICE_FILE
    for p in d.glob(BUFFER_PREFIX + "*"):
        if p.is_dir() and not p.is_symlink() and p.name[len(BUFFER_PREFIX):].isdigit():
            shutil.rmtree(p, ignore_errors=True)
    for name in (DEVICE_FILE, DEVICE_FILE + ".tmp"):
        p = d / name
        if p.is_file() and not p.is_symlink():
            p.unlink()


def _same(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _no_links(out: Path) -> None:
    """The bundle's own files are written in place: refuse a directory whose
    entries for them are symbolic links (they would be written through)."""
    for p in (out / "manifest.json.tmp", out / "images"):
        if p.is_symlink():
            raise CliError(f"recover: {p} is a symbolic link (refusing to write through it)")
    imgs = out / "images"
    if imgs.is_dir():
        for p in imgs.iterdir():
            if p.is_symlink():
                raise CliError(f"recover: {p} is a symbolic link (refusing to write through it)")


def _mark(out: Path, log: Path, prep, st, live: bool = False) -> None:
    """Say in the manifest that this bundle was recovered, from what; and
    how the recording ended as far as it is known (the replay of the log
    "exited with status 0", its command the log's path)."""
    mpath = out / "manifest.json"
    man = json.loads(mpath.read_text())
    rec = man.get("recording")
    if isinstance(rec, dict):
        rec.pop("command", None)
        if st.command:
            rec["command"] = list(st.command)
        rec["status"] = None
        rec["ended"] = ("its recorder still running: the trace so far, made by "
                        "hwtrace recover" if live else
                        "its recorder ended before writing the bundle: made by "
                        "hwtrace recover from what it had logged")
    try:
        where = os.path.relpath(log, out)
    except ValueError:
        where = str(log)
    man["recovered"] = {"from": "execution log", "log": where, "source": prep.source,
                        "log_bytes": prep.size, "used_bytes": prep.used,
                        "dropped_bytes": prep.dropped,
                        "unended_blocks_cut": prep.unended,
                        "settings": "recorded" if st.recorded else "defaults"}
    tmp = out / "manifest.json.tmp"
    if tmp.exists() or tmp.is_symlink():
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(man, indent=1) + "\n")
    os.replace(tmp, mpath)
