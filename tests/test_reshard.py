"""Resharding: the chosen steps, their bytes, and bitwise-equal values for random layout pairs.

References are plain NumPy: every chip's block is cut from the global array by explicit
slicing, chip by chip; partial sums are added with NumPy over explicit per-chip pieces.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, seed
from hypothesis import strategies as st

import shardsim
from fuzz_budget import budget
from shardsim import (
    ChipFailureError,
    LayoutParseError,
    MeshAxisError,
    PartialSumError,
    ShapeError,
    ShardingError,
)
from shardsim.layout import Dim, Layout
from shardsim.resharding import host_global, local_slice, plan_reshard, reshard

NAMES = ("X", "Y", "Z", "W")


DIMS = ("A", "B", "C")


# -- plain-NumPy references ------------------------------------------------------------------------
def chips(mesh: shardsim.Mesh) -> list[dict[str, int]]:
    return [dict(zip(mesh.axis_names, c)) for c in itertools.product(*map(range, mesh.shape))]


def chip_slices(mesh: shardsim.Mesh, layout: Layout, shape: tuple[int, ...], c: dict[str, int]) -> tuple[slice, ...]:
    out = []
    for n, d in zip(shape, layout.dims):
        k = 0
        for a in d.axes:
            k = k * mesh.axis_size(a) + c[a]
        size = n // math.prod(mesh.axis_size(a) for a in d.axes)
        out.append(slice(k * size, (k + 1) * size))
    return tuple(out)


def assert_blocks(x: shardsim.ShardedArray, full: np.ndarray) -> None:
    """Every chip's block is, byte for byte, the slice of ``full`` its layout names."""
    for c in chips(x.mesh):
        want = full[chip_slices(x.mesh, x.layout, full.shape, c)]
        got = x.local(**c)
        assert got.dtype == want.dtype and got.shape == want.shape, (c, got.shape, want.shape)
        assert got.tobytes() == want.tobytes(), f"chip {c} of {x.layout}"


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# -- strategies ------------------------------------------------------------------------------------
@st.composite
def meshes(draw: st.DrawFn) -> shardsim.Mesh:
    n = draw(st.integers(1, 4))
    sizes = [draw(st.integers(1, 3)) for _ in range(n)]
    return shardsim.Mesh(dict(zip(NAMES, sizes)))


@st.composite
def layouts(draw: st.DrawFn, mesh: shardsim.Mesh, rank: int, partial: tuple[str, ...] | None = None) -> Layout:
    """A legal layout; with ``partial``, its partial axes are drawn from those (the rest as usual)."""
    slots: list[list[str]] = [[] for _ in range(rank)]
    part: list[str] = []
    for axis in draw(st.permutations(mesh.axis_names)):
        if partial is not None and axis in partial and draw(st.booleans()):
            part.append(axis)
            continue
        where = draw(st.integers(-1, rank - 1))
        if where >= 0:
            slots[where].append(axis)
    return Layout(tuple(Dim(DIMS[i], tuple(s)) for i, s in enumerate(slots)), tuple(part))


def parts(mesh: shardsim.Mesh, axes: tuple[str, ...]) -> int:
    return math.prod(mesh.axis_size(a) for a in axes)


def fitting_shape(draw: st.DrawFn, mesh: shardsim.Mesh, *lays: Layout) -> tuple[int, ...]:
    shape = []
    for i in range(lays[0].rank):
        unit = math.lcm(*(parts(mesh, lay.dims[i].axes) for lay in lays))
        shape.append(unit * draw(st.integers(0, 2)))
    return tuple(shape)


def random_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("int"):
        return rng.integers(-100, 100, shape).astype(dtype)
    v = rng.standard_normal(shape).astype(dtype)
    if v.size:
        v.flat[0] = np.nan  # NaN and Inf travel like any other bits
        v.flat[-1] = -np.inf
    return v


