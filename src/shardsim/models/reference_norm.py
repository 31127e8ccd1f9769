"""The single-device norms, LayerNorm and RMSNorm with their backward passes derived by hand,
and the LayerNorm → MLP → residual block that the MLP schemes ``tp_ln`` and ``tp_sp`` are held to.

This is the one home of the norms on plain NumPy arrays: the transformer's single-device
reference (:mod:`shardsim.models.reference`, through :mod:`shardsim.models.reference_pieces`)
and the MLP block below both use these. The sharded norms, on ShardedArrays, are
:mod:`shardsim.strategies.norms`.

LayerNorm over the last dimension ``D`` of every token (Ba et al. 2016), with weights
``gamma``, ``beta`` of shape ``[D]``, normalised first and then scaled (as Megatron-LM, Apex
and PyTorch do):

    mu = mean_D(x)      rstd = 1 / sqrt(mean_D((x - mu)^2) + eps)
    xhat = (x - mu) * rstd                    y = gamma * xhat + beta

    dbeta = sum_S(dy)    dgamma = sum_S(dy * xhat)    dxhat = dy * gamma
    dx = rstd * (dxhat - mean_D(dxhat) - xhat * mean_D(dxhat * xhat))

RMSNorm (Zhang & Sennrich 2019) is the same without the centring and without ``beta``:
``rstd = 1 / sqrt(mean_D(x^2) + eps)``, ``xhat = x * rstd``, ``y = gamma * xhat``. The
weights' gradients sum over every token (every dimension but the last).

The block on tokens ``x[S, D]``: ``Out = x + act(LN(x) @ W_in) @ W_out``. The tests hold every
backward pass to finite differences.

>>> import numpy as np
>>> p = init(d_model=4, d_ff=8, seed=0)
>>> x = np.random.default_rng(1).standard_normal((3, 4))
>>> sorted(block_backward(p, x, np.ones((3, 4))))
['beta', 'gamma', 'w_in', 'w_out', 'x']
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import resolve_dtype
from . import reference_mlp as mlp

EPS = 1e-5
Params = dict[str, np.ndarray]


def _stats(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``(mu, rstd)`` of every token, over the last dimension."""
    mu = x.mean(axis=-1, keepdims=True)
    return mu, 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)


def _token_sum(x: np.ndarray) -> np.ndarray:
    """The sum over every token: ``[..., D] -> [D]``."""
    return x.reshape(-1, x.shape[-1]).sum(axis=0)


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = EPS) -> np.ndarray:
    """LayerNorm over the last dimension: ``gamma * (x - mean) / std + beta``, normalised first.

    ``gamma * xhat``, not ``(gamma * (x - mean)) * rstd``: the product of a large gain and an
    unnormalised input would overflow while the normalised value is finite.

    >>> layer_norm(np.array([[1.0, 3.0]]), np.ones(2), np.zeros(2), eps=0.0)
    array([[-1.,  1.]])
    """
    mu, rstd = _stats(x, eps)
    return gamma * ((x - mu) * rstd) + beta


def layer_norm_backward(
    x: np.ndarray, gamma: np.ndarray, dy: np.ndarray, eps: float = EPS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dgamma, dbeta)`` for the output cotangent ``dy``; the weights' grads summed over tokens.

    >>> dx, dg, db = layer_norm_backward(np.ones((2, 3, 4)), np.ones(4), np.ones((2, 3, 4)))
    >>> dx.shape, dg.shape, db.tolist()
    ((2, 3, 4), (4,), [6.0, 6.0, 6.0, 6.0])
    """
    mu, rstd = _stats(x, eps)
    xhat = (x - mu) * rstd
    dxhat = dy * gamma
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, _token_sum(dy * xhat), _token_sum(dy)


def _rstd(x: np.ndarray, eps: float) -> np.ndarray:
    return 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float = EPS) -> np.ndarray:
    """RMSNorm over the last dimension (Zhang & Sennrich 2019): ``gamma * x / sqrt(mean(x²) + eps)``.

    Normalised first, then scaled by gamma, as :func:`layer_norm`: ``gamma * x`` first would
    overflow for a large gain while the normalised value is finite.

    >>> rms_norm(np.array([[3.0, -3.0]]), np.array([1.0, 2.0]), eps=0.0)
    array([[ 1., -2.]])
    """
    return gamma * (x * _rstd(x, eps))


def rms_norm_backward(
    x: np.ndarray, gamma: np.ndarray, dy: np.ndarray, eps: float = EPS
) -> tuple[np.ndarray, np.ndarray]:
    """``(dx, dgamma)``: with ``xhat = x * rstd``, ``dx = rstd * (dxhat - xhat * mean(dxhat * xhat))``.

    >>> dx, dg = rms_norm_backward(np.array([[3.0, -3.0]]), np.ones(2), np.array([[1.0, 1.0]]), eps=0.0)
    >>> dx.round(6).tolist(), dg.tolist()
    ([[0.333333, 0.333333]], [1.0, -1.0])
    """
    rstd = _rstd(x, eps)
    xhat = x * rstd
    dxhat = dy * gamma
    dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, _token_sum(dy * xhat)


def init(d_model: int, d_ff: int, seed: int = 0, dtype: Any = "float32") -> Params:
    """``{"gamma", "beta": [D], "w_in": [D, F], "w_out": [F, D]}``; gamma near 1, beta near 0."""
    rng = np.random.default_rng(seed + 10_000)
    dt = resolve_dtype(dtype)
    return {
        "gamma": (1.0 + 0.1 * rng.standard_normal(d_model)).astype(dt),
        "beta": (0.1 * rng.standard_normal(d_model)).astype(dt),
        **mlp.init(d_model, d_ff, seed=seed, dtype=dtype),
    }


def block_forward(params: Params, x: np.ndarray, activation: str = "identity") -> np.ndarray:
    """``x + MLP(LN(x))``."""
    return x + mlp.forward(params, layer_norm(x, params["gamma"], params["beta"]), activation)


def block_backward(params: Params, x: np.ndarray, dout: np.ndarray, activation: str = "identity") -> Params:
    """Gradients ``{"x", "gamma", "beta", "w_in", "w_out"}``: the residual passes ``dout`` through."""
    y = layer_norm(x, params["gamma"], params["beta"])
    g = mlp.backward(params, y, dout, activation)  # the MLP on the LayerNorm's output
    dx_ln, dgamma, dbeta = layer_norm_backward(x, params["gamma"], g["x"])
    return {"x": dout + dx_ln, "gamma": dgamma, "beta": dbeta, "w_in": g["w_in"], "w_out": g["w_out"]}
