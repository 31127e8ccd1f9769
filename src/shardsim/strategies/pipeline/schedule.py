"""Pipeline schedules as data: which stage runs which microbatch's forward (F) or backward (B) when.

A :class:`Schedule` is a list of :class:`Item` ``(time, stage, kind, microbatch, chunk)``,
built from each stage's order of work by running it on a clock where every item takes one
step and waits for the items it needs (Narayanan et al. 2021, §2.2):

- ``F`` of virtual stage ``k`` on microbatch ``j`` needs ``F`` of stage ``k-1`` on ``j``;
- ``B`` of stage ``k`` needs ``B`` of stage ``k+1`` (the last stage: its own ``F``).

With ``v`` model chunks per stage (interleaved), virtual stage ``k`` is chunk ``k // p``
of stage ``k % p``. The same orders run on any clock (:meth:`Schedule.timeline`), e.g. one
where a backward costs twice a forward, to measure the bubble:

- GPipe and 1F1B: bubble ``(p-1)(t_f+t_b)`` against ideal ``m(t_f+t_b)``: **(p-1)/m**,
  an idle fraction of ``(p-1)/(m+p-1)``; GPipe stashes ``m`` microbatches, 1F1B at most ``p``.
- Interleaved 1F1B: **(p-1)/(v·m)** (requires ``m`` to be a multiple of ``p``).

Zero-bubble schedules (Qi et al. 2024) split the backward in two: ``B``, the gradient of the
stage's input, which the previous stage waits for, and ``W``, its weights' gradients, which
nothing waits for and which may run later (``W`` needs its own ``B``). A microbatch's stash is
held until its ``W``:

- ZB-H1: 1F1B's order with stage ``s``'s ``W`` passes ``s`` microbatches late; bubble
  ``(p-1)(t_F+t_B-t_W)``, at most ``p`` microbatches held on any stage (1F1B's first stage).
- ZB-H2: up to ``2p-1`` held, the warm-up's extra forwards and the late ``W`` passes filling
  the bubbles; within one step (the optimizer after the flush) the ramp ``(p-1)t_F`` stays:
  bubble ``(p-1)·max(t_F, t_F+t_B-2t_W)`` once ``m >= 2p``.

>>> s = one_f_one_b(stages=3, microbatches=4)
>>> print(s.grid())
stage 0 | F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3
stage 1 | .  F0 F1 .  B0 F2 B1 F3 B2 .  B3 .
stage 2 | .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .
>>> s.bubble(), s.idle_fraction(), s.peak_in_flight()
(0.5, 0.3333333333333333, [3, 2, 1])
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...errors import ShardingError

Key = tuple[int, str, int, int]  # (stage, kind, microbatch, chunk)


@dataclass(frozen=True, order=True)
class Item:
    """One unit of pipeline work: ``kind`` (``"F"``, ``"B"``, or ``"W"`` when the backward is split) of
    ``microbatch`` on ``stage``."""

    time: int
    stage: int
    kind: str
    microbatch: int
    chunk: int = 0

    @property
    def key(self) -> Key:
        return (self.stage, self.kind, self.microbatch, self.chunk)


@dataclass(frozen=True)
class Timed:
    """An item placed on a clock: it runs from ``start`` to ``end``."""

    item: Item
    start: float
    end: float


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: ``stages`` (p) stages, ``microbatches`` (m), ``chunks`` (v) per stage."""

    name: str
    stages: int
    microbatches: int
    chunks: int
    items: tuple[Item, ...]

    @functools.cached_property  # read by every clock of a search: the items are walked once
    def split(self) -> bool:
        """Whether the backward is split into ``B`` and a later ``W`` (the zero-bubble schedules)."""
        return any(it.kind == "W" for it in self.items)

    def virtual_stage(self, item: Item) -> int:
        """The model chunk's place in the layer order: ``chunk * stages + stage``."""
        return item.chunk * self.stages + item.stage

    def orders(self) -> list[list[Item]]:
        """Each stage's items in the order it runs them."""
        out: list[list[Item]] = [[] for _ in range(self.stages)]
        for it in sorted(self.items):
            out[it.stage].append(it)
        return out

    # -- the picture ----------------------------------------------------------------------
    def grid(self) -> str:
        """The classic stage-by-time picture: one row per stage, ``.`` where it idles."""
        steps = max(it.time for it in self.items) + 1
        cells = [["."] * steps for _ in range(self.stages)]
        for it in self.items:
            chunk = chr(ord("a") + it.chunk) if self.chunks > 1 else ""
            cells[it.stage][it.time] = f"{it.kind}{it.microbatch}{chunk}"
        width = max(len(c) for row in cells for c in row)
        rows = [f"stage {s} | " + " ".join(c.ljust(width) for c in row) for s, row in enumerate(cells)]
        return "\n".join(r.rstrip() for r in rows)

    # -- time -----------------------------------------------------------------------------
    def timeline(self, duration: Callable[[Item], float] | None = None) -> list[Timed]:
        """Run each stage's order on a clock where ``duration(item)`` is an item's time.

        Every item starts as soon as its stage is free and the items it needs are done.
        Default: one step per item (the schedule's own ``time``).
        """
        return _clock(self.orders(), self.stages * self.chunks, duration or (lambda it: 1.0))

    def idle_fraction(self, duration: Callable[[Item], float] | None = None) -> float:
        """The share of the stages' time spent idle: ``(p-1)/(m+p-1)`` for GPipe and 1F1B."""
        idle, busy = self._idle_busy(duration)
        return idle / (idle + busy)

    def bubble(self, duration: Callable[[Item], float] | None = None) -> float:
        """Bubble time over ideal time, Narayanan's ``t_pb / t_id``: ``(p-1)/m``, ``(p-1)/(v·m)``."""
        idle, busy = self._idle_busy(duration)
        return idle / busy

    def _idle_busy(self, duration: Callable[[Item], float] | None) -> tuple[float, float]:
        timed = self.timeline(duration)
        span = max(t.end for t in timed)
        busy = sum(t.end - t.start for t in timed)
        return span * self.stages - busy, busy

    def in_flight(self) -> list[list[int]]:
        """Per stage, after each of its items: how many microbatch chunks it has stashed (until
        their ``W`` when the backward is split)."""
        freed = "W" if self.split else "B"
        out = []
        for order in self.orders():
            n, counts = 0, []
            for it in order:
                n += 1 if it.kind == "F" else -1 if it.kind == freed else 0
                counts.append(n)
            out.append(counts)
        return out

    def peak_in_flight(self) -> list[int]:
        """Per stage, the most microbatch chunks stashed at once: ``m`` (GPipe), ``p - s`` (1F1B)."""
        return [max(c) for c in self.in_flight()]


