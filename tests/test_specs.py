"""Layouts as JAX PartitionSpecs and DTensor placements, checked against each library's own rule.

The references below place every chip's block by each library's documented semantics, written
out independently of shardsim: JAX numbers a dimension split over ``("X", "Y")`` with ``X``
major (the spec's order); DTensor applies ``Shard(d)`` mesh dimension after mesh dimension, each
cutting the piece the previous ones left. shardsim's blocks for the converted layout must be
those blocks.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardsim as ss
from shardsim import specs
from shardsim.layout import Layout
from shardsim.specs import P, Partial, PartitionSpec, Replicate, Shard
from shardsim.testing import layouts, meshes
from strategies_core import all_chips, deep


@st.composite
def mesh_layouts(draw, partial: bool = True):
    mesh = draw(meshes())
    return mesh, draw(layouts(mesh, draw(st.integers(1, 3)), partial=partial))


def in_mesh_order(layout: Layout, mesh: ss.Mesh) -> Layout:
    """The layout with its partial-sum axes in mesh order (a partial sum's order means nothing)."""
    return layout.with_partial(a for a in mesh.axis_names if a in layout.partial)


def split_in_mesh_order(layout: Layout, mesh: ss.Mesh) -> bool:
    return all([mesh.axis_index(a) for a in d.axes] == sorted(mesh.axis_index(a) for a in d.axes) for d in layout.dims)


# -- round trips -----------------------------------------------------------------------------------
@deep
@given(mesh_layouts())
def test_partition_spec_round_trip(case) -> None:
    mesh, layout = case
    spec = layout.to_partition_spec()
    entries = tuple(getattr(spec, "partitions", spec))  # JAX's own spec is read by .partitions
    assert len(entries) == layout.rank
    assert spec.unreduced == frozenset(layout.partial)
    for entry, d in zip(entries, layout.dims):
        assert entry == (None if not d.axes else d.axes[0] if len(d.axes) == 1 else d.axes)
    assert Layout.from_partition_spec(spec, mesh, names=layout.names) == in_mesh_order(layout, mesh)


@deep
@given(mesh_layouts())
def test_placements_round_trip_and_what_is_refused(case) -> None:
    """Every layout round-trips, except a dimension split against the mesh order: that is refused."""
    mesh, layout = case
    if not split_in_mesh_order(layout, mesh):
        with pytest.raises(ss.ShardingError, match="mesh order"):
            layout.to_placements(mesh)
        return
    placements = layout.to_placements(mesh)
    assert len(placements) == len(mesh.axis_names)
    for axis, p in zip(mesh.axis_names, placements):
        i = layout.axis_dim(axis)
        assert p == (Shard(i) if i is not None else Partial() if axis in layout.partial else Replicate())
    back = Layout.from_placements(placements, mesh, layout.rank, names=layout.names)
    assert back == in_mesh_order(layout, mesh)


# -- each library's block rule, written out -------------------------------------------------------------
def jax_block(spec, mesh: ss.Mesh, array: np.ndarray, coords: dict[str, int]) -> np.ndarray:
    """The block a device holds under a JAX PartitionSpec: per dim, the spec's axes in tuple order, first major."""
    index = []
    for n, entry in zip(array.shape, tuple(spec) + (None,) * (array.ndim - len(spec))):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
        k, parts = 0, 1
        for a in axes:
            k, parts = k * mesh.axis_size(a) + coords[a], parts * mesh.axis_size(a)
        size = n // parts
        index.append(slice(k * size, (k + 1) * size))
    return array[tuple(index)]


def dtensor_block(placements, mesh: ss.Mesh, array: np.ndarray, coords: dict[str, int]) -> np.ndarray:
    """DTensor's rule: for each mesh dim in order, Shard(d) cuts dim d of what is left into equal chunks."""
    block = array
    for axis, p in zip(mesh.axis_names, placements):
        if isinstance(p, Shard):
            block = np.split(block, mesh.axis_size(axis), axis=p.dim)[coords[axis]]
    return block


@st.composite
def global_cases(draw, order: str):
    mesh = draw(meshes())
    layout = draw(layouts(mesh, draw(st.integers(1, 3))))
    if order == "mesh" and not split_in_mesh_order(layout, mesh):
        layout = Layout.parse(
            "["
            + ", ".join(
                f"{d.name}_{{{','.join(sorted(d.axes, key=mesh.axis_index))}}}" if d.axes else d.name
                for d in layout.dims
            )
            + "]"
        )
    shape = tuple(draw(st.integers(1, 3)) * mesh.axis_size(d.axes) if d.axes else draw(st.integers(1, 3))
                  for d in layout.dims)  # fmt: skip
    return mesh, layout, np.arange(float(np.prod(shape))).reshape(shape)


@deep
@given(global_cases("any"))
def test_a_partition_spec_puts_jaxs_blocks_on_each_chip(case) -> None:
    mesh, layout, array = case
    spec = layout.to_partition_spec()
    x = ss.shard(array, mesh, Layout.from_partition_spec(spec, mesh, names=layout.names))
    for c in all_chips(mesh):
        np.testing.assert_array_equal(x.local(**c), jax_block(spec, mesh, array, c), err_msg=f"{spec} chip {c}")


@deep
@given(global_cases("mesh"))
def test_placements_put_dtensors_blocks_on_each_chip(case) -> None:
    mesh, layout, array = case
    placements = layout.to_placements(mesh)
    x = ss.shard(array, mesh, Layout.from_placements(placements, mesh, layout.rank, names=layout.names))
    for c in all_chips(mesh):
        np.testing.assert_array_equal(x.local(**c), dtensor_block(placements, mesh, array, c), err_msg=f"chip {c}")


def test_the_refused_order_really_puts_other_blocks_on_the_chips() -> None:
    """Why [D_YX] has no placements: (Shard(0), Shard(0)) means X major, which is another split."""
    mesh = ss.Mesh(X=2, Y=3)
    array = np.arange(6.0)
    yx = ss.shard(array, mesh, "D_YX")
    assert yx.local(X=1, Y=0)[0] == 1.0  # Y major: block y*2 + x
    assert dtensor_block((Shard(0), Shard(0)), mesh, array, {"X": 1, "Y": 0})[0] == 3.0  # X major: x*3 + y
    with pytest.raises(ss.ShardingError, match=r"D_XY.*mesh whose axes come in the order \['Y', 'X'\]"):
        Layout.parse("D_YX").to_placements(mesh)
    assert Layout.parse("D_YX").to_placements(ss.Mesh(Y=3, X=2)) == (Shard(0), Shard(0))


# -- the module's table, and the spellings ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("layout", "spec", "placements"),
    [
        ("[B_X, D_Y]", P("X", "Y"), (Shard(0), Shard(1))),
        ("[B, D_XY]", P(None, ("X", "Y")), (Shard(1), Shard(1))),
        ("[B_X, D]{U_Y}", P("X", None, unreduced={"Y"}), (Shard(0), Partial())),
        ("[B, D]", P(None, None), (Replicate(), Replicate())),
    ],
)
def test_the_table(layout: str, spec: PartitionSpec, placements: tuple) -> None:
    mesh = ss.Mesh(X=2, Y=4)
    lay = Layout.parse(layout)
    assert lay.to_partition_spec() == spec
    assert lay.to_placements(mesh) == placements
    assert Layout.from_partition_spec(spec, mesh, names="BD") == lay
    assert Layout.from_placements(placements, mesh, 2, names="BD") == lay


