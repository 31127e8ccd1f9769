"""What the ``shardsim`` command line writes: JSON and CSV, progress, and output files.

``--json`` prints one JSON document (schema in ``docs/cli.md``), ``--csv`` one table with a
header row; both go to stdout with nothing else, so they pipe into scripts and spreadsheets.
Numbers stay numbers: seconds, bytes, FLOPs and tokens unformatted; an infinite value (a
batch that never turns compute-bound) is ``null``.

Progress of a long run goes to stderr, and only when stderr is a terminal: ``tqdm`` or
``rich`` when installed (neither is a dependency), else a plain counter.

A file option (``--png``, ``--chrome-trace``) is refused before any work when its path cannot
be written, and written as a checkpoint writes its files.

>>> import io
>>> out = io.StringIO()
>>> write_csv([{"scheme": "ddp", "step_s": 0.5}], out)
>>> out.getvalue().splitlines()
['scheme,step_s', 'ddp,0.5']
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import IO, Any, TypeVar

from .._output_file import output_problem, write_output
from ..errors import CommandLineError

T = TypeVar("T")
#: The width the text output fits: a terminal this wide.
WIDTH = 96


def add_output_options(parser: argparse.ArgumentParser, *, table: bool = True) -> None:
    """``--json`` (and ``--csv`` when the command's result is a table), mutually exclusive."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help="print the result as JSON (schema: docs/cli.md)")
    if table:
        group.add_argument("--csv", action="store_true", help="print the result as CSV with a header row")


def plain(value: Any) -> Any:
    """``value`` with NumPy scalars, tuples and non-finite floats made JSON's own.

    >>> plain({"a": (1, float("inf"))})
    {'a': [1, None]}
    """
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # a NumPy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(record: Mapping[str, Any], out: IO[str] | None = None) -> None:
    """One JSON document on ``out`` (default stdout)."""
    print(json.dumps(plain(record), indent=2, allow_nan=False), file=out or sys.stdout)


def write_csv(rows: Sequence[Mapping[str, Any]], out: IO[str] | None = None) -> None:
    """A header row (the keys of the first row) and one line per row, on ``out`` (default stdout)."""
    if not rows:
        return
    writer = csv.DictWriter(out or sys.stdout, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in plain(row).items()})


def progress(items: Iterable[T], total: int, desc: str, *, every: int = 1) -> Iterator[T]:
    """``items``, with a progress bar on stderr when it is a terminal and ``total`` is long.

    >>> list(progress(range(3), 3, "steps"))  # not a terminal: nothing is drawn
    [0, 1, 2]
    """
    if total < every * 20 or not _is_tty(sys.stderr):
        yield from items
        return
    try:
        from tqdm import tqdm  # optional

        yield from tqdm(items, total=total, desc=desc, file=sys.stderr, leave=False)
        return
    except ImportError:
        pass
    try:
        from rich.progress import track  # optional

        yield from track(items, total=total, description=desc, transient=True)
        return
    except ImportError:
        pass
    for i, item in enumerate(items, 1):
        yield item
        print(f"\r{desc}: {i}/{total}", end="", file=sys.stderr, flush=True)
    print("\r" + " " * (len(desc) + 2 * len(str(total)) + 3) + "\r", end="", file=sys.stderr, flush=True)


def _is_tty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


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
    from ..trace_events import export_chrome_trace

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
