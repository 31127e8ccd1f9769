"""The transformer's pieces on plain NumPy arrays, each with its hand-derived backward pass.

The single-device reference (:mod:`shardsim.models.reference`) is built from these, and a
sharded program can hold each of its own pieces to them. Shapes: ``x [B, S, D]``, queries
``q [B, S, N, H]``, keys and values ``k, v [B, S, K, H]``, attention probabilities
``[B, N, S, S]`` (query rows, key columns), logits ``[..., V]``.

Softmax and cross-entropy run in float32 (float64 when an input is float64); everything else
keeps the inputs' dtype.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> q, k, v = rng.standard_normal((1, 3, 2, 4)), rng.standard_normal((1, 3, 1, 4)), rng.standard_normal((1, 3, 1, 4))
>>> o = attention(q, k, v)  # two query heads share one kv head (multi-query)
>>> o.shape, bool(np.allclose(o[0, 0, 1], v[0, 0, 0]))  # the first token sees only itself
((1, 3, 2, 4), True)
"""

from __future__ import annotations

import numpy as np

from .. import norm as _norm
from ..activations import get as _activation
from ..errors import ConfigError, ShapeError

SITES = ("attn_probs", "attn_out", "mlp_out")
SITE_INDEX = {site: i for i, site in enumerate(SITES)}

_GELU = _activation("gelu")


def compute_dtype(*arrays: np.ndarray) -> np.dtype:
    """float64 if any input is float64, else float32: the dtype of softmax and cross-entropy.

    >>> compute_dtype(np.zeros(2, np.float32)), compute_dtype(np.zeros(2), np.zeros(2, np.float32))
    (dtype('float32'), dtype('float64'))
    """
    return np.dtype(np.float64 if any(a.dtype == np.float64 for a in arrays) else np.float32)


# -- dropout -----------------------------------------------------------------------------------
def dropout_mask(seed: int, layer: int, site: str, shape: tuple[int, ...], p: float) -> np.ndarray:
    """The keep-mask of dropout site ``site`` of block ``layer``: True where the value is kept.

    Drawn on the GLOBAL ``shape`` from ``default_rng([seed, layer, SITE_INDEX[site]])``, so a
    sharded program draws the same mask and takes its blocks. Sites: ``"attn_probs"``
    ``[B, N, S, S]``, ``"attn_out"`` and ``"mlp_out"`` ``[B, S, D]``.

    >>> dropout_mask(0, 1, "mlp_out", (2, 3), 0.5).shape
    (2, 3)
    >>> bool((dropout_mask(0, 1, "mlp_out", (4, 4), 0.5) == dropout_mask(0, 1, "mlp_out", (4, 4), 0.5)).all())
    True
    """
    if site not in SITE_INDEX:
        raise ConfigError(f"unknown dropout site {site!r}; the sites are {list(SITES)}")
    return np.random.default_rng([seed, layer, SITE_INDEX[site]]).random(shape) >= p


def dropout(x: np.ndarray, keep: np.ndarray | None, p: float) -> np.ndarray:
    """``x`` with the dropped entries zeroed and the kept ones scaled by ``1/(1-p)``.

    Linear in ``x``, so the same call is its backward pass. ``keep`` None means no dropout.

    >>> dropout(np.ones(4, np.float32), np.array([True, False, True, True]), 0.5)
    array([2., 0., 2., 2.], dtype=float32)
    """
    if keep is None:
        return x
    return x * keep * (1.0 / (1.0 - p))


# -- norms -------------------------------------------------------------------------------------
def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """LayerNorm over the last dimension (Ba et al. 2016): ``gamma * (x - mean) / std + beta``.

    >>> layer_norm(np.array([[1.0, 3.0]]), np.ones(2), np.zeros(2), eps=0.0)
    array([[-1.,  1.]])
    """
    return _norm.layer_norm(x, gamma, beta, eps)


