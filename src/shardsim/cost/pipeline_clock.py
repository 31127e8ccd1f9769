"""A pipeline's step on a clock: the schedule's items, each lasting what its traced layers take.

The layer program (:mod:`~shardsim.cost.layer_program`) times one layer's forward and backward
and the embedding's with the head's. A pipelined step is the plan's own schedule
(:mod:`shardsim.strategies.pipeline.schedule`) run on a clock whose items last what their
virtual stage's layers take, as the event time line
of the whole program runs them (the embedding and the head charged to the last virtual stage,
which holds the loss): each stage-to-stage send (traced) on the stage's link while
the stage computes its next item, only its reader waiting; each chunk's last backward reducing
its gradients over the data axis as it runs (the traced ``fused`` time), the reduction's tail
past the flush exposed. The planner and the estimate both read it, so a plan has one step
time whichever asks; :func:`item_timeline` draws the same clock as a time line, one bar per
item and stream, that the estimate's summary, bubble and bound read.

>>> from shardsim.strategies.pipeline.schedule import one_f_one_b
>>> s = one_f_one_b(stages=3, microbatches=4)
>>> clock(s, [1.0] * 3, [2.0] * 3)[0] == max(t.end for t in s.timeline(lambda it: 1.0 + (it.kind == "B")))
True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..plans import Plan
from ..strategies.pipeline.schedule import Schedule, make, needs
from ..training.stage_memory import stage_layers
from .layer_program import Layer
from .timeline import Bar, Timeline


def virtual_stage_layers(layers: int, p: int, v: int) -> list[int]:
    """Layers of each of the ``p v`` virtual stages: equal, or the first and last one short.

    >>> virtual_stage_layers(126, 16, 1)[:2], virtual_stage_layers(126, 16, 1)[-2:]
    ([7, 8], [8, 7])
    """
    per = stage_layers(layers, p * v)
    assert per is not None, (layers, p, v)
    short, last = per * p * v - layers, p * v - 1
    return [per - (1 if (k == 0 and short == 2) or (k == last and short >= 1) else 0) for k in range(p * v)]


@dataclass(frozen=True)
class Passes:
    """Seconds of each virtual stage's forward, backward, and backward with its gradient
    reduction (``fused``), and of the reduction alone (``sync``); ``layers`` per virtual stage;
    ``wgt`` the part of the backward a split backward's W pass runs (zeros otherwise)."""

    fwd: list[float]
    bwd: list[float]
    fused: list[float]
    sync: list[float]
    layers: list[int]
    wgt: list[float]


def passes(lay: Layer, layers: int, p: int, v: int) -> Passes:
    """The :class:`Passes` of a model of ``layers`` layers on ``p`` stages of ``v`` chunks, the
    embedding and the head charged to the last virtual stage (which holds the loss)."""
    per, edge = lay.per_layer, lay.edge
    counts = virtual_stage_layers(layers, p, v)
    head = [0.0] * (len(counts) - 1) + [1.0]
    return Passes(
        [n * per.fwd + h * edge.fwd for n, h in zip(counts, head)],
        [n * per.bwd + h * edge.bwd for n, h in zip(counts, head)],
        [n * per.fused + h * edge.fused for n, h in zip(counts, head)],
        [n * per.sync + h * edge.sync for n, h in zip(counts, head)],
        counts,
        [n * per.wgt + h * edge.wgt for n, h in zip(counts, head)],
    )


Slots = tuple[tuple[int, int, int, bool, bool], ...]
_COMPILED: dict[int, tuple[Schedule, Slots]] = {}


def _slots(sched: Schedule) -> Slots:
    """Each item of ``sched`` in its unit-time order: its stage, its slot in the duration
    tables (``k`` for the forward of virtual stage ``k``, ``V + k`` for its backward, ``2V + k``
    for its W pass), the index of the item it waits for (-1: none), whether its output is sent
    to another stage, and whether it is its chunk's last backward (the last W when the backward
    is split: the gradients are whole after it). Built once per schedule."""
    hit = _COMPILED.get(id(sched))
    if hit is not None and hit[0] is sched:
        return hit[1]
    p, virtual, m = sched.stages, sched.stages * sched.chunks, sched.microbatches
    index = {it.key: i for i, it in enumerate(sched.items)}
    final = "W" if sched.split else "B"
    out = []
    for it in sched.items:
        k = sched.virtual_stage(it)
        need = needs(it, p, virtual)
        sends = (it.kind == "F" and k < virtual - 1) or (it.kind == "B" and k > 0)
        slot = "FBW".index(it.kind) * virtual + k
        out.append((it.stage, slot, -1 if need is None else index[need], sends,
                    it.kind == final and it.microbatch == m - 1))  # fmt: skip
    _COMPILED[id(sched)] = (sched, tuple(out))
    return _COMPILED[id(sched)][1]


