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

import functools
import math
import numbers
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import activations, engines, tracing
from ._format import Deferred
from .array import ShardedArray, check_same_kind, check_same_mesh, require_array
from .dtypes import resolve_dtype
from .engines.stacked import LazyMatmul
from .errors import ArgumentTypeError, DtypeError, PartialSumError, ShapeError, ShardingError
from .holders import held_where
from .layout import Dim, Layout, matmul_layout

Text = str | Deferred  # how an error names an op: built only if one is raised


def matmul(
    a: ShardedArray, b: ShardedArray, *, label: str | None = None, category: str = "activations"
) -> ShardedArray:
    """``a @ b`` on every chip: ``a`` is ``[..., M, K]``, ``b`` is ``[K, N]`` or ``[..., K, N]``.

    A contracting dimension split alike on both sides gives a partial sum ``{U_axis}``,
    which only :func:`~shardsim.all_reduce` or :func:`~shardsim.reduce_scatter` clears.
    """
    for arg, v in (("a", a), ("b", b)):
        if not isinstance(v, ShardedArray):
            raise ArgumentTypeError(
                f"matmul needs two ShardedArrays; {arg} is a {type(v).__name__}: shard NumPy operands with "
                "shardsim.shard(array, mesh, layout)"
            )
    mesh = check_same_mesh(a, b)
    has_data = check_same_kind(a, b)
    layout = matmul_layout(a.layout, b.layout)
    if a.global_shape[-1] != b.global_shape[-2] or (b.ndim > 2 and a.global_shape[:-2] != b.global_shape[:-2]):
        raise ShapeError(
            f"matmul {a.describe()} @ {b.describe()}: shapes {a.global_shape} and {b.global_shape} "
            "do not fit ([..., M, K] @ [K, N])"
        )
    shape = a.global_shape[:-1] + (b.global_shape[-1],)
    dtype = _common_dtype(np.matmul, a, b, Deferred(lambda: f"{a.describe()} @ {b.describe()}"))
    a, b = promote(a, dtype), promote(b, dtype)
    data, lazy = None, None
    if has_data:
        engine = engines.active()
        lhs = a.compact()
        rhs = b.compact()
        if b.ndim < a.ndim:  # line b's mesh dims up with a's, past a's batch dims
            nm = len(mesh.shape)
            rhs = rhs.reshape(rhs.shape[:nm] + (1,) * (a.ndim - b.ndim) + rhs.shape[nm:])
        if layout.partial and not (a.is_partial or b.is_partial) and engine.lazy_partials:
            lazy = LazyMatmul(lhs, rhs)  # reduced later by folding the chips into K
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
# How an op may treat a partial sum {U_X} (the chips' blocks add up to the value):
#   "sum":   a + b, a - b: both sides partial over the same axes, or neither;
#   "scale": a * b, a / b: one side partial, the other a value replicated over its axes;
#   "other": anything else (maximum, power, remainder...): no partial side at all.
def add(a: Any, b: Any, *, label: str | None = None) -> ShardedArray:
    """``a + b`` blockwise; two partial sums over the same axes add to a partial sum."""
    return _binary(a, b, operator.add, "+", kind="sum", label=label)


def subtract(a: Any, b: Any, *, label: str | None = None) -> ShardedArray:
    """``a - b`` blockwise (same rules as :func:`add`)."""
    return _binary(a, b, operator.sub, "-", kind="sum", label=label)


def multiply(a: Any, b: Any, *, label: str | None = None) -> ShardedArray:
    """``a * b`` blockwise; a partial sum may be scaled by a finite value replicated over its axes."""
    return _binary(a, b, operator.mul, "*", kind="scale", label=label)


def divide(a: Any, b: Any, *, label: str | None = None) -> ShardedArray:
    """``a / b`` blockwise; only the numerator may be a partial sum, and then the divisor has no zeros."""
    if isinstance(b, ShardedArray) and b.is_partial:
        raise PartialSumError(f"cannot divide by a partial sum {b.describe()}; reduce it first")
    return _binary(a, b, operator.truediv, "/", kind="scale", label=label)


_SYMBOLS: dict[Any, str] = {np.add: "+", np.subtract: "-", np.multiply: "*", np.true_divide: "/", np.matmul: "@"}


