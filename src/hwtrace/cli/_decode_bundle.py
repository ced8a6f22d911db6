"""``hwtrace decode DIR``: every stream of a bundle, each part of it in the
address space of the process that ran it.

Thread-mode streams run in their process's space (a new one after an
exec); cpu-mode streams switch spaces as the sideband's context switches
(by time) and the trace's PIP packets (by CR3) say
(:mod:`hwtrace.flow.spaces`).  Files are found by the bundle's rules
(:meth:`hwtrace.bundle.Bundle.find_image`: the bundle's copies,
``--image-path``, recorded paths that are ELF files with the recorded
build-id, anything with ``--allow-outside``); a mapped file that can't be
found is a one-line error naming it.

Output: per stream a ``[stream NAME]`` line (jsonl: ``{"stream": NAME}``)
then the decode; when the space changes, ``[process PID (COMM)]`` (jsonl:
``{"process": PID, "comm": ..., "cr3": ..., "offset": ...}``), except with
``--quiet``.  ``--merge-time`` prints all streams' lines merged by time
stamp (the decoder's time when the line was produced, never running back
within a stream), each tagged with
its stream: ``[NAME] LINE`` (jsonl: ``"stream"`` and ``"time"`` keys
first).  The merge goes through temporary files, so memory stays small.
"""

from __future__ import annotations

import heapq
import json
import os
import sys
import tempfile

from hwtrace.cli import CliError


def run_bundle(args) -> int:
    from hwtrace.bundle import BundleError
    from hwtrace.cli import decode as D
    from hwtrace.flow.spaces import AddressSpaces, SpaceSwitcher

    for d in args.image_path:
        if not os.path.isdir(d):
            raise CliError(f"decode: --image-path {d}: not a directory")
    b, streams, extra = D._bundle_streams(args)
    parser = D._parser_of(args)
    subs = [(info, parser.parse_args(D._argv_of(args) + ["--pt", path] + extra))
            for info, path in streams]

    found: dict = {}

    def resolve(file, build_id):
        key = (file, build_id)
        if key not in found:
            found[key] = b.find_image(file, build_id)
        return found[key]

    def extend(image):
        D._image(args, image)       # --raw/--elf on top of every space

    if args.images:
        D._image(args)              # a bad --raw/--elf is an error now
    try:
        spaces = AddressSpaces(b.iter_sideband(), resolve,
                               extend if args.images else None)
    except BundleError as e:
        raise CliError(f"decode: {args.bundle}: {e}") from None
    except OSError as e:
        raise CliError(f"decode: {args.bundle}: sideband: {e.strerror}") from None

    plans = []
    for info, sub in subs:
        timeline, initial = _plan(spaces, info)
        used = timeline.spaces() if timeline is not None else [initial]
        missing = spaces.missing_for(used) if timeline is not None else \
            list(spaces.missing)
        # Files on disk only: "[vdso]", "[kernel.kallsyms]_text", "//anon"
        # decode only if the bundle stores them; without, their code is a
        # "no memory mapped" error in the output, as for any gap.
        missing = [m for m in missing
                   if m[1].startswith("/") and not m[1].startswith("//")]
        if missing:
            pid, file, bid = missing[0]
            n = len({m[1] for m in missing}) - 1
            more = f" (and {n} more file{'s' if n > 1 else ''})" if n else ""
            raise CliError(
                f"decode: {args.bundle}: no image for {file} of process {pid}"
                f"{more}: record with --copy-images, or give --image-path DIR"
                f" (or --allow-outside for a trusted bundle)")
        if timeline is not None and len(used) > 1 and not _fine_timing(b, info):
            sys.stderr.write(
                f"hwtrace: warning: {info.file} runs {len(used)} processes but "
                f"its trace has no MTC/CYC packets: process switches are "
                f"placed by TSC alone (record with e.g. --config "
                f"'branch;user;retc;tsc;mtc;cyc')\n")
        plans.append((info, sub, timeline, initial, _cyc(b, info)))

    out = sys.stdout.write
    if args.merge_time:
        return _merged(plans, spaces, out, D, SpaceSwitcher)
    for info, sub, timeline, initial, cyc in plans:
        jsonl = sub.format == "jsonl"
        out('{"stream":%s}\n' % json.dumps(info.file) if jsonl
            else f"[stream {info.file}]\n")
        wrap = _wrapper(spaces, timeline, initial, sub, out, SpaceSwitcher,
                        cyc=cyc)
        D._run_one(sub, image=initial.image, wrap=wrap, write=out)
    return 0


