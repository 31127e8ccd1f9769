"""A training step on any scheme: forward, loss, backward, gradient synchronisation, update.

The step runs the scheme's own per-layer forward and backward layer after layer (the same
steps :func:`shardsim.run_strategy` runs), then the optimizer step, and reports the loss,
the trace (phases ``forward``, ``loss``, ``backward``, ``recompute``, ``optimizer``) and every
chip's memory by category, measured by the ledger from the values' real lifetimes.

A step either happens or it does not: when :meth:`Trainer.step` raises (a failed chip, out of
memory, bad input), the weights, master weights, optimizer moments, step count and loss scale
are exactly as before the call, and a retry once the fault is gone computes the same step.

Where the optimizer state lives (``state_layouts``) decides the optimizer step:

- the weights' own layout (ddp, fsdp = zero3, tp, fsdp_tp): each chip updates what it holds,
  in place; no communication.
- slices of replicated weights (zero1, zero2): ``1.`` ReduceScatter the gradients still
  whole (zero1), ``2.`` each chip updates its slice, ``3.`` AllGather the weights back.

>>> import numpy as np, shardsim
>>> from shardsim import mlp
>>> params = mlp.init_stack(2, 8, 16)
>>> x = np.ones((4, 8), np.float32)
>>> trainer = Trainer("zero2", shardsim.Mesh(X=2), params, SGD(lr=0.1))
>>> r = trainer.step(x, np.zeros_like(x))
>>> r.trace.collectives("optimizer")
[('all_gather', ('X',)), ('all_gather', ('X',)), ('all_gather', ('X',)), ('all_gather', ('X',))]
>>> r.layouts["dw_in"], r.layouts["opt_w_in"]
('[D_X, F]', '[D_X, F]')
"""

from __future__ import annotations

import contextlib
import math
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import strategies
from ..array import ShapeDtype, ShardedArray, shard
from ..collectives import reduce_dtype
from ..errors import ShardingError
from ..layout import Layout
from ..mesh import Mesh
from ..ops import cast
from ..pieces import place, split
from ..pipeline.execute import PipelineStep
from ..resharding import local_slice
from ..strategies import zero
from ..strategies.base import Ctx, Grads, Params, Scheme
from ..strategies.pp import PipelineState
from ..strategies.runner import (
    backward_stack,
    block_ranks,
    check_residual,
    forward_stack,
    layer_of,
    reduce_gradients,
    resolve_axes,
    stack_depth,
    weight_label,
    weight_names,
)
from ..tracing import Trace, phase, trace
from . import optim
from .loss import mse, mse_terms
from .optim import SGD, Adam, Optimizer
from .precision import Precision
from .scaling import DynamicLossScale, ScaleState, found_inf

if TYPE_CHECKING:
    from .model_trainer import ModelTrainer

MODEL_STATE = ("params", "grads", "optimizer")


@dataclass
class StepResult:
    """What one training step shows.

    ``loss`` is the mean squared error before the update (None for a shape-only run).
    ``memory`` is each chip's peak bytes by category during the step, shape ``mesh.shape``,
    plus ``"total"`` — absolute, counting the weights and optimizer state that live across
    steps (unlike :class:`~shardsim.strategies.StrategyResult`, which counts above what was
    live before). ``model_state`` is each chip's live ``params``, ``grads`` and
    ``optimizer`` bytes when the backward pass has finished and the optimizer step has not
    begun: the moment the ZeRO paper's per-device formulas describe.
    ``stored_activations`` is each chip's live activation bytes at the end of the forward
    pass: what the blocks keep for the backward pass, plus the output. ``layouts`` has the
    input, weights, output, reduced gradients (``dw_in``) and optimizer state (``opt_w_in``).
    ``params`` (global weights after the step) is filled by :func:`train_step`.
    ``loss_scale`` is the scale this step multiplied dOut by; ``skipped`` is True when its
    gradients held inf/NaN and the update was skipped (then ``step`` did not advance).
    """

    scheme: str
    mesh: Mesh
    step: int
    loss: float | None
    trace: Trace
    memory: dict[str, np.ndarray]
    model_state: dict[str, np.ndarray]
    stored_activations: np.ndarray
    layouts: dict[str, str]
    axes: dict[str, str] = field(default_factory=dict)
    params: dict[str, np.ndarray] | None = None
    loss_scale: float = 1.0
    skipped: bool = False