def _tables(
    sched: Schedule,
    fwd: Sequence[float],
    bwd: Sequence[float],
    wgt: Sequence[float] | None,
    reduced: Sequence[float] | None,
) -> tuple[list[float], list[float] | None]:
    """Each slot's seconds (:func:`_slots`: F, B and, when the backward is split, W, whose B is
    the backward less its W) and, given the reductions' ends from the last whole backward's
    start, each slot's from its own start (the last W's when the backward is split)."""
    v = len(fwd)
    if not sched.split:
        return [*fwd, *bwd], None if reduced is None else [0.0] * v + list(reduced)
    if wgt is None:
        raise ValueError(f"the {sched.name} schedule splits the backward: clock() needs its W seconds (wgt)")
    b = [whole - w for whole, w in zip(bwd, wgt)]
    return [*fwd, *b, *wgt], None if reduced is None else [0.0] * 2 * v + [r - x for r, x in zip(reduced, b)]


def clock(
    sched: Schedule,
    fwd: Sequence[float],
    bwd: Sequence[float],
    send: float = 0.0,
    reduced: Sequence[float] | None = None,
    starts: list[tuple[float, float]] | None = None,
    wgt: Sequence[float] | None = None,
) -> tuple[float, float, float]:
    """The span of ``sched`` when the forward and backward of virtual stage ``k`` last
    ``fwd[k]`` and ``bwd[k]``, the span with the gradient reductions, and the busiest stage's
    busy time: :meth:`~shardsim.strategies.pipeline.schedule.Schedule.timeline`'s clock in one pass,
    since the schedule's unit-time order already has every item after what it waits for.

    Each output sent to another stage takes ``send`` seconds on the stage's link, one send
    after another, and only the item that reads it waits for it; a chunk's last backward
    reduces its gradients over the data axis as it runs, ending ``reduced[k]`` seconds after
    it starts, which delays the step's end but neither the stage's next item nor the item's
    reader. ``starts``, when given, receives each item's start and its send's end (the item's
    end when it sends nothing), in the order of ``sched.items``. A schedule that splits the
    backward runs ``wgt[k]`` of ``bwd[k]`` as its W pass, and the reduction ends as long after
    the last W starts as it did after the last whole backward's B part.

    >>> from shardsim.strategies.pipeline.schedule import one_f_one_b
    >>> s = one_f_one_b(stages=3, microbatches=4)
    >>> span, _, busy = clock(s, [1.0] * 3, [2.0] * 3, send=0.5)  # the sends lengthen the span, not the work
    >>> span > clock(s, [1.0] * 3, [2.0] * 3)[0], busy == 12.0
    (True, True)
    >>> clock(s, [1.0] * 3, [2.0] * 3, reduced=[5.0] * 3)[1] - 18.0  # the last backward's reduction: 5 s from its start
    3.0
    """
    p = sched.stages
    dur, tail_of = _tables(sched, fwd, bwd, wgt, reduced)
    arrive: list[float] = []
    free = [0.0] * p
    link = [0.0] * p
    busy = [0.0] * p
    tail = 0.0
    for stage, slot, need, sends, last in _slots(sched):
        start = free[stage]
        if need >= 0 and arrive[need] > start:
            start = arrive[need]
        d = dur[slot]
        free[stage] = end = start + d
        busy[stage] += d
        if last and tail_of is not None and start + tail_of[slot] > tail:
            tail = start + tail_of[slot]
        if sends and send > 0:
            link[stage] = end = max(end, link[stage]) + send
        arrive.append(end)
        if starts is not None:
            starts.append((start, end))
    span = max(free)
    return span, max(span, tail), max(busy)


