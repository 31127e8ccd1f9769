"""Every collective held to its global meaning, on random meshes, layouts, shapes and dtypes.

References are plain NumPy: blocks cut by slicing (``strategies_core.chip_slices``) and sums
written as Python loops over chips, never shardsim's stacked kernels.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardsim
from shardsim import Layout, Mesh
from shardsim.layout import Dim
from strategies_core import (
    all_chips,
    assert_blocks,
    assert_close,
    cases,
    chip_index,
    deep,
    dtypes,
    layouts,
    meshes,
    parts,
    random_array,
    seeds,
)


def _minor_axes(data: st.DataObject, axes: tuple[str, ...]) -> tuple[str, ...]:
    """A non-empty minor end of a dimension's split: the axes a collective may un-split."""
    k = data.draw(st.integers(1, len(axes)))
    return axes[len(axes) - k :]


def _arg(axes: tuple[str, ...]) -> str | tuple[str, ...]:
    """A single axis is passed as a string, as users write it."""
    return axes[0] if len(axes) == 1 else axes


def _one_trace_event(fn, *args):  # type: ignore[no-untyped-def]
    with shardsim.trace() as t:
        out = fn(*args)
    assert len(t.events) == 1
    return out, t.events[0]


# -- AllGather ----------------------------------------------------------------------------------
@deep
@given(st.data())
def test_all_gather_of_shard_is_the_array(data: st.DataObject) -> None:
    case = data.draw(cases(min_split=1))
    x = shardsim.shard(case.array, case.mesh, case.layout)
    assert_blocks(x, case.array)  # shard() puts on each chip the slice its layout names
    i = data.draw(st.sampled_from([k for k, d in enumerate(case.layout.dims) if d.axes]))
    axes = _minor_axes(data, case.layout.dims[i].axes)
    out, ev = _one_trace_event(shardsim.all_gather, x, _arg(axes))

    kept = case.layout.dims[i].axes[: -len(axes)]
    assert out.layout == case.layout.with_dim(i, kept)
    np.testing.assert_array_equal(out.to_global(), case.array)  # bitwise
    assert_blocks(out, case.array)

    # ring AllGather: each chip sends and receives (N-1)/N of the gathered block
    n = parts(case.mesh, axes)
    gathered = case.array.nbytes // math.prod(parts(case.mesh, d.axes) for d in out.layout.dims)
    assert (ev.op, ev.axes, ev.group_size) == ("all_gather", axes, n)
    assert ev.sent_bytes == ev.received_bytes == (n - 1) * gathered // n
    assert (n - 1) * gathered % n == 0


@given(st.data())
def test_gathering_every_split_leaves_one_host_copy(data: st.DataObject) -> None:
    case = data.draw(cases())
    x = shardsim.shard(case.array, case.mesh, case.layout)
    for d in case.layout.dims:
        if d.axes:
            x = shardsim.all_gather(x, _arg(d.axes))
    assert x.layout == Layout(tuple(Dim(d.name) for d in case.layout.dims))
    assert x.compact().shape == (1,) * len(case.mesh.shape) + case.array.shape  # replicated: stored once
    np.testing.assert_array_equal(x.to_global(), case.array)


def test_all_gather_two_axes_order() -> None:
    # D_YX on Mesh(X, Y): Y major. Gathering X (the minor end) leaves D_Y, in global order.
    mesh = Mesh(X=2, Y=3)
    a = np.arange(12.0)
    x = shardsim.shard(a, mesh, "D_YX")
    assert x.local(X=1, Y=0).tolist() == [2.0, 3.0]  # block y*2 + x = 1
    y = shardsim.all_gather(x, "X")
    assert str(y.layout) == "[D_Y]"
    assert y.local(X=0, Y=2).tolist() == [8.0, 9.0, 10.0, 11.0]
    np.testing.assert_array_equal(shardsim.all_gather(x, ("Y", "X")).to_global(), a)


