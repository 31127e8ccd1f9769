"""Context parallelism inside ``run_model``: the sequence split over the context axis.

Every layer but attention works on its own tokens, so the residual stream is simply
``[B_data, S_context, D]``; attention calls :func:`shardsim.strategies.context.context_attention` (ring
or all-gather) and its backward. Under a causal mask the sequence is permuted up front by
the balanced (zigzag) order of :func:`shardsim.strategies.context.balanced_order`, so contiguous
``S/cp`` blocks hold chunks ``i`` and ``2cp-1-i`` and every chip does the same work; the
tokens, the targets, the learned positions and RoPE's angles all follow the real positions.
The loss is a mean over all tokens, so the order does not change it; ``pos_embed``'s
gradient is put back in the natural order. Without a context axis, under
``attention=flash``, :func:`forward` and :func:`backward` run one FlashAttention block on
every chip's whole sequence (positions ``0 .. S-1``).

>>> order(8, 2, balanced=True).tolist(), order(8, 2, balanced=False).tolist()
([0, 1, 6, 7, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6, 7])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..array import ShapeDtype, ShardedArray, shard
from ..mesh import Mesh
from ..pieces import blockwise
from ..strategies.context import AttentionSaved, balanced_order, context_attention, context_attention_backward
from ..strategies.context.problem import geometry
from ..xp import namespace, scatter_set
from .local import per_chip
from .roles import Roles


def order(seq: int, cp: int, *, balanced: bool) -> np.ndarray:
    """The global position of each row of the context-parallel sequence (contiguous: ``arange``)."""
    return balanced_order(seq, cp) if balanced else np.arange(seq)


def permuted(ids: Any, rows: np.ndarray) -> Any:
    """Token ids ``[B, S]`` in the order ``rows`` (shape-only ids have no order to change, and
    placed ids, an engine's blocks, were put in it before they were placed)."""
    return ids if isinstance(ids, (ShapeDtype, ShardedArray)) else np.asarray(ids)[:, rows]


def positions(mesh: Mesh, roles: Roles, rows: np.ndarray) -> ShardedArray:
    """``rows`` as the int ``[S_context]`` the attention's causal mask reads (data even when shape-only)."""
    return shard(rows, mesh, f"[S_{roles.context}]", label="positions")


def permute_rows(x: ShardedArray, index: np.ndarray, label: str) -> ShardedArray:
    """``x[index]`` along dimension 0, which every chip holds whole (no communication)."""
    nm = len(x.mesh.shape)
    return blockwise(lambda a: a[(slice(None),) * nm + (index,)], [x], (x.layout, x.global_shape, x.dtype), label=label)


def position_grads(dx: ShardedArray, pos: ShardedArray, partial: tuple[str, ...]) -> ShardedArray:
    """``dPos [S, D]``: each chip's ``dx [B, S_C, D]`` summed over B into the rows of its real
    positions, zeros elsewhere; partial over ``partial`` (the data and context axes)."""
    nm, (seq, d) = len(dx.mesh.shape), (dx.global_shape[1], dx.global_shape[2])
    if dx.is_shape_only:
        pos = shard(ShapeDtype(pos.global_shape, pos.dtype), pos.mesh, pos.layout, label="positions")

    def fn(a: np.ndarray, p: np.ndarray) -> np.ndarray:
        def one(ab: np.ndarray, pb: np.ndarray) -> np.ndarray:
            out = namespace(ab).zeros((seq, d), ab.dtype)
            return scatter_set(out, (pb,), ab.sum(axis=0), where=pb >= 0)  # each position once

        return per_chip(one, a, p, nm=nm)

    layout = "[S, D]{" + ", ".join(f"U_{a}" for a in partial) + "}"
    return blockwise(fn, [dx, pos], (layout, (seq, d), dx.dtype), label="dpos_embed")


def _positions(pos: ShardedArray | None, q: ShardedArray) -> ShardedArray:
    """The rows' positions: the context-parallel order, or ``0..S-1`` on every chip without a context axis."""
    return pos if pos is not None else shard(np.arange(q.global_shape[1]), q.mesh, "[S]", label="positions")


def forward(
    roles: Roles, pos: ShardedArray | None, q: ShardedArray, k: ShardedArray, v: ShardedArray
) -> tuple[ShardedArray, ShardedArray]:
    """``(o, lse)``: attention of every chip's queries ``[B, S_C, N_Y, H]`` over the whole sequence
    (ring or all-gather over the context axis, or one FlashAttention block without one)."""
    o, saved = context_attention(q, k, v, _positions(pos, q), axis=roles.context, causal=True, method=roles.cp_method)
    return o.named("O"), saved.lse


def backward(
    roles: Roles,
    pos: ShardedArray | None,
    q: ShardedArray,
    k: ShardedArray,
    v: ShardedArray,
    o: ShardedArray,
    lse: ShardedArray,
    do: ShardedArray,
) -> tuple[ShardedArray, ShardedArray, ShardedArray]:
    """``(dq, dk, dv)`` from the stored q, k, v, output and log-sum-exp (the scores are recomputed)."""
    p = _positions(pos, q)
    g = geometry(q, k, v, p, axis=roles.context, causal=True, scale=None, method=roles.cp_method)
    return context_attention_backward(AttentionSaved(g, roles.cp_method, q, k, v, p, o, lse), do)
