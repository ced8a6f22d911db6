"""The command line: parse, call the library, print.

Each subcommand lives in its own module of this package (every module
whose name does not start with ``_`` is one, listed in :data:`COMMANDS`
with its one-line help) and exposes ``register(subparsers)``, which adds
its parser and sets ``func`` to a callable taking the parsed namespace
and returning an exit status.
Errors meant for the user are raised as :class:`CliError` and become one
line on stderr with a non-zero exit status; nothing else is printed.
Input files are checked where they are opened, not in each subcommand:
traces in :mod:`hwtrace.cli._tracemap`, code images in
:mod:`hwtrace.flow.loaders`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from hwtrace.cli import _blas, _gc

_blas.install()      # numpy, when a command imports it, without BLAS threads

EPILOG = """\
exit status: 0 done (a damaged trace is decoded where it can be: its errors
are in the output at their trace offsets); 1 calls, summary, export or
coverage decoded not one instruction (one line says why), or diff: the runs
differ; 2 nothing could be done: a bad
command line, or input that is unreadable, empty, not Intel PT (no PSB), a
directory where a file belongs, or code that is not an x86 ELF file (one
line on stderr says which); 130 interrupted.  record and live branches
exit with the traced program's status (128+N: killed by signal N).
'hwtrace COMMAND --help' for a command's options."""


#: Every subcommand in ``hwtrace --help``'s order: its name -> (the module
#: of this package whose ``register(sub)`` adds its parser, the one line
#: ``hwtrace --help`` lists it with).  A command line that names a command
#: imports that module only; one that does not (``hwtrace``, ``--help``,
#: ``--version``, a bad command) imports none (:class:`_Deferred`).
COMMANDS = {
    "branches": ("branches",
                 "call/return/branch records, filtered and windowed"),
    "calls": ("calls",
              "indented function-call history with counts and durations, "
              "per thread"),
    "coverage": ("coverage", "edge coverage of a trace (exact counts and an "
                 "AFL-style bitmap)"),
    "decode": ("decode", "list the executed instructions (symbolized, "
               "disassembled; ptxed-compatible with --no-inst)"),
    "diff": ("diff", "where two recorded executions parted ways"),
    "dump": ("dump", "print a trace's packets (ptdump-compatible)"),
    "export": ("export", "export call timelines, flame graphs and coverage "
               "(Chrome JSON, Perfetto, folded, drcov, lcov)"),
    "images": ("images",
               "print ptxed/ptoracle --raw image arguments for a stream"),
    "import": ("import_perf",
               "import a perf.data or LLDB Intel PT trace into a bundle"),
    "info": ("info", "this machine's capabilities and engines (and why not); "
             "with DIR, what a bundle holds"),
    "record": ("record",
               "record a program's execution as an Intel PT trace bundle"),
    "recover": ("recover",
                "make a bundle from a trace directory (e.g. after a crash)"),
    "summary": ("summary", "top functions, call counts, lost data"),
}


def help_of(command: str) -> str:
    """The one-line help of ``command`` (its module's ``add_parser`` passes
    it, so that a command's line is written once)."""
    return COMMANDS[command][1]


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
    """An ArgumentParser whose errors are one line and exit status 2, and
    whose help formatters get the terminal's width from
    :func:`terminal_columns`."""

    def __init__(self, *args, formatter_class=argparse.HelpFormatter,
                 **kwargs):
        super().__init__(*args, formatter_class=_sized(formatter_class),
                         **kwargs)

    def error(self, message):  # noqa: D401 - argparse API
        raise CliError(f"{self.prog}: {message}", 2)


#: formatter class -> its :func:`_sized` subclass
_SIZED: dict = {}


def _sized(formatter_class):
    """``formatter_class`` given, when argparse gives it no width, the
    width it would look up itself, by :func:`terminal_columns`.  argparse
    makes a formatter for every argument added to a parser (to check its
    metavar), and a formatter with no width asks
    shutil.get_terminal_size, whose import loads shutil, bz2, lzma and
    zlib: ~3-4 ms of every command's start-up."""
    sized = _SIZED.get(formatter_class)
    if sized is None:
        class sized(formatter_class):
            def __init__(self, *args, **kwargs):
                if len(args) < 4 and kwargs.get("width") is None:
                    kwargs["width"] = terminal_columns() - 2
                super().__init__(*args, **kwargs)
        sized.__name__ = sized.__qualname__ = formatter_class.__name__
        _SIZED[formatter_class] = sized
    return sized


def terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``, as shutil computes it
    (COLUMNS if a positive integer, else the width of the terminal on
    ``sys.__stdout__``, else 80), without importing shutil."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0         # not a terminal: shutil's fallback
        columns = columns or 80
    return columns


def build_parser(command: str | None = None) -> Parser:
    """The command line's parser, with every subcommand; or, given the
    ``command`` a command line names, with that one only (the other
    modules are not even imported: most of a small command's start-up
    otherwise)."""
    if command in COMMANDS:
        return _parser([command])
    return _parser(list(COMMANDS))


def _parser(commands: list[str], deferred: bool = False) -> Parser:
    """The top-level parser with the subparsers of ``commands`` (their
    modules' own; ``deferred``: stand-ins that build them only if the
    command line reaches them)."""
    parser = Parser(prog="hwtrace", description="hardware control-flow tracing: "
                    "record, decode and view Intel Processor Trace",
                    epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"hwtrace {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                parser_class=_Deferred if deferred else Parser)
    sub.required = True
    for name in commands:
        if deferred:
            sub.add_parser(name, help=help_of(name), command=name)
        else:
            module = importlib.import_module(f"hwtrace.cli.{COMMANDS[name][0]}")
            module.register(sub)
    return parser


class _Deferred:
    """A subcommand's place in a parser built for a command line that names
    no command (``hwtrace --help`` lists the commands from
    :data:`COMMANDS`; ``--version`` and errors need none of them): if
    parsing does reach the command after all, its own parser is built and
    parses, exactly as when the command is named first."""

    def __init__(self, prog: str, command: str):
        self.prog = prog
        self.command = command

    def parse_known_args(self, args=None, namespace=None):
        real = _subparser(build_parser(self.command), self.command)
        return real.parse_known_args(args, namespace)


def _subparser(parser: Parser, command: str):
    return next(a for a in parser._actions
                if a.dest == "command").choices[command]


def _parser_for(argv: list[str]) -> Parser:
    """The parser ``main`` parses ``argv`` with: the named command's own
    (its module only), else every command deferred."""
    if argv and argv[0] in COMMANDS:
        return build_parser(argv[0])
    return _parser(list(COMMANDS), deferred=True)


def _version() -> str:
    from hwtrace import __version__
    return __version__


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv``; None: the process's own (the
    ``hwtrace`` script, ``python -m hwtrace``), which exits after it
    (:func:`hwtrace.cli._gc.command`'s ``program``)."""
    program = argv is None
    with _gc.command(program=program):
        return _main(sys.argv[1:] if program else argv, program)


def _main(argv: list[str], program: bool = False) -> int:
    try:
        parser = _parser_for(argv)
        if not argv:
            parser.print_help()         # "hwtrace" alone: what it can do
            return 2
        args = parser.parse_args(argv)
        status = int(args.func(args) or 0)
        if program and getattr(args, "quick_exit", False):
            from hwtrace.cli import _exit
            _exit.leave(status)         # returns where it cannot
        return status
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
