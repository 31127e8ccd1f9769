"""Python's operators and NumPy's protocols on ShardedArray, each a call into :mod:`shardsim.ops`.

``ShardedArray`` lives in the layer below ``ops``, so it cannot name them; this module, one
layer above, puts ``@ + - * /``, unary ``-``, ufuncs, ``astype``, indexing, ``.T``,
``transpose`` and ``sum`` on the class. ``import shardsim`` imports it.

>>> import numpy as np, shardsim
>>> x = shardsim.shard(np.arange(4.0).reshape(2, 2), shardsim.Mesh(X=2), "[B_X, D]")
>>> (-x * 2 + 1).to_global().tolist(), x.T.layout
([[1.0, -1.0], [-3.0, -5.0]], Layout('[D, B_X]'))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .array import ShardedArray
from .ops import add, apply_ufunc, cast, divide, matmul, multiply, subtract, sum_dim, take_basic, transpose


def _matmul(self: ShardedArray, other: ShardedArray) -> ShardedArray:
    return matmul(self, other)


def _add(self: ShardedArray, other: Any) -> ShardedArray:
    return add(self, other)


def _sub(self: ShardedArray, other: Any) -> ShardedArray:
    return subtract(self, other)


def _rsub(self: ShardedArray, other: Any) -> ShardedArray:
    return subtract(other, self)


def _mul(self: ShardedArray, other: Any) -> ShardedArray:
    return multiply(self, other)


def _truediv(self: ShardedArray, other: Any) -> ShardedArray:
    return divide(self, other)


def _rtruediv(self: ShardedArray, other: Any) -> ShardedArray:
    return divide(other, self)


def _neg(self: ShardedArray) -> ShardedArray:
    return multiply(self, -1.0)


def _array_ufunc(self: ShardedArray, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
    """NumPy ufuncs (``np.exp(x)``, ``np.add(x, y)``) run on every chip's block (see ``ops.apply_ufunc``)."""
    return apply_ufunc(ufunc, method, inputs, kwargs)


def astype(self: ShardedArray, dtype: Any) -> ShardedArray:
    """The value in another dtype, same layout (NumPy's ``astype``; see :func:`shardsim.cast`)."""
    return cast(self, dtype)


def _getitem(self: ShardedArray, index: Any) -> ShardedArray:
    """Basic indexing (integers, slices, ``...``) along dimensions that are not split."""
    return take_basic(self, index)


def _T(self: ShardedArray) -> ShardedArray:  # noqa: N802 - NumPy's name
    """Swap the last two dimensions; each keeps its sharding (``[B_X, D_Y].T == [D_Y, B_X]``)."""
    return transpose(self)


def _transpose(self: ShardedArray, *order: int) -> ShardedArray:
    """Permute dimensions (NumPy's ``transpose``); each keeps its sharding."""
    return transpose(self, order if order else tuple(reversed(range(self.ndim))))  # NumPy: reverse all


def _sum(self: ShardedArray, dim: str | int, *, label: str | None = None) -> ShardedArray:
    """Sum over a dimension; over a split dimension the result is a partial sum over its axes."""
    return sum_dim(self, dim, label=label)


_METHODS: dict[str, Callable[..., Any] | property] = {
    "__matmul__": _matmul,
    "__add__": _add,
    "__radd__": _add,
    "__sub__": _sub,
    "__rsub__": _rsub,
    "__mul__": _mul,
    "__rmul__": _mul,
    "__truediv__": _truediv,
    "__rtruediv__": _rtruediv,
    "__neg__": _neg,
    "__array_ufunc__": _array_ufunc,
    "astype": astype,
    "__getitem__": _getitem,
    "T": property(_T),
    "transpose": _transpose,
    "sum": _sum,
}
for _name, _method in _METHODS.items():
    setattr(ShardedArray, _name, _method)
