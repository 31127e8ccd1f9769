"""The collectives, each a pure function from ShardedArray to ShardedArray.

Semantics follow ``jax.lax`` inside ``shard_map`` and PyTorch DTensor placements (see
``docs/collectives.md``); as subscript algebra (the scaling book's table):

=================  ===================================  ============================
collective         layout                               jax.lax
=================  ===================================  ============================
all_gather         ``[A_X, B] -> [A, B]``               ``all_gather(tiled=True)``
reduce_scatter     ``[A, B]{U_X} -> [A_X, B]``          ``psum_scatter(tiled=True)``
all_reduce         ``[A_X, B]{U_Y} -> [A_X, B]``        ``psum``
all_to_all         ``[A, B_X] -> [A_X, B]``             ``all_to_all``
ppermute           layout unchanged, blocks move        ``ppermute``
=================  ===================================  ============================

Every call appends one event to the active traces with the bytes each chip sends and
receives under the ring algorithm: AllGather and ReduceScatter move (N-1)/N of the
unsharded array per chip, AllReduce twice that, AllToAll (N-1)/N of the local block.

>>> import numpy as np, shardsim
>>> mesh = shardsim.Mesh(X=2, Y=2)
>>> x = shardsim.shard(np.arange(8.0).reshape(2, 4), mesh, "B_X D_Y")
>>> shardsim.all_gather(x, "Y").layout
Layout('[B_X, D]')
>>> shardsim.all_to_all(x, "X", "B", "D").layout
Layout('[B, D_YX]')
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import numbers
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar
from typing import cast as typed_as

import numpy as np

from . import engines, tracing
from .array import ShardedArray, local_shape_of, require_array
from .dtypes import resolve_dtype
from .engines.stacked import LazyMatmul
from .errors import ArgumentTypeError, ChipFailureError, CollectiveError, ShardingError
from .holders import held_text
from .layout import Layout
from .mesh import Mesh, normalize_axes

Axes = str | Iterable[str]
_Collective = TypeVar("_Collective", bound=Callable[..., ShardedArray])

# jax.lax's keywords for its collectives, and what each is in shardsim (docs/coming-from-jax.md).
_JAX_KEYWORDS = {
    "axis_name": "shardsim's axis is JAX's axis_name",
    "axis_index_groups": "shardsim has no axis_index_groups: a collective runs over whole mesh axes",
    "tiled": "shardsim's collectives are always tiled: drop tiled=",
    "scatter_dimension": "reduce_scatter's dim is JAX's scatter_dimension",
    "split_axis": "all_to_all's dst_dim is JAX's split_axis",
    "concat_axis": "all_to_all's src_dim is JAX's concat_axis",
}


def _refuses_jax_calls(usage: str) -> Callable[[_Collective], _Collective]:
    """Turn a call Python would refuse with a bare TypeError (an unknown keyword, ``axis`` given twice,
    too many positional arguments) into :class:`ArgumentTypeError` naming shardsim's form ``usage``.

    The mistakes are JAX's habits: ``all_gather(x, "Y", axis=1)`` passes jax.lax's array dimension
    as ``axis``, which is shardsim's mesh axis (JAX's ``axis_name``); shardsim reads the dimension
    from the layout.
    """

    def wrap(fn: _Collective) -> _Collective:
        params = list(inspect.signature(fn).parameters.values())
        positional = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        keywords = {p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY}

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> ShardedArray:
            given = set(positional[: len(args)])
            if len(args) > len(positional) or any(k not in keywords or k in given for k in kwargs):
                raise ArgumentTypeError(_jax_call_message(fn.__name__, usage, positional, args, kwargs))
            return fn(*args, **kwargs)

        return typed_as(_Collective, checked)

    return wrap


def _jax_call_message(op: str, usage: str, positional: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    given = set(positional[: len(args)])
    why = f"{op} takes {len(positional)} positional arguments ({', '.join(positional)}), got {len(args)}"
    for k, v in kwargs.items():
        if k == "axis" and k in given:
            dim = " (the dimension it scatters is dim)" if op == "reduce_scatter" else ""
            why = (
                f"axis={v!r} is given after the mesh axis: shardsim's axis is the mesh axis (JAX's axis_name), "
                f"and jax.lax's axis=, the array dimension, is read from x's layout{dim}"
            )
            break
        if k in given:
            why = f"{k}= is given twice, by position and by keyword"
            break
        if k in _JAX_KEYWORDS:
            why = f"{k}={v!r} is jax.lax's: {_JAX_KEYWORDS[k]}"
            break
        if k not in positional:
            why = f"{op} has no argument {k}="
            break
    return f"{op}: {why}; call it as {usage} (docs/coming-from-jax.md has the table)"


@_refuses_jax_calls("all_gather(x, 'Y')")
def all_gather(x: ShardedArray, axis: Axes, *, label: str | None = None, category: str | None = None) -> ShardedArray:
    """Un-split the dimension split over ``axis``: ``[B_X, D] -> [B, D]`` (AllGather_X).

    ``axis`` must be the minor end of that dimension's split (``D_XY``: gather ``Y`` or
    ``("X", "Y")``), so the blocks concatenate in global order. The result is in ``x``'s
    ledger category unless ``category`` names another (a gathered weight is a buffer).
    """
    axes = _axes(x, axis, "all_gather")
    dim = _split_dim(x, axes, "all_gather")
    d = x.layout.dims[dim]
    layout = x.layout.with_dim(dim, d.axes[: len(d.axes) - len(axes)])
    _check_group_ready(x, axes, "all_gather")
    data = None
    if not x.is_shape_only:
        data = engines.active().all_gather(x.compact(), _nm(x), _positions(x, axes), axes, dim)
    out = _new(x, layout, data, label, category=category)
    n = x.mesh.axis_size(axes)
    moved = (n - 1) * x.local_nbytes
    tracing.record("all_gather", axes, [x], out, sent_bytes=moved, received_bytes=moved, **_sizes(out, n))
    return out


@_refuses_jax_calls("reduce_scatter(x, 'Y', dim)")
def reduce_scatter(x: ShardedArray, axis: Axes, dim: str | int, *, label: str | None = None) -> ShardedArray:
    """Sum the partials over ``axis`` and split ``dim`` over it: ``[A, B]{U_X} -> [A_X, B]``."""
    axes = _axes(x, axis, "reduce_scatter")
    _check_partial(x, axes, "reduce_scatter")
    x = _in_reduce_dtype(x, axes)
    i = x.layout.dim_index(dim)
    layout = x.layout.with_dim(i, x.layout.dims[i].axes + axes)
    layout = layout.with_partial(a for a in x.layout.partial if a not in axes)
    local_shape_of(x.mesh, layout, x.global_shape)  # DivisibilityError before any work
    _check_group_ready(x, axes, "reduce_scatter")
    data = None
    if not x.is_shape_only:
        sizes = [x.mesh.axis_size(a) for a in axes]
        data = engines.active().reduce_scatter(_operand(x), _nm(x), _positions(x, axes), axes, sizes, i)
    out = _new(x, layout, data, label)
    n = x.mesh.axis_size(axes)
    moved = (n - 1) * out.local_nbytes
    tracing.record("reduce_scatter", axes, [x], out, sent_bytes=moved, received_bytes=moved, **_sizes(x, n))
    return out


@_refuses_jax_calls("all_reduce(x, 'Y')")
def all_reduce(x: ShardedArray, axis: Axes, *, label: str | None = None) -> ShardedArray:
    """Sum the partials over ``axis``; every chip of the group gets the sum: ``{U_X}`` cleared."""
    axes = _axes(x, axis, "all_reduce")
    _check_partial(x, axes, "all_reduce")
    x = _in_reduce_dtype(x, axes)
    layout = x.layout.with_partial(a for a in x.layout.partial if a not in axes)
    _check_group_ready(x, axes, "all_reduce")
    data, lazy = None, None
    if not x.is_shape_only:
        reduced = engines.active().all_reduce(_operand(x), _positions(x, axes), axes)
        lazy, data = (reduced, None) if isinstance(reduced, LazyMatmul) else (None, reduced)
    out = _new(x, layout, data, label, lazy=lazy)
    n = x.mesh.axis_size(axes)
    moved = 2 * (n - 1) * x.local_nbytes // n
    tracing.record("all_reduce", axes, [x], out, sent_bytes=moved, received_bytes=moved, **_sizes(x, n))
    return out


@_refuses_jax_calls("all_to_all(x, 'Y', src_dim, dst_dim)")
def all_to_all(
    x: ShardedArray, axis: Axes, src_dim: str | int, dst_dim: str | int, *, label: str | None = None
) -> ShardedArray:
    """Move the split over ``axis`` from ``src_dim`` to ``dst_dim``: ``[A, B_X] -> [A_X, B]``.

    In ``jax.lax.all_to_all`` terms, ``dst_dim`` is ``split_axis`` and ``src_dim`` is
    ``concat_axis``.
    """
    axes = _axes(x, axis, "all_to_all")
    src = x.layout.dim_index(src_dim)
    dst = x.layout.dim_index(dst_dim)
    if src == dst:
        raise CollectiveError(f"all_to_all of {x.describe()}: src_dim and dst_dim are both {x.layout.dims[src]}")
    got = _split_dim(x, axes, "all_to_all")
    if got != src:
        raise CollectiveError(
            f"all_to_all of {x.describe()}: {_fmt(axes)} splits {x.layout.dims[got]}, not "
            f"src_dim {x.layout.dims[src]}; pass src_dim={x.layout.dims[got].name!r}"
        )
    d = x.layout.dims[src]
    layout = x.layout.with_dim(src, d.axes[: len(d.axes) - len(axes)])
    layout = layout.with_dim(dst, layout.dims[dst].axes + axes)
    local_shape_of(x.mesh, layout, x.global_shape)
    _check_group_ready(x, axes, "all_to_all")
    data = None
    if not x.is_shape_only:
        sizes = [x.mesh.axis_size(a) for a in axes]
        data = engines.active().all_to_all(x.compact(), _nm(x), _positions(x, axes), axes, sizes, src, dst)
    out = _new(x, layout, data, label)
    n = x.mesh.axis_size(axes)
    moved = (n - 1) * x.local_nbytes // n
    # V of the book's AllToAll formula is the whole array over the group, not one chip's block
    volume = n * x.local_nbytes
    tracing.record(
        "all_to_all", axes, [x], out, sent_bytes=moved, received_bytes=moved, group_size=n, array_bytes=volume
    )
    return out


@_refuses_jax_calls("ppermute(x, 'Y', shift) or ppermute(x, 'Y', perm=[(0, 1), (1, 0)])")
def ppermute(
    x: ShardedArray,
    axis: Axes,
    shift: int | None = None,
    *,
    perm: Sequence[tuple[int, int]] | None = None,
    label: str | None = None,
) -> ShardedArray:
    """Send every chip's block ``shift`` steps along ``axis`` (a ring): chip i's lands on i+shift.

    ``perm`` instead gives ``(source, destination)`` pairs, as in ``jax.lax.ppermute``; it
    must be a full permutation of the axis indices. The layout is unchanged; the blocks move.
    """
    axes = _axes(x, axis, "ppermute")
    n = x.mesh.axis_size(axes)
    src_of = _permutation(n, shift, perm, x)
    _check_permutable(x, axes)
    _check_alive(x, "ppermute", axes)
    data = None
    if not x.is_shape_only:
        data = engines.active().ppermute(x.compact(), _positions(x, axes), axes, src_of)
    # a value held on some chips only (a pipeline stage's) arrives on the destinations: chip
    # bookkeeping, kept in NumPy on every engine
    holders = None if x.holders is None else engines.STACKED.ppermute(x.holders, _positions(x, axes), axes, src_of)
    out = _new(x, x.layout, data, label, holders=holders)
    moves = any(s != d for d, s in enumerate(src_of))
    moved = x.local_nbytes if moves else 0
    tracing.record("ppermute", axes, [x], out, sent_bytes=moved, received_bytes=moved, **_sizes(x, n))
    return out


# -- reduction dtype ------------------------------------------------------------------------
# pairs (axis, dtype); a tuple, as a ContextVar's default must not be mutable
_reduce_dtypes: contextvars.ContextVar[tuple[tuple[str, np.dtype], ...]] = contextvars.ContextVar(
    "shardsim_reduce_dtypes", default=()
)


@contextlib.contextmanager
def reduce_dtype(dtype: Any, axes: Axes) -> Iterator[None]:
    """Inside the block, sum partials over ``axes`` in ``dtype`` (e.g. float32 gradients of bfloat16 chips).

    An :func:`all_reduce` or :func:`reduce_scatter` over any of ``axes`` casts a partial sum
    of another dtype on every chip before sending it; the result has ``dtype`` and the trace
    counts its bytes. This is PyTorch FSDP's ``MixedPrecision(reduce_dtype=...)``.

    >>> import numpy as np, shardsim
    >>> mesh = shardsim.Mesh(X=2)
    >>> p = shardsim.from_local(np.ones((2, 1, 4), np.float16), mesh, "[A, B]{U_X}")
    >>> with reduce_dtype("float32", "X"):
    ...     reduce_scatter(p, "X", "B").dtype
    dtype('float32')
    """
    dt = resolve_dtype(dtype)
    pairs = tuple((a, dt) for a in normalize_axes(axes, "axes", "reduce_dtype"))
    token = _reduce_dtypes.set(_reduce_dtypes.get() + pairs)
    try:
        yield
    finally:
        _reduce_dtypes.reset(token)


def _in_reduce_dtype(x: ShardedArray, axes: tuple[str, ...]) -> ShardedArray:
    wanted = dict(_reduce_dtypes.get())  # the innermost setting of an axis wins
    dts = {wanted[a] for a in axes if a in wanted}
    if not dts:
        return x
    dt = max(dts, key=lambda d: d.itemsize)
    if x.dtype == dt:
        return x
    from .ops import cast

    return cast(x, dt)


# -- helpers -------------------------------------------------------------------------------
def _axes(x: ShardedArray, axis: Axes, op: str) -> tuple[str, ...]:
    """The door of every collective: ``x`` a ShardedArray, ``axis`` names of its mesh's axes."""
    require_array(x, "x", op)
    axes = normalize_axes(axis, "axis", op)
    for a in axes:
        x.mesh.check_axis(a)
    return axes


