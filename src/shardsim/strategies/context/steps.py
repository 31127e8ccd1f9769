"""One block step of context-parallel attention, on sharded values: what a chip does with one K/V block.

Ring attention and all-gather attention differ only in how a chip comes to hold each key
block (it arrives from the ring neighbour, or it is a slice of the gathered K/V); the step
is the same. Forward: the block's scores and the online softmax (a traced matmul ``Q @ K^T``
giving the score block), then the running output (``P @ V``). Backward: the probabilities
recomputed from the saved log-sum-exp, then ``dO @ V^T`` (giving dS), ``P^T @ dO``,
``dS^T @ Q`` and ``dS @ K``. Each matmul is one trace event with the FLOPs of the tile pairs
the causal mask leaves visible (:meth:`Geometry.record`).

Ledger categories: the score blocks ``P`` and ``dS`` (``[B, N, S/cp, S/cp]``, float32; one
128-row tile without a context axis, :meth:`Geometry.scores`) are ``scores``; running
statistics, accumulators and K/V blocks in flight are ``temporaries``; the saved output and
log-sum-exp are ``activations``. Heads come first in the running
values (``[B, N, S_C, ...]``), as the kernels hold them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...array import ShardedArray
from ...layout import Layout
from ...xp import namespace
from . import kernels
from .problem import Geometry


@dataclass
class Running:
    """The online softmax's state for a chip's queries: max ``m``, sum ``l``, unnormalised output."""

    m: ShardedArray  # [B, N, S_C]
    l: ShardedArray  # noqa: E741 - the paper's name: [B, N, S_C]
    acc: ShardedArray  # [B, N, S_C, H]


def start(g: Geometry) -> Running:
    """No key seen yet: ``m = -inf``, ``l = 0``, ``acc = 0``."""
    rows = g.rows_layout
    return Running(g.filled(rows, -np.inf, "m"), g.filled(rows, 0.0, "l"), g.filled(g.acc_layout, 0.0, "O acc"))


def _data(x: ShardedArray | None) -> np.ndarray | None:
    return None if x is None else x.compact()


def _rows(g: Geometry, x: ShardedArray) -> np.ndarray:
    """A ``[B, N, S]`` value's blocks as ``(..., B, K, G, S)``."""
    return kernels.split_heads(x.compact(), g.kv_local, 1)


def forward_block(
    g: Geometry,
    q: ShardedArray,
    k: ShardedArray,
    v: ShardedArray,
    pos_q: ShardedArray | None,
    pos_k: ShardedArray | None,
    run: Running,
) -> Running:
    """Fold one key block into ``run``; the FLOPs count the tile pairs the positions leave visible."""
    work = g.work_on(pos_q, pos_k)
    m = ll = alpha = acc = None
    if g.has_data:
        s = kernels.scores(q.compact(), k.compact(), _data(pos_q), _data(pos_k), g.scale, g.causal, g.compute)
        p, m, ll, alpha = kernels.online_softmax(s, _rows(g, run.m), _rows(g, run.l))
        acc = kernels.accumulate(kernels.split_heads(run.acc.compact(), g.kv_local, 2), alpha, p, v.compact())
        acc = kernels.merge_heads(acc, 2)
        m, ll, alpha = (kernels.merge_heads(x, 1) for x in (m, ll, alpha))
    scores = g.scores("scores")
    g.record([q, k], scores, work)  # S = Q @ K^T, then P = exp(S - m_new) in place
    new = Running(g.value(g.rows_layout, m, "m"), g.value(g.rows_layout, ll, "l"), run.acc)
    rescale = g.value(g.rows_layout, alpha, "alpha")
    new.acc = g.value(g.acc_layout, acc, "O acc")
    g.record([scores, v], new.acc, work)  # acc = alpha * acc + P @ V
    del scores, rescale
    return new


def finish(g: Geometry, run: Running, q: ShardedArray) -> tuple[ShardedArray, ShardedArray]:
    """``(o, lse)``: the output ``[B, S_C, N, H]`` in q's dtype and the rows' log-sum-exp (saved)."""
    o = lse = None
    if g.has_data:
        og, lse = kernels.finish(run.acc.compact(), run.m.compact(), run.l.compact())
        o = namespace(og).swapaxes(og, -2, -3)  # (..., B, N, S, H) -> (..., B, S, N, H)
    out = g.value(q.layout, o, "O", "activations", shape=q.global_shape, dtype=q.dtype)
    return out, g.value(g.rows_layout, lse, "lse", "activations")