# -- partial sums: ReduceScatter and AllReduce ---------------------------------------------------------
@dataclass
class PartialCase:
    mesh: Mesh
    x: shardsim.ShardedArray  # a partial sum built with from_local
    blocks: np.ndarray  # every chip's block, mesh.shape + local
    axes: tuple[str, ...]  # the partial axes to reduce
    dim: int  # the dimension a ReduceScatter splits


@st.composite
def partial_cases(draw: st.DrawFn) -> PartialCase:
    mesh = draw(meshes())
    rank = draw(st.integers(1, 3))
    lay = draw(layouts(mesh, rank, partial=True))
    if not lay.partial:  # make the first axis a partial sum
        axis = mesh.axis_names[0]
        dims = tuple(Dim(d.name, tuple(a for a in d.axes if a != axis)) for d in lay.dims)
        lay = Layout(dims, (axis,))
    axes = tuple(draw(st.permutations(lay.partial))[: draw(st.integers(1, len(lay.partial)))])
    dim = draw(st.integers(0, rank - 1))
    # local sizes chosen so the dim also divides once the reduced axes split it
    local = [draw(st.integers(1, 2)) * (parts(mesh, axes) if i == dim else 1) for i in range(rank)]
    dtype = draw(dtypes)
    used = set(lay.used_axes())
    stored = tuple(s if a in used else 1 for a, s in zip(mesh.axis_names, mesh.shape))
    blocks = np.broadcast_to(random_array(stored + tuple(local), dtype, draw(seeds)), mesh.shape + tuple(local))
    return PartialCase(mesh, shardsim.from_local(blocks, mesh, lay), blocks, axes, dim)


def _reduced_blocks(pc: PartialCase) -> tuple[np.ndarray, np.ndarray]:
    """Per chip: the sum of the blocks of its group over ``pc.axes`` (a loop), and of their |.|."""
    total = np.zeros(pc.blocks.shape, np.float64)
    scale = np.zeros(pc.blocks.shape, np.float64)
    positions = [pc.mesh.axis_index(a) for a in pc.axes]
    for c in itertools.product(*map(range, pc.mesh.shape)):
        for peer in itertools.product(*(range(pc.mesh.shape[p]) for p in positions)):
            src = list(c)
            for p, k in zip(positions, peer):
                src[p] = k
            total[c] += pc.blocks[tuple(src)]
            scale[c] += np.abs(pc.blocks[tuple(src)])
    return total, scale


@deep
@given(partial_cases())
def test_reduce_scatter_is_the_sum_split(pc: PartialCase) -> None:
    out, ev = _one_trace_event(shardsim.reduce_scatter, pc.x, _arg(pc.axes), pc.dim)
    d = pc.x.layout.dims[pc.dim]
    assert out.layout.dims[pc.dim] == Dim(d.name, d.axes + pc.axes)
    assert out.layout.partial == tuple(a for a in pc.x.layout.partial if a not in pc.axes)
    total, scale = _reduced_blocks(pc)
    n = parts(pc.mesh, pc.axes)
    chunk = pc.blocks.shape[len(pc.mesh.shape) + pc.dim] // n
    for c in all_chips(pc.mesh):
        idx = tuple(c[a] for a in pc.mesh.axis_names)
        k = chip_index(pc.mesh, c, pc.axes)
        cut = (slice(None),) * pc.dim + (slice(k * chunk, (k + 1) * chunk),)
        assert_close(out.local(**c), total[idx][cut], scale[idx][cut], pc.x.dtype, n)
    # ring ReduceScatter: (N-1)/N of the unreduced block per chip
    assert ev.sent_bytes == ev.received_bytes == (n - 1) * pc.x.local_nbytes // n
    assert ev.array_bytes == pc.x.local_nbytes


