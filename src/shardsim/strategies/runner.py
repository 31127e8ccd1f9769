"""The plumbing every scheme shares: pick the axes, shard the inputs, run both passes, gather.

>>> import numpy as np, shardsim
>>> from shardsim import mlp
>>> params = mlp.init(4, 8, seed=0)
>>> x, dout = np.ones((2, 4), np.float32), np.ones((2, 4), np.float32)
>>> r = shardsim.run_strategy("fsdp_tp", shardsim.Mesh(X=2, Y=2), params, x, dout)
>>> r.trace.collectives("forward")
[('all_gather', ('Y',)), ('all_gather', ('X',)), ('all_gather', ('X',)), ('reduce_scatter', ('Y',))]
>>> bool(np.allclose(r.out, mlp.forward(params, x)))
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..array import ShapeDtype, ShardedArray, require_mesh, shard
from ..errors import ArgumentTypeError, MeshAxisError, ShardingError
from ..layout import Layout
from ..mesh import Mesh
from ..tracing import phase
from .base import ROLE_DEFAULTS, Ctx, Grads, Params, Saved, Scheme, shape_of
from .result import RunResult
from .stack import Stepped, backward_layers, forward_layers, run_step

StrategyResult = RunResult  # the name every scheme's result has had; one class with the transformer's


def resolve_axes(scheme: Scheme, mesh: Mesh, axes: Mapping[str, str] | None) -> dict[str, str]:
    """Map the scheme's roles (``data``, ``model``) to mesh axes, or say which are missing."""
    require_mesh(mesh, "mesh", scheme.name)
    if axes is not None and not isinstance(axes, Mapping):
        example = ", ".join(f"{r!r}: {ROLE_DEFAULTS.get(r, 'X')!r}" for r in scheme.roles)
        raise ArgumentTypeError(
            f"{scheme.name}: axes={axes!r} must be a mapping of the scheme's roles {list(scheme.roles)} to mesh "
            f"axes, e.g. axes={{{example}}}, or None for the mesh's axes in order"
        )
    if axes is not None:
        unknown = [r for r in axes if r not in scheme.roles]
        if unknown:
            raise MeshAxisError(
                f"{scheme.name} has roles {list(scheme.roles)}; unknown role(s) {unknown} in axes={dict(axes)}"
            )
        chosen = dict(axes)
    elif len(mesh.axis_names) == len(scheme.roles):
        chosen = dict(zip(scheme.roles, mesh.axis_names))
    else:
        chosen = {r: ROLE_DEFAULTS[r] for r in scheme.roles if ROLE_DEFAULTS.get(r) in mesh.axis_names}
    missing = [r for r in scheme.roles if r not in chosen]
    if missing:
        example = ", ".join(f"{ROLE_DEFAULTS.get(r, r[0].upper())}=2" for r in scheme.roles)
        roles = ", ".join(f"{r!r}: <axis>" for r in scheme.roles)
        raise MeshAxisError(
            f"{scheme.name} needs a mesh axis for each of its roles {list(scheme.roles)}; {mesh} has none "
            f"for {missing}. Use a mesh with {len(scheme.roles)} axes (e.g. Mesh({example})) or pass "
            f"axes={{{roles}}}"
        )
    for a in chosen.values():
        mesh.check_axis(a)
    if len(set(chosen.values())) != len(chosen):
        raise MeshAxisError(f"{scheme.name}: each role needs its own mesh axis, got axes={chosen}")
    return chosen


@dataclass
class Prepared:
    """A scheme's run checked and laid out, before anything is placed: what :func:`prepare` gives."""

    scheme: Scheme
    ctx: Ctx
    layouts: dict[str, str]
    names: list[str]
    depth: int | None
    per_layer: list[dict[str, Any]]


def prepare(
    scheme: Scheme,
    mesh: Mesh,
    params: Mapping[str, Any],
    x: Any,
    dout: Any,
    activation: str = "identity",
    axes: Mapping[str, str] | None = None,
    residual: bool = False,
    **options: Any,
) -> Prepared:
    """Every check of a run of ``scheme``, in the order a user meets them, and its layouts and blocks.

    >>> import numpy as np, shardsim
    >>> from shardsim import strategies
    >>> x = np.ones((2, 4))
    >>> p = prepare(strategies.get("ddp"), shardsim.Mesh(X=2), shardsim.models.reference_mlp.init(4, 8), x, x)
    >>> p.names, p.depth, p.ctx.axes
    (['w_in', 'w_out'], None, {'data': 'X'})
    """
    chosen = resolve_axes(scheme, mesh, axes)
    check_residual(scheme, residual)
    ctx = Ctx(axes=chosen, activation=activation, options=options).check()
    lay = scheme.layouts(ctx)
    names = weight_names(scheme, lay, params)
    depth = stack_depth(params, block_ranks(lay, mesh, names))
    per_layer = [dict(params)] if depth is None else [layer_of(params, i) for i in range(depth)]
    if scheme.check_shapes is not None:
        scheme.check_shapes(per_layer[0], x, dout)
    return Prepared(scheme, ctx, dict(lay), names, depth, per_layer)


