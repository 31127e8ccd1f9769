"""Layout text round-trips: ``Layout.parse(str(layout), mesh.axis_names) == layout`` on every mesh.

The printed form is the run-together ``D_XY`` only where it reads back the same; axes named by
more than one letter (``data``, ``αβ``, the axis ``XY`` beside ``X`` and ``Y``) print in braces,
``D_{XY}``, and a rank-0 value prints ``[]``. Resharding to a layout's own text moves nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardsim
from fuzz_budget import budget
from shardsim.layout import Dim, Layout
from strategies_core import layouts

# Axis names whose letters spell other axes, multi-letter and non-ASCII names, and both kinds mixed.
NAME_POOLS = [
    ("X", "Y", "XY"),
    ("X", "XY", "Y", "Z"),
    ("data", "model", "αβ"),
    ("a", "ab", "b", "ba"),
    ("X", "data", "Y"),
    ("α", "β", "αβ"),
]
DIM_NAMES = ("B", "D", "F", "Δ", "S2", "heads")


@st.composite
def meshes(draw: st.DrawFn) -> shardsim.Mesh:
    pool = draw(st.sampled_from(NAME_POOLS))
    names = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=len(pool), unique=True))
    return shardsim.Mesh({n: draw(st.integers(1, 2)) for n in names})


@st.composite
def mesh_layouts(draw: st.DrawFn) -> tuple[shardsim.Mesh, Layout]:
    mesh = draw(meshes())
    rank = draw(st.integers(0, 3))
    names = draw(st.permutations(DIM_NAMES))
    return mesh, draw(layouts(mesh, rank, partial=True, names=names))


@budget(150)
@given(mesh_layouts())
def test_every_layout_parses_back_from_its_text(case: tuple[shardsim.Mesh, Layout]) -> None:
    mesh, layout = case
    text = str(layout)
    assert Layout.parse(text, mesh.axis_names) == layout, text
    assert Layout.parse(repr(layout)[len("Layout('") : -2], mesh.axis_names) == layout


@budget(60)
@given(mesh_layouts())
def test_reshard_to_its_own_text_moves_nothing(case: tuple[shardsim.Mesh, Layout]) -> None:
    mesh, layout = case
    local = (2,) * layout.rank
    rng = np.random.default_rng(0)
    used = set(layout.used_axes())
    compact = tuple(s if a in used else 1 for a, s in zip(mesh.axis_names, mesh.shape))
    blocks = np.broadcast_to(rng.standard_normal(compact + local), mesh.shape + local)
    x = shardsim.from_local(blocks, mesh, layout)
    with shardsim.trace() as t:
        y = shardsim.reshard(x, str(x.layout))
    assert y is x and len(t) == 0
    np.testing.assert_array_equal(y.blocks(), blocks)


@pytest.mark.parametrize(
    ("layout", "text"),
    [
        (Layout(()), "[]"),
        (Layout((), ("X",)), "[]{U_X}"),
        (Layout((Dim("D", ("X", "Y")),)), "[D_XY]"),
        (Layout((Dim("D", ("XY",)),)), "[D_{XY}]"),
        (Layout((Dim("D", ("XY", "X")), Dim("F", ("Y",)))), "[D_{XY,X}, F_Y]"),
        (Layout((Dim("B", ("αβ",)),), ("data",)), "[B_{αβ}]{U_{data}}"),
    ],
)
def test_ambiguous_subscripts_print_in_braces(layout: Layout, text: str) -> None:
    assert str(layout) == text
    assert Layout.parse(text, ("X", "Y", "XY", "αβ", "data")) == layout


def test_x_then_y_is_not_the_axis_xy() -> None:
    # On a mesh with axes X, Y and XY, "D_XY" is D split over X then Y; the axis XY is "D_{XY}".
    mesh = shardsim.Mesh(X=2, Y=2, XY=2)
    a = np.arange(16.0).reshape(8, 2)
    x = shardsim.shard(a, mesh, Layout((Dim("D", ("XY",)), Dim("F"))))
    assert str(x.layout) == "[D_{XY}, F]"
    with shardsim.trace() as t:
        y = shardsim.reshard(x, str(x.layout))
    assert y is x and t.collectives() == []
    z = shardsim.shard(a, mesh, "D_XY F")
    assert z.layout.dims[0].axes == ("X", "Y")
    np.testing.assert_array_equal(z.local(X=0, Y=1, XY=0), a[2:4])  # block 1 of 4 over X-major (X, Y)


def test_rank_zero_values_shard_and_read_back() -> None:
    mesh = shardsim.Mesh(X=2)
    x = shardsim.shard(np.float32(3.5), mesh, "[]")
    assert x.layout == Layout(()) and x.shape == () and float(np.asarray(x)) == 3.5
    p = shardsim.from_local(np.array([1.0, 2.0]), mesh, "[]{U_X}")
    assert float(np.asarray(shardsim.all_reduce(p, "X"))) == 3.0
