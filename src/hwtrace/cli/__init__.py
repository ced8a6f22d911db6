"""The command line: parse, call the library, print.

Each subcommand lives in its own module of this package (every module
whose name does not start with ``_`` is one) and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a
callable taking the parsed namespace and returning an exit status.
Errors meant for the user are raised as :class:`CliError` and become one
line on stderr with a non-zero exit status; nothing else is printed.
Input files are checked where they are opened, not in each subcommand:
traces in :mod:`hwtrace.cli._tracemap`, code images in
:mod:`hwtrace.flow.loaders`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

EPILOG = """\
exit status: 0 done (a damaged trace is decoded where it can be: its errors
are in the output at their trace offsets); 2 nothing could be done: a bad
command line, or input that is unreadable, empty, not Intel PT (no PSB), a
directory where a file belongs, or code that is not an x86 ELF file (one
line on stderr says which); 130 interrupted.  record and live branches
exit with the traced program's status (128+N: killed by signal N).
'hwtrace COMMAND --help' for a command's options."""


def _command_modules() -> list[str]:
    """Every module of this package is a subcommand (listed alphabetically;
    read from the directory as pkgutil.iter_modules would, without the
    inspect module it imports)."""
    import importlib.machinery
    import os
    suffixes = sorted(importlib.machinery.all_suffixes(), key=len,
                      reverse=True)
    names = set()
    for d in __path__:
        for f in os.listdir(d):
            stem = next((f[:-len(s)] for s in suffixes if f.endswith(s)), "")
            if stem.isidentifier() and not stem.startswith("_"):
                names.add(stem)
    return sorted(names)


def warn(text: str) -> None:
    """One warning line on stderr (what the commands say of an input they
    decode anyway: :meth:`hwtrace.streams.Stream.report`), on a line of
    its own: a progress bar showing is erased first."""
    _end_progress_line()
    sys.stderr.write(f"hwtrace: warning: {text}\n")
    sys.stderr.flush()


def _end_progress_line() -> None:
    """Erase a view's progress bar if one is on the terminal (a bar exists
    only once its module is loaded: nothing to import otherwise)."""
    progress = sys.modules.get("hwtrace.export.progress")
    if progress is not None:
        progress.clear_line()


class CliError(Exception):
    """A user-facing error: printed as one line, exit status ``status``."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit status 2."""

    def error(self, message):  # noqa: D401 - argparse API
        raise CliError(f"{self.prog}: {message}", 2)


def build_parser(command: str | None = None) -> Parser:
    """The command line's parser, with every subcommand; or, given the
    ``command`` a command line names, with that one only if the module of
    its name registers it (the other modules are not even imported: most
    of a small command's start-up otherwise)."""
    modules = _command_modules()
    if command in modules:
        parser, sub = _parser([command])
        if command in sub.choices:
            return parser
    return _parser(modules)[0]


def _parser(modules: list[str]):
    parser = Parser(prog="hwtrace", description="hardware control-flow tracing: "
                    "record, decode and view Intel Processor Trace",
                    epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"hwtrace {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                parser_class=Parser)
    sub.required = True
    for name in modules:
        module = importlib.import_module(f"hwtrace.cli.{name}")
        module.register(sub)
    return parser, sub


def _version() -> str:
    from hwtrace import __version__
    return __version__


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser(argv[0] if argv else None)
        if not argv:
            parser.print_help()         # "hwtrace" alone: what it can do
            return 2
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except CliError as e:
        _end_progress_line()
        print(f"hwtrace: {e}" if not str(e).startswith("hwtrace") else str(e),
              file=sys.stderr)
        return e.status
    except BrokenPipeError:
        # Output piped into head & co.: not an error of ours.
        try:
            sys.stdout = None  # type: ignore[assignment]
        finally:
            return 0
    except KeyboardInterrupt:
        _end_progress_line()
        print("hwtrace: interrupted", file=sys.stderr)
        return 130
