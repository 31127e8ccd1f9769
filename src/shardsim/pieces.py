"""Cutting values into pieces and putting them together, on every chip at once, with no communication.

What a pipeline and a mixture of experts need besides matmuls and collectives:

==============================  ==========================================================
op                              what every chip does
==============================  ==========================================================
``split(x, dim, parts)``        cuts its block along ``dim`` into equal pieces (microbatches)
``concat(pieces, dim)``         glues its blocks back (the inverse of ``split``)
``take(x, dim, i)``             keeps index ``i`` of ``dim``, as NumPy's ``x[i]`` (one layer)
``stack(values, name, axes)``   stacks values along a new dimension split over ``axes``
``place(x, **coords)``          copies ``x`` onto the chips at ``coords`` only (one stage)
``blockwise(fn, inputs, out)``  runs a NumPy function on its blocks (``shard_map``'s body)
==============================  ==========================================================

A value may live on some chips only (its ``holders``): ``take`` of an index of a dimension
split over ``Z`` is held by the chips that own that index, ``place`` puts a copy on a
sub-mesh, and the ledger counts those bytes only there. ``split``, ``take`` and
``concat`` of a split dimension work on each chip's own block, so ``split`` of ``[B_X, D]``
into microbatches gives each microbatch ``B/(X·parts)`` rows from every chip.

>>> import numpy as np, shardsim
>>> mesh = shardsim.Mesh(Z=2)
>>> w = shardsim.shard(np.arange(4.0 * 3).reshape(4, 3), mesh, "L_Z D")
>>> layer = take(w, "L", 3)          # layer 3 lives on the second stage
>>> layer.layout, layer.to_global(), held_text(layer)
(Layout('[D]'), array([ 9., 10., 11.]), '(Z1)')
>>> [p.shape for p in split(shardsim.shard(np.ones((6, 2)), mesh, "B D"), "B", 3)]
[(2, 2), (2, 2), (2, 2)]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from . import engines
from .array import ShardedArray, check_same_kind, check_same_mesh, compact_shape, local_shape_of
from .dtypes import resolve_dtype
from .errors import DivisibilityError, PartialSumError, ShapeError, ShardingError
from .holders import held_text
from .layout import Dim, Layout
from .mesh import normalize_axes
from .xp import namespace

__all__ = ["blockwise", "concat", "held_text", "place", "split", "stack", "take"]


def split(x: ShardedArray, dim: str | int, parts: int, *, label: str | None = None) -> list[ShardedArray]:
    """``parts`` equal pieces of ``x`` along ``dim``, each chip cutting its own block (views).

    Over an unsplit dimension this is ``np.split``. Over a split one, piece ``j`` holds the
    ``j``-th part of every chip's block: the microbatches of a data-parallel batch. The
    pieces share ``x``'s buffers (no new bytes), as NumPy views do.

    >>> import numpy as np, shardsim
    >>> x = shardsim.shard(np.arange(8.0).reshape(8, 1), shardsim.Mesh(X=2), "B_X D")
    >>> [p.to_global().ravel().tolist() for p in split(x, "B", 2)]
    [[0.0, 1.0, 4.0, 5.0], [2.0, 3.0, 6.0, 7.0]]
    """
    i = x.layout.dim_index(dim)
    n = x.local_shape[i]
    if parts < 1 or n % parts:
        chips = x.global_shape[i] // n
        raise DivisibilityError(
            f"split of {x.describe()} into {parts} pieces along {x.layout.dims[i].name}: each of its "
            f"{chips} chip block(s) has {n} rows there, which do not divide by {parts}; use a size that "
            f"is a multiple of {chips * max(parts, 1)}"
        )
    step = n // parts
    shape = x.global_shape[:i] + (x.global_shape[i] // parts,) + x.global_shape[i + 1 :]
    nm = len(x.mesh.shape)
    pieces = []
    for j in range(parts):
        data = None if x.is_shape_only else x.compact()[(slice(None),) * (nm + i) + (slice(j * step, (j + 1) * step),)]
        pieces.append(
            ShardedArray(x.mesh, x.layout, shape, x.dtype, data, label=label or x.label, category=x.category, view_of=x)
        )
    return pieces


def concat(values: Sequence[ShardedArray], dim: str | int, *, label: str | None = None) -> ShardedArray:
    """Glue ``values`` along ``dim``, each chip its own blocks: the inverse of :func:`split`.

    The values share one layout; the result is a new buffer, held where all of them are.

    >>> import numpy as np, shardsim
    >>> x = shardsim.shard(np.arange(8.0).reshape(8, 1), shardsim.Mesh(X=2), "B_X D")
    >>> bool((concat(split(x, "B", 2), "B").to_global() == x.to_global()).all())
    True
    """
    if not values:
        raise ShapeError("concat needs at least one value")
    first = values[0]
    mesh = check_same_mesh(*values)
    has_data = check_same_kind(*values)
    i = first.layout.dim_index(dim)
    for v in values[1:]:
        rest = v.global_shape[:i] + v.global_shape[i + 1 :]
        if (
            v.layout != first.layout
            or v.dtype != first.dtype
            or rest != first.global_shape[:i] + first.global_shape[i + 1 :]
        ):
            raise ShapeError(
                f"concat along {first.layout.dims[i].name}: {v.describe()} {v.dtype} does not match "
                f"{first.describe()} {first.dtype} (same layout, dtype and other dimensions needed)"
            )
    shape = first.global_shape[:i] + (sum(v.global_shape[i] for v in values),) + first.global_shape[i + 1 :]
    data = None
    if has_data:
        nm = len(mesh.shape)
        blocks = [v.compact() for v in values]
        xp = namespace(blocks[0])
        lead = np.broadcast_shapes(*(b.shape[:nm] for b in blocks))
        blocks = [xp.broadcast_to(b, lead + b.shape[nm:]) for b in blocks]
        data = xp.concatenate(blocks, axis=nm + i)
    return ShardedArray(
        mesh,
        first.layout,
        shape,
        first.dtype,
        data,
        label=label or first.label,
        category=first.category,
        derived_from=values,
    )


def take(x: ShardedArray, dim: str | int, index: int, *, label: str | None = None) -> ShardedArray:
    """``x[index]`` along ``dim`` (the dimension goes away), as a view of ``x``'s buffers.

    Over an unsplit dimension every chip takes the index from its block. Over a dimension
    split over mesh axes, only the chips owning ``index`` have it: the result is held there
    (the scaling book's ``W_in[L_Z, D, F][i]`` for a global layer ``i``: one pipeline stage).

    >>> import numpy as np, shardsim
    >>> mesh = shardsim.Mesh(X=2, Z=2)
    >>> w = shardsim.shard(np.zeros((4, 8, 6)), mesh, "L_Z D F_X")
    >>> w1 = take(w, "L", 1)
    >>> w1.layout, held_text(w1)
    (Layout('[D, F_X]'), '(X0,Z0) (X1,Z0)')
    """
    i = x.layout.dim_index(dim)
    d = x.layout.dims[i]
    n = x.global_shape[i]
    if not -n <= index < n:
        raise ShapeError(f"take: index {index} is out of range for {d.name} of size {n} in {x.describe()}")
    index %= n
    nm = len(x.mesh.shape)
    n_local = x.local_shape[i]
    owner, local = divmod(index, n_local)
    coords = dict(zip(d.axes, np.unravel_index(owner, [x.mesh.axis_size(a) for a in d.axes]))) if d.axes else {}
    where: list[Any] = [slice(None)] * (nm + x.ndim)
    for a, c in coords.items():
        where[x.mesh.axis_index(a)] = slice(int(c), int(c) + 1)  # keep the mesh dim, now size 1
    where[nm + i] = local
    data = None if x.is_shape_only else x.compact()[tuple(where)]
    layout = Layout(x.layout.dims[:i] + x.layout.dims[i + 1 :], x.layout.partial)
    shape = x.global_shape[:i] + x.global_shape[i + 1 :]
    held = _on(x, {a: int(c) for a, c in coords.items()}) if coords else x.holders
    return ShardedArray(
        x.mesh, layout, shape, x.dtype, data, label=label or x.label, category=x.category, holders=held, view_of=x
    )


def stack(
    values: list[ShardedArray],
    name: str,
    axes: str | Sequence[str] = (),
    *,
    label: str | None = None,
    move: bool = False,
) -> ShardedArray:
    """Stack ``values`` along a new leading dimension ``name`` split over mesh ``axes``.

    The inverse of :func:`take`: value ``i`` must be held by the chips that own index ``i``
    of the new dimension. Stacking the per-layer gradients each pipeline stage computed gives
    ``dW_in[L_Z, D, F]``. With ``move`` the values go into the result (the list is emptied):
    once nothing else refers to them, the ledger counts their bytes once, as the result's, as
    when a stage's layers already share one buffer.

    >>> import numpy as np, shardsim
    >>> mesh = shardsim.Mesh(Z=2)
    >>> w = shardsim.shard(np.arange(4.0).reshape(4, 1), mesh, "L_Z D")
    >>> again = stack([take(w, "L", i) for i in range(4)], "L", "Z")
    >>> again.layout, bool((again.to_global() == w.to_global()).all())
    (Layout('[L_Z, D]'), True)
    """
    if not values:
        raise ShapeError("stack needs at least one value")
    mesh = check_same_mesh(*values)
    built = _stacked(values, name, normalize_axes(axes) if axes else ())
    origins: Sequence[ShardedArray] = values
    if move:
        values.clear()  # the caller's references go; the values die before the result is counted
        origins = ()
    return ShardedArray(
        mesh, *built[:4], label=label or built[4], category=built[5], holders=built[6], derived_from=origins
    )


def _stacked(values: Sequence[ShardedArray], name: str, along: tuple[str, ...]) -> tuple[Any, ...]:
    """(layout, shape, dtype, data, label, category, holders) of :func:`stack`'s result."""
    first, mesh = values[0], values[0].mesh
    has_data = check_same_kind(*values)
    for v in values[1:]:
        if v.layout != first.layout or v.global_shape != first.global_shape or v.dtype != first.dtype:
            raise ShapeError(f"stack: {v.describe()} {v.dtype} does not match {first.describe()} {first.dtype}")
    clash = [a for a in along if a in first.layout.used_axes()]
    if clash:
        raise ShardingError(f"stack over {list(along)}: {first.describe()} already uses mesh axes {clash}")
    layout = Layout((Dim(name, along), *first.layout.dims), first.layout.partial).validate(mesh.axis_names)
    shape = (len(values), *first.global_shape)
    local_shape_of(mesh, layout, shape)  # DivisibilityError naming the new dimension
    sizes = [mesh.axis_size(a) for a in along]
    per_owner = len(values) // math.prod(sizes)
    held = np.ones(mesh.shape, bool)
    for i, v in enumerate(values):
        owner = i // per_owner
        coords = dict(zip(along, map(int, np.unravel_index(owner, sizes)))) if along else {}
        chips = _on_mask(mesh, coords)
        mine = np.ones(mesh.shape, bool) if v.holders is None else v.holders
        if along and not mine[chips].all():
            raise ShardingError(
                f"stack over {list(along)}: index {i} belongs on "
                f"{' '.join(mesh.chip_name(c) for c in _chips(mesh, chips))} but {v.describe()} "
                f"is held on {held_text(v)}"
            )
        held &= ~chips | mine
    data = None
    if has_data:
        nm = len(mesh.shape)
        lead = np.broadcast_shapes(*(v.compact().shape[:nm] for v in values))
        xp = namespace(values[0].compact())
        arr = xp.stack([xp.broadcast_to(v.compact(), lead + v.local_shape) for v in values], axis=nm)
        if along:  # (mesh..., len, *block) → the new dimension's owners along their mesh axes
            pos = [mesh.axis_index(a) for a in along]
            arr = arr.reshape(arr.shape[:nm] + tuple(sizes) + (per_owner,) + arr.shape[nm + 1 :])
            arr = np.squeeze(arr, axis=tuple(pos))  # those mesh dims were 1: the values did not vary there
            arr = np.moveaxis(arr, list(range(nm - len(pos), nm)), pos)  # (mesh..., per_owner, *block)
        data = arr
    return layout, shape, first.dtype, data, first.label, first.category, held


def place(x: ShardedArray, *, label: str | None = None, **coords: int) -> ShardedArray:
    """A copy of ``x`` held only by the chips at ``coords``, e.g. ``place(x, Z=0)``: one stage.

    No communication: those chips already hold ``x``. The ledger counts the copy there.

    >>> import numpy as np, shardsim
    >>> mesh = shardsim.Mesh(X=2, Z=2)
    >>> x = shardsim.shard(np.ones((4, 4), np.float32), mesh, "B_X D")
    >>> mine = place(x, Z=1)
    >>> mesh.memory.live()[:, 1] - mesh.memory.live()[:, 0]
    array([32, 32])
    """
    if not coords:
        raise ShardingError("place needs the coordinates of the chips to hold the copy, e.g. place(x, Z=0)")
    held = _on(x, coords)
    if not held.any():
        raise ShardingError(f"place of {x.describe()} on {coords}: it is held on {held_text(x)} only")
    data = None if x.is_shape_only else x.compact()
    return ShardedArray(
        x.mesh,
        x.layout,
        x.global_shape,
        x.dtype,
        data,
        label=label or x.label,
        category=x.category,
        holders=held,
        derived_from=(x,),
    )


OutSpec = tuple[str | Layout, Sequence[int], Any]


def _is_one_spec(out: OutSpec | Sequence[OutSpec]) -> bool:
    """Whether ``out`` is one ``(layout, shape, dtype)``, not a list of them (a shape is no layout)."""
    return isinstance(out, tuple) and len(out) == 3 and isinstance(out[0], (str, Layout))


def blockwise(
    fn: Callable[..., Any],
    inputs: Sequence[ShardedArray],
    out: OutSpec | Sequence[OutSpec],
    *,
    label: str | None = None,
) -> Any:
    """Run ``fn`` on every chip's blocks at once, like the body of JAX's ``shard_map``.

    ``fn`` gets each input's blocks stacked over the mesh (leading mesh dimensions, size 1
    where the value is the same on every chip along an axis) and returns the output's blocks
    the same way; ``out`` is the output's ``(layout, global shape, dtype)`` (or a list of
    them, and ``fn`` returns a tuple). The caller vouches that the blocks fit the layout.
    Partial sums are refused: a function of a partial is not the partial of the function.

    >>> import numpy as np, shardsim
    >>> x = shardsim.shard(np.array([[3.0, 1.0], [0.0, 2.0]]), shardsim.Mesh(T=2), "T_T E")
    >>> best = blockwise(lambda b: np.argmax(b, axis=-1), [x], ("[T_T]", (2,), "int64"))
    >>> best.to_global()
    array([0, 1])
    """
    if not inputs:
        raise ShapeError("blockwise needs at least one input (it runs on their chips)")
    mesh = check_same_mesh(*inputs)
    has_data = check_same_kind(*inputs)
    partial = [v.describe() for v in inputs if v.is_partial]
    if partial:
        raise PartialSumError(f"blockwise of partial sums {partial}: reduce them first")
    single = _is_one_spec(out)
    specs: list[OutSpec] = [cast(OutSpec, out)] if single else list(cast(Sequence[OutSpec], out))
    layouts = [Layout.parse(lay, mesh.axis_names).validate(mesh.axis_names) for lay, _, _ in specs]
    shapes = [tuple(int(n) for n in shape) for _, shape, _ in specs]
    dtypes = [resolve_dtype(dt) for _, _, dt in specs]
    results: list[Any] = [None] * len(specs)
    if has_data:
        got = fn(*(v.compact() for v in inputs))
        got = [got] if single else list(got)
        if len(got) != len(specs):
            raise ShapeError(f"blockwise: fn returned {len(got)} values for {len(specs)} outputs")
        for k, (blocks, lay, shape) in enumerate(zip(got, layouts, shapes)):
            want = compact_shape(mesh, lay, local_shape_of(mesh, lay, shape))
            xp = namespace(blocks)
            blocks = xp.asarray(blocks)
            nm = len(mesh.shape)
            if engines.active().per_device:  # one chip's block: every mesh dim is 1
                want = (1,) * nm + want[nm:]
            lead_ok = all(g in (1, w) for g, w in zip(blocks.shape[:nm], want[:nm]))
            if blocks.ndim != len(want) or not lead_ok or blocks.shape[nm:] != want[nm:]:
                raise ShapeError(
                    f"blockwise: output {k} ({lay} {shape}) needs stacked blocks of shape {want} "
                    f"(mesh dims first, 1 where replicated), fn returned {blocks.shape}"
                )
            results[k] = engines.active().cast(xp.broadcast_to(blocks, want[:nm] + blocks.shape[nm:]), dtypes[k])
    outs = [
        ShardedArray(mesh, lay, shape, dt, data, label=label, derived_from=inputs)
        for lay, shape, dt, data in zip(layouts, shapes, dtypes, results)
    ]
    return outs[0] if single else tuple(outs)


# -- helpers ------------------------------------------------------------------------------------
def _on_mask(mesh: Any, coords: dict[str, int]) -> np.ndarray:
    """Bool ``mesh.shape``: the chips at ``coords`` (any index along the other axes)."""
    mask = np.ones(mesh.shape, bool)
    for a, c in coords.items():
        if not 0 <= c < mesh.axis_size(a):
            raise ShardingError(f"{a}={c} is out of range: axis {a!r} has size {mesh.axis_size(a)}")
        along = np.arange(mesh.axis_size(a)) == c
        shape = [1] * len(mesh.shape)
        shape[mesh.axis_index(a)] = -1
        mask &= along.reshape(shape)
    return mask


def _on(x: ShardedArray, coords: dict[str, int]) -> np.ndarray:
    mask = _on_mask(x.mesh, coords)
    return mask if x.holders is None else mask & x.holders


def _chips(mesh: Any, mask: np.ndarray) -> list[dict[str, int]]:
    return [dict(zip(mesh.axis_names, map(int, c))) for c in np.argwhere(mask)]