@deep
@given(partial_cases())
def test_all_reduce_is_all_gather_after_reduce_scatter(pc: PartialCase) -> None:
    with shardsim.trace() as t:
        ar = shardsim.all_reduce(pc.x, _arg(pc.axes))
        rs = shardsim.reduce_scatter(pc.x, _arg(pc.axes), pc.dim)
        ag = shardsim.all_gather(rs, _arg(pc.axes))
    assert ar.layout == ag.layout == pc.x.layout.with_partial(a for a in pc.x.layout.partial if a not in pc.axes)
    for c in all_chips(pc.mesh):  # the same sums in the same order: bitwise equal
        np.testing.assert_array_equal(ar.local(**c), ag.local(**c))
    e_ar, e_rs, e_ag = t.events
    assert e_ar.sent_bytes == e_rs.sent_bytes + e_ag.sent_bytes
    assert e_ar.received_bytes == e_rs.received_bytes + e_ag.received_bytes
    n = parts(pc.mesh, pc.axes)
    assert e_ar.sent_bytes == 2 * (n - 1) * pc.x.local_nbytes // n  # twice an AllGather
    total, scale = _reduced_blocks(pc)
    for c in all_chips(pc.mesh):
        idx = tuple(c[a] for a in pc.mesh.axis_names)
        assert_close(ar.local(**c), total[idx], scale[idx], pc.x.dtype, n)


def test_all_reduce_small_example_by_hand() -> None:
    mesh = Mesh(X=2, Y=2)
    blocks = np.arange(8.0).reshape(2, 2, 2, 1)  # chip (x, y) holds [[4x+2y], [4x+2y+1]]
    p = shardsim.from_local(blocks, mesh, "[D_Y, E]{U_X}")
    assert p.global_shape == (4, 1)
    out = shardsim.all_reduce(p, "X")
    np.testing.assert_array_equal(out.to_global().ravel(), [0 + 4, 1 + 5, 2 + 6, 3 + 7])
    rs = shardsim.reduce_scatter(p, "X", "D")
    assert str(rs.layout) == "[D_YX, E]"
    np.testing.assert_array_equal(rs.to_global().ravel(), [4, 6, 8, 10])


def test_reductions_are_bitwise_reproducible() -> None:
    def run() -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(7)
        mesh = Mesh(X=8, Y=4)
        blocks = rng.standard_normal((8, 4, 16, 32)).astype(np.float32) * 10.0 ** rng.integers(-6, 6, (8, 4, 16, 32))
        p = shardsim.from_local(blocks, mesh, "[B_Y, D]{U_X}")
        return shardsim.all_reduce(p, "X").to_global(), shardsim.reduce_scatter(p, "X", "D").to_global()

    first, second = run(), run()
    for a, b in zip(first, second):
        assert np.array_equal(a, b)


# -- AllToAll -------------------------------------------------------------------------------------
@deep
@given(st.data())
def test_all_to_all_there_and_back(data: st.DataObject) -> None:
    mesh = data.draw(meshes())
    rank = data.draw(st.integers(2, 3))
    lay = data.draw(layouts(mesh, rank))
    if not any(d.axes for d in lay.dims):
        lay = lay.with_dim(0, (mesh.axis_names[0],))
    src = data.draw(st.sampled_from([i for i, d in enumerate(lay.dims) if d.axes]))
    dst = data.draw(st.sampled_from([i for i in range(rank) if i != src]))
    axes = _minor_axes(data, lay.dims[src].axes)
    shape = tuple(
        data.draw(st.integers(1, 2)) * parts(mesh, d.axes + (axes if i == dst else ())) for i, d in enumerate(lay.dims)
    )
    a = random_array(shape, data.draw(dtypes), data.draw(seeds))
    x = shardsim.shard(a, mesh, lay)
    y, ev = _one_trace_event(shardsim.all_to_all, x, _arg(axes), lay.dims[src].name, dst)

    expect = lay.with_dim(src, lay.dims[src].axes[: -len(axes)])
    expect = expect.with_dim(dst, lay.dims[dst].axes + axes)
    assert y.layout == expect
    np.testing.assert_array_equal(y.to_global(), a)
    assert_blocks(y, a)
    n = parts(mesh, axes)
    assert ev.sent_bytes == ev.received_bytes == (n - 1) * x.local_nbytes // n  # (N-1)/N of the block

    back = shardsim.all_to_all(y, _arg(axes), dst, src)
    assert back.layout == lay
    for c in all_chips(mesh):
        np.testing.assert_array_equal(back.local(**c), x.local(**c))


