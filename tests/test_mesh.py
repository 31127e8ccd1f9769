"""Mesh: named axes, chip coordinates, the groups a collective talks in, failure marks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given

import shardsim
from shardsim import ChipFailureError, Mesh, MeshAxisError
from strategies_core import meshes


def test_basic_properties() -> None:
    mesh = Mesh(X=2, Y=4)
    assert mesh.axis_names == ("X", "Y")
    assert mesh.shape == (2, 4)
    assert mesh.size == 8
    assert mesh.axis_size("Y") == 4
    assert mesh.axis_size(("X", "Y")) == 8
    assert mesh.axis_index("Y") == 1
    assert repr(mesh) == "Mesh(X=2, Y=4)"


def test_mapping_and_keywords_keep_order() -> None:
    mesh = Mesh({"data": 4, "model": 2}, pipe=3)
    assert mesh.axis_names == ("data", "model", "pipe")
    assert mesh.shape == (4, 2, 3)


@given(meshes())
def test_coords_are_row_major(mesh: Mesh) -> None:
    chips = list(itertools.product(*map(range, mesh.shape)))  # row-major reference
    assert [tuple(c.values()) for c in mesh.chips()] == chips
    for flat, c in enumerate(chips):
        assert mesh.coords(flat) == dict(zip(mesh.axis_names, c))


@given(meshes(min_axes=2))
def test_groups_partition_the_chips_along_an_axis(mesh: Mesh) -> None:
    axis = mesh.axis_names[-1]
    others = [a for a in mesh.axis_names if a != axis]
    groups = mesh.groups(axis)
    assert len(groups) == mesh.size // mesh.axis_size(axis)
    seen = []
    for g in groups:
        assert len(g) == mesh.axis_size(axis)
        assert [c[axis] for c in g] == list(range(mesh.axis_size(axis)))  # ring order
        assert len({tuple(c[a] for a in others) for c in g}) == 1  # the other coordinates fixed
        seen += [tuple(c.values()) for c in g]
    assert sorted(seen) == sorted(tuple(c.values()) for c in mesh.chips())


def test_groups_over_two_axes_first_major() -> None:
    mesh = Mesh(X=2, Y=2, Z=2)
    group = mesh.groups(("Y", "X"))[1]  # Z = 1 fixed, Y major
    assert [(c["Y"], c["X"]) for c in group] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {c["Z"] for c in group} == {1}


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({}, "a mesh has 1 to 4 axes, got 0"),
        ({"A": 1, "B": 1, "C": 1, "D": 1, "E": 1}, "a mesh has 1 to 4 axes, got 5"),
        ({"X": 0}, "mesh axis 'X' needs a positive integer size, got 0"),
        ({"X": 2.0}, "mesh axis 'X' needs a positive integer size, got 2.0"),
        ({"X": True}, "mesh axis 'X' needs a positive integer size, got True"),
        ({"X_1": 2}, "mesh axis name 'X_1' must be letters and digits without '_'"),
    ],
)
def test_bad_meshes(kwargs: dict, words: str) -> None:
    with pytest.raises(MeshAxisError) as info:
        Mesh(**kwargs)
    assert words in str(info.value)


def test_axis_given_twice_and_bad_names() -> None:
    with pytest.raises(MeshAxisError, match="mesh axis 'X' given twice"):
        Mesh({"X": 2}, X=2)
    with pytest.raises(MeshAxisError, match="mesh axis name '1X'"):
        Mesh({"1X": 2})


def test_unknown_axis_names_the_axes_it_has() -> None:
    mesh = Mesh(X=2, Y=2)
    for call in (lambda: mesh.axis_size("Z"), lambda: mesh.axis_index("Z"), lambda: mesh.groups("Z")):
        with pytest.raises(MeshAxisError, match=r"unknown mesh axis 'Z'; this mesh has axes \['X', 'Y'\]"):
            call()


def test_axes_argument_checks() -> None:
    mesh = Mesh(X=2, Y=2)
    with pytest.raises(MeshAxisError, match=r"mesh axis repeated in \('X', 'X'\)"):
        mesh.axis_size(("X", "X"))
    with pytest.raises(MeshAxisError, match="no mesh axis given"):
        mesh.axis_size(())
    with pytest.raises(MeshAxisError, match="chip index 4 out of range"):
        mesh.coords(4)


def test_chip_name() -> None:
    assert Mesh(X=2, Y=4).chip_name({"X": 1, "Y": 3}) == "(X1,Y3)"


def test_each_mesh_has_its_own_ledger() -> None:
    a, b = Mesh(X=2), Mesh(X=2)
    x = shardsim.shard(np.ones(4), a, "D")
    assert a.memory is a.memory
    assert a.memory.live().tolist() == [32, 32]
    assert b.memory.live().tolist() == [0, 0]
    del x


def test_failed_chip_stops_collectives_until_healed() -> None:
    mesh = Mesh(X=2, Y=2)
    x = shardsim.shard(np.arange(4.0), mesh, "D_X")
    mesh.fail(X=1, Y=0)
    assert mesh.failed == {(1, 0)}
    with pytest.raises(ChipFailureError, match=r"all_gather over axis 'X' of array\[D_X\].*\(X1,Y0\).*failed"):
        shardsim.all_gather(x, "X")
    mesh.heal()
    np.testing.assert_array_equal(shardsim.all_gather(x, "X").to_global(), np.arange(4.0))


def test_fail_a_whole_row_and_check_coordinates() -> None:
    mesh = Mesh(X=2, Y=3)
    mesh.fail(X=1)
    assert mesh.failed == {(1, 0), (1, 1), (1, 2)}
    with pytest.raises(MeshAxisError, match="X=2 is out of range: axis 'X' has size 2"):
        mesh.fail(X=2)
    with pytest.raises(MeshAxisError, match="unknown mesh axis 'Q'"):
        mesh.fail(Q=0)