def run(
    scheme: Scheme,
    mesh: Mesh,
    params: Mapping[str, Any],
    x: Any,
    dout: Any,
    activation: str = "identity",
    axes: Mapping[str, str] | None = None,
    residual: bool = False,
    *,
    recompute: bool = False,
    plan: Any = None,
    model: Any = None,
    **options: Any,
) -> RunResult:
    """Run ``scheme``'s forward and backward once; see :func:`shardsim.run_strategy`.

    Params of one more dimension (``w_in`` ``[L, D, F]``, ``w_out`` ``[L, F, D]``) are a stack
    of ``L`` blocks: the scheme's per-layer steps run layer after layer (with ``residual``,
    each block adds its input), each layer's weights sharded with the scheme's layout. With
    ``recompute`` each block keeps only its input and runs its forward again in the backward
    pass. ``plan`` and ``model`` are what the result names (the run reads neither).
    """
    ready = prepare(scheme, mesh, params, x, dout, activation, axes, residual, **options)
    return run_prepared(ready, mesh, x, dout, residual=residual, recompute=recompute, plan=plan, model=model)


def run_prepared(
    ready: Prepared,
    mesh: Mesh,
    x: Any,
    dout: Any,
    *,
    residual: bool = False,
    recompute: bool = False,
    plan: Any = None,
    model: Any = None,
) -> RunResult:
    """The step of a run :func:`prepare` has checked: its blocks placed, both passes run by the
    one step skeleton (:func:`~shardsim.strategies.stack.run_step`), the result read back.

    >>> import numpy as np, shardsim
    >>> from shardsim import strategies
    >>> x, mesh = np.ones((2, 4)), shardsim.Mesh(X=2)
    >>> ready = prepare(strategies.get("ddp"), mesh, shardsim.models.reference_mlp.init(4, 8), x, x)
    >>> run_prepared(ready, mesh, x, x).trace.collectives("backward")
    [('all_reduce', ('X',)), ('all_reduce', ('X',))]
    """
    step = SchemeStep(ready, mesh, x, dout, residual=residual, recompute=recompute)
    stepped = run_step(step)
    return step.result(stepped, plan, model)


class SchemeLayers:
    """A scheme's per-layer steps over blocks of sharded weights: an MLP stack's layer program
    (see :mod:`shardsim.strategies.stack`). Each block's weight gradients, moved to the ledger
    category ``grads``, are in ``grads``."""

    def __init__(
        self,
        scheme: Scheme,
        ctx: Ctx,
        layers: Sequence[Params],
        *,
        residual: bool = False,
        recompute: bool = False,
    ) -> None:
        self.scheme, self.ctx, self.layers = scheme, ctx, list(layers)
        self.depth, self.residual, self.recompute = len(self.layers), residual, recompute
        self.grads: list[Grads] = [{} for _ in self.layers]

    def layer_forward(self, i: int, x: ShardedArray) -> tuple[ShardedArray, Saved]:
        y, kept = self.scheme.forward(self.ctx, x, self.layers[i])
        return y, ({"In": x} if self.recompute else kept)  # with recompute, H_pre and H die here

    def layer_backward(self, i: int, kept: Mapping[str, ShardedArray], dx: ShardedArray) -> tuple[ShardedArray, Grads]:
        if self.recompute:
            with phase("recompute"):
                kept = self.scheme.forward(self.ctx, kept["In"], self.layers[i])[1]  # its output dies at once
        return self.scheme.backward(self.ctx, kept, dx, self.layers[i])  # type: ignore[arg-type]

    def layer_gradients(self, i: int, grads: Mapping[str, ShardedArray]) -> None:
        for v in grads.values():
            v.as_category("grads")
        self.grads[i] = dict(grads)