def test_a_shorter_spec_leaves_the_last_dimensions_unsplit_and_names_default() -> None:
    mesh = ss.Mesh(X=2)
    assert str(Layout.from_partition_spec(("X",), mesh, ndim=3)) == "[d0_X, d1, d2]"
    assert str(Layout.from_partition_spec([["X"], None], mesh)) == "[d0_X, d1]"  # lists too
    assert str(Layout.from_placements([Shard(-1)], mesh, 2)) == "[d0, d1_X]"


def test_partition_spec_spelling() -> None:
    assert repr(P("X", None, ("Y", "Z"), unreduced={"W"})) == "PartitionSpec('X', None, ('Y', 'Z'), unreduced={'W'})"
    assert P("X") == ("X",) and P("X", unreduced={"Y"}) != ("X",)
    assert P("X", unreduced={"Y"}) == P("X", unreduced=["Y"]) and len({P("X"), P("X")}) == 1


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda m: Layout.from_partition_spec(P("Q"), m), ss.MeshAxisError, "'Q'"),
        (lambda m: Layout.from_partition_spec(P("X", "X"), m), ss.MeshAxisError, "twice"),
        (lambda m: Layout.from_partition_spec(P(None, unreduced={"Q"}), m), ss.MeshAxisError, "'Q'"),
        (lambda m: Layout.from_partition_spec(P(3), m), ss.LayoutParseError, "entry 3"),
        (lambda m: Layout.from_partition_spec("X", m), ss.LayoutParseError, "one entry per dimension"),
        (lambda m: Layout.from_partition_spec(P("X", None), m, ndim=1), ss.ShapeError, "2 entries"),
        (lambda m: Layout.from_partition_spec(P("X"), m, names=["B_X"]), ss.LayoutParseError, "'B_X'"),
        (lambda m: Layout.from_partition_spec(P("X"), m, names="BD"), ss.ShapeError, "2 dimension names"),
        (lambda m: Layout.from_placements([Shard(0)], m, 2), ss.MeshAxisError, "one placement per mesh axis"),
        (lambda m: Layout.from_placements([Shard(2), Replicate()], m, 2), ss.ShapeError, "Shard(dim=2)"),
        (lambda m: Layout.from_placements([Partial("max"), Replicate()], m, 2), ss.PartialSumError, "'max'"),
        (lambda m: Layout.from_placements(["Shard(0)", Replicate()], m, 2), ss.LayoutParseError, "none of"),
        (lambda m: Layout.parse("B_XY").to_placements(ss.Mesh(X=2)), ss.MeshAxisError, "'Y'"),
    ],
)
def test_bad_specs_and_placements_name_the_culprit(call, error, words) -> None:
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        call(ss.Mesh(X=2, Y=2))


