"""LayerNorm and RMSNorm on ShardedArrays, forward and backward: the one sharded norm.

A norm is per token over the last dimension ``D``, which is never split, so it runs on
whatever tokens a chip holds and every op is local: replicated ``[S, D]`` (``tp_ln``),
split over the sequence ``[S_Y, D]`` (``tp_sp``, sequence parallelism), ``[B_data, S, D]``...
Its users: the MLP schemes ``tp_ln`` and ``tp_sp`` (:mod:`shardsim.strategies.tp_sp`) and the
transformer's blocks (through :mod:`shardsim.transformer.norms`, which re-exports this
module). The single-device norms it is held to are :mod:`shardsim.models.reference_norm`'s.

In this order of floating-point operations, normalised first and then scaled by ``gamma``
(as Megatron-LM, Apex and PyTorch do), with ``1/D`` a scalar of the input's dtype:

    mu = sum_D(x) * (1/D),  xc = x - mu           (RMSNorm: xc = x, no mu)
    rstd = 1 / sqrt(sum_D(xc * xc) * (1/D) + eps)
    xhat = xc * rstd,       y = xhat * gamma (+ beta)

    dgamma = sum_tokens(dy * xhat)    dbeta = sum_tokens(dy)    g = dy * gamma
    dx = (g - xhat * (sum_D(g * xhat) * (1/D)) - sum_D(g) * (1/D)) * rstd
                                                  (RMSNorm: without the last term)

``dgamma`` and ``dbeta`` sum over the chip's own tokens only: partial over the axes that
split the tokens, which the caller reduces. The backward pass takes the statistics the
forward pass kept, or recomputes them from the stored input when given none: a norm that
stores its input only is the accounting of Korthikanti et al. 2022 (2sbh per norm).

>>> import numpy as np, shardsim
>>> x = shardsim.shard(np.random.default_rng(0).standard_normal((2, 3, 4)), shardsim.Mesh(X=2), "B_X S D")
>>> g = shardsim.shard(np.ones(4), x.mesh, "D")
>>> y = forward("rmsnorm", x, g, None, 1e-5)
>>> bool(np.allclose((y.to_global() ** 2).mean(-1), 1, atol=1e-4))
True
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..array import ShardedArray
from ..ops import map_blocks, sum_dim
from ..xp import namespace

KINDS = ("layernorm", "rmsnorm")


class Stats(NamedTuple):
    """A norm's per-token statistics, shape ``[..., 1]``: ``mu`` (None for RMSNorm) and ``rstd``."""

    mu: ShardedArray | None
    rstd: ShardedArray


def _inv(x: ShardedArray) -> np.ndarray:
    """``1/D`` as a 0-d array of ``x``'s dtype: a Python float would promote bfloat16 to float32."""
    return np.asarray(1.0 / x.global_shape[-1], x.dtype)


def _sum_d(x: ShardedArray) -> ShardedArray:
    return sum_dim(x, x.ndim - 1, keepdims=True)


def statistics(kind: str, x: ShardedArray, eps: float) -> Stats:
    """``(mu, rstd)`` of every token: LayerNorm for ``kind="layernorm"``, otherwise RMSNorm.

    >>> import numpy as np, shardsim
    >>> x = shardsim.shard(np.array([[1.0, 3.0], [2.0, 6.0]]), shardsim.Mesh(Y=2), "S_Y D")
    >>> mu, rstd = statistics("layernorm", x, 0.0)
    >>> mu.to_global().ravel().tolist(), rstd.to_global().ravel().tolist(), rstd.layout
    ([2.0, 4.0], [1.0, 0.5], Layout('[S_Y, D]'))
    """
    mu = None
    xc = x
    if kind == "layernorm":
        mu = _sum_d(x) * _inv(x)
        xc = x - mu
    var = _sum_d(xc * xc) * _inv(x)
    rstd = map_blocks(var, lambda v: (1.0 / namespace(v).sqrt(v + eps)).astype(v.dtype), "rsqrt", label="rstd")
    return Stats(mu, rstd)


