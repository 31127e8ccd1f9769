"""The host's memory: what it can still allocate, and a run refused before it asks for more.

A run that holds real data (a demo's blocks, a training run's stacks) checks its need here
before anything big is allocated, so a size the host cannot hold is one clear error rather
than a machine swapping or the process killed.

>>> check_host_memory(1024, "this run", "use smaller sizes")
>>> available_memory() is None or available_memory() > 0
True
"""

from __future__ import annotations

import os

from ._format import fmt_bytes
from .errors import CommandLineError

#: The share of the host's available memory a run may plan to use.
HOST_FRACTION = 0.75


def available_memory() -> int | None:
    """Bytes the host can still allocate: ``MemAvailable`` of ``/proc/meminfo``, else the free
    physical pages (``os.sysconf``), else None (unknown: no check).

    >>> isinstance(available_memory(), (int, type(None)))
    True
    """
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


__all__ = ["HOST_FRACTION", "available_memory", "check_host_memory"]
