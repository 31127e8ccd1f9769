"""Where a step's values go: each weight in its layout, held by its pipeline stage only.

>>> from shardsim.models import TransformerConfig
>>> cfg = TransformerConfig(layers=4, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)
>>> stage_of(cfg, Plan(pp=2), "layers.3.mlp.w_in"), stage_of(cfg, Plan(pp=2), "embed")
(1, 0)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..array import ShapeDtype, ShardedArray, shard
from ..dtypes import PRECISION_DTYPES, resolve_dtype
from ..errors import ShardingError
from ..layout import Layout
from ..mesh import Mesh
from ..models import TransformerConfig
from ..plans import Plan
from .local import dim
from .roles import Roles


def place_value(mesh: Mesh, value: Any, layout: str, label: str, dtype: np.dtype, category: str) -> ShardedArray:
    """``value`` (global, or :class:`ShapeDtype`) in ``dtype`` and ``layout`` on ``mesh``; a layout that
    does not fit says which value it was.

    >>> from shardsim import Mesh
    >>> place_value(Mesh(X=2), np.ones((4, 2)), "[B_X, D]", "x", np.dtype("float32"), "activations").local_shape
    (2, 2)
    """
    if isinstance(value, ShapeDtype):
        value = ShapeDtype(value.shape, dtype)
    else:
        value = np.asarray(value).astype(dtype, copy=False)
    try:
        return shard(value, mesh, layout, label=label, category=category)
    except ShardingError as e:
        raise type(e)(f"{label} as {layout}: {e}") from None


def stage_of(cfg: TransformerConfig, plan: Plan, key: str) -> int:
    """The pipeline stage holding weight ``key``: its layer's (interleaved: its chunk's), the
    embedding's on the first stage, the final norm's and LM head's on the last."""
    p = plan.pp
    if key.startswith("layers."):
        return (int(key.split(".")[1]) // (cfg.layers // (p * plan.virtual_stages))) % p
    return 0 if key in ("embed", "pos_embed") else p - 1


def place_weights(
    cfg: TransformerConfig,
    plan: Plan,
    mesh: Mesh,
    params: Mapping[str, Any],
    dtype: Any,
    *,
    layout: Any = None,
    category: str = "params",
) -> dict[str, ShardedArray]:
    """Each weight in ``dtype`` and its layout (``layout(key)``, by default the plan's storage
    layout), held under ``pp > 1`` by its stage only. A :class:`ShardedArray` already in that
    layout (a trainer's own weights) is used as it is.

    >>> from shardsim.models import TransformerConfig
    >>> cfg = TransformerConfig(layers=2, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)
    >>> plan = Plan(pp=2)
    >>> shapes = {k: ShapeDtype(s) for k, s in cfg.param_shapes().items()}
    >>> w = place_weights(cfg, plan, plan.mesh(), shapes, "float32")
    >>> int(w["layers.1.attn.wq"].holders[1]), int(w["layers.1.attn.wq"].holders[0])
    (1, 0)
    """
    from ..pieces import place

    roles = Roles.of(plan, cfg.n_kv)
    layout_of = layout or roles.weight_layout
    pipe = plan.axis("pipe")
    out = {}
    for key, value in params.items():
        want = layout_of(key)
        if isinstance(value, ShardedArray):
            if value.mesh is not mesh or str(value.layout) != str(Layout.parse(want, mesh.axis_names)):
                raise ShardingError(f"weight {key} is {value.describe()}; run_model needs it as {want} on {mesh}")
            out[key] = value
            continue
        whole = place_value(mesh, value, want, key, np.dtype(dtype), category)
        out[key] = whole if pipe is None else place(whole, label=key, **{pipe: stage_of(cfg, plan, key)})
        del whole  # the stage's copy is the only one
    return out


def compute_dtype(plan: Plan, params: Mapping[str, Any]) -> np.dtype:
    """The dtype a step computes in: the plan's precision's, else the weights' own.

    >>> compute_dtype(Plan(precision="bf16"), {}).name, compute_dtype(Plan(), {"w": np.ones(2)}).name
    ('bfloat16', 'float64')
    """
    if plan.precision is not None:  # the plan checked its name: a precision's compute dtype
        return resolve_dtype(PRECISION_DTYPES[plan.precision][0])
    first = next(iter(params.values()))
    return np.dtype(first.dtype)


def place_tokens(mesh: Mesh, roles: Roles, value: Any, label: str) -> ShardedArray:
    """Token ids ``[B, S]`` split over the batch axes and the context axis, in their own dtype.

    >>> from shardsim import Mesh
    >>> place_tokens(Mesh(data=2), Roles.of(Plan(dp=2), 1), np.zeros((4, 3), int), "tokens").layout
    Layout('[B_{data}, S]')
    """
    layout = f"[{dim('B', *roles.batch)}, {dim('S', roles.context)}]"
    if isinstance(value, ShardedArray):  # placed already (an engine's own blocks)
        if value.mesh is not mesh or str(value.layout) != str(Layout.parse(layout, mesh.axis_names)):
            raise ShardingError(f"{label} is {value.describe()}; run_model needs it as {layout} on {mesh}")
        return value
    dt = value.dtype if isinstance(value, ShapeDtype) else np.asarray(value).dtype
    return place_value(mesh, value, layout, label, np.dtype(dt), "activations")
