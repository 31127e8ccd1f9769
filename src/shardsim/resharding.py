"""Resharding: move a value from one layout to another by the cheapest sequence of collectives.

``reshard(x, "[B, D_X]")`` plans the steps that turn ``x``'s layout into the target on the
same mesh, runs them through the public collectives (so the trace shows every one), and
returns the result. The steps are:

==================  ===================================  ==============================
step                layout                               bytes each chip sends
==================  ===================================  ==============================
``slice``           ``[A, B] -> [A_X, B]``               0 (each chip keeps its slice)
``all_to_all``      ``[A_X, B] -> [A, B_X]``             (N-1)/N of its block
``all_gather``      ``[A_X, B] -> [A, B]``               (N-1) x its block
``reduce_scatter``  ``[A, B]{U_X} -> [A_X, B]``          (N-1) x its output block
``all_reduce``      ``[A, B]{U_X} -> [A, B]``            2(N-1)/N of its block
==================  ===================================  ==============================

A search over layouts (Dijkstra, cost = bytes each chip sends, then the number of
collectives, then the number of steps) picks the order: an AllToAll beats an AllGather and a
slice, a slice before an AllGather shrinks what is gathered, a ReduceScatter beats an
AllReduce and a slice. ``docs/resharding.md`` lists the transitions and their costs.

Onto another mesh the value travels through the host: its global array is assembled from
the chips' blocks (partial sums added in ascending chip order) and split anew. That is a
``host_transfer`` step in the trace, not a collective.

>>> import numpy as np, shardsim
>>> mesh = shardsim.Mesh(X=4)
>>> x = shardsim.shard(np.arange(32.0).reshape(4, 8), mesh, "B_X D").named("act")
>>> with shardsim.trace() as t:
...     y = reshard(x, "[B, D_X]")
>>> t.steps(), y.layout
([('all_to_all', 'X', 'act')], Layout('[B, D_X]'))
>>> bool((y.to_global() == x.to_global()).all())
True
"""

from __future__ import annotations

import heapq
import itertools
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from . import _blocks, collectives, engines
from .array import ShardedArray, local_shape_of, parse_layout, require_array, require_mesh, shard
from .errors import ChipFailureError, PartialSumError, ShapeError, ShardingError
from .layout import Dim, Layout
from .mesh import Mesh
from .tracing import record

__all__ = ["Step", "host_global", "plan_reshard", "reshard"]

# The state of the search: each dimension's split axes (major first) and the partial axes.
_State = tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]


@dataclass(frozen=True)
class Step:
    """One step of a resharding plan.

    ``op`` is ``slice``, ``all_to_all``, ``all_gather``, ``reduce_scatter`` or ``all_reduce``;
    ``axes`` the mesh axes it works over; ``src`` the dimension the axes leave (gather,
    all-to-all), ``dst`` the one they join (slice, all-to-all, reduce-scatter);
    ``sent_bytes`` what each chip sends (the trace's figure); ``after`` the layout it leaves.
    """

    op: str
    axes: tuple[str, ...]
    src: int | None
    dst: int | None
    sent_bytes: int
    after: Layout

    def __str__(self) -> str:
        return f"{self.op}({''.join(self.axes)}) -> {self.after}"


def reshard(x: ShardedArray, layout: str | Layout, mesh: Mesh | None = None, label: str | None = None) -> ShardedArray:
    """``x`` in layout ``layout``: on its own mesh by the cheapest collectives, on another via the host.

    Dimensions are matched by position and must keep their names (resharding moves blocks;
    :meth:`ShardedArray.transpose` reorders dimensions). A partial sum ``{U_X}`` is reduced
    (ReduceScatter or AllReduce) unless the target keeps it; no step creates one. If ``x``
    already has the layout on that mesh it is returned as is (relabelled if ``label`` is
    given).

    >>> import numpy as np, shardsim
    >>> mesh = shardsim.Mesh(X=2, Y=2)
    >>> w = shardsim.shard(np.arange(32.0).reshape(4, 8), mesh, "D_XY F")
    >>> with shardsim.trace() as t:
    ...     v = reshard(w, "[D, F_XY]")
    >>> t.collectives(), v.layout
    ([('all_to_all', ('X', 'Y'))], Layout('[D, F_XY]'))
    """
    require_array(x, "x", "reshard")
    if mesh is not None:
        require_mesh(mesh, "mesh", "reshard")
    if mesh is not None and mesh is not x.mesh:
        return _host_transfer(x, layout, mesh, label)
    target = _target(x, layout)
    if target == x.layout:
        return x if label is None else x.named(label)
    cur = x
    try:
        for step in _search(x.mesh, x.layout, target, x.global_shape, x.dtype.itemsize):
            cur = _run(cur, step)
    except BaseException as e:
        # An aborted reshard (out of memory, failed chip) keeps no intermediate value alive, even
        # while the caller holds the traceback: drop it from this frame and the finished ones below.
        cur = x
        if e.__traceback__ is not None and e.__traceback__.tb_next is not None:
            traceback.clear_frames(e.__traceback__.tb_next)
        raise
    if cur.layout != target:  # the partial axes listed in another order: same blocks
        cur = ShardedArray(
            cur.mesh,
            target,
            cur.global_shape,
            cur.dtype,
            cur._data,
            lazy=cur._lazy,
            label=cur.label,
            category=cur.category,
            view_of=cur,
        )
    if label is not None:
        cur.label = label
    return cur


