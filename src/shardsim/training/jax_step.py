"""A training step on the JAX engine: forward, loss, backward, gradient reduction and update, one jitted program.

``Trainer(..., engine="jax")`` keeps its weights and optimizer state as every trainer does
(the scheme's layouts and the stage's state layouts); each :meth:`~Trainer.step` places
them on the JAX mesh with those ``NamedSharding``\\ s and runs the jitted step: the scheme's
own forward and backward inside ``jax.shard_map``, the gradients reduced, every chip
updating the optimizer state it holds, and under ZeRO-1/2 the AllGather of the updated
weights. The trace and the ledger are those recorded when the step was first traced (the
program is the same every step). Supported: ddp, fsdp, tp, fsdp_tp and the ZeRO stages, in
the params' own dtype (no mixed precision or loss scaling yet).

>>> import numpy as np, shardsim
>>> from shardsim.training import SGD, Trainer
>>> t = Trainer("zero2", shardsim.Mesh(X=2), shardsim.mlp.init(8, 16), SGD(lr=0.1), engine="jax")
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
from ..activations import namespace
from ..array import ShardedArray
from ..errors import EngineError
from ..layout import Layout
from ..mesh import Mesh
from ..strategies.runner import backward_stack, forward_stack, reduce_gradients
from ..tracing import Trace, phase, trace
from .loss import mse_terms
from .optim import SGD, Adam

if TYPE_CHECKING:
    from .trainer import StepResult, Trainer

SUPPORTED = ("ddp", "fsdp", "tp", "fsdp_tp", "zero1", "zero2", "zero3")


class JaxStep:
    """The jitted step of one :class:`~shardsim.training.Trainer` (built on its first call)."""

    def __init__(self, trainer: Trainer) -> None:
        from ..engines.jax.placement import meshes  # the engine's errors if JAX is missing or too small

        name = trainer.scheme.name
        if name not in SUPPORTED:
            raise EngineError(
                f"Trainer(engine='jax') runs {list(SUPPORTED)}, not {name!r}; use engine='numpy' (docs/engines.md)"
            )
        prec = trainer.precision
        if prec.mixed or prec.reduce != prec.compute or prec.dynamic is not None or prec.initial_scale != 1:
            raise EngineError(
                "Trainer(engine='jax') computes in the params' own dtype: no master weights, reduce_dtype or "
                "loss scaling yet; drop precision=/reduce_dtype=/loss_scale= or use engine='numpy'"
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
        from .trainer import state_slice

        t = self.trainer
        mesh, scheme, ctx, opt = self.mesh, t.scheme, t.ctx, t.optimizer
        nm, lay, state_lay = len(mesh.shape), t.layouts, t.state_layouts
        shapes = [{k: v.global_shape for k, v in block.items()} for block in t.params]
        dtype = t.precision.compute
        stats = self._stats
        gather = getattr(scheme, "gather_params", None)

        def value(block: Any, layout: str, shape: tuple[int, ...], label: str | None, category: str) -> ShardedArray:
            data = block.reshape((1,) * nm + tuple(block.shape))
            return ShardedArray(mesh, Layout.parse(layout), shape, np.dtype(block.dtype), data, label=label,
                                category=category)

        def local(v: ShardedArray) -> Any:
            return v.compact().reshape(v.local_shape)

        def body(weights: list, moments: list, xb: Any, tb: Any, factors: Any) -> tuple[list, list, Any]:
            with engines.use(JAX):
                params = [
                    {k: value(b[k], lay[k], shapes[i][k], t.params[i][k].label, "params") for k in t.names}
                    for i, b in enumerate(weights)
                ]
                moms = [
                    {k: {s: value(m[k][s], state_lay[k], shapes[i][k], None, "optimizer") for s in m[k]}
                     for k in t.names}
                    for i, m in enumerate(moments)
                ]
                xs = value(xb, lay["x"], x.shape, "In", "activations")
                with phase("forward"):
                    out, saved = forward_stack(scheme, ctx, xs, params, residual=t.residual, recompute=t.recompute)
                del xs
                stats["stored"] = mesh.memory.live("activations")
                ts = value(tb, lay["out"], target.shape, "Target", "activations")
                with phase("loss"):
                    total, dout = mse_terms(out, ts)
                loss = local(total)
                del out, ts, total
                hand_over = [dout]  # so the backward pass holds the only reference and frees it
                del dout
                with phase("backward"):
                    dx, grads = backward_stack(
                        scheme, ctx, saved, hand_over.pop(), params, residual=t.residual, recompute=t.recompute
                    )
                    del dx
                stats["model_state"] = {c: mesh.memory.live(c) for c in ("params", "grads", "optimizer")}
                new_w: list[dict[str, Any]] = []
                new_m: list[dict[str, Any]] = []
                with phase("optimizer"):
                    for i in range(len(grads)):
                        g = reduce_gradients(scheme, ctx, grads[i])
                        stats["grad_layouts"] = {k: str(v.layout) for k, v in g.items()}
                        sliced, mine = {}, {}
                        for k in t.names:
                            w = state_slice(params[i][k], state_lay[k])
                            state = {s: m.compact() for s, m in moms[i][k].items()}
                            data, state = updated(opt, w.compact(), g.pop(k).compact(), state, factors)
                            spec_w = (w.layout, w.global_shape, w.dtype, w.label, w.local_shape)
                            del w
                            params[i][k] = None  # type: ignore[assignment]  # updated in place, as on NumPy
                            sliced[k] = ShardedArray(mesh, *spec_w[:3], data, label=spec_w[3], category="params")
                            mine[k] = {s: v.reshape(spec_w[4]) for s, v in state.items()}
                        if gather is not None:
                            sliced = gather(ctx, sliced)  # 3. AllGather the updated weights
                        new_w.append({k: local(v) for k, v in sliced.items()})
                        new_m.append(mine)
            return new_w, new_m, loss

        spec = lambda layout: sharding(self.jmesh, layout).spec  # noqa: E731
        w_specs = [{k: spec(lay[k]) for k in t.names} for _ in t.params]
        m_specs = [{k: {s: spec(state_lay[k]) for s in opt.slots} for k in t.names} for _ in t.params]
        in_specs = (w_specs, m_specs, spec(lay["x"]), spec(lay["out"]), spec("[N]"))
        out_specs = (w_specs, m_specs, jax.sharding.PartitionSpec())  # the loss: one number, on every chip
        self._put = lambda a, layout: put(np.asarray(a, dtype), sharding(self.jmesh, layout))
        mapped = jax.shard_map(body, mesh=self.jmesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
        return jax.jit(mapped)

    # -- one step ---------------------------------------------------------------------------
    def __call__(self, x: Any, target: Any) -> StepResult:
        from .trainer import StepResult, _place

        t = self.trainer
        dtype = t.precision.compute
        x, target = np.asarray(x, dtype), np.asarray(target, dtype)
        key = (x.shape, target.shape)
        ledger = self.mesh.memory
        if key != self._key:  # trace once per input shape; the trace and the ledger are read then
            self._fn, self._key = self._program(x, target), key
            ledger.reset_peak()
            with trace() as self._trace:
                self._fn = self._fn.lower(*self._arguments(x, target)).compile()
            self._stats["peak"] = ledger.snapshot()["peak"]
        new_w, new_m, total = self._fn(*self._arguments(x, target))
        for i, block in enumerate(new_w):  # the trainer's state is the step's result
            for k, v in block.items():
                old = t.params[i][k]
                t.params[i][k] = _place(np.asarray(v), t.mesh, t.layouts[k], dtype, old.label or k, "params")
                for s, m in new_m[i][k].items():
                    t.moments[i][k][s] = _place(
                        np.asarray(m), t.mesh, t.state_layouts[k], t.precision.state_dtype, old.label or k, "optimizer"
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
        put = self._put
        weights = [{k: put(v.to_global(), t.layouts[k]) for k, v in block.items()} for block in t.params]
        moments = [
            {k: {s: put(m.to_global(), t.state_layouts[k]) for s, m in slots.items()} for k, slots in block.items()}
            for block in t.moments
        ]
        step = t.step_count + 1
        factors = np.asarray(bias_factors(t.optimizer, step), t.precision.state_dtype)
        return weights, moments, put(x, t.layouts["x"]), put(target, t.layouts["out"]), put(factors, "[N]")


def bias_factors(opt: SGD | Adam, step: int) -> list[float]:
    """Adam's step-dependent numbers at ``step`` (``1/sqrt(1 - b2^t)``, ``lr / (1 - b1^t)``), as
    :meth:`~shardsim.training.Adam.update` computes them; SGD has none (a placeholder pair)."""
    if isinstance(opt, Adam):
        return [1.0 / math.sqrt(1.0 - opt.b2**step), opt.lr / (1.0 - opt.b1**step)]
    return [0.0, 0.0]


def updated(opt: SGD | Adam, w: Any, g: Any, state: dict[str, Any], factors: Any) -> tuple[Any, dict[str, Any]]:
    """The optimizer's update out of place, for arrays that cannot change in place (JAX's).

    The same operations in the same order as :meth:`SGD.update` / :meth:`Adam.update` (which
    work in place on NumPy blocks); ``factors`` are :func:`bias_factors` of the step.
    """
    g = g.astype(w.dtype)
    if isinstance(opt, SGD):
        if opt.weight_decay:
            g = g + opt.weight_decay * w
        if opt.momentum:
            state = {"momentum": state["momentum"] * opt.momentum + g}
            g = state["momentum"]
        return w - opt.lr * g, state
    if opt.weight_decay and not opt.decoupled:
        g = g + opt.weight_decay * w
    m = state["m"] * opt.b1 + (1.0 - opt.b1) * g
    v = state["v"] * opt.b2 + (g * g) * (1.0 - opt.b2)
    denom = namespace(v).sqrt(v) * factors[0] + opt.eps
    if opt.weight_decay and opt.decoupled:
        w = w * (1.0 - opt.lr * opt.weight_decay)
    return w - (m / denom) * factors[1], {"m": m, "v": v}