class Checkpointed:
    """:meth:`state` and :meth:`restore` of a trainer, from the list of its state's values
    (``_state_slots``): shared by the MLP :class:`Trainer` and the transformer's
    :class:`~shardsim.training.model_trainer.ModelTrainer`."""

    mesh: Mesh
    precision: Precision
    scale: ScaleState
    step_count: int

    @property
    def _name(self) -> str:
        raise NotImplementedError

    def _state_slots(self) -> list[tuple[tuple[str, ...], dict[str, Any], str]]:
        raise NotImplementedError

    # -- checkpointing ---------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What a resumed run needs, as ShardedArrays: a state for :func:`shardsim.checkpoint.save`.

        ``{"params": P, "moments": {slot: P}, "step": [1] int64}``, plus ``"master": P`` in
        mixed precision and ``"loss_scale": [2] float64`` (the running scale and its good steps)
        with a dynamic loss scale, where ``P`` is ``{"w_in": ..., "w_out": ...}`` for one block and
        ``{"0": {...}, "1": {...}, ...}`` for a stack. Each value is held as the trainer holds
        it (weights in the scheme's layout, optimizer state in its own) and is the trainer's
        own, not a copy: save it before the next step updates it. :meth:`restore` puts it back.

        >>> import tempfile, numpy as np, shardsim
        >>> from shardsim import checkpoint
        >>> params = shardsim.mlp.init_stack(2, 4, 8, dtype="float64")
        >>> t = Trainer("fsdp", shardsim.Mesh(X=4), params, Adam(lr=0.1))
        >>> x = np.ones((4, 4))
        >>> _ = t.step(x, 0 * x)
        >>> s = t.state()
        >>> s["params"]["1"]["w_in"], s["moments"]["v"]["0"]["w_out"].layout, int(s["step"].to_global()[0])
        (ShardedArray(W_in.1[D_X, F] float64 (4, 8) on Mesh(X=4), local (1, 8)), Layout('[F_X, D]'), 1)
        >>> path = checkpoint.save(tempfile.mkdtemp() + "/step_1", s)
        >>> again = Trainer("fsdp", shardsim.Mesh(X=2), params, Adam(lr=0.1))  # fewer chips
        >>> again.restore(checkpoint.load(path, again.mesh))
        >>> again.step_count, bool((again.params_global()["w_in"] == t.params_global()["w_in"]).all())
        (1, True)
        """
        out: dict[str, Any] = {}
        for path, holder, key in self._state_slots():
            node = out
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = holder[key]
        out["step"] = shard(np.array([self.step_count], np.int64), self.mesh, "[N]", label="step", category="optimizer")
        if self.precision.dynamic is not None:
            running = np.array([self.scale.scale, self.scale.good_steps], np.float64)
            out["loss_scale"] = shard(running, self.mesh, "[N]", label="loss_scale", category="optimizer")
        return out

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``, as :meth:`state` returned it (or ``checkpoint.load`` read it back).

        The same names, global shapes and dtypes as this trainer's own state are required
        (else :class:`~shardsim.ShardingError`, before anything changes); the layouts and the
        mesh may differ. A value already in this trainer's layout on a mesh of this shape is
        taken block for block; any other is assembled on the host and split as this trainer
        holds it. Either way the values are copied bit for bit, and the step count with them,
        so the next :meth:`step` is the one after the saved step.

        >>> import numpy as np, shardsim
        >>> params = shardsim.mlp.init(4, 8, dtype="float64")
        >>> a = Trainer("zero1", shardsim.Mesh(X=2), params, Adam(lr=0.1))
        >>> b = Trainer("zero1", shardsim.Mesh(X=2), params, Adam(lr=0.1))
        >>> x = np.ones((2, 4))
        >>> _ = a.step(x, 0 * x)
        >>> b.restore(a.state())
        >>> a.step(x, 0 * x).loss == b.step(x, 0 * x).loss, b.step_count
        (True, 2)
        """
        want = {path: holder[key] for path, holder, key in self._state_slots()}
        have = _flat_state(state)
        counters = {("step",)} | ({("loss_scale",)} if self.precision.dynamic is not None else set())
        missing = sorted("/".join(p) for p in set(want) - set(have) | (counters - set(have)))
        extra = sorted("/".join(p) for p in set(have) - set(want) - counters)
        if missing or extra:
            raise ShardingError(
                f"cannot restore {self._name} trainer state: missing {missing}, unexpected {extra}; "
                "pass what Trainer.state() returns (or checkpoint.load reads back)"
            )
        step = have[("step",)]
        if step.is_shape_only or step.global_shape != (1,) or step.dtype.kind not in "iu":
            raise ShardingError(f"cannot restore the step count from {step.describe()}: expected [1] integers")
        count = int(step.to_global()[0])
        if count < 0:
            raise ShardingError(f"cannot restore a negative step count ({count})")
        scale = self.scale
        if self.precision.dynamic is not None:
            running = have[("loss_scale",)]
            if running.is_shape_only or running.global_shape != (2,) or running.dtype.kind != "f":
                raise ShardingError(
                    f"cannot restore the loss scale from {running.describe()}: expected [2] floats (scale, good steps)"
                )
            value, good = (float(v) for v in running.to_global())
            if not (np.isfinite(value) and value > 0 and good >= 0 and good == int(good)):
                raise ShardingError(f"cannot restore the loss scale {value!r} with {good!r} good steps")
            scale = ScaleState(value, int(good))
        fresh: dict[tuple[str, ...], ShardedArray] = {}
        for path, mine in want.items():
            given = have[path]
            name = "/".join(path)
            if mine.is_shape_only:
                raise ShardingError(f"cannot restore {name}: this trainer is shape-only, it holds no values")
            if given.global_shape != mine.global_shape or given.dtype != mine.dtype:
                raise ShardingError(
                    f"cannot restore {name}: this trainer holds {mine.global_shape} {mine.dtype}, "
                    f"the state has {given.global_shape} {given.dtype}"
                )
            if given.is_shape_only or given.is_partial:
                raise ShardingError(f"cannot restore {name} from {given.describe()}: need data, not a partial sum")
            same = (given.mesh.axis_names, given.mesh.shape, given.layout) == (
                mine.mesh.axis_names,
                mine.mesh.shape,
                mine.layout,
            )
            if not same:
                given = shard(given.to_global(), mine.mesh, mine.layout)
            blocks = np.array(given.compact(), order="C")  # held as every trainer holds its state
            fresh[path] = ShardedArray(
                mine.mesh,
                mine.layout,
                mine.global_shape,
                mine.dtype,
                blocks,
                label=mine.label,
                category=mine.category,
                holders=mine.holders,
            )
        del want
        for path, holder, key in self._state_slots():
            holder[key] = fresh.pop(path)
        self.step_count = count
        self.scale = scale


class Trainer(Checkpointed):
    """Sharded weights and optimizer state of an MLP (one block or a stack), trained step by step.

    ``params`` are global arrays ``{"w_in": [D, F], "w_out": [F, D]}`` or stacks
    ``[L, D, F]`` / ``[L, F, D]`` (or :class:`~shardsim.ShapeDtype` for a shape-only run at real
    sizes). ``precision`` is a :class:`Precision` or a name (``fp32``, ``fp64``, ``bf16``,
    ``fp16``), by default the params' own dtype with no master copy; ``reduce_dtype``
    overrides the dtype gradients are reduced in; ``loss_scale`` is a static scale (a
    number), ``"dynamic"`` or a :class:`~shardsim.training.scaling.DynamicLossScale`.
    ``optimizer`` is an optimizer or its name (``sgd``, ``momentum``, ``adam``, ``adamw``).
    ``recompute`` keeps only each block's input and runs its forward again in the backward pass.
    ``engine="jax"`` runs each step as one jitted ``shard_map`` program on JAX devices
    (:mod:`shardsim.training.jax_step`; ``pip install 'shardsim[jax]'``).

    ``step_count`` counts the updates applied (Adam's ``t``); ``skipped_steps`` the steps
    skipped for inf/NaN gradients; ``scale`` is the running loss scale.

    >>> import numpy as np, shardsim
    >>> t = Trainer("ddp", shardsim.Mesh(X=2), shardsim.mlp.init(4, 8), precision="bf16")
    >>> t.master_dtype, t.weights()["w_in"].dtype.name
    (dtype('float32'), 'bfloat16')
    """

    def __init__(
        self,
        scheme: str | Scheme,
        mesh: Mesh,
        params: Mapping[str, Any],
        optimizer: Optimizer | str | None = None,
        *,
        precision: str | Precision | None = None,
        reduce_dtype: Any = None,
        loss_scale: float | str | DynamicLossScale | None = None,
        activation: str = "identity",
        residual: bool = False,
        recompute: bool = False,
        axes: Mapping[str, str] | None = None,
        engine: str = "numpy",
        **options: Any,
    ) -> None:
        self.scheme = strategies.get(scheme) if isinstance(scheme, str) else scheme
        if not isinstance(mesh, Mesh):
            raise ShardingError(f"Trainer needs a shardsim.Mesh, got {type(mesh).__name__}")
        self.mesh = mesh
        self.optimizer: Optimizer = _optimizer(optimizer)
        if not isinstance(params, Mapping) or not params:
            raise ShardingError(
                f"Trainer needs params: a dict of weight names to global arrays such as "
                f"{{'w_in': [D, F], 'w_out': [F, D]}}, got {params!r:.80}"
            )
        if precision is None:  # compute in the params' own dtype, no separate master
            precision = Precision(_spec(next(iter(params.values()))).dtype)
        self.precision = Precision.of(precision, reduce=reduce_dtype, loss_scale=loss_scale)
        self.residual, self.recompute = residual, recompute
        self.axes = resolve_axes(self.scheme, mesh, axes)
        check_residual(self.scheme, residual)
        self.ctx = Ctx(axes=self.axes, activation=activation, options=options).check()
        self.layouts = self.scheme.layouts(self.ctx)
        self.names = weight_names(self.scheme, self.layouts, params)
        self.state_layouts = zero.state_layouts(self.scheme, self.ctx)
        _reductions_in(self.precision, self.ctx, self.scheme)  # a reduce_dtype the scheme cannot use fails here
        self.depth = stack_depth(params, block_ranks(self.layouts, mesh, self.names))
        self._blocks = [params] if self.depth is None else [layer_of(params, i) for i in range(self.depth)]
        self.step_count = 0
        self.skipped_steps = 0
        self.scale = ScaleState(self.precision.initial_scale)
        self.params: list[Params] = []  # the weights the chips compute with (compute dtype)
        self.master: list[Params] = []  # float32 master weights (mixed precision only), state layout
        self.moments: list[dict[str, dict[str, ShardedArray]]] = []  # optimizer state, state layout
        prec = self.precision
        for i, block in enumerate(self._blocks):
            weights, masters, moments = {}, {}, {}
            for k in self.names:
                label = weight_label(k, i, self.depth)
                weights[k] = _place(block[k], mesh, self.layouts[k], prec.compute, label, "params")
                if prec.mixed:
                    masters[k] = _place(block[k], mesh, self.state_layouts[k], prec.state_dtype, label, "optimizer")
                moments[k] = {
                    slot: _place(
                        _zeros_like(block[k]), mesh, self.state_layouts[k], prec.moment_dtype, label, "optimizer"
                    )
                    for slot in self.optimizer.slots
                }
            self.params.append(weights)
            self.master.append(masters)
            self.moments.append(moments)
        self._blocks = [{k: _spec(v) for k, v in b.items()} for b in self._blocks]  # shapes only from here on
        self._engine_step = _engine_step(engine, self)

    @classmethod
    def for_model(
        cls,
        cfg: Any,
        plan: Any,
        mesh: Mesh,
        params: Mapping[str, Any],
        optimizer: Optimizer | str | None = None,
        **options: Any,
    ) -> ModelTrainer:
        """A trainer of transformer ``cfg`` (a :class:`~shardsim.models.TransformerConfig`) under
        ``plan`` (a :class:`~shardsim.plans.Plan`) on ``mesh``: a
        :class:`~shardsim.training.model_trainer.ModelTrainer`, whose steps run
        :func:`~shardsim.transformer.run_model` and then this trainer's optimizer update.
        ``options``: ``precision``, ``reduce_dtype``, ``dropout_seed``.

        >>> import numpy as np
        >>> from shardsim.models import get, reference
        >>> from shardsim.plans import Plan
        >>> cfg, plan = get("gpt-tiny"), Plan(dp=2, zero=2)
        >>> t = Trainer.for_model(cfg, plan, plan.mesh(), reference.init(cfg), "adam")
        >>> tok = np.arange(16).reshape(2, 8)
        >>> t.step(tok, tok + 1).step, t.moments["embed"]["m"].layout
        (1, Layout('[V, D_{data}]'))
        """
        from .model_trainer import ModelTrainer

        return ModelTrainer(cfg, plan, mesh, params, optimizer, **options)

    # -- the step ---------------------------------------------------------------------------
    def step(self, x: Any, target: Any) -> StepResult:
        """One training step on inputs ``x`` and regression targets ``target`` (both ``[B, D]``).

        All or nothing: if the step raises, the trainer's weights, master weights, moments,
        step count and loss scale are exactly as before the call (the values the step made are
        released, even while the caller holds the traceback), so once the fault is healed the
        same call computes the same step, bit for bit.

        >>> import numpy as np, shardsim
        >>> mesh = shardsim.Mesh(X=2)
        >>> t = Trainer("zero1", mesh, shardsim.mlp.init(4, 8), SGD(lr=0.1))
        >>> x = np.ones((2, 4), np.float32)
        >>> mesh.fail(X=1)
        >>> try:
        ...     t.step(x, 0 * x)
        ... except shardsim.ChipFailureError:
        ...     print("failed at step", t.step_count + 1)
        failed at step 1
        >>> mesh.heal()
        >>> t.step(x, 0 * x).step
        1
        """
        if self.scheme.check_shapes is not None:
            self.scheme.check_shapes(self._blocks[0], x, target)
        if self._engine_step is not None:  # the whole step as one program on another engine
            return self._engine_step(x, target)
        undo: list[_Undo] = []
        # float16 overflows are expected here and handled: the step checks its gradients and skips
        quiet = np.errstate(over="ignore", invalid="ignore") if self.precision.checks_overflow else None
        try:
            with quiet or contextlib.nullcontext():
                return self._step(x, target, undo)
        except BaseException as e:
            # Release what the aborted step made (the traceback's frames hold it), then undo.
            if e.__traceback__ is not None and e.__traceback__.tb_next is not None:
                traceback.clear_frames(e.__traceback__.tb_next)
            _roll_back(self.mesh, undo)
            raise

    def _step(self, x: Any, target: Any, undo: list[_Undo]) -> StepResult:
        scheme, ctx, mesh, prec = self.scheme, self.ctx, self.mesh, self.precision
        ledger = mesh.memory
        ledger.reset_peak()
        scale = self.scale.scale
        with trace() as t, _reductions_in(prec, ctx, scheme):
            xs = _place(x, mesh, self.layouts["x"], prec.compute, "In", "activations")
            with phase("forward"):
                out, saved = forward_stack(
                    scheme, ctx, xs, self.params, residual=self.residual, recompute=self.recompute
                )
            x_layout = str(xs.layout)
            del xs
            stored = ledger.live("activations")
            ts = _place(target, mesh, self.layouts["out"], prec.compute, "Target", "activations")
            out_layout = str(Layout.parse(self.layouts["out"], mesh.axis_names))
            pipeline = saved[0].step if len(saved) == 1 and isinstance(saved[0], PipelineState) else None
            if pipeline is None:
                with phase("loss"):
                    loss, dout = mse(out, ts, scale=scale)
            else:  # the last stage takes each microbatch's loss as it comes out (1F1B runs backward first)
                losses: list[ShardedArray] = []
                n_out = math.prod(ts.global_shape)
                dout = microbatch_loss(pipeline, ts, scale, losses)  # type: ignore[assignment]
            del out, ts
            hand_over = [dout]  # so the backward pass holds the only reference and frees it
            del dout
            with phase("backward"):
                dx, grads = backward_stack(
                    scheme, ctx, saved, hand_over.pop(), self.params, residual=self.residual, recompute=self.recompute
                )
                del dx
            if pipeline is not None:
                shape_only = not losses or losses[0].is_shape_only
                loss = None if shape_only else sum(float(np.asarray(v.to_global())) for v in losses) / n_out
                del losses, pipeline
            model_state = {c: ledger.live(c) for c in MODEL_STATE}
            with phase("optimizer"):
                grad_layouts, skipped = self._update(grads, scale, undo)
        # the commit: nothing below can fail
        if skipped:
            self.skipped_steps += 1
        else:
            self.step_count += 1
        self.scale = self.scale.after(prec.dynamic, skipped)
        peaks = ledger.snapshot()["peak"]
        names = mesh.axis_names
        layouts = {
            "x": x_layout,
            **{k: str(v.layout) for k, v in self.params[0].items()},
            "out": out_layout,
            **{f"d{k}": v for k, v in grad_layouts.items()},
            **{f"opt_{k}": str(Layout.parse(v, names)) for k, v in self.state_layouts.items()},
        }
        return StepResult(
            scheme=scheme.name,
            mesh=mesh,
            step=self.step_count,
            loss=loss,
            trace=t,
            memory=peaks,
            model_state=model_state,
            stored_activations=stored,
            layouts=layouts,
            axes=dict(self.axes),
            loss_scale=scale,
            skipped=skipped,
        )

    def _update(self, grads: list[Grads], scale: float, undo: list[_Undo]) -> tuple[dict[str, str], bool]:
        """The optimizer step, block by block; empties ``grads``.

        Returns the reduced gradients' layouts and whether the step was skipped (inf/NaN
        gradients). Before the first change to the trainer's state, ``undo`` gets what puts
        it back.
        """
        scheme, ctx, prec, opt = self.scheme, self.ctx, self.precision, self.optimizer
        gather = getattr(scheme, "gather_params", None)
        layouts: dict[str, str] = {}
        checked = prec.checks_overflow
        if checked:  # every gradient reduced (ZeRO-1: ReduceScattered) and checked before any update
            for i in range(len(grads)):
                grads[i] = reduce_gradients(scheme, ctx, grads[i])
            layouts = {k: str(v.layout) for k, v in grads[0].items()}
            values = [g for block in grads for g in block.values()]
            if found_inf(values, self.mesh, f"found_inf (loss scale {scale:g})"):
                del values
                grads.clear()
                return layouts, True
            del values
        if gather is not None:  # the AllGathers after the update can fail: keep what undoes it
            undo.extend(self._undo_entries())
        # else nothing after the first in-place update can fail: no collective, no allocation
        step = self.step_count + 1
        for i in range(len(grads)):
            g, grads[i] = grads[i], {}
            if not checked:
                g = reduce_gradients(scheme, ctx, g)  # 1. ZeRO-1: ReduceScatter the whole gradients
            sliced = {}
            for k in self.names:
                gk = g.pop(k)
                layouts[k] = str(gk.layout)
                master = self.master[i][k] if prec.mixed else None
                new = update_weight(  # 2. every chip updates the block it holds
                    opt, step, self.params[i][k], master, gk, self.moments[i][k], self.state_layouts[k],
                    scale=scale, gathered=gather is not None,
                )  # fmt: skip
                del gk
                if new is not None:
                    sliced[k] = new
                    self.params[i][k] = None  # type: ignore[assignment]  # the gather below refills it
            if gather is not None:
                gathered = gather(ctx, sliced)  # 3. AllGather the updated weights
                del sliced
                self.params[i].update({k: _in_c_order(gathered.pop(k)) for k in list(gathered)})
                del gathered
        return layouts, False

    def _undo_entries(self) -> list[_Undo]:
        """What puts a ZeRO-1/2 trainer's state back: a copy of each value the update changes in
        place (moments, masters); for the weights the AllGather replaces, their untouched blocks."""
        entries = []
        for path, holder, key in self._state_slots():
            value = holder[key]
            data = None if value.is_shape_only else value.compact()
            if path[0] == "params":
                entries.append(_Undo(holder, key, None, _spec_of(value), value.uid, data))
            else:
                entries.append(_Undo(holder, key, value, None, value.uid, None if data is None else data.copy()))
        return entries

    # -- reading the state -----------------------------------------------------------------
    @property
    def master_dtype(self) -> np.dtype:
        """The dtype the optimizer updates (float32 master weights in mixed precision)."""
        return self.precision.state_dtype

    def params_global(self) -> dict[str, np.ndarray]:
        """The optimizer's weights as global arrays (the float32 masters in mixed precision)."""
        return self._gather(self.master if self.precision.mixed else self.params)

    def weights(self) -> dict[str, np.ndarray]:
        """The weights the chips compute with, as global arrays (16-bit in mixed precision)."""
        return self._gather(self.params)

    def moments_global(self) -> dict[str, dict[str, np.ndarray]]:
        """The optimizer's moments as global arrays: ``{"m": {"w_in": ...}, ...}``."""
        out = {}
        for slot in self.optimizer.slots:
            out[slot] = self._gather([{k: m[k][slot] for k in self.names} for m in self.moments])
        return out

    def _gather(self, layers: list[Params]) -> dict[str, np.ndarray]:
        glob = {k: [np.array(layer[k].to_global()) for layer in layers] for k in self.names}
        return {k: v[0] if self.depth is None else np.stack(v) for k, v in glob.items()}

    @property
    def _name(self) -> str:
        return self.scheme.name

    def _state_slots(self) -> list[tuple[tuple[str, ...], dict[str, Any], str]]:
        """Where each value of :meth:`state` lives: its path, the dict holding it, and its key there."""
        slots: list[tuple[tuple[str, ...], dict[str, Any], str]] = []
        for i in range(len(self.params)):
            block = () if self.depth is None else (str(i),)
            for k in self.names:
                slots.append((("params", *block, k), self.params[i], k))
                if self.precision.mixed:
                    slots.append((("master", *block, k), self.master[i], k))
                for slot in self.optimizer.slots:
                    slots.append((("moments", slot, *block, k), self.moments[i][k], slot))
        return slots


def train_step(
    scheme: str | Scheme,
    mesh: Mesh,
    params: Mapping[str, Any],
    x: Any,
    target: Any,
    optimizer: Optimizer | None = None,
    **kwargs: Any,
) -> StepResult:
    """One training step from fresh optimizer state; the result's ``params`` are the updated weights.

    Keyword arguments are :class:`Trainer`'s (``precision``, ``activation``, ``residual``,
    ``recompute``, ``axes``...).

    >>> import numpy as np, shardsim
    >>> p = shardsim.mlp.init(8, 16)
    >>> x = np.ones((4, 8), np.float32)
    >>> r = train_step("zero1", shardsim.Mesh(X=4), p, x, np.zeros_like(x), SGD(lr=0.1))
    >>> r.trace.collectives("optimizer")
    [('reduce_scatter', ('X',)), ('reduce_scatter', ('X',)), ('all_gather', ('X',)), ('all_gather', ('X',))]
    >>> r.params["w_in"].shape
    (8, 16)
    """
    trainer = Trainer(scheme, mesh, params, optimizer, **kwargs)
    result = trainer.step(x, target)
    if result.loss is not None:
        result.params = trainer.params_global()
    return result


# -- helpers -------------------------------------------------------------------------------
def microbatch_loss(
    pipeline: PipelineStep, target: ShardedArray, scale: float, losses: list[ShardedArray]
) -> Callable[[int, ShardedArray], ShardedArray]:
    """The mean squared error of a pipeline, microbatch by microbatch on its last stage.

    Microbatch ``j``'s output meets its slice of the targets there; its ``dOut`` is the
    whole batch's gradient restricted to those rows (``2 (Out_j - Target_j) / (B·D)``), and
    its sum of squares goes to ``losses``.
    """
    m = pipeline.schedule.microbatches
    pieces = split(target, target.layout.dims[0].name, m, label="Target")
    n = math.prod(target.global_shape)

    def dout_of(j: int, out: ShardedArray) -> ShardedArray:
        mine = place(pieces[j], label="Target", **{pipeline.pipe: pipeline.schedule.stages - 1})
        total, dout = mse_terms(out, mine, scale=scale * math.prod(out.global_shape) / n)
        losses.append(total)
        return dout

    return dout_of


def state_slice(w: ShardedArray, layout: str) -> ShardedArray:
    """The part of weights ``w`` each chip updates: ``w`` itself, or under ZeRO-1/2 its slice of the
    optimizer state's ``layout`` (a local slice, no communication; the weights are their own master).

    >>> import numpy as np, shardsim
    >>> w = shardsim.shard(np.ones((4, 2)), shardsim.Mesh(X=2), "D F")
    >>> state_slice(w, "[D_X, F]").layout
    Layout('[D_X, F]')
    """
    want = Layout.parse(layout, w.mesh.axis_names)
    for d, (have, need) in enumerate(zip(w.layout.dims, want.dims)):
        extra = need.axes[len(have.axes) :]
        if extra:
            w = local_slice(w, extra, d)
    return w


def update_weight(
    opt: Optimizer,
    step: int,
    w: ShardedArray,
    master: ShardedArray | None,
    grad: ShardedArray,
    moments: Mapping[str, ShardedArray],
    layout: str,
    *,
    scale: float = 1.0,
    gathered: bool = False,
    sent: str = "params",
) -> ShardedArray | None:
    """The optimizer step of one weight ``w``, whose optimizer state lives in ``layout``.

    Each chip updates what it holds of the state: the float32 ``master`` (mixed precision),
    else ``w`` itself or, when ``layout`` splits it further (ZeRO-1/2), its slice of ``w``.
    ``grad`` (reduced; divided by ``scale`` here) is cut to ``layout`` first, a local slice.
    With ``gathered`` (ZeRO-1/2) the updated slice is returned in ``w``'s dtype for the
    caller's AllGather (in ledger category ``sent``); else ``w`` is updated in place (its 16-bit copy refreshed from the
    master) and None returned.

    >>> import numpy as np, shardsim
    >>> mesh = shardsim.Mesh(X=2)
    >>> w = _owned(shardsim.shard(np.ones((2, 2)), mesh, "D F"), "W", "params")
    >>> g = shardsim.shard(np.ones((2, 2)), mesh, "D F")
    >>> new = update_weight(SGD(lr=0.5), 1, w, None, g, {}, "[D_X, F]", gathered=True)
    >>> new.layout, new.to_global().tolist()
    (Layout('[D_X, F]'), [[0.5, 0.5], [0.5, 0.5]])
    """
    target = master
    if target is None:
        mine = state_slice(w, layout)
        target = w if mine is w else _owned(mine, w.label, sent)
        del mine
    grad = state_slice(grad, layout)
    if not grad.is_shape_only:
        g = grad.compact()
        if scale != 1:
            g = g.astype(target.dtype) * target.dtype.type(1.0 / scale)
        opt.update(target.compact(), g, {s: m.compact() for s, m in moments.items()}, step)
        del g
    del grad
    if gathered:
        return target if master is None else cast(target, w.dtype, category=sent, label=w.label)
    if master is not None and not target.is_shape_only:  # refresh the 16-bit copy of the master
        np.copyto(w.compact(), target.compact(), casting="unsafe")
    return None


@dataclass
class _Undo:
    """One state value as it was before a step changed it: the value itself and a copy of its
    blocks (changed in place), or what rebuilds it (``spec`` and its untouched ``data``: replaced)."""

    holder: dict[str, Any]
    key: str
    value: ShardedArray | None
    spec: tuple[Any, ...] | None
    uid: int
    data: np.ndarray | None


def _spec_of(x: ShardedArray) -> tuple[Any, ...]:
    return (x.mesh, x.layout, x.global_shape, x.dtype, x.label, x.category, x.holders)


def _roll_back(mesh: Mesh, undo: list[_Undo]) -> None:
    """Put every state value back as :class:`_Undo` recorded it."""
    ledger = mesh.memory
    capacity, ledger.capacity = ledger.capacity, None  # the values put back held these bytes before the step
    try:
        for u in undo:
            if u.value is not None:
                u.holder[u.key] = u.value
                if u.data is not None:
                    np.copyto(u.value.compact(), u.data)
            elif u.holder.get(u.key) is None or u.holder[u.key].uid != u.uid:
                u.holder[u.key] = None  # release the new value before the old one is rebuilt
                assert u.spec is not None
                m, layout, shape, dtype, label, category, holders = u.spec
                u.holder[u.key] = ShardedArray(
                    m, layout, shape, dtype, u.data, label=label, category=category, holders=holders
                )
    finally:
        ledger.capacity = capacity


def _engine_step(engine: str, trainer: Trainer) -> Any:
    """None for the stacked NumPy engine; for ``"jax"``, the jitted step of :mod:`.jax_step`."""
    if engine == "numpy":
        return None
    if engine == "jax":
        from .jax_step import JaxStep

        return JaxStep(trainer)
    raise ShardingError(f"engine must be 'numpy' or 'jax', got {engine!r}")


def _optimizer(optimizer: Any) -> Optimizer:
    """An optimizer, its name, or None (Adam's defaults)."""
    if optimizer is None:
        return Adam()
    if isinstance(optimizer, str):
        return optim.get(optimizer)
    if not isinstance(optimizer, (SGD, Adam)):
        raise ShardingError(
            f"optimizer must be shardsim.training.SGD, Adam or AdamW (or one's name: 'sgd', 'momentum', "
            f"'adam', 'adamw'), got {type(optimizer).__name__}"
        )
    return optimizer


def _spec(value: Any) -> ShapeDtype:
    if isinstance(value, ShapeDtype):
        return value
    a = np.asarray(value)
    return ShapeDtype(a.shape, a.dtype)


def _flat_state(state: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], ShardedArray]:
    """A nested state as paths to ShardedArrays."""
    if not isinstance(state, Mapping):
        raise ShardingError(f"a trainer state is a dict of names to ShardedArrays, got {type(state).__name__}")
    flat: dict[tuple[str, ...], ShardedArray] = {}
    for key, value in state.items():
        path = (*prefix, str(key))
        if isinstance(value, Mapping):
            flat.update(_flat_state(value, path))
        elif isinstance(value, ShardedArray):
            flat[path] = value
        else:
            raise ShardingError(f"trainer state {'/'.join(path)} is a {type(value).__name__}, not a ShardedArray")
    return flat


