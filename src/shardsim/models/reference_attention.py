"""Attention and rotary position embeddings on plain NumPy arrays, with hand-derived backward passes.

Shapes: queries ``q [B, S, N, H]``, keys and values ``k, v [B, S, K, H]``, attention
probabilities ``[B, N, S, S]`` (query rows, key columns). Query head ``n`` reads kv head
``n // (N // K)``: the groups of grouped-query attention are contiguous, so splitting the
heads evenly over chips gives each chip whole groups. The softmax runs in float32 (float64
when an input is float64); the output keeps the queries' dtype.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> q, k, v = rng.standard_normal((1, 3, 2, 4)), rng.standard_normal((1, 3, 1, 4)), rng.standard_normal((1, 3, 1, 4))
>>> o = attention(q, k, v)  # two query heads share one kv head (multi-query)
>>> o.shape, bool(np.allclose(o[0, 0, 1], v[0, 0, 0]))  # the first token sees only itself
((1, 3, 2, 4), True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..xp import namespace
from .reference_pieces import compute_dtype, dropout


# -- rotary position embedding -----------------------------------------------------------------
def _rotation(positions: np.ndarray, head_dim: int, theta: float, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``cos, sin [S, 1, H/2]`` of angle ``position * theta^(-2j/H)`` (Su et al. 2021)."""
    xp = namespace(positions)
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    # float64 on NumPy; on JAX the widest float it runs (float32 unless jax_enable_x64)
    pos = np.asarray(positions, dtype=np.float64) if xp is np else xp.asarray(positions) * xp.asarray(1.0)
    angle = pos[:, None, None] * inv_freq
    return xp.cos(angle).astype(dtype), xp.sin(angle).astype(dtype)


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
    half, xp = x.shape[-1] // 2, namespace(x)  # any engine's blocks: NumPy's, or jax.numpy's in shard_map
    x1, x2 = x[..., :half], x[..., half:]
    return xp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


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
# Inside, the G query heads of each kv head are stacked into one matrix [B, K, G*S, H], so each
# product is one contiguous batched matmul per kv head (NumPy's BLAS path needs contiguous
# operands; a transposed view falls back to a loop many times slower).
@dataclass(frozen=True)
class Saved:
    """What :func:`attention_forward` keeps for :func:`attention_grads`: operands in the softmax dtype."""

    q: np.ndarray  # [B, K, G*S, H]
    k: np.ndarray  # [B, K, S, H]
    v: np.ndarray  # [B, K, S, H]
    probs: np.ndarray  # [B, K, G*S, S], before dropout
    keep: np.ndarray | None  # [B, K, G*S, S]
    p: float
    dtypes: tuple[np.dtype, np.dtype, np.dtype]  # of the caller's q, k, v


def _check(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    if q.ndim != 4 or k.shape != v.shape or k.ndim != 4 or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ShapeError(
            f"attention takes q [B, S, N, H] and k, v [B, S, K, H] with equal B, S, H; got q {q.shape}, "
            f"k {k.shape}, v {v.shape}"
        )
    if q.shape[2] % k.shape[2]:
        raise ShapeError(
            f"attention: {q.shape[2]} query heads do not divide into groups over {k.shape[2]} kv heads (q {q.shape})"
        )


def _heads_first(x: np.ndarray, kv: int, dt: np.dtype) -> np.ndarray:
    """``[B, S, K*G, H]`` as a contiguous ``[B, K, G*S, H]``: query head ``n = k*G + g`` in group ``k``."""
    b, s, n, h = x.shape
    g = n // kv
    return np.ascontiguousarray(x.reshape(b, s, kv, g, h).transpose(0, 2, 3, 1, 4), dtype=dt).reshape(b, kv, g * s, h)


def _heads_last(x: np.ndarray, s: int) -> np.ndarray:
    """``[B, K, G*S, H]`` back to ``[B, S, K*G, H]``."""
    b, kv, gs, h = x.shape
    return x.reshape(b, kv, gs // s, s, h).transpose(0, 3, 1, 2, 4).reshape(b, s, kv * (gs // s), h)


def _softmax_probs(q: np.ndarray, k: np.ndarray, s: int, causal: bool, positions: np.ndarray | None) -> np.ndarray:
    """Softmax over the keys of ``q k^T / sqrt(H)``, ``[B, K, G*S, S]``, computed in place."""
    b, kv, gs, h = q.shape
    scores = q @ np.ascontiguousarray(k.swapaxes(-1, -2))
    scores *= scores.dtype.type(h**-0.5)
    if causal:
        pos = np.arange(s) if positions is None else np.asarray(positions)
        if pos.shape != (s,):
            raise ShapeError(f"attention: positions must be [S] = [{s}], got shape {pos.shape}")
        later = pos[None, :] > pos[:, None]  # key position after the query position
        np.copyto(scores.reshape(b, kv, gs // s, s, s), -np.inf, where=later)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


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
    >>> o.shape, saved.probs.shape  # the probabilities, [B, K, G*S, S]
    ((1, 2, 2, 4), (1, 2, 2, 2))
    """
    _check(q, k, v)
    dt, s, kv = compute_dtype(q, k, v), q.shape[1], k.shape[2]
    qh, kh, vh = _heads_first(q, kv, dt), _heads_first(k, kv, dt), _heads_first(v, kv, dt)
    probs = _softmax_probs(qh, kh, s, causal, positions)
    keep_h = None if keep is None else keep.reshape(probs.shape)
    o = _heads_last(dropout(probs, keep_h, p) @ vh, s).astype(q.dtype, copy=False)
    return o, Saved(qh, kh, vh, probs, keep_h, p, (q.dtype, k.dtype, v.dtype))


def attention_probs(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = True, positions: np.ndarray | None = None
) -> np.ndarray:
    """The attention probabilities ``[B, N, S, S]`` (query rows, key columns), in float32/float64.

    >>> p = attention_probs(*[np.zeros((1, 3, 2, 4))] * 3)
    >>> p.shape, p[0, 0, 2].tolist()
    ((1, 2, 3, 3), [0.3333333333333333, 0.3333333333333333, 0.3333333333333333])
    """
    probs = attention_forward(q, k, v, causal=causal, positions=positions)[1].probs
    return probs.reshape(q.shape[0], q.shape[2], q.shape[1], q.shape[1])


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
    q, k, v, probs = saved.q, saved.k, saved.v, saved.probs
    s, h, kv = k.shape[2], k.shape[3], k.shape[1]
    doh = _heads_first(do, kv, probs.dtype)
    # dv^T = do^T P' and dk^T = q^T dZ: the small operand transposed, so both matmuls stay contiguous
    dv = np.ascontiguousarray(doh.swapaxes(-1, -2)) @ dropout(probs, saved.keep, saved.p)
    dz = dropout(doh @ np.ascontiguousarray(v.swapaxes(-1, -2)), saved.keep, saved.p)
    dz -= (dz * probs).sum(axis=-1, keepdims=True)
    dz *= probs
    dz *= dz.dtype.type(h**-0.5)
    dq = _heads_last(dz @ k, s)
    dk = np.ascontiguousarray(q.swapaxes(-1, -2)) @ dz
    qt, kt, vt = saved.dtypes
    return (
        dq.astype(qt, copy=False),
        dk.transpose(0, 3, 1, 2).astype(kt, copy=False),
        dv.transpose(0, 3, 1, 2).astype(vt, copy=False),
    )