class SchemeStep(SchemeLayers):
    """One run of a scheme on global inputs: its blocks placed with the scheme's layouts, ``x``
    in and ``dout`` as the output's gradient; :meth:`result` reads the run back."""

    def __init__(
        self, ready: Prepared, mesh: Mesh, x: Any, dout: Any, *, residual: bool = False, recompute: bool = False
    ) -> None:
        super().__init__(ready.scheme, ready.ctx, [], residual=residual, recompute=recompute)
        self.ready, self.mesh, self.x, self.dout = ready, mesh, x, dout
        self.depth = len(ready.per_layer)

    def place(self) -> None:
        r = self.ready
        self.xs = _shard(r.scheme, self.x, self.mesh, r.layouts["x"], "In", "activations")
        self.layers = [
            {k: _shard(r.scheme, p[k], self.mesh, r.layouts[k], weight_label(k, i, r.depth), "params") for k in r.names}
            for i, p in enumerate(r.per_layer)
        ]
        self.grads = [{} for _ in self.layers]

    def start(self) -> ShardedArray:
        return self.xs

    def finish_forward(self, x: ShardedArray) -> None:
        self.out = x

    def start_backward(self) -> ShardedArray:
        self.douts = _shard(self.scheme, self.dout, self.mesh, self.ready.layouts["out"], "dOut", "activations")
        return self.douts

    def finish_backward(self, dx: ShardedArray) -> None:
        self.dx = dx
        self.grads = [reduce_gradients(self.scheme, self.ctx, g) for g in self.grads]

    def result(self, stepped: Stepped, plan: Any = None, model: Any = None) -> RunResult:
        """The run as a :class:`RunResult`: global output and gradients, layouts, the stored activations."""
        r, depth = self.ready, self.ready.depth
        layouts = {
            "x": str(self.xs.layout),
            **{k: str(v.layout) for k, v in self.layers[0].items()},
            "out": str(self.out.layout),
            "dx": str(self.dx.layout),
            **{f"d{k}": str(g.layout) for k, g in self.grads[0].items()},
        }
        stored = {
            (name if depth is None else f"{name}.{i}"): n
            for i, values in enumerate(stepped.stored_values)
            for name, n in values.items()
        }
        sharded = {"x": self.dx}
        for i, g in enumerate(self.grads):
            sharded.update({(k if depth is None else f"{k}.{i}"): v for k, v in g.items()})
        shape_only = self.xs.is_shape_only
        grads = None
        if not shape_only:
            grads = {"x": np.array(self.dx.to_global())}
            for k in r.names:
                blocks = [np.array(g[k].to_global()) for g in self.grads]
                grads[k] = blocks[0] if depth is None else np.stack(blocks)
        return RunResult(
            loss=None,
            grads=grads,
            sharded_grads=sharded,
            trace=stepped.trace,
            memory=stepped.memory,
            stored=stepped.stored,
            stored_values=stepped.stored_values,
            peak=self.mesh.memory.peak(),
            out=None if shape_only else np.array(self.out.to_global()),
            activations={"In": self.xs.local_nbytes, **stored, "Out": self.out.local_nbytes},
            layouts=layouts,
            axes=dict(self.ctx.axes),
            scheme=self.scheme.name,
            model=model,
            plan=plan,
            mesh=self.mesh,
        )


def check_residual(scheme: Scheme, residual: bool) -> None:
    """A pipeline runs its blocks inside its schedule: it has no block boundary to add a residual at."""
    if residual and "pipe" in scheme.roles:
        raise ShardingError(
            f"residual=True adds each block's input to its output; {scheme.name} runs all its blocks inside "
            "the pipeline schedule, whose blocks have no residual: leave residual off for a pipeline"
        )


def weight_names(scheme: Scheme, layouts: Mapping[str, str], params: Mapping[str, Any]) -> list[str]:
    """The scheme's weights (its layouts but ``x`` and ``out``), checked against the keys of ``params``."""
    names = [k for k in layouts if k not in ("x", "out")]
    if sorted(params) != sorted(names):
        raise ShardingError(f"{scheme.name} needs params {names} (global arrays); got keys {sorted(params)}")
    return names


# -- deep stacks: the per-layer steps, layer after layer ---------------------------------------
def block_ranks(layouts: Mapping[str, str], mesh: Mesh, names: Sequence[str]) -> dict[str, int]:
    """The rank of one block's weight ``k``: its layout's (``[E_Y, D, F]`` has 3).

    >>> block_ranks({"gamma": "[D]", "w_in": "[L_Z, D, F]"}, Mesh(Z=2), ["gamma", "w_in"])
    {'gamma': 1, 'w_in': 3}
    """
    return {k: Layout.parse(layouts[k], mesh.axis_names).rank for k in names}


