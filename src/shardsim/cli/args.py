"""Argument types and limits of the ``shardsim`` command line.

Every number the command line reads goes through one of these types, so ``0``, negative
sizes, non-numbers and sizes past a documented limit (:data:`LIMITS`, listed in
``docs/cli.md``) are refused at the door with the flag's name, before any work or
allocation. Whole numbers are written in ASCII digits (:func:`whole_number`).

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
import math
import re
from collections.abc import Callable

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
#: Seeds NumPy accepts as one 32-bit word.
SEED_MAX = 2**32 - 1


# -- whole numbers and NAME=VALUE lists ------------------------------------------------------
# A whole number as a person writes it: ASCII digits, an optional minus sign, nothing else
# (int() alone would also take "+2", "2_000" and other scripts' digits such as "٢").
_WHOLE = re.compile(r"-?[0-9]+")


def whole_number(text: str) -> int | None:
    """``text`` as a whole number written in digits (spaces around it ignored), else None.

    >>> whole_number(" 12 "), whole_number("-3"), whole_number("+2"), whole_number("1_0")
    (12, -3, None, None)
    """
    stripped = text.strip() if isinstance(text, str) else ""
    return int(stripped) if _WHOLE.fullmatch(stripped) else None


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1.

    >>> positive_int("4")
    4
    """
    n = whole_number(text)
    if n is None:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {n}")
    return n


def pairs(text: str) -> list[tuple[str, ...]]:
    """Each comma-separated item of ``text`` split at its first ``=``: ``(key, "=", value)``, stripped.

    >>> pairs("X=2, Y")
    [('X', '=', '2'), ('Y', '', '')]
    """
    return [tuple(s.strip() for s in item.partition("=")) for item in text.split(",")]


def key_values(text: str) -> dict[str, str]:
    """``"X=2,Y=4"`` → ``{"X": "2", "Y": "4"}`` (an argparse type for ``--mesh`` and ``--axes``).

    >>> key_values("data=X, model=Y")
    {'data': 'X', 'model': 'Y'}
    """
    out: dict[str, str] = {}
    for key, sep, value in pairs(text):
        if not sep or not key or not value:
            raise argparse.ArgumentTypeError(f"expected NAME=VALUE pairs separated by commas, got {text!r}")
        if key in out:
            raise argparse.ArgumentTypeError(f"{key!r} given twice in {text!r}")
        out[key] = value
    return out


def mesh_sizes(text: str) -> dict[str, int]:
    """``"X=2,Y=4"`` → ``{"X": 2, "Y": 4}``: the ``--mesh`` option; every size a positive whole
    number written in digits.

    >>> mesh_sizes("X=2,Y=4")
    {'X': 2, 'Y': 4}
    >>> mesh_sizes("X=+2")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: mesh axis 'X' needs a whole-number size written in digits, got '+2' (write e.g. X=2,Y=4)
    """
    out = {}
    for axis, size in key_values(text).items():
        n = whole_number(size)
        if n is None:
            raise argparse.ArgumentTypeError(
                f"mesh axis {axis!r} needs a whole-number size written in digits, got {size!r} (write e.g. X=2,Y=4)"
            )
        if n < 1:
            raise argparse.ArgumentTypeError(f"mesh axis {axis!r} needs at least 1 chip, got {size}")
        out[axis] = n
    return out


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