def naive_bytes(x: shardsim.ShardedArray, target: Layout) -> int:
    """Bytes per chip of the obvious path: AllReduce, gather everything, slice (public collectives)."""
    with shardsim.trace() as t:
        y = x
        reduce = [a for a in y.layout.partial if a not in target.partial]
        if reduce:
            y = shardsim.all_reduce(y, tuple(reduce))
        for d in y.layout.dims:
            if d.axes:
                y = shardsim.all_gather(y, d.axes)
    return t.total("sent_bytes")


# -- property: random meshes, random layout pairs --------------------------------------------------
@seed(20240611)
@budget(120)
@given(data=st.data())
def test_reshard_random_layout_pairs_bitwise(data: st.DataObject) -> None:
    mesh = data.draw(meshes(), "mesh")
    rank = data.draw(st.integers(1, 3), "rank")
    src = data.draw(layouts(mesh, rank), "src")
    dst = data.draw(layouts(mesh, rank), "dst")
    shape = fitting_shape(data.draw, mesh, src, dst)
    dtype = data.draw(st.sampled_from(["float32", "float64", "float16", "int16", "bool"]), "dtype")
    full = random_values(np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))), shape, dtype)
    x = shardsim.shard(full, mesh, src).named("v")
    plan = plan_reshard(x, dst)
    with shardsim.trace() as t:
        y = reshard(x, str(dst))
    assert y.layout == dst
    assert same_bits(y.to_global(), full)
    assert_blocks(y, full)
    # the trace is the plan, step for step, with the plan's bytes
    assert [(e.op, e.axes) for e in t.events] == [(s.op, s.axes) for s in plan]
    assert [e.sent_bytes for e in t.events] == [s.sent_bytes for s in plan]
    # never worse than gathering everything and slicing
    assert t.total("sent_bytes") <= naive_bytes(x, dst)


