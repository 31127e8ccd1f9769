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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..array import ShapeDtype, ShardedArray, require_mesh, shard
from ..errors import ArgumentTypeError, MeshAxisError, ShardingError
from ..layout import Layout
from ..mesh import Mesh
from ..ops import add
from ..tracing import Trace, phase, trace
from .base import ROLE_DEFAULTS, Ctx, Grads, Params, Saved, Scheme, shape_of


@dataclass
class StrategyResult:
    """What one forward+backward run of a scheme shows.

    ``out`` and ``grads`` (``x``, ``w_in``, ``w_out``) are global NumPy arrays (None for a
    shape-only run); ``trace`` has every collective and matmul with phase forward or
    backward; ``memory`` is each chip's peak bytes by category during the run (above what
    was live before it), shape ``mesh.shape``, plus ``"total"``; ``activations`` the
    per-chip bytes of each activation the forward pass stores for the backward pass;
    ``layouts`` the layouts of the inputs, weights, output and gradients. For a stack of
    blocks the weight gradients are ``[L, ...]``, the layouts are one block's (every block has
    the same) and the activations are named per block (``H_pre.0``, ``H_pre.1``...).
    """

    scheme: str
    mesh: Mesh
    out: np.ndarray | None
    grads: dict[str, np.ndarray] | None
    trace: Trace
    memory: dict[str, np.ndarray]
    activations: dict[str, int]
    layouts: dict[str, str]
    axes: dict[str, str] = field(default_factory=dict)


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


def run(
    scheme: Scheme,
    mesh: Mesh,
    params: Mapping[str, Any],
    x: Any,
    dout: Any,
    activation: str = "identity",
    axes: Mapping[str, str] | None = None,
    residual: bool = False,
    **options: Any,
) -> StrategyResult:
    """Run ``scheme``'s forward and backward once; see :func:`shardsim.run_strategy`.

    Params of one more dimension (``w_in`` ``[L, D, F]``, ``w_out`` ``[L, F, D]``) are a stack
    of ``L`` blocks: the scheme's per-layer steps run layer after layer (with ``residual``,
    each block adds its input), each layer's weights sharded with the scheme's layout.
    """
    chosen = resolve_axes(scheme, mesh, axes)
    check_residual(scheme, residual)
    ctx = Ctx(axes=chosen, activation=activation, options=options).check()
    lay = scheme.layouts(ctx)
    names = weight_names(scheme, lay, params)
    depth = stack_depth(params, block_ranks(lay, mesh, names))
    per_layer = [params] if depth is None else [layer_of(params, i) for i in range(depth)]
    if scheme.check_shapes is not None:
        scheme.check_shapes(per_layer[0], x, dout)
    ledger = mesh.memory
    before = ledger.snapshot()["live"]
    ledger.reset_peak()
    with trace() as t:
        xs = _shard(scheme, x, mesh, lay["x"], "In", "activations")
        layers = [
            {k: _shard(scheme, p[k], mesh, lay[k], weight_label(k, i, depth), "params") for k in names}
            for i, p in enumerate(per_layer)
        ]
        with phase("forward"):
            out, saved = forward_stack(scheme, ctx, xs, layers, residual=residual)
        stored = {
            (name if depth is None else f"{name}.{i}"): v.local_nbytes
            for i, sv in enumerate(saved)
            for name, v in sv.items()
        }
        douts = _shard(scheme, dout, mesh, lay["out"], "dOut", "activations")
        with phase("backward"):
            dx, grads = backward_stack(scheme, ctx, saved, douts, layers, residual=residual)
            grads = [reduce_gradients(scheme, ctx, g) for g in grads]
    peaks = ledger.snapshot()["peak"]
    memory = {c: peaks[c] - before.get(c, 0) for c in peaks}
    layouts = {
        "x": str(xs.layout),
        **{k: str(v.layout) for k, v in layers[0].items()},
        "out": str(out.layout),
        "dx": str(dx.layout),
        **{f"d{k}": str(g.layout) for k, g in grads[0].items()},
    }
    shape_only = xs.is_shape_only
    result_grads = None
    if not shape_only:
        result_grads = {"x": np.array(dx.to_global())}
        for k in names:
            blocks = [np.array(g[k].to_global()) for g in grads]
            result_grads[k] = blocks[0] if depth is None else np.stack(blocks)
    return StrategyResult(
        scheme=scheme.name,
        mesh=mesh,
        out=None if shape_only else np.array(out.to_global()),
        grads=result_grads,
        trace=t,
        memory=memory,
        activations={"In": xs.local_nbytes, **stored, "Out": out.local_nbytes},
        layouts=layouts,
        axes=chosen,
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
    saved: list[Saved] = []
    for params in layers:
        y, kept = scheme.forward(ctx, x, params)
        saved.append({"In": x} if recompute else kept)
        del kept  # with recompute, H_pre and H die here
        x = add(x, y, label="Out") if residual else y
        del y
    return x, saved


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
    grads: list[Grads] = [{} for _ in layers]
    for i in reversed(range(len(layers))):
        kept, saved[i] = saved[i], {}
        if recompute:
            with phase("recompute"):
                kept = scheme.forward(ctx, kept["In"], layers[i])[1]  # its output dies at once
        dx, g = scheme.backward(ctx, kept, dout, layers[i])
        del kept
        for v in g.values():
            v.as_category("grads")
        grads[i] = g
        dout = add(dout, dx, label="dOut") if residual else dx
        del dx
    return dout, grads


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
