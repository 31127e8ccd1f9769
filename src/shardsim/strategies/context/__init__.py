"""Context parallelism: attention over a sequence split along a mesh axis (ring or all-gather).

``context_attention(q, k, v, positions, axis="C")`` takes a chip's query block ``q [B, S_C, N, H]``
and key/value blocks ``k``, ``v`` ``[B, S_C, K, H]`` (the heads may also be split over a
model axis, ``[B, S_C, N_Y, H]``; ``K < N`` is grouped-query attention, groups contiguous)
and returns the attention output ``o [B, S_C, N, H]`` and what the backward pass needs.
``positions [S_C]`` gives the global position of each row: the causal mask compares them,
so a sequence permuted up front by :func:`balanced_order` (chunks ``i`` and ``2cp-1-i`` on
chip ``i``) gives every chip the same work. ``method="ring"`` passes the K/V blocks round the
context ring (:mod:`~shardsim.strategies.context.ring`); ``"all_gather"`` gathers them
(:mod:`~shardsim.strategies.context.gather`). See ``docs/context-parallel.md``.

>>> import numpy as np, shardsim
>>> mesh = shardsim.Mesh(C=4)
>>> order = balanced_order(16, 4)
>>> order[:8].tolist()                      # chip 0: chunks 0 and 7; chip 1: chunks 1 and 6
[0, 1, 14, 15, 2, 3, 12, 13]
>>> x = np.random.default_rng(0).standard_normal((1, 16, 2, 4))[:, order]
>>> q = shardsim.shard(x, mesh, "B S_C N H")
>>> pos = shardsim.shard(order, mesh, "[S_C]")
>>> with shardsim.trace() as t:
...     o, saved = context_attention(q, q, q, pos, axis="C")
>>> [e.op for e in t.events].count("ppermute")   # K, V and positions, cp - 1 steps each
9
>>> dq, dk, dv = context_attention_backward(saved, o)
>>> dq.layout
Layout('[B, S_C, N, H]')
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np

from ...array import ShardedArray, check_same_kind, check_same_mesh
from ...errors import DivisibilityError, ShapeError, ShardingError
from ...ops import cast
from . import flash, gather, ring, steps
from .problem import Geometry, geometry

__all__ = ["AttentionSaved", "balanced_order", "context_attention", "context_attention_backward"]

_METHODS = {"ring": ring, "all_gather": gather}


def _method(g: Geometry, method: str) -> ModuleType:
    """The module that runs it: the ring, the gather, or, without a context axis, one flash block."""
    return flash if g.axis is None else _METHODS[method]


@dataclass(frozen=True)
class AttentionSaved:
    """What :func:`context_attention_backward` reads: the inputs, the output and the rows' log-sum-exp."""

    geometry: Geometry
    method: str
    q: ShardedArray
    k: ShardedArray
    v: ShardedArray
    positions: ShardedArray | None
    o: ShardedArray
    lse: ShardedArray  # [B, N, S_C], float32 (float64 for float64 inputs)


def balanced_order(seq: int, cp: int) -> np.ndarray:
    """The zigzag order of a causal sequence over ``cp`` chips: chunks ``i`` and ``2cp-1-i`` on chip ``i``.

    The sequence is cut into ``2cp`` chunks; contiguous blocks of the returned order hold
    chunks ``(0, 2cp-1), (1, 2cp-2), ...``, an early and a late one, so under a causal mask
    every chip attends to the same number of keys (Megatron-LM's context parallelism).
    ``order[r]`` is the global position of row ``r``: permute tokens as ``tokens[:, order]``.

    >>> balanced_order(8, 2).tolist()
    [0, 1, 6, 7, 2, 3, 4, 5]
    """
    if isinstance(cp, bool) or not isinstance(cp, (int, np.integer)) or cp < 1:
        raise ShardingError(f"balanced_order: cp is the number of chips of the context axis (>= 1), got {cp!r}")
    if isinstance(seq, bool) or not isinstance(seq, (int, np.integer)) or seq < 1 or seq % (2 * cp):
        low = max(1, int(seq) // (2 * cp)) if isinstance(seq, (int, np.integer)) else 1
        fits = [2 * cp * m for m in range(low, low + 3)]
        raise DivisibilityError(
            f"balanced_order: a sequence of {seq!r} tokens does not split into 2*cp = {2 * cp} equal chunks "
            f"(two per chip of a context axis of {cp}); use a length that is a multiple of {2 * cp} "
            f"(e.g. {fits}) or the contiguous split np.arange(seq)"
        )
    chunks = np.arange(seq).reshape(2 * cp, seq // (2 * cp))
    return np.concatenate([np.concatenate([chunks[i], chunks[2 * cp - 1 - i]]) for i in range(cp)])


def context_attention(
    q: ShardedArray,
    k: ShardedArray,
    v: ShardedArray,
    positions: ShardedArray | None,
    *,
    axis: str | None,
    causal: bool = True,
    method: str = "ring",
    scale: float | None = None,
) -> tuple[ShardedArray, AttentionSaved]:
    """Attention of every chip's query block over the whole sequence split along ``axis``.

    ``axis=None``: no context axis; every chip holds the whole sequence ``[B, S, N, H]`` and
    runs FlashAttention on it (positions ``[S]``), with no communication.

    Returns ``(o, saved)``: ``o [B, S_C, N, H]`` in q's dtype and what
    :func:`context_attention_backward` needs. ``scale`` defaults to ``1/sqrt(H)``; scores and
    softmax run in float32 (float64 for float64 inputs). ``positions`` may be None when not
    causal. Bad input raises a :class:`~shardsim.errors.ShardingError` subclass naming it.
    """
    g = geometry(q, k, v, positions, axis=axis, causal=causal, scale=scale, method=method)
    pos = positions if causal else None
    o, lse = _method(g, method).forward(g, q, k, v, pos)
    return o, AttentionSaved(g, method, q, k, v, pos, o, lse)


def context_attention_backward(
    saved: AttentionSaved, do: ShardedArray
) -> tuple[ShardedArray, ShardedArray, ShardedArray]:
    """``(dq, dk, dv)`` for the output gradient ``do`` (laid out like ``o``), in the inputs' dtypes."""
    if not isinstance(saved, AttentionSaved):
        raise ShardingError(
            f"context_attention_backward needs the saved value context_attention returned, got {type(saved).__name__}"
        )
    o = saved.o
    if not isinstance(do, ShardedArray):
        raise ShardingError(f"context_attention_backward: do must be a ShardedArray like {o.describe()}")
    check_same_mesh(o, do)
    check_same_kind(o, do)
    if do.layout != o.layout or do.global_shape != o.global_shape:
        raise ShapeError(
            f"context_attention_backward: do {do.describe()} must have the layout and shape of the output "
            f"{o.describe()}"
        )
    g = saved.geometry
    rows = (saved.lse, steps.delta(g, o, do))
    dq, dk, dv = _method(g, saved.method).backward(g, saved.q, saved.k, saved.v, saved.positions, rows, do)
    dq = steps.dq_out(g, dq, saved.q)
    dk = cast(dk, saved.k.dtype, label="dK", category="grads")
    dv = cast(dv, saved.v.dtype, label="dV", category="grads")
    return dq, dk, dv
