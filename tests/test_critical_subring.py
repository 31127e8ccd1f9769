"""FSDP+TP with a mesh axis inside one torus axis: the split the book reasons about on 4,096 v5p.

SB training.md: on a 16x16x16 v5p slice FSDP alone needs 850 tokens per chip; mixing in
tensor parallelism lowers that, `B/N > alpha^2 / (M_X M_Y F)`. With F = 32768 a whole 16-chip
axis of TP is never compute-bound (`Y < M_Y F / 2550 = 12.85`), so the useful TP axis is a
sub-ring of 4 chips inside one hardware axis; the hand derivations below follow the book.
"""

from __future__ import annotations

import math

import pytest

from shardsim import Mesh
from shardsim.cost import best_split, critical_batch, estimate, get_hardware, place

V5P = get_hardware("tpu-v5p")
C = 4.59e14
W_UNI, W_ICI = 9e10, 1.8e11
D, F = 8192, 32768


def test_fsdp_tp_on_4096_chips_uses_a_subring_and_beats_fsdp():
    c = critical_batch("fsdp_tp", "tpu-v5p", d_ff=F, chips=4096)
    assert repr(c.mesh) == "Mesh(X=1024, Y=4)"
    # Y: 4 neighbours of one 16-chip axis, a line; X: every 4th chip of that axis plus two
    # whole axes. X and Y split the shared axis's links.
    assert c.placement == "X=1024: ici 4:4x16x16 / Y=4: ici 4"
    w_y = (4 / 3) * W_UNI / 2  # line of 4: N-1 hops of V/N one way, halved by sharing
    w_x = 2 * W_ICI + W_ICI / (4 * 2)  # two whole rings + a ring of 4 strided by 4, shared
    assert c.bandwidth == pytest.approx({"X": w_x, "Y": w_y})
    # forward: X gathers 4 D F / Y bytes against 4 b D F / C of matmul: b > C / (Y w_x)
    assert c.per_chip_batch == pytest.approx(C / (4 * w_x), rel=1e-9)
    assert C / w_y < F / 4  # and the Y collectives stay hidden at any batch (TP's own condition)
    assert c.per_chip_batch < 0.4 * 850
    # the closed form beside it, with each axis's effective bandwidth for M W_ici
    assert c.closed_form == pytest.approx(C * C / (w_x * w_y * F))
    # the book's form with whole axes (M_X = 2, M_Y = 1): 2550^2 / (2 F) = 99.2, but that needs
    # TP over a whole 16-chip axis, which is communication-bound at every batch here
    assert pytest.approx(99.2, abs=0.05) == (C / W_ICI) ** 2 / (2 * F)
    assert math.isinf(c.splits[16]) and F / 16 < C / W_ICI
    assert c.splits[1] == pytest.approx(C / (3 * W_ICI))  # plain FSDP over three axes: 850


def test_time_line_uses_the_subring():
    # the Y AllGather of In[B_X, D_Y] moves V = 2 (B / X) D bytes over the shared line of 4
    mesh, b = Mesh(X=1024, Y=4), 512
    est = estimate("fsdp_tp", mesh, V5P, 4096 * b, D, F, efficiency="ideal")
    v = 2 * (4096 * b // 1024) * D
    ag_y = [bar for bar in est.timeline.bars if bar.op == "all_gather" and bar.axes == ("Y",)]
    assert ag_y and all(bar.seconds == pytest.approx(3 * (v / 4) / (W_UNI / 2)) for bar in ag_y)


def test_best_split_takes_the_placement_options():
    batch = 4096 * 512
    auto = best_split(V5P, batch, D, F, chips=4096, efficiency="ideal")
    given = best_split(V5P, batch, D, F, chips=4096, efficiency="ideal", topology="16x16x16")
    assert repr(auto.mesh) == repr(given.mesh) == "Mesh(X=2048, Y=2)"  # a sub-ring of 2 for TP
    assert auto.step_s == given.step_s
    # a 1-D pod layout cannot hold 4,096 chips on one axis: every split is refused
    with pytest.raises(Exception, match="no X x Y split"):
        best_split(V5P, batch, D, F, chips=4096, efficiency="ideal", topology="4096")
    assert str(place(V5P, auto.mesh)) == "X=2048: ici 8:2x16x16\nY=2: ici 2"
