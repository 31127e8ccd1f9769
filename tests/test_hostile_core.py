"""The core refuses bad input at the door and keeps values right: regression tests, and a
hypothesis fuzz of the public functions with hostile arguments (``tests/hostile_inputs.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardsim
from fuzz_budget import budget
from hostile_inputs import CASES, HOSTILE, run_case
from shardsim import Mesh


# -- the fuzz: every outcome is NumPy's answer or a documented error ---------------------------
@budget(400)
@given(st.sampled_from(sorted(CASES)), st.data())
def test_hostile_arguments_give_numpys_answer_or_a_documented_error(name: str, data: st.DataObject) -> None:
    n = CASES[name][0]
    args = [data.draw(st.sampled_from(HOSTILE), label=f"arg{i}") for i in range(n)]
    assert run_case(name, args) in ("ok", "documented"), (name, args)


def test_the_outcome_classifier_can_see_a_wrong_value() -> None:
    # the fuzz's own check: a value NumPy disagrees with is "wrong", not "ok"
    assert run_case("ppermute(axis, shift)", ["X", 1]) == "ok"
    assert run_case("ppermute(axis, shift)", ["Y", 1]) == "ok"
    assert run_case("ppermute(axis, shift)", [("Y", "X"), 1]) == "ok"
    assert run_case("x + s", [2]) == "ok"
    check = CASES["x + s"][2]
    assert not check(shardsim.shard(np.zeros((2, 4)), Mesh(X=2), "B D"), [2])


# -- arguments at the door ----------------------------------------------------------------------
@pytest.mark.parametrize("axis", [None, 5, 1.5, ["X", 5], b"X"])
def test_axis_arguments_are_names(axis: object) -> None:
    x = shardsim.shard(np.ones(4), Mesh(X=2), "[B_X]")
    for op in (lambda: shardsim.all_gather(x, axis), lambda: shardsim.ppermute(x, axis, 1)):
        with pytest.raises(shardsim.ArgumentTypeError, match="axis="):
            op()


@pytest.mark.parametrize("shift", [float("nan"), 1.5, "1", True, None.__class__])
def test_ppermute_shift_must_be_an_integer_even_on_replicated_values(shift: object) -> None:
    x = shardsim.shard(np.ones(4), Mesh(X=2), "[B]")
    with pytest.raises(shardsim.ArgumentTypeError, match="shift"):
        shardsim.ppermute(x, "X", shift)  # type: ignore[arg-type]
    assert np.array_equal(np.asarray(shardsim.ppermute(x, "X", np.int64(3))), np.ones(4))


@pytest.mark.parametrize(
    "call",
    [
        lambda: shardsim.all_gather(np.ones(4), "X"),
        lambda: shardsim.all_reduce([1.0], "X"),
        lambda: shardsim.reshard("x", "[B]"),
        lambda: shardsim.cast(3.0, "float32"),
        lambda: shardsim.shard(np.ones(4), {"X": 2}, "[B_X]"),
        lambda: shardsim.from_local(np.ones((2, 2)), "mesh", "[B]"),
        lambda: shardsim.matmul(np.ones((2, 2)), np.ones((2, 2))),
        lambda: shardsim.Mesh([("X", 2)]),
    ],
)
def test_wrong_kinds_of_argument_are_both_shardsim_and_type_errors(call: object) -> None:
    with pytest.raises(shardsim.ArgumentTypeError) as info:
        call()  # type: ignore[operator]
    assert isinstance(info.value, TypeError) and isinstance(info.value, shardsim.ShardsimError)
    assert "must be" in str(info.value) or "is a" in str(info.value) or "needs" in str(info.value)


def test_chip_indices_and_axis_name_lists_are_checked() -> None:
    with pytest.raises(shardsim.ArgumentTypeError, match="integer index"):
        Mesh(X=2).coords("1")  # type: ignore[arg-type]
    assert Mesh(X=2, Y=2).coords(np.int64(3)) == {"X": 1, "Y": 1}
    for names in (5, "XY", [1]):
        with pytest.raises(shardsim.LayoutParseError, match="axis_names is a mesh's axis names"):
            shardsim.Layout.parse("B_X", names)  # type: ignore[arg-type]


def test_negative_shapes_and_sizes_are_refused() -> None:
    with pytest.raises(shardsim.ShapeError, match="zero or more"):
        shardsim.ShapeDtype((-1, 3))
    with pytest.raises(shardsim.ArgumentTypeError):
        shardsim.ShapeDtype((2.5, 3))
    for size in (0, -2):
        with pytest.raises(shardsim.MeshAxisError, match="positive integer"):
            Mesh(X=size)


def test_meshes_too_large_to_index_are_refused() -> None:
    with pytest.raises(shardsim.MeshAxisError, match="more than the"):
        Mesh(X=2**20, Y=2**20)
    assert Mesh(X=4096, Y=4096).size == 2**24  # the limit itself is a mesh


def test_the_ledger_cannot_wrap() -> None:
    mesh = Mesh(X=2)
    with pytest.raises(shardsim.ShapeError, match="more than"):
        shardsim.shard(shardsim.ShapeDtype((2**40, 2**30)), mesh, "D F")  # one value past 2**62 bytes
    quarter = shardsim.ShapeDtype((2**30, 2**28), "float64")  # 2**61 bytes per chip
    held = [shardsim.shard(quarter, mesh, "D F") for _ in range(3)]
    with pytest.raises(shardsim.OutOfMemoryError, match="the most the ledger counts"):
        shardsim.shard(quarter, mesh, "D F")  # 4 * 2**61 = 2**63 would wrap an int64 to -2**63
    assert int(mesh.memory.live().max()) == 3 * 2**61 and len(held) == 3


@pytest.mark.parametrize("name", ["capacity", "size", "shape", "groups", "memory", "slow", "failed"])
def test_axis_names_that_collide_with_mesh_attributes_are_refused(name: str) -> None:
    with pytest.raises(shardsim.MeshAxisError, match=f"collides with .*{name}"):
        Mesh(X=2, **{name: 100})


def test_capacity_points_at_the_ledger() -> None:
    with pytest.raises(shardsim.MeshAxisError, match=r"mesh\.memory\.capacity"):
        Mesh(X=2, capacity=100)


# -- zero-size dimensions ---------------------------------------------------------------------
def test_zero_size_broadcasting_keeps_the_zero() -> None:
    mesh = Mesh(X=2)
    a, b = np.ones((0, 3)), np.arange(3.0)
    y = shardsim.shard(a, mesh, "B D") + shardsim.shard(b, mesh, "[D]")
    assert y.shape == (a + b).shape == (0, 3)
    assert np.asarray(y).shape == (0, 3)


def test_zero_size_batched_matmul_is_exact() -> None:
    mesh = Mesh(X=2)
    for a_shape, b_shape in [((2, 0, 4), (2, 4, 3)), ((2, 3, 0), (2, 0, 5)), ((0, 2, 3), (0, 3, 4))]:
        a, b = np.arange(np.prod(a_shape), dtype=float).reshape(a_shape), np.ones(b_shape)
        y = shardsim.shard(a, mesh, "L M K") @ shardsim.shard(b, mesh, "L K N")
        np.testing.assert_array_equal(np.asarray(y), a @ b)
        assert y.shape == (a @ b).shape


# -- partial sums keep their value ---------------------------------------------------------------
def int8_partial() -> shardsim.ShardedArray:
    return shardsim.from_local(np.full((2, 1), 100, np.int8), Mesh(X=2), "[B]{U_X}")


def test_an_int8_partial_sum_wraps_in_int8() -> None:
    assert np.asarray(shardsim.all_reduce(int8_partial(), "X")).tolist() == [-56]  # 100 + 100 as int8


@pytest.mark.parametrize(
    "widen",
    [
        lambda p: p * 1.5,
        lambda p: p / 2,
        lambda p: shardsim.cast(p, "int16"),
        lambda p: p.sum(0),
        lambda p: p * shardsim.shard(np.array([2], np.int16), p.mesh, "[B]"),
    ],
)
def test_widening_an_integer_partial_sum_is_refused(widen: object) -> None:
    with pytest.raises(shardsim.DtypeError, match="wrap-around"):
        widen(int8_partial())  # type: ignore[operator]


def test_a_float_partial_sum_widens_and_is_reduced_in_the_wider_dtype() -> None:
    p = shardsim.from_local(np.array([[[1.0, 2.0]], [[3.0, 4.0]]], np.float16), Mesh(X=2), "[A, B]{U_X}")
    w = shardsim.cast(p, "float32")
    got = shardsim.all_reduce(w, "X")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(got), np.array([[4.0, 6.0]], np.float32))


@pytest.mark.parametrize(
    "scale", [lambda p: p * np.inf, lambda p: p * np.nan, lambda p: p / 0, lambda p: p / 0.0, lambda p: -np.inf * p]
)
def test_a_partial_scaled_by_inf_or_divided_by_zero_is_refused(scale: object) -> None:
    # blocks 0 and 3: (0 + 3) * inf is inf, but 0 * inf + 3 * inf is nan
    p = shardsim.from_local(np.array([[0.0], [3.0]]), Mesh(X=2), "[B]{U_X}")
    with pytest.raises(shardsim.PartialSumError, match="reduce the partial sum first"):
        scale(p)  # type: ignore[operator]


def test_a_partial_scaled_by_a_replicated_value_with_inf_is_refused() -> None:
    mesh = Mesh(X=2)
    p = shardsim.from_local(np.array([[0.0], [3.0]]), mesh, "[B]{U_X}")
    with pytest.raises(shardsim.PartialSumError):
        p * shardsim.shard(np.array([np.inf]), mesh, "[B]")
    ok = p * shardsim.shard(np.array([2.0]), mesh, "[B]")
    assert np.asarray(shardsim.all_reduce(ok, "X")).tolist() == [6.0]


def test_a_factor_split_over_the_partial_axis_is_refused() -> None:
    # [B]{U_X} times [C_X, B] would be [C_X, B]{U_X}: X spent twice, no chip's block means anything
    mesh = Mesh(X=2)
    p = shardsim.from_local(np.ones((2, 4)), mesh, "[B]{U_X}")
    with pytest.raises(shardsim.MeshAxisError, match="twice"):
        p * shardsim.shard(np.ones((2, 4)), mesh, "[C_X, B]")


# -- operators and dtypes ------------------------------------------------------------------------
def test_division_and_remainder_from_either_side() -> None:
    a = np.array([1.0, -2.0, 0.0, 4.0])
    x = shardsim.shard(a, Mesh(X=2), "[B_X]")
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(np.asarray(2 / x), 2 / a)
    np.testing.assert_array_equal(np.asarray(x % 2), a % 2)


def test_bfloat16_with_ints_follows_one_rule() -> None:
    mesh = Mesh(X=2)
    b = shardsim.shard(np.ones((2, 2), "float32"), mesh, "B D").astype("bfloat16")
    i = shardsim.shard(np.ones((2, 2), np.int32), mesh, "D F")
    try:  # the rule is NumPy's promotion, which ml_dtypes extends (its releases differ on bfloat16 with ints)
        common = np.result_type(b.dtype, i.dtype)
    except TypeError:
        with pytest.raises(shardsim.DtypeError, match="no common dtype"):
            b @ i
    else:
        assert (b @ i).dtype == common
    assert (b * 2).dtype == b.dtype  # a Python int is weak, as in NumPy 2
    assert (b @ i.astype("bfloat16")).dtype == b.dtype


# -- a slow chip in the cost model -------------------------------------------------------------
def test_a_1000x_slower_chip_makes_every_step_1000x_slower() -> None:
    from shardsim.cost import estimate

    mesh = Mesh(X=4, Y=2)
    sizes = dict(batch=4096, d_model=1024, d_ff=4096, layers=2)
    for scheme in ("ddp", "fsdp", "tp"):
        fast = estimate(scheme, mesh, "h100", **sizes)
        mesh.slow(1000.0, X=1, Y=0)
        slow = estimate(scheme, mesh, "h100", **sizes)
        mesh.heal()
        # SPMD: every matmul and every collective waits for the slow chip's group
        assert slow.compute_s == pytest.approx(1000 * fast.compute_s, rel=1e-12)
        assert slow.comm_s == pytest.approx(1000 * fast.comm_s, rel=1e-12)
        assert slow.step_s == pytest.approx(1000 * fast.step_s, rel=1e-12)


def test_a_slow_pipeline_stage_slows_only_its_own_steps() -> None:
    from shardsim.cost import timeline_of

    mesh = Mesh(Z=2)
    w = [shardsim.shard(shardsim.ShapeDtype((1024, 1024), "bfloat16"), mesh, "D F") for _ in range(2)]
    x = shardsim.shard(shardsim.ShapeDtype((4096, 1024), "bfloat16"), mesh, "B D")
    holders = np.array([True, False])
    x0 = shardsim.ShardedArray(mesh, x.layout, x.shape, x.dtype, holders=holders)
    with shardsim.trace() as t:
        x0 @ w[0]
        x @ w[1]
    fast = timeline_of(t, "h100", mesh)
    mesh.slow(1000.0, Z=1)
    slow = timeline_of(t, "h100", mesh)
    by_where = {b.where: b.seconds for b in slow.bars}
    base = {b.where: b.seconds for b in fast.bars}
    assert by_where["Z0"] == pytest.approx(base["Z0"])  # stage 0 does not wait for chip Z1
    assert by_where[""] == pytest.approx(1000 * base[""])  # a step on every chip does


# -- capacities ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-1, 1.5, "100", float("nan"), True])
def test_a_ledger_capacity_is_a_whole_number_of_bytes(bad: object) -> None:
    mesh = Mesh(X=2)
    with pytest.raises(shardsim.ShardingError, match="whole number of bytes"):
        mesh.memory.capacity = bad  # type: ignore[assignment]
    assert mesh.memory.capacity is None
    mesh.memory.capacity = 64
    with pytest.raises(shardsim.OutOfMemoryError):
        shardsim.shard(np.ones(16), mesh, "[B]")  # 128 bytes per chip


@pytest.mark.parametrize(
    "options",
    [
        {"capacity": -1, "groups": 2},
        {"capacity": 0, "groups": 2},
        {"capacity": 1.5, "groups": 2},
        {"capacity": "2", "groups": 2},
        {"capacity_factor": float("nan"), "groups": 2},
        {"capacity_factor": float("inf"), "groups": 2},
        {"capacity_factor": -1.0, "groups": 2},
        {"top_k": 1.5},
        {"groups": 2.0},
    ],
)
def test_expert_capacity_options_are_checked(options: dict) -> None:
    from shardsim import moe, strategies

    params = moe.init(4, 8, experts=4)
    x = np.ones((8, 4), np.float32)
    name = next(iter(options))
    with pytest.raises(shardsim.ShardingError, match=f"option {name}="):
        shardsim.run_strategy("ep", Mesh(Y=2), params, x, x, **options)
    r = shardsim.run_strategy("ep", Mesh(Y=2), params, x, x, capacity=1, groups=2)  # the least that runs
    want_out, _ = strategies.get("ep").reference(params, x, x, "identity", capacity=1, groups=2)
    np.testing.assert_allclose(r.out, want_out, rtol=1e-5, atol=1e-6)