# -- DTensor's and JAX's own objects ------------------------------------------------------------------
def test_dtensors_own_placement_classes_are_read_by_name() -> None:
    """torch is no dependency: placements are read by class name, ``dim`` and ``reduce_op``."""
    Shard_ = type("Shard", (), {"__init__": lambda self, dim: setattr(self, "dim", dim)})
    Replicate_ = type("Replicate", (), {})
    Partial_ = type("Partial", (), {"reduce_op": "sum"})
    mesh = ss.Mesh(X=2, Y=2, Z=2)
    assert str(Layout.from_placements([Shard_(1), Partial_(), Replicate_()], mesh, 2, names="BD")) == "[B, D_X]{U_Y}"
    strided = type("_StridedShard", (), {"dim": 0})
    with pytest.raises(ss.LayoutParseError, match="_StridedShard"):
        Layout.from_placements([strided(), Replicate_(), Replicate_()], mesh, 2)


class _FakeJaxSpec:
    """Stands for today's jax.sharding.PartitionSpec: no tuple, but iterable, with ``unreduced``."""

    def __init__(self, *partitions, unreduced=None):
        if unreduced is not None and not isinstance(unreduced, (set, frozenset)):
            raise TypeError("unreduced must be None, a set or a frozenset")  # as JAX checks it
        self._partitions, self.unreduced = partitions, frozenset(unreduced or ())

    def __iter__(self):
        return iter(self._partitions)

    def __len__(self):
        return len(self._partitions)


class _OldJaxSpec(tuple):
    """A JAX PartitionSpec from before unreduced axes."""

    def __new__(cls, *entries):
        return super().__new__(cls, entries)