def delta(g: Geometry, o: ShardedArray, do: ShardedArray) -> ShardedArray:
    """``rowsum(dO * O)`` per query row and head, ``[B, N, S_C]``: the softmax backward's correction."""
    data = None
    if g.has_data:
        prod = (do.compact().astype(g.compute) * o.compact().astype(g.compute)).sum(axis=-1)  # (..., B, S, N)
        data = namespace(prod).swapaxes(prod, -1, -2)
    return g.value(g.rows_layout, data, "delta")


@dataclass
class Grads:
    """A chip's running ``dq [B, N, S_C, H]`` and one key block's ``dk``/``dv`` (None: none yet)."""

    dq: ShardedArray
    dk: ShardedArray | None = None
    dv: ShardedArray | None = None


def backward_block(
    g: Geometry,
    q: ShardedArray,
    do: ShardedArray,
    rows: tuple[ShardedArray, ShardedArray],
    k: ShardedArray,
    v: ShardedArray,
    pos_q: ShardedArray | None,
    pos_k: ShardedArray | None,
    grads: Grads,
    kv_out: tuple[Layout, tuple[int, ...]],
) -> Grads:
    """One key block's share of the gradients, added to ``grads``.

    ``rows`` is ``(lse, delta)``; ``kv_out`` the layout and global shape of the block's
    ``dk``/``dv`` (the travelling ``[B, S_C, K, H]`` of the ring, or a partial sum over the
    context axis for all-gather attention).
    """
    kv = g.kv_local
    work = g.work_on(pos_q, pos_k)
    dv_d = dk_d = dq_d = None
    if g.has_data:
        s = kernels.scores(q.compact(), k.compact(), _data(pos_q), _data(pos_k), g.scale, g.causal, g.compute)
        p = kernels.probabilities(s, _rows(g, rows[0]))
        dog = kernels.grouped(do.compact().astype(g.compute), kv)
        ds = kernels.score_grad(p, dog, v.compact(), _rows(g, rows[1]))
        dv_d = kernels.kv_last(namespace(p).swapaxes(p, -1, -2) @ dog)
        dk_d = (
            kernels.kv_last(namespace(ds).swapaxes(ds, -1, -2) @ kernels.grouped(q.compact().astype(g.compute), kv))
            * g.scale
        )
        dq_d = kernels.merge_heads(ds @ kernels.kv_first(k.compact().astype(g.compute)), 2) * g.scale
        if grads.dk is not None and grads.dv is not None:
            dk_d, dv_d = grads.dk.compact() + dk_d, grads.dv.compact() + dv_d
        dq_d = grads.dq.compact() + dq_d
    layout, shape = kv_out
    scores = g.scores("scores")
    g.record([q, k], scores, work)  # S = Q @ K^T again, P = exp(S - lse)
    dscores = g.scores("dS")
    g.record([do, v], dscores, work)  # dP = dO @ V^T, dS = P * (dP - delta)
    dv = g.value(layout, dv_d, "dV", shape=shape)
    g.record([scores, do], dv, work)  # dV += P^T @ dO
    del scores
    dk = g.value(layout, dk_d, "dK", shape=shape)
    g.record([dscores, q], dk, work)  # dK += scale * dS^T @ Q
    dq = g.value(g.acc_layout, dq_d, "dQ")
    g.record([dscores, k], dq, work)  # dQ += scale * dS @ K
    return Grads(dq, dk, dv)


def dq_out(g: Geometry, dq: ShardedArray, q: ShardedArray) -> ShardedArray:
    """The accumulated ``dQ [B, N, S_C, H]`` in q's layout and dtype, ``[B, S_C, N, H]``."""
    data = None if not g.has_data else namespace(dq.compact()).swapaxes(dq.compact(), -2, -3)
    return g.value(q.layout, data, "dQ", "grads", shape=q.global_shape, dtype=q.dtype)