def stack_depth(params: Mapping[str, Any], block_ranks: Mapping[str, int] | None = None) -> int | None:
    """``L`` if the params are stacked ``[L, ...]`` (one more dimension than a block's), else None.

    A block's weight has the rank of its layout (``block_ranks``; 2 by default): a scheme with
    weights of other ranks (a LayerNorm's ``[D]``, experts ``[E, D, F]``, pipeline stages
    ``[L, D, F]``) runs its params as they are, and stacks of them have one dimension more.
    """
    ranks = {k: len(shape_of(v)) - (block_ranks or {}).get(k, 2) + 2 for k, v in params.items()}  # as if 2-D
    if all(r == 2 for r in ranks.values()):
        return None
    if all(r == 3 for r in ranks.values()):
        depths = {shape_of(v)[0] for v in params.values()}
        if len(depths) == 1:
            depth = depths.pop()
            if depth >= 1:
                return depth
    shapes = {k: shape_of(v) for k, v in params.items()}
    raise ShardingError(
        f"params must all be one block's weights (W_in [D, F], W_out [F, D]) or all stacks of L blocks "
        f"(W_in [L, D, F], W_out [L, F, D]) with the same L >= 1; got shapes {shapes}"
    )


def layer_of(params: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Block ``i``'s global weights out of stacked ones (shape-only stacks give shape-only blocks)."""
    return {
        k: ShapeDtype(v.shape[1:], v.dtype) if isinstance(v, ShapeDtype) else np.asarray(v)[i]
        for k, v in params.items()
    }


def weight_label(name: str, i: int, depth: int | None) -> str:
    """``W_in`` for a single block, ``W_in.2`` for block 2 of a stack.

    >>> weight_label("w_in", 2, 4), weight_label("w_in", 0, None)
    ('W_in.2', 'W_in')
    """
    return _label(name) if depth is None else f"{_label(name)}.{i}"


def forward_stack(
    scheme: Scheme,
    ctx: Ctx,
    x: ShardedArray,
    layers: Sequence[Params],
    *,
    residual: bool = False,
    recompute: bool = False,
) -> tuple[ShardedArray, list[Saved]]:
    """The scheme's forward, block after block; returns the output and what each block saved.

    With ``residual`` a block's output is ``In + MLP(In)``. With ``recompute`` a block keeps
    only its input (``{"In": x}``); :func:`backward_stack` runs its forward again.

    >>> import numpy as np, shardsim
    >>> from shardsim import mlp, strategies
    >>> mesh = shardsim.Mesh(X=2)
    >>> w = [{k: shardsim.shard(v, mesh, "A B") for k, v in mlp.init(4, 8, seed=i).items()} for i in range(3)]
    >>> x = shardsim.shard(np.ones((2, 4), np.float32), mesh, "B_X D")
    >>> out, saved = forward_stack(strategies.get("ddp"), Ctx(), x, w, recompute=True)
    >>> [list(s) for s in saved]
    [['In'], ['In'], ['In']]
    """
    stack = SchemeLayers(scheme, ctx, layers, residual=residual, recompute=recompute)
    first = [x]
    del x  # handed over, not held here: the first block's input dies when that block is done with it
    out, kept, _, _ = forward_layers(stack, first.pop())
    return out, kept  # type: ignore[return-value]


def backward_stack(
    scheme: Scheme,
    ctx: Ctx,
    saved: list[Saved],
    dout: ShardedArray,
    layers: Sequence[Params],
    *,
    residual: bool = False,
    recompute: bool = False,
) -> tuple[ShardedArray, list[Grads]]:
    """The scheme's backward, last block first; frees each block's saved values as it goes.

    Empties ``saved``. With ``recompute`` each block first runs its forward again from its
    kept input (trace phase ``recompute``). Returns ``dIn`` and each block's gradients,
    moved to the ledger category ``grads``.
    """
    stack = SchemeLayers(scheme, ctx, layers, residual=residual, recompute=recompute)
    kept: list[Mapping[str, ShardedArray]] = list(saved)
    saved[:] = [{} for _ in saved]  # handed to the stack, which frees each block's as it goes
    first = [dout]
    del dout  # handed over, as the input is to the forward
    dx = backward_layers(stack, kept, first.pop())
    return dx, stack.grads


def reduce_gradients(scheme: Scheme, ctx: Ctx, grads: Grads) -> Grads:
    """Gradients a scheme keeps unreduced through its backward (ZeRO-1) reduced to their owners."""
    hook = getattr(scheme, "reduce_gradients", None)
    if hook is None:
        return grads
    out = hook(ctx, grads)
    for v in out.values():
        v.as_category("grads")
    return out


def _shard(scheme: Scheme, value: Any, mesh: Mesh, layout: str, label: str, category: str) -> ShardedArray:
    try:
        return shard(value, mesh, layout, label=label, category=category)
    except ShardingError as e:
        raise type(e)(f"{scheme.name}: cannot lay out {label} as {layout}: {e}") from None


def _label(name: str) -> str:
    """``w_in`` → ``W_in``: the seed's names for weights."""
    return name[0].upper() + name[1:]