def layer_norm_backward(
    x: np.ndarray, gamma: np.ndarray, dy: np.ndarray, eps: float = 1e-5
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dgamma, dbeta)`` for the output cotangent ``dy``; weights' grads summed over tokens.

    >>> dx, dg, db = layer_norm_backward(np.ones((2, 3, 4)), np.ones(4), np.ones((2, 3, 4)))
    >>> dx.shape, dg.shape, db.tolist()
    ((2, 3, 4), (4,), [6.0, 6.0, 6.0, 6.0])
    """
    d = x.shape[-1]
    dx, dgamma, dbeta = _norm.layer_norm_backward(x.reshape(-1, d), gamma, dy.reshape(-1, d), eps)
    return dx.reshape(x.shape), dgamma, dbeta


def _rstd(x: np.ndarray, eps: float) -> np.ndarray:
    return 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """RMSNorm over the last dimension (Zhang & Sennrich 2019): ``gamma * x / sqrt(mean(x²) + eps)``.

    >>> rms_norm(np.array([[3.0, -3.0]]), np.array([1.0, 2.0]), eps=0.0)
    array([[ 1., -2.]])
    """
    return gamma * x * _rstd(x, eps)


def rms_norm_backward(
    x: np.ndarray, gamma: np.ndarray, dy: np.ndarray, eps: float = 1e-5
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
    d = x.shape[-1]
    return dx, (dy * xhat).reshape(-1, d).sum(axis=0)


# -- MLP nonlinearities ------------------------------------------------------------------------
def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (Hendrycks & Gimpel 2016), as GPT-2/3 and Megatron use it.

    >>> gelu(np.array([0.0, 10.0])).tolist()
    [0.0, 10.0]
    """
    return _GELU.fn(x)


def gelu_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """``dy * gelu'(x)``.

    >>> gelu_backward(np.array([0.0]), np.array([2.0])).tolist()
    [1.0]
    """
    return dy * _GELU.grad(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|, unlike 1 / (1 + exp(-x))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """SwiGLU (Shazeer 2020): ``silu(gate) * up`` with ``silu(g) = g * sigmoid(g)``.

    >>> swiglu(np.array([0.0, 20.0]), np.array([5.0, 2.0])).round(6).tolist()
    [0.0, 40.0]
    """
    return gate * _sigmoid(gate) * up


def swiglu_backward(gate: np.ndarray, up: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(dgate, dup)``: ``silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g)))``.

    >>> dgate, dup = swiglu_backward(np.array([0.0]), np.array([3.0]), np.array([1.0]))
    >>> dgate.tolist(), dup.tolist()
    ([1.5], [0.0])
    """
    sig = _sigmoid(gate)
    return dy * up * (sig * (1.0 + gate * (1.0 - sig))), dy * gate * sig


# -- rotary position embedding -----------------------------------------------------------------
def _rotation(positions: np.ndarray, head_dim: int, theta: float, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``cos, sin [S, 1, H/2]`` of angle ``position * theta^(-2j/H)`` (Su et al. 2021)."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angle = np.asarray(positions, dtype=np.float64)[:, None, None] * inv_freq
    return np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)


def rope(x: np.ndarray, positions: np.ndarray, theta: float = 10000.0) -> np.ndarray:
    """Rotary embedding of ``x [B, S, heads, H]`` by ``positions [S]``, half-split pairs.

    Pairs ``(x[j], x[j + H/2])`` rotate by ``position * theta^(-2j/H)``: the GPT-NeoX and Llama
    convention. A rotation, so the dot product of two rotated vectors depends only on the
    difference of their positions.

    >>> x = np.ones((1, 2, 1, 4))
    >>> bool(np.allclose(rope(x, np.arange(2))[0, 0], x[0, 0]))  # position 0 is not rotated
    True
    """
    if x.shape[-1] % 2:
        raise ShapeError(f"rope needs an even head dimension, got {x.shape[-1]} (x of shape {x.shape})")
    cos, sin = _rotation(positions, x.shape[-1], theta, x.dtype)
    x1, x2 = np.split(x, 2, axis=-1)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rope_backward(dy: np.ndarray, positions: np.ndarray, theta: float = 10000.0) -> np.ndarray:
    """The rotation's transpose: ``dy`` rotated back by the same angles.

    >>> x = np.random.default_rng(0).standard_normal((1, 3, 2, 4))
    >>> bool(np.allclose(rope_backward(rope(x, np.arange(3)), np.arange(3)), x))
    True
    """
    cos, sin = _rotation(positions, dy.shape[-1], theta, dy.dtype)
    d1, d2 = np.split(dy, 2, axis=-1)
    return np.concatenate([d1 * cos + d2 * sin, d2 * cos - d1 * sin], axis=-1)


# -- attention ---------------------------------------------------------------------------------
def _grouped(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``q [B, K, G, S, H]``, ``k, v [B, K, 1, S, H]``: query head ``n = k*G + g`` uses kv head ``k``."""
    if q.ndim != 4 or k.shape != v.shape or k.ndim != 4 or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ShapeError(
            f"attention takes q [B, S, N, H] and k, v [B, S, K, H] with equal B, S, H; got q {q.shape}, "
            f"k {k.shape}, v {v.shape}"
        )
    b, s, n, h = q.shape
    kv = k.shape[2]
    if n % kv:
        raise ShapeError(f"attention: {n} query heads do not divide into groups over {kv} kv heads (q {q.shape})")
    qg = q.reshape(b, s, kv, n // kv, h).transpose(0, 2, 3, 1, 4)
    return qg, k.transpose(0, 2, 1, 3)[:, :, None], v.transpose(0, 2, 1, 3)[:, :, None]


def _probabilities(
    qg: np.ndarray, kg: np.ndarray, causal: bool, positions: np.ndarray | None, dtype: np.dtype
) -> np.ndarray:
    """Softmax of ``q k^T / sqrt(H)`` over the keys, ``[B, K, G, S, S]``, in ``dtype``."""
    s, h = qg.shape[-2], qg.shape[-1]
    scores = (qg.astype(dtype, copy=False) @ kg.astype(dtype, copy=False).swapaxes(-1, -2)) * dtype.type(h**-0.5)
    if causal:
        pos = np.arange(s) if positions is None else np.asarray(positions)
        if pos.shape != (s,):
            raise ShapeError(f"attention: positions must be [S] = [{s}], got shape {pos.shape}")
        scores = np.where(pos[None, :] <= pos[:, None], scores, -np.inf)  # key position <= query position
    scores = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(scores)
    return e / e.sum(axis=-1, keepdims=True)


def _keep_grouped(keep: np.ndarray | None, qg: np.ndarray) -> np.ndarray | None:
    """The ``[B, N, S, S]`` probability keep-mask as ``[B, K, G, S, S]``."""
    return None if keep is None else keep.reshape(qg.shape[:3] + keep.shape[-2:])


def _ungroup(og: np.ndarray) -> np.ndarray:
    """``[B, K, G, S, H]`` back to ``[B, S, N, H]``."""
    b, kv, g, s, h = og.shape
    return og.transpose(0, 3, 1, 2, 4).reshape(b, s, kv * g, h)


def attention_probs(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = True, positions: np.ndarray | None = None
) -> np.ndarray:
    """The attention probabilities ``[B, N, S, S]`` (query rows, key columns), in float32/float64.

    >>> p = attention_probs(*[np.zeros((1, 3, 2, 4))] * 3)
    >>> p.shape, p[0, 0, 2].tolist()
    ((1, 2, 3, 3), [0.3333333333333333, 0.3333333333333333, 0.3333333333333333])
    """
    qg, kg, _ = _grouped(q, k, v)
    p = _probabilities(qg, kg, causal, positions, compute_dtype(q, k, v))
    return p.reshape(q.shape[0], q.shape[2], q.shape[1], q.shape[1])


Saved = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, "np.ndarray | None", float]


def attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = True,
    positions: np.ndarray | None = None,
    keep: np.ndarray | None = None,
    p: float = 0.0,
) -> tuple[np.ndarray, Saved]:
    """:func:`attention`'s output and what :func:`attention_grads` reads (the probabilities included).

    >>> x = np.ones((1, 2, 2, 4))
    >>> o, saved = attention_forward(x, x, x)
    >>> o.shape, saved[3].shape  # the probabilities, grouped [B, K, G, S, S]
    ((1, 2, 2, 4), (1, 2, 1, 2, 2))
    """
    qg, kg, vg = _grouped(q, k, v)
    dt = compute_dtype(q, k, v)
    probs = _probabilities(qg, kg, causal, positions, dt)
    keep_g = _keep_grouped(keep, qg)
    o = _ungroup(dropout(probs, keep_g, p) @ vg.astype(dt, copy=False)).astype(q.dtype, copy=False)
    return o, (qg, kg, vg, probs, keep_g, p)


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = True,
    positions: np.ndarray | None = None,
    dropout_keep: np.ndarray | None = None,
    dropout_p: float = 0.0,
) -> np.ndarray:
    """Scaled dot-product attention, multi-head, grouped-query or multi-query: ``o [B, S, N, H]``.

    ``softmax(q k^T / sqrt(H)) @ v`` per head; query head ``n`` reads kv head ``n // (N // K)``.
    ``causal`` masks keys whose position is after the query's; ``positions [S]`` gives each
    row's position (default ``arange(S)``; a context-parallel program passes its permuted
    order). ``dropout_keep [B, N, S, S]`` drops attention probabilities with probability
    ``dropout_p``. The softmax runs in float32 (float64 for float64 inputs).

    >>> rng = np.random.default_rng(1)
    >>> q, k, v = (rng.standard_normal((2, 5, 4, 8)) for _ in range(3))
    >>> o = attention(q, k[:, :, :2], v[:, :, :2])  # 4 query heads over 2 kv heads
    >>> bool(np.allclose(o[:, :, 1], attention(q[:, :, 1:2], k[:, :, :1], v[:, :, :1])[:, :, 0]))
    True
    """
    return attention_forward(q, k, v, causal=causal, positions=positions, keep=dropout_keep, p=dropout_p)[0]