# -- the schedules ------------------------------------------------------------------------------
def gpipe(stages: int, microbatches: int) -> Schedule:
    """GPipe: every stage runs all forwards, then all backwards (Huang et al. 2019).

    >>> print(gpipe(2, 2).grid())
    stage 0 | F0 F1 .  .  B0 B1
    stage 1 | .  F0 F1 B0 B1 .
    """
    p, m = _check(stages, microbatches)
    orders = [[("F", j, 0) for j in range(m)] + [("B", j, 0) for j in range(m)] for _ in range(p)]
    return _schedule("gpipe", p, m, 1, orders)


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """1F1B (PipeDream-Flush): ``p-s-1`` warm-up forwards, then one forward, one backward.

    Stage ``s`` never stashes more than ``p - s`` microbatches (Narayanan et al. 2021).
    """
    p, m = _check(stages, microbatches)
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        order = [("F", j, 0) for j in range(warm)]
        for i in range(m - warm):
            order += [("F", warm + i, 0), ("B", i, 0)]
        order += [("B", j, 0) for j in range(m - warm, m)]
        orders.append(order)
    return _schedule("1f1b", p, m, 1, orders)


def interleaved(stages: int, microbatches: int, chunks: int) -> Schedule:
    """Interleaved 1F1B: ``chunks`` model chunks per stage, Megatron-LM's order.

    Forwards go through the chunks in groups of ``p`` microbatches; warm-up is
    ``2(p-s-1) + (v-1)p`` forwards. The bubble shrinks by ``v``; needs ``m % p == 0``.

    >>> interleaved(2, 2, 2).bubble()
    0.25
    """
    p, m = _check(stages, microbatches)
    v = chunks
    if v < 1:
        raise ShardingError(f"interleaved needs chunks >= 1, got {v}")
    if m % p:
        raise ShardingError(
            f"the interleaved schedule needs microbatches to be a multiple of stages: {m} is not a multiple of {p}"
        )
    total = m * v

    def nth(k: int, kind: str) -> tuple[str, int, int]:
        group, within = divmod(k, p * v)
        chunk = within // p
        return kind, group * p + within % p, (chunk if kind == "F" else v - 1 - chunk)

    orders = []
    for s in range(p):
        warm = min((p - s - 1) * 2 + (v - 1) * p, total)
        order = [nth(k, "F") for k in range(warm)]
        for i in range(total - warm):
            order += [nth(warm + i, "F"), nth(i, "B")]
        order += [nth(k, "B") for k in range(total - warm, total)]
        orders.append(order)
    return _schedule("interleaved", p, m, v, orders)