def _nm(x: ShardedArray) -> int:
    return len(x.mesh.shape)


def _positions(x: ShardedArray, axes: tuple[str, ...]) -> list[int]:
    return [x.mesh.axis_index(a) for a in axes]


def _fmt(axes: tuple[str, ...]) -> str:
    return f"axis {axes[0]!r}" if len(axes) == 1 else f"axes {axes!r}"


def _split_dim(x: ShardedArray, axes: tuple[str, ...], op: str) -> int:
    """The dimension whose split ends with ``axes`` (the minor end), or a CollectiveError."""
    dims = {x.layout.axis_dim(a) for a in axes}
    if None in dims:
        lost = [a for a in axes if x.layout.axis_dim(a) is None]
        partial = [a for a in lost if a in x.layout.partial]
        hint = (
            f"it is a partial sum over {partial}: use all_reduce or reduce_scatter"
            if partial
            else f"it is replicated over {lost}, so there is nothing to {op.replace('_', ' ')}"
        )
        raise CollectiveError(f"{op} over {_fmt(axes)}: {x.describe()} is not split over {lost}; {hint}")
    if len(dims) > 1:
        raise CollectiveError(
            f"{op} over {_fmt(axes)}: in {x.describe()} those axes split different dimensions; do one at a time"
        )
    dim = dims.pop()
    assert dim is not None
    d = x.layout.dims[dim]
    if d.axes[len(d.axes) - len(axes) :] != axes:
        minor = d.axes[len(d.axes) - len(axes) :]
        raise CollectiveError(
            f"{op} over {_fmt(axes)}: {d} of {x.describe()} is split over {d.axes} (major first); "
            f"only its minor end can be un-split without reordering blocks. Use {minor!r}"
            f"{' or the whole ' + repr(d.axes) if len(d.axes) > len(axes) else ''}."
        )
    return dim