def apply_ufunc(ufunc: np.ufunc, method: str, inputs: Sequence[Any], kwargs: dict[str, Any]) -> ShardedArray:
    """A NumPy ufunc called on ShardedArrays (``np.exp(x)``, ``np.maximum(x, 0)``), blockwise.

    Elementwise ufuncs with one output run on every chip's block and keep the layout; a
    partial sum is accepted only where the result is still the partial of the value
    (``np.negative``, ``np.add`` of partials, ``np.multiply`` by a replicated value).
    Reductions, ``out=`` and ufuncs with several outputs raise :class:`ArgumentTypeError`.

    >>> import numpy as np, shardsim
    >>> x = shardsim.shard(np.arange(4.0), shardsim.Mesh(X=2), "[B_X]")
    >>> y = np.maximum(x, 1.5)
    >>> y.layout, np.asarray(y)
    (Layout('[B_X]'), array([1.5, 1.5, 2. , 3. ]))
    """
    name = f"np.{ufunc.__name__}"
    if method != "__call__" or kwargs or ufunc.nout != 1:
        what = f"{name}.{method}" if method != "__call__" else name
        extra = f" with {sorted(kwargs)}" if kwargs else ""
        raise ArgumentTypeError(
            f"{what}{extra} is not defined on a ShardedArray (only elementwise ufuncs with one output "
            "and no out=/where=/dtype=); use the shardsim op (sum, matmul, cast) or np.asarray(x) first"
        )
    for v in inputs:
        if not isinstance(v, ShardedArray) and _ndim(v, name) != 0:
            raise ArgumentTypeError(
                f"{name} of a ShardedArray and a {type(v).__name__} of shape {np.shape(v)}:"
                " shard it first with shardsim.shard(array, mesh, layout) so its layout is known"
            )
    if ufunc is np.matmul:
        return matmul(inputs[0], inputs[1])
    if ufunc is np.true_divide:
        return divide(inputs[0], inputs[1])
    if ufunc.nin == 1:
        x = inputs[0]
        if x.is_partial and ufunc not in (np.negative, np.positive):
            raise PartialSumError(
                f"{name} of {x.describe()}: a nonlinear function of a partial sum is not the partial of "
                f"the function; reduce over {list(x.layout.partial)} first"
            )
        dtype = _result_dtype(ufunc, (np.zeros(0, x.dtype),), f"{name}({x.describe()})")
        _check_partial_dtype(x, dtype, name)
        data = None if x.is_shape_only else ufunc(x.compact())
        return ShardedArray(x.mesh, x.layout, x.global_shape, dtype, data, derived_from=(x,))
    kinds: dict[Any, str] = {np.add: "sum", np.subtract: "sum", np.multiply: "scale"}
    kind = kinds.get(ufunc, "other")
    return _binary(inputs[0], inputs[1], ufunc, _SYMBOLS.get(ufunc, name), kind=kind, label=None)


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
    require_array(x, "x", name)
    if x.is_partial and name != "identity":
        raise PartialSumError(
            f"{name} of {x.describe()}: a nonlinear function of a partial sum is not the partial of "
            f"the function; reduce over {list(x.layout.partial)} first"
        )
    data = None if x.is_shape_only else engines.active().elementwise(fn, len(x.mesh.shape), x.compact())
    dtype = x.dtype if data is None else data.dtype
    return ShardedArray(x.mesh, x.layout, x.global_shape, dtype, data, label=label, derived_from=(x,))


def cast(x: ShardedArray, dtype: Any, *, label: str | None = None, category: str | None = None) -> ShardedArray:
    """The value in another dtype (e.g. float32 master weights to bfloat16), same layout."""
    require_array(x, "x", "cast")
    dt = resolve_dtype(dtype)
    _check_partial_dtype(x, dt, "cast")
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
    require_array(x, "x", "transpose")
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
    swaps_last_two = perm == [*range(x.ndim - 2), x.ndim - 1, x.ndim - 2]
    data, lazy = None, None
    if x._lazy is not None and swaps_last_two:
        # (A @ B).T = B.T @ A.T: stay a lazy partial
        lazy = LazyMatmul(np.swapaxes(x._lazy.rhs, -1, -2), np.swapaxes(x._lazy.lhs, -1, -2))
    elif not x.is_shape_only:
        data = engines.active().transpose(x.compact(), nm, perm)
    if label is None and x.label and swaps_last_two:
        label = transposed_label(x.label)
    return ShardedArray(
        x.mesh, layout, shape, x.dtype, data, lazy=lazy, label=label or x.label, category=x.category, view_of=x
    )