def _zeros_like(value: Any) -> Any:
    if isinstance(value, ShapeDtype):
        return value
    return np.zeros(np.shape(value))


def _place(value: Any, mesh: Mesh, layout: str, dtype: np.dtype, label: str, category: str) -> ShardedArray:
    """``value`` (global array or ShapeDtype) in ``dtype`` and ``layout``, in a buffer of its own."""
    if isinstance(value, ShapeDtype):
        return shard(ShapeDtype(value.shape, dtype), mesh, layout, label=label, category=category)
    if isinstance(value, ShardedArray):
        raise ShardingError(f"{label} must be a global NumPy array, got {value.describe()}; pass value.to_global()")
    a = np.asarray(value)
    if a.dtype.kind not in "biuf":
        raise ShardingError(f"{label} must hold real numbers, got an array of dtype {a.dtype}")
    return _owned(shard(a.astype(dtype, copy=False), mesh, layout), label, category)


def _owned(x: ShardedArray, label: str | None, category: str) -> ShardedArray:
    """A copy of ``x`` whose blocks the optimizer may update in place, in C order.

    A trainer holds all its state in C order, however it was made (placed, gathered, restored):
    NumPy's matmul rounds by the operands' memory layout, so a restored trainer computes the
    next step bit for bit as the original only if both hold the same layout.
    """
    data = None if x.is_shape_only else np.array(x.compact(), order="C")
    return ShardedArray(
        x.mesh, x.layout, x.global_shape, x.dtype, data, label=label, category=category, holders=x.holders
    )


def _in_c_order(x: ShardedArray) -> ShardedArray:
    """``x`` itself if its blocks are in C order (a collective's result usually is), else its C-order copy."""
    if x.is_shape_only or x.compact().flags.c_contiguous:
        return x
    return _owned(x, x.label, x.category)


def _reductions_in(precision: Precision, ctx: Ctx, scheme: Scheme) -> contextlib.AbstractContextManager[Any]:
    """Reduce gradients over the data-parallel axes in ``precision.reduce``, if it is not the compute dtype."""
    if precision.reduce == precision.compute:
        return contextlib.nullcontext()
    data_axes = [ctx.axes[r] for r in scheme.roles if r == "data"]
    if not data_axes:
        raise ShardingError(
            f"reduce_dtype {precision.reduce}: {scheme.name} reduces no gradients over a data-parallel axis "
            "(its weight gradients need no reduction); leave reduce_dtype unset"
        )
    return reduce_dtype(precision.reduce, data_axes)
