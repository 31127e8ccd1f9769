"""A transformer's training step on the JAX engine: ``run_model``'s step, then the optimizer update, one jitted program.

``Trainer(cfg, plan, mesh, params, optimizer, engine="jax")`` keeps its state as every
trainer does (the weights in the plan's storage layouts, the masters and moments in the
state's); each :meth:`~shardsim.training.Trainer.step` places them on the JAX mesh with
those ``NamedSharding``\\ s and runs one jitted ``shard_map`` program: the transformer's own
step on each device's blocks (:class:`~shardsim.transformer.on_device.DeviceStep`), then
every chip's update of the state it holds with the optimizer's own
:meth:`~shardsim.training.Adam.apply` and, under ZeRO-1/2, the AllGather of the updated
slices. The trace and the ledger are recorded when the program is first traced; the step's
numbers (the optimizer's bias corrections) are an input, so one compiled program serves
every step of a run without dropout (with dropout each step's masks are its own constants).

>>> import numpy as np
>>> from shardsim.models import get, reference
>>> from shardsim.plans import Plan
>>> from shardsim.training import Trainer
>>> cfg, plan = get("gpt-tiny"), Plan(dp=2, zero=1)
>>> t = Trainer(cfg, plan, plan.mesh(), reference.init(cfg), "adam", engine="jax")
>>> tok = np.arange(16, dtype=np.int32).reshape(2, 8)
>>> r = t.step(tok, (tok + 1) % cfg.vocab)
>>> r.step, sorted({op for op, _ in r.trace.collectives("optimizer")})
(1, ['all_gather'])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import engines
from ..array import ShapeDtype, ShardedArray
from ..collectives import all_gather
from ..errors import EngineError
from ..layout import Layout
from ..mesh import Mesh
from ..ops import cast
from ..tracing import Trace, phase, trace
from ..transformer import context_parallel
from ..transformer.embedding import LOSS_PARTS, mean_loss
from ..transformer.on_device import DeviceStep, device_value, local_block, probe
from ..transformer.placement import place_tokens
from .jax_step import check_alive, host
from .model_step import gradient_reductions, step_dropout_seed
from .result import MODEL_STATE, StepResult
from .state import owned
from .update import state_slice

if TYPE_CHECKING:
    from .held import TrainerState


class JaxModelStep:
    """The jitted step of one transformer :class:`~shardsim.training.Trainer` (built on its first call)."""

    def __init__(self, trainer: TrainerState) -> None:
        from ..engines.jax.placement import meshes  # the engine's errors if JAX is missing or too small

        assert trainer.plan is not None
        if trainer.plan.pp > 1:
            raise EngineError(
                "Trainer(engine='jax') does not run pipeline parallelism (pp > 1) yet: use engine='numpy', or "
                "shardsim.engines.jax.run_model for the step's gradients (docs/engines.md)"
            )
        self.trainer = trainer
        self.jmesh = meshes(trainer.mesh)[0]
        # the program's values live on a twin of the trainer's mesh: its ledger holds exactly what
        # one step holds (weights, state, activations), as the trainer's own ledger does on NumPy
        self.mesh = Mesh(dict(zip(trainer.mesh.axis_names, trainer.mesh.shape)))
        names = trainer.mesh.axis_names  # the state's layouts, spelt so they parse without the mesh
        self.state_layouts = {k: str(Layout.parse(v, names)) for k, v in trainer.state_layouts.items()}
        self._fn: Any = None
        self._key: Any = None
        self._trace = Trace()
        self._stats: dict[str, Any] = {}

    # -- the program ------------------------------------------------------------------------
    def _program(self, shape: tuple[int, ...], ids: np.dtype, seed: int | None) -> Any:
        import jax

        from ..engines.jax.kernels import JAX
        from ..engines.jax.placement import put, sharding

        t, mesh, stats = self.trainer, self.mesh, self._stats
        assert t.plan is not None
        prec, opt, state_lay = t.precision, t.optimizer, self.state_layouts
        layouts = {k: str(v.layout) for k, v in t.params.items()}
        layouts["tokens"] = str(place_tokens(t.mesh, t.roles, ShapeDtype(shape, ids), "tokens").layout)
        shapes = {k: v.global_shape for k, v in t.params.items()} | {"tokens": shape}
        plan = t.plan.replace(precision=None)  # the weights come in the compute dtype
        laid = probe(t.cfg, plan, mesh, shapes, {k: prec.compute for k in t.params} | {"tokens": ids})

        def body(weights: dict, masters: dict, moments: dict, tok: Any, tgt: Any, factors: Any) -> tuple:
            with engines.use(JAX), gradient_reductions(t):
                step = DeviceStep(t.cfg, plan, mesh, weights, tok, tgt, laid=laid, shapes=shapes, dropout_seed=seed)

                def state(k: str, b: Any, dtype: np.dtype, label: str) -> ShardedArray:
                    return device_value(mesh, b, state_lay[k], shapes[k], dtype, label, "optimizer")

                master = {k: state(k, b, prec.state_dtype, k) for k, b in masters.items()}
                moms = {
                    k: {s: state(k, b, prec.moment_dtype, f"{s}.{k}") for s, b in m.items()} for k, m in moments.items()
                }
                stepped = step.run()
                stats["stored"] = sum(stepped.stored, np.zeros(mesh.shape, np.int64))
                stats["model_state"] = {c: mesh.memory.live(c) for c in MODEL_STATE}
                grads = {k: step.grads.done[k] for k in t.params}  # updated in the weights' order, as on NumPy
                stats["grad_layouts"] = {k: str(v.layout) for k, v in grads.items()}
                held = step.step.weights  # the step's own dict: emptied, so the update holds the only references
                params = {k: held.pop(k) for k in list(held)}
                step.params = {}
                step.grads.done.clear()
                with phase("optimizer"):
                    new = self._update(params, master, moms, grads, factors)
                return (*new, step.loss_parts())

        spec = lambda layout: sharding(self.jmesh, layout).spec  # noqa: E731
        w_specs = {k: spec(layouts[k]) for k in t.params}
        master_specs = {k: spec(state_lay[k]) for k in t.master}
        m_specs = {k: {s: spec(state_lay[k]) for s in opt.slots} for k in t.params}
        tok_spec = spec(layouts["tokens"])
        parts = {k: spec(laid.layouts[k]) for k in LOSS_PARTS}
        in_specs = (w_specs, master_specs, m_specs, tok_spec, tok_spec, spec("[N]"))
        out_specs = (w_specs, master_specs, m_specs, parts)
        self._put = lambda a, layout, dtype: put(np.asarray(a, dtype), sharding(self.jmesh, layout))
        self.factors_sharding = sharding(self.jmesh, "[N]")
        self._tokens_layout = layouts["tokens"]
        mapped = jax.shard_map(body, mesh=self.jmesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
        return jax.jit(mapped)

    def _update(
        self, params: dict[str, Any], master: dict[str, Any], moms: dict[str, Any], grads: dict[str, Any], factors: Any
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """Inside the program: every chip updates the state it holds (:func:`~.update.update_weight`'s
        order), and under ZeRO-1/2 the updated slices are AllGathered; the new weights, masters
        and moments come back as each chip's blocks."""
        t, prec, opt, state_lay = self.trainer, self.trainer.precision, self.trainer.optimizer, self.state_layouts
        new_w: dict[str, Any] = {}
        new_master: dict[str, Any] = {}
        new_m: dict[str, Any] = {}
        for k in list(grads):
            w = params[k]
            target = master[k] if prec.mixed else state_slice(w, state_lay[k])
            g = state_slice(grads.pop(k), state_lay[k])
            state = {s: m.compact() for s, m in moms[k].items()}
            data, state = opt.apply(target.compact(), g.compact(), state, factors)
            del g
            new_m[k] = {s: v.reshape(target.local_shape) for s, v in state.items()}
            if prec.mixed:
                new_master[k] = data.reshape(target.local_shape)
            if not t.gathers:
                new_w[k] = data.astype(prec.compute).reshape(w.local_shape)
                continue
            assert t.data_axis is not None
            sent = ShardedArray(w.mesh, target.layout, target.global_shape, target.dtype, data, label=k,
                                category="optimizer" if prec.mixed else "temporaries")  # fmt: skip
            if prec.mixed:  # the 16-bit copy of the updated master slice is what travels
                sent = cast(sent, w.dtype, category="temporaries", label=k)
            del target, w
            params[k] = None
            new_w[k] = local_block(all_gather(sent, t.data_axis, label=k, category="params"))
            del sent
        return new_w, new_master, new_m

    # -- one step ---------------------------------------------------------------------------
    def _checked(self, tokens: Any, targets: Any) -> tuple[np.ndarray, np.ndarray, int | None]:
        """The ids checked against the model and plan, in JAX's dtype, and the step's dropout seed."""
        from ..engines.jax.placement import id_dtype
        from ..transformer import checks

        t = self.trainer
        assert t.plan is not None
        tokens, targets = np.asarray(tokens), np.asarray(targets)
        checks.check_tokens(t.cfg, t.plan, tokens, targets)
        checks.check_model(t.cfg, t.plan, tokens.shape[1])
        ids = id_dtype(tokens.dtype)
        seed = None if t.dropout_seed is None else step_dropout_seed(t.dropout_seed, t.step_count + 1)
        return tokens.astype(ids), targets.astype(ids), seed

    def compiled(self, tokens: Any, targets: Any) -> tuple[Any, tuple[Any, ...]]:
        """``(fn, args)``: the jitted step for ids like ``tokens`` and the trainer's state placed as its
        arguments, ``fn(weights, masters, moments, tokens, targets, factors) -> (weights, masters,
        moments, loss parts)`` (``factors``: the optimizer's ``factors(step)``)."""
        tokens, targets, seed = self._checked(tokens, targets)
        fn = self._program(tokens.shape, tokens.dtype, seed)
        return fn, self._arguments(tokens, targets)

    def __call__(self, tokens: Any, targets: Any) -> StepResult:
        t = self.trainer
        check_alive(t)
        tokens, targets, seed = self._checked(tokens, targets)
        ids = tokens.dtype
        key = (tokens.shape, seed)
        ledger = self.mesh.memory
        if key != self._key:  # trace once per input shape (and dropout masks); the trace and ledger are read then
            self._fn, self._key = self._program(tokens.shape, ids, seed), key
            ledger.reset_peak()
            with trace() as self._trace:
                self._fn = self._fn.lower(*self._arguments(tokens, targets)).compile()
            self._stats["peak"] = ledger.snapshot()["peak"]
        new_w, new_master, new_m, parts = self._fn(*self._arguments(tokens, targets))
        prec = t.precision
        for k, v in new_w.items():  # the trainer's state is the step's result
            t.params[k] = own(v, t.params[k], prec.compute, "params")
            if prec.mixed:
                t.master[k] = own(new_master[k], t.master[k], prec.state_dtype, "optimizer")
            for s, m in new_m[k].items():
                t.moments[k][s] = own(m, t.moments[k][s], prec.moment_dtype, "optimizer")
        t.step_count += 1
        stats, names, plan = self._stats, t.mesh.axis_names, t.plan
        assert plan is not None
        layouts = {
            **{k: str(v.layout) for k, v in t.params.items()},
            **{f"d{k}": v for k, v in stats["grad_layouts"].items()},
            **{f"opt_{k}": str(Layout.parse(v, names)) for k, v in t.state_layouts.items()},
        }
        return StepResult(
            scheme=str(t.plan),
            mesh=t.mesh,
            step=t.step_count,
            loss=mean_loss(*(np.asarray(parts[k]) for k in LOSS_PARTS)),
            trace=self._trace,
            memory=stats["peak"],
            model_state=stats["model_state"],
            stored_activations=stats["stored"],
            layouts=layouts,
            axes=dict(plan.axes()),
        )

    def _arguments(self, tokens: np.ndarray, targets: np.ndarray) -> tuple[Any, ...]:
        t, put, prec = self.trainer, self._put, self.trainer.precision
        weights = {k: put(v.to_global(), str(v.layout), prec.compute) for k, v in t.params.items()}
        lay = self.state_layouts
        masters = {k: put(v.to_global(), lay[k], prec.state_dtype) for k, v in t.master.items()}
        moments = {
            k: {s: put(m.to_global(), lay[k], prec.moment_dtype) for s, m in slots.items()}
            for k, slots in t.moments.items()
        }
        factors = np.asarray(t.optimizer.factors(t.step_count + 1), prec.state_dtype)
        ids = self._tokens_layout
        if t.roles.context is not None:  # the sequence in its context-parallel order, as run_model puts it
            assert t.plan is not None
            rows = context_parallel.order(tokens.shape[1], t.plan.cp, balanced=t.plan.cp_balanced)
            tokens, targets = context_parallel.permuted(tokens, rows), context_parallel.permuted(targets, rows)
        return (
            weights,
            masters,
            moments,
            put(tokens, ids, tokens.dtype),
            put(targets, ids, targets.dtype),
            put(factors, "[N]", prec.state_dtype),
        )


def own(block: Any, old: ShardedArray, dtype: np.dtype, category: str) -> ShardedArray:
    """A device array (the step's new value) as the trainer's value in ``old``'s place: its layout and label."""
    from ..transformer.placement import place_value

    label = old.label or ""
    mesh, layout = old.mesh, str(old.layout)
    del old
    return owned(place_value(mesh, host(block), layout, label, dtype, category), label, category)