def transposed_label(label: str) -> str:
    """The label of a value with its last two dimensions swapped: ``W`` → ``W.T``, ``W.T`` → ``W``.

    Traces, pictures and exported traces then name a backward matmul by what it computes:
    ``In.T @ dH``, ``dOut @ W_out.T``.

    >>> transposed_label("W_out"), transposed_label("W_out.T")
    ('W_out.T', 'W_out')
    """
    return label.removesuffix(".T") if label.endswith(".T") else f"{label}.T"


def take_basic(x: ShardedArray, index: Any) -> ShardedArray:
    """``x[i]``, ``x[:, 2:4]``, ``x[..., 0]``: NumPy's basic indexing along dimensions that are not split.

    An integer drops its dimension, a slice keeps it; a split dimension may only be taken
    whole (``:``). A partial sum stays one (selecting entries commutes with the sum).

    >>> import numpy as np, shardsim
    >>> x = shardsim.shard(np.arange(12.0).reshape(2, 6), shardsim.Mesh(X=2), "B_X D")
    >>> y = x[:, 1:3]
    >>> y.layout, np.asarray(y).tolist()
    (Layout('[B_X, D]'), [[1.0, 2.0], [7.0, 8.0]])
    """
    items = index if isinstance(index, tuple) else (index,)
    if sum(i is Ellipsis for i in items) > 1:
        raise ShapeError(f"index {index!r} of {x.describe()}: at most one '...'")
    for i in items:
        integer = isinstance(i, numbers.Integral) and not isinstance(i, bool)
        if i is not Ellipsis and not isinstance(i, slice) and not integer:
            raise ArgumentTypeError(
                f"index {index!r} of {x.describe()}: only integers, slices and '...' are supported "
                f"(got {type(i).__name__}); for advanced indexing use np.asarray(x)[...]"
            )
    n_real = sum(i is not Ellipsis for i in items)
    if n_real > x.ndim:
        raise ShapeError(f"index {index!r} has {n_real} entries but {x.describe()} has {x.ndim} dimensions")
    if Ellipsis in items:
        k = items.index(Ellipsis)
        items = items[:k] + (slice(None),) * (x.ndim - n_real) + items[k + 1 :]
    items = items + (slice(None),) * (x.ndim - len(items))
    dims: list[Dim] = []
    shape: list[int] = []
    local: list[int | slice] = []
    for item, d, n in zip(items, x.layout.dims, x.global_shape):
        if d.axes and item != slice(None):
            raise ShardingError(
                f"index {index!r} of {x.describe()}: dimension {d} is split over {list(d.axes)}; "
                f"only ':' may index it. all_gather(x, {d.axes!r}) first to index it"
            )
        if isinstance(item, slice):
            dims.append(d)
            shape.append(len(range(*item.indices(n))))
            local.append(item if not d.axes else slice(None))
        else:
            if not -n <= item < n:
                raise ShapeError(f"index {item} is out of range for dimension {d.name} of size {n} in {x.describe()}")
            local.append(int(item))
    layout = Layout(tuple(dims), x.layout.partial)
    data = None
    if not x.is_shape_only:
        data = np.ascontiguousarray(x.compact()[(slice(None),) * len(x.mesh.shape) + tuple(local)])
    return ShardedArray(
        x.mesh, layout, tuple(shape), x.dtype, data, label=x.label, category=x.category, derived_from=(x,)
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
    require_array(x, "x", "sum")
    i = x.layout.dim_index(dim)
    d = x.layout.dims[i]
    kept = (Dim(d.name),) if keepdims else ()
    layout = Layout(x.layout.dims[:i] + kept + x.layout.dims[i + 1 :], x.layout.partial + d.axes)
    shape = x.global_shape[:i] + ((1,) if keepdims else ()) + x.global_shape[i + 1 :]
    dtype = _sum_dtype(x.dtype)
    _check_partial_dtype(x, dtype, "sum")
    nm = len(x.mesh.shape)
    data = None if x.is_shape_only else engines.active().sum(x.compact(), nm + i, keepdims)
    return ShardedArray(x.mesh, layout, shape, dtype, data, label=label, derived_from=(x,))


@functools.lru_cache(maxsize=64)
def _sum_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype of a sum, NumPy's: bool and small ints sum as int64."""
    return np.sum(np.zeros(1, dtype)).dtype


def _binary(a: Any, b: Any, op: Callable[[Any, Any], Any], sym: str, *, kind: str, label: str | None) -> ShardedArray:
    arrays = [v for v in (a, b) if isinstance(v, ShardedArray)]
    if not arrays:
        raise ArgumentTypeError(f"{sym} needs a ShardedArray operand, got {type(a).__name__} and {type(b).__name__}")
    mesh = check_same_mesh(*arrays)
    has_data = check_same_kind(*arrays)
    if len(arrays) == 1:
        x = arrays[0]
        scalar = b if x is a else a
        if isinstance(scalar, np.ndarray) or _ndim(scalar, sym) != 0:
            if np.ndim(scalar) != 0:
                raise ShardingError(f"{x.describe()} {sym} a NumPy array: shard the array first so its layout is known")
            scalar = scalar[()]  # a 0-d array is its scalar, as NumPy treats it
        what = Deferred(lambda: f"{x.describe()} {sym} {scalar!r}" if x is a else f"{scalar!r} {sym} {x.describe()}")
        probe = np.zeros(0, x.dtype)
        dtype = _result_dtype(op, (probe, scalar) if x is a else (scalar, probe), what)
        if x.is_partial:
            _check_partial_scalar(x, scalar, x is a, sym, kind, what)
        _check_partial_dtype(x, dtype, what)
        data = None
        if has_data:
            engine = engines.active()
            scaled = (lambda c: op(c, scalar)) if x is a else (lambda c: op(scalar, c))  # NumPy's warnings too
            data = engine.cast(engine.elementwise(scaled, len(mesh.shape), x.compact()), dtype)
            if x.is_partial:
                _check_no_overflow(x, data, what)
        return ShardedArray(mesh, x.layout, x.global_shape, dtype, data, label=label, derived_from=(x,))
    what = Deferred(lambda: f"{a.describe()} {sym} {b.describe()}")
    layout, shape = _broadcast_layout(a, b, sym)
    if kind == "sum":
        if set(a.layout.partial) != set(b.layout.partial):
            raise PartialSumError(
                f"{what}: both sides must be partial sums over the same axes (or neither); "
                "reduce the partial side first"
            )
        partial = a.layout.partial
    elif kind == "scale":
        if a.is_partial and b.is_partial:
            raise PartialSumError(
                f"{what}: the product of two partial sums is not a partial sum; reduce one side first"
            )
        if b.is_partial and sym == "/":
            raise PartialSumError(f"cannot divide by a partial sum {b.describe()}; reduce it first")
        partial = a.layout.partial + b.layout.partial
    else:
        if a.is_partial or b.is_partial:
            p = a if a.is_partial else b
            raise PartialSumError(
                f"{what}: {sym} of a partial sum is not the partial of the result; reduce "
                f"{p.describe()} over {list(p.layout.partial)} first"
            )
        partial = ()
    layout = layout.with_partial(partial)
    layout.validate(mesh.axis_names)  # a factor split over an axis the other sums over: refused
    dtype = _common_dtype(op, a, b, what)
    for x in (a, b):
        _check_partial_dtype(x, dtype, what)
    if kind == "scale" and has_data and (a.is_partial or b.is_partial):
        factor = b if a.is_partial else a
        _check_finite_factor(factor.compact(), sym, what)
    a, b = promote(a, dtype), promote(b, dtype)
    data = None
    if has_data:
        nm = len(mesh.shape)
        x, y = a.compact(), b.compact()
        rank = len(shape)
        x = x.reshape(x.shape[:nm] + (1,) * (rank - a.ndim) + x.shape[nm:])
        y = y.reshape(y.shape[:nm] + (1,) * (rank - b.ndim) + y.shape[nm:])
        engine = engines.active()
        data = engine.cast(engine.elementwise(op, nm, x, y), dtype)
        for v in (a, b):
            if v.is_partial:
                _check_no_overflow(v, data, what)
    return ShardedArray(mesh, layout, shape, dtype, data, label=label, derived_from=(a, b))


def _check_no_overflow(x: ShardedArray, data: np.ndarray, what: Text) -> None:
    """A finite partial scaled by a finite factor must stay finite: a block that overflows to inf
    (3e308 * 10 on one chip, -2e308 * 10 on another) no longer adds up to the scaled sum."""
    if data.dtype.kind not in "fc" and data.dtype.name != "bfloat16":
        return
    if not engines.active().reads_data:  # the data is traced (JAX): XLA's own numbers decide
        return
    if _finite(data).all():
        return
    if not _finite(x.compact()).all():
        return  # already inf or nan on some chip: the sum was too, and so is its scaled value
    raise PartialSumError(
        f"{what}: a chip's partial block overflows to inf, so the blocks no longer add up to the scaled "
        f"sum; reduce {x.describe()} over {list(x.layout.partial)} first, then scale it"
    )


def _finite(a: np.ndarray) -> np.ndarray:
    """``np.isfinite`` for every numeric dtype, bfloat16 included (which ufuncs read as float64)."""
    return np.isfinite(a.astype(np.complex128 if a.dtype.kind == "c" else np.float64))


def _ndim(v: Any, what: Text) -> int:
    """``np.ndim(v)``, or :class:`ArgumentTypeError` for what NumPy cannot make an array of (ragged lists)."""
    try:
        return int(np.ndim(v))
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"{what}: NumPy cannot make an array of {type(v).__name__} {v!r:.60}") from None