def plan_reshard(x: ShardedArray, layout: str | Layout) -> list[Step]:
    """The steps :func:`reshard` would run to move ``x`` to ``layout`` on its mesh (runs nothing).

    >>> import numpy as np, shardsim
    >>> from shardsim.resharding import plan_reshard
    >>> x = shardsim.shard(np.zeros((8, 8), np.float32), shardsim.Mesh(X=2, Y=4), "B_X D")
    >>> [str(s) for s in plan_reshard(x, "[B, D_Y]")]
    ['slice(Y) -> [B_X, D_Y]', 'all_gather(X) -> [B, D_Y]']
    >>> [s.sent_bytes for s in plan_reshard(x, "[B, D_Y]")]
    [0, 32]
    """
    if not isinstance(x, ShardedArray):
        require_array(x, "x", "plan_reshard")
    return _search(x.mesh, x.layout, _target(x, layout), x.global_shape, x.dtype.itemsize)


def host_global(x: ShardedArray) -> np.ndarray:
    """The global array of ``x`` as the host assembles it; a partial sum is summed in ascending chip order.

    The order is the one :func:`~shardsim.all_reduce` uses on plain blocks, so a reduced value
    is bitwise the same either way.

    >>> import numpy as np, shardsim
    >>> p = shardsim.from_local(np.array([[[1.0]], [[2.0]]]), shardsim.Mesh(X=2), "[A, B]{U_X}")
    >>> host_global(p)
    array([[3.]])
    """
    return global_from_compact(x.compact(), x.layout, x.mesh.axis_names, x.global_shape)


def global_from_compact(
    compact: np.ndarray, layout: Layout, axis_names: Sequence[str], global_shape: Sequence[int]
) -> np.ndarray:
    """The global array of compact stacked data (mesh dims first), summing any partial axes."""
    pos = {a: i for i, a in enumerate(axis_names)}
    if layout.partial:
        compact = _blocks.sum_mesh(compact, [pos[a] for a in layout.partial])
    dims_axes = [tuple(pos[a] for a in d.axes) for d in layout.dims]
    return _blocks.to_global(compact, dims_axes, len(axis_names), tuple(global_shape))


# -- target layout --------------------------------------------------------------------------
def _target(x: ShardedArray, layout: str | Layout) -> Layout:
    # a PartitionSpec keeps x's names
    target = parse_layout(layout, x.mesh, "reshard", ndim=x.ndim, names=x.layout.names)
    _check_same_dims(x, target)
    local_shape_of(x.mesh, target, x.global_shape)  # DivisibilityError naming the dimension
    new_partial = [a for a in target.partial if a not in x.layout.partial]
    if new_partial:
        raise PartialSumError(
            f"reshard of {x.describe()} to {target}: no resharding step creates a partial sum "
            f"over {new_partial}; keep only partial axes the value already has ({list(x.layout.partial)})"
        )
    return target


def _check_same_dims(x: ShardedArray, target: Layout) -> None:
    if target.rank != x.layout.rank:
        raise ShapeError(
            f"reshard of {x.describe()} to {target}: the target has {target.rank} dimensions, the value {x.ndim}"
        )
    if target.names != x.layout.names:
        raise ShapeError(
            f"reshard of {x.describe()} to {target}: dimensions are matched by position and keep their "
            f"names ({list(x.layout.names)} vs {list(target.names)}); reshard does not transpose, "
            "use x.transpose(...) for that"
        )