def zb_h1(stages: int, microbatches: int) -> Schedule:
    """ZB-H1 (Qi et al. 2024, §3): 1F1B with the backward split, stage ``s`` running each ``W``
    ``s`` microbatches after its ``B`` so that the ``B`` passes, which the previous stage waits
    for, reach it sooner; the deferred ``W`` passes fill the cool-down.

    >>> s = zb_h1(stages=3, microbatches=4)
    >>> print(s.grid())
    stage 0 | F0 F1 F2 .  .  B0 W0 F3 B1 W1 B2 W2 B3 W3
    stage 1 | .  F0 F1 .  B0 F2 B1 W0 F3 B2 W1 B3 W2 W3
    stage 2 | .  .  F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3
    >>> s.bubble(), s.peak_in_flight()  # (p-1)(tF+tB-tW) on 3m units; p held on every stage
    (0.16666666666666666, [3, 3, 3])
    """
    p, m = _check(stages, microbatches)
    orders = []
    for s, order in enumerate(one_f_one_b(p, m).orders()):
        out: list[tuple[str, int, int]] = []
        for it in order:
            out.append(("F" if it.kind == "F" else "B", it.microbatch, 0))
            if it.kind == "B" and it.microbatch >= s:
                out.append(("W", it.microbatch - s, 0))
        out += [("W", j, 0) for j in range(max(0, m - s), m)]
        orders.append(out)
    return _schedule("zb-h1", p, m, 1, orders)


def zb_h2(stages: int, microbatches: int) -> Schedule:
    """ZB-H2 (Qi et al. 2024, §3): up to ``2p-1`` microbatches held, each stage running, whenever
    it is free, a ``B`` that has arrived, else a forward while it holds fewer than ``2p-1``, else
    its oldest deferred ``W`` (the order built on a clock where F, B and W take one step each).

    >>> s = zb_h2(stages=2, microbatches=4)
    >>> print(s.grid())
    stage 0 | F0 F1 F2 B0 W0 B1 F3 B2 W1 W2 B3 W3 .
    stage 1 | .  F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3
    >>> t = {"F": 1.0, "B": 2.0, "W": 1.0}  # ZB-H1's bubble (p-1)(tF+tB-tW) = 2, ZB-H2's (p-1)tF = 1
    >>> [s.bubble(lambda it: t[it.kind]) * 4 * 4 for s in (zb_h1(2, 4), s)], s.peak_in_flight()
    ([2.0, 1.0], [3, 3])
    """
    p, m = _check(stages, microbatches)
    cap = 2 * p - 1
    done: dict[tuple[int, str, int], int] = {}
    free, made = [0] * p, [{"F": 0, "B": 0, "W": 0} for _ in range(p)]
    orders: list[list[tuple[str, int, int]]] = [[] for _ in range(p)]
    for _ in range(3 * p * m):  # one item per turn: the stage that can start soonest, then B > F > W
        best: tuple[int, int, int, str] | None = None
        for s in range(p):
            n = made[s]
            ready = []
            if n["B"] < n["F"]:
                arrived = done.get((s, "F", n["B"]) if s == p - 1 else (s + 1, "B", n["B"]))
                if arrived is not None:
                    ready.append((max(free[s], arrived), 0, "B"))
            if n["F"] < m and n["F"] - n["W"] < cap:
                arrived = 0 if s == 0 else done.get((s - 1, "F", n["F"]))
                if arrived is not None:
                    ready.append((max(free[s], arrived), 1, "F"))
            if n["W"] < n["B"]:
                ready.append((free[s], 2, "W"))
            if ready:
                start, rank, kind = min(ready)
                if best is None or (start, rank) < best[:2]:
                    best = (start, rank, s, kind)
        assert best is not None
        start, _, s, kind = best
        j = made[s][kind]
        made[s][kind] += 1
        done[(s, kind, j)] = free[s] = start + 1
        orders[s].append((kind, j, 0))
    return _schedule("zb-h2", p, m, 1, orders)