def test_all_to_all_small_example() -> None:
    mesh = Mesh(X=2)
    a = np.arange(8.0).reshape(2, 4)
    x = shardsim.shard(a, mesh, "[A, B_X]")
    y = shardsim.all_to_all(x, "X", "B", "A")  # jax: split_axis=A (dst), concat_axis=B (src)
    assert str(y.layout) == "[A_X, B]"
    np.testing.assert_array_equal(y.local(X=1), a[1:2, :])


# -- ppermute ------------------------------------------------------------------------------------
@deep
@given(st.data())
def test_ppermute_shifts_blocks_around_the_ring(data: st.DataObject) -> None:
    case = data.draw(cases(min_split=1))
    varying = [a for a in case.mesh.axis_names if case.layout.axis_dim(a) is not None]
    axis = data.draw(st.sampled_from(varying))
    n = case.mesh.axis_size(axis)
    x = shardsim.shard(case.array, case.mesh, case.layout)
    y, ev = _one_trace_event(shardsim.ppermute, x, axis, 1)
    assert y.layout == x.layout
    for c in all_chips(case.mesh):  # chip i's block lands on chip i+1
        np.testing.assert_array_equal(y.local(**{**c, axis: (c[axis] + 1) % n}), x.local(**c))
    assert ev.sent_bytes == ev.received_bytes == (x.local_nbytes if n > 1 else 0)

    z = x
    for _ in range(n):
        z = shardsim.ppermute(z, axis, 1)
    np.testing.assert_array_equal(z.compact(), x.compact())  # N shifts: the identity

    s = data.draw(st.integers(-2 * n, 2 * n))
    by_shift = shardsim.ppermute(x, axis, s)
    by_perm = shardsim.ppermute(x, axis, perm=[(i, (i + s) % n) for i in range(n)])
    np.testing.assert_array_equal(by_shift.compact(), by_perm.compact())


def test_ppermute_over_two_axes_shifts_the_flattened_index() -> None:
    mesh = Mesh(X=2, Y=3)
    a = np.arange(6.0)
    x = shardsim.shard(a, mesh, "D_XY")
    y = shardsim.ppermute(x, ("X", "Y"), 1)  # flat index x*3 + y, X major
    np.testing.assert_array_equal(y.to_global(), np.roll(a, 1))


@pytest.mark.parametrize("layout", ["D_XY", "D_Y"])
def test_ppermute_over_an_axis_of_one_chip(layout: str) -> None:
    # an axis of size 1 cannot make a value differ along it, whether the layout names it or not
    mesh = Mesh(X=1, Y=4)
    a = np.arange(8.0)
    y = shardsim.ppermute(shardsim.shard(a, mesh, layout), ("X", "Y"), 1)
    np.testing.assert_array_equal(y.to_global(), np.roll(a, 2))


def test_ppermute_of_a_replicated_value_keeps_every_block() -> None:
    mesh = Mesh(X=4)
    x = shardsim.shard(np.arange(4.0), mesh, "D")
    y = shardsim.ppermute(x, "X", 1)
    np.testing.assert_array_equal(y.to_global(), np.arange(4.0))


