"""The trace: one event per collective and matmul, with per-chip bytes and FLOPs in closed form."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given

import shardsim
from shardsim import Mesh
from strategies_core import MatmulCase, legal_matmuls, parts


@given(legal_matmuls(batch=True))
def test_matmul_flops_are_2mkn_per_chip(c: MatmulCase) -> None:
    x = shardsim.shard(c.a, c.mesh, c.la)
    w = shardsim.shard(c.b, c.mesh, c.lb)
    with shardsim.trace() as t:
        out = x @ w
    (ev,) = t.events
    local_a = [n // parts(c.mesh, d.axes) for n, d in zip(c.a.shape, c.la.dims)]
    local_b = [n // parts(c.mesh, d.axes) for n, d in zip(c.b.shape, c.lb.dims)]
    (batch, m, k), n = local_a, local_b[-1]
    assert ev.flops == 2 * batch * m * k * n
    item = c.a.dtype.itemsize
    assert ev.hbm_bytes == item * (batch * m * k + math.prod(local_b) + batch * m * n)  # read A, B; write C
    assert (ev.op, ev.axes, ev.sent_bytes, ev.is_collective) == ("matmul", (), 0, False)
    assert ev.before == (str(c.la), str(c.lb)) and ev.after == str(out.layout)
    assert ev.local_shapes == (tuple(local_a), tuple(local_b))
    assert ev.inputs == (x.uid, w.uid) and ev.output == out.uid


def test_events_carry_labels_phases_and_layouts() -> None:
    mesh = Mesh(X=2, Y=2)
    x = shardsim.shard(np.ones((4, 8), np.float32), mesh, "B_X D_Y", label="In")
    w = shardsim.shard(np.ones((8, 16), np.float32), mesh, "D_X F_Y", label="W_in")
    with shardsim.trace() as t:
        xf = shardsim.all_gather(x, "Y")
        wf = shardsim.all_gather(w, "X")
        h = xf @ wf
        with shardsim.phase("backward"):
            g = shardsim.all_gather(h, "Y", label="H_full")
    assert [e.op for e in t] == ["all_gather", "all_gather", "matmul", "all_gather"]
    assert [e.label for e in t] == ["In", "W_in", "In @ W_in", "H_full"]
    assert [e.phase for e in t] == ["forward"] * 3 + ["backward"]
    assert t.events[0].before == ("[B_X, D_Y]",) and t.events[0].after == "[B_X, D]"
    assert t.events[2].after == "[B_X, F_Y]"
    assert [e.index for e in t] == [0, 1, 2, 3]
    assert {e.dtype for e in t} == {"float32"}
    assert t.events[3].inputs == (h.uid,) and t.events[3].output == g.uid
    assert t.collectives() == [("all_gather", ("Y",)), ("all_gather", ("X",)), ("all_gather", ("Y",))]
    assert t.collectives("backward") == [("all_gather", ("Y",))]
    assert t.steps("forward") == [("all_gather", "Y", "In"), ("all_gather", "X", "W_in"), ("matmul", "", "In @ W_in")]


def test_trace_compares_to_a_list_of_op_axes_pairs() -> None:
    mesh = Mesh(X=2, Y=2)
    w = shardsim.shard(np.ones((4, 4)), mesh, "D_XY F")
    with shardsim.trace() as t:
        shardsim.all_gather(w, ("X", "Y"))
    assert t == [("all_gather", ("X", "Y"))]
    assert t == [["all_gather", ["X", "Y"]]]
    assert t != [("all_gather", "XY")]  # a string is one axis name, not a list of letters
    assert t != [("all_gather", "X")]
    assert t != [("reduce_scatter", ("X", "Y"))]
    assert t != []
    assert len(t) == 1


def test_traces_nest_and_stop_at_the_block_end() -> None:
    mesh = Mesh(X=4)
    w = shardsim.shard(np.ones(8), mesh, "D_X")
    with shardsim.trace() as outer:
        shardsim.all_gather(w, "X")
        with shardsim.trace() as inner:
            shardsim.ppermute(w, "X", 1)
    shardsim.all_gather(w, "X")  # outside any trace: not recorded
    assert outer == [("all_gather", "X"), ("ppermute", "X")]
    assert inner == [("ppermute", "X")]


def test_summary_and_totals_in_closed_form() -> None:
    # N = 4 chips, a 64x32 float32 weight (V = 8 KiB): AG and RS move 3/4 V, AR 2 * 3/4 V
    n, v = 4, 64 * 32 * 4
    mesh = Mesh(X=n)
    w = shardsim.shard(np.ones((64, 32), np.float32), mesh, "D_X F")
    g = shardsim.from_local(np.ones((n, 64, 32), np.float32), mesh, "[D, F]{U_X}")
    with shardsim.trace() as t:
        shardsim.all_gather(w, "X")
        shardsim.reduce_scatter(g, "X", "D")
        shardsim.all_reduce(g, "X")
        shardsim.all_to_all(w, "X", "D", "F")
        shardsim.ppermute(w, "X", 1)
    s = t.summary()
    assert s[("all_gather", ("X",))]["sent_bytes"] == (n - 1) * v // n == 6144
    assert s[("reduce_scatter", ("X",))]["sent_bytes"] == 6144
    assert s[("all_reduce", ("X",))]["received_bytes"] == 2 * 6144
    assert s[("all_to_all", ("X",))]["sent_bytes"] == (n - 1) * (v // n) // n == 1536  # of the local block
    assert s[("ppermute", ("X",))]["sent_bytes"] == v // n
    assert all(row["count"] == 1 for row in s.values())
    assert t.total() == 6144 * 4 + 1536 + 2048
    assert t.total("received_bytes") == t.total()
    assert t.total("flops") == 0
    assert [e.group_size for e in t] == [n] * 5
    # the book's V for each: the gathered / partial block, the array over the group, the moved block
    assert [e.array_bytes for e in t] == [v, v, v, v, v // n]


def test_two_axis_collective_uses_the_product_of_sizes() -> None:
    mesh = Mesh(X=2, Y=4)
    w = shardsim.shard(np.ones((16, 8), np.float64), mesh, "D_XY F")
    with shardsim.trace() as t:
        shardsim.all_gather(w, ("X", "Y"))
    (ev,) = t.events
    assert ev.group_size == 8
    assert ev.sent_bytes == 7 * 16 * 8 * 8 // 8


def test_ppermute_by_zero_moves_nothing() -> None:
    w = shardsim.shard(np.ones(8), Mesh(X=4), "D_X")
    with shardsim.trace() as t:
        shardsim.ppermute(w, "X", 0)
        shardsim.ppermute(w, "X", 4)
    assert t.total() == 0


def test_table_lists_every_event() -> None:
    mesh = Mesh(X=2)
    w = shardsim.shard(np.ones((8, 8), np.float32), mesh, "D_X F", label="W")
    x = shardsim.shard(np.ones((2, 8), np.float32), mesh, "B D", label="In")
    with shardsim.trace() as t:
        full = shardsim.all_gather(w, "X")
        x @ full
    lines = str(t).splitlines()
    assert lines[0].split() == ["#", "phase", "op", "axes", "array", "layout", "sent/chip", "flops/chip"]
    assert "all_gather" in lines[1] and "[D_X, F] -> [D, F]" in lines[1] and "128 B" in lines[1]
    assert "matmul" in lines[2] and "In @ W" in lines[2] and "256" in lines[2]  # 2*2*8*8 flops
    assert len(lines) == 3
    assert t._repr_html_().startswith("<table>")  # an HTML table, tests/test_html_reprs.py
