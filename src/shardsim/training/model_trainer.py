"""Training a transformer under a :class:`~shardsim.plans.Plan`: ``run_model``, then the optimizer step.

:meth:`Trainer.for_model <shardsim.training.Trainer.for_model>` builds a :class:`ModelTrainer`.
Its :meth:`~ModelTrainer.step` runs :func:`~shardsim.transformer.run_model` (forward, loss,
backward, the gradients reduced over the data axis as the plan's ZeRO stage says) on the
trainer's own weights, then the optimizer update of :func:`~shardsim.training.trainer.update_weight`,
the one the MLP :class:`~shardsim.training.Trainer` runs. Where the optimizer state lives:

========  ==========================  ===========================  ==============================
ZeRO      weights                     gradients after backward     optimizer state; update
========  ==========================  ===========================  ==============================
0         replicated over data        AllReduced, whole            whole; in place
1         replicated over data        AllReduced, whole            split over data; each chip
                                                                   updates its slice, AllGather
2         replicated over data        ReduceScattered, split       split; as ZeRO-1
3         split over data (FSDP)      ReduceScattered, split       split; in place
========  ==========================  ===========================  ==============================

"Split over data" is the weight's ``D`` dimension (its only one for a vector), as ZeRO-3
splits it. Under mixed precision the optimizer updates float32 master weights and the 16-bit
weights are their rounded copy. The weights live on their pipeline stage only under ``pp > 1``,
and so do their master copy and moments. A step is all or nothing, as the MLP trainer's.

>>> import numpy as np, shardsim
>>> from shardsim.models import get, reference
>>> from shardsim.plans import Plan
>>> from shardsim.training import Trainer
>>> cfg = get("llama-tiny")
>>> plan = Plan(dp=2, zero=1)
>>> t = Trainer.for_model(cfg, plan, plan.mesh(), reference.init(cfg, dtype="float64"), "sgd")
>>> tok = np.arange(32).reshape(4, 8) % cfg.vocab
>>> r = t.step(tok, (tok + 1) % cfg.vocab)
>>> sorted({op for op, _ in r.trace.collectives("optimizer")})
['all_gather']
>>> r.layouts["opt_layers.0.attn.wq"], r.layouts["layers.0.attn.wq"]
('[D_{data}, NH]', '[D, NH]')
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..array import ShardedArray
from ..collectives import all_gather, reduce_dtype
from ..errors import PlanError
from ..layout import Layout
from ..mesh import Mesh
from ..models import TransformerConfig
from ..models.inputs import check_params
from ..tracing import phase, trace
from .optim import Optimizer
from .precision import Precision
from .scaling import ScaleState
from .trainer import (
    MODEL_STATE,
    Checkpointed,
    StepResult,
    _in_c_order,
    _optimizer,
    _owned,
    _roll_back,
    _spec_of,
    _Undo,
    _zeros_like,
    update_weight,
)

if TYPE_CHECKING:
    from ..plans import Plan


class ModelTrainer(Checkpointed):
    """A transformer's sharded weights and optimizer state under a plan, trained step by step.

    Build it with :meth:`Trainer.for_model <shardsim.training.Trainer.for_model>`; see the
    module docstring. ``params`` have the keys of :func:`shardsim.models.reference.init`
    (NumPy arrays, or :class:`~shardsim.ShapeDtype` for a shape-only run at real sizes).
    ``precision`` is a :class:`Precision` or a name (``fp32``, ``fp64``, ``bf16``), by
    default the plan's, else the params' own dtype; ``reduce_dtype`` the dtype gradients
    are summed over the data axis in. ``dropout_seed`` (a non-negative integer) turns on the
    config's dropout with the reference's masks, fresh every step: step ``n`` draws them from
    :func:`step_dropout_seed(dropout_seed, n) <step_dropout_seed>`, so a restored trainer draws
    the masks the original would have. :meth:`state` and :meth:`restore` checkpoint it as the MLP
    trainer's do (``{"params": {key: ...}, "master": ..., "moments": {slot: ...}, "step": ...}``).

    >>> import shardsim
    >>> from shardsim.models import get
    >>> from shardsim.plans import Plan
    >>> cfg = get("gpt-tiny")
    >>> shapes = {k: shardsim.ShapeDtype(s) for k, s in cfg.param_shapes().items()}
    >>> t = shardsim.training.Trainer.for_model(cfg, Plan(dp=2, zero=3), Plan(dp=2).mesh(), shapes, precision="bf16")
    >>> t.master_dtype.name, t.params["embed"].layout
    ('float32', Layout('[V, D_{data}]'))
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        plan: Plan,
        mesh: Mesh,
        params: Mapping[str, Any],
        optimizer: Optimizer | str | None = None,
        *,
        precision: str | Precision | None = None,
        reduce_dtype: Any = None,
        dropout_seed: int | None = None,
    ) -> None:
        from ..transformer import checks
        from ..transformer.roles import Roles
        from ..transformer.run import place_weights

        plan = checks.check_arguments(cfg, plan, mesh, who="Trainer.for_model")
        checks.check_plan(plan, mesh)
        check_params(cfg, params)
        checks.check_model(cfg, plan.replace(sp=False, cp=1), cfg.seq)  # the widths; each step checks its sequence
        if plan.pp > 1:
            checks.check_pipeline(cfg, plan, plan.dp * plan.ep * plan.microbatches)
        self.cfg, self.plan, self.mesh = cfg, plan, mesh
        self.optimizer: Optimizer = _optimizer(optimizer)
        if precision is None:
            precision = plan.precision or Precision(np.dtype(next(iter(params.values())).dtype))
        self.precision = Precision.of(precision, reduce=reduce_dtype)
        if self.precision.checks_overflow:
            raise PlanError(
                f"precision {self.precision}: the transformer's step has no loss scaling yet, which float16 "
                "needs; use precision='bf16' (no loss scale) or the MLP Trainer"
            )
        self.dropout_seed = checks.check_dropout_seed(dropout_seed)
        self.roles = roles = Roles.of(plan, cfg.n_kv)
        self.data_axis = roles.data
        split = plan.zero >= 1 and roles.data is not None  # ZeRO-1/2/3: the state split over data
        self.state_layouts = {
            k: "[" + ", ".join(roles.weight_dims(k, sharded=split)) + "]" for k in cfg.param_shapes()
        }
        self.gathers = split and plan.zero < 3  # ZeRO-1/2: the updated slices are AllGathered
        prec = self.precision
        self.params = _own_all(place_weights(cfg, plan, mesh, params, prec.compute))

        def state(values: Mapping[str, Any], dtype: np.dtype) -> dict[str, ShardedArray]:
            layout = self.state_layouts.__getitem__
            return _own_all(place_weights(cfg, plan, mesh, values, dtype, layout=layout, category="optimizer"))

        self.master: dict[str, ShardedArray] = state(params, prec.state_dtype) if prec.mixed else {}
        zeros = {k: _zeros_like(v) for k, v in params.items()}
        self.moments: dict[str, dict[str, ShardedArray]] = {k: {} for k in params}
        for slot in self.optimizer.slots:
            for k, v in state(zeros, prec.moment_dtype).items():
                self.moments[k][slot] = v.named(f"{slot}.{k}")
        del zeros
        self.step_count = 0
        self.scale = ScaleState(1.0)  # no loss scaling: the checkpoint's counters are the MLP trainer's

    @property
    def master_dtype(self) -> np.dtype:
        """The dtype the optimizer updates (float32 master weights in mixed precision)."""
        return self.precision.state_dtype

    # -- the step ---------------------------------------------------------------------------
    def step(self, tokens: Any, targets: Any) -> StepResult:
        """One training step on ``[B, S]`` token ids and next-token ``targets``; all or nothing
        (as the MLP trainer's: a step that raises leaves the state and the ledger as they were,
        even while the caller holds the exception).

        ``loss`` is the mean cross-entropy before the update (None shape-only); ``memory`` each
        chip's peak bytes by category over the whole step, ``model_state`` the live
        ``params``, ``grads`` and ``optimizer`` bytes between the backward pass and the update.
        """
        undo: list[_Undo] = []
        try:
            return self._step(tokens, targets, undo)
        except BaseException as e:
            # Release what the aborted step made (the traceback's frames below this one hold
            # it, the gradients the update did not reach among it), then undo.
            if e.__traceback__ is not None and e.__traceback__.tb_next is not None:
                traceback.clear_frames(e.__traceback__.tb_next)
            _roll_back(self.mesh, undo)
            raise

    def _step(self, tokens: Any, targets: Any, undo: list[_Undo]) -> StepResult:
        from ..transformer.run import run_model

        ledger = self.mesh.memory
        ledger.reset_peak()
        seed = None if self.dropout_seed is None else step_dropout_seed(self.dropout_seed, self.step_count + 1)
        with trace() as t, self._reductions():
            result = run_model(
                self.cfg, self.plan.replace(precision=None), self.mesh, self.params, tokens, targets,
                dropout_seed=seed,
            )  # fmt: skip
            model_state = {c: ledger.live(c) for c in MODEL_STATE}
            stored = sum(result.stored, np.zeros(self.mesh.shape, np.int64))
            grads, loss = result.sharded_grads, result.loss
            grad_layouts = {k: str(v.layout) for k, v in grads.items()}
            del result
            with phase("optimizer"):
                self._update(grads, undo)
        # the commit: nothing below can fail
        self.step_count += 1
        names = self.mesh.axis_names
        layouts = {
            **{k: str(v.layout) for k, v in self.params.items()},
            **{f"d{k}": v for k, v in grad_layouts.items()},
            **{f"opt_{k}": str(Layout.parse(v, names)) for k, v in self.state_layouts.items()},
        }
        return StepResult(
            scheme=str(self.plan),
            mesh=self.mesh,
            step=self.step_count,
            loss=loss,
            trace=t,
            memory=ledger.snapshot()["peak"],
            model_state=model_state,
            stored_activations=stored,
            layouts=layouts,
            axes=dict(self.plan.axes()),
        )

    def _reductions(self) -> contextlib.AbstractContextManager[Any]:
        """Gradients summed over the data axis in ``precision.reduce`` (e.g. float32 under bf16)."""
        prec = self.precision
        if prec.reduce == prec.compute or self.data_axis is None:
            return contextlib.nullcontext()
        return reduce_dtype(prec.reduce, self.data_axis)

    def _update(self, grads: dict[str, ShardedArray], undo: list[_Undo]) -> None:
        """Every weight's optimizer step (empties ``grads``); ZeRO-1/2 AllGather the new weights."""
        if self.gathers:  # the AllGathers after the first update can fail: keep what undoes it
            undo.extend(self._undo_entries())
        step = self.step_count + 1
        for k in list(grads):
            new = update_weight(
                self.optimizer, step, self.params[k], self.master.get(k), grads.pop(k), self.moments[k],
                self.state_layouts[k], gathered=self.gathers, sent="temporaries",
            )  # fmt: skip
            if new is not None:
                assert self.data_axis is not None
                self.params[k] = None  # type: ignore[assignment]  # the gather below refills it
                self.params[k] = _in_c_order(all_gather(new, self.data_axis, label=k, category="params"))
                del new

    def _undo_entries(self) -> list[_Undo]:
        """A copy of each value the update changes in place (masters, moments); for the weights the
        AllGather replaces, their untouched blocks."""
        entries = []
        for k, w in self.params.items():
            data = None if w.is_shape_only else w.compact()
            entries.append(_Undo(self.params, k, None, _spec_of(w), w.uid, data))
        for holder in (self.master, *self.moments.values()):
            for k, v in holder.items():
                copy = None if v.is_shape_only else v.compact().copy()
                entries.append(_Undo(holder, k, v, None, v.uid, copy))
        return entries

    # -- reading the state -----------------------------------------------------------------
    @property
    def _name(self) -> str:
        return f"transformer ({self.plan})"

    def _state_slots(self) -> list[tuple[tuple[str, ...], dict[str, Any], str]]:
        """Where each value of :meth:`state` lives: its path, the dict holding it, and its key there."""
        slots: list[tuple[tuple[str, ...], dict[str, Any], str]] = []
        for k in self.params:
            slots.append((("params", k), self.params, k))
            if self.precision.mixed:
                slots.append((("master", k), self.master, k))
            for slot in self.optimizer.slots:
                slots.append((("moments", slot, k), self.moments[k], slot))
        return slots

    def params_global(self) -> dict[str, np.ndarray]:
        """The optimizer's weights as global arrays (the float32 masters in mixed precision)."""
        held = self.master if self.precision.mixed else self.params
        return {k: np.array(v.to_global()) for k, v in held.items()}

    def moments_global(self) -> dict[str, dict[str, np.ndarray]]:
        """The optimizer's moments as global arrays: ``{"m": {"embed": ...}, ...}``."""
        return {s: {k: np.array(m[s].to_global()) for k, m in self.moments.items()} for s in self.optimizer.slots}


