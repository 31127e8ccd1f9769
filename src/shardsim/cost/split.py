"""How one set of chips spends a step: computing, waiting for its collectives, or idle.

A time line's totals split each set of chips' step (every chip's, or one pipeline stage's):
``compute_s`` (its compute stream busy), ``exposed_s`` (its compute idle while one of its
collectives runs) and ``bubble_s`` (idle with none running: a stage waiting for another
stage's work), which add up to the step; its collectives' sum ``comm_s`` splits into the part
under compute, the exposed part and the rest, behind other comm. Exposed communication is a
union of moments, so it is never more than the communication.

>>> ChipsTime("Z1", 2.0, 0.5, 0.25, 0.25, 1.0).chips
'Z1'
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Span(Protocol):
    """What the split reads of a bar of the time line (:class:`~shardsim.cost.timeline.Bar`)."""

    @property
    def start(self) -> float: ...

    @property
    def end(self) -> float: ...

    @property
    def seconds(self) -> float: ...

    @property
    def is_compute(self) -> bool: ...


@dataclass(frozen=True)
class ChipsTime:
    """One set of chips' step, in seconds (``chips`` is their ``Event.where``, ``""`` for all).

    ``compute_s`` is their compute stream's busy time; ``comm_s`` sums their collectives, split
    into ``under_compute_s`` (overlapping their compute), ``exposed_s`` (their compute idle, one
    of their collectives running: the union of those moments, so two collectives at once count
    once) and the rest, behind other comm. ``bubble_s`` is the step's remaining idle time, with
    none of their collectives running: ``step_s = compute_s + exposed_s + bubble_s``.
    """

    chips: str
    compute_s: float
    comm_s: float
    under_compute_s: float
    exposed_s: float
    bubble_s: float


def chips_time(chips: str, bars: Sequence[Span], step_s: float) -> ChipsTime:
    """The :class:`ChipsTime` of the ``bars`` one set of chips runs, over a step of ``step_s``.

    >>> from dataclasses import replace
    >>> from shardsim.cost.timeline import Bar
    >>> busy = Bar(0, "compute", "matmul", (), "x @ W", "forward", 0, 1.0, 3.0, 0, 1, "compute")
    >>> ring = replace(busy, index=1, stream="comm X", op="all_gather", start=0.0, end=2.0)
    >>> chips_time("", [ring, busy], 5.0)  # 1 s exposed, 1 s under compute, 2 s idle: the bubble
    ChipsTime(chips='', compute_s=2.0, comm_s=2.0, under_compute_s=1.0, exposed_s=1.0, bubble_s=2.0)
    """
    compute = _union([(b.start, b.end) for b in bars if b.is_compute])
    comm = [(b.start, b.end) for b in bars if not b.is_compute and b.seconds > 0]
    busy = sum(b.seconds for b in bars if b.is_compute)
    under = sum(_overlap(start, end, compute) for start, end in comm)
    exposed = sum(end - start - _overlap(start, end, compute) for start, end in _union(comm))
    idle = max(0.0, step_s - busy - exposed)
    return ChipsTime(chips, busy, sum(end - start for start, end in comm), under, exposed, idle)


def busiest(times: Sequence[ChipsTime]) -> ChipsTime:
    """The chips with the most compute; among stages within a billionth of it (equal stages,
    their sums rounded apart), the most communication, then the most exposed.

    >>> busiest([ChipsTime("Z0", 2.0, 0.1, 0.1, 0.0, 1.0), ChipsTime("Z1", 2.0, 0.2, 0.1, 0.1, 0.9)]).chips
    'Z1'
    """
    if not times:
        return ChipsTime("", 0.0, 0.0, 0.0, 0.0, 0.0)
    top = max(t.compute_s for t in times)
    tied = [t for t in times if t.compute_s >= top * (1 - 1e-9)]
    return max(tied, key=lambda t: (t.comm_s, t.exposed_s))


def _union(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same time as ``spans``."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _overlap(start: float, end: float, disjoint: Sequence[tuple[float, float]]) -> float:
    """Seconds of ``[start, end)`` inside the sorted, disjoint intervals ``disjoint``."""
    k = max(0, bisect.bisect_right(disjoint, (start, float("inf"))) - 1)
    total = 0.0
    while k < len(disjoint) and disjoint[k][0] < end:
        total += max(0.0, min(end, disjoint[k][1]) - max(start, disjoint[k][0]))
        k += 1
    return total


__all__ = ["ChipsTime", "Span", "busiest", "chips_time"]
