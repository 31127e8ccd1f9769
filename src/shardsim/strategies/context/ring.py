"""Ring attention (Liu et al. 2023): K/V blocks travel the context ring, queries stay home.

Chip ``c`` holds its queries and, at step ``t``, the key/value block of chip ``c - t``
(mod cp): before computing on a block it sends it on to ``c + 1`` with ``ppermute``, so the
transfer runs while the block's attention computes. After cp steps every chip has seen every
block, and no chip ever held more than two K/V blocks (the one in use and the one arriving).

The backward pass runs the ring again: the K/V blocks travel as in the forward pass, and
each block's ``dK``/``dV`` (float32) travel with it, every chip adding its queries' share;
one last hop after the final step brings them home, so they move cp times (K/V cp - 1).
"""

from __future__ import annotations

from ...array import ShardedArray
from ...collectives import ppermute
from . import steps
from .problem import Geometry

Blocks = tuple[ShardedArray, ShardedArray, ShardedArray | None]  # K, V and (causal) positions of one block


def _send(x: ShardedArray, g: Geometry) -> ShardedArray:
    """The block one step round the ring: chip c's lands on c + 1."""
    return ppermute(x, g.context_axis, 1, label=x.label).as_category("temporaries")


def _send_on(blocks: Blocks, g: Geometry) -> Blocks:
    k, v, pos = blocks
    return _send(k, g), _send(v, g), None if pos is None else _send(pos, g)


def forward(
    g: Geometry, q: ShardedArray, k: ShardedArray, v: ShardedArray, pos: ShardedArray | None
) -> tuple[ShardedArray, ShardedArray]:
    """``(o, lse)`` of the chip's queries against every block, the blocks arriving round the ring."""
    run = steps.start(g)
    here: Blocks = (k, v, pos)
    for t in range(g.cp):
        arriving = _send_on(here, g) if t < g.cp - 1 else None  # sent first: overlaps this step's compute
        run = steps.forward_block(g, q, here[0], here[1], pos, here[2], run)
        if arriving is not None:
            here = arriving
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
    """``(dq, dk, dv)``; dK/dV of each block ride the ring with it and come home at the end."""
    kv = (g.kv_layout, g.shape(g.kv_layout))
    dq, dk, dv = (
        g.filled(lay, 0.0, name) for lay, name in ((g.acc_layout, "dQ"), (g.kv_layout, "dK"), (g.kv_layout, "dV"))
    )
    here: Blocks = (k, v, pos)
    for t in range(g.cp):
        arriving = _send_on(here, g) if t < g.cp - 1 else None
        grads = steps.backward_block(g, q, do, rows, here[0], here[1], pos, here[2], steps.Grads(dq, dk, dv), kv)
        assert grads.dk is not None and grads.dv is not None
        dq, dk, dv = grads.dq, grads.dk, grads.dv
        del grads
        if g.cp > 1:  # on with the block; after the last step this hop takes them home
            dk, dv = _send(dk, g), _send(dv, g)
        if arriving is not None:
            here = arriving
    return dq, dk, dv
