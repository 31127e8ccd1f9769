"""How collective times scale, checked against the book's formulas derived by hand.

Each case traces real collectives on shape-only arrays and costs the events.
"""

from __future__ import annotations

import pytest

import shardsim
from shardsim import Mesh, ShapeDtype
from shardsim.cost import AxisLink, Hardware, Switched, Torus, get_hardware, place, timeline_of

V5P = get_hardware("tpu-v5p")
H100 = get_hardware("h100")
D, F = 8192, 32768


def traced(mesh: Mesh, shape, layout: str, op, *args, hw=V5P, links=None, dtype="bfloat16"):
    x = shardsim.shard(ShapeDtype(shape, dtype), mesh, layout)
    with shardsim.trace() as t:
        op(x, *args)
    return timeline_of(t, hw, mesh, links=links).bars[0]


def test_allgather_time_does_not_depend_on_ring_length():
    # SB sharding.md: on a bidirectional ring T = V / W_ici, "doesn't depend on |X|"
    times = [traced(Mesh(X=n), (D, F), "D_X F", shardsim.all_gather, "X").seconds for n in (4, 8, 16)]
    assert times == pytest.approx([2 * D * F / 1.8e11] * 3, rel=1e-12)
    # the exact ring keeps (N-1)/N, so it grows with N toward V / W_ici
    exact = V5P.with_(ring="exact")
    times = [traced(Mesh(X=n), (D, F), "D_X F", shardsim.all_gather, "X", hw=exact).seconds for n in (4, 8, 16)]
    assert times == pytest.approx([2 * D * F / 1.8e11 * (n - 1) / n for n in (4, 8, 16)], rel=1e-12)


def test_tiny_allgather_is_latency_bound_and_grows_with_the_ring():
    # SB sharding.md: T = max(T_min |X| / 2, V / W_ici); 256 bytes is far below the latency
    for n in (4, 8, 16):
        bar = traced(Mesh(X=n), (n * 8,), "B_X", shardsim.all_gather, "X")
        assert bar.limit == "latency"
        assert bar.seconds == pytest.approx(1e-6 * n / 2)


def test_missing_wraparound_about_doubles_the_time():
    # SB tpus.md: a missing wraparound "typically doubles the time"; on v5e a ring of 8 has
    # none, a ring of 16 has one: (N-1)/N V / W_uni vs V / (2 W_uni)
    v5e = get_hardware("tpu-v5e")
    eight = traced(Mesh(X=8), (D, F), "D_X F", shardsim.all_gather, "X", hw=v5e)
    sixteen = traced(Mesh(X=16), (D, F), "D_X F", shardsim.all_gather, "X", hw=v5e)
    assert eight.seconds / sixteen.seconds == pytest.approx(2 * 7 / 8)


def test_more_hardware_axes_more_bandwidth():
    # SB sharding.md: over several axes T = V / (W_ici n_axes)
    one = traced(Mesh(X=16), (D, F), "D_X F", shardsim.all_gather, "X", links={"X": AxisLink("ici", rings=(16,))})
    two = traced(Mesh(X=16), (D, F), "D_X F", shardsim.all_gather, "X", links={"X": AxisLink("ici", rings=(4, 4))})
    assert two.seconds == pytest.approx(one.seconds / 2)


