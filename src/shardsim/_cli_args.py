"""Argument types, limits and the host-memory check of the ``shardsim`` command line.

Every number the command line reads goes through one of these types, so ``0``, negative
sizes, non-numbers and sizes past a documented limit (:data:`LIMITS`, listed in
``docs/cli.md``) are refused at the door with the flag's name, before any work or
allocation. A run that holds real data is also checked against the host's free memory
(:func:`check_host_memory`) before anything is allocated.

>>> steps = count("steps")
>>> steps("12")
12
>>> steps("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected a whole number from 1 to 10,000, got 0
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from ._options import mesh_sizes, whole_number
from ._output_file import output_problem, write_output
from .errors import CommandLineError
from .memory import fmt_bytes

#: The largest value each bounded argument accepts. Chips and sizes that hold real data
#: (``demo``, ``train``) are bounded tighter than the shape-only cost commands'.
LIMITS: dict[str, int] = {
    "chips": 4096,  # demo, train: every chip holds NumPy blocks
    "cost_chips": 65536,  # estimate, sweep, critical: shape-only
    "batch": 2**34,  # tokens; with the widths below, no byte count nears 2**63
    "width": 2**24,  # d_model, d_ff
    "layers": 256,  # train
    "cost_layers": 1024,  # estimate, sweep, critical
    "steps": 10_000,  # train
    "microbatches": 1024,  # pipeline schemes' --option microbatches
    "sweep_points": 1000,  # sweep: schemes x batches
    "columns": 1000,  # estimate --width
}
#: The share of the host's available memory a run may plan to use.
HOST_FRACTION = 0.75
#: Seeds NumPy accepts as one 32-bit word.
SEED_MAX = 2**32 - 1


def _whole(text: str) -> int:
    """``text`` as a whole number written in digits, or an :class:`argparse.ArgumentTypeError` quoting it."""
    n = whole_number(text)
    if n is None:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return n


def count(limit: str, low: int = 1) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``LIMITS[limit]``.

    >>> count("chips")("8")
    8
    """
    high = LIMITS[limit]

    def parse(text: str) -> int:
        n = _whole(text)
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low:,} to {high:,}, got {n}")
        return n

    parse.__name__ = limit  # argparse names the type in some messages
    return parse


def seed(text: str) -> int:
    """An argparse type: a random seed, a whole number from 0 to 2**32 - 1.

    >>> seed("7")
    7
    """
    n = _whole(text)
    if not 0 <= n <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected a seed from 0 to {SEED_MAX:,}, got {n}")
    return n


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (a learning rate).

    >>> positive_float("1e-3")
    0.001
    """
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number above 0, got {text!r}")
    return x


def mesh_type(limit: str = "chips") -> Callable[[str], dict[str, int]]:
    """An argparse type: ``X=2,Y=4`` as ``{"X": 2, "Y": 4}``, every size at least 1 and at most
    ``LIMITS[limit]`` chips in all.

    >>> mesh_type()("X=2, Y=4")
    {'X': 2, 'Y': 4}
    """
    high = LIMITS[limit]

    def parse(text: str) -> dict[str, int]:
        sizes = mesh_sizes(text)
        chips = math.prod(sizes.values())
        if chips > high:
            raise argparse.ArgumentTypeError(f"{text!r} is {chips:,} chips; the limit is {high:,}")
        return sizes

    parse.__name__ = "mesh"
    return parse


# -- the host's memory ------------------------------------------------------------------------
def available_memory() -> int | None:
    """Bytes the host can still allocate: ``MemAvailable`` of ``/proc/meminfo``, else the free
    physical pages (``os.sysconf``), else None (unknown: no check)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def check_host_memory(need: int, what: str, alternative: str) -> None:
    """Refuse a run that needs more than :data:`HOST_FRACTION` of the available memory.

    >>> check_host_memory(1024, "this run", "use smaller sizes")
    >>> check_host_memory(2**80, "this run", "use smaller sizes")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    shardsim.errors.CommandLineError: this run needs about ... of host memory and ... is available; use smaller sizes
    """
    free = available_memory()
    if free is not None and need > HOST_FRACTION * free:
        raise CommandLineError(
            f"{what} needs about {fmt_bytes(need)} of host memory and {fmt_bytes(free)} is available; {alternative}"
        )


# -- files the command line writes ----------------------------------------------------------
def _suffix(flag: str) -> str:
    return ".png" if flag == "--png" else ".json"


def check_output_path(flag: str, path: str | None) -> None:
    """Refuse a file option (``--png``, ``--chrome-trace``) that cannot be written, before any
    work: an empty path, a missing folder, a folder, a symbolic link, a FIFO or a device.

    >>> check_output_path("--chrome-trace", None)
    >>> check_output_path("--chrome-trace", "/")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    shardsim.errors.CommandLineError: --chrome-trace '/' is a folder; give a file name, e.g. /out.json
    """
    if path is None:
        return
    problem = output_problem(path, _suffix(flag))
    if problem is not None:
        raise CommandLineError(f"{flag} {path!r} {problem}")


def write_output_option(flag: str, path: str, data: bytes, *, quiet: bool) -> None:
    """Write a file option's ``data`` to ``path`` as a checkpoint writes its files (atomically,
    never through a link, never into a FIFO); a failure is a one-line :class:`~shardsim.CommandLineError`."""
    check_output_path(flag, path)  # again: the path may have changed while the command ran
    try:
        write_output(path, data)
    except OSError as e:
        raise CommandLineError(f"{flag} {path!r} cannot be written: {e.strerror or e}") from None
    if not quiet:
        print(f"wrote {path}")


def add_chrome_trace_option(parser: argparse.ArgumentParser, what: str) -> None:
    """The ``--chrome-trace FILE`` option: ``what`` says which programs the file holds."""
    parser.add_argument(
        "--chrome-trace",
        metavar="FILE",
        help=f"also write {what} as Trace Event Format JSON, one process per scheme (open it in Perfetto)",
    )


def write_chrome_trace_option(programs: Mapping[str, Any], path: str | None, *, quiet: bool) -> None:
    """Write ``programs`` (traces or time lines, by name) to ``--chrome-trace``'s ``path``, if given."""
    if path is None:
        return
    from .trace_events import export_chrome_trace

    doc = export_chrome_trace(programs, None)
    write_output_option("--chrome-trace", path, json.dumps(doc, allow_nan=False).encode("utf-8"), quiet=quiet)


#: The resolution of a ``--png`` (the plotting functions' own default).
PNG_DPI = 150


def write_png_option(figure: Any, path: str, *, quiet: bool) -> None:
    """Save a matplotlib ``figure`` as ``--png``'s ``path`` with :func:`write_output_option`."""
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=PNG_DPI, bbox_inches="tight")
    write_output_option("--png", path, buffer.getvalue(), quiet=quiet)


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
