"""Pictures: which block lives on which chip, as text for 1-D/2-D/3-D meshes and as HTML."""

from __future__ import annotations

import re

import numpy as np
import pytest

import shardsim
from shardsim import Mesh


def _text(x: shardsim.ShardedArray, capsys: pytest.CaptureFixture[str]) -> list[str]:
    shardsim.show(x)
    return capsys.readouterr().out.rstrip("\n").splitlines()


def test_one_axis_lists_every_chip(capsys: pytest.CaptureFixture[str]) -> None:
    x = shardsim.shard(np.zeros((8, 3)), Mesh(X=4), "B_X D", label="In")
    assert _text(x, capsys) == [
        "In[B_X, D] (8, 3) float64 on Mesh(X=4)",
        "(X0): B[0:2] D[0:3]",
        "(X1): B[2:4] D[0:3]",
        "(X2): B[4:6] D[0:3]",
        "(X3): B[6:8] D[0:3]",
    ]


def test_two_axes_draw_a_grid(capsys: pytest.CaptureFixture[str]) -> None:
    x = shardsim.shard(np.zeros((4, 6), np.float32), Mesh(X=2, Y=3), "B_X D_Y")
    lines = _text(x, capsys)
    assert lines[0] == "array[B_X, D_Y] (4, 6) float32 on Mesh(X=2, Y=3)"
    assert lines[1].split() == ["Y0", "Y1", "Y2"]
    assert lines[2].split() == ["X0", "B[0:2]", "D[0:2]", "B[0:2]", "D[2:4]", "B[0:2]", "D[4:6]"]
    assert lines[3].startswith("X1") and "B[2:4] D[4:6]" in lines[3]
    # columns line up under their headers
    assert lines[2].index("B[0:2] D[2:4]") == lines[1].index("Y1")


def test_three_axes_and_a_multi_axis_split(capsys: pytest.CaptureFixture[str]) -> None:
    x = shardsim.shard(np.zeros(8), Mesh(X=2, Y=2, Z=2), "D_ZX")
    lines = _text(x, capsys)
    assert len(lines) == 1 + 8
    # D_ZX: block z*2 + x, of size 2; Y does not split D, so Y0 and Y1 hold the same block
    assert "(X1,Y0,Z0): D[2:4]" in lines
    assert "(X0,Y1,Z1): D[4:6]" in lines
    assert "(X1,Y1,Z1): D[6:8]" in lines
    assert "(X1,Y0,Z1): D[6:8]" in lines


def test_partial_sums_name_their_chip(capsys: pytest.CaptureFixture[str]) -> None:
    p = shardsim.from_local(np.zeros((2, 2, 1, 4)), Mesh(X=2, Y=2), "[B, D_Y]{U_X}")
    lines = _text(p, capsys)
    assert lines[3].split() == ["X1", "B[0:1]", "D[0:4]", "{partial", "X1}", "B[0:1]", "D[4:8]", "{partial", "X1}"]


def test_show_prints_traces_meshes_and_ledgers(capsys: pytest.CaptureFixture[str]) -> None:
    mesh = Mesh(X=2)
    w = shardsim.shard(np.zeros((4, 4)), mesh, "D_X F", label="W")
    with shardsim.trace() as t:
        shardsim.all_gather(w, "X")
    for thing, words in ((t, "all_gather"), (mesh, "Mesh(X=2)"), (mesh.memory, "total peak")):
        shardsim.show(thing)
        assert words in capsys.readouterr().out


def _cells(html: str) -> list[str]:
    return re.findall(r"<td[^>]*>(.*?)</td>", html)


def test_html_of_an_array() -> None:
    x = shardsim.shard(np.zeros((4, 6)), Mesh(X=2, Y=3), "B_X D_Y", label="A<b>")
    html = x._repr_html_()
    assert html.startswith("<div>") and "<table>" in html
    assert "A&lt;b&gt;[B_X, D_Y]" in html  # labels are escaped
    cells = _cells(html)
    assert len(cells) == 6 and html.count("<tr>") == 2  # one cell per chip, rows along X
    assert cells[5] == "<b>(X1,Y2)</b><br>B[2:4] D[4:6]"


def test_html_of_mesh_trace_and_ledger() -> None:
    mesh = Mesh(X=2, Y=2)
    assert len(_cells(mesh._repr_html_())) == 4 and "Mesh(X=2, Y=2)" in mesh._repr_html_()
    w = shardsim.shard(np.zeros((4, 4)), mesh, "D_X F", label="W")
    with shardsim.trace() as t:
        shardsim.all_gather(w, "X")
    for obj, words in ((t, "all_gather"), (mesh.memory, "(X1,Y1)")):
        html = obj._repr_html_()
        assert html.startswith("<table>") and html.endswith("</table>") and words in html
        assert "-&gt;" in html or obj is mesh.memory  # the layout arrow, escaped
