"""The transformer's training step under a plan as one ``jax.shard_map`` program, and its run.

The step is :func:`shardsim.run_model`'s own code (:class:`~shardsim.transformer.run.ModelStep`):
inside ``shard_map`` each weight and each token block becomes a
:class:`~shardsim.ShardedArray` holding the device's block, every op and collective runs on
:data:`~shardsim.engines.jax.kernels.JAX`, and the trace and the ledger are filled while JAX
traces the program. A shape-only run of the same step on the stacked engine lays the values
out first (the weights' storage layouts, the gradients' and the loss parts') and runs every
check of the front end before JAX sees anything.

The loss is the mean of the cross-entropy's per-token parts, which the program returns in
their layouts; :func:`run_model` reads it on the host, as the stacked engine does, and the
jitted function of :func:`compile_model` reduces them over the global arrays after the
``shard_map``.

>>> import numpy as np, shardsim
>>> from shardsim.engines.jax import run_model
>>> from shardsim.models import TransformerConfig, reference
>>> cfg = TransformerConfig(layers=1, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)
>>> p = reference.init(cfg, seed=0)
>>> tok = np.arange(8).reshape(2, 4)
>>> r = run_model(cfg, "dp=2,tp=2,sp", shardsim.Mesh(data=2, model=2), p, tok, tok)
>>> bool(np.isclose(r.loss, reference.loss(cfg, p, tok, tok), atol=1e-5))
True
>>> r.trace.collectives("forward")[:2]  # SP: the embedding's sum scattered over the sequence, gathered for QKV
[('reduce_scatter', ('model',)), ('all_gather', ('model',))]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ... import engines
from ...array import ShapeDtype
from ...errors import EngineError
from ...layout import Layout
from ...mesh import Mesh
from ...models import TransformerConfig
from ...plans import Plan
from ...strategies.result import RunResult
from ...strategies.stack import Stepped
from ...transformer import checks, context_parallel
from ...transformer.embedding import LOSS_PARTS, mean_loss
from ...transformer.on_device import DeviceStep, Laid, local_block, probe, run_pipelined_on_device
from ...transformer.result import model_result
from ...transformer.roles import Roles
from ...transformer.run import check_step
from .kernels import JAX
from .placement import check_dtype, fetch, id_dtype, meshes, put, sharding


@dataclass(frozen=True)
class ModelProgram:
    """A transformer step laid out on a JAX mesh: what :func:`compile_model` builds and :func:`run_model` runs.

    ``laid`` holds every weight's storage layout (by the reference's key), the tokens' (the
    targets' too), each gradient's (``d`` + key) and each loss part's (:data:`LOSS_PARTS`).
    """

    cfg: TransformerConfig
    plan: Plan
    jmesh: jax.sharding.Mesh
    mesh: Mesh
    laid: Laid
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, np.dtype]
    dropout_seed: int | None = None

    @property
    def seq(self) -> int:
        return self.shapes["tokens"][1]


def plan_model(
    cfg: TransformerConfig,
    plan: Plan | str,
    mesh: Mesh | jax.sharding.Mesh,
    params: Mapping[str, Any],
    tokens: Any,
    targets: Any,
    *,
    dropout_seed: int | None = None,
) -> ModelProgram:
    """Check everything and lay the step out, before any JAX tracing."""
    jmesh, smesh = meshes(mesh)
    plan, dropout_seed, _ = check_step(cfg, plan, smesh, params, tokens, targets, dropout_seed)
    if plan.pp > 1:
        checks.check_pipeline(cfg, plan, checks.shape_of(tokens)[0])
    dtypes = {k: check_dtype(k, v) for k, v in params.items()}
    for k in ("tokens", "targets"):  # ids below the vocabulary (checked) fit int32, JAX's default
        dtypes[k] = id_dtype(np.asarray(tokens if k == "tokens" else targets).dtype)
    inputs = {"tokens": tokens, "targets": targets, **params}
    shapes = {k: tuple(v.shape) if isinstance(v, ShapeDtype) else tuple(np.shape(v)) for k, v in inputs.items()}
    laid = probe(cfg, plan, smesh, shapes, dtypes)  # shape-only: the layouts, on a twin's ledger
    partial = [k for k in (*(f"d{k}" for k in params), *LOSS_PARTS) if Layout.parse(laid.layouts[k]).partial]
    if partial:
        raise EngineError(f"{plan}: results {partial} of the step are unreduced partial sums")
    return ModelProgram(cfg, plan, jmesh, smesh, laid, shapes, dtypes, dropout_seed)


def program_fn(prog: ModelProgram, recorded: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The ``shard_map``-ped ``fn(params, tokens, targets) -> (grads, loss parts)`` of global ``jax.Array``\\ s.

    Tracing it records the step's events in a :class:`~shardsim.strategies.stack.Stepped`
    (``recorded["stepped"]``, if ``recorded`` is given) and fills the mesh's ledger.
    """
    lay, keys = prog.laid.layouts, [k for k in prog.shapes if k not in ("tokens", "targets")]
    micro = prog.plan.microbatches if prog.plan.pp > 1 else 1

    def body(params: dict[str, Any], tokens: Any, targets: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        with engines.use(JAX):
            if prog.plan.pp > 1:
                stepped, done, parts = run_pipelined_on_device(
                    prog.cfg, prog.plan, prog.mesh, params, tokens, targets,
                    laid=prog.laid, shapes=prog.shapes, dropout_seed=prog.dropout_seed,
                )  # fmt: skip
            else:
                step = DeviceStep(
                    prog.cfg, prog.plan, prog.mesh, params, tokens, targets,
                    laid=prog.laid, shapes=prog.shapes, dropout_seed=prog.dropout_seed,
                )  # fmt: skip
                stepped, done, parts = step.run(), step.grads.done, [step.loss_parts()]
            if recorded is not None:
                recorded["stepped"] = stepped
            return {k: local_block(done[k]) for k in keys}, parts

    spec = lambda layout: sharding(prog.jmesh, layout).spec  # noqa: E731
    in_specs = ({k: spec(lay[k]) for k in keys}, spec(lay["tokens"]), spec(lay["tokens"]))
    out_specs = ({k: spec(lay[f"d{k}"]) for k in keys}, [{k: spec(lay[k]) for k in LOSS_PARTS}] * micro)
    return jax.shard_map(body, mesh=prog.jmesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def arguments(prog: ModelProgram, params: Mapping[str, Any], tokens: Any, targets: Any) -> tuple[Any, ...]:
    """``(params, tokens, targets)`` as global ``jax.Array``\\ s with the plan's ``NamedSharding``\\ s (each
    weight in its storage layout, in its own dtype: the program casts it to the compute dtype)."""
    lay, plan = prog.laid.layouts, prog.plan
    weights = {k: put(np.asarray(v), sharding(prog.jmesh, lay[k])) for k, v in params.items()}
    where = sharding(prog.jmesh, lay["tokens"])
    ids = np.asarray(tokens, prog.dtypes["tokens"]), np.asarray(targets, prog.dtypes["targets"])
    if Roles.of(plan, prog.cfg.n_kv).context is not None:  # the sequence in its context-parallel order
        rows = context_parallel.order(prog.seq, plan.cp, balanced=plan.cp_balanced)
        ids = tuple(context_parallel.permuted(v, rows) for v in ids)
    return weights, put(ids[0], where), put(ids[1], where)


def device_loss(parts: Mapping[str, Any]) -> Any:
    r""":func:`~shardsim.transformer.embedding.mean_loss` of the loss parts as global ``jax.Array``\ s."""
    z, largest, target = (parts[k] for k in LOSS_PARTS)
    return jnp.mean(jnp.log(z[..., 0]) + largest[..., 0] - target)


def compile_model(
    cfg: TransformerConfig,
    plan: Plan | str,
    mesh: Mesh | jax.sharding.Mesh,
    params: Mapping[str, Any],
    tokens: Any,
    targets: Any,
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``(fn, args)``: the step's forward and backward as a jitted JAX function, and its arguments.

    ``fn(params, tokens, targets)`` returns ``(loss, grads)``: the mean cross-entropy (a scalar)
    and each weight's gradient (the reference's keys) as global ``jax.Array``\\ s in the plan's
    gradient layouts; ``args`` are the inputs placed with the plan's ``NamedSharding``\\ s.

    >>> import numpy as np, shardsim
    >>> from shardsim.engines.jax import compile_model
    >>> from shardsim.models import TransformerConfig, reference
    >>> cfg = TransformerConfig(layers=1, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)
    >>> tok = np.arange(8).reshape(2, 4)
    >>> fn, args = compile_model(cfg, "dp=2,zero=3", shardsim.Mesh(data=2), reference.init(cfg), tok, tok)
    >>> loss, grads = fn(*args)
    >>> grads["layers.0.mlp.w_in"].sharding.spec, loss.shape
    (P('data', None), ())
    """
    prog = plan_model(cfg, plan, mesh, params, tokens, targets)
    mapped = program_fn(prog)

    def step(params: dict[str, Any], tokens: Any, targets: Any) -> tuple[Any, dict[str, Any]]:
        grads, parts = mapped(params, tokens, targets)
        return jnp.mean(jnp.stack([device_loss(p) for p in parts])), grads  # microbatches of one size

    return jax.jit(step), arguments(prog, params, tokens, targets)


def compile_step(
    cfg: TransformerConfig,
    plan: Plan | str,
    mesh: Mesh,
    optimizer: Any,
    params: Mapping[str, Any],
    tokens: Any,
    targets: Any,
    **options: Any,
) -> tuple[Callable[..., Any], tuple[Any, ...], Callable[[int], Any]]:
    r"""``(step, state, factors)``: the whole training step as a jitted JAX function, its first state, and
    the optimizer's numbers of step ``n`` — for a JAX training loop.

    ``step(state, tokens, targets, factors(n)) -> (state, loss)``: the forward, the loss, the
    backward, the gradient reductions and every chip's update of the optimizer state it holds
    (ZeRO-1/2: the AllGather of the new slices), as :class:`~shardsim.training.Trainer` with
    ``engine="jax"`` runs it. ``state`` is ``(weights, masters, moments)`` of global
    ``jax.Array``\ s in the plan's storage and state layouts (``masters`` empty unless mixed
    precision). ``options`` are the trainer's (``precision``, ``reduce_dtype``).

    >>> import numpy as np, shardsim
    >>> from shardsim.engines.jax import compile_step
    >>> from shardsim.models import get, reference
    >>> cfg, tok = get("gpt-tiny"), np.arange(16, dtype=np.int32).reshape(2, 8)
    >>> mesh, p = shardsim.Mesh(data=2), reference.init(cfg)
    >>> step, state, factors = compile_step(cfg, "dp=2,zero=1", mesh, "adam", p, tok, tok)
    >>> for n in (1, 2):
    ...     state, loss = step(state, tok, tok, factors(n))
    >>> state[2]["embed"]["m"].sharding.spec, loss.shape
    (P(None, 'data'), ())
    """
    from ...training import Trainer

    trainer = Trainer(cfg, plan, mesh, params, optimizer, engine="jax", **options)
    fn, args = trainer.engine_step.compiled(tokens, targets)
    weights, masters, moments, tok, _, _ = args
    fs = trainer.engine_step.factors_sharding

    cp = trainer.plan.cp if trainer.roles.context is not None else 1
    rows = context_parallel.order(np.shape(tokens)[1], cp, balanced=trainer.plan.cp_balanced)
    ids = tok.sharding

    @jax.jit
    def run(state: tuple[Any, ...], tokens: Any, targets: Any, factors: Any) -> tuple[tuple[Any, ...], Any]:
        w, m, mom, parts = fn(*state, tokens, targets, factors)
        return (w, m, mom), device_loss(parts)

    def step(state: tuple[Any, ...], tokens: Any, targets: Any, factors: Any) -> tuple[tuple[Any, ...], Any]:
        # each process places its own devices' ids, in the context-parallel order when there is one
        placed = (
            put(np.asarray(v, tok.dtype)[:, rows] if cp > 1 else np.asarray(v, tok.dtype), ids)
            for v in (tokens, targets)
        )
        return run(state, *placed, factors)  # type: ignore[no-any-return]

    def factors(n: int) -> Any:
        return put(np.asarray(trainer.optimizer.factors(n), trainer.precision.state_dtype), fs)

    return step, (weights, masters, moments), factors


def run_model(
    cfg: TransformerConfig,
    plan: Plan | str,
    mesh: Mesh | jax.sharding.Mesh,
    params: Mapping[str, Any],
    tokens: Any,
    targets: Any,
    *,
    dropout_seed: int | None = None,
) -> RunResult:
    """One forward and backward of the transformer under ``plan`` on JAX devices: the same result as
    :func:`shardsim.run_model` (loss, global gradients, trace, per-chip logical memory), with no
    ``sharded_grads`` (the values live on the devices).

    ``mesh`` is a shardsim :class:`~shardsim.Mesh` (placed on the first devices) or a
    ``jax.sharding.Mesh`` with the plan's axis names and sizes.
    """
    prog = plan_model(cfg, plan, mesh, params, tokens, targets, dropout_seed=dropout_seed)
    recorded: dict[str, Any] = {}
    fn = jax.jit(program_fn(prog, recorded))  # a new function each run: JAX traces it, and the trace is recorded
    grads, parts = fn(*arguments(prog, params, tokens, targets))
    stepped: Stepped = recorded["stepped"]
    return model_result(
        prog.cfg,
        prog.plan,
        prog.mesh,
        loss=float(np.mean([mean_loss(*(fetch(p[k]) for k in LOSS_PARTS)) for p in parts])),
        sharded_grads={},
        trace=stepped.trace,
        memory=stepped.memory,
        stored=stepped.stored,
        stored_values=stepped.stored_values,
        grads={k: fetch(v) for k, v in grads.items()},
        layouts={f"d{k}": prog.laid.layouts[f"d{k}"] for k in grads},
    )


__all__ = ["ModelProgram", "compile_model", "compile_step", "plan_model", "program_fn", "run_model"]