def _check_partial(x: ShardedArray, axes: tuple[str, ...], op: str) -> None:
    missing = [a for a in axes if a not in x.layout.partial]
    if missing:
        split = [a for a in missing if x.layout.axis_dim(a) is not None]
        hint = f"it is split over {split}: use all_gather to un-split it" if split else "there is nothing to sum"
        raise CollectiveError(f"{op} over {_fmt(axes)}: {x.describe()} is not a partial sum over {missing}; {hint}")


def _operand(x: ShardedArray) -> np.ndarray | LazyMatmul:
    """What a reduction reads: the data, or a lazy partial the stacked engine folds into one matmul."""
    return x._lazy if x._lazy is not None else x.compact()


def _permutation(n: int, shift: int | None, perm: Sequence[tuple[int, int]] | None, x: ShardedArray) -> list[int]:
    if (shift is None) == (perm is None):
        raise ShardingError("ppermute takes exactly one of shift=... or perm=[(source, destination), ...]")
    if shift is not None:
        if isinstance(shift, bool) or not isinstance(shift, numbers.Integral):
            raise ArgumentTypeError(
                f"ppermute(shift={shift!r}): shift is a whole number of steps along the axis (1: to the next chip)"
            )
        return [(d - int(shift)) % n for d in range(n)]
    assert perm is not None
    try:
        pairs = [tuple(p) for p in perm]
    except TypeError:
        raise ArgumentTypeError(f"ppermute(perm={perm!r}): perm is a list of (source, destination) pairs") from None
    for p in pairs:
        if len(p) != 2 or any(isinstance(i, bool) or not isinstance(i, numbers.Integral) for i in p):
            raise ArgumentTypeError(
                f"ppermute(perm=...): {p!r} is not a (source, destination) pair of integer axis indices"
            )
    src_of = [-1] * n
    for s, d in pairs:
        if not (0 <= s < n and 0 <= d < n):
            raise ShardingError(f"ppermute pair ({s}, {d}) out of range for an axis of size {n}")
        if src_of[d] != -1:
            raise ShardingError(f"ppermute: chip {d} receives twice")
        src_of[d] = s
    if sorted(src_of) != list(range(n)):
        raise ShardingError(
            f"ppermute of {x.describe()}: perm must be a full permutation of 0..{n - 1} so every chip "
            "keeps a block; got " + repr(pairs)
        )
    return src_of


