"""A scheme's forward and backward as one ``jax.shard_map`` program, and its run.

The scheme module runs unchanged: inside ``shard_map`` each input becomes a
:class:`~shardsim.ShardedArray` whose data is the device's block, the ops and collectives
run on :data:`~shardsim.engines.jax.kernels.JAX`, and the trace and the ledger are filled
while JAX traces the program (the ledger is logical bytes per chip, as on every engine).
The layouts of the results, which ``shard_map`` needs before it traces, come from a
shape-only run of the same scheme on the stacked engine; that run also checks every input
with the front end's errors before JAX sees anything.

>>> import numpy as np, shardsim
>>> from shardsim.engines.jax import run_strategy
>>> p = shardsim.models.reference_mlp.init(8, 16)
>>> x = np.ones((4, 8), np.float32)
>>> r = run_strategy("fsdp_tp", shardsim.Mesh(X=2, Y=2), p, x, x)
>>> r.trace.collectives("forward")
[('all_gather', ('Y',)), ('all_gather', ('X',)), ('all_gather', ('X',)), ('reduce_scatter', ('Y',))]
>>> bool(np.allclose(r.out, shardsim.models.reference_mlp.forward(p, x), atol=1e-5))
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ... import engines, strategies
from ...array import ShapeDtype, ShardedArray
from ...errors import EngineError, MeshAxisError
from ...layout import Layout
from ...mesh import Mesh
from ...strategies.base import Ctx, Scheme
from ...strategies.result import StepMemory
from ...strategies.runner import StrategyResult, backward_stack, forward_stack, reduce_gradients, resolve_axes
from ...tracing import Trace, phase, trace
from .kernels import JAX
from .placement import check_dtype, fetch, meshes, put, sharding

SUPPORTED = ("ddp", "fsdp", "tp", "fsdp_tp", "tp_ln", "tp_sp", "ep", "dp_ep", "zero1", "zero2", "zero3")
"""The schemes the JAX engine runs; ``docs/engines.md`` says why the others do not, yet."""


@dataclass(frozen=True)
class Program:
    """A scheme laid out on a JAX mesh: what :func:`compile` builds and :func:`run_strategy` runs.

    ``layouts`` holds the layout of every input and result (``x``, ``w_in``, ``out``, ``dx``,
    ``dw_in``...), ``shapes`` and ``dtypes`` the global ones of the inputs.
    """

    scheme: Scheme
    ctx: Ctx
    jmesh: jax.sharding.Mesh
    mesh: Mesh
    layouts: dict[str, str]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, np.dtype]
    weights: tuple[str, ...]


def plan(
    name: str,
    mesh: Mesh | jax.sharding.Mesh,
    params: Mapping[str, Any],
    x: Any,
    dout: Any,
    *,
    activation: str = "identity",
    axes: Mapping[str, str] | None = None,
    options: Mapping[str, Any] | None = None,
) -> Program:
    """Check everything and lay the scheme out, before any JAX tracing."""
    scheme = strategies.get(name)
    if name not in SUPPORTED:
        raise EngineError(
            f"the JAX engine does not run {name!r} yet (docs/engines.md says why and what it needs); "
            f"it runs {list(SUPPORTED)}, and shardsim.run_strategy runs {name!r} on the stacked NumPy engine"
        )
    jmesh, smesh = meshes(mesh)
    try:
        chosen = resolve_axes(scheme, smesh, axes)
    except MeshAxisError as e:
        example = dict(zip(scheme.roles, smesh.axis_names))
        raise MeshAxisError(
            f"{e}. On a JAX mesh, map {name}'s roles {list(scheme.roles)} to its axes "
            f"{list(smesh.axis_names)}, e.g. axes={example}"
        ) from None
    inputs = {"x": x, "dout": dout, **params}
    dtypes = {k: check_dtype(k, v) for k, v in inputs.items()}
    shapes = {k: tuple(np.shape(v)) if not isinstance(v, ShapeDtype) else v.shape for k, v in inputs.items()}
    probe = strategies.run_strategy(  # shape-only: the result layouts, and every check of the front end
        name,
        Mesh(dict(zip(smesh.axis_names, smesh.shape))),
        {k: ShapeDtype(shapes[k], dtypes[k]) for k in params},
        ShapeDtype(shapes["x"], dtypes["x"]),
        ShapeDtype(shapes["dout"], dtypes["dout"]),
        activation=activation,
        axes=chosen,
        **dict(options or {}),
    )
    ctx = Ctx(axes=chosen, activation=activation, options=dict(options or {})).check()
    weights = tuple(k for k in scheme.layouts(ctx) if k not in ("x", "out"))
    layouts = dict(probe.layouts)
    if any(Layout.parse(layouts[k]).partial for k in ("out", "dx", *(f"d{w}" for w in weights))):
        raise EngineError(f"{name}: a result of the scheme is an unreduced partial sum ({layouts})")
    return Program(scheme, ctx, jmesh, smesh, layouts, shapes, dtypes, weights)


def program_fn(prog: Program, stats: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The jitted ``fn(params, x, dout) -> (out, grads)`` of global ``jax.Array``\\ s.

    ``grads`` has ``x`` and every weight. Tracing it (its first call, or ``jax.make_jaxpr``)
    records the scheme's events in the active traces; ``stats`` (if given) receives the
    per-chip bytes of the stored activations.
    """
    lay, weights, nm = prog.layouts, prog.weights, len(prog.mesh.shape)

    def value(block: Any, key: str, layout: str, label: str, category: str) -> ShardedArray:
        data = block.reshape((1,) * nm + tuple(block.shape))  # the stacked engine's indexing
        return ShardedArray(
            prog.mesh, Layout.parse(layout), prog.shapes[key], prog.dtypes[key], data, label=label, category=category
        )

    def local(v: ShardedArray) -> Any:
        return v.compact().reshape(v.local_shape)

    def body(params: dict[str, Any], x: Any, dout: Any) -> tuple[Any, dict[str, Any]]:
        with engines.use(JAX):
            xs = value(x, "x", lay["x"], "In", "activations")
            layer = {k: value(params[k], k, lay[k], k[0].upper() + k[1:], "params") for k in weights}
            with phase("forward"):
                out, saved = forward_stack(prog.scheme, prog.ctx, xs, [layer])
            if stats is not None:
                stats["activations"] = {
                    "In": xs.local_nbytes,
                    **{k: v.local_nbytes for k, v in saved[0].items()},
                    "Out": out.local_nbytes,
                }
            douts = value(dout, "dout", lay["out"], "dOut", "activations")
            with phase("backward"):
                dx, grads = backward_stack(prog.scheme, prog.ctx, saved, douts, [layer])
                grads = [reduce_gradients(prog.scheme, prog.ctx, g) for g in grads]
            return local(out), {"x": local(dx), **{k: local(g) for k, g in grads[0].items()}}

    spec = lambda layout: sharding(prog.jmesh, layout).spec  # noqa: E731
    in_specs = ({k: spec(lay[k]) for k in weights}, spec(lay["x"]), spec(lay["out"]))
    out_specs = (spec(lay["out"]), {"x": spec(lay["dx"]), **{k: spec(lay[f"d{k}"]) for k in weights}})
    mapped = jax.shard_map(body, mesh=prog.jmesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    return jax.jit(mapped)


def arguments(prog: Program, params: Mapping[str, Any], x: Any, dout: Any) -> tuple[Any, ...]:
    """``(params, x, dout)`` as global ``jax.Array``\\ s with the scheme's ``NamedSharding``\\ s."""
    lay = prog.layouts

    def place(v: Any, layout: str) -> Any:
        return put(v, sharding(prog.jmesh, layout))

    return {k: place(params[k], lay[k]) for k in prog.weights}, place(x, lay["x"]), place(dout, lay["out"])


def compile(
    name: str,
    mesh: Mesh | jax.sharding.Mesh,
    params: Mapping[str, Any],
    x: Any,
    dout: Any,
    *,
    activation: str = "identity",
    axes: Mapping[str, str] | None = None,
    options: Mapping[str, Any] | None = None,
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``(fn, args)``: scheme ``name``'s forward and backward as a jitted JAX function, and its arguments.

    ``fn(params, x, dout)`` returns ``(out, grads)`` (``grads`` with ``x`` and every weight) as
    global ``jax.Array``\\ s; ``args`` are the inputs placed with the scheme's ``NamedSharding``\\ s.
    ``jax.make_jaxpr(fn)(*args)`` shows the program's collectives.

    >>> import numpy as np, shardsim
    >>> from shardsim.engines.jax import compile
    >>> p = shardsim.models.reference_mlp.init(8, 16)
    >>> fn, args = compile("ddp", shardsim.Mesh(X=2), p, np.ones((4, 8), np.float32), np.ones((4, 8), np.float32))
    >>> out, grads = fn(*args)
    >>> out.sharding.spec, sorted(grads)
    (P('X', None), ['w_in', 'w_out', 'x'])
    """
    prog = plan(name, mesh, params, x, dout, activation=activation, axes=axes, options=options)
    return program_fn(prog), arguments(prog, params, x, dout)


def run_strategy(
    name: str,
    mesh: Mesh | jax.sharding.Mesh,
    params: Mapping[str, Any],
    x: Any,
    dout: Any,
    *,
    activation: str = "identity",
    axes: Mapping[str, str] | None = None,
    options: Mapping[str, Any] | None = None,
) -> StrategyResult:
    """Run scheme ``name`` forward and backward on JAX devices; the same result as :func:`shardsim.run_strategy`.

    ``out`` and ``grads`` are global NumPy arrays, ``trace`` the events recorded while JAX
    traced the program and ``memory`` the per-chip logical bytes of the ledger, filled at the
    same time (what each chip's program holds, not what XLA's buffer assignment allocates).
    """
    prog = plan(name, mesh, params, x, dout, activation=activation, axes=axes, options=options)
    ledger = prog.mesh.memory
    before = ledger.snapshot()["live"]
    ledger.reset_peak()
    stats: dict[str, Any] = {}
    fn = program_fn(prog, stats)
    args = arguments(prog, params, x, dout)
    t: Trace
    with trace() as t:
        out, grads = fn(*args)
    return StrategyResult(
        loss=None,
        grads={k: fetch(v) for k, v in grads.items()},
        sharded_grads={},  # the program's values live on the JAX devices, not on the simulated mesh
        trace=t,
        memory=StepMemory.since(ledger, before),
        peak=ledger.peak(),
        out=fetch(out),
        scheme=name,
        mesh=prog.mesh,
        activations=stats["activations"],
        layouts=dict(prog.layouts),
        axes=dict(prog.ctx.axes),
    )