def _check_partial_scalar(x: ShardedArray, scalar: Any, x_first: bool, sym: str, kind: str, what: Text) -> None:
    """A partial sum meets a scalar: only ``x * c`` and ``x / c`` with a finite ``c`` (non-zero to
    divide) keep it the partial of the value."""
    axes = list(x.layout.partial)
    if kind == "sum":
        raise PartialSumError(
            f"{what}: the scalar would be added once per chip of {axes}; reduce the partial sum first"
        )
    if kind != "scale" or (sym == "/" and not x_first):
        raise PartialSumError(
            f"{what}: this is not a scaling of the partial sum {x.describe()}; reduce it over {axes} first"
        )
    _check_finite_factor(np.asarray(scalar), sym, what)


def _check_finite_factor(factor: np.ndarray, sym: str, what: Text) -> None:
    """Scaling a partial by inf or nan, or dividing it by 0, is not the scaled sum: blocks 0 and 3
    times inf are nan and inf, which add to nan, while (0 + 3) * inf is inf."""
    f = np.asarray(factor)
    if f.dtype.kind not in "fc" and f.dtype.name != "bfloat16" and sym == "*":
        return  # integers and bools are finite
    bad = ~_finite(f) | ((f == 0) if sym == "/" else False)
    if np.any(bad):
        why = "a zero or non-finite divisor" if sym == "/" else "a non-finite factor (inf or nan)"
        raise PartialSumError(
            f"{what}: {why} does not distribute over the chips' partial blocks (0 * inf is nan on "
            "one chip while the sum times inf is inf); reduce the partial sum first, then scale it"
        )


