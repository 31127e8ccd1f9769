"""ShardedArray: one value spread over a mesh, every chip's block in one NumPy array.

>>> import numpy as np
>>> import shardsim
>>> mesh = shardsim.Mesh(X=2, Y=2)
>>> x = shardsim.shard(np.arange(16.0).reshape(2, 8), mesh, "B_X D_Y")
>>> x.layout, x.local_shape
(Layout('[B_X, D_Y]'), (1, 4))
>>> x.local(X=1, Y=0)
array([[ 8.,  9., 10., 11.]])
>>> bool((x.to_global() == np.arange(16.0).reshape(2, 8)).all())
True
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _blocks, engines
from .dtypes import resolve_dtype
from .engines.stacked import LazyMatmul as _LazyMatmul
from .errors import (
    ArgumentTypeError,
    DivisibilityError,
    MeshMismatchError,
    PartialSumError,
    ShapeError,
    ShapeOnlyError,
    ShardingError,
)
from .holders import held_where
from .layout import Layout, is_partition_spec
from .mesh import Mesh

_uids = itertools.count(1)


def new_uid() -> int:
    """A value id no value has yet (for a traced result that is no :class:`ShardedArray` of its own).

    >>> new_uid() < new_uid()
    True
    """
    return next(_uids)


@dataclass(frozen=True)
class ShapeDtype:
    """A global shape and dtype with no data, like ``jax.ShapeDtypeStruct``.

    ``shard(ShapeDtype((8192, 32768), "bfloat16"), mesh, "D_X F_Y")`` gives a shape-only
    sharded value: every op, collective, trace event and ledger entry works on it as on data.

    >>> ShapeDtype((4, 8), "float32").nbytes
    128
    """

    shape: tuple[int, ...]
    dtype: Any = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", check_shape(self.shape, "ShapeDtype(shape)"))
        object.__setattr__(self, "dtype", resolve_dtype(self.dtype))

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


# A chip's block and the ledger's totals are int64 byte counts (NumPy's index type): a value
# past this many bytes per chip could not be indexed, and sums past it would wrap.
MAX_BYTES = 2**62


def check_shape(shape: Any, argument: str) -> tuple[int, ...]:
    """``shape`` as a tuple of non-negative ints, or an error naming ``argument``.

    >>> check_shape([4, 0], "shape")
    (4, 0)
    """
    try:
        dims = tuple(shape)
    except TypeError:
        raise ArgumentTypeError(f"{argument}={shape!r}: a shape is a tuple of integers, e.g. (4, 8)") from None
    for n in dims:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise ArgumentTypeError(f"{argument}={shape!r}: a shape is a tuple of integers, got {n!r}")
        if n < 0:
            raise ShapeError(f"{argument}={shape!r}: dimension sizes are zero or more, got {n}")
    out = tuple(int(n) for n in dims)
    if math.prod(out) >= MAX_BYTES:
        raise ShapeError(f"{argument}={shape!r}: {math.prod(out)} elements is more than any chip can index")
    return out


def require_array(x: Any, argument: str, op: str) -> ShardedArray:
    """``x`` if it is a :class:`ShardedArray`, else :class:`ArgumentTypeError` naming ``argument`` of ``op``.

    >>> try:
    ...     require_array(3, "x", "all_gather")
    ... except ArgumentTypeError as e:
    ...     print(str(e)[:63])
    all_gather needs a ShardedArray, got int for its argument x (3)
    """
    if not isinstance(x, ShardedArray):
        raise ArgumentTypeError(
            f"{op} needs a ShardedArray, got {type(x).__name__} for its argument {argument} ({_short(x)}); "
            "build one with shardsim.shard(array, mesh, layout)"
        )
    return x


def require_mesh(mesh: Any, argument: str, op: str) -> Mesh:
    """``mesh`` if it is a :class:`Mesh`, else :class:`ArgumentTypeError` naming ``argument`` of ``op``."""
    if not isinstance(mesh, Mesh):
        raise ArgumentTypeError(
            f"{op}: {argument} must be a shardsim.Mesh, got {type(mesh).__name__} ({_short(mesh)}); "
            "e.g. shardsim.Mesh(X=2, Y=2)"
        )
    return mesh


def as_numeric(array: Any, argument: str) -> np.ndarray:
    """``np.asarray(array)`` if that is a numeric array, else :class:`ArgumentTypeError` naming ``argument``."""
    try:
        data = np.asarray(array)
    except (TypeError, ValueError) as e:  # ragged nested lists, objects NumPy cannot convert
        raise ArgumentTypeError(f"{argument}: NumPy cannot make an array of {_short(array)} ({e})") from None
    if data.dtype.kind not in "fiucb" and data.dtype.name != "bfloat16":
        raise ArgumentTypeError(f"{argument}: cannot shard an array of dtype {data.dtype}; use a numeric dtype")
    return data


def _short(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"<ndarray {v.shape} {v.dtype}>"
    text = " ".join(repr(v).split())
    return text if len(text) <= 40 else text[:37] + "..."


class ShardedArray:
    """A global array split over a mesh according to a layout such as ``[B_X, D_Y]``.

    Build one with :func:`shard` (from a global array), :func:`from_local` (from every
    chip's block) or by ops and collectives on others. Attributes: ``mesh``, ``layout``,
    ``global_shape``, ``local_shape``, ``dtype``, ``label``, ``category``.

    >>> import shardsim, numpy as np
    >>> w = shardsim.shard(np.ones((4, 8)), shardsim.Mesh(X=2), "D_X F").named("W_in")
    >>> w
    ShardedArray(W_in[D_X, F] float64 (4, 8) on Mesh(X=2), local (2, 8))
    """

    __array_priority__ = 1000  # make ndarray @ ShardedArray defer to us (and fail clearly)

    def __init__(
        self,
        mesh: Mesh,
        layout: Layout,
        global_shape: tuple[int, ...],
        dtype: np.dtype,
        data: np.ndarray | None = None,
        *,
        lazy: _LazyMatmul | None = None,
        label: str | None = None,
        category: str = "activations",
        holders: np.ndarray | None = None,
        view_of: ShardedArray | None = None,
        derived_from: Sequence[ShardedArray] = (),
    ) -> None:
        """Internal: use :func:`shard`, :func:`from_local` or the ops. Data must be compact.

        ``view_of`` marks a value that shares its chips' buffers with another (a transpose):
        the ledger counts the buffer once, until the last value using it dies.
        ``derived_from`` names the values an untraced local op (activation, elementwise, cast)
        computed this one from, so trace events can follow data dependencies through it.
        ``holders`` (bool, shape ``mesh.shape``) marks the chips that hold the value, when only
        some do (a pipeline stage's activations); by default the chips holding all of
        ``view_of`` / ``derived_from`` (see :func:`held_where`), else every chip.
        """
        self.mesh = mesh
        self.layout = layout
        self.global_shape = global_shape
        self.dtype = dtype
        self.label = label
        self.uid = next(_uids)
        self._data = data
        self._lazy = lazy
        self._category = category
        origins = (view_of,) if view_of is not None else tuple(derived_from)
        if holders is None:  # the origins' chips: never all of them (each origin's are not)
            self.holders = held_where(*origins)
        else:
            self.holders = None if holders.all() else holders  # held by every chip: spelled one way
        self.local_shape = local_shape_of(mesh, layout, global_shape)
        self.local_nbytes = math.prod(self.local_shape) * dtype.itemsize
        if self.local_nbytes >= MAX_BYTES:
            raise ShapeError(
                f"{self.describe()} would hold {self.local_nbytes} bytes per chip, more than a chip can index "
                f"(2**62); split it over more chips or use smaller sizes"
            )
        self.storage: int = view_of.storage if view_of is not None else self.uid
        # the traced values (event outputs or program inputs) this one derives from
        if len(origins) == 1:  # the usual case: one origin, whose sources are already distinct
            self.sources: tuple[int, ...] = origins[0].sources
        else:
            self.sources = tuple(dict.fromkeys(s for v in origins for s in v.sources)) or (self.uid,)
        mesh.memory.allocate(self)  # counted until this value dies

    # -- basic properties ---------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.global_shape)

    @property
    def shape(self) -> tuple[int, ...]:
        """The global shape (as NumPy users expect ``.shape`` to be)."""
        return self.global_shape

    @property
    def is_shape_only(self) -> bool:
        return self._data is None and self._lazy is None

    @property
    def is_partial(self) -> bool:
        return bool(self.layout.partial)

    @property
    def category(self) -> str:
        return self._category

    def named(self, label: str) -> ShardedArray:
        """Set the label that traces and pictures show (``W_in``, ``dOut``...); returns self."""
        self.label = label
        return self

    def as_category(self, category: str) -> ShardedArray:
        """Move this value to ledger category ``category`` (params, grads, optimizer...); returns self."""
        self.mesh.memory.recategorize(self, category)
        self._category = category
        return self

    def __repr__(self) -> str:
        name = self.label or ""
        what = "shape-only " if self.is_shape_only else ""
        return (
            f"ShardedArray({name}{self.layout} {what}{self.dtype} {self.global_shape} on {self.mesh}, "
            f"local {self.local_shape})"
        )

    # _repr_html_ is the pictures' (shardsim.pictures puts it on the class)

    # -- data access --------------------------------------------------------------------
    def compact(self) -> np.ndarray:
        """The compact stacked data (mesh dims leading, size 1 where replicated), read-only."""
        if self._lazy is not None:
            self._data, self._lazy = self._lazy.materialize(), None
        if self._data is None:
            raise ShapeOnlyError(
                f"{self.describe()} is shape-only: it has no data to read. Build it from a NumPy array to get numbers."
            )
        return self._data

    def local(self, **coords: int) -> np.ndarray:
        """The block chip ``coords`` holds, e.g. ``x.local(X=0, Y=1)`` (read-only)."""
        index = self._chip_index(coords)
        if self._lazy is not None:
            block = self._lazy.block(index)
        else:
            data = self.compact()
            nm = len(self.mesh.shape)
            block = data[tuple(i if n > 1 else 0 for i, n in zip(index, data.shape[:nm]))]
        block = read_only(block)
        return block

    def blocks(self) -> np.ndarray:
        """Every chip's block, shape ``mesh.shape + local_shape`` (a read-only broadcast view)."""
        return np.broadcast_to(self.compact(), self.mesh.shape + self.local_shape)

    def to_global(self) -> np.ndarray:
        """The whole array as one NumPy array. A partial sum refuses: reduce it first."""
        if self.layout.partial:
            axes = self.layout.partial
            raise PartialSumError(
                f"{self.describe()} is an unreduced partial sum over {list(axes)}; its global value "
                f"is the sum of the chips' blocks. Call all_reduce(x, {_axes_arg(axes)}) or "
                f"reduce_scatter(x, {_axes_arg(axes)}, dim) first."
            )
        nm = len(self.mesh.shape)
        out = _blocks.to_global(self.compact(), self.dims_positions(), nm, self.global_shape)
        out = read_only(out)
        return out

    def _chip_index(self, coords: dict[str, int]) -> tuple[int, ...]:
        names = self.mesh.axis_names
        missing = [a for a in names if a not in coords]
        extra = [a for a in coords if a not in names]
        if missing or extra:
            raise ShardingError(
                f"local() needs one coordinate per mesh axis {list(names)}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {extra}" if extra else "")
                + f", e.g. local({', '.join(f'{a}=0' for a in names)})"
            )
        for a in names:
            if isinstance(coords[a], bool) or not isinstance(coords[a], numbers.Integral):
                raise ShardingError(f"{a}={coords[a]!r}: a chip coordinate is an integer index along axis {a!r}")
            if not 0 <= coords[a] < self.mesh.axis_size(a):
                raise ShardingError(f"{a}={coords[a]} is out of range: axis {a!r} has size {self.mesh.axis_size(a)}")
        return tuple(coords[a] for a in names)

    # -- helpers for ops ----------------------------------------------------------------
    def dims_positions(self) -> list[tuple[int, ...]]:
        """Mesh positions splitting each dimension (for the block kernels)."""
        idx = self.mesh.axis_index
        return [tuple(idx(a) for a in d.axes) for d in self.layout.dims]

    def describe(self) -> str:
        """``W_in[D_X, F_Y] (8, 16)``: how errors and traces name this value."""
        return f"{self.label or 'array'}{self.layout} {self.global_shape}"

    # -- operators: implemented in shardsim.ops, put on the class by shardsim.operators ----
    # (the layer above ops), so that this module needs nothing above it. Declared here for
    # type checkers only.
    if TYPE_CHECKING:

        def __matmul__(self, other: ShardedArray) -> ShardedArray: ...
        def __add__(self, other: Any) -> ShardedArray: ...
        def __radd__(self, other: Any) -> ShardedArray: ...
        def __sub__(self, other: Any) -> ShardedArray: ...
        def __rsub__(self, other: Any) -> ShardedArray: ...
        def __mul__(self, other: Any) -> ShardedArray: ...
        def __rmul__(self, other: Any) -> ShardedArray: ...
        def __truediv__(self, other: Any) -> ShardedArray: ...
        def __rtruediv__(self, other: Any) -> ShardedArray: ...
        def __neg__(self) -> ShardedArray: ...
        def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any: ...
        def astype(self, dtype: Any) -> ShardedArray: ...
        def __getitem__(self, index: Any) -> ShardedArray: ...
        @property
        def T(self) -> ShardedArray: ...  # noqa: N802 - NumPy's name
        def transpose(self, *order: int) -> ShardedArray: ...
        def sum(self, dim: str | int, *, label: str | None = None) -> ShardedArray: ...

    def __rmatmul__(self, other: Any) -> ShardedArray:
        raise ShardingError(
            f"cannot multiply a NumPy array by {self.describe()}: shard it first with shardsim.shard(...)"
        )

    def __floordiv__(self, other: Any) -> ShardedArray:
        return self.__array_ufunc__(np.floor_divide, "__call__", self, other)

    def __rfloordiv__(self, other: Any) -> ShardedArray:
        return self.__array_ufunc__(np.floor_divide, "__call__", other, self)

    def __mod__(self, other: Any) -> ShardedArray:
        return self.__array_ufunc__(np.remainder, "__call__", self, other)

    def __rmod__(self, other: Any) -> ShardedArray:
        return self.__array_ufunc__(np.remainder, "__call__", other, self)

    def __pow__(self, other: Any) -> ShardedArray:
        return self.__array_ufunc__(np.power, "__call__", self, other)

    def __rpow__(self, other: Any) -> ShardedArray:
        return self.__array_ufunc__(np.power, "__call__", other, self)

    def __abs__(self) -> ShardedArray:
        return self.__array_ufunc__(np.absolute, "__call__", self)

    # -- NumPy interoperability ---------------------------------------------------------
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """``np.asarray(x)``: the global array; a partial sum or a shape-only value refuses."""
        out = self.to_global()
        if dtype is not None:
            return out.astype(resolve_dtype(dtype))
        return out.copy() if copy else out


def read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``: blocks handed out can't change the value behind them."""
    view = a.view()
    view.flags.writeable = False
    return view


def local_shape_of(mesh: Mesh, layout: Layout, global_shape: Sequence[int]) -> tuple[int, ...]:
    """Each chip's block shape; raises DivisibilityError naming the dim, axes and sizes."""
    if len(global_shape) != len(layout.dims):
        raise ShapeError(
            f"layout {layout} has {layout.rank} dimensions but the array has shape "
            f"{tuple(global_shape)} ({len(global_shape)} dimensions)"
        )
    out = []
    for n, d in zip(global_shape, layout.dims):
        if n < 0:
            raise ShapeError(f"dimension {d.name} of layout {layout} has negative size {n}")
        if not d.axes:
            out.append(n)
            continue
        parts = mesh.axis_size(d.axes)
        if n % parts:
            sizes = " x ".join(f"{a}={mesh.axis_size(a)}" for a in d.axes)
            fits = [k for k in range(max(parts, 1), n + parts + 1, parts) if k][:3]
            raise DivisibilityError(
                f"dimension {d.name} of size {n} does not divide by mesh axes {list(d.axes)} "
                f"({sizes} = {parts} chips) in layout {layout} on {mesh}. Use a size that is a "
                f"multiple of {parts} (e.g. {fits}) or split {d.name} over fewer axes."
            )
        out.append(n // parts)
    return tuple(out)


def compact_shape(mesh: Mesh, layout: Layout, local_shape: Sequence[int]) -> tuple[int, ...]:
    used = set(layout.used_axes())
    return tuple(s if a in used else 1 for a, s in zip(mesh.axis_names, mesh.shape)) + tuple(local_shape)


def _axes_arg(axes: tuple[str, ...]) -> str:
    return repr(axes[0]) if len(axes) == 1 else repr(axes)


def parse_layout(
    layout: str | Layout, mesh: Mesh, op: str = "shard", *, ndim: int | None = None, names: Sequence[str] | None = None
) -> Layout:
    """``layout`` on ``mesh``, checked; a ``PartitionSpec`` is converted as JAX reads it on an
    ``ndim``-dimensional value (a short spec leaves the last dimensions unsplit), its dimensions
    called ``names`` (default ``d0``, ``d1``, ...). ``op`` names the caller in errors.

    >>> import shardsim
    >>> parse_layout("B_X D", shardsim.Mesh(X=2))
    Layout('[B_X, D]')
    """
    require_mesh(mesh, "mesh", op)
    if is_partition_spec(layout):
        from .specs import from_partition_spec  # a layer above layouts and meshes

        return from_partition_spec(layout, mesh, ndim=ndim, names=names)
    return Layout.parse(layout, mesh.axis_names).validate(mesh.axis_names)


def _ndim(value: Any) -> int | None:
    """The rank of an array-like about to be sharded, or None if NumPy cannot tell (reported later)."""
    if isinstance(value, ShapeDtype):
        return len(value.shape)
    try:
        return int(np.ndim(value))
    except Exception:  # a ragged or hostile object: shard() reports it when it reads the data
        return None


def shard(
    array: Any,
    mesh: Mesh,
    layout: str | Layout,
    *,
    label: str | None = None,
    category: str = "activations",
) -> ShardedArray:
    """Split a global array over ``mesh`` as ``layout`` says, e.g. ``"[B_X, D_Y]"``.

    ``array`` is anything NumPy accepts, or a :class:`ShapeDtype` for a shape-only value. The
    blocks are read-only views of the array (no copy): changing the array later changes them.

    >>> import shardsim, numpy as np
    >>> w = shardsim.shard(np.zeros((4, 8), np.float32), shardsim.Mesh(X=2, Y=2), "D_X F_Y")
    >>> w.local_shape
    (2, 4)
    """
    lay = parse_layout(layout, mesh, ndim=_ndim(array) if is_partition_spec(layout) else None)
    if lay.partial:
        raise PartialSumError(
            f"shard() splits a global array, which is never a partial sum ({lay}); build partial "
            "values from every chip's block with shardsim.from_local(blocks, mesh, layout)"
        )
    if isinstance(array, ShapeDtype):
        return ShardedArray(mesh, lay, array.shape, array.dtype, None, label=label, category=category)
    if isinstance(array, ShardedArray):
        raise ShardingError(f"{array.describe()} is already sharded; use shardsim.reshard to change its layout")
    data = as_numeric(array, "shard(array)")
    shape = tuple(data.shape)
    local_shape_of(mesh, lay, shape)  # validates rank and divisibility with a clear message
    idx = mesh.axis_index
    compact = _blocks.from_global(data, [tuple(idx(a) for a in d.axes) for d in lay.dims], mesh.shape)
    compact = engines.active().own_blocks(read_only(compact), mesh.axis_names)
    return ShardedArray(mesh, lay, shape, data.dtype, compact, label=label, category=category)


def from_local(
    blocks: Any,
    mesh: Mesh,
    layout: str | Layout,
    *,
    label: str | None = None,
    category: str = "activations",
) -> ShardedArray:
    """Build a value from every chip's block, stacked as ``mesh.shape + local_shape``.

    Like DTensor's ``from_local``: the only way to make a partial sum ``{U_X}`` from data.
    Along an axis the layout calls replicated, all blocks must be equal.

    >>> import shardsim, numpy as np
    >>> mesh = shardsim.Mesh(X=2)
    >>> p = shardsim.from_local(np.array([[[1.0]], [[2.0]]]), mesh, "[A, B]{U_X}")
    >>> shardsim.all_reduce(p, "X").to_global()
    array([[3.]])
    """
    lay = parse_layout(layout, mesh, "from_local")
    if isinstance(blocks, (ShardedArray, ShapeDtype)):
        raise ArgumentTypeError(
            f"from_local(blocks={_short(blocks)}): blocks is a NumPy array of every chip's block, "
            f"stacked as mesh.shape + local_shape, got {type(blocks).__name__}"
        )
    data = as_numeric(blocks, "from_local(blocks)")
    nm = len(mesh.shape)
    if data.shape[:nm] != mesh.shape or data.ndim != nm + lay.rank:
        raise ShapeError(
            f"from_local needs blocks of shape mesh.shape + local_shape = {mesh.shape} + "
            f"(rank {lay.rank} block), got {data.shape} for layout {lay}"
        )
    local = data.shape[nm:]
    global_shape = tuple(n * (mesh.axis_size(d.axes) if d.axes else 1) for n, d in zip(local, lay.dims))
    used = set(lay.used_axes())
    for p, a in enumerate(mesh.axis_names):
        if a not in used:
            first = np.take(data, [0], axis=p)
            if not np.array_equal(np.broadcast_to(first, data.shape), data, equal_nan=True):
                raise ShardingError(
                    f"layout {lay} says the value is replicated over {a!r}, but the blocks differ "
                    f"along {a!r}; split a dimension over {a!r} or mark it partial {{U_{a}}}"
                )
            data = first
    data = read_only(data)
    return ShardedArray(mesh, lay, global_shape, data.dtype, data, label=label, category=category)


def check_same_mesh(*arrays: ShardedArray) -> Mesh:
    """The mesh all ``arrays`` live on, or MeshMismatchError naming them."""
    mesh = arrays[0].mesh
    for a in arrays[1:]:
        if a.mesh is not mesh:
            raise MeshMismatchError(
                f"{arrays[0].describe()} lives on {mesh} and {a.describe()} on another mesh {a.mesh}; "
                "build both on one Mesh object"
            )
    return mesh


def check_same_kind(*arrays: ShardedArray) -> bool:
    """True if all have data, False if all are shape-only; mixing is ShapeOnlyError."""
    shape_only = arrays[0].is_shape_only
    if any(a.is_shape_only != shape_only for a in arrays[1:]):
        names = ", ".join(f"{a.describe()} ({'shape-only' if a.is_shape_only else 'data'})" for a in arrays)
        raise ShapeOnlyError(f"cannot mix shape-only values and values with data in one op: {names}")
    return not shape_only
