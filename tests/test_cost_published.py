"""The cost model reproduces the scaling book's published numbers from its own formulas.

SB = "How to Scale Your Model" (training.md, sharding.md, gpus.md, roofline.md); each test
quotes the figure it checks. Numbers come from running the schemes' programs (or single
collectives) shape-only and costing them, never from a table.
"""

from __future__ import annotations

import math

import pytest

import shardsim
from shardsim import Mesh, ShapeDtype
from shardsim.cost import AxisLink, critical_batch, get_hardware, matmul_critical_batch, timeline_of

V5P = get_hardware("tpu-v5p")
H100 = get_hardware("h100")


def gather_time(mesh: Mesh, shape: tuple[int, ...], layout: str, axes: str | tuple[str, ...], hw, links=None) -> float:
    """Seconds of one traced AllGather of a bf16 shape-only array."""
    x = shardsim.shard(ShapeDtype(shape, "bfloat16"), mesh, layout)
    with shardsim.trace() as t:
        shardsim.all_gather(x, axes)
    return timeline_of(t, hw, mesh, links=links).step_s


# -- critical batches ---------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["ddp", "fsdp"])
def test_v5p_data_parallel_critical_batch_is_2550(scheme):
    # SB training.md: "C=4.6e14 and W=2 * 9e10 [...] our batch size per chip must be at least
    # 2,550"; "4.59e14 / 1.8e11 = 2550 for v5p"
    c = critical_batch(scheme, "tpu-v5p", mesh=Mesh(X=16))
    assert c.per_chip_batch == pytest.approx(2550)  # exactly C / W


def test_v5p_fsdp_over_three_axes_is_850():
    # SB training.md: "if we dedicate all three axes [...] we 3x our bandwidth [...] BS=850 per TPU"
    c = critical_batch("fsdp", "tpu-v5p", chips=4096)  # 16 x 16 x 16: three ICI rings
    assert c.per_chip_batch == pytest.approx(850)


def test_v5p_fsdp_tp_condition_for_large_d_ff():
    # SB training.md: compute-bound iff B/N > alpha^2 / (M_X M_Y F), with X_opt =
    # sqrt((B/F)(M_X/M_Y)N). With F = 40960 the best integer split is X = 256 (two ICI axes),
    # Y = 16 (one): alpha / (Y M_X) = 2550 / 32, a hair above the continuous optimum.
    f = 40960
    c = critical_batch("fsdp_tp", "tpu-v5p", f, chips=4096)
    assert (c.mesh.axis_size("X"), c.mesh.axis_size("Y")) == (256, 16)
    assert c.per_chip_batch == pytest.approx(2550 / 32, rel=1e-9)
    closed = 2550**2 / (2 * 1 * f)
    assert c.closed_form == pytest.approx(closed, rel=1e-9)
    assert c.per_chip_batch == pytest.approx(closed, rel=0.005)
    assert c.x_opt == pytest.approx(256, rel=0.005)  # the book's X_opt lands on the chosen split


@pytest.mark.parametrize(("f", "published"), [(32768, 99), (30000, 108), (13824, 235)])
def test_fsdp_tp_closed_form_numbers(f, published):
    # SB training.md: "F=32,768, alpha=2550, M_X M_Y=2 [...] B/N > 99"; LLaMA-3 70B
    # "2550^2 / 2 * 30,000 = 108"; problem 3 "2550^2 / 2F = 235" for F = 13824
    c = critical_batch("fsdp_tp", "tpu-v5p", f, mesh=Mesh(X=256, Y=16))
    assert c.closed_form == pytest.approx(published, rel=0.005)


def test_tp_condition_y_below_m_y_f_over_2550():
    # SB training.md: tensor parallelism is compute-bound only for Y < M_Y F / 2550
    # (12.85 for F = 32768 on one ICI axis): 8-way is fine, 16-way never is, and 16-way over
    # two ICI axes (4 x 4) is fine again.
    assert math.isfinite(critical_batch("tp", "tpu-v5p", 32768, mesh=Mesh(Y=8)).per_chip_batch)
    assert math.isinf(critical_batch("tp", "tpu-v5p", 32768, mesh=Mesh(Y=16)).per_chip_batch)
    two_axes = critical_batch("tp", "tpu-v5p", 32768, mesh=Mesh(Y=16), links={"Y": AxisLink("ici", rings=(4, 4))})
    assert math.isfinite(two_axes.per_chip_batch)


def test_h100_data_parallel_within_and_across_nodes():
    # SB gpus.md: "Within a node, [...] 990e12 / 450e9 = 2200"; "Within an SU or at the spine
    # level, BS > 990e12 / 400e9 = 2475"
    assert critical_batch("ddp", "h100", chips=8).per_chip_batch == pytest.approx(2200)
    assert critical_batch("ddp", "h100", chips=256).per_chip_batch == pytest.approx(2475)


def test_h100_exact_ring_forms():
    # SB gpus.md, precise forms: T = B (D-1) / (D W). One node: 2200 x 7/8. Exactly two nodes:
    # the node level (B / 514e9) binds, not the cross-node B / 800e9. One SU of 32 nodes:
    # "400e9 * 32 / (32 - 1) = 413GB/s".
    exact = H100.with_(ring="exact")
    assert critical_batch("fsdp", exact, chips=8).per_chip_batch == pytest.approx(2200 * 7 / 8)
    assert critical_batch("fsdp", exact, chips=16).per_chip_batch == pytest.approx(990e12 / (450e9 * 8 / 7))
    su = critical_batch("fsdp", exact, chips=256).per_chip_batch
    assert su == pytest.approx(990e12 / (400e9 * 32 / 31))
    assert 990e12 / su / 1e9 == pytest.approx(413, abs=0.5)


