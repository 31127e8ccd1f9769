"""Placement on real topologies: sub-rings of a torus axis, pod shapes, NVLink domains, padding.

Every expected time is derived here by hand from the scaling book's formulas (SB
sharding.md): a bidirectional ring gathers V in V / W_ici, a line of N chips (no
wraparound) in (N - 1) (V / N) / W_uni, one-way.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import shardsim
from fuzz_budget import budget
from shardsim import CostModelError, DivisibilityError, Mesh, ShapeDtype
from shardsim.cost import AxisLink, collective_time, default_topology, estimate, get_hardware, place, timeline_of

V5P = get_hardware("tpu-v5p")
H100 = get_hardware("h100")
W_UNI = 9e10  # v5p ICI, one way per link (SB tpus.md)
W_ICI = 2 * W_UNI
D, F = 8192, 32768
V = 2 * D * F  # bf16 [D, F]


def gather_time(mesh: Mesh, axis: str, layout: str, hw=V5P, **placement) -> float:
    x = shardsim.shard(ShapeDtype((D, F), "bfloat16"), mesh, layout)
    with shardsim.trace() as t:
        shardsim.all_gather(x, axis)
    return timeline_of(t, hw, mesh, **placement).bars[0].seconds


@pytest.mark.parametrize("n", [4, 8])
def test_subring_without_wraparound_runs_as_a_line(n):
    # n neighbouring chips of a 16-chip v5p axis: no link closes the ring, so it is a line:
    # (N-1) hops of V/N one way (SB sharding.md pop quiz 2), about twice the ring's V / W_ici
    t = gather_time(Mesh(X=n), "X", "D_X F", topology="16x16x16")
    assert t == pytest.approx((n - 1) * (V / n) / W_UNI, rel=1e-12)
    assert place(V5P, Mesh(X=n), topology="16x16x16").route("X").describe() == f"ici rings {n} (no wraparound)"


@pytest.mark.parametrize("n", [4, 8])
def test_subring_with_wraparound_runs_as_a_ring(n):
    # the same sub-ring with a wraparound link (e.g. closed by the optical switches): V / W_ici
    t = gather_time(Mesh(X=n), "X", "D_X F", topology="16x16x16", links={"X": AxisLink("ici", wraparound=True)})
    assert t == pytest.approx(V / W_ICI, rel=1e-12)
    line = gather_time(Mesh(X=n), "X", "D_X F", topology="16x16x16")
    assert line / t == pytest.approx(2 * (n - 1) / n)  # SB tpus.md: "typically doubles the time"


def test_two_mesh_axes_share_one_torus_axis():
    # Mesh(X=4, Y=4) on one 16-chip ring: Y takes 4 neighbours (a line), X every 4th chip (a
    # ring of 4 closing the 16-chip axis, with wraparound); each link carries 4 strided X rings,
    # and X and Y split the axis's links
    mesh = Mesh(X=4, Y=4)
    p = place(V5P, mesh, topology="16")
    assert str(p) == "X=4: ici 4:4\nY=4: ici 4"
    assert p.route("X").describe() == "ici rings 4:4 (wraparound)"
    assert gather_time(mesh, "Y", "D_Y F", topology="16") == pytest.approx(2 * 3 * (V / 4) / W_UNI)
    assert gather_time(mesh, "X", "D_X F", topology="16") == pytest.approx(V / (W_ICI / (4 * 2)))


def test_default_placement_shares_an_axis_only_when_the_torus_runs_out():
    # X=256 and Y=16 take three whole axes (the book's M_X = 2, M_Y = 1), as before
    assert str(place(V5P, Mesh(X=256, Y=16))) == "X=256: ici 16x16\nY=16: ici 16"
    # X=1024, Y=4 needs four rings: laid out on the 16x16x16 slice, Y inside one axis
    p = place(V5P, Mesh(X=1024, Y=4))
    assert p.topology == {"ici": (16, 16, 16)}
    assert str(p) == "X=1024: ici 4:4x16x16\nY=4: ici 4"


def test_v5p_pod_is_not_a_cube():
    # SB tpus.md: "the maximum pod size ... is 16x20x28 for TPU v5p"
    ici = V5P.networks["ici"]
    assert ici.pod == (16, 20, 28) and ici.chips == 8960
    assert default_topology(ici, 8960) == (16, 20, 28)
    assert default_topology(ici, 4096) == (16, 16, 16)
    p = place(V5P, Mesh(X=16, Y=20, Z=28), topology="16x20x28")
    assert p.route(("X", "Y", "Z")).describe() == "ici rings 16x20x28 (wraparound)"  # all multiples of 4


def test_more_chips_on_an_axis_than_the_hardware_has():
    with pytest.raises(CostModelError, match=r"32 chips on one hardware axis.*16x20x28.*28"):
        place(V5P, Mesh(X=32), {"X": AxisLink("ici", rings=(32,))})
    with pytest.raises(CostModelError, match="16x20x28"):
        place(V5P, Mesh(X=16, Y=16, Z=32), topology="16x16x32")
    with pytest.raises(CostModelError, match="dcn"):
        place(V5P, Mesh(X=256, Y=64))  # 16,384 chips: no v5p slice holds them
    with pytest.raises(CostModelError, match="topology 16x16 has 256"):
        place(V5P, Mesh(X=1024), topology="16x16")
    with pytest.raises(CostModelError, match="domain holds 8"):
        place(H100, Mesh(X=16), {"X": "nvlink"})
    with pytest.raises(CostModelError, match="not a torus"):
        place(H100, Mesh(X=8), topology="8")
    assert issubclass(CostModelError, shardsim.ShardsimError) and issubclass(CostModelError, ValueError)


def test_mesh_axes_inside_an_nvlink_domain_and_across_nodes():
    # row-major over nodes of 8: Z (4) and Y (2) share a node's NVLink, X crosses nodes. An
    # AllGather over X of an array replicated over Y, Z gets one NIC per node: V / 50e9 (SB
    # gpus.md); sharded over Y, Z too, each of the 8 groups gathers V/8 on its own NIC
    mesh = Mesh(X=4, Y=2, Z=4)
    assert str(place(H100, mesh)) == "X=4: scaleout 4\nY=2: nvlink 2\nZ=4: nvlink 4"
    assert gather_time(mesh, "Z", "D_Z F", hw=H100) == pytest.approx(V / 450e9)
    assert gather_time(mesh, "X", "D_X F", hw=H100) == pytest.approx(V / 50e9)
    assert gather_time(mesh, "X", "D_X F_YZ", hw=H100) == pytest.approx(V / (8 * 50e9))
    straddle = Mesh(X=2, Y=16)  # Y: 8 in a node x 2 nodes
    assert str(place(H100, straddle)) == "X=2: scaleout 2\nY=16: nvlink 8 x scaleout 2"


def test_dimensions_that_do_not_divide_are_refused_or_padded():
    with pytest.raises(DivisibilityError, match="pad=True"):
        estimate("fsdp", Mesh(X=16), V5P, 16 * 1024, 8200, F, efficiency="ideal")
    padded = estimate("fsdp", Mesh(X=16), V5P, 16 * 1024, 8200, F, efficiency="ideal", pad=True)
    assert padded.padding == {"d_model": (8200, 8208)}
    assert "padded d_model 8200 -> 8208" in padded.summary()
    exact = estimate("fsdp", Mesh(X=16), V5P, 16 * 1024, 8208, F, efficiency="ideal")
    assert padded.step_s == exact.step_s  # the padded program is what runs
    assert padded.mfu == pytest.approx(exact.mfu * 8200 / 8208)  # the padding is wasted work


@budget(40)
@given(st.lists(st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128]), min_size=1, max_size=3))
def test_any_row_major_layout_on_a_slice_is_consistent(sizes):
    # every mesh of powers of two that fits 16x16x16 lays out; each axis's rings multiply to
    # its size, stay inside a hardware axis, and no AllGather beats three whole bidirectional
    # rings (V / (3 W_ici)) or, on one hardware axis, one ring's V / W_ici
    assume(math.prod(sizes) <= 4096)
    mesh = Mesh({f"A{i}": n for i, n in enumerate(sizes)})
    p = place(V5P, mesh, topology="16x16x16")
    for axis, n in zip(mesh.axis_names, sizes):
        (part,) = p.parts[axis]
        assert math.prod(part.rings) == n
        assert all(r * part.stride(k) <= 16 for k, r in enumerate(part.rings))
        t = collective_time("all_gather", V, p.route(axis), "exact").bandwidth_s if n > 1 else math.inf
        assert t >= V / (3 * W_ICI) * (1 - 1e-12)
        if n > 1 and len([r for r in part.rings if r > 1]) == 1:
            assert t >= V / W_ICI * (1 - 1 / n) * (1 - 1e-12)