def test_reduce_scatter_allreduce_alltoall_against_allgather():
    # SB sharding.md table: ReduceScatter = AllGather; AllReduce = 2 AllGather;
    # AllToAll = AllGather / 4 on a bidirectional ring (same array V)
    mesh = Mesh(X=16)
    ag = traced(mesh, (D, F), "D_X F", shardsim.all_gather, "X").seconds
    h = shardsim.shard(ShapeDtype((2048, D), "bfloat16"), mesh, "B D_X")
    w = shardsim.shard(ShapeDtype((D, F // 4), "bfloat16"), mesh, "D_X F")
    with shardsim.trace() as t:
        partial = h @ w  # [B, F/4]{U_X}: V = 2 * 2048 * F / 4 bytes
        shardsim.reduce_scatter(partial, "X", "F")
        shardsim.all_reduce(partial, "X")
    bars = {b.op: b for b in timeline_of(t, V5P, mesh).bars}
    v = 2 * 2048 * F // 4
    assert bars["reduce_scatter"].seconds == pytest.approx(v / 1.8e11)
    assert bars["all_reduce"].seconds == pytest.approx(2 * v / 1.8e11)
    a2a = traced(mesh, (D, F), "D F_X", shardsim.all_to_all, "X", "F", "D")
    assert a2a.seconds == pytest.approx(ag / 4)


def test_alltoall_over_several_axes_uses_the_longest():
    # SB: AllToAll on an A x B torus costs V max(A, B) / (4 N W_ici)
    mesh = Mesh(X=16)
    bar = traced(mesh, (D, F), "D F_X", shardsim.all_to_all, "X", "F", "D", links={"X": AxisLink("ici", rings=(8, 2))})
    v = 2 * D * F
    assert bar.seconds == pytest.approx(v * 8 / (4 * 16 * 1.8e11))


def test_gpu_allgather_sharded_over_an_inner_axis():
    # SB gpus.md pop quiz 3: AllGather_X(bf16[D_X, F_Y]) over one SU (256 GPUs) with Y the
    # inner axis: for Y <= 8 it stays bounded by the leaf level, 2DF / 400e9 (book mode); for
    # Y > 8, "2DF / (Y * 50GB/s)".
    for y in (1, 2, 4, 8, 16, 32):
        bar = traced(Mesh(X=256 // y, Y=y), (D, F), "D_X F_Y", shardsim.all_gather, "X", hw=H100)
        want = 2 * D * F / 400e9 if y <= 8 else 2 * D * F / (y * 50e9)
        assert bar.seconds == pytest.approx(want), y


def test_gpu_two_node_allgather_is_node_bound():
    # SB gpus.md question 5: over exactly 2 nodes the node level costs B / 514e9 and the
    # cross-node ring B / 800e9, so "we're actually bounded by the node level"
    exact = H100.with_(ring="exact")
    bar = traced(Mesh(X=16), (D, F), "D_X F", shardsim.all_gather, "X", hw=exact)
    assert bar.seconds == pytest.approx(2 * D * F * 7 / (8 * 450e9))


def test_gpu_alltoall_in_a_node_and_across():
    # SB gpus.md: in a node B (N-1) / (W N^2) ~ B / (8 W); across M nodes
    # B (M-1) / (M^2 W_node)
    exact = H100.with_(ring="exact")
    node = traced(Mesh(X=8), (D, F), "D F_X", shardsim.all_to_all, "X", "F", "D", hw=exact)
    assert node.seconds == pytest.approx(2 * D * F * 7 / (64 * 450e9))
    book = traced(Mesh(X=8), (D, F), "D F_X", shardsim.all_to_all, "X", "F", "D", hw=H100)
    assert book.seconds == pytest.approx(2 * D * F / (8 * 450e9))
    two = traced(Mesh(X=16), (D, F), "D F_X", shardsim.all_to_all, "X", "F", "D", hw=exact)
    assert two.seconds == pytest.approx(max(2 * D * F * 7 / (256 * 450e9), 2 * D * F * 1 / (4 * 400e9)))


def test_user_hardware_with_an_axis_on_each_network():
    # a made-up chip: a 2-D torus of 1e10 B/s links and a 1e9 B/s switched network
    hw = Hardware(
        "toy",
        {"bfloat16": 1e14},
        1e12,
        16e9,
        {"ici": Torus(bandwidth=1e10, dims=2, wrap="always"), "dcn": Switched(bandwidth=1e9)},
    )
    mesh = Mesh(X=4, Y=8)
    links = {"X": "dcn", "Y": "ici"}
    placement = place(hw, mesh, links)
    assert placement.route("X").describe() == "dcn 4"
    across = traced(mesh, (D, F), "D_X F", shardsim.all_gather, "X", hw=hw, links=links)
    assert across.seconds == pytest.approx(2 * D * F / 1e9)  # book mode: V / W per chip
    inside = traced(mesh, (D, F), "D_Y F", shardsim.all_gather, "Y", hw=hw, links=links)
    assert inside.seconds == pytest.approx(2 * D * F / 2e10)  # V / W_bidi


def test_placement_errors_say_what_to_do():
    with pytest.raises(shardsim.ShardsimError, match="dcn"):
        place(get_hardware("tpu-v5e"), Mesh(X=1024))  # three rings on a 2-D torus
    with pytest.raises(shardsim.ShardsimError, match="domain"):
        place(H100, Mesh(X=16), {"X": "nvlink"})
    with pytest.raises(shardsim.ShardsimError, match="has no network"):
        place(H100, Mesh(X=8), {"X": "ici"})