# -- the search -----------------------------------------------------------------------------
def _search(mesh: Mesh, src: Layout, dst: Layout, shape: Sequence[int], itemsize: int) -> list[Step]:
    """Cheapest steps from ``src`` to ``dst``: Dijkstra over (bytes sent, collectives, steps)."""
    names = src.names
    goal_dims = tuple(d.axes for d in dst.dims)
    goal_partial = set(dst.partial)
    start: _State = (tuple(d.axes for d in src.dims), src.partial)

    def local_bytes(dims: tuple[tuple[str, ...], ...]) -> int | None:
        n = itemsize
        for size, axes in zip(shape, dims):
            parts = mesh.axis_size(axes) if axes else 1
            if size % parts:
                return None
            n *= size // parts
        return n

    def moves(state: _State) -> Iterator[tuple[str, tuple[str, ...], int | None, int | None, _State]]:
        dims, partial = state
        used = {a for axes in dims for a in axes} | set(partial)
        free = [a for a in mesh.axis_names if a not in used]
        reducible = [a for a in partial if a not in goal_partial]

        def toward_goal(j: int, axes: tuple[str, ...]) -> bool:
            return goal_dims[j][: len(dims[j]) + len(axes)] == dims[j] + axes

        def with_dims(changes: dict[int, tuple[str, ...]], left: tuple[str, ...] = partial) -> _State:
            return tuple(changes.get(i, a) for i, a in enumerate(dims)), left

        # a slice or ReduceScatter extends a dimension toward its target split
        for j, axes_j in enumerate(dims):
            if goal_dims[j][: len(axes_j)] != axes_j:
                continue
            nxt = goal_dims[j][len(axes_j) :]
            for k in range(1, len(nxt) + 1):
                add = nxt[:k]
                if all(a in free for a in add):
                    yield "slice", add, None, j, with_dims({j: axes_j + add})
                if all(a in reducible for a in add):
                    left = tuple(a for a in partial if a not in add)
                    yield "reduce_scatter", add, None, j, with_dims({j: axes_j + add}, left)
        # an AllToAll or AllGather takes the minor end of a dimension's split
        for i, axes_i in enumerate(dims):
            for k in range(1, len(axes_i) + 1):
                moved, rest = axes_i[len(axes_i) - k :], axes_i[: len(axes_i) - k]
                for j, axes_j in enumerate(dims):
                    if j != i:
                        yield "all_to_all", moved, i, j, with_dims({i: rest, j: axes_j + moved})
                yield "all_gather", moved, i, None, with_dims({i: rest})
        for k in range(1, len(reducible) + 1):
            for axes in itertools.combinations(reducible, k):
                yield "all_reduce", axes, None, None, (dims, tuple(a for a in partial if a not in axes))

    def sent(op: str, axes: tuple[str, ...], before: int, after: int) -> int:
        n = mesh.axis_size(axes)
        if op == "slice":
            return 0
        if op == "all_gather":
            return (n - 1) * before
        if op == "all_to_all":
            return (n - 1) * before // n
        if op == "reduce_scatter":
            return (n - 1) * after
        return 2 * (n - 1) * before // n  # all_reduce

    def is_goal(state: _State) -> bool:
        return state[0] == goal_dims and set(state[1]) == goal_partial

    def layout_of(state: _State) -> Layout:
        return Layout(tuple(Dim(n, a) for n, a in zip(names, state[0])), state[1])

    best: dict[_State, tuple[int, int, int]] = {start: (0, 0, 0)}
    back: dict[_State, tuple[_State, Step]] = {}
    order = itertools.count()
    heap: list[tuple[tuple[int, int, int], int, _State]] = [((0, 0, 0), next(order), start)]
    while heap:
        cost, _, state = heapq.heappop(heap)
        if cost > best[state]:
            continue
        if is_goal(state):
            steps: list[Step] = []
            while state in back:
                state, step = back[state]
                steps.append(step)
            return steps[::-1]
        before = local_bytes(state[0])
        assert before is not None
        for op, axes, i, j, nxt in moves(state):
            after = local_bytes(nxt[0])
            if after is None:
                continue
            b = sent(op, axes, before, after)
            c = (cost[0] + b, cost[1] + (op != "slice"), cost[2] + 1)
            if nxt not in best or c < best[nxt]:
                best[nxt] = c
                back[nxt] = (state, Step(op, axes, i, j, b, layout_of(nxt)))
                heapq.heappush(heap, (c, next(order), nxt))
    # Unreachable: reduce every partial, gather everything, then slice is always a path.
    raise AssertionError(f"no resharding path from {src} to {dst}")  # pragma: no cover