def _own_all(placed: dict[str, ShardedArray]) -> dict[str, ShardedArray]:
    """Copies the optimizer may update in place (placed values are views of the caller's arrays)."""
    out = {}
    for k in list(placed):
        v = placed.pop(k)
        out[k] = v.named(k) if v.is_shape_only else _owned(v, k, v.category)  # shape-only: nothing shared
        del v
    return out


def step_dropout_seed(seed: int, step: int) -> int:
    """The dropout seed of training step ``step`` (1, 2, ...) of a run seeded ``seed``.

    The first 32-bit word of ``numpy.random.SeedSequence([seed, step])``: every step draws
    fresh masks, and they are a function of the two numbers alone, so a trainer restored from
    a checkpoint (its step count with it) draws the masks the original would have drawn. Step
    ``n`` of :meth:`ModelTrainer.step` runs :func:`~shardsim.transformer.run_model` with
    ``dropout_seed=step_dropout_seed(seed, n)``, as the reference's
    :func:`~shardsim.models.reference.dropout_mask` would with that seed.

    >>> step_dropout_seed(0, 1), step_dropout_seed(0, 2)
    (3964924996, 3141116543)
    """
    from ..transformer.checks import check_dropout_seed

    check_dropout_seed(seed)
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or step < 0:
        raise PlanError(f"step must be a non-negative integer (1 for the first step), got {step!r}")
    return int(np.random.SeedSequence([int(seed), int(step)]).generate_state(1)[0])
