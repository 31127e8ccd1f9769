"""Layouts: parsing and printing the scaling book's notation, and the sharded-matmul rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardsim import Layout, LayoutParseError, MatmulShardingError, MeshAxisError, ShapeError
from shardsim.layout import Dim, matmul_layout
from strategies_core import layouts, meshes


@pytest.mark.parametrize(
    ("text", "dims", "partial"),
    [
        ("[B_X, D_Y]", (("B", ("X",)), ("D", ("Y",))), ()),
        ("B_X D_Y", (("B", ("X",)), ("D", ("Y",))), ()),
        ("B_X,D_Y", (("B", ("X",)), ("D", ("Y",))), ()),
        ("[D_XY, F]", (("D", ("X", "Y")), ("F", ())), ()),
        ("[D_YX, F]", (("D", ("Y", "X")), ("F", ())), ()),
        ("[B_X, D]{U_Y}", (("B", ("X",)), ("D", ())), ("Y",)),
        ("[B, D]{U_XY}", (("B", ()), ("D", ())), ("X", "Y")),
        ("[B, D]{U_X, U_Y}", (("B", ()), ("D", ())), ("X", "Y")),
        ("D_{data,model} F", (("D", ("data", "model")), ("F", ())), ()),
        ("[B_{data}, D]{U_{model}}", (("B", ("data",)), ("D", ())), ("model",)),
        ("[L1_X, D2]", (("L1", ("X",)), ("D2", ())), ()),
        ("  [ B_X ,  D ]  ", (("B", ("X",)), ("D", ())), ()),
    ],
)
def test_parse(text: str, dims: tuple, partial: tuple) -> None:
    lay = Layout.parse(text)
    assert [(d.name, d.axes) for d in lay.dims] == list(dims)
    assert lay.partial == partial


def test_parse_with_mesh_axes_splits_multiletter_subscripts() -> None:
    # with the mesh's axis names, "datamodel" is two known axes, longest name first
    lay = Layout.parse("D_datamodel F", ["data", "model"])
    assert lay.dims[0].axes == ("data", "model")
    assert Layout.parse("D_XY F", ["X", "Y"]).dims[0].axes == ("X", "Y")


@pytest.mark.parametrize(
    ("text", "printed"),
    [
        ("B_X D_Y", "[B_X, D_Y]"),
        ("[D_XY, F]", "[D_XY, F]"),
        ("[B, D]{U_X, U_Y}", "[B, D]{U_XY}"),
        ("D_{data,model} F", "[D_{data,model}, F]"),
        ("[B, D]{U_{data}}", "[B, D]{U_{data}}"),
        ("B", "[B]"),
    ],
)
def test_print(text: str, printed: str) -> None:
    assert str(Layout.parse(text)) == printed
    assert repr(Layout.parse(text)) == f"Layout('{printed}')"


@given(st.data())
def test_print_parse_roundtrip(data: st.DataObject) -> None:
    mesh = data.draw(meshes())
    lay = data.draw(layouts(mesh, data.draw(st.integers(1, 4)), partial=True))
    text = str(lay)
    assert Layout.parse(text) == lay
    assert Layout.parse(text, mesh.axis_names) == lay
    assert lay.validate(mesh.axis_names) is lay


def test_accessors() -> None:
    lay = Layout.parse("[B_X, D_YZ, F]{U_W}")
    assert lay.rank == 3
    assert lay.names == ("B", "D", "F")
    assert lay.used_axes() == ("X", "Y", "Z", "W")
    assert lay.dim_index("D") == 1 and lay.dim_index(-1) == 2
    assert lay.dim_axes("D") == ("Y", "Z")
    assert lay.axis_dim("Z") == 1 and lay.axis_dim("W") is None
    assert str(lay.with_dim(2, ("W",)).with_partial(())) == "[B_X, D_YZ, F_W]"
    assert str(lay.transposed([2, 0, 1])) == "[F, B_X, D_YZ]{U_W}"
    assert str(lay.renamed(["A", "C", "E"])) == "[A_X, C_YZ, E]{U_W}"


def test_dim_index_errors() -> None:
    lay = Layout.parse("[B, D]")
    with pytest.raises(ShapeError, match=r"no dimension named 'Q'.*\['B', 'D'\]"):
        lay.dim_index("Q")
    with pytest.raises(ShapeError, match="more than one dimension named 'D'"):
        Layout.parse("[D, D]").dim_index("D")
    with pytest.raises(ShapeError, match="index 2 out of range"):
        lay.dim_index(2)


def _caret_column(message: str) -> int:
    """Column of '^' relative to the echoed layout line above it."""
    lines = message.splitlines()
    caret = next(i for i, line in enumerate(lines) if line.strip() == "^")
    return lines[caret].index("^") - (len(lines[caret - 1]) - len(lines[caret - 1].lstrip()))


@pytest.mark.parametrize(
    ("text", "token", "words"),
    [
        ("[B_X, D-Y]", "D-Y", "dimension name 'D-Y'"),
        ("[B_X, 3D]", "3D", "dimension name '3D'"),
        ("[B_X, D_]", "]", "'D_' needs mesh axes"),
        ("B_XX D", "XX", "mesh axis repeated"),
        ("[B_X, D]{U_Y, V_Z}", "V_Z", "'V_Z': a partial sum is written U_X"),
        ("[B_X, D]{U_}", "U_}", "a partial sum is written U_X"),
    ],
)
def test_parse_error_points_at_token(text: str, token: str, words: str) -> None:
    with pytest.raises(LayoutParseError) as info:
        Layout.parse(text)
    msg = str(info.value)
    assert words in msg
    assert repr(text) in msg  # quotes the layout
    assert _caret_column(msg) == text.index(token)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[B_X, D_Y", "missing closing ']'"),
        ("", "no dimensions"),
        ("[B, D_{data,model]", "missing closing '}'"),
        ("[B, D]{U_Y", "a partial sum is written"),
    ],
)
def test_parse_errors(text: str, words: str) -> None:
    with pytest.raises(LayoutParseError, match="cannot parse layout") as info:
        Layout.parse(text)
    assert words in str(info.value)


def test_parse_rejects_non_strings() -> None:
    with pytest.raises(LayoutParseError, match="a layout is a string"):
        Layout.parse(3)  # type: ignore[arg-type]


def test_unknown_subscript_for_mesh_points_at_it() -> None:
    with pytest.raises(LayoutParseError, match=r"'Z' is not a mesh axis; this mesh has axes \['X', 'Y'\]") as info:
        Layout.parse("[B_XZ, D]", ["X", "Y"])
    assert _caret_column(str(info.value)) == "[B_XZ, D]".index("Z")


def test_validate() -> None:
    with pytest.raises(MeshAxisError, match=r"mesh axis 'Z', which the mesh does not have \(axes \['X', 'Y'\]\)"):
        Layout.parse("[B_Z, D]").validate(["X", "Y"])
    with pytest.raises(MeshAxisError, match=r"uses mesh axis 'X' twice \(B_X and D_X\)"):
        Layout.parse("[B_X, D_X]").validate(["X"])
    with pytest.raises(MeshAxisError, match=r"uses mesh axis 'X' twice \(B_X and \{U\}\)"):
        Layout.parse("[B_X, D]{U_X}").validate(["X"])


# -- the four cases of the sharded matmul (layouts only; values in test_ops.py) --------------------
@pytest.mark.parametrize(
    ("a", "b", "out"),
    [
        ("[B_X, D]", "[D, F_Y]", "[B_X, F_Y]"),  # case 1: no contraction split
        ("[B, D]", "[D, F]", "[B, F]"),
        ("[B, D_X]", "[D_X, F]", "[B, F]{U_X}"),  # case 3: partial over the contraction's axis
        ("[B_Y, D_X]", "[D_X, F]", "[B_Y, F]{U_X}"),
        ("[B, D_XY]", "[D_XY, F]", "[B, F]{U_XY}"),  # K over two axes
        ("[B, D]{U_X}", "[D, F_Y]", "[B, F_Y]{U_X}"),  # a partial scaled by a replicated matrix
        ("[L_X, B, D_Y]", "[L_X, D_Y, F]", "[L_X, B, F]{U_Y}"),  # batch dims
        ("[L_X, B, D]", "[D, F_Y]", "[L_X, B, F_Y]"),
    ],
)
def test_matmul_layout_legal(a: str, b: str, out: str) -> None:
    assert str(matmul_layout(Layout.parse(a), Layout.parse(b))) == out


@pytest.mark.parametrize(
    ("a", "b", "words"),
    [
        ("[B, D_X]", "[D, F]", ["case 2", "left operand only (D_X)", "AllGather it first"]),
        ("[B, D]", "[D_X, F]", ["case 2", "right operand only (D_X)", "AllGather it first"]),
        ("[B_X, D]", "[D, F_X]", ["case 4", "'X' splits both B_X and F_X", "diagonal", "AllGather one of them"]),
        ("[B, D_X]", "[D_Y, F]", ["split differently on the two sides (D_X vs D_Y)", "AllGather one side"]),
        ("[B, D_XY]", "[D_YX, F]", ["split differently", "AllGather"]),
        ("[B, D]{U_X}", "[D, F]{U_X}", ["both operands are partial sums over ['X']", "AllReduce one operand"]),
        ("[B, D]{U_X}", "[D, F_X]", ["'X' would both split F_X and carry a partial sum"]),
        ("[L_X, B, D]", "[D, F_X]", ["case 4", "'X' splits both L_X and F_X"]),
        ("[L_X, B, D]", "[D_X, F]", ["case 2"]),
    ],
)
def test_matmul_layout_illegal(a: str, b: str, words: list[str]) -> None:
    with pytest.raises(MatmulShardingError) as info:
        matmul_layout(Layout.parse(a), Layout.parse(b))
    for w in words:
        assert w in str(info.value)
    assert f"{Layout.parse(a)} @ {Layout.parse(b)}" in str(info.value)  # quotes both layouts


def test_matmul_layout_rank_and_batch() -> None:
    with pytest.raises(ShapeError, match="rank >= 2"):
        matmul_layout(Layout.parse("[D]"), Layout.parse("[D, F]"))
    with pytest.raises(ShapeError, match="batch dimensions must match"):
        matmul_layout(Layout.parse("[L_X, B, D]"), Layout.parse("[L, D, F]"))


def test_dim_str() -> None:
    assert str(Dim("D", ("X", "Y"))) == "D_XY"
    assert str(Dim("D", ("data", "Y"))) == "D_{data,Y}"
    assert str(Dim("D")) == "D"
