"""Option types shared by the command lines: ``shardsim`` (:mod:`shardsim.cli`), ``shardsim train``
(:mod:`shardsim.training.cli`) and the cost commands (:mod:`shardsim.cost.cli`).

A module of its own because :mod:`shardsim.cli` imports the other two at load time.
"""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1.

    >>> positive_int("4")
    4
    """
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}") from None
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
    """``"X=2,Y=4"`` → ``{"X": 2, "Y": 4}``: the ``--mesh`` option.

    >>> mesh_sizes("X=2,Y=4")
    {'X': 2, 'Y': 4}
    """
    out = {}
    for axis, size in key_values(text).items():
        try:
            out[axis] = int(size)
        except ValueError:
            raise argparse.ArgumentTypeError(f"mesh axis {axis!r} needs a whole-number size, got {size!r}") from None
    return out
