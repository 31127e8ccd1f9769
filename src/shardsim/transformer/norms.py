"""LayerNorm and RMSNorm over D of ``[B, S, D]`` on whatever tokens a chip holds (D is never split).

The per-token statistics are recomputed from the stored input in the backward pass, so a
norm stores its input only: the accounting of Korthikanti et al. 2022 (2sbh per norm).
The maths is :mod:`shardsim.norm`'s (held to finite differences there), on every chip.

>>> import numpy as np, shardsim
>>> x = shardsim.shard(np.random.default_rng(0).standard_normal((2, 3, 4)), shardsim.Mesh(X=2), "B_X S D")
>>> g = shardsim.shard(np.ones(4), x.mesh, "D")
>>> y = forward("rmsnorm", x, g, None, 1e-5)
>>> bool(np.allclose((y.to_global() ** 2).mean(-1), 1, atol=1e-4))
True
"""

from __future__ import annotations

import numpy as np

from ..array import ShardedArray
from ..ops import map_blocks, sum_dim
from .local import scalar


def _stats(kind: str, x: ShardedArray, eps: float) -> tuple[ShardedArray | None, ShardedArray]:
    """``(mu, rstd)`` per token (mu None for RMSNorm), shape ``[B, S, 1]``."""
    d = x.global_shape[-1]
    mu = None
    xc = x
    if kind == "layernorm":
        mu = sum_dim(x, "D", keepdims=True) * scalar(1.0 / d, x)
        xc = x - mu
    var = sum_dim(xc * xc, "D", keepdims=True) * scalar(1.0 / d, x)
    rstd = map_blocks(var, lambda v: (1.0 / np.sqrt(v + eps)).astype(v.dtype), "rsqrt", label="rstd")
    return mu, rstd


def _xhat(kind: str, x: ShardedArray, eps: float) -> tuple[ShardedArray, ShardedArray]:
    mu, rstd = _stats(kind, x, eps)
    return ((x - mu) if mu is not None else x) * rstd, rstd


def forward(kind: str, x: ShardedArray, gamma: ShardedArray, beta: ShardedArray | None, eps: float) -> ShardedArray:
    """``gamma * xhat (+ beta)``: LayerNorm (``kind="layernorm"``) or RMSNorm."""
    xhat, _ = _xhat(kind, x, eps)
    y = xhat * gamma
    return (y + beta if beta is not None else y).named("Norm out")


def backward(
    kind: str, x: ShardedArray, gamma: ShardedArray, dy: ShardedArray, eps: float
) -> tuple[ShardedArray, dict[str, ShardedArray]]:
    """``dx`` and ``{"gamma", "beta"}``: sums over the chip's tokens (partial over the axes splitting B, S)."""
    xhat, rstd = _xhat(kind, x, eps)
    d = x.global_shape[-1]
    grads = {"gamma": sum_dim(sum_dim(dy * xhat, "B"), "S", label="dgamma")}
    if kind == "layernorm":
        grads["beta"] = sum_dim(sum_dim(dy, "B"), "S", label="dbeta")
    g = dy * gamma
    inv = scalar(1.0 / d, x)
    dxhat = g - xhat * (sum_dim(g * xhat, "D", keepdims=True) * inv)
    if kind == "layernorm":
        dxhat = dxhat - sum_dim(g, "D", keepdims=True) * inv
    return (dxhat * rstd).named("dNorm in"), grads
