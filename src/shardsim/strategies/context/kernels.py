"""The attention arithmetic of one (query block, key block) pair, on chip blocks in their own namespace.

Every array carries any leading dimensions (the mesh's, size 1 where a value is replicated)
followed by its block. Queries come as ``[..., B, S, N, H]`` and keys/values as
``[..., B, T, K, H]``; inside, the N query heads are grouped by the kv head they use
(query head ``n`` uses kv head ``n // G``, ``G = N // K``: groups are contiguous), so a
grouped query is ``[..., B, K, G, S, H]`` and ``[..., B, N, S, ...]`` is the same memory.

The forward pass is the online softmax of FlashAttention (Dao et al. 2022) and Ring Attention
(Liu et al. 2023): per query row a running max ``m`` and sum ``l`` and an unnormalised output,
rescaled by ``exp(m_old - m_new)`` when a key block raises the max. The backward pass
recomputes each block's probabilities from the saved log-sum-exp ``lse = m + log l``.

>>> import numpy as np
>>> q = np.ones((1, 2, 2, 4)); k = v = np.ones((1, 3, 1, 4))       # B=1, S=2, N=2, T=3, K=1
>>> s = scores(q, k, np.array([0, 1]), np.array([0, 1, 2]), 0.5, True, np.dtype("float64"))
>>> s.shape, bool(np.isinf(s[0, 0, 0, 0, 1]))                     # key 1 is after query 0: masked
((1, 1, 2, 2, 3), True)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...xp import namespace


def compute_dtype(dtype: Any) -> np.dtype:
    """The dtype scores and softmax run in: float64 for float64 inputs, else float32."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def grouped(x: np.ndarray, kv: int) -> np.ndarray:
    """``[..., B, S, N, H]`` → ``[..., B, K, G, S, H]`` (query heads grouped by kv head)."""
    *lead, b, s, n, h = x.shape
    return namespace(x).moveaxis(x.reshape(*lead, b, s, kv, n // kv, h), -4, -2)


def ungrouped(x: np.ndarray) -> np.ndarray:
    """``[..., B, K, G, S, H]`` → ``[..., B, S, N, H]``: the inverse of :func:`grouped`."""
    y = namespace(x).moveaxis(x, -2, -4)  # (..., B, S, K, G, H)
    return y.reshape(*y.shape[:-3], y.shape[-3] * y.shape[-2], y.shape[-1])


def kv_first(k: np.ndarray) -> np.ndarray:
    """``[..., B, T, K, H]`` → ``[..., B, K, 1, T, H]``: broadcasts over the G heads of a group."""
    return namespace(k).moveaxis(k, -3, -2)[..., None, :, :]


def kv_last(dk: np.ndarray) -> np.ndarray:
    """``[..., B, K, G, T, H]`` summed over the group → ``[..., B, T, K, H]`` (a kv block's gradient)."""
    return namespace(dk).moveaxis(dk.sum(axis=-3), -3, -2)


def split_heads(x: np.ndarray, kv: int, after: int) -> np.ndarray:
    """Split the head dimension (``after`` dimensions from the end) into ``(K, G)``: N → kv heads × group."""
    i = x.ndim - 1 - after
    return x.reshape(*x.shape[:i], kv, x.shape[i] // kv, *x.shape[i + 1 :])


def merge_heads(x: np.ndarray, after: int) -> np.ndarray:
    """Merge ``(K, G)`` (``after`` dimensions from the end) back into the N query heads."""
    i = x.ndim - 2 - after
    return x.reshape(*x.shape[:i], x.shape[i] * x.shape[i + 1], *x.shape[i + 2 :])


def scores(
    q: np.ndarray,
    k: np.ndarray,
    pos_q: np.ndarray | None,
    pos_k: np.ndarray | None,
    scale: float,
    causal: bool,
    dt: np.dtype,
) -> np.ndarray:
    """``scale * q @ k^T`` per head, ``[..., B, K, G, S, T]``, ``-inf`` where a key comes after its query."""
    xp = namespace(q)
    s = grouped(q.astype(dt), k.shape[-2]) @ xp.swapaxes(kv_first(k.astype(dt)), -1, -2)
    s = s * dt.type(scale)
    if causal:
        assert pos_q is not None and pos_k is not None
        allowed = pos_k[..., None, :] <= pos_q[..., :, None]  # (..., S, T)
        s = xp.where(allowed[..., None, None, None, :, :], s, -np.inf)
    return s


def _shift(m: np.ndarray) -> np.ndarray:
    """The shift a row's exponentials use: its max, or 0 while every key it saw scored ``-inf``.

    Only ``-inf`` is replaced (``-inf - -inf`` would be NaN for a row with no key yet); a NaN or
    ``+inf`` max stays, so the row's exponentials, sum and output turn NaN as the plain softmax's
    ``exp(s - max(s))`` does.
    """
    return namespace(m).where(m == -np.inf, 0.0, m)


def online_softmax(s: np.ndarray, m: np.ndarray, l: np.ndarray) -> tuple[np.ndarray, ...]:  # noqa: E741
    """One key block into the running softmax: ``(p, m_new, l_new, alpha)``, all grouped.

    ``p = exp(s - m_new)`` (0 where masked), ``alpha = exp(m - m_new)`` the factor the rows'
    earlier sums and outputs are rescaled by, ``l_new = alpha * l + sum(p)``.
    """
    xp = namespace(s)
    m_new = xp.maximum(m, s.max(axis=-1))  # NaN if any score is NaN (maximum propagates it)
    shift = _shift(m_new)
    with np.errstate(invalid="ignore"):  # inf - inf: a NaN the plain softmax has too
        p = xp.exp(s - shift[..., None])
        alpha = xp.exp(m - shift)
    return p, m_new, alpha * l + p.sum(axis=-1), alpha


def accumulate(acc: np.ndarray, alpha: np.ndarray, p: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``alpha * acc + p @ v``: the running, unnormalised output ``[..., B, K, G, S, H]``."""
    return acc * alpha[..., None] + p @ kv_first(v.astype(p.dtype))


def finish(acc: np.ndarray, m: np.ndarray, l: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # noqa: E741
    """``(o, lse)``: the normalised output and ``m + log l``.

    A row whose every score was ``-inf`` has ``l = 0``: its output is ``0 / 0``, NaN, as the
    plain softmax's ``exp(-inf - -inf)`` is; a NaN ``m`` or ``l`` carries through to both.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        return acc / l[..., None], m + namespace(l).log(l)


def probabilities(s: np.ndarray, lse: np.ndarray) -> np.ndarray:
    """The block's softmax probabilities recomputed from the scores and the rows' log-sum-exp.

    Unguarded: a NaN ``lse`` gives a NaN row, and ``lse = -inf`` (every score ``-inf``) gives
    ``exp(-inf - -inf)``, NaN, exactly where the plain softmax's probabilities are NaN.
    """
    with np.errstate(invalid="ignore"):
        return namespace(s).exp(s - lse[..., None])


def score_grad(p: np.ndarray, do: np.ndarray, v: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """``dS = P * (dO @ V^T - delta)``, grouped; ``delta = rowsum(dO * O)`` (the softmax backward)."""
    dp = do @ namespace(do).swapaxes(kv_first(v.astype(p.dtype)), -1, -2)
    return p * (dp - delta[..., None])