def _ctl(b, info) -> int | None:
    cfg = info.config if info.config is not None else b.manifest.get("config")
    ctl = cfg.get("ctl") if isinstance(cfg, dict) else None
    return ctl if type(ctl) is int else None


def _fine_timing(b, info) -> bool:
    """Whether the stream was recorded with MTC or CYC packets."""
    ctl = _ctl(b, info)
    return ctl is None or bool(ctl & ((1 << 1) | (1 << 9)))   # CYCEn, MTCEn


def _cyc(b, info) -> bool:
    ctl = _ctl(b, info)
    return ctl is not None and bool(ctl & (1 << 1))


def _plan(spaces, info):
    """(timeline or None, initial space) for one stream."""
    return spaces.for_stream(info.cpu, info.tid, info.pid)


def _wrapper(spaces, timeline, initial, sub, write, SpaceSwitcher, hold=None,
             cyc=False):
    """``wrap(decoder)`` for ``_run_one``: the switcher, reporting switches
    unless ``--quiet``; ``hold`` (a list) receives the switcher."""
    jsonl = sub.format == "jsonl"

    def on_switch(space, offset):
        if sub.quiet or space.pid == -1:     # -1: no sideband to go by
            return
        if jsonl:
            write(json.dumps({"process": space.pid, "comm": space.comm,
                              "cr3": space.cr3, "offset": offset},
                             separators=(",", ":")) + "\n")
        else:
            write(f"[process {space.label}]\n")

    def wrap(dec):
        sw = SpaceSwitcher(dec, spaces, timeline, initial, on_switch, cyc=cyc)
        if hold is not None:
            hold.append(sw)
        return sw
    return wrap


def _merged(plans, spaces, out, D, SpaceSwitcher) -> int:
    """Decode each stream into a temporary file of time-prefixed lines,
    then merge them by time (ties: stream order)."""
    files = []
    try:
        for info, sub, timeline, initial, cyc in plans:
            f = tempfile.TemporaryFile("w+", encoding="utf-8")
            files.append((info.file, sub.format == "jsonl", f))
            hold: list = []
            last = [0]

            def write(text, f=f, hold=hold, last=last):
                # A stream's lines keep their order: a time stamp that runs
                # back (the time model re-anchoring at an MTC) is clamped.
                tsc = last[0]
                if hold:
                    t, _, _, have = hold[0].time()
                    if have and t > tsc:
                        tsc = last[0] = t
                for line in text.splitlines():
                    f.write(f"{tsc:020d} {line}\n")
            wrap = _wrapper(spaces, timeline, initial, sub, write,
                            SpaceSwitcher, hold, cyc)
            D._run_one(sub, image=initial.image, wrap=wrap, write=write)
            f.seek(0)

        def tagged(name, jsonl, f):
            tag = json.dumps(name)
            for line in f:
                tsc, text = line[:20], line[21:]
                if jsonl:
                    body = text[1:] if text.startswith("{") else "}\n"
                    sep = "," if body != "}\n" else ""
                    yield tsc, '{"stream":%s,"time":%d%s%s' % (
                        tag, int(tsc), sep, body)
                else:
                    yield tsc, f"[{name}] {text}"
        for _, line in heapq.merge(*(tagged(*x) for x in files),
                                   key=lambda x: x[0]):
            out(line)
    finally:
        for _, _, f in files:
            f.close()
    return 0
