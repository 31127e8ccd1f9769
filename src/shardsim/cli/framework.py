"""The command framework: a registry of subcommands, one parser built from it, and every error as one line.

Each subcommand is one function registered with :func:`subcommand`; its ``configure``
function adds its options to its own parser. A subcommand returns the exit code: 0 when all
is well, 1 when a check failed. :func:`run_command` turns every error into one line on
stderr and exit code 2, never a traceback: a bad option (argparse's message, with the flag),
a :class:`~shardsim.ShardsimError` (in the command line's words, :func:`cli_words`), a file
that cannot be written, the host out of memory, or a bug (named as one).

>>> "demo" in commands()
True
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from ..errors import CommandLineError, ShardsimError


@dataclass(frozen=True)
class Subcommand:
    """One ``shardsim NAME`` command: its help line, its options and the function that runs it.

    >>> COMMANDS["schemes"].help
    'list the registered schemes, their roles, what each does and the options it reads'
    """

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    configure: Callable[[argparse.ArgumentParser], None] | None = None


#: The registered subcommands by name, in registration order (the order ``shardsim --help`` lists them).
COMMANDS: dict[str, Subcommand] = {}


def subcommand(
    name: str, help: str, *, configure: Callable[[argparse.ArgumentParser], None] | None = None
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Register the decorated function as ``shardsim NAME``; ``configure`` adds its options.

    >>> @subcommand("hello", "say hello")
    ... def hello(args):
    ...     print("hello")
    ...     return 0
    >>> COMMANDS.pop("hello").help
    'say hello'
    """

    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS[name] = Subcommand(name, help, run, configure)
        return run

    return register


def commands() -> list[str]:
    """The registered subcommands, in registration order.

    >>> commands()[:2]
    ['demo', 'schemes']
    """
    return list(COMMANDS)


class UsageError(CommandLineError):
    """A bad option or command, as argparse words it; ``prog`` is the (sub)command it is about.

    >>> UsageError("shardsim demo", "unrecognized arguments: --x").prog
    'shardsim demo'
    """

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """An argparse parser that raises :class:`UsageError` instead of printing usage and exiting,
    so :func:`run_command` reports it as one line.

    >>> Parser(prog="shardsim demo").parse_args(["--x"])
    Traceback (most recent call last):
    ...
    shardsim.cli.framework.UsageError: unrecognized arguments: --x (see 'shardsim demo --help')
    """

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    """The ``shardsim`` parser with one sub-parser per registered subcommand.

    >>> build_parser().prog
    'shardsim'
    """
    from .. import __version__

    parser = Parser(
        prog="shardsim",
        description="Run sharded training schemes on a virtual mesh of NumPy chips and see every "
        "collective, byte and chip's memory.",
    )
    parser.add_argument("--version", action="version", version=f"shardsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in COMMANDS.values():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        if cmd.configure is not None:
            cmd.configure(p)
        p.set_defaults(_run=cmd.run)
    return parser


@contextlib.contextmanager
def warnings_as_lines(prog: str) -> Iterator[None]:
    """Print each warning a command raises as one line on stderr, ``prog: warning: ...``, not
    as Python's file, line and source text.

    >>> import contextlib, io
    >>> err = io.StringIO()
    >>> with contextlib.redirect_stderr(err), warnings_as_lines("shardsim demo"):
    ...     warnings.warn("slow")
    >>> err.getvalue()
    'shardsim demo: warning: slow\\n'
    """

    def show(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
        print(f"{prog}: warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def run_command(argv: Sequence[str] | None) -> int:
    """Parse ``argv`` and run its subcommand; every error is one line on stderr and exit code 2.

    >>> run_command(["schemes", "--no-such-flag"])
    2
    """
    try:
        args, extra = build_parser().parse_known_args(argv)
        if extra:  # name the subcommand they were given to, not the top-level parser
            prog = f"shardsim {args.command}"
            raise UsageError(prog, f"unrecognized arguments: {' '.join(extra)} (see '{prog} --help')")
    except UsageError as e:
        return fail(e.prog, str(e))
    except SystemExit as e:  # --help and --version have printed and exit 0
        return e.code if isinstance(e.code, int) else 0
    prog = f"shardsim {args.command}"
    try:
        with warnings_as_lines(prog):
            return int(args._run(args))
    except UsageError as e:  # a subcommand's own parser (e.g. a --scheme list) refused a value
        return fail(e.prog, str(e))
    except ShardsimError as e:
        return fail(prog, str(e))
    except BrokenPipeError:  # the reader went away (``shardsim demo | head``): stop quietly
        with contextlib.suppress(OSError, ValueError):  # stdout may not be a file descriptor
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:  # a --png path in a missing folder, a read-only file...
        where = f" {e.filename!r}" if e.filename else ""
        return fail(prog, f"cannot write{where}: {e.strerror or e}")
    except MemoryError:
        return fail(prog, "the host ran out of memory; use smaller sizes, or a shape-only command (estimate)")
    except Exception as e:  # a bug: still one line, and named as one
        return fail(prog, f"internal error {type(e).__name__}: {e} (please report this command line)")


def fail(prog: str, message: str) -> int:
    """Print ``message`` as ``prog``'s one error line on stderr (:func:`cli_words`); exit code 2.

    >>> import contextlib, io
    >>> err = io.StringIO()
    >>> with contextlib.redirect_stderr(err):
    ...     fail("shardsim estimate", "e.g. links={'X': 'dcn'}")
    2
    >>> err.getvalue()
    'shardsim estimate: error: e.g. --links X=dcn\\n'
    """
    print(f"{prog}: error: {cli_words(message)}", file=sys.stderr)
    return 2


# -- messages in the command line's words -----------------------------------------------------
_KEYWORD = re.compile(r"\b(axes|links)=(\{[^{}]*\})")


def cli_words(message: str) -> str:
    """A library message with its Python keyword arguments spelt as the flags that set them,
    on one line.

    >>> cli_words("map an axis to another network, e.g. links={'X': 'dcn'}")
    'map an axis to another network, e.g. --links X=dcn'
    >>> cli_words("or pass axes={'data': <axis>}")
    'or pass --axes data=AXIS'
    """

    def flag(m: re.Match[str]) -> str:
        text = m.group(2).replace("<axis>", "'AXIS'")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return f"--{m.group(1)} NAME=VALUE"
        if not isinstance(value, dict):
            return m.group(0)
        return f"--{m.group(1)} " + ",".join(f"{k}={v}" for k, v in value.items())

    return " ".join(_KEYWORD.sub(flag, message).split())