def normalized(x: ShardedArray, stats: Stats) -> ShardedArray:
    """``xhat = (x - mu) * rstd`` (``x * rstd`` for RMSNorm): zero mean and unit variance per token.

    >>> import numpy as np, shardsim
    >>> x = shardsim.shard(np.array([[1.0, 3.0]]), shardsim.Mesh(Y=1), "S D")
    >>> normalized(x, statistics("layernorm", x, 0.0)).to_global().tolist()
    [[-1.0, 1.0]]
    """
    mu, rstd = stats
    return ((x - mu) if mu is not None else x) * rstd


def forward(
    kind: str,
    x: ShardedArray,
    gamma: ShardedArray,
    beta: ShardedArray | None,
    eps: float,
    stats: Stats | None = None,
) -> ShardedArray:
    """``xhat * gamma (+ beta)``, labelled ``Norm out``; ``stats`` from :func:`statistics`, or computed here.

    >>> import numpy as np, shardsim
    >>> mesh = shardsim.Mesh(Y=2)
    >>> x = shardsim.shard(np.array([[1.0, 3.0], [4.0, 0.0]]), mesh, "S_Y D")
    >>> gamma, beta = shardsim.shard(np.array([1.0, 2.0]), mesh, "D"), shardsim.shard(np.ones(2), mesh, "D")
    >>> y = forward("layernorm", x, gamma, beta, 0.0)
    >>> y.to_global().tolist(), y.layout, y.label
    ([[0.0, 3.0], [2.0, -1.0]], Layout('[S_Y, D]'), 'Norm out')
    """
    xhat = normalized(x, stats if stats is not None else statistics(kind, x, eps))
    y = xhat * gamma
    return (y + beta if beta is not None else y).named("Norm out")


def _token_sum(x: ShardedArray, label: str) -> ShardedArray:
    """The sum over every dimension but ``D``, first to last: ``[B, S, D] -> [D]``."""
    while x.ndim > 2:
        x = sum_dim(x, 0)
    return sum_dim(x, 0, label=label)


def backward(
    kind: str,
    x: ShardedArray,
    gamma: ShardedArray,
    dy: ShardedArray,
    eps: float,
    stats: Stats | None = None,
) -> tuple[ShardedArray, dict[str, ShardedArray]]:
    """``dx`` (labelled ``dNorm in``) and ``{"gamma", "beta"}`` (``"gamma"`` only for RMSNorm).

    The weights' gradients are sums over the chip's tokens: partial over the axes splitting
    them. ``stats`` are the forward pass's; given none, they are recomputed from ``x``.

    >>> import numpy as np, shardsim
    >>> mesh = shardsim.Mesh(Y=2)
    >>> x = shardsim.shard(np.array([[3.0, -3.0], [1.0, 1.0]]), mesh, "S_Y D")
    >>> dx, grads = backward("rmsnorm", x, shardsim.shard(np.ones(2), mesh, "D"), x * 0 + 1, 0.0)
    >>> dx.to_global().round(6).tolist(), sorted(grads), grads["gamma"].layout
    ([[0.333333, 0.333333], [0.0, 0.0]], ['gamma'], Layout('[D]{U_Y}'))
    """
    mu, rstd = stats if stats is not None else statistics(kind, x, eps)
    xhat = normalized(x, Stats(mu, rstd))
    del mu  # the centred input is in xhat: mu need not outlive it
    grads = {"gamma": _token_sum(dy * xhat, "dgamma")}
    if kind == "layernorm":
        grads["beta"] = _token_sum(dy, "dbeta")
    g = dy * gamma
    inv = _inv(x)
    dxhat = g - xhat * (_sum_d(g * xhat) * inv)
    if kind == "layernorm":
        dxhat = dxhat - _sum_d(g) * inv
    return (dxhat * rstd).named("dNorm in"), grads