@pytest.mark.parametrize("spec_class", [_FakeJaxSpec, _OldJaxSpec])
def test_with_jax_importable_the_spec_is_jaxs(monkeypatch, spec_class) -> None:
    jax = types.ModuleType("jax")
    jax.__spec__ = types.SimpleNamespace(name="jax")  # found by importlib.util.find_spec
    sharding = types.ModuleType("jax.sharding")
    sharding.PartitionSpec = spec_class
    jax.sharding = sharding
    monkeypatch.setitem(sys.modules, "jax", jax)
    monkeypatch.setitem(sys.modules, "jax.sharding", sharding)
    spec = Layout.parse("[B_X, D_YZ]").to_partition_spec()
    assert type(spec) is spec_class and tuple(spec) == ("X", ("Y", "Z"))
    partial = Layout.parse("[B_X, D]{U_Y}")
    if spec_class is _OldJaxSpec:
        with pytest.raises(ss.PartialSumError, match="no unreduced"):
            partial.to_partition_spec()
    else:
        spec = partial.to_partition_spec()
        assert spec.unreduced == {"Y"}
        assert Layout.from_partition_spec(spec, ss.Mesh(X=2, Y=2), names="BD") == partial


def test_with_real_jax() -> None:
    jax = pytest.importorskip("jax")
    spec = Layout.parse("[B_X, D_YZ]").to_partition_spec()
    assert isinstance(spec, jax.sharding.PartitionSpec) and spec == jax.sharding.PartitionSpec("X", ("Y", "Z"))
    assert Layout.from_partition_spec(spec, ss.Mesh(X=2, Y=2, Z=1), names="BD") == Layout.parse("[B_X, D_YZ]")


def test_specs_is_the_one_place_for_the_mapping() -> None:
    """layout.py delegates: its methods and the module's functions agree on a layout they both see."""
    mesh, lay = ss.Mesh(X=2, Y=2), Layout.parse("[B_YX, D]{U_Z}")
    assert lay.to_partition_spec() == specs.to_partition_spec(lay)
    assert Layout.parse("[B_XY, D]").to_placements(mesh) == specs.to_placements("[B_XY, D]", mesh)


# -- ppermute over a tuple of axes: shardsim numbers the group in the tuple's order -------------------
@pytest.mark.parametrize("axes", [("X", "Y"), ("Y", "X")])
@pytest.mark.parametrize("shift", [1, 2, 5])
def test_ppermute_numbers_a_tuple_of_axes_in_the_tuples_order(axes, shift) -> None:
    """Pinned: chip c's group index is the mixed-radix number of its coordinates in ``axes``' order
    (first major), as docs/coming-from-jax.md says; jax.lax.ppermute would use mesh order for both."""
    mesh = ss.Mesh(X=2, Y=3)
    chips = all_chips(mesh)
    ids = ss.from_local(np.arange(6.0).reshape(2, 3, 1), mesh, "[B_XY]")  # chip (x, y) holds x*3 + y

    def index(c):  # the reference numbering, written out
        return c[axes[0]] * mesh.axis_size(axes[1]) + c[axes[1]]

    by_index = {index(c): c for c in chips}
    moved = ss.ppermute(ids, axes, shift)
    for c in chips:
        src = by_index[(index(c) - shift) % 6]
        assert moved.local(**c)[0] == src["X"] * 3 + src["Y"], f"chip {c}"
    mesh_order = ss.ppermute(ids, ("X", "Y"), shift)  # what lax.ppermute does for either tuple
    differs = any(moved.local(**c)[0] != mesh_order.local(**c)[0] for c in chips)
    assert differs == (axes != ("X", "Y"))


def test_the_coming_from_jax_page_runs(capsys) -> None:
    from doc_blocks import python_blocks, run_blocks

    assert len(python_blocks("coming-from-jax.md")) == 4
    run_blocks("coming-from-jax.md")
    out = capsys.readouterr().out  # show() drew the blocks: row X1, column Y3 holds D[3:4]
    assert out.startswith("W[D_Y, F] (4, 8)") and out.splitlines()[-1].split()[-2:] == ["D[3:4]", "F[0:8]"]
