"""A training step on the JAX engine: forward, loss, backward, gradient reduction and update, one jitted program.

``Trainer(..., engine="jax")`` keeps its weights and optimizer state as every trainer does
(the scheme's layouts and the stage's state layouts); each :meth:`~Trainer.step` places
them on the JAX mesh with those ``NamedSharding``\\ s and runs the jitted step: the scheme's
own forward and backward inside ``jax.shard_map``, the gradients reduced, every chip
updating the optimizer state it holds, and under ZeRO-1/2 the AllGather of the updated
weights. The trace and the ledger are those recorded when the step was first traced (the
program is the same every step). Supported: ddp, fsdp, tp, fsdp_tp, tp_ln, tp_sp, ep, dp_ep and the ZeRO stages, in
the params' own dtype or in mixed precision (``precision="bf16"``: bfloat16 compute, float32
master weights and moments in the state's layout), with gradients reduced in a separate
``reduce_dtype`` if given, without loss scaling yet. The update is the optimizer's own
:meth:`~shardsim.training.Adam.apply`, the code the NumPy trainer runs, here on the device's blocks.
A mesh with a failed chip (``mesh.fail``) fails the step with ``ChipFailureError`` before anything
is traced or run, as the NumPy trainer's first collective does; the trainer's state is untouched.

>>> import numpy as np, shardsim
>>> from shardsim.training import SGD, Trainer
>>> t = Trainer("zero2", shardsim.Mesh(X=2), shardsim.models.reference_mlp.init(8, 16), SGD(lr=0.1), engine="jax")
>>> x = np.ones((4, 8), np.float32)
>>> r = t.step(x, 0 * x)
>>> r.step, r.trace.collectives("optimizer")
(1, [('all_gather', ('X',)), ('all_gather', ('X',))])
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import engines
from ..array import ShardedArray
from ..collectives import failed_chips
from ..errors import ChipFailureError, EngineError
from ..layout import Layout
from ..mesh import Mesh
from ..ops import cast
from ..strategies.runner import backward_stack, forward_stack, reduce_gradients
from ..tracing import Trace, phase, trace
from .loss import mse_terms
from .mlp_step import reductions_in
from .result import MODEL_STATE, StepResult
from .state import place
from .update import state_slice

if TYPE_CHECKING:
    from .held import TrainerState

SUPPORTED = ("ddp", "fsdp", "tp", "fsdp_tp", "tp_ln", "tp_sp", "ep", "dp_ep", "zero1", "zero2", "zero3")


class JaxStep:
    """The jitted step of one :class:`~shardsim.training.Trainer` (built on its first call)."""

    def __init__(self, trainer: TrainerState) -> None:
        from ..engines.jax.placement import meshes  # the engine's errors if JAX is missing or too small

        name = trainer.scheme.name
        if name not in SUPPORTED:
            raise EngineError(
                f"Trainer(engine='jax') runs {list(SUPPORTED)}, not {name!r}; use engine='numpy' (docs/engines.md)"
            )
        prec = trainer.precision
        if prec.checks_overflow:
            raise EngineError(
                f"Trainer(engine='jax') runs precision fp32, fp64 or bf16 (mixed), with no loss scaling or "
                f"float16 overflow checks yet (got {prec}); drop loss_scale=, use precision='bf16', or use "
                "engine='numpy'"
            )
        if any(v.is_shape_only for block in trainer.params for v in block.values()):
            raise EngineError("Trainer(engine='jax') needs weights with data, not ShapeDtype")
        self.trainer = trainer
        self.jmesh = meshes(trainer.mesh)[0]
        # the program's values live on a twin of the trainer's mesh: its ledger holds exactly what
        # one step holds (weights, state, activations), as the trainer's own ledger does on NumPy
        self.mesh = Mesh(dict(zip(trainer.mesh.axis_names, trainer.mesh.shape)))
        self._fn: Any = None
        self._key: Any = None
        self._trace = Trace()
        self._stats: dict[str, Any] = {}

    # -- the program ------------------------------------------------------------------------
    def _program(self, x: np.ndarray, target: np.ndarray) -> Any:
        import jax

        from ..engines.jax.kernels import JAX
        from ..engines.jax.placement import put, sharding

        t = self.trainer
        mesh, scheme, ctx, opt = self.mesh, t.scheme, t.ctx, t.optimizer
        lay, state_lay = t.layouts, t.state_layouts
        shapes = [{k: v.global_shape for k, v in block.items()} for block in t.params]
        prec = t.precision
        stats = self._stats

        def body(
            weights: list, masters: list, moments: list, xb: Any, tb: Any, factors: Any
        ) -> tuple[list, list, list, Any]:
            with engines.use(JAX), reductions_in(prec, t.ctx, scheme):  # reduce_dtype, as on NumPy
                params = [
                    {k: _value(mesh, b[k], lay[k], shapes[i][k], t.params[i][k].label, "params") for k in t.names}
                    for i, b in enumerate(weights)
                ]
                master = [  # mixed precision: the float32 masters the optimizer updates, in the state's layout
                    {k: _value(mesh, b[k], state_lay[k], shapes[i][k], t.params[i][k].label, "optimizer") for k in b}
                    for i, b in enumerate(masters)
                ]
                moms = [
                    {
                        k: {s: _value(mesh, m[k][s], state_lay[k], shapes[i][k], None, "optimizer") for s in m[k]}
                        for k in t.names
                    }
                    for i, m in enumerate(moments)
                ]
                xs = _value(mesh, xb, lay["x"], x.shape, "In", "activations")
                with phase("forward"):
                    out, saved = forward_stack(scheme, ctx, xs, params, residual=t.residual, recompute=t.recompute)
                del xs
                stats["stored"] = mesh.memory.live("activations")
                ts = _value(mesh, tb, lay["out"], target.shape, "Target", "activations")
                with phase("loss"):
                    total, dout = mse_terms(out, ts)
                loss = _local(total)
                del out, ts, total
                hand_over = [dout]  # so the backward pass holds the only reference and frees it
                del dout
                with phase("backward"):
                    dx, grads = backward_stack(
                        scheme, ctx, saved, hand_over.pop(), params, residual=t.residual, recompute=t.recompute
                    )
                    del dx
                stats["model_state"] = {c: mesh.memory.live(c) for c in MODEL_STATE}
                with phase("optimizer"):
                    new_w, new_master, new_m = self._update(params, master, moms, grads, factors)
            return new_w, new_master, new_m, loss

        spec = lambda layout: sharding(self.jmesh, layout).spec  # noqa: E731
        w_specs = [{k: spec(lay[k]) for k in t.names} for _ in t.params]
        master_specs = [{k: spec(state_lay[k]) for k in block} for block in t.master]  # empty unless mixed
        m_specs = [{k: {s: spec(state_lay[k]) for s in opt.slots} for k in t.names} for _ in t.params]
        in_specs = (w_specs, master_specs, m_specs, spec(lay["x"]), spec(lay["out"]), spec("[N]"))
        out_specs = (w_specs, master_specs, m_specs, jax.sharding.PartitionSpec())  # the loss: one number
        self._put = lambda a, layout, dtype: put(np.asarray(a, dtype), sharding(self.jmesh, layout))
        mapped = jax.shard_map(body, mesh=self.jmesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
        return jax.jit(mapped)

    def _update(
        self, params: list[Any], master: list[Any], moms: list[Any], grads: list[Any], factors: Any
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """Inside the program: every chip updates the optimizer state it holds, block by block, and
        under ZeRO-1/2 the updated weights are AllGathered; the new weights, masters and moments
        come back as each chip's local blocks."""
        t, mesh, prec = self.trainer, self.mesh, self.trainer.precision
        scheme, ctx, opt, state_lay = t.scheme, t.ctx, t.optimizer, t.state_layouts
        gather = getattr(scheme, "gather_params", None)
        new_w: list[dict[str, Any]] = []
        new_master: list[dict[str, Any]] = []
        new_m: list[dict[str, Any]] = []
        kept = []  # the updated masters, alive to the end as the NumPy trainer's (updated in place)
        for i in range(len(grads)):
            g = reduce_gradients(scheme, ctx, grads[i])
            self._stats["grad_layouts"] = {k: str(v.layout) for k, v in g.items()}
            sliced, mine, mastered, local_w = {}, {}, {}, {}
            for k in t.names:
                w = master[i][k] if prec.mixed else state_slice(params[i][k], state_lay[k])
                state = {s: m.compact() for s, m in moms[i][k].items()}
                data, state = opt.apply(w.compact(), g.pop(k).compact(), state, factors)
                spec_w = (w.layout, w.global_shape, w.dtype, w.label, w.local_shape)
                mine[k] = {s: v.reshape(spec_w[4]) for s, v in state.items()}
                del w
                if not prec.mixed:
                    params[i][k] = None  # updated in place, as on NumPy
                    sliced[k] = ShardedArray(mesh, *spec_w[:3], data, label=spec_w[3], category="params")
                    continue
                mastered[k] = data.reshape(spec_w[4])
                if gather is None:  # the 16-bit weights: a rounded copy of the masters (untraced)
                    local_w[k] = data.astype(prec.compute).reshape(spec_w[4])
                    continue
                master[i][k] = None
                updated = ShardedArray(mesh, *spec_w[:3], data, label=spec_w[3], category="optimizer")
                kept.append(updated)
                params[i][k] = None  # the gather below refills it
                sliced[k] = cast(updated, prec.compute, category="params", label=spec_w[3])
            if gather is not None:
                sliced = gather(ctx, sliced)  # 3. AllGather the updated weights
            new_w.append({**{k: _local(v) for k, v in sliced.items()}, **local_w})
            new_master.append(mastered)
            new_m.append(mine)
        return new_w, new_master, new_m

    # -- one step ---------------------------------------------------------------------------
    def __call__(self, x: Any, target: Any) -> StepResult:
        t = self.trainer
        check_alive(t)  # the program runs on devices the failed chips do not stand for: refuse first
        dtype, state_dtype = t.precision.compute, t.precision.state_dtype
        x, target = np.asarray(x, dtype), np.asarray(target, dtype)
        key = (x.shape, target.shape)
        ledger = self.mesh.memory
        if key != self._key:  # trace once per input shape; the trace and the ledger are read then
            self._fn, self._key = self._program(x, target), key
            ledger.reset_peak()
            with trace() as self._trace:
                self._fn = self._fn.lower(*self._arguments(x, target)).compile()
            self._stats["peak"] = ledger.snapshot()["peak"]
        new_w, new_master, new_m, total = self._fn(*self._arguments(x, target))
        for i, block in enumerate(new_w):  # the trainer's state is the step's result
            for k, v in block.items():
                label = t.params[i][k].label or k
                t.params[i][k] = place(host(v), t.mesh, t.layouts[k], dtype, label, "params")
                if t.precision.mixed:
                    t.master[i][k] = place(
                        np.asarray(new_master[i][k]), t.mesh, t.state_layouts[k], state_dtype, label, "optimizer"
                    )
                for s, m in new_m[i][k].items():
                    t.moments[i][k][s] = place(
                        np.asarray(m), t.mesh, t.state_layouts[k], state_dtype, label, "optimizer"
                    )
        t.step_count += 1
        stats = self._stats
        layouts = {
            "x": t.layouts["x"],
            **{k: str(v.layout) for k, v in t.params[0].items()},
            "out": t.layouts["out"],
            **{f"d{k}": v for k, v in stats["grad_layouts"].items()},
            **{f"opt_{k}": str(Layout.parse(v, t.mesh.axis_names)) for k, v in t.state_layouts.items()},
        }
        return StepResult(
            scheme=t.scheme.name,
            mesh=t.mesh,
            step=t.step_count,
            loss=float(np.asarray(total)) / math.prod(target.shape),
            trace=self._trace,
            memory=stats["peak"],
            model_state=stats["model_state"],
            stored_activations=stats["stored"],
            layouts=layouts,
            axes=dict(t.axes),
        )

    def _arguments(self, x: np.ndarray, target: np.ndarray) -> tuple[Any, ...]:
        t = self.trainer
        put, prec = self._put, t.precision
        weights = [{k: put(v.to_global(), t.layouts[k], prec.compute) for k, v in block.items()} for block in t.params]
        masters = [
            {k: put(v.to_global(), t.state_layouts[k], prec.state_dtype) for k, v in block.items()}
            for block in t.master
        ]
        moments = [
            {
                k: {s: put(m.to_global(), t.state_layouts[k], prec.state_dtype) for s, m in slots.items()}
                for k, slots in block.items()
            }
            for block in t.moments
        ]
        # the step's numbers are an input, so one compiled program serves every step
        factors = np.asarray(t.optimizer.factors(t.step_count + 1), prec.state_dtype)
        x_, t_ = put(x, t.layouts["x"], prec.compute), put(target, t.layouts["out"], prec.compute)
        return weights, masters, moments, x_, t_, put(factors, "[N]", prec.state_dtype)


