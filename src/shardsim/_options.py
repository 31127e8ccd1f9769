"""Option types shared by the command lines: ``shardsim`` (:mod:`shardsim.cli`), ``shardsim train``
(:mod:`shardsim.training.cli`) and the cost commands (:mod:`shardsim.cost.cli`).

A module of its own because :mod:`shardsim.cli` imports the other two at load time.
"""

from __future__ import annotations

import argparse
import re

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