def _check_partial_dtype(x: ShardedArray, dtype: np.dtype, what: Text) -> None:
    """A partial sum may change dtype only between float types (it is then reduced in the new
    dtype); an integer or bool partial wraps in its own dtype, so widening it would change its value."""
    if not x.is_partial or x.dtype == dtype:
        return
    if x.dtype.kind in "biu":
        raise DtypeError(
            f"{what}: {x.describe()} is an {x.dtype} partial sum; in {x.dtype} its chips' blocks add up "
            f"with wrap-around (100 + 100 is -56 as int8), so making it {dtype} before the reduction would "
            f"change its value. Reduce it first (all_reduce over {list(x.layout.partial)}), then convert"
        )


def _common_dtype(op: Callable[[Any, Any], Any], a: ShardedArray, b: ShardedArray, what: Text) -> np.dtype:
    """The one dtype rule for two operands: NumPy's promotion (``np.result_type``) and the op's own
    result type; a pair NumPy has no common dtype for is refused (ml_dtypes 0.7, which shardsim
    requires, gives bfloat16 one with every number type: with int32 float64, with float16 float32).
    Answers are remembered per (op, dtypes): every elementwise op asks, NumPy's probes are slow."""
    key = (op, a.dtype, b.dtype)
    known = _common_dtypes.get(key)
    if known is None:
        known = _common_dtypes[key] = _find_common_dtype(op, a, b, what)  # raises for a pair refused
    return known