def test_ppermute_partial_sum_moves_partials() -> None:
    mesh = Mesh(X=3)
    blocks = np.array([[1.0], [10.0], [100.0]])
    p = shardsim.from_local(blocks, mesh, "[D]{U_X}")
    q = shardsim.ppermute(p, "X", perm=[(0, 2), (2, 1), (1, 0)])
    assert [q.local(X=i).item() for i in range(3)] == [10.0, 100.0, 1.0]
    assert shardsim.all_reduce(q, "X").to_global().item() == 111.0


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({}, "exactly one of shift"),
        ({"shift": 1, "perm": [(0, 1)]}, "exactly one of shift"),
        ({"perm": [(0, 1)]}, "perm must be a full permutation of 0..3"),
        ({"perm": [(0, 1), (1, 1), (2, 2), (3, 3)]}, "chip 1 receives twice"),
        ({"perm": [(0, 4)]}, "pair (0, 4) out of range for an axis of size 4"),
    ],
)
def test_ppermute_argument_errors(kwargs: dict, words: str) -> None:
    x = shardsim.shard(np.arange(4.0), Mesh(X=4), "D_X")
    with pytest.raises(shardsim.ShardingError) as info:
        shardsim.ppermute(x, "X", **kwargs)
    assert words in str(info.value)


# -- collectives keep labels and categories ------------------------------------------------------------
def test_collectives_keep_label_and_category() -> None:
    mesh = Mesh(X=2)
    w = shardsim.shard(np.ones((4, 2)), mesh, "D_X F", label="W", category="params")
    full = shardsim.all_gather(w, "X")
    assert (full.label, full.category) == ("W", "params")
    assert shardsim.all_gather(w, "X", label="W_full").label == "W_full"


@deep
@given(partial_cases(), st.data())
def test_collectives_over_different_axes_commute(pc: PartialCase, data: st.DataObject) -> None:
    # un-splitting a dimension over one axis and reducing over another can happen in either order
    split = [d for d in pc.x.layout.dims if d.axes]
    if not split:
        return
    d = data.draw(st.sampled_from(split))
    gather = _minor_axes(data, d.axes)
    reduce_axes = _arg(pc.axes)
    first = shardsim.all_reduce(shardsim.all_gather(pc.x, _arg(gather)), reduce_axes)
    second = shardsim.all_gather(shardsim.all_reduce(pc.x, reduce_axes), _arg(gather))
    assert first.layout == second.layout
    n = parts(pc.mesh, pc.axes)
    scale = np.abs(pc.blocks).max() * n * np.ones(first.local_shape)
    for c in all_chips(pc.mesh):
        assert_close(first.local(**c), second.local(**c), scale, pc.x.dtype, n)


def test_four_axis_mesh() -> None:
    mesh = Mesh(A=2, B=1, C=3, D=2)
    a = np.random.default_rng(5).standard_normal((12, 4))
    x = shardsim.shard(a, mesh, "[R_AC, S_D]")
    assert x.local_shape == (2, 2)
    assert_blocks(x, a)
    y = shardsim.all_gather(x, "C")
    assert str(y.layout) == "[R_A, S_D]"
    np.testing.assert_array_equal(y.to_global(), a)
    z = shardsim.all_to_all(y, "D", "S", "R")
    assert str(z.layout) == "[R_AD, S]"
    assert_blocks(z, a)
    s = shardsim.all_reduce(z.sum("R"), ("A", "D"))
    np.testing.assert_allclose(s.to_global(), a.sum(axis=0), rtol=shardsim.dtypes.tolerance(np.float64, 12))


def test_results_are_read_only_views() -> None:
    mesh = Mesh(X=2)
    a = np.arange(8.0).reshape(2, 4)
    x = shardsim.shard(a, mesh, "R C_X")
    assert np.shares_memory(x.compact(), a)  # shard() does not copy
    for view in (x.local(X=1), x.to_global(), x.compact(), x.blocks()):
        with pytest.raises(ValueError, match="read-only"):
            view[...] = 0.0
