"""The step program of an MLP: the scheme's forward, the squared error, backward, synchronisation, update.

The step runs the scheme's own per-layer forward and backward layer after layer (the same
steps :func:`shardsim.run_strategy` runs), then the optimizer step, and reports the loss,
the trace (phases ``forward``, ``loss``, ``backward``, ``recompute``, ``optimizer``) and every
chip's memory by category, measured by the ledger from the values' real lifetimes.

Where the optimizer state lives (``state_layouts``) decides the optimizer step:

- the weights' own layout (ddp, fsdp = zero3, tp, fsdp_tp): each chip updates what it holds,
  in place; no communication.
- slices of replicated weights (zero1, zero2): ``1.`` ReduceScatter the gradients still
  whole (zero1), ``2.`` each chip updates its slice, ``3.`` AllGather the weights back.

Under float16 every gradient is reduced and checked for inf/NaN before any update; an
overflowing step is skipped (the loss scale backs off) and changes no weight.

>>> import numpy as np, shardsim
>>> from shardsim.training import SGD, Trainer
>>> t = Trainer("zero1", shardsim.Mesh(X=2), shardsim.models.reference_mlp.init(4, 8), SGD(lr=0.1))
>>> x = np.ones((2, 4), np.float32)
>>> type(t.program).__name__, t.program(t, x, 0 * x, []).trace.collectives("optimizer")[0]
('MLPStep', ('reduce_scatter', ('X',)))
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..array import ShardedArray
from ..collectives import reduce_dtype
from ..errors import ShardingError
from ..layout import Layout
from ..pieces import place, split
from ..strategies.base import Ctx, Grads, Scheme
from ..strategies.pipeline.execute import PipelineStep
from ..strategies.pp import PipelineState
from ..strategies.runner import backward_stack, forward_stack, reduce_gradients
from ..tracing import phase, trace
from . import state
from .loss import mse, mse_terms
from .result import MODEL_STATE, StepResult
from .scaling import found_inf
from .update import Undo, undo_entries, update_weight

if TYPE_CHECKING:
    from .held import TrainerState
    from .precision import Precision


class MLPStep:
    """One training step of an MLP :class:`~shardsim.training.Trainer` on its scheme.

    Called with the trainer, inputs ``x``, regression targets ``target`` (both ``[B, D]``) and
    the list the step puts its :class:`~shardsim.training.update.Undo` entries in; updates the
    trainer's state (or, on a float16 overflow, skips) and returns the :class:`StepResult`.
    It holds nothing itself: the trainer holds the state (and no cycle keeps it alive).

    >>> import numpy as np, shardsim
    >>> from shardsim.training import Trainer
    >>> t = Trainer("ddp", shardsim.Mesh(X=2), shardsim.models.reference_mlp.init(4, 8))
    >>> MLPStep()(t, np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32), []).step
    1
    """

    def check(self, t: TrainerState, x: Any, target: Any) -> None:
        """The scheme's own check of the inputs' shapes against the weights', before anything runs."""
        if t.scheme.check_shapes is not None:
            t.scheme.check_shapes(t.block_shapes[0], x, target)

    def __call__(self, t: TrainerState, x: Any, target: Any, undo: list[Undo]) -> StepResult:
        scheme, ctx, mesh, prec = t.scheme, t.ctx, t.mesh, t.precision
        ledger = mesh.memory
        ledger.reset_peak()
        scale = t.scale.scale
        with trace() as tr, reductions_in(prec, ctx, scheme):
            xs = state.place(x, mesh, t.layouts["x"], prec.compute, "In", "activations")
            with phase("forward"):
                out, saved = forward_stack(scheme, ctx, xs, t.params, residual=t.residual, recompute=t.recompute)
            x_layout = str(xs.layout)
            del xs
            stored = ledger.live("activations")
            ts = state.place(target, mesh, t.layouts["out"], prec.compute, "Target", "activations")
            out_layout = str(Layout.parse(t.layouts["out"], mesh.axis_names))
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
                    scheme, ctx, saved, hand_over.pop(), t.params, residual=t.residual, recompute=t.recompute
                )
                del dx
            if pipeline is not None:
                shape_only = not losses or losses[0].is_shape_only
                loss = None if shape_only else sum(float(np.asarray(v.to_global())) for v in losses) / n_out
                del losses, pipeline
            model_state = {c: ledger.live(c) for c in MODEL_STATE}
            with phase("optimizer"):
                grad_layouts, skipped = self._update(t, grads, scale, undo)
        # the commit: nothing below can fail
        if skipped:
            t.skipped_steps += 1
        else:
            t.step_count += 1
        t.scale = t.scale.after(prec.dynamic, skipped)
        layouts = {
            "x": x_layout,
            **{k: str(v.layout) for k, v in t.params[0].items()},
            "out": out_layout,
            **{f"d{k}": v for k, v in grad_layouts.items()},
            **{f"opt_{k}": str(Layout.parse(v, mesh.axis_names)) for k, v in t.state_layouts.items()},
        }
        return StepResult(
            scheme=scheme.name,
            mesh=mesh,
            step=t.step_count,
            loss=loss,
            trace=tr,
            memory=ledger.snapshot()["peak"],
            model_state=model_state,
            stored_activations=stored,
            layouts=layouts,
            axes=dict(t.axes),
            loss_scale=scale,
            skipped=skipped,
        )

    def _update(
        self, t: TrainerState, grads: list[Grads], scale: float, undo: list[Undo]
    ) -> tuple[dict[str, str], bool]:
        """The optimizer step, block by block; empties ``grads``.

        Returns the reduced gradients' layouts and whether the step was skipped (inf/NaN
        gradients). Before the first change to the trainer's state, ``undo`` gets what puts
        it back.
        """
        scheme, ctx, prec, opt = t.scheme, t.ctx, t.precision, t.optimizer
        gather = getattr(scheme, "gather_params", None)
        layouts: dict[str, str] = {}
        checked = prec.checks_overflow
        if checked:  # every gradient reduced (ZeRO-1: ReduceScattered) and checked before any update
            for i in range(len(grads)):
                grads[i] = reduce_gradients(scheme, ctx, grads[i])
            layouts = {k: str(v.layout) for k, v in grads[0].items()}
            values = [g for block in grads for g in block.values()]
            if found_inf(values, t.mesh, f"found_inf (loss scale {scale:g})"):
                del values
                grads.clear()
                return layouts, True
            del values
        if gather is not None:  # the AllGathers after the update can fail: keep what undoes it
            undo.extend(undo_entries(t.state_slots()))
        # else nothing after the first in-place update can fail: no collective, no allocation
        step = t.step_count + 1
        for i in range(len(grads)):
            g, grads[i] = grads[i], {}
            if not checked:
                g = reduce_gradients(scheme, ctx, g)  # 1. ZeRO-1: ReduceScatter the whole gradients
            sliced = {}
            for k in t.names:
                gk = g.pop(k)
                layouts[k] = str(gk.layout)
                master = t.master[i][k] if prec.mixed else None
                new = update_weight(  # 2. every chip updates the block it holds
                    opt, step, t.params[i][k], master, gk, t.moments[i][k], t.state_layouts[k],
                    scale=scale, gathered=gather is not None,
                )  # fmt: skip
                del gk
                if new is not None:
                    sliced[k] = new
                    t.params[i][k] = None  # the gather below refills it
            if gather is not None:
                gathered = gather(ctx, sliced)  # 3. AllGather the updated weights
                del sliced
                t.params[i].update({k: state.in_c_order(gathered.pop(k)) for k in list(gathered)})
                del gathered
        return layouts, False