def _run(x: ShardedArray, step: Step) -> ShardedArray:
    if step.op == "slice":
        assert step.dst is not None
        return local_slice(x, step.axes, step.dst)
    if step.op == "all_to_all":
        assert step.src is not None and step.dst is not None
        return collectives.all_to_all(x, step.axes, step.src, step.dst)
    if step.op == "all_gather":
        return collectives.all_gather(x, step.axes)
    if step.op == "reduce_scatter":
        assert step.dst is not None
        return collectives.reduce_scatter(x, step.axes, step.dst)
    return collectives.all_reduce(x, step.axes)


def local_slice(
    x: ShardedArray, axes: str | Sequence[str], dim: str | int, *, label: str | None = None
) -> ShardedArray:
    """Split ``dim`` over ``axes`` (over which ``x`` is replicated) by each chip keeping its slice.

    No communication: ``[A, B] -> [A_X, B]`` is a local step, recorded in the trace as
    ``("slice", axes)`` with 0 bytes sent (``hbm_bytes`` counts the copy of the kept slice).

    >>> import numpy as np, shardsim
    >>> x = shardsim.shard(np.arange(8.0).reshape(4, 2), shardsim.Mesh(X=2), "A B")
    >>> local_slice(x, "X", "A").local(X=1)
    array([[4., 5.],
           [6., 7.]])
    """
    axes_t = collectives._axes(x, axes, "local_slice")
    busy = [a for a in axes_t if a in x.layout.used_axes()]
    if busy:
        raise ShardingError(
            f"slice of {x.describe()} over {list(axes_t)}: the value already varies over {busy}; "
            "only an axis it is replicated over can be sliced locally"
        )
    i = x.layout.dim_index(dim)
    layout = x.layout.with_dim(i, x.layout.dims[i].axes + axes_t)
    data = None
    if not x.is_shape_only:
        nm = len(x.mesh.shape)
        pos = [x.mesh.axis_index(a) for a in axes_t]
        data = engines.active().local_slice(x.compact(), nm, pos, axes_t, [x.mesh.axis_size(a) for a in axes_t], i)
    out = ShardedArray(
        x.mesh, layout, x.global_shape, x.dtype, data, label=label or x.label, category=x.category, holders=x.holders
    )  # a slice of a pipeline stage's value lives on that stage only
    record(
        "slice",
        axes_t,
        [x],
        out,
        sent_bytes=0,
        received_bytes=0,
        hbm_bytes=2 * out.local_nbytes,
        group_size=x.mesh.axis_size(axes_t),
        array_bytes=0,
    )
    return out


# -- onto another mesh -----------------------------------------------------------------------
def _host_transfer(x: ShardedArray, layout: str | Layout, mesh: Mesh, label: str | None) -> ShardedArray:
    target = parse_layout(layout, mesh, "reshard", ndim=x.ndim, names=x.layout.names)
    _check_same_dims(x, target)
    if target.partial:
        raise PartialSumError(
            f"reshard of {x.describe()} onto {mesh} as {target}: a host transfer moves the global "
            "value, never a partial sum; choose a layout without {U...}"
        )
    _check_blocks_alive(x)
    name = label or x.label
    if x.is_shape_only:
        from .array import ShapeDtype

        out = shard(ShapeDtype(x.global_shape, x.dtype), mesh, target, label=name, category=x.category)
    else:
        out = shard(host_global(x), mesh, target, label=name, category=x.category)
    record("host_transfer", (), [x], out, sent_bytes=0, received_bytes=out.local_nbytes, array_bytes=out.local_nbytes)
    return out


def _check_blocks_alive(x: ShardedArray) -> None:
    """Raise ChipFailureError if some block of ``x`` lives only on failed chips."""
    if not x.mesh.failed:
        return
    alive = np.ones(x.mesh.shape, bool)
    for chip in x.mesh.failed:
        alive[chip] = False
    used = set(x.layout.used_axes())
    replicated = tuple(p for p, a in enumerate(x.mesh.axis_names) if a not in used)
    held = alive.any(axis=replicated, keepdims=True) if replicated else alive
    if held.all():
        return
    lost = tuple(int(i) for i in np.argwhere(~held)[0])
    names = x.mesh.axis_names
    where = "(" + ",".join(f"{a}{'*' if p in replicated else lost[p]}" for p, a in enumerate(names)) + ")"
    raise ChipFailureError(
        f"host transfer of {x.describe()}: the block on chip {where} is held only by failed chips "
        f"({', '.join(x.mesh.chip_name(dict(zip(names, c))) for c in sorted(x.mesh.failed))}); "
        "restore it from a checkpoint instead (shardsim.checkpoint.load)"
    )
