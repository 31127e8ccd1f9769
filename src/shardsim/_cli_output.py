"""Machine-readable output and progress of the ``shardsim`` command line.

``--json`` prints one JSON document (schema in ``docs/cli.md``), ``--csv`` one table with a
header row; both go to stdout with nothing else, so they pipe into scripts and spreadsheets.
Numbers stay numbers: seconds, bytes, FLOPs and tokens unformatted; an infinite value (a
batch that never turns compute-bound) is ``null``.

Progress of a long run goes to stderr, and only when stderr is a terminal: ``tqdm`` or
``rich`` when installed (neither is a dependency), else a plain counter.

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

T = TypeVar("T")


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