#: Every schedule by name; ``interleaved`` also takes the chunks per stage, so :func:`make` calls it apart.
SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved,
    "zb-h1": zb_h1,
    "zb-h2": zb_h2,
}


@functools.lru_cache(maxsize=512)  # a schedule is immutable: the clock, the memory and the bounds share it
def make(name: str, stages: int, microbatches: int, chunks: int = 1) -> Schedule:
    """The schedule called ``name`` (one of :data:`SCHEDULES`), built once per shape."""
    if name not in SCHEDULES:
        raise ShardingError(f"unknown pipeline schedule {name!r}; choose one of {list(SCHEDULES)}")
    if name == "interleaved":
        return interleaved(stages, microbatches, chunks)
    if chunks != 1:
        raise ShardingError(f"the {name} schedule runs one chunk per stage; chunks={chunks} needs 'interleaved'")
    return SCHEDULES[name](stages, microbatches)


# -- the clock ----------------------------------------------------------------------------------
def _check(stages: int, microbatches: int) -> tuple[int, int]:
    if stages < 1 or microbatches < 1:
        raise ShardingError(f"a pipeline needs stages >= 1 and microbatches >= 1, got {stages} and {microbatches}")
    return stages, microbatches


def _schedule(name: str, p: int, m: int, v: int, orders: Sequence[Sequence[tuple[str, int, int]]]) -> Schedule:
    work = [[Item(0, s, kind, j, c) for kind, j, c in order] for s, order in enumerate(orders)]
    timed = _clock(work, p * v, lambda it: 1.0)
    items = tuple(sorted(Item(int(t.start), t.item.stage, t.item.kind, t.item.microbatch, t.item.chunk) for t in timed))
    return Schedule(name, p, m, v, items)


def _clock(orders: Sequence[Sequence[Item]], virtual: int, duration: Callable[[Item], float]) -> list[Timed]:
    """Start every item once its stage is free and what it needs is done (in each stage's order)."""
    p = len(orders)
    done: dict[Key, float] = {}
    free = [0.0] * p
    nxt = [0] * p
    timed: list[Timed] = []
    total = sum(len(o) for o in orders)
    while len(timed) < total:
        progressed = False
        for s in range(p):
            while nxt[s] < len(orders[s]):
                it = orders[s][nxt[s]]
                need = needs(it, p, virtual)
                if need is not None and need not in done:
                    break
                start = max(free[s], done[need] if need is not None else 0.0)
                end = start + duration(it)
                done[it.key] = end
                free[s] = end
                timed.append(Timed(it, start, end))
                nxt[s] += 1
                progressed = True
        if not progressed:
            stuck = [orders[s][nxt[s]] for s in range(p) if nxt[s] < len(orders[s])]
            raise ShardingError(f"pipeline schedule deadlocks: every stage waits ({stuck})")
    return timed


def needs(it: Item, p: int, virtual: int) -> Key | None:
    """The item ``it`` waits for: the previous stage's F, or the next stage's B (a stage's first
    backward, of the last chunk, waits for its own forward); a W, its own B.

    >>> needs(Item(0, 1, "F", 0), 2, 2), needs(Item(0, 1, "B", 0), 2, 2), needs(Item(0, 1, "W", 0), 2, 2)
    ((0, 'F', 0, 0), (1, 'F', 0, 0), (1, 'B', 0, 0))
    """
    if it.kind == "W":
        return (it.stage, "B", it.microbatch, it.chunk)
    k = it.chunk * p + it.stage
    if it.kind == "F":
        if k == 0:
            return None
        k -= 1
    else:
        if k == virtual - 1:
            return (it.stage, "F", it.microbatch, it.chunk)
        k += 1
    return (k % p, it.kind, it.microbatch, k // p)
