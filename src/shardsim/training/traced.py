"""One shape-only training step of a transformer under a plan, traced once and kept.

:func:`trained_step` runs a :class:`~shardsim.training.Trainer` step on shape-only weights and
tokens and keeps what it measured, keyed by everything the step depends on: the memory of a
model's step (:func:`~shardsim.training.model_memory`), the cost model
(:mod:`shardsim.cost.builder`) and the planner's traced layers all read this one cache, so a
step traced once is never traced again.

>>> clear_steps(); steps_held()
0
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..memory import per_chip
from ..mesh import Mesh
from ..models import TransformerConfig
from ..plans import Plan
from ..tracing import Event
from .precision import Precision


@dataclass(frozen=True)
class TrainedStep:
    """What one shape-only training step of a transformer measured: its events (empty when
    they were not asked for), each category's per-chip peak bytes, the model state between
    the backward pass and the update, the most bytes a chip keeps for the backward pass, and
    the mesh it ran on; ``by_stage`` the first two figures of each pipeline stage's busiest
    chips (one entry without a pipeline)."""

    events: tuple[Event, ...]
    memory: dict[str, int]
    model_state: dict[str, int]
    stored: int
    mesh: Mesh
    has_events: bool
    by_stage: tuple[tuple[dict[str, int], dict[str, int]], ...] = ()


#: How many training steps :func:`trained_step` keeps (the least recently read goes first).
STEPS_KEPT = 256
_steps: OrderedDict[tuple[Any, ...], TrainedStep] = OrderedDict()


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
    step = _trace_step(cfg, plan, mesh, tokens, optimizer, precision, events)
    _steps[key] = step
    while len(_steps) > STEPS_KEPT:
        _steps.popitem(last=False)
    return step


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
    params = {k: ShapeDtype(s, precision.compute) for k, s in cfg.param_shapes().items()}
    tok = ShapeDtype(tuple(tokens), "int32")
    trainer = Trainer(cfg, plan, fresh, params, optimizer, precision=precision)
    res = trainer.step(tok, tok)
    recorded = tuple(res.trace.events) if events else ()
    stored = int(res.stored_activations.max())
    shape = Mesh(dict(zip(trainer.mesh.axis_names, trainer.mesh.shape)))
    stages = _by_stage(res.memory, res.model_state, list(shape.axis_names), plan.pipe_axis if plan.pp > 1 else None)
    return TrainedStep(recorded, per_chip(res.memory), per_chip(res.model_state), stored, shape, events, stages)


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


__all__ = ["STEPS_KEPT", "TrainedStep", "clear_steps", "steps_held", "trained_step"]