def test_dcn_operational_intensity():
    # SB training.md: "For TPU v5p, the C / W_dcn is about 4.46e14 / 6.25e9 = 71,360" (the book
    # uses 4.46e14 here): data parallelism between two one-chip slices over DCN.
    hw = V5P.with_(flops_by_dtype={"bfloat16": 4.46e14})
    c = critical_batch("ddp", hw, mesh=Mesh(X=2), links={"X": "dcn"})
    assert c.per_chip_batch == pytest.approx(71360)


# -- single chip --------------------------------------------------------------------------
def test_v5e_critical_intensity_about_240():
    # SB roofline.md: "1.97e14 / 8.2e11 = 240"; the tpus.md table gives 8.1e11 (243). The
    # preset keeps the table; the book's own bandwidth gives its 240.
    v5e = get_hardware("tpu-v5e")
    assert v5e.critical_intensity() == pytest.approx(1.97e14 / 8.1e11)
    assert v5e.with_(hbm_bandwidth=8.2e11).critical_intensity() == pytest.approx(240, abs=0.5)
    # "B > 240 tokens" for a bf16 matmul with B << D, F: solved on the roofline model
    assert matmul_critical_batch(v5e, 1 << 22, 1 << 22) == pytest.approx(243, abs=0.5)


@pytest.mark.parametrize(("name", "published"), [("h100", 295), ("b200", 281)])
def test_gpu_critical_intensity(name, published):
    # SB gpus.md: H100 "990e12 / 3.35e12 = 295"; B200 "2250e12 / 8e12 = 281"
    assert get_hardware(name).critical_intensity() == pytest.approx(published, abs=1)


# -- worked AllGather examples (SB sharding.md) -------------------------------------------
def test_pop_quiz_allgather_without_wraparound():
    # SB sharding.md pop quiz 2: AllGather_Y([E_Y, F]) on a v5e {X: 8, Y: 4}, E=2048, F=8192:
    # "34e6 bytes / 9e10 = 377us" with wraparound, but a ring of 4 has none on v5e:
    # "3 * 8.4e6 / 4.5e10 = 560us".
    v5e = get_hardware("tpu-v5e")
    mesh = Mesh(X=8, Y=4)
    no_wrap = gather_time(mesh, (2048, 8192), "E_Y F", "Y", v5e)
    assert no_wrap == pytest.approx(3 * (2048 * 8192 * 2 / 4) / 4.5e10)
    assert no_wrap * 1e6 == pytest.approx(560, rel=0.005)
    wrap = gather_time(mesh, (2048, 8192), "E_Y F", "Y", v5e, {"Y": AxisLink("ici", wraparound=True)})
    assert wrap == pytest.approx(2048 * 8192 * 2 / 9e10)
    assert wrap * 1e6 == pytest.approx(377, rel=0.015)  # the book rounds V = 33.6 MB up to 34e6


def test_pop_quiz_latency_bound_allgather():
    # same quiz, E = F = 256: "32e3 / 4.5e10 = 0.7us, so we're latency bound [...] 3 hops [...] 3us"
    t = gather_time(Mesh(X=8, Y=4), (256, 256), "E_Y F", "Y", get_hardware("tpu-v5e"))
    assert t == pytest.approx(3e-6)


def test_v4p_allgather_examples():
    # SB sharding.md question 2, TPU v4p 4x4x4, B=1024, D=4096 bf16:
    # AllGather_X([B_X, D_Y]): "2BD / (9e10 * Y) = 23 us"; over two axes:
    # "max(4 T_min, 2BD / (2 W_ICI))" = 46 us.
    v4p = get_hardware("tpu-v4p")
    mesh = Mesh(X=4, Y=4, Z=4)
    one = gather_time(mesh, (1024, 4096), "B_X D_Y", "X", v4p)
    assert one == pytest.approx(2 * 1024 * 4096 / (9e10 * 4))
    assert one * 1e6 == pytest.approx(23, abs=0.5)
    two = gather_time(mesh, (1024, 4096), "B_XY D", ("X", "Y"), v4p)
    assert two == pytest.approx(2 * 1024 * 4096 / (2 * 9e10))
    assert two * 1e6 == pytest.approx(46, abs=1)
    # question 3: AllGather_X([B_X]) with B = 128: latency-bound, "2 hops [...] roughly 2us"
    assert gather_time(mesh, (128,), "B_X", "X", v4p) == pytest.approx(2e-6)


def test_latency_bound_below_45_kb_per_hop():
    # SB sharding.md: "TPU v5e with 4.5e10 unidirectional ICI bandwidth, sending any buffer
    # under 4.5e10 * 1e-6 = 45kB will be latency bound" (per hop, on a ring of 16)
    v5e = get_hardware("tpu-v5e")
    mesh = Mesh(X=16)
    for per_hop, bound in ((40_000, "latency"), (50_000, "bandwidth")):
        x = shardsim.shard(ShapeDtype((16 * per_hop,), "int8"), mesh, "B_X")
        with shardsim.trace() as t:
            shardsim.all_gather(x, "X")
        assert timeline_of(t, v5e, mesh).bars[0].limit == bound
