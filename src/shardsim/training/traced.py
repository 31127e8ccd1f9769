"""One shape-only training step of a transformer under a plan, traced once and kept.

:func:`trained_step` runs a :class:`~shardsim.training.Trainer` step on shape-only weights and
tokens and keeps what it measured, keyed by everything the step depends on: the memory of a
model's step (:func:`~shardsim.training.model_memory`), the cost model
(:mod:`shardsim.cost.builder`) and the planner's traced layers all read this one cache, so a
step traced once is never traced again. A step of the same program at a third batch (another
microbatch size of the same layer sharding, the planner asks up to seven) is not traced at
all once two are: every size in it is affine in the batch, so its events, peaks, model state
and stored activations are read off the line through the two (exact, else traced;
:func:`_on_line`).

>>> clear_steps(); steps_held()
0
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..journal import FrozenJournal, Journal, peaks_on_line, sizes_on_line
from ..memory import per_chip
from ..mesh import Mesh
from ..models import TransformerConfig
from ..plans import Plan
from ..tracing import Event
from .event_line import on_line
from .precision import Precision


@dataclass(frozen=True)
class TrainedStep:
    """What one shape-only training step of a transformer measured: its events (empty when
    they were not asked for), each category's per-chip peak bytes, the model state between
    the backward pass and the update, the most bytes a chip keeps for the backward pass, and
    the mesh it ran on; ``by_stage`` the first two figures of each pipeline stage's busiest
    chips (one entry without a pipeline); ``from_line`` whether it was read off the line
    through two steps of the same program at other batches rather than traced."""

    events: tuple[Event, ...]
    memory: dict[str, int]
    model_state: dict[str, int]
    stored: int
    mesh: Mesh
    has_events: bool
    by_stage: tuple[tuple[dict[str, int], dict[str, int]], ...] = ()
    line: _Anchor | None = field(default=None, repr=False, compare=False)  # a traced step's, see _on_line
    from_line: bool = False  # read off the line through two traced steps (_on_line), not traced


@dataclass(frozen=True, eq=False)
class _Anchor:
    """What a traced step gives the line through it: its ledger's journal, and each chip's
    model state and stored activations (the figures :class:`TrainedStep` keeps of the busiest
    chip only)."""

    journal: FrozenJournal
    state: dict[str, np.ndarray]
    stored: np.ndarray


#: How many training steps :func:`trained_step` keeps (the least recently read goes first).
STEPS_KEPT = 256
_steps: OrderedDict[tuple[Any, ...], TrainedStep] = OrderedDict()
_anchors: dict[tuple[Any, ...], list[int]] = {}  # the batches traced of each program (see _on_line)
_count = {"traced": 0}


def trained_step(
    cfg: TransformerConfig,
    plan: Plan,
    mesh: Mesh,
    tokens: tuple[int, int],
    optimizer: str,
    precision: Precision,
    *,
    events: bool = True,
) -> TrainedStep:
    """One shape-only step of :class:`~shardsim.training.Trainer` on a fresh
    copy of ``mesh``, the weights in ``precision``'s compute dtype and ``tokens`` (sequences,
    seq) as both input and target; cached by all of them, so every caller (the memory of a
    model's step, the planner's layers) shares each step traced. ``events=False`` keeps only
    the figures (a deep pipeline's step holds a great many events).

    >>> from shardsim.models import get
    >>> cfg, plan = get("gpt-tiny").scaled(layers=1), Plan(dp=2)
    >>> a = trained_step(cfg, plan, plan.mesh(), (2, 16), "adam", Precision.of("bf16"))
    >>> a is trained_step(cfg, plan, plan.mesh(), (2, 16), "adam", Precision.of("bf16")), a.stored > 0
    (True, True)
    """
    key = (cfg, plan, tuple(mesh.axis_names), tuple(mesh.shape), tuple(tokens), optimizer, precision)
    try:
        hit = _steps.get(key)
    except TypeError:  # an argument that cannot be a key: trace it, uncached
        return _trace_step(cfg, plan, mesh, tokens, optimizer, precision, events)
    if hit is not None and (hit.has_events or not events):
        _steps.move_to_end(key)
        return hit
    line = (cfg, plan, key[2], key[3], tokens[1], optimizer, precision)  # the step at any batch
    step = _on_line(line, tokens[0], events)
    if step is None:
        step = _trace_step(cfg, plan, mesh, tokens, optimizer, precision, events)
        _count["traced"] += 1
        traced = _anchors.setdefault(line, [])
        if step.line is not None and tokens[0] not in traced:
            traced.append(tokens[0])
    _steps[key] = step
    while len(_steps) > STEPS_KEPT:
        _steps.popitem(last=False)
    return step


def _on_line(line: tuple[Any, ...], sequences: int, events: bool) -> TrainedStep | None:
    """The step at ``sequences`` from two traced at other batches of the same program, or None.

    A shape-only step is the same program at every batch, only its sizes change, each
    affinely: its events are read off the line through two traced steps'
    (:func:`~shardsim.training.event_line.on_line`), its peaks replayed from their ledgers'
    journals (:func:`~shardsim.journal.peaks_on_line`), its model state and stored
    activations carried on the line chip by chip. Where any of these is not exact (the
    programs differ, a size falls between whole numbers) it is None and the step is traced.
    """
    cfg, plan, names, shape, seq, optimizer, precision = line
    traced = []
    for b in _anchors.get(line, []):
        s = _steps.get((cfg, plan, names, shape, (b, seq), optimizer, precision))
        if s is not None and s.line is not None and (s.has_events or not events):
            traced.append((b, s))
    if len(traced) < 2:
        return None
    (b1, one), (b2, two) = traced[:2]
    assert one.line is not None and two.line is not None
    recorded: tuple[Event, ...] = ()
    if events:
        got = on_line((b1, one.events), (b2, two.events), sequences)
        if got is None:
            return None
        recorded = tuple(got)
    peaks = peaks_on_line((b1, one.line.journal), (b2, two.line.journal), sequences, shape)
    if peaks is None or set(one.line.state) != set(two.line.state):
        return None
    state = {c: sizes_on_line((b1, one.line.state[c]), (b2, two.line.state[c]), sequences) for c in one.line.state}
    stored = sizes_on_line((b1, one.line.stored), (b2, two.line.stored), sequences)
    if stored is None or any(v is None for v in state.values()):
        return None
    held = {c: v for c, v in state.items() if v is not None}
    stages = _by_stage(peaks, held, list(names), plan.pipe_axis if plan.pp > 1 else None)
    return TrainedStep(
        recorded, per_chip(peaks), per_chip(held), int(stored.max()), one.mesh, events, stages, from_line=True
    )


def steps_traced() -> int:
    """How many steps :func:`trained_step` has traced in this process (those read off a line
    through two, or found in the cache, not counted).

    >>> from shardsim.models import get
    >>> clear_steps()
    >>> cfg, plan, before = get("gpt-tiny").scaled(layers=1), Plan(dp=2), steps_traced()
    >>> for b in (2, 4, 6):
    ...     _ = trained_step(cfg, plan, plan.mesh(), (b, 16), "adam", Precision.of("bf16"))
    >>> steps_traced() - before  # the third batch is read off the line through the first two
    2
    """
    return _count["traced"]


def steps_held() -> int:
    """How many training steps :func:`trained_step` holds now.

    >>> clear_steps(); steps_held()
    0
    """
    return len(_steps)


def clear_steps() -> None:
    """Forget every training step :func:`trained_step` holds.

    >>> clear_steps()
    """
    _steps.clear()
    _anchors.clear()


def _trace_step(
    cfg: TransformerConfig,
    plan: Plan,
    mesh: Mesh,
    tokens: tuple[int, int],
    optimizer: str,
    precision: Precision,
    events: bool,
) -> TrainedStep:
    from ..array import ShapeDtype
    from .trainer import Trainer  # the trainer reads the package this module is in

    fresh = Mesh(dict(zip(mesh.axis_names, mesh.shape)))
    fresh.memory.journal = Journal()  # for the line through this step (_on_line)
    params = {k: ShapeDtype(s, precision.compute) for k, s in cfg.param_shapes().items()}
    tok = ShapeDtype(tuple(tokens), "int32")
    trainer = Trainer(cfg, plan, fresh, params, optimizer, precision=precision)
    res = trainer.step(tok, tok)
    journal = fresh.memory.journal  # None after a program too long to keep one of
    recorded = tuple(res.trace.events) if events else ()
    stored = int(res.stored_activations.max())
    shape = Mesh(dict(zip(trainer.mesh.axis_names, trainer.mesh.shape)))
    stages = _by_stage(res.memory, res.model_state, list(shape.axis_names), plan.pipe_axis if plan.pp > 1 else None)
    same = trainer.mesh.memory is fresh.memory and (shape.axis_names, shape.shape) == (mesh.axis_names, mesh.shape)
    anchor = _Anchor(journal.freeze(), dict(res.model_state), res.stored_activations) if same and journal else None
    return TrainedStep(recorded, per_chip(res.memory), per_chip(res.model_state), stored, shape, events, stages, anchor)


def _by_stage(
    memory: dict[str, Any], state: dict[str, Any], axes: list[str], pipe: str | None
) -> tuple[tuple[dict[str, int], dict[str, int]], ...]:
    """Each pipeline stage's busiest chips' peaks and model state (the whole mesh's without a pipeline)."""
    if pipe is None or pipe not in axes:
        return ((per_chip(memory), per_chip(state)),)
    at = axes.index(pipe)
    stages = next(iter(memory.values())).shape[at]

    def stage(figures: dict[str, Any], s: int) -> dict[str, int]:
        return per_chip({c: np.take(v, s, axis=at) for c, v in figures.items()})

    return tuple((stage(memory, s), stage(state, s)) for s in range(stages))


__all__ = ["STEPS_KEPT", "TrainedStep", "clear_steps", "steps_held", "steps_traced", "trained_step"]
