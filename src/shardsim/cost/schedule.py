"""When each event of a program starts on one chip: the scheduling rules of the time line.

- Matmuls run on the compute stream in program order, each once the values it reads exist.
- A collective runs on the links of the mesh axes it spans, once its input exists and it is
  issued: at the start of the compute op ``prefetch`` ops before the first matmul that reads
  its result (``prefetch=1``: it may hide behind the one matmul before its reader, as FSDP
  prefetches the next weight during the current matmul). A collective no matmul reads (a
  gradient's ReduceScatter) is issued at once. The rule looks at who reads a value, not at
  where the program wrote the collective, so two programs with the same data flow get the
  same schedule.
- Among the collectives issued at the same point, the one ready first goes first, into the
  first gap on its links: a weight's AllGather does not queue behind the ReduceScatter of a
  gradient that is still being computed (a latency-hiding scheduler).
- With ``overlap=False`` every event waits for the one before it.

>>> from shardsim.cost.schedule import Slot, schedule
>>> from shardsim.cost.program import Step
>>> from shardsim.tracing import Event
>>> ag = Step(Event(0, "all_gather", ("X",), "W", (), "", "forward"), 0, (1,), 2)
>>> mm = Step(Event(1, "matmul", (), "x @ W", (), "", "forward"), 0, (3, 2), 4)
>>> slots = [Slot("comm X", ("comm X",), 1.0), Slot("compute", ("compute",), 2.0)]
>>> [(p.index, p.start, p.end) for p in schedule([ag, mm], slots)]  # the matmul waits for W
[(0, 0.0, 1.0), (1, 1.0, 3.0)]
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ..errors import ShardsimError
from .program import Step


@dataclass(frozen=True)
class Slot:
    """What an event needs: its ``stream`` (``"compute"``, ``"comm X"``..., None for a free
    local op), the ``links`` it occupies (compute streams too: one per set of chips that runs
    steps of its own, as pipeline stages do) and how many ``seconds``."""

    stream: str | None
    links: tuple[str, ...]
    seconds: float


@dataclass(frozen=True)
class Placed:
    """Step ``index`` of the program runs from ``start`` to ``end``."""

    index: int
    start: float
    end: float


def schedule(steps: Sequence[Step], slots: Sequence[Slot], *, overlap: bool = True, prefetch: int = 1) -> list[Placed]:
    """Start and end of every costed step (see the module doc), in the order they were placed."""
    if prefetch < 1:
        raise ShardsimError(f"prefetch counts compute ops a collective may run ahead; it must be >= 1, got {prefetch}")
    if not overlap:
        return _serial(steps, slots)
    order, issued_by = _issue_order(steps, slots, prefetch)
    ready: dict[int, float] = {}
    started: dict[int, float] = {}
    busy: dict[str, _Busy] = defaultdict(_Busy)
    free: dict[str, float] = defaultdict(float)  # end of each compute stream
    out: list[Placed] = []

    def dep(i: int) -> float:
        return max((ready.get(v, 0.0) for v in steps[i].inputs), default=0.0)

    def issued(i: int) -> float:  # a collective may start once its inputs exist and it is issued
        return max(dep(i), started.get(issued_by.get(i, -1), 0.0))

    k = 0
    while k < len(order):
        i = order[k]
        if _computes(slots[i]):
            start = max(dep(i), *(free[s] for s in slots[i].links))
            end = ready[steps[i].output] = start + slots[i].seconds
            for s in slots[i].links:
                free[s] = end
            started[i] = start
            out.append(Placed(i, start, end))
            k += 1
            continue
        run = []
        while k < len(order) and not _computes(slots[order[k]]):
            run.append(order[k])
            k += 1
        for i in _ready_first(run, steps, issued):
            slot = slots[i]
            if slot.stream is None:  # a free local op: its value exists when its inputs do
                ready[steps[i].output] = dep(i)
                continue
            start = _first_gap([busy[s] for s in slot.links], issued(i), slot.seconds)
            for s in slot.links:
                busy[s].add(start, start + slot.seconds)
            ready[steps[i].output] = start + slot.seconds
            out.append(Placed(i, start, start + slot.seconds))
    return out


def _ready_first(run: list[int], steps: Sequence[Step], when: Callable[[int], float]) -> Iterator[int]:
    """The collectives of ``run`` in the order they go: among those whose inputs from the run
    are placed, the one issued and ready first (then program order). A collective's time is
    fixed once its run inputs are placed, so a heap of the eligible ones gives the order."""
    made = {steps[i].output: i for i in run}
    position = {i: k for k, i in enumerate(run)}
    waiting = {i: {made[v] for v in steps[i].inputs if v in made and made[v] != i} for i in run}
    readers: dict[int, list[int]] = defaultdict(list)
    for i, producers in waiting.items():
        for p in producers:
            readers[p].append(i)
    heap: list[tuple[float, int, int]] = []
    left = set(run)

    def push(i: int) -> None:
        heapq.heappush(heap, (when(i), position[i], i))

    for i in run:
        if not waiting[i]:
            push(i)
    while left:
        if not heap:  # a cycle among the run (cannot happen in a trace): the first left goes
            push(min(left, key=position.__getitem__))
        _, _, i = heapq.heappop(heap)
        if i not in left:
            continue
        left.discard(i)
        yield i  # the caller places it before the readers' times are asked for
        for r in readers.pop(i, []):
            waiting[r].discard(i)
            if not waiting[r] and r in left:
                push(r)


def _serial(steps: Sequence[Step], slots: Sequence[Slot]) -> list[Placed]:
    ready: dict[int, float] = {}
    t = 0.0
    out = []
    for i, (st, slot) in enumerate(zip(steps, slots)):
        dep = max((ready.get(v, 0.0) for v in st.inputs), default=0.0)
        if slot.stream is None:
            ready[st.output] = dep
            continue
        start = max(dep, t)
        t = ready[st.output] = start + slot.seconds
        out.append(Placed(i, start, t))
    return out


def _computes(slot: Slot) -> bool:
    return slot.stream is not None and slot.stream.startswith("compute")


def _issue_order(steps: Sequence[Step], slots: Sequence[Slot], prefetch: int) -> tuple[list[int], dict[int, int]]:
    """Program order with each collective moved to just after the compute op that issues it."""
    streams: dict[str, list[int]] = defaultdict(list)  # compute ops of each compute stream, in order
    position: dict[int, int] = {}
    reader: dict[int, int] = {}
    for i, slot in enumerate(slots):
        if _computes(slot):
            stream = streams[slot.links[0]]
            position[i] = len(stream)
            stream.append(i)
            for v in steps[i].inputs:
                reader.setdefault(v, i)
    later: dict[int, list[int]] = defaultdict(list)
    issued_by: dict[int, int] = {}
    order: list[int] = []
    for i, slot in enumerate(slots):
        if _computes(slot):
            order.append(i)
            order.extend(later.pop(i, []))
            continue
        r = reader.get(steps[i].output)
        if r is not None and r > i and position[r] >= prefetch:
            j = streams[slots[r].links[0]][position[r] - prefetch]
            issued_by[i] = j
            if j > i:
                later[j].append(i)
                continue
        order.append(i)
    for rest in later.values():  # issued by a compute op that never came: keep them last
        order.extend(rest)
    return order, issued_by


class _Busy:
    """Busy intervals of one link, sorted and disjoint."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def clash(self, start: float, end: float) -> float | None:
        """The end of an interval overlapping ``[start, end)``, or None if it is free."""
        k = bisect.bisect_right(self.starts, start) - 1
        for j in (k, k + 1):
            if 0 <= j < len(self.starts) and self.starts[j] < end and self.ends[j] > start:
                return self.ends[j]
        return None

    def add(self, start: float, end: float) -> None:
        if end <= start:
            return
        k = bisect.bisect_right(self.starts, start)
        self.starts.insert(k, start)
        self.ends.insert(k, end)


def _first_gap(links: list[_Busy], start: float, seconds: float) -> float:
    """The earliest time from ``start`` at which every link is free for ``seconds``."""
    if seconds <= 0:
        return start
    moved = True
    while moved:
        moved = False
        for link in links:
            end = link.clash(start, start + seconds)
            if end is not None:
                start, moved = end, True
    return start
