"""FlashAttention on one block (Dao et al. 2022): every chip holds the whole sequence, nothing moves.

The same block step as ring and all-gather attention with a single key block, the chip's
own: the online softmax runs over the kernel's 128-row tiles (the FLOPs count the tile pairs
the causal mask leaves visible), the output and its log-sum-exp are kept, and the backward
pass recomputes the probabilities from them. No ``[B, N, S, S]`` value outlives its step.
"""

from __future__ import annotations

from ...array import ShardedArray
from . import steps
from .problem import Geometry


def forward(
    g: Geometry, q: ShardedArray, k: ShardedArray, v: ShardedArray, pos: ShardedArray | None
) -> tuple[ShardedArray, ShardedArray]:
    """``(o, lse)`` of the chip's queries against its own keys."""
    return steps.finish(g, steps.forward_block(g, q, k, v, pos, pos, steps.start(g)), q)


def backward(
    g: Geometry,
    q: ShardedArray,
    k: ShardedArray,
    v: ShardedArray,
    pos: ShardedArray | None,
    rows: tuple[ShardedArray, ShardedArray],
    do: ShardedArray,
) -> tuple[ShardedArray, ShardedArray, ShardedArray]:
    """``(dq, dk, dv)`` from one block step."""
    dq = g.filled(g.acc_layout, 0.0, "dQ")
    grads = steps.backward_block(g, q, do, rows, k, v, pos, pos, steps.Grads(dq), (g.kv_layout, g.shape(g.kv_layout)))
    assert grads.dk is not None and grads.dv is not None
    return grads.dq, grads.dk, grads.dv
