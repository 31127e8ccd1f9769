"""Local (per-chip) ops: matmul by the sharded-matmul rules, elementwise ops, activations.

Every op runs on all chips at once as one NumPy call over the stacked blocks. A legal
sharded matmul produces the layout the scaling book gives; an illegal one raises
:class:`~shardsim.errors.MatmulShardingError` naming the case and the collective that fixes it.

>>> import numpy as np, shardsim
>>> mesh = shardsim.Mesh(X=2)
>>> a = shardsim.shard(np.ones((2, 4)), mesh, "B D_X")
>>> w = shardsim.shard(np.ones((4, 3)), mesh, "D_X F")
>>> (a @ w).layout
Layout('[B, F]{U_X}')
>>> shardsim.all_reduce(a @ w, "X").to_global()[0]
array([4., 4., 4.])
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import activations, engines, tracing
from .array import ShardedArray, _LazyMatmul, check_same_kind, check_same_mesh, held_where
from .dtypes import resolve_dtype
from .errors import DtypeError, PartialSumError, ShapeError, ShardingError
from .layout import Dim, Layout, matmul_layout


def matmul(
    a: ShardedArray, b: ShardedArray, *, label: str | None = None, category: str = "activations"
) -> ShardedArray:
    """``a @ b`` on every chip: ``a`` is ``[..., M, K]``, ``b`` is ``[K, N]`` or ``[..., K, N]``.

    A contracting dimension split alike on both sides gives a partial sum ``{U_axis}``,
    which only :func:`~shardsim.all_reduce` or :func:`~shardsim.reduce_scatter` clears.
    """
    if not isinstance(b, ShardedArray) or not isinstance(a, ShardedArray):
        raise ShardingError("matmul needs two ShardedArrays; shard NumPy operands with shardsim.shard(...)")
    mesh = check_same_mesh(a, b)
    has_data = check_same_kind(a, b)
    layout = matmul_layout(a.layout, b.layout)
    if a.global_shape[-1] != b.global_shape[-2] or (b.ndim > 2 and a.global_shape[:-2] != b.global_shape[:-2]):
        raise ShapeError(
            f"matmul {a.describe()} @ {b.describe()}: shapes {a.global_shape} and {b.global_shape} "
            "do not fit ([..., M, K] @ [K, N])"
        )
    shape = a.global_shape[:-1] + (b.global_shape[-1],)
    dtype = np.result_type(a.dtype, b.dtype)
    data, lazy = None, None
    if has_data:
        engine = engines.active()
        lhs = a.compact()
        rhs = b.compact()
        if b.ndim < a.ndim:  # line b's mesh dims up with a's, past a's batch dims
            nm = len(mesh.shape)
            rhs = rhs.reshape(rhs.shape[:nm] + (1,) * (a.ndim - b.ndim) + rhs.shape[nm:])
        if layout.partial and not (a.is_partial or b.is_partial) and engine.lazy_partials:
            lazy = _LazyMatmul(lhs, rhs)  # reduced later by folding the chips into K
        else:
            data = engine.matmul(lhs, rhs)
    held = held_where(a, b)  # a stage's weights meet its activations only on its chips
    out = ShardedArray(mesh, layout, shape, dtype, data, lazy=lazy, label=label, category=category, holders=held)
    m, k = a.local_shape[-2:]
    n = b.local_shape[-1]
    batch = math.prod(a.local_shape[:-2])
    tracing.record(
        "matmul",
        (),
        [a, b],
        out,
        flops=2 * batch * m * k * n,
        hbm_bytes=a.local_nbytes + b.local_nbytes + out.local_nbytes,
        local_shapes=(a.local_shape, b.local_shape),
    )
    return out


# -- elementwise ------------------------------------------------------------------------------
def add(a: Any, b: Any, *, label: str | None = None) -> ShardedArray:
    """``a + b`` blockwise; two partial sums over the same axes add to a partial sum."""
    return _binary(a, b, operator.add, "+", linear=True, label=label)


def subtract(a: Any, b: Any, *, label: str | None = None) -> ShardedArray:
    """``a - b`` blockwise (same rules as :func:`add`)."""
    return _binary(a, b, operator.sub, "-", linear=True, label=label)


def multiply(a: Any, b: Any, *, label: str | None = None) -> ShardedArray:
    """``a * b`` blockwise; a partial sum may be scaled by a value replicated over its axes."""
    return _binary(a, b, operator.mul, "*", linear=False, label=label)


def divide(a: Any, b: Any, *, label: str | None = None) -> ShardedArray:
    """``a / b`` blockwise; only the numerator may be a partial sum."""
    if isinstance(b, ShardedArray) and b.is_partial:
        raise PartialSumError(f"cannot divide by a partial sum {b.describe()}; reduce it first")
    return _binary(a, b, operator.truediv, "/", linear=False, label=label)


def activation(x: ShardedArray, name: str, *, label: str | None = None) -> ShardedArray:
    """Apply activation ``name`` (identity, relu, gelu) on every chip."""
    act = activations.get(name)
    return map_blocks(x, act.fn, name, label=label)


def activation_grad(x: ShardedArray, name: str, *, label: str | None = None) -> ShardedArray:
    """The derivative of activation ``name`` at pre-activation ``x``, on every chip."""
    act = activations.get(name)
    return map_blocks(x, act.grad, f"{name}'", label=label)


def map_blocks(
    x: ShardedArray, fn: Callable[[np.ndarray], np.ndarray], name: str, *, label: str | None = None
) -> ShardedArray:
    """Apply an elementwise NumPy function to every block (refused on a partial sum)."""
    if x.is_partial and name != "identity":
        raise PartialSumError(
            f"{name} of {x.describe()}: a nonlinear function of a partial sum is not the partial of "
            f"the function; reduce over {list(x.layout.partial)} first"
        )
    data = None if x.is_shape_only else fn(x.compact())
    dtype = x.dtype if data is None else data.dtype
    return ShardedArray(x.mesh, x.layout, x.global_shape, dtype, data, label=label, derived_from=(x,))


def cast(x: ShardedArray, dtype: Any, *, label: str | None = None, category: str | None = None) -> ShardedArray:
    """The value in another dtype (e.g. float32 master weights to bfloat16), same layout."""
    dt = resolve_dtype(dtype)
    data = None if x.is_shape_only else x.compact().astype(dt)
    return ShardedArray(
        x.mesh,
        x.layout,
        x.global_shape,
        dt,
        data,
        label=label or x.label,
        category=category or x.category,
        derived_from=(x,),
    )


def transpose(x: ShardedArray, order: Sequence[int] | None = None, *, label: str | None = None) -> ShardedArray:
    """Permute dimensions (default: swap the last two); each dimension keeps its sharding."""
    if x.ndim < 2 and order is None:
        raise ShapeError(f"transpose of {x.describe()} needs at least two dimensions")
    perm = list(range(x.ndim))
    if order is None:
        perm[-2], perm[-1] = perm[-1], perm[-2]
    else:
        perm = [x.layout.dim_index(i) for i in order]
        if sorted(perm) != list(range(x.ndim)):
            raise ShapeError(
                f"transpose order {tuple(order)} is not a permutation of {x.ndim} dimensions of {x.describe()}"
            )
    layout = x.layout.transposed(perm)
    shape = tuple(x.global_shape[i] for i in perm)
    nm = len(x.mesh.shape)
    data, lazy = None, None
    if x._lazy is not None and perm[:-2] == list(range(x.ndim - 2)) and perm[-2:] == [x.ndim - 1, x.ndim - 2]:
        # (A @ B).T = B.T @ A.T: stay a lazy partial
        lazy = _LazyMatmul(np.swapaxes(x._lazy.rhs, -1, -2), np.swapaxes(x._lazy.lhs, -1, -2))
    elif not x.is_shape_only:
        data = engines.active().transpose(x.compact(), nm, perm)
    return ShardedArray(
        x.mesh, layout, shape, x.dtype, data, lazy=lazy, label=label or x.label, category=x.category, view_of=x
    )


def sum_dim(x: ShardedArray, dim: str | int, *, keepdims: bool = False, label: str | None = None) -> ShardedArray:
    """Sum over one dimension; over a split dimension each chip's sum is a partial ``{U_axes}``.

    With ``keepdims`` the dimension stays with size 1 (unsplit), so the sum broadcasts
    against ``x``: a LayerNorm's per-token mean is ``sum_dim(x, "D", keepdims=True) / D``.

    >>> import numpy as np, shardsim
    >>> x = shardsim.shard(np.ones((4, 6)), shardsim.Mesh(Y=2), "S_Y D")
    >>> mean = sum_dim(x, "D", keepdims=True) / 6
    >>> mean.layout, mean.shape, (x - mean).layout
    (Layout('[S_Y, D]'), (4, 1), Layout('[S_Y, D]'))
    """
    i = x.layout.dim_index(dim)
    d = x.layout.dims[i]
    kept = (Dim(d.name),) if keepdims else ()
    layout = Layout(x.layout.dims[:i] + kept + x.layout.dims[i + 1 :], x.layout.partial + d.axes)
    shape = x.global_shape[:i] + ((1,) if keepdims else ()) + x.global_shape[i + 1 :]
    nm = len(x.mesh.shape)
    data = None if x.is_shape_only else engines.active().sum(x.compact(), nm + i, keepdims)
    dtype = np.sum(np.zeros(1, x.dtype)).dtype  # NumPy's: bool and small ints sum as int64
    return ShardedArray(x.mesh, layout, shape, dtype, data, label=label, derived_from=(x,))


def _binary(
    a: Any, b: Any, op: Callable[[Any, Any], Any], sym: str, *, linear: bool, label: str | None
) -> ShardedArray:
    arrays = [v for v in (a, b) if isinstance(v, ShardedArray)]
    mesh = check_same_mesh(*arrays)
    has_data = check_same_kind(*arrays)
    if len(arrays) == 1:
        x = arrays[0]
        scalar = b if x is a else a
        if np.ndim(scalar) != 0:
            raise ShardingError(f"{x.describe()} {sym} a NumPy array: shard the array first so its layout is known")
        if x.is_partial and linear:
            raise PartialSumError(
                f"{x.describe()} {sym} a scalar: the scalar would be added once per chip of "
                f"{list(x.layout.partial)}; reduce the partial sum first"
            )
        probe = np.zeros(0, x.dtype)
        dtype = _result_dtype(op, (probe, scalar) if x is a else (scalar, probe), f"{x.describe()} {sym} {scalar!r}")
        data = None if not has_data else op(x.compact(), scalar) if x is a else op(scalar, x.compact())
        return ShardedArray(mesh, x.layout, x.global_shape, dtype, data, label=label, derived_from=(x,))
    layout, shape = _broadcast_layout(a, b, sym)
    if linear:
        if set(a.layout.partial) != set(b.layout.partial):
            raise PartialSumError(
                f"{a.describe()} {sym} {b.describe()}: both sides must be partial sums over the same "
                "axes (or neither); reduce the partial side first"
            )
        partial = a.layout.partial
    else:
        if a.is_partial and b.is_partial:
            raise PartialSumError(
                f"{a.describe()} {sym} {b.describe()}: the product of two partial sums is not a partial "
                "sum; reduce one side first"
            )
        partial = a.layout.partial + b.layout.partial
    layout = layout.with_partial(partial)
    dtype = _result_dtype(op, (np.zeros(0, a.dtype), np.zeros(0, b.dtype)), f"{a.describe()} {sym} {b.describe()}")
    data = None
    if has_data:
        nm = len(mesh.shape)
        x, y = a.compact(), b.compact()
        rank = len(shape)
        x = x.reshape(x.shape[:nm] + (1,) * (rank - a.ndim) + x.shape[nm:])
        y = y.reshape(y.shape[:nm] + (1,) * (rank - b.ndim) + y.shape[nm:])
        data = op(x, y)
    return ShardedArray(mesh, layout, shape, dtype, data, label=label, derived_from=(a, b))


def _result_dtype(op: Callable[[Any, Any], Any], operands: tuple[Any, Any], what: str) -> np.dtype:
    """The dtype NumPy gives ``op`` on these operands (zero-size probes), the same with or without data."""
    try:
        dtype = np.asarray(op(*operands)).dtype  # zero-size: no floating-point warnings
    except (TypeError, ValueError, OverflowError) as e:
        raise DtypeError(f"{what}: NumPy refuses this for these dtypes ({e})") from None
    if dtype.kind not in "biufc" and dtype.name != "bfloat16":
        raise DtypeError(f"{what}: the result would have dtype {dtype}; use numbers of a numeric dtype")
    return dtype


def _broadcast_layout(a: ShardedArray, b: ShardedArray, sym: str) -> tuple[Layout, tuple[int, ...]]:
    """NumPy broadcasting, aligned from the right; aligned dimensions must be split alike."""
    rank = max(a.ndim, b.ndim)
    dims: list[Dim] = []
    shape: list[int] = []
    for i in range(-rank, 0):
        da = a.layout.dims[i] if -i <= a.ndim else None
        db = b.layout.dims[i] if -i <= b.ndim else None
        na = a.global_shape[i] if da else 1
        nb = b.global_shape[i] if db else 1
        if da and db and da.axes != db.axes and not (na == 1 or nb == 1):
            raise ShardingError(
                f"{a.describe()} {sym} {b.describe()}: dimension {da} and {db} are split differently; "
                "reshard one side (all_gather / all_to_all) so the layouts match"
            )
        if na != nb and 1 not in (na, nb):
            raise ShapeError(
                f"{a.describe()} {sym} {b.describe()}: shapes {a.global_shape} and {b.global_shape} do not broadcast"
            )
        wide = da if (db is None or (na >= nb and da is not None)) else db
        assert wide is not None
        if na != nb and ((na == 1 and da and da.axes) or (nb == 1 and db and db.axes)):
            raise ShardingError(f"{a.describe()} {sym} {b.describe()}: a broadcast dimension of size 1 cannot be split")
        dims.append(wide)
        shape.append(max(na, nb))
    layout = Layout(tuple(dims))
    used = [ax for d in dims for ax in d.axes]
    for x in (a, b):
        spent = set(used)
        clash = [ax for d in x.layout.dims for ax in d.axes if ax not in spent]
        if clash:  # an axis splits a dim of x that the result does not split the same way
            raise ShardingError(f"{a.describe()} {sym} {b.describe()}: mesh axis {clash} is split inconsistently")
    if len(set(used)) != len(used):
        raise ShardingError(
            f"{a.describe()} {sym} {b.describe()}: a mesh axis would split two dimensions of the result"
        )
    return layout, tuple(shape)
