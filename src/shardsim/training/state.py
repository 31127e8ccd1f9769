"""A trainer's state values: placed in buffers of their own, in C order.

The optimizer updates a trainer's weights, master weights and moments in place, so each is
a copy the trainer owns (never a view of the caller's arrays), and each is held in C order
however it was made (placed, gathered, restored): NumPy's matmul rounds by the operands'
memory layout, so a restored trainer computes the next step bit for bit as the original only
if both hold the same layout.

>>> import numpy as np, shardsim
>>> w = np.ones((4, 2))
>>> held = place(w, shardsim.Mesh(X=2), "[D_X, F]", np.dtype("float32"), "W", "params")
>>> held.layout, held.dtype.name, held.category, np.shares_memory(held.compact(), w)
(Layout('[D_X, F]'), 'float32', 'params', False)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..array import ShapeDtype, ShardedArray, shard
from ..errors import ShardingError
from ..mesh import Mesh


def shape_of(value: Any) -> ShapeDtype:
    """The shape and dtype of a global array (or of a :class:`~shardsim.ShapeDtype`: itself).

    >>> shape_of(np.zeros((2, 3), np.float32))
    ShapeDtype(shape=(2, 3), dtype=dtype('float32'))
    """
    if isinstance(value, ShapeDtype):
        return value
    a = np.asarray(value)
    return ShapeDtype(a.shape, a.dtype)


def zeros_like(value: Any) -> Any:
    """Zeros of ``value``'s shape (float64, cast where placed), or ``value`` itself if shape-only.

    >>> zeros_like(np.ones(3, np.float32)).tolist()
    [0.0, 0.0, 0.0]
    """
    if isinstance(value, ShapeDtype):
        return value
    return np.zeros(np.shape(value))


def place(value: Any, mesh: Mesh, layout: str, dtype: np.dtype, label: str, category: str) -> ShardedArray:
    """``value`` (global array or ShapeDtype) in ``dtype`` and ``layout``, in a buffer of its own.

    >>> import shardsim
    >>> place(ShapeDtype((4, 2)), shardsim.Mesh(X=2), "[D_X, F]", np.dtype("float32"), "W", "params").is_shape_only
    True
    """
    if isinstance(value, ShapeDtype):
        return shard(ShapeDtype(value.shape, dtype), mesh, layout, label=label, category=category)
    if isinstance(value, ShardedArray):
        raise ShardingError(f"{label} must be a global NumPy array, got {value.describe()}; pass value.to_global()")
    a = np.asarray(value)
    if a.dtype.kind not in "biuf":
        raise ShardingError(f"{label} must hold real numbers, got an array of dtype {a.dtype}")
    return owned(shard(a.astype(dtype, copy=False), mesh, layout), label, category)


def owned(x: ShardedArray, label: str | None, category: str) -> ShardedArray:
    """A copy of ``x`` whose blocks the optimizer may update in place, in C order.

    >>> import shardsim
    >>> x = shardsim.shard(np.ones((4, 2)), shardsim.Mesh(X=2), "D F")
    >>> y = owned(x, "W", "params")
    >>> y.label, y.category, np.shares_memory(x.compact(), y.compact())
    ('W', 'params', False)
    """
    data = None if x.is_shape_only else np.array(x.compact(), order="C")
    return ShardedArray(
        x.mesh, x.layout, x.global_shape, x.dtype, data, label=label, category=category, holders=x.holders
    )


def in_c_order(x: ShardedArray) -> ShardedArray:
    """``x`` itself if its blocks are in C order (a collective's result usually is), else its C-order copy.

    >>> import shardsim
    >>> x = shardsim.shard(np.ones((4, 2)), shardsim.Mesh(X=2), "D F")
    >>> in_c_order(x) is x
    True
    """
    if x.is_shape_only or x.compact().flags.c_contiguous:
        return x
    return owned(x, x.label, x.category)


def own_all(placed: dict[str, ShardedArray]) -> dict[str, ShardedArray]:
    """Copies the optimizer may update in place of ``placed`` (emptied), each labelled by its key
    (placed values are views of the caller's arrays).

    >>> import shardsim
    >>> v = shardsim.shard(np.ones((4, 2)), shardsim.Mesh(X=2), "D F")
    >>> own_all({"w": v})["w"].label
    'w'
    """
    out = {}
    for k in list(placed):
        v = placed.pop(k)
        out[k] = v.named(k) if v.is_shape_only else owned(v, k, v.category)  # shape-only: nothing shared
        del v
    return out