def _value(
    mesh: Mesh, block: Any, layout: str, shape: tuple[int, ...], label: str | None, category: str
) -> ShardedArray:
    """A device's local ``block`` (inside the program) as a ShardedArray of global ``shape`` on ``mesh``."""
    data = block.reshape((1,) * len(mesh.shape) + tuple(block.shape))
    return ShardedArray(mesh, Layout.parse(layout), shape, np.dtype(block.dtype), data, label=label, category=category)


def _local(v: ShardedArray) -> Any:
    """The device's local block of ``v`` (inside the program)."""
    return v.compact().reshape(v.local_shape)


def check_alive(t: TrainerState) -> None:
    """Raise ChipFailureError, as the NumPy trainer's first collective does, if a chip of the mesh has failed.

    Every supported step runs collectives in which every chip takes part (SPMD), so one failed
    chip fails the step; the jitted program would not notice, its devices do not fail.
    """
    mesh = t.mesh
    if not mesh.failed:
        return
    _, who = failed_chips(mesh)
    raise ChipFailureError(
        f"Trainer(engine='jax') step {t.step_count + 1} ({t.scheme.name} on {mesh}) cannot run: {who} failed, "
        "and every chip takes part in the step's collectives. Restore from a checkpoint onto a mesh without "
        "it (shardsim.checkpoint.load), or mesh.heal() once it is back."
    )


def host(v: Any) -> np.ndarray:
    """A device array as NumPy; 16-bit floats (an ml_dtypes dtype, not a NumPy kind) as their exact
    float32 values, which the trainer rounds back when it places them."""
    a = np.asarray(v)
    return a.astype(np.float32) if a.dtype.kind == "V" else a
