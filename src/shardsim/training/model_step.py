"""The step program of a transformer: :func:`~shardsim.transformer.run_model`, then the optimizer update.

A step runs :func:`~shardsim.transformer.run_model` (forward, loss, backward, the gradients
reduced over the data axis as the plan's ZeRO stage says) on the trainer's own weights, then
:func:`~shardsim.training.update.update_weight` for every weight, the update the MLP's step
runs; under ZeRO-1/2 the updated slices are AllGathered back. With ``dropout_seed`` step ``n``
draws its dropout masks from :func:`step_dropout_seed(dropout_seed, n) <step_dropout_seed>`.

>>> import numpy as np
>>> from shardsim.models import get, reference
>>> from shardsim.plans import Plan
>>> from shardsim.training import Trainer
>>> cfg = get("gpt-tiny")
>>> t = Trainer(cfg, "dp=2,zero=2", Plan(dp=2).mesh(), reference.init(cfg), "sgd")
>>> tok = np.arange(16).reshape(2, 8)
>>> type(t.program).__name__, t.program(t, tok, tok + 1, []).step
('ModelStep', 1)
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np

from ..array import ShardedArray
from ..collectives import all_gather, reduce_dtype
from ..errors import PlanError
from ..layout import Layout
from ..tracing import phase, trace
from .result import MODEL_STATE, StepResult
from .state import in_c_order
from .update import Undo, undo_entries, update_weight

if TYPE_CHECKING:
    from .held import TrainerState


class ModelStep:
    """One training step of a transformer :class:`~shardsim.training.Trainer` under its plan.

    Called with the trainer, ``[B, S]`` token ids, next-token ``targets`` and the list the step
    puts its :class:`~shardsim.training.update.Undo` entries in; updates the trainer's state and
    returns the :class:`StepResult` (``loss``: the mean cross-entropy before the update).

    >>> import shardsim
    >>> from shardsim.models import get
    >>> from shardsim.plans import Plan
    >>> from shardsim.training import Trainer
    >>> cfg = get("gpt-tiny")
    >>> shapes = {k: shardsim.ShapeDtype(s) for k, s in cfg.param_shapes().items()}
    >>> t = Trainer(cfg, Plan(tp=2), Plan(tp=2).mesh(), shapes)
    >>> tok = shardsim.ShapeDtype((2, 8), "int32")
    >>> r = ModelStep()(t, tok, tok, [])
    >>> r.loss is None, r.scheme
    (True, 'tp=2')
    """

    def check(self, t: TrainerState, tokens: Any, targets: Any) -> None:
        """Nothing before the step: :func:`~shardsim.transformer.run_model` checks the tokens itself."""

    def __call__(self, t: TrainerState, tokens: Any, targets: Any, undo: list[Undo]) -> StepResult:
        from ..transformer.run import run_model

        plan = t.plan
        assert plan is not None  # a transformer's trainer always has its plan
        ledger = t.mesh.memory
        ledger.reset_peak()
        seed = None if t.dropout_seed is None else step_dropout_seed(t.dropout_seed, t.step_count + 1)
        with trace() as tr, gradient_reductions(t):
            result = run_model(
                t.cfg, plan.replace(precision=None), t.mesh, t.params, tokens, targets, dropout_seed=seed
            )
            model_state = {c: ledger.live(c) for c in MODEL_STATE}
            stored = sum(result.stored, np.zeros(t.mesh.shape, np.int64))
            grads, loss = result.sharded_grads, result.loss
            grad_layouts = {k: str(v.layout) for k, v in grads.items()}
            del result
            with phase("optimizer"):
                self._update(t, grads, undo)
        # the commit: nothing below can fail
        t.step_count += 1
        names = t.mesh.axis_names
        layouts = {
            **{k: str(v.layout) for k, v in t.params.items()},
            **{f"d{k}": v for k, v in grad_layouts.items()},
            **{f"opt_{k}": str(Layout.parse(v, names)) for k, v in t.state_layouts.items()},
        }
        return StepResult(
            scheme=str(plan),
            mesh=t.mesh,
            step=t.step_count,
            loss=loss,
            trace=tr,
            memory=ledger.snapshot()["peak"],
            model_state=model_state,
            stored_activations=stored,
            layouts=layouts,
            axes=dict(plan.axes()),
        )

    def _update(self, t: TrainerState, grads: dict[str, ShardedArray], undo: list[Undo]) -> None:
        """Every weight's optimizer step (empties ``grads``); ZeRO-1/2 AllGather the new weights."""
        if t.gathers:  # the AllGathers after the first update can fail: keep what undoes it
            undo.extend(undo_entries(t.state_slots()))
        step = t.step_count + 1
        for k in list(grads):
            new = update_weight(
                t.optimizer, step, t.params[k], t.master.get(k), grads.pop(k), t.moments[k],
                t.state_layouts[k], gathered=t.gathers, sent="temporaries",
            )  # fmt: skip
            if new is not None:
                assert t.data_axis is not None
                t.params[k] = None  # the gather below refills it
                t.params[k] = in_c_order(all_gather(new, t.data_axis, label=k, category="params"))
                del new


def gradient_reductions(t: TrainerState) -> contextlib.AbstractContextManager[Any]:
    """Gradients summed over the data axis in ``precision.reduce`` (e.g. float32 under bf16).

    >>> from types import SimpleNamespace
    >>> from shardsim.training import Precision
    >>> type(gradient_reductions(SimpleNamespace(precision=Precision.of("bf16"), data_axis="data"))).__name__
    'nullcontext'
    """
    prec = t.precision
    if prec.reduce == prec.compute or t.data_axis is None:
        return contextlib.nullcontext()
    return reduce_dtype(prec.reduce, t.data_axis)


def step_dropout_seed(seed: int, step: int) -> int:
    """The dropout seed of training step ``step`` (1, 2, ...) of a run seeded ``seed``.

    The first 32-bit word of ``numpy.random.SeedSequence([seed, step])``: every step draws
    fresh masks, and they are a function of the two numbers alone, so a trainer restored from
    a checkpoint (its step count with it) draws the masks the original would have drawn. Step
    ``n`` of a transformer's :meth:`Trainer.step <shardsim.training.Trainer.step>` runs
    :func:`~shardsim.transformer.run_model` with ``dropout_seed=step_dropout_seed(seed, n)``,
    as the reference's :func:`~shardsim.models.reference.dropout_mask` would with that seed.

    >>> step_dropout_seed(0, 1), step_dropout_seed(0, 2)
    (3964924996, 3141116543)
    """
    from ..transformer.checks import check_dropout_seed

    check_dropout_seed(seed)
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or step < 0:
        raise PlanError(f"step must be a non-negative integer (1 for the first step), got {step!r}")
    return int(np.random.SeedSequence([int(seed), int(step)]).generate_state(1)[0])