def _check_permutable(x: ShardedArray, axes: tuple[str, ...]) -> None:
    # decided from the layout, not the data, so shape-only values refuse the same programs
    used = set(x.layout.used_axes())
    if not any(a in used for a in axes):
        return  # replicated along the axes: every chip already holds what it receives
    names = [a for a in axes if a not in used and x.mesh.axis_size(a) > 1]
    if names:
        raise CollectiveError(
            f"ppermute of {x.describe()} over several axes would make it differ along {names}, "
            f"over which its layout says it is replicated; ppermute over the split axes only"
        )


def _new(
    x: ShardedArray,
    layout: Layout,
    data: np.ndarray | None,
    label: str | None,
    *,
    lazy: LazyMatmul | None = None,
    holders: np.ndarray | None = None,
    category: str | None = None,
) -> ShardedArray:
    return ShardedArray(
        x.mesh,
        layout,
        x.global_shape,
        x.dtype,
        data,
        lazy=lazy,
        label=label or x.label,
        category=x.category if category is None else category,
        holders=x.holders if holders is None else holders,
    )


def _check_group_ready(x: ShardedArray, axes: tuple[str, ...], op: str) -> None:
    """A collective needs every chip of its group alive and holding the value."""
    _check_alive(x, op, axes)
    _check_group_holds(x, axes, op)


