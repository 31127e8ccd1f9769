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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..array import ShardedArray, shard
from ..errors import MeshAxisError, ShardingError
from ..mesh import Mesh
from ..trace import Trace, phase, trace
from .base import ROLE_DEFAULTS, Ctx, Scheme


@dataclass
class StrategyResult:
    """What one forward+backward run of a scheme shows.

    ``out`` and ``grads`` (``x``, ``w_in``, ``w_out``) are global NumPy arrays (None for a
    shape-only run); ``trace`` has every collective and matmul with phase forward or
    backward; ``memory`` is each chip's peak bytes by category during the run (above what
    was live before it), shape ``mesh.shape``, plus ``"total"``; ``activations`` the
    per-chip bytes of each activation the forward pass stores for the backward pass;
    ``layouts`` the layouts of the inputs, weights, output and gradients.
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
    **options: Any,
) -> StrategyResult:
    """Run ``scheme``'s forward and backward once; see :func:`shardsim.run_strategy`."""
    chosen = resolve_axes(scheme, mesh, axes)
    ctx = Ctx(axes=chosen, activation=activation, options=options).check()
    lay = scheme.layouts(ctx)
    names = [k for k in lay if k not in ("x", "out")]
    if sorted(params) != sorted(names):
        raise ShardingError(f"{scheme.name} needs params {names} (global arrays); got keys {sorted(params)}")
    if scheme.check_shapes is not None:
        scheme.check_shapes(params, x, dout)
    ledger = mesh.memory
    before = ledger.snapshot()["live"]
    ledger.reset_peak()
    with trace() as t:
        xs = _shard(scheme, x, mesh, lay["x"], "In", "activations")
        ps = {k: _shard(scheme, params[k], mesh, lay[k], _label(k), "params") for k in names}
        with phase("forward"):
            out, saved = scheme.forward(ctx, xs, ps)
        stored = {name: v.local_nbytes for name, v in saved.items()}
        douts = _shard(scheme, dout, mesh, lay["out"], "dOut", "activations")
        with phase("backward"):
            dx, grads = scheme.backward(ctx, saved, douts, ps)
            for g in grads.values():
                g.as_category("grads")
    peaks = ledger.snapshot()["peak"]
    memory = {c: peaks[c] - before.get(c, 0) for c in peaks}
    layouts = {
        "x": str(xs.layout),
        **{k: str(v.layout) for k, v in ps.items()},
        "out": str(out.layout),
        "dx": str(dx.layout),
        **{f"d{k}": str(g.layout) for k, g in grads.items()},
    }
    shape_only = xs.is_shape_only
    return StrategyResult(
        scheme=scheme.name,
        mesh=mesh,
        out=None if shape_only else np.array(out.to_global()),
        grads=None
        if shape_only
        else {"x": np.array(dx.to_global()), **{k: np.array(g.to_global()) for k, g in grads.items()}},
        trace=t,
        memory=memory,
        activations={"In": xs.local_nbytes, **stored, "Out": out.local_nbytes},
        layouts=layouts,
        axes=chosen,
    )


def _shard(scheme: Scheme, value: Any, mesh: Mesh, layout: str, label: str, category: str) -> ShardedArray:
    try:
        return shard(value, mesh, layout, label=label, category=category)
    except ShardingError as e:
        raise type(e)(f"{scheme.name}: cannot lay out {label} as {layout}: {e}") from None


def _label(name: str) -> str:
    """``w_in`` → ``W_in``: the seed's names for weights."""
    return name[0].upper() + name[1:]
