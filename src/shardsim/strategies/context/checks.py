"""The layout rules of context-parallel attention, each refusal naming its culprit and the fix.

The sequence is split over exactly the context axis (a sequence-parallel split over another
axis cannot share the dimension); k and v are split like q, their kv heads over the axes of
the query heads, so every chip holds whole GQA groups; the positions ``[S_C]`` are integers
with data, split like the sequence.

>>> import numpy as np, shardsim
>>> mesh = shardsim.Mesh(C=2, Y=2)
>>> q = shardsim.shard(np.zeros((1, 4, 2, 2)), mesh, "B S_CY N H")
>>> try:
...     check_layouts(q, q, q, "C")
... except shardsim.ShardingError as e:
...     print(str(e)[:78])
context attention over 'C': q array[B, S_CY, N, H] (1, 4, 2, 2) shares its seq
"""

from __future__ import annotations

from typing import Any

from ...array import ShardedArray, check_same_mesh
from ...errors import ShapeError, ShapeOnlyError, ShardingError


def check_layouts(q: ShardedArray, k: ShardedArray, v: ShardedArray, axis: str | None) -> None:
    """S split over exactly the context axis (whole when ``axis`` is None); k and v split like q
    (kv heads over q's head axes)."""
    b, s, n, h = q.layout.dims
    if axis is None:
        if s.axes:
            raise ShardingError(
                f"attention without a context axis: q {q.describe()} splits its sequence {s} over "
                f"{list(s.axes)}; gather it first (all_gather) or pass that axis as the context axis"
            )
    else:
        _check_sequence(q, axis)
    if h.axes:
        raise ShardingError(f"context attention: q {q.describe()} splits the head dimension {h}; keep it whole")
    for name, x in (("k", k), ("v", v)):
        kb, ks, kn, kh = x.layout.dims
        if (kb.axes, ks.axes, kn.axes, kh.axes) != (b.axes, s.axes, n.axes, h.axes):
            raise ShardingError(
                f"context attention: {name} {x.describe()} must be split like q {q.describe()} "
                f"(batch over {list(b.axes)}, sequence over {list(s.axes)}, kv heads over the query heads' "
                f"axes {list(n.axes)}, so each chip holds whole GQA groups)"
            )


def _check_sequence(q: ShardedArray, axis: str) -> None:
    """q's sequence, and nothing else, split over exactly the context axis."""
    b, s, n, h = q.layout.dims
    where = q.layout.axis_dim(axis)
    if where is None:
        raise ShardingError(
            f"context attention over {axis!r}: q {q.describe()} does not split its sequence over {axis!r}; "
            f"shard it as [{b}, {s.name}_{axis}, {n}, {h}]"
        )
    if where != 1:
        raise ShardingError(
            f"context attention over {axis!r}: q {q.describe()} splits {q.layout.dims[where]} over the context "
            f"axis; the context axis splits the sequence {s.name} only"
        )
    if s.axes != (axis,):
        others = [a for a in s.axes if a != axis]
        raise ShardingError(
            f"context attention over {axis!r}: q {q.describe()} shares its sequence dimension {s} between the "
            f"context axis and {others}; a sequence-parallel or other split of {s.name} over {others} cannot "
            f"share the dimension with context parallelism. Gather over {others} first (all_gather) or use "
            f"{s.name}_{axis} alone"
        )


def check_positions(positions: Any, q: ShardedArray, axis: str | None, causal: bool, seq: int) -> None:
    """``positions [S_C]``: integers with data, split like q's sequence (None allowed when not causal)."""
    if positions is None and not causal:
        return
    want = "[S]" if axis is None else f"[S_{axis}]"
    if not isinstance(positions, ShardedArray):
        raise ShardingError(
            f"context attention: positions must be an int ShardedArray {want} (the global position of each "
            f"row, e.g. shard(balanced_order(S, cp), mesh, '[S_C]')), got {type(positions).__name__}"
        )
    check_same_mesh(q, positions)
    split = () if axis is None else (axis,)
    if positions.global_shape != (seq,) or positions.layout.dims[0].axes != split or positions.is_partial:
        raise ShapeError(
            f"context attention: positions {positions.describe()} must be {want} of shape ({seq},), split "
            f"like the sequence of q {q.describe()}"
        )
    if positions.dtype.kind not in "iu":
        raise ShardingError(
            f"context attention: positions {positions.describe()} must be integers, not {positions.dtype}"
        )
    if positions.is_shape_only:
        raise ShapeOnlyError(
            f"context attention: positions {positions.describe()} is shape-only; the causal mask and the tiles "
            "a chip skips are read from the positions, so give them data even in a shape-only run "
            "(shard(balanced_order(S, cp), mesh, ...))"
        )