def _check_group_holds(x: ShardedArray, axes: tuple[str, ...], op: str) -> None:
    """A value held on some chips only must be held alike along ``axes`` (a pipeline stage's
    value: collectives within the stage)."""
    if x.holders is None:
        return
    pos = _positions(x, axes)
    if (x.holders == np.any(x.holders, axis=tuple(pos), keepdims=True)).all():
        return
    raise CollectiveError(
        f"{op} over {_fmt(axes)} of {x.describe()}: it is held only on {held_text(x)}, so some groups "
        f"over {_fmt(axes)} miss chips; run collectives over the axes the value is held along, "
        "or move it with ppermute"
    )


def _sizes(x: ShardedArray, n: int) -> dict[str, Any]:  # event fields, for tracing.record
    """The collective's group size and V, the bytes of the array it moves (the book's formulas)."""
    return {"group_size": n, "array_bytes": x.local_nbytes}


def failed_chips(mesh: Mesh) -> tuple[list[str], str]:
    """The failed chips' names in order, and the words a ChipFailureError says of them.

    >>> from shardsim import Mesh
    >>> m = Mesh(X=2, Y=2)
    >>> m.fail(X=1, Y=0)
    >>> failed_chips(m)
    (['(X1,Y0)'], 'chip (X1,Y0) has')
    """
    names = [mesh.chip_name(dict(zip(mesh.axis_names, c))) for c in sorted(mesh.failed)]
    return names, f"chip {names[0]} has" if len(names) == 1 else f"chips {', '.join(names)} have"


def _check_alive(x: ShardedArray, op: str, axes: tuple[str, ...]) -> None:
    """Raise ChipFailureError naming the failed chip(s), the collective, the value and the step.

    Every chip runs the collective in its own group (SPMD), so one failed chip fails the step.
    """
    if not x.mesh.failed:
        return
    mesh = x.mesh
    names, who = failed_chips(mesh)
    first = dict(zip(mesh.axis_names, min(mesh.failed)))
    group = next(g for g in mesh.groups(axes) if first in g)
    index = tracing.next_event_index()
    step = f"{tracing.current_phase()} phase" + (f", trace event {index}" if index is not None else "")
    raise ChipFailureError(
        f"{op} over {_fmt(axes)} of {x.describe()} cannot run: {who} failed (step: {step}). "
        f"The group of {names[0]} over {_fmt(axes)}: {' '.join(mesh.chip_name(c) for c in group)}. "
        "Restore from a checkpoint onto a mesh without it (shardsim.checkpoint.load)."
    )