def microbatch_loss(
    pipeline: PipelineStep, target: ShardedArray, scale: float, losses: list[ShardedArray]
) -> Callable[[int, ShardedArray], ShardedArray]:
    """The mean squared error of a pipeline, microbatch by microbatch on its last stage.

    Microbatch ``j``'s output meets its slice of the targets there; its ``dOut`` is the
    whole batch's gradient restricted to those rows (``2 (Out_j - Target_j) / (B·D)``), and
    its sum of squares goes to ``losses``.

    >>> microbatch_loss.__name__
    'microbatch_loss'
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


def reductions_in(precision: Precision, ctx: Ctx, scheme: Scheme) -> contextlib.AbstractContextManager[Any]:
    """Reduce gradients over the data-parallel axes in ``precision.reduce``, if it is not the compute dtype.

    >>> import shardsim
    >>> from shardsim.strategies.base import Ctx
    >>> from shardsim.training import Precision
    >>> ddp = shardsim.strategies.get("ddp")
    >>> reductions_in(Precision.of("bf16", reduce="float32"), Ctx(axes={"data": "X"}), ddp) is not None
    True
    """
    if precision.reduce == precision.compute:
        return contextlib.nullcontext()
    data_axes = [ctx.axes[r] for r in scheme.roles if r == "data"]
    if not data_axes:
        raise ShardingError(
            f"reduce_dtype {precision.reduce}: {scheme.name} reduces no gradients over a data-parallel axis "
            "(its weight gradients need no reduction); leave reduce_dtype unset"
        )
    return reduce_dtype(precision.reduce, data_axes)