_common_dtypes: dict[tuple[Any, np.dtype, np.dtype], np.dtype] = {}


def _find_common_dtype(op: Callable[[Any, Any], Any], a: ShardedArray, b: ShardedArray, what: Text) -> np.dtype:
    try:
        common = np.result_type(a.dtype, b.dtype)
    except TypeError as e:  # DTypePromotionError
        raise DtypeError(
            f"{what}: NumPy has no common dtype for {a.dtype} and {b.dtype} ({type(e).__name__}); "
            f"convert one side first, e.g. shardsim.cast(x, 'float32')"
        ) from None
    if op is np.matmul:
        return common  # NumPy's matmul of bfloat16 gives float32; a chip's 16-bit matmul writes bfloat16
    return _result_dtype(op, (np.zeros(0, a.dtype), np.zeros(0, b.dtype)), what)


def promote(x: ShardedArray, dtype: np.dtype) -> ShardedArray:
    """``x`` converted to ``dtype`` for an op that mixes dtypes, as a ``cast`` event in the trace.

    NumPy converts the narrower operand of ``float32 @ float64`` silently; here the converted
    copy is a value of its own, so the trace shows it and the ledger counts its bytes.

    >>> import numpy as np, shardsim
    >>> mesh = shardsim.Mesh(X=2)
    >>> a = shardsim.shard(np.ones((2, 2), np.float32), mesh, "B D").named("a")
    >>> b = shardsim.shard(np.ones((2, 2), np.float64), mesh, "D F")
    >>> with shardsim.trace() as t:
    ...     c = a @ b
    >>> t.steps(), c.dtype
    ([('cast', '', 'a'), ('matmul', '', 'a @ ?')], dtype('float64'))
    """
    if x.dtype == dtype:
        return x
    y = cast(x, dtype)
    tracing.record("cast", (), [x], y, hbm_bytes=x.local_nbytes + y.local_nbytes, local_shapes=(x.local_shape,))
    return y


def _result_dtype(op: Callable[..., Any], operands: tuple[Any, ...], what: Text) -> np.dtype:
    """The dtype NumPy gives ``op`` on these operands (zero-size probes), the same with or without data."""
    try:
        # zero-size probes: nothing is computed, so no floating-point warnings (and no np.errstate,
        # whose context variable CPython 3.10/3.11 can corrupt when entered very often)
        dtype = np.asarray(op(*operands)).dtype
    except (TypeError, ValueError, OverflowError, ZeroDivisionError, ArithmeticError) as e:
        raise DtypeError(f"{what}: NumPy refuses this for these dtypes ({e})") from None
    if dtype.kind not in "biufc" and dtype.name != "bfloat16":
        raise DtypeError(f"{what}: the result would have dtype {dtype}; use numbers of a numeric dtype")
    return dtype


def _broadcast_layout(a: ShardedArray, b: ShardedArray, sym: str) -> tuple[Layout, tuple[int, ...]]:
    """NumPy broadcasting, aligned from the right; aligned dimensions must be split alike."""
    if a.layout.dims == b.layout.dims and a.global_shape == b.global_shape:
        # the usual case (x * y of one layout): the result's dims are the operands'; only a
        # mesh axis splitting two of them is refused
        used = [ax for d in a.layout.dims for ax in d.axes]
        if len(set(used)) == len(used):
            return Layout(a.layout.dims), tuple(a.global_shape)
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
        shape.append(na if nb == 1 else nb)  # NumPy's: 1 stretches to the other size, 0 included
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
