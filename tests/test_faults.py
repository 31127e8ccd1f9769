"""Faults: failed chips stop collectives with an error naming chip, collective and step; slow chips.

A failed chip fails every collective on its mesh (each chip runs the collective in its own
group, one SPMD step), and the message says which chip, which collective over which axes,
which value, which phase and, when tracing, which trace event it would have been.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import shardsim
from shardsim import ChipFailureError, MeshAxisError, ShardingError, checkpoint

HINT = "Restore from a checkpoint onto a mesh without it (shardsim.checkpoint.load)."


# -- slow chips ------------------------------------------------------------------------------------
def test_slowdown_defaults_to_one_per_chip() -> None:
    mesh = shardsim.Mesh(X=2, Y=3)
    assert mesh.slowdown.shape == (2, 3)
    assert (mesh.slowdown == 1.0).all() and mesh.slowdown.dtype == np.float64


def test_slow_marks_the_selected_chips() -> None:
    mesh = shardsim.Mesh(X=2, Y=3)
    mesh.slow(2.5, Y=1)  # a whole column
    mesh.slow(4, X=0, Y=2)  # one chip
    np.testing.assert_array_equal(mesh.slowdown, [[1.0, 2.5, 4.0], [1.0, 2.5, 1.0]])
    mesh.slow(1.0, X=0)  # full speed again along X=0
    np.testing.assert_array_equal(mesh.slowdown, [[1.0, 1.0, 1.0], [1.0, 2.5, 1.0]])


def test_slowdown_is_a_copy() -> None:
    mesh = shardsim.Mesh(X=2)
    mesh.slowdown[0] = 9.0
    assert (mesh.slowdown == 1.0).all()


def test_heal_clears_failures_and_slowdowns() -> None:
    mesh = shardsim.Mesh(X=2)
    mesh.fail(X=1)
    mesh.slow(3.0, X=0)
    mesh.heal()
    assert mesh.failed == set() and (mesh.slowdown == 1.0).all()


@pytest.mark.parametrize("factor", [0, -1.0, float("nan"), float("inf"), True, "2"])
def test_slow_refuses_a_bad_factor(factor: object) -> None:
    mesh = shardsim.Mesh(X=2)
    with pytest.raises(ShardingError, match=r"a slowdown factor is a positive finite number \(2\.0: half speed\), got"):
        mesh.slow(factor)  # type: ignore[arg-type]
    assert (mesh.slowdown == 1.0).all()


def test_slow_refuses_unknown_or_out_of_range_chips() -> None:
    mesh = shardsim.Mesh(X=2)
    with pytest.raises(MeshAxisError, match="unknown mesh axis 'Y'"):
        mesh.slow(2.0, Y=0)
    with pytest.raises(MeshAxisError, match="X=2 is out of range: axis 'X' has size 2"):
        mesh.slow(2.0, X=2)


def test_a_slow_chip_computes_the_same_values() -> None:
    mesh = shardsim.Mesh(X=4)
    mesh.slow(10.0, X=3)
    full = np.arange(16.0).reshape(4, 4)
    x = shardsim.shard(full, mesh, "A_X B")
    np.testing.assert_array_equal(shardsim.all_gather(x, "X").to_global(), full)


# -- failed chips: the exact error -----------------------------------------------------------------
def two_by_two() -> tuple[shardsim.Mesh, dict[str, shardsim.ShardedArray]]:
    mesh = shardsim.Mesh(X=2, Y=2)
    blocks = np.ones((2, 2, 2, 4))
    values = {
        "split": shardsim.shard(np.ones((4, 4)), mesh, "D_X F").named("W_in"),
        "partial": shardsim.from_local(blocks, mesh, "[B, D]{U_Y}").named("out"),
    }
    return mesh, values


CASES: list[tuple[str, Callable[[dict[str, shardsim.ShardedArray]], object], str]] = [
    ("all_gather", lambda v: shardsim.all_gather(v["split"], "X"), "all_gather over axis 'X' of W_in[D_X, F] (4, 4)"),
    (
        "all_to_all",
        lambda v: shardsim.all_to_all(v["split"], "X", "D", "F"),
        "all_to_all over axis 'X' of W_in[D_X, F] (4, 4)",
    ),
    ("ppermute", lambda v: shardsim.ppermute(v["split"], "X", 1), "ppermute over axis 'X' of W_in[D_X, F] (4, 4)"),
    (
        "all_reduce",
        lambda v: shardsim.all_reduce(v["partial"], "Y"),
        "all_reduce over axis 'Y' of out[B, D]{U_Y} (2, 4)",
    ),
    (
        "reduce_scatter",
        lambda v: shardsim.reduce_scatter(v["partial"], "Y", "D"),
        "reduce_scatter over axis 'Y' of out[B, D]{U_Y} (2, 4)",
    ),
]


@pytest.mark.parametrize(("op", "call", "what"), CASES, ids=[c[0] for c in CASES])
def test_failed_chip_error_names_chip_collective_and_step(
    op: str, call: Callable[[dict[str, shardsim.ShardedArray]], object], what: str
) -> None:
    mesh, values = two_by_two()
    axis = what.split("'")[1]
    group = "(X0,Y0) (X1,Y0)" if axis == "X" else "(X1,Y0) (X1,Y1)"
    with shardsim.trace() as t, shardsim.phase("backward"):
        shardsim.all_gather(shardsim.shard(np.ones(4), mesh, "A_Y"), "Y")  # events 0 and 1 run...
        shardsim.all_gather(shardsim.shard(np.ones(4), mesh, "A_X"), "X")
        mesh.fail(X=1, Y=0)
        live = mesh.memory.live()
        with pytest.raises(ChipFailureError) as e:
            call(values)  # ...and event 2 cannot
    assert str(e.value) == (
        f"{what} cannot run: chip (X1,Y0) has failed (step: backward phase, trace event 2). "
        f"The group of (X1,Y0) over axis '{axis}': {group}. {HINT}"
    )
    assert len(t) == 2  # the failed step records nothing
    np.testing.assert_array_equal(mesh.memory.live(), live)  # and allocates nothing


def test_without_a_trace_the_step_is_the_phase() -> None:
    mesh, values = two_by_two()
    mesh.fail(X=0)
    with pytest.raises(ChipFailureError) as e:
        shardsim.all_gather(values["split"], "X")
    assert str(e.value) == (
        "all_gather over axis 'X' of W_in[D_X, F] (4, 4) cannot run: chips (X0,Y0), (X0,Y1) have failed "
        f"(step: forward phase). The group of (X0,Y0) over axis 'X': (X0,Y0) (X1,Y0). {HINT}"
    )


def test_nested_traces_report_the_innermost_index() -> None:
    mesh = shardsim.Mesh(X=2)
    x = shardsim.shard(np.ones(4), mesh, "A_X").named("x")
    with shardsim.trace() as outer:
        shardsim.all_gather(x, "X")
        with shardsim.trace() as inner:
            mesh.fail(X=1)
            with pytest.raises(ChipFailureError, match=r"\(step: forward phase, trace event 0\)"):
                shardsim.all_gather(x, "X")
    assert (len(outer), len(inner)) == (1, 0)


def test_a_failure_off_the_collective_axis_still_stops_the_step() -> None:
    """SPMD: every chip runs the collective; a failed chip in any group fails the step."""
    mesh = shardsim.Mesh(X=2, Y=2)
    x = shardsim.shard(np.ones((4, 4)), mesh, "A_X B").named("x")
    mesh.fail(X=1, Y=1)
    with pytest.raises(ChipFailureError, match=r"The group of \(X1,Y1\) over axis 'X': \(X0,Y1\) \(X1,Y1\)"):
        shardsim.all_gather(x, "X")


def test_multi_axis_collective_names_its_axes_and_group() -> None:
    mesh = shardsim.Mesh(X=2, Y=2)
    x = shardsim.shard(np.ones(8), mesh, "A_XY").named("x")
    mesh.fail(X=0, Y=1)
    with pytest.raises(ChipFailureError) as e:
        shardsim.all_gather(x, ("X", "Y"))
    assert str(e.value) == (
        "all_gather over axes ('X', 'Y') of x[A_XY] (8,) cannot run: chip (X0,Y1) has failed (step: forward "
        f"phase). The group of (X0,Y1) over axes ('X', 'Y'): (X0,Y0) (X0,Y1) (X1,Y0) (X1,Y1). {HINT}"
    )


def test_heal_lets_collectives_run_again() -> None:
    mesh = shardsim.Mesh(X=2)
    x = shardsim.shard(np.arange(4.0), mesh, "A_X")
    mesh.fail(X=1)
    with pytest.raises(ChipFailureError):
        shardsim.all_gather(x, "X")
    mesh.heal()
    np.testing.assert_array_equal(shardsim.all_gather(x, "X").to_global(), np.arange(4.0))


def test_fail_refuses_unknown_chips() -> None:
    mesh = shardsim.Mesh(X=2)
    with pytest.raises(MeshAxisError, match="X=5 is out of range"):
        mesh.fail(X=5)
    assert mesh.failed == set()


def test_restore_onto_a_smaller_mesh_after_a_failure(tmp_path: Path) -> None:
    """Checkpoint, lose a chip, and carry on from the checkpoint on the three chips left."""
    mesh = shardsim.Mesh(X=4)
    w = np.random.default_rng(5).standard_normal((12, 6))
    checkpoint.save(tmp_path / "c", {"W": shardsim.shard(w, mesh, "D_X F").named("W")})
    mesh.fail(X=2)
    smaller = shardsim.Mesh(X=3)
    restored = checkpoint.load(tmp_path / "c", smaller)["W"]
    assert str(restored.layout) == "[D_X, F]" and restored.local_shape == (4, 6)
    np.testing.assert_array_equal(shardsim.all_gather(restored, "X").to_global(), w)
