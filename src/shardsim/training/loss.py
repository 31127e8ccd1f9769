"""Mean squared error on sharded outputs: the loss value and its gradient dOut.

``loss = mean((Out - Target)²)`` over all ``B × D`` elements, ``dOut = 2 (Out - Target) / (B·D)``.
The gradient is local: each chip differentiates its own block. Only the loss value needs
the other chips: each sums its squares (a partial sum over the axes that split ``Out``) and
one AllReduce of a single number gives every chip the loss.

>>> import numpy as np, shardsim
>>> from shardsim.training.loss import mse
>>> mesh = shardsim.Mesh(X=2)
>>> out = shardsim.shard(np.array([[1.0, 2.0], [3.0, 4.0]]), mesh, "B_X D")
>>> target = shardsim.shard(np.zeros((2, 2)), mesh, "B_X D")
>>> loss, dout = mse(out, target)
>>> loss, dout.to_global()
(7.5, array([[0.5, 1. ],
       [1.5, 2. ]]))
"""

from __future__ import annotations

import math

import numpy as np

from ..array import ShardedArray
from ..collectives import all_reduce
from ..ops import cast, subtract


def mse(out: ShardedArray, target: ShardedArray, *, scale: float = 1.0) -> tuple[float | None, ShardedArray]:
    """``(loss, dOut)`` of the mean squared error; ``dOut`` is multiplied by ``scale`` (loss scaling).

    The loss is summed in float32 at least (16-bit squares would lose it); ``dOut`` has
    ``out``'s dtype and layout. A shape-only run gives ``None`` for the loss.
    """
    total, dout = mse_terms(out, target, scale=scale)
    if total.is_shape_only:
        return None, dout
    return float(np.asarray(total.to_global())) / math.prod(out.global_shape), dout


def mse_terms(out: ShardedArray, target: ShardedArray, *, scale: float = 1.0) -> tuple[ShardedArray, ShardedArray]:
    """``(sum of squares, dOut)``: :func:`mse`'s steps, with the loss still a sharded scalar (times ``B·D``).

    An engine that runs the step as one program (JAX) returns the scalar from it.
    """
    n = math.prod(out.global_shape)
    diff = subtract(out, target, label="Out - Target")  # 1. local: every chip its own block
    dout = (diff * diff.dtype.type(2.0 * scale / n)).named("dOut")  # 2. dOut = 2 (Out - Target) / n: local
    wide = diff if diff.dtype.itemsize >= 4 else cast(diff, "float32")
    squares = wide * wide
    del diff, wide
    while squares.ndim:
        squares = squares.sum(0)  # each chip's sum: a partial sum over the axes splitting Out
    total = squares.named("loss")
    if total.layout.partial:
        total = all_reduce(total, total.layout.partial, label="loss")  # 3. AllReduce: one number
    return total, dout