def attention_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    *,
    causal: bool = True,
    positions: np.ndarray | None = None,
    dropout_keep: np.ndarray | None = None,
    dropout_p: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dq, dk, dv)`` for the output cotangent ``do [B, S, N, H]``; the probabilities are recomputed.

    With ``P = softmax(Z)``, ``Z = q k^T / sqrt(H)``, ``P' = drop(P)``, ``o = P' v``:
    ``dv = P'^T do`` (summed over a kv head's group), ``dP = drop(do v^T)``,
    ``dZ = P * (dP - rowsum(dP * P))``, ``dq = dZ k / sqrt(H)``, ``dk = dZ^T q / sqrt(H)``.

    >>> x = np.random.default_rng(0).standard_normal((1, 4, 2, 8))
    >>> [g.shape for g in attention_backward(x, x[:, :, :1], x[:, :, :1], x)]
    [(1, 4, 2, 8), (1, 4, 1, 8), (1, 4, 1, 8)]
    """
    _, saved = attention_forward(q, k, v, causal=causal, positions=positions, keep=dropout_keep, p=dropout_p)
    return attention_grads(saved, do)


def attention_grads(saved: Saved, do: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The backward pass of :func:`attention` from what :func:`attention_forward` saved.

    >>> x = np.ones((1, 2, 2, 4))
    >>> [g.shape for g in attention_grads(attention_forward(x, x[:, :, :1], x[:, :, :1])[1], x)]
    [(1, 2, 2, 4), (1, 2, 1, 4), (1, 2, 1, 4)]
    """
    qg, kg, vg, probs, keep, p = saved
    dt = probs.dtype
    b, kv, g, s, h = qg.shape
    dog = do.reshape(b, s, kv, g, h).transpose(0, 2, 3, 1, 4).astype(dt, copy=False)
    dv = (dropout(probs, keep, p).swapaxes(-1, -2) @ dog).sum(axis=2)
    dprobs = dropout(dog @ vg.astype(dt, copy=False).swapaxes(-1, -2), keep, p)
    dz = probs * (dprobs - (dprobs * probs).sum(axis=-1, keepdims=True)) * dt.type(h**-0.5)
    dq = _ungroup(dz @ kg.astype(dt, copy=False))
    dk = (dz.swapaxes(-1, -2) @ qg.astype(dt, copy=False)).sum(axis=2)
    return (
        dq.astype(qg.dtype, copy=False),
        dk.transpose(0, 2, 1, 3).astype(kg.dtype, copy=False),
        dv.transpose(0, 2, 1, 3).astype(vg.dtype, copy=False),
    )


# -- loss --------------------------------------------------------------------------------------
def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(compute_dtype(logits), copy=False)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> float:
    """Mean softmax cross-entropy of ``logits [..., V]`` against integer ``targets [...]``.

    >>> round(cross_entropy(np.zeros((2, 4)), np.array([0, 3])), 6) == round(float(np.log(4)), 6)
    True
    """
    logp = _log_softmax(logits)
    picked = np.take_along_axis(logp, np.asarray(targets)[..., None], axis=-1)
    return float(-picked.mean())


def cross_entropy_backward(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The gradient of the mean cross-entropy: ``(softmax(logits) - onehot(targets)) / tokens``.

    >>> cross_entropy_backward(np.zeros((1, 2)), np.array([1])).tolist()
    [[0.5, -0.5]]
    """
    grad = np.exp(_log_softmax(logits))
    t = np.asarray(targets)[..., None]
    np.put_along_axis(grad, t, np.take_along_axis(grad, t, axis=-1) - 1.0, axis=-1)
    return grad / t.size
