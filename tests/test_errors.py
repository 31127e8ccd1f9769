"""Every error: its type, and the words that name the culprit and, where there is one, the fix."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import shardsim as ss
from shardsim import errors

MESH = ss.Mesh(X=2, Y=2)


def _x(layout: str = "B_X D", shape: tuple[int, ...] = (4, 8)) -> ss.ShardedArray:
    return ss.shard(np.arange(float(np.prod(shape))).reshape(shape), MESH, layout)


def _partial(layout: str = "[B, D]{U_Y}") -> ss.ShardedArray:
    return ss.from_local(np.zeros((2, 2, 4, 8)), MESH, layout)


def _shape_only(layout: str = "B_X D") -> ss.ShardedArray:
    return ss.shard(ss.ShapeDtype((4, 8)), MESH, layout)


def _oom() -> None:
    mesh = ss.Mesh(X=2)
    mesh.memory.capacity = 100
    first = ss.shard(np.zeros(8), mesh, "D", label="first")  # 64 bytes per chip
    second = ss.shard(np.zeros(8), mesh, "D_X", label="second")  # 32 more: 96, fits
    try:
        ss.shard(np.zeros(2), mesh, "D", label="third")  # 16 more: 112 > 100
    finally:
        del first, second


CASES: dict[str, tuple[Callable[[], object], type[Exception], list[str]]] = {
    # dimension that does not divide: the dim, its size, the axes and their sizes, what would divide
    "indivisible": (
        lambda: ss.shard(np.zeros((6, 8)), MESH, "B_XY D"),
        errors.DivisibilityError,
        ["dimension B of size 6", "mesh axes ['X', 'Y']", "X=2 x Y=2 = 4 chips", "multiple of 4", "[B_XY, D]"],
    ),
    "indivisible_after_reduce_scatter": (
        lambda: ss.reduce_scatter(ss.from_local(np.zeros((2, 2, 3, 1)), MESH, "[B, D]{U_X}"), "X", "B"),
        errors.DivisibilityError,
        ["dimension B of size 3", "mesh axes ['X']"],
    ),
    "unknown_axis_in_layout": (
        lambda: ss.shard(np.zeros((4, 8)), MESH, "B_Z D"),
        errors.LayoutParseError,
        ["'Z' is not a mesh axis", "this mesh has axes ['X', 'Y']", "^"],
    ),
    "unknown_axis_in_brace_layout": (
        lambda: ss.shard(np.zeros((4, 8)), MESH, "B_{data} D"),
        errors.MeshAxisError,
        ["mesh axis 'data', which the mesh does not have", "['X', 'Y']"],
    ),
    "unknown_axis_in_collective": (
        lambda: ss.all_gather(_x(), "Q"),
        errors.MeshAxisError,
        ["unknown mesh axis 'Q'", "['X', 'Y']"],
    ),
    "repeated_axis_two_dims": (
        lambda: ss.shard(np.zeros((4, 8)), MESH, "B_X D_X"),
        errors.MeshAxisError,
        ["mesh axis 'X' twice (B_X and D_X)"],
    ),
    "repeated_axis_split_and_partial": (
        lambda: ss.from_local(np.zeros((2, 2, 2, 8)), MESH, "[B_X, D]{U_X}"),
        errors.MeshAxisError,
        ["mesh axis 'X' twice (B_X and {U})"],
    ),
    "repeated_axis_in_subscript": (
        lambda: ss.shard(np.zeros((4, 8)), MESH, "B_XX D"),
        errors.LayoutParseError,
        ["mesh axis repeated in subscript 'XX'"],
    ),
    "repeated_axis_in_collective": (
        lambda: ss.all_gather(_x(), ("X", "X")),
        errors.MeshAxisError,
        ["mesh axis repeated in ('X', 'X')"],
    ),
    "unparsable_layout": (
        lambda: ss.shard(np.zeros((4, 8)), MESH, "[B_X, 3D]"),
        errors.LayoutParseError,
        ["cannot parse layout '[B_X, 3D]'", "dimension name '3D'", "[B_X, 3D]\n          ^"],
    ),
    "rank_mismatch": (
        lambda: ss.shard(np.zeros((4, 8, 2)), MESH, "B_X D"),
        errors.ShapeError,
        ["layout [B_X, D] has 2 dimensions", "shape (4, 8, 2) (3 dimensions)"],
    ),
    "from_local_block_shape": (
        lambda: ss.from_local(np.zeros((2, 4, 8)), MESH, "B D"),
        errors.ShapeError,
        ["mesh.shape + local_shape = (2, 2)", "got (2, 4, 8)"],
    ),
    "all_gather_replicated_axis": (
        lambda: ss.all_gather(_x(), "Y"),
        errors.CollectiveError,
        ["all_gather over axis 'Y'", "array[B_X, D] (4, 8) is not split over ['Y']", "replicated over ['Y']"],
    ),
    "all_gather_partial_axis": (
        lambda: ss.all_gather(_partial(), "Y"),
        errors.CollectiveError,
        ["is not split over ['Y']", "partial sum over ['Y']: use all_reduce or reduce_scatter"],
    ),
    "all_gather_major_axis": (
        lambda: ss.all_gather(_x("B_XY D"), "X"),
        errors.CollectiveError,
        ["B_XY", "only its minor end", "Use ('Y',)"],
    ),
    "all_gather_two_dims": (
        lambda: ss.all_gather(_x("B_X D_Y"), ("X", "Y")),
        errors.CollectiveError,
        ["those axes split different dimensions; do one at a time"],
    ),
    "reduce_scatter_not_partial": (
        lambda: ss.reduce_scatter(_x(), "X", "D"),
        errors.CollectiveError,
        ["reduce_scatter over axis 'X'", "not a partial sum over ['X']", "use all_gather"],
    ),
    "all_reduce_not_partial": (
        lambda: ss.all_reduce(_x(), "Y"),
        errors.CollectiveError,
        ["all_reduce over axis 'Y'", "not a partial sum over ['Y']", "nothing to sum"],
    ),
    "all_to_all_not_split": (
        lambda: ss.all_to_all(_x(), "Y", "B", "D"),
        errors.CollectiveError,
        ["all_to_all over axis 'Y'", "not split over ['Y']"],
    ),
    "all_to_all_wrong_src": (
        lambda: ss.all_to_all(_x("B_X D"), "X", "D", "B"),
        errors.CollectiveError,
        ["'X' splits B_X, not src_dim D", "pass src_dim='B'"],
    ),
    "all_to_all_same_dims": (
        lambda: ss.all_to_all(_x(), "X", "B", "B"),
        errors.CollectiveError,
        ["src_dim and dst_dim are both B_X"],
    ),
    "ppermute_over_a_replicated_axis_too": (
        lambda: ss.ppermute(_x(), ("X", "Y"), 1),
        errors.CollectiveError,
        ["ppermute of array[B_X, D]", "differ along ['Y']", "replicated"],
    ),
    "different_meshes_matmul": (
        lambda: _x() @ ss.shard(np.zeros((8, 2)), ss.Mesh(X=2, Y=2), "D F"),
        errors.MeshMismatchError,
        ["array[B_X, D] (4, 8) lives on Mesh(X=2, Y=2)", "array[D, F] (8, 2) on another mesh", "one Mesh object"],
    ),
    "different_meshes_add": (
        lambda: _x() + ss.shard(np.zeros((4, 8)), ss.Mesh(X=2, Y=2), "B_X D"),
        errors.MeshMismatchError,
        ["on another mesh"],
    ),
    "to_global_of_partial": (
        lambda: _partial().to_global(),
        errors.PartialSumError,
        ["unreduced partial sum over ['Y']", "all_reduce(x, 'Y')", "reduce_scatter(x, 'Y', dim)"],
    ),
    "nonlinear_op_on_partial": (
        lambda: ss.activation(_partial(), "gelu"),
        errors.PartialSumError,
        ["gelu of array[B, D]{U_Y} (4, 8)", "reduce over ['Y'] first"],
    ),
    "shard_a_partial_layout": (
        lambda: ss.shard(np.zeros((4, 8)), MESH, "[B, D]{U_X}"),
        errors.PartialSumError,
        ["never a partial sum", "shardsim.from_local"],
    ),
    "local_out_of_range": (
        lambda: _x().local(X=2, Y=0),
        errors.ShardingError,
        ["X=2 is out of range: axis 'X' has size 2"],
    ),
    "local_missing_axis": (
        lambda: _x().local(X=0),
        errors.ShardingError,
        ["one coordinate per mesh axis ['X', 'Y']", "missing ['Y']", "local(X=0, Y=0)"],
    ),
    "local_unknown_axis": (
        lambda: _x().local(X=0, Y=0, Z=0),
        errors.ShardingError,
        ["unknown ['Z']"],
    ),
    "shape_only_data": (
        lambda: _shape_only().to_global(),
        errors.ShapeOnlyError,
        ["array[B_X, D] (4, 8) is shape-only", "no data to read"],
    ),
    "shape_only_mixed": (
        lambda: _shape_only("B D") @ ss.shard(np.zeros((8, 2)), MESH, "D F"),
        errors.ShapeOnlyError,
        ["cannot mix shape-only values and values with data", "(shape-only)", "(data)"],
    ),
    "from_local_not_replicated": (
        lambda: ss.from_local(np.arange(4.0).reshape(2, 2, 1, 1), MESH, "B_X D"),
        errors.ShardingError,
        ["replicated over 'Y', but the blocks differ along 'Y'", "{U_Y}"],
    ),
    "shard_twice": (
        lambda: ss.shard(_x(), MESH, "B D"),
        errors.ShardingError,
        ["array[B_X, D] (4, 8) is already sharded"],
    ),
    "shard_strings": (
        lambda: ss.shard(np.array(["a", "b"]), ss.Mesh(X=2), "D_X"),
        errors.ShardingError,
        ["cannot shard an array of dtype <U1"],
    ),
    "unknown_activation": (
        lambda: ss.activation(_x(), "tanh"),
        errors.ShardingError,
        ["unknown activation 'tanh'", "['identity', 'relu', 'gelu']"],
    ),
    "unknown_dtype": (
        lambda: ss.cast(_x(), "float7"),
        errors.ShardingError,
        ["unknown dtype 'float7'"],
    ),
    "elementwise_split_differently": (
        lambda: _x("B_X D") + _x("B D_X"),
        errors.ShardingError,
        ["dimension B_X and B are split differently", "reshard one side"],
    ),
    "dtype": (
        lambda: (lambda m: m - m)(ss.shard(np.array([True, False]), ss.Mesh(X=2), "D_X", label="mask")),
        errors.DtypeError,
        ["mask[D_X] (2,) - mask[D_X] (2,)", "NumPy refuses this"],
    ),
    "out_of_memory": (
        _oom,
        errors.OutOfMemoryError,
        ["out of memory on chip (X0)", "third[D]", "16 B", "96 B", "capacity 100 B"],
    ),
    "failed_chip": (
        lambda: (MESH.fail(X=0, Y=1), ss.all_gather(_x(), "X")),
        errors.ChipFailureError,
        ["all_gather over axis 'X'", "forward phase", "(X0,Y1)", "failed", "checkpoint"],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_error_names_the_culprit(name: str) -> None:
    call, kind, words = CASES[name]
    try:
        with pytest.raises(kind) as info:
            call()
    finally:
        MESH.heal()
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def test_out_of_memory_lists_the_largest_live_values() -> None:
    with pytest.raises(errors.OutOfMemoryError) as info:
        _oom()
    lines = str(info.value).splitlines()
    at = lines.index("Largest live values on that chip:")
    assert "first[D]" in lines[at + 1] and "64 B" in lines[at + 1]  # largest first
    assert "second[D_X]" in lines[at + 2]


def test_hierarchy() -> None:
    value_errors = [
        errors.ShardingError,
        errors.LayoutParseError,
        errors.MeshAxisError,
        errors.DivisibilityError,
        errors.ShapeError,
        errors.MatmulShardingError,
        errors.CollectiveError,
        errors.PartialSumError,
        errors.MeshMismatchError,
        errors.DtypeError,
    ]
    for e in value_errors:
        assert issubclass(e, errors.ShardingError) and issubclass(e, ValueError)
    assert issubclass(errors.ShapeOnlyError, TypeError) and issubclass(errors.DtypeError, TypeError)
    assert issubclass(errors.OutOfMemoryError, MemoryError)
    assert issubclass(errors.ChipFailureError, RuntimeError)
    assert issubclass(errors.CheckpointError, OSError)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.ShardsimError)
        assert getattr(ss, name) is getattr(errors, name)  # exported at the top level
