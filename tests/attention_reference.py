"""Single-device attention with positions, and its backward: the reference context-parallel attention is held to.

Plain NumPy on global arrays, written from the definition (no online softmax, no blocks):
``q [B, S, N, H]``, ``k``/``v [B, S, K, H]``; query head n uses kv head ``n // (N // K)``;
scores ``q k^T * scale`` per head, masked where the key's position is after the query's,
softmax over the keys, ``@ v``. Computed in float64.
"""

from __future__ import annotations

import numpy as np


def _expand(k: np.ndarray, heads: int) -> np.ndarray:
    """``[B, S, K, H]`` → ``[B, S, N, H]``: each kv head repeated for the G query heads of its group."""
    return np.repeat(k, heads // k.shape[2], axis=2)


def probabilities(q: np.ndarray, k: np.ndarray, positions: np.ndarray | None, scale: float) -> np.ndarray:
    """Softmax probabilities ``[B, N, S, S]`` (float64)."""
    s = np.einsum("bqnh,bknh->bnqk", q.astype(np.float64), _expand(k, q.shape[2]).astype(np.float64)) * scale
    if positions is not None:
        s = np.where(positions[None, :] <= positions[:, None], s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray | None, scale: float) -> np.ndarray:
    """``o [B, S, N, H]``; ``positions`` None means no mask."""
    p = probabilities(q, k, positions, scale)
    return np.einsum("bnqk,bknh->bqnh", p, _expand(v, q.shape[2]).astype(np.float64))


def attention_backward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray | None, scale: float, do: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dq, dk, dv)`` for the output gradient ``do``; dk/dv summed over each group's query heads."""
    heads, kv = q.shape[2], k.shape[2]
    p = probabilities(q, k, positions, scale)
    do = do.astype(np.float64)
    ve, ke = _expand(v, heads).astype(np.float64), _expand(k, heads).astype(np.float64)
    dv_e = np.einsum("bnqk,bqnh->bknh", p, do)
    dp = np.einsum("bqnh,bknh->bnqk", do, ve)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = np.einsum("bnqk,bknh->bqnh", ds, ke) * scale
    dk_e = np.einsum("bnqk,bqnh->bknh", ds, q.astype(np.float64)) * scale

    def fold(x: np.ndarray) -> np.ndarray:  # sum the G query heads of each kv head
        b, s, _, h = x.shape
        return x.reshape(b, s, kv, heads // kv, h).sum(axis=3)

    return dq, fold(dk_e), fold(dv_e)
