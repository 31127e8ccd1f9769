"""All-gather attention (the Llama 3 paper's context parallelism): gather K/V, attend locally.

Forward: AllGather K and V (and the positions) over the context axis, then each chip runs
its queries against the gathered sequence, one ``S/cp`` block at a time with the online
softmax, so the score blocks stay ``(S/cp)²``. Backward: AllGather K and V again (only the
chip's own blocks were kept), the same block steps give each chip's share of every block's
dK/dV (a partial sum over the context axis), and a ReduceScatter brings each chip its own
blocks' sums. The gathered K/V are full length: cheap when K/V are much smaller than Q
(GQA), which is when this beats the ring.
"""

from __future__ import annotations

from ...array import ShardedArray
from ...collectives import all_gather, reduce_scatter
from ...pieces import concat, split
from . import steps
from .problem import Geometry


def _gathered(g: Geometry, x: ShardedArray) -> list[ShardedArray]:
    """The cp blocks of ``x`` gathered over the context axis (views of one gathered buffer)."""
    full = all_gather(x, g.context_axis, label=x.label).as_category("temporaries")
    return split(full, 1 if x.ndim > 1 else 0, g.cp)


def _blocks(g: Geometry, pos: ShardedArray | None) -> list[ShardedArray | None]:
    """The gathered positions' blocks (None each when not causal: no mask, nothing to gather)."""
    return [None] * g.cp if pos is None else list(_gathered(g, pos))


def forward(
    g: Geometry, q: ShardedArray, k: ShardedArray, v: ShardedArray, pos: ShardedArray | None
) -> tuple[ShardedArray, ShardedArray]:
    """``(o, lse)`` of the chip's queries against the gathered K/V, block by block."""
    ks, vs, ps = _gathered(g, k), _gathered(g, v), _blocks(g, pos)
    run = steps.start(g)
    for j in range(g.cp):
        run = steps.forward_block(g, q, ks[j], vs[j], pos, ps[j], run)  # every chip takes block j
    return steps.finish(g, run, q)


def backward(
    g: Geometry,
    q: ShardedArray,
    k: ShardedArray,
    v: ShardedArray,
    pos: ShardedArray | None,
    rows: tuple[ShardedArray, ShardedArray],
    do: ShardedArray,
) -> tuple[ShardedArray, ShardedArray, ShardedArray]:
    """``(dq, dk, dv)``: regather K/V, every block's partial dK/dV, ReduceScatter over the context axis."""
    ks, vs, ps = _gathered(g, k), _gathered(g, v), _blocks(g, pos)
    seq = g.kv_layout.dims[1].name
    # a block's dK/dV on one chip: its queries' share, a partial sum over the context axis
    partial = (g.kv_layout.with_dim(1, ()).with_partial((g.context_axis,)), (g.batch, g.rows, g.kv_heads, g.head_dim))
    dq = g.filled(g.acc_layout, 0.0, "dQ")
    dks: list[ShardedArray] = []
    dvs: list[ShardedArray] = []
    for j in range(g.cp):
        grads = steps.backward_block(g, q, do, rows, ks[j], vs[j], pos, ps[j], steps.Grads(dq), partial)
        assert grads.dk is not None and grads.dv is not None
        dq = grads.dq
        dks.append(grads.dk)
        dvs.append(grads.dv)
    del ks, vs, ps, grads
    dk_full = concat(dks, seq)
    dks.clear()
    dk = reduce_scatter(dk_full, g.context_axis, seq, label="dK")
    del dk_full
    dv_full = concat(dvs, seq)
    dvs.clear()
    dv = reduce_scatter(dv_full, g.context_axis, seq, label="dV")
    return dq, dk, dv