def item_timeline(plan: Plan, lay: Layer, layers: int, send: float, title: str = "") -> Timeline:
    """The clock of ``plan``'s schedule as a time line: per item, the compute stream busy for its
    layers' compute and each mesh axis's links for their collectives (the part the item waits
    for first, the rest under its compute), the stage-to-stage send after it, and each chunk's
    last backward's gradient reduction. Its ``step_s`` is :func:`clock`'s step; its stages'
    compute, exposed communication and bubble add up to it.

    >>> from shardsim.models import get
    >>> from .layer_program import LayerCache
    >>> cache = LayerCache(get("llama-tiny").scaled(layers=4, tie_embeddings=False), "h100", seq=16)
    >>> plan = Plan.parse("pp=2,microbatches=4")
    >>> tl = item_timeline(plan, cache.layer(plan, 1), 4, cache.p2p(plan, 1))
    >>> round(tl.step_s, 12) == round(tl.chips.compute_s + tl.chips.exposed_s + tl.chips.bubble_s, 12)
    True
    """
    p, m, v = plan.pp, plan.microbatches, plan.virtual_stages
    sched = make(plan.schedule, p, m, v)
    ps = passes(lay, layers, p, v)
    starts: list[tuple[float, float]] = []
    _, step, _ = clock(sched, ps.fwd, ps.bwd, send, ps.fused, starts, ps.wgt)
    durations, tails = _tables(sched, ps.fwd, ps.bwd, ps.wgt, ps.fused)
    assert tails is not None
    axes = plan.axes()
    pipe = axes["pipe"]
    reduced_over = tuple(axes[r] for r in ("data", "context") if plan.degree(r) > 1)
    bars: list[Bar] = []
    virtual = p * v
    works: dict[tuple[int, str], dict[str, float]] = {}  # a virtual stage's pass: the same every microbatch
    for (stage, slot, _, sends, last), (start, sent) in zip(_slots(sched), starts):
        k, forward = slot % virtual, slot < virtual
        side = "FBW"[slot // virtual]
        if (k, side) not in works:
            head = 1.0 if k == virtual - 1 else 0.0
            works[k, side] = {key: ps.layers[k] * lay.work[0].get(key, 0.0) + head * lay.work[1].get(key, 0.0)
                              for key in {*lay.work[0], *lay.work[1]} if key.startswith(side)}  # fmt: skip
        work = works[k, side]
        d = durations[slot]
        where = f"{pipe}{stage}"
        bars += _item_bars(len(bars), where, k, side, start, d, work)
        end = start + d
        if sends and send > 0:
            bars.append(_comm(len(bars), where, "ppermute", (pipe,), f"{side}{k} send", "forward" if forward
                              else "backward", sent - send, sent, 0.0))  # fmt: skip
        if last and reduced_over and ps.sync[k] > 0:
            done = start + tails[slot]
            bars.append(_comm(len(bars), where, "all_reduce", reduced_over, f"d chunk {k}", "backward",
                              done - ps.sync[k], done, max(0.0, min(done, end) - (done - ps.sync[k]))))  # fmt: skip
    return Timeline(bars, step, True, title)


def _item_bars(index: int, where: str, k: int, side: str, start: float, d: float, work: dict[str, float]) -> list[Bar]:
    """One item's bars: the collectives it waits for, then its compute with the rest under it."""
    phase = {"F": "forward", "B": "backward", "W": "weight"}[side]
    compute = min(d, work.get(f"{side} compute", 0.0))
    waited = d - compute
    comm = {key.split(" ", 2)[2]: s for key, s in work.items() if key.startswith(f"{side} comm ") and s > 0}
    total = sum(comm.values())
    bars: list[Bar] = []
    at = start
    for axis, seconds in comm.items():  # the wait, shared out among the axes by their seconds
        share = waited * seconds / total
        if share > 0:
            bars.append(_comm(index + len(bars), where, "collective", (axis,), f"{side}{k} {axis}", phase, at,
                              at + share, 0.0))  # fmt: skip
            at += share
        under = min(seconds - share, compute)
        if under > 0:
            bars.append(_comm(index + len(bars), where, "collective", (axis,), f"{side}{k} {axis}", phase,
                              start + waited, start + waited + under, under))  # fmt: skip
    bars.append(
        Bar(index + len(bars), f"compute {where}", "matmul", (), f"{side}{k}", phase, k, start + waited,
            start + d, 0, 0, "compute", flops_s=work.get(f"{side} flops", 0.0),
            memory_s=work.get(f"{side} memory", 0.0), where=where, untimed_s=work.get(f"{side} untimed", 0.0))
    )  # fmt: skip
    return bars


def _comm(
    index: int, where: str, op: str, axes: tuple[str, ...], label: str, phase: str, start: float, end: float,
    hidden: float,
) -> Bar:  # fmt: skip
    stream = f"comm {' '.join(axes)} {where}"
    return Bar(index, stream, op, axes, label, phase, -1, start, end, 0, 0, "bandwidth", hidden=hidden,
               where=where)  # fmt: skip


__all__ = ["Passes", "clock", "item_timeline", "passes", "stage_layers", "virtual_stage_layers"]