@seed(7)
@budget(60)
@given(data=st.data())
def test_reshard_partial_sources(data: st.DataObject) -> None:
    """A partial ``{U_P}`` input: the result's blocks are those of the NumPy sum over the reduced axes."""
    mesh = data.draw(meshes(), "mesh")
    rank = data.draw(st.integers(1, 3), "rank")
    src = data.draw(layouts(mesh, rank, partial=mesh.axis_names), "src")
    dst = data.draw(layouts(mesh, rank, partial=src.partial), "dst")
    shape = fitting_shape(data.draw, mesh, src, dst)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    p_sizes = tuple(mesh.axis_size(a) for a in src.partial)
    pieces = rng.integers(-50, 50, p_sizes + shape).astype(np.float64)  # one global array per partial index

    def piece(c: dict[str, int], axes: tuple[str, ...]) -> np.ndarray:
        """Sum of the pieces over the partial axes not in ``axes``, at chip ``c``'s index along ``axes``."""
        out = pieces
        for k, a in reversed(list(enumerate(src.partial))):
            out = np.take(out, c[a], axis=k) if a in axes else out.sum(axis=k)
        return out

    blocks = np.empty(mesh.shape + tuple(n // parts(mesh, d.axes) for n, d in zip(shape, src.dims)))
    for c in chips(mesh):
        blocks[tuple(c.values())] = piece(c, src.partial)[chip_slices(mesh, src, shape, c)]
    x = shardsim.from_local(blocks, mesh, src)
    y = reshard(x, dst)
    assert y.layout == dst
    for c in chips(mesh):
        want = piece(c, dst.partial)[chip_slices(mesh, dst, shape, c)]
        np.testing.assert_array_equal(y.local(**c), want, err_msg=f"chip {c}")


# -- the chosen steps, by hand ---------------------------------------------------------------------
def run(mesh: shardsim.Mesh, shape: tuple[int, ...], src: str, dst: str) -> tuple[shardsim.Trace, np.ndarray, object]:
    full = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    x = shardsim.shard(full, mesh, src).named("x")
    with shardsim.trace() as t:
        y = reshard(x, dst)
    assert same_bits(y.to_global(), full)
    return t, full, y


def test_batch_to_feature_split_is_one_all_to_all() -> None:
    t, _, y = run(shardsim.Mesh(X=4), (8, 8), "[B_X, D]", "[B, D_X]")
    assert [(e.op, e.axes) for e in t.events] == [("all_to_all", ("X",))]
    assert t.events[0].sent_bytes == 3 * 64 // 4  # (N-1)/N of the 2x8 float32 block
    assert str(y.layout) == "[B, D_X]"


def test_replicated_to_split_is_a_local_slice_with_zero_bytes() -> None:
    t, full, y = run(shardsim.Mesh(X=4), (8, 8), "[B, D]", "[B_X, D]")
    assert [(e.op, e.axes, e.sent_bytes, e.received_bytes) for e in t.events] == [("slice", ("X",), 0, 0)]
    assert t.collectives() == []
    np.testing.assert_array_equal(y.local(X=2), full[4:6])


def test_two_axis_split_moves_in_one_all_to_all() -> None:
    t, _, _ = run(shardsim.Mesh(X=2, Y=2), (8, 8), "[D_XY, F]", "[D, F_XY]")
    assert t.collectives() == [("all_to_all", ("X", "Y"))]
    assert t.events[0].sent_bytes == 3 * 64 // 4  # 2x8 float32 block, N = 4


def test_slice_comes_before_the_gather() -> None:
    """[B_X, D] -> [B, D_Y]: slicing D first makes the AllGather move a quarter as much."""
    t, _, _ = run(shardsim.Mesh(X=2, Y=4), (8, 8), "[B_X, D]", "[B, D_Y]")
    assert [(e.op, e.axes, e.sent_bytes) for e in t.events] == [("slice", ("Y",), 0), ("all_gather", ("X",), 32)]


def test_moving_an_axis_to_another_dimension_of_the_same_name_order() -> None:
    """[A_X, B] -> [A_Y, B] on X=2, Y=4: AllToAll X away, slice Y, gather X from the smaller block."""
    t, _, _ = run(shardsim.Mesh(X=2, Y=4), (8, 8), "[A_X, B]", "[A_Y, B]")
    assert [(e.op, e.axes) for e in t.events] == [("all_to_all", ("X",)), ("slice", ("Y",)), ("all_gather", ("X",))]
    assert t.total("sent_bytes") == 64 + 32  # against 128 for AllGather X then slice Y


def test_partial_to_split_is_one_reduce_scatter() -> None:
    mesh = shardsim.Mesh(X=4)
    blocks = np.arange(4 * 8 * 4, dtype=np.float64).reshape(4, 8, 4)
    x = shardsim.from_local(blocks, mesh, "[A, B]{U_X}")
    with shardsim.trace() as t:
        y = reshard(x, "[A_X, B]")
    assert t.collectives() == [("reduce_scatter", ("X",))]
    np.testing.assert_array_equal(y.to_global(), blocks.sum(axis=0))


def test_partial_to_replicated_is_one_all_reduce() -> None:
    mesh = shardsim.Mesh(X=2, Y=2)
    blocks = np.arange(2 * 2 * 2 * 2, dtype=np.float64).reshape(2, 2, 2, 2)
    x = shardsim.from_local(blocks, mesh, "[A, B]{U_XY}")
    with shardsim.trace() as t:
        y = reshard(x, "[A, B]")
    assert t.collectives() == [("all_reduce", ("X", "Y"))]
    np.testing.assert_array_equal(y.to_global(), blocks.sum(axis=(0, 1)))


def test_kept_partial_axis_stays_partial() -> None:
    mesh = shardsim.Mesh(X=2, Y=2)
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 9, (2, 2, 4, 2)).astype(np.float64)  # [A_X, B]{U_Y}: varies along both
    x = shardsim.from_local(blocks, mesh, "[A_X, B]{U_Y}")
    y = reshard(x, "[A, B_X]{U_Y}")
    assert str(y.layout) == "[A, B_X]{U_Y}"
    for c in chips(mesh):
        # partial over Y kept: chip (x, y) holds piece y's [A, B_X] block
        piece = np.concatenate([blocks[0, c["Y"]], blocks[1, c["Y"]]], axis=0)
        np.testing.assert_array_equal(y.local(**c), piece[:, c["X"] : c["X"] + 1])


def test_partial_axes_in_another_order_is_the_same_value() -> None:
    blocks = np.arange(8.0).reshape(2, 2, 2)
    x = shardsim.from_local(blocks, shardsim.Mesh(X=2, Y=2), "[A]{U_XY}")
    y = reshard(x, "[A]{U_YX}")
    assert str(y.layout) == "[A]{U_YX}"
    np.testing.assert_array_equal(shardsim.all_reduce(y, ("Y", "X")).to_global(), blocks.sum(axis=(0, 1)))


def test_lazy_matmul_partial_reshards_like_numpy() -> None:
    mesh = shardsim.Mesh(X=4)
    rng = np.random.default_rng(1)
    a, w = rng.standard_normal((4, 8)), rng.standard_normal((8, 4))
    out = shardsim.shard(a, mesh, "B D_X") @ shardsim.shard(w, mesh, "D_X F")
    with shardsim.trace() as t:
        y = reshard(out, "[B, F_X]")
    assert t.collectives() == [("reduce_scatter", ("X",))]
    np.testing.assert_allclose(y.to_global(), a @ w, rtol=1e-12, atol=1e-12)


def test_no_op_returns_the_value_itself() -> None:
    x = shardsim.shard(np.ones((4, 4)), shardsim.Mesh(X=2), "B_X D")
    with shardsim.trace() as t:
        assert reshard(x, "[B_X, D]") is x
    assert len(t) == 0


def test_label_and_category_of_the_result() -> None:
    x = shardsim.shard(np.ones((4, 4)), shardsim.Mesh(X=2), "B_X D", category="params").named("W")
    y = reshard(x, "B D_X", label="W2")
    assert (y.label, y.category, x.label) == ("W2", "params", "W")


def test_shape_only_values_plan_and_trace_like_data() -> None:
    mesh = shardsim.Mesh(X=2, Y=4)
    real = shardsim.shard(np.zeros((8, 16), np.float32), mesh, "B_X D")
    ghost = shardsim.shard(shardsim.ShapeDtype((8, 16), "float32"), mesh, "B_X D")
    with shardsim.trace() as t1:
        reshard(real, "B_Y D_X")
    with shardsim.trace() as t2:
        g = reshard(ghost, "B_Y D_X")
    assert g.is_shape_only and str(g.layout) == "[B_Y, D_X]"
    assert [(e.op, e.axes, e.sent_bytes) for e in t1] == [(e.op, e.axes, e.sent_bytes) for e in t2]


def test_intermediates_are_released() -> None:
    mesh = shardsim.Mesh(X=2, Y=4)
    x = shardsim.shard(np.zeros((8, 16), np.float32), mesh, "B_X D")
    before = mesh.memory.live().copy()
    y = reshard(x, "B_Y D_X")
    assert len(plan_reshard(x, "B_Y D_X")) > 1
    np.testing.assert_array_equal(mesh.memory.live(), before + y.local_nbytes)


def test_local_slice_refuses_an_axis_in_use() -> None:
    x = shardsim.shard(np.ones((4, 4)), shardsim.Mesh(X=2), "B_X D")
    with pytest.raises(ShardingError, match=r"already varies over \['X'\]"):
        local_slice(x, "X", "D")


@pytest.mark.parametrize(
    ("target", "error", "match"),
    [
        ("[D, B_X]", ShapeError, r"matched by position and keep their names \(\['B', 'D'\] vs \['D', 'B'\]\)"),
        ("[B_X]", ShapeError, "the target has 1 dimensions, the value 2"),
        ("[B_Z, D]", LayoutParseError, "'Z' is not a mesh axis"),
        ("[B_{Z}, D]", MeshAxisError, "uses mesh axis 'Z', which the mesh does not have"),
        ("[B_X, D_X]", MeshAxisError, "uses mesh axis 'X' twice"),
        ("[B, D]{U_X}", PartialSumError, r"no resharding step creates a partial sum over \['X'\]"),
        ("[B_X, D", LayoutParseError, "missing closing"),
        ("[B_Y, D]", shardsim.DivisibilityError, "dimension B of size 2"),
    ],
)
def test_reshard_errors(target: str, error: type, match: str) -> None:
    x = shardsim.shard(np.ones((2, 6)), shardsim.Mesh(X=2, Y=3), "B_X D")
    with pytest.raises(error, match=match):
        reshard(x, target)


def test_reshard_needs_a_sharded_array() -> None:
    with pytest.raises(ShardingError, match="reshard needs a ShardedArray, got ndarray"):
        reshard(np.ones(2), "[A]")  # type: ignore[arg-type]


# -- onto another mesh ----------------------------------------------------------------------------
def test_onto_another_mesh_is_a_host_transfer() -> None:
    full = np.arange(64.0).reshape(8, 8)
    x = shardsim.shard(full, shardsim.Mesh(X=8), "D_X F").named("W_in")
    other = shardsim.Mesh(X=2, Y=2)
    with shardsim.trace() as t:
        y = reshard(x, "[D_X, F_Y]", mesh=other)
    assert y.mesh is other and str(y.layout) == "[D_X, F_Y]" and y.label == "W_in"
    assert t.collectives() == [] and [e.op for e in t.events] == ["host_transfer"]
    assert t.events[0].received_bytes == y.local_nbytes
    assert_blocks(y, full)


def test_partial_value_onto_another_mesh_is_summed_on_the_host() -> None:
    blocks = np.arange(24.0).reshape(2, 3, 4)
    x = shardsim.from_local(blocks, shardsim.Mesh(X=2), "[A, B]{U_X}")
    y = reshard(x, "[A, B_Y]", mesh=shardsim.Mesh(Y=2))
    np.testing.assert_array_equal(y.to_global(), blocks[0] + blocks[1])
    np.testing.assert_array_equal(host_global(x), blocks[0] + blocks[1])


def test_onto_another_mesh_refuses_a_partial_target() -> None:
    x = shardsim.shard(np.ones((2, 2)), shardsim.Mesh(X=2), "A B")
    with pytest.raises(PartialSumError, match="never a partial sum"):
        reshard(x, "[A, B]{U_Y}", mesh=shardsim.Mesh(Y=2))


def test_host_transfer_reads_a_replica_when_a_chip_has_failed() -> None:
    mesh = shardsim.Mesh(X=2, Y=2)
    full = np.arange(16.0).reshape(4, 4)
    x = shardsim.shard(full, mesh, "D_X F")  # replicated over Y: (X1,Y1) still holds X1's block
    mesh.fail(X=1, Y=0)
    y = reshard(x, "[D, F]", mesh=shardsim.Mesh(Z=1))
    np.testing.assert_array_equal(y.to_global(), full)


def test_host_transfer_of_a_lost_block_names_it() -> None:
    mesh = shardsim.Mesh(X=2, Y=2)
    x = shardsim.shard(np.zeros((4, 4)), mesh, "D_X F").named("W")
    mesh.fail(X=1)
    with pytest.raises(ChipFailureError) as e:
        reshard(x, "[D, F]", mesh=shardsim.Mesh(Z=1))
    assert str(e.value) == (
        "host transfer of W[D_X, F] (4, 4): the block on chip (X1,Y*) is held only by failed chips "
        "((X1,Y0), (X1,Y1)); restore it from a checkpoint instead (shardsim.checkpoint.load)"
    )


def test_collective_in_a_reshard_on_a_failed_mesh_raises() -> None:
    mesh = shardsim.Mesh(X=2)
    x = shardsim.shard(np.zeros((4, 4)), mesh, "B_X D").named("act")
    mesh.fail(X=0)
    with pytest.raises(ChipFailureError, match=r"all_to_all over axis 'X' of act\[B_X, D\] \(4, 4\) cannot run"):
        reshard(x, "B D_X")
