"""Efficiency curves: measured by others, bounded by peak, ideal equal to the book's model.

Constants and their sources: ``src/shardsim/cost/presets.py`` and ``docs/cost-model.md``.
"""

from __future__ import annotations

import itertools
import re
import warnings
from pathlib import Path

import pytest

from finite_differences import root
from shardsim import CostModelError, Mesh
from shardsim.cost import (
    AttentionEfficiency,
    Calibration,
    CalibrationWarning,
    CollectiveEfficiency,
    Hardware,
    MatmulEfficiency,
    Switched,
    collective_time,
    critical_both,
    estimate,
    get_hardware,
    hardware_names,
    matmul_time,
    place,
    resolve_efficiency,
    timeline_of,
)
from shardsim.cost.critical import critical_table
from shardsim.cost.crossover import crossover_both
from shardsim.cost.measured import collective_comparison, comparison_table

DOCS = Path(__file__).resolve().parents[1] / "docs" / "cost-model.md"
CALIBRATED = [n for n in hardware_names() if get_hardware(n).calibration is not None]


def _quiet(hw, networks=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        return resolve_efficiency(get_hardware(hw), "calibrated", networks)


@pytest.mark.parametrize("name", CALIBRATED)
def test_curves_are_monotone_and_bounded_by_peak(name):
    eff = _quiet(name)
    if eff.matmul is not None:
        for dtype in ("bfloat16", "float8_e4m3fn"):
            fr = [eff.matmul_fraction(i, dtype) for i in (1, 10, 50, 100, 300, 1000, 3000, 1e4, 1e6, float("inf"))]
            assert all(0 <= a <= b <= 1 for a, b in itertools.pairwise(fr)), fr
            assert fr[-1] == eff.matmul.by_dtype.get(dtype, eff.matmul.peak_fraction)
    for curve in eff.networks.values():
        fr = [curve.fraction(v) for v in (1, 1e3, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e12)]
        assert all(0 <= a <= b <= 1 for a, b in itertools.pairwise(fr)), fr


def test_matmul_curve_passes_through_its_measurements():
    # MAMF (ml-engineering): H100 SXM bf16 794.5 of 989 TFLOP/s; A100 271.2 of 312. The bend
    # was read from an H100 2048^3 bf16 matmul at 676.59 TFLOP/s (intensity 2048 / 3).
    h100 = get_hardware("h100")
    eff = _quiet("h100")
    n = 2048
    r = matmul_time(2 * n**3, 2 * 3 * n * n, h100, efficiency=eff)
    assert 2 * n**3 / r.seconds == pytest.approx(676.59e12 * 990 / 989, rel=2e-3)  # preset peak 990 vs 989
    assert eff.matmul.peak_fraction == pytest.approx(794.5 / 989)
    assert _quiet("a100").matmul.peak_fraction == pytest.approx(271.2 / 312)
    ideal = matmul_time(2 * n**3, 2 * 3 * n * n, h100)
    assert ideal.seconds == 2 * n**3 / 9.9e14  # the book's roofline, untouched


def test_collective_curves_pass_through_their_fit_points():
    rows = collective_comparison()
    for c in rows:
        # calibrated never beats the link rate: the ideal time with exact (N-1)/N rings
        hw = c.row.chip().with_(ring="exact")
        route = place(hw, Mesh(dict(c.row.mesh))).route(c.row.axis)
        assert c.calibrated_s >= collective_time(c.row.op, c.row.nbytes, route, hw.ring).seconds, c.row.what
        if c.role == "fit":
            assert c.calibrated_s == pytest.approx(c.measured_s, rel=2e-3), c.row.what
    checks = {c.row.what: c for c in rows if c.role == "check"}
    assert len(checks) >= 3  # measurements the constants were not read from


def test_docs_tables_are_what_the_code_computes():
    text = DOCS.read_text()
    assert comparison_table() in text
    assert critical_table() in text


def test_ideal_is_the_old_model_exactly():
    # step, comm and compute seconds of the model before calibration existed (same code path)
    old = [
        ("fsdp", {"X": 16}, "tpu-v5p", 16 * 2048, 8192, 32768, 3, 0.05608254136944664, 0.053687091200000016),
        ("fsdp_tp", {"X": 8, "Y": 8}, "tpu-v5p", 64 * 512, 8192, 32768, 2, 0.010168966686117649, 0.008202194488888887),
        ("ddp", {"X": 32}, "h100", 32 * 1024, 8192, 32768, 2, 0.013513962754585856, 0.010737418239999998),
        ("tp", {"Y": 8}, "h200", 8 * 1024, 4096, 16384, 2, 0.0028589731798626273, 0.0011930464711111116),
        ("fsdp", {"X": 16}, "tpu-v5e", 16 * 4096, 4096, 16384, 2, 0.03497897187902087, 0.017895697066666667),
    ]
    for scheme, mesh, hw, b, d, f, layers, step, comm in old:
        e = estimate(scheme, Mesh(mesh), hw, b, d, f, layers=layers, efficiency="ideal")
        assert (e.step_s, e.comm_s) == (step, comm), scheme
        assert e.summary().splitlines()[-2].startswith("efficiency ideal")  # the defaults line after it


def test_calibrated_is_the_default_and_says_so():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        est = estimate("fsdp", Mesh(X=8), "h100", 8 * 4096, 8192, 32768)
    assert est.efficiency.mode == "calibrated"
    (line,) = [ln for ln in est.summary().splitlines() if ln.startswith("efficiency")]
    assert line == (
        "efficiency calibrated (matmul up to 80.3% of peak, nvlink up to 82.2% of link rate, "
        "untimed kernels 1.36 HBM passes over each matmul output, "
        "fused attention 65.5% / 56.7% of peak forward / backward)"
    )
    ideal = estimate("fsdp", Mesh(X=8), "h100", 8 * 4096, 8192, 32768, efficiency="ideal")
    assert est.step_s > ideal.step_s and est.mfu < ideal.mfu


def test_efficiency_above_peak_is_an_error():
    for bad in (lambda: MatmulEfficiency(1.2), lambda: CollectiveEfficiency(1.01), lambda: MatmulEfficiency(0.0)):
        with pytest.raises(CostModelError, match="fraction of peak"):
            bad()
    with pytest.raises(CostModelError, match=r"by_dtype\['float8_e4m3fn'\] = 1.5"):
        MatmulEfficiency(0.8, by_dtype={"float8_e4m3fn": 1.5})
    with pytest.raises(CostModelError, match="'fast'"):
        estimate("fsdp", Mesh(X=8), "h100", 8 * 4096, 8192, 32768, efficiency="fast")
    with pytest.raises(CostModelError, match=r"backward = 1.2: an efficiency is a fraction of peak"):
        AttentionEfficiency(0.6, 1.2)


def _context_attention_trace(method):
    """Causal context-parallel attention, forward and backward, on 4 chips of the context axis."""
    import numpy as np

    import shardsim as ss
    from shardsim.strategies.context import balanced_order, context_attention, context_attention_backward

    mesh = ss.Mesh(C=4)
    B, S, N, H = 1, 64, 2, 16
    rng = np.random.default_rng(0)
    q, k, v, do = rng.standard_normal((4, B, S, N, H))
    order = balanced_order(S, 4)

    def shard(x):
        return ss.shard(x[:, order], mesh, "B S_C N H")

    positions = ss.shard(order, mesh, "[S_C]")
    with ss.trace() as t:
        _, saved = context_attention(shard(q), shard(k), shard(v), positions, axis="C", method=method)
        with ss.tracing.phase("backward"):
            context_attention_backward(saved, shard(do))
    return t, mesh


@pytest.mark.parametrize("method", ["ring", "all_gather"])
def test_fused_attention_blocks_run_at_the_kernels_measured_rate(method):
    """Context-parallel attention is FlashAttention's algorithm (online softmax, scores
    recomputed in the backward pass): on a chip with a measured fused-attention rate each of
    its block matmuls takes FLOPs / (peak x the rate of its pass), with no untimed passes
    after it; on a chip without one (the A100) they stay on the matmul curve, with no untimed
    passes after them either: the scores never reach HBM for a pass to read."""
    t, mesh = _context_attention_trace(method)
    blocks = [e for e in t.events if e.kernel == "attention"]
    assert {e.phase for e in blocks} == {"forward", "backward"} and all(e.op == "matmul" for e in blocks)
    h100 = timeline_of(t, "h100", mesh, efficiency="calibrated")
    for b in h100.bars:
        e = t.events[b.index]
        if e.kernel == "attention":
            rate = {"forward": 648e12, "backward": 561e12}[e.phase]
            assert b.seconds == pytest.approx(e.flops / rate, rel=1e-12) and b.untimed_s == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        a100 = timeline_of(t, "a100", mesh, efficiency="calibrated")
    eff = _quiet("a100")
    hw = get_hardware("a100")
    for b in a100.bars:
        e = t.events[b.index]
        if e.kernel == "attention":
            on_curve = matmul_time(e.flops, e.hbm_bytes, hw, "float64", eff).seconds
            assert b.seconds == pytest.approx(on_curve, rel=1e-12) and b.untimed_s == 0


def test_missing_calibration_warns_naming_what_is_missing():
    with pytest.warns(CalibrationWarning, match="tpu-v5p has no measured efficiency for matmul"):
        estimate("fsdp", Mesh(X=16), "tpu-v5p", 16 * 4096, 8192, 32768)
    with pytest.warns(CalibrationWarning, match="b200 has no measured efficiency for nvlink"):
        estimate("fsdp", Mesh(X=8), "b200", 8 * 4096, 8192, 32768)
    toy = Hardware("toy", {"bfloat16": 1e14}, 1e12, 16e9, {"net": Switched(bandwidth=1e10)})
    with pytest.warns(CalibrationWarning, match="toy has no measured efficiency for matmul, net"):
        e = estimate("ddp", Mesh(X=4), toy, 4 * 1024, 1024, 4096)
    assert e.efficiency.missing == ("matmul", "net")
    assert "ideal for matmul, net (no measured data)" in e.summary()
    given = toy.with_(calibration=Calibration(MatmulEfficiency(0.5), {"net": CollectiveEfficiency(0.5)}))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)
        cal = estimate("ddp", Mesh(X=4), given, 4 * 1024, 1024, 4096)
    ideal = estimate("ddp", Mesh(X=4), given, 4 * 1024, 1024, 4096, efficiency="ideal")
    assert cal.compute_s == pytest.approx(2 * ideal.compute_s)  # half the peak, no bend
    # exact rings (measured rings pay (N-1)/N) at half the rate: 2 x 3/4 of the book's time
    assert cal.comm_s == pytest.approx(ideal.comm_s * 2 * 3 / 4)


def test_calibrated_critical_batch_against_hand_derivation():
    # FSDP in one H100 node: the two forward AllGathers (V = 2 D F each, exact ring 7/8 at the
    # NVLink plateau, 370 of 450 GB/s, plus NCCL's ring latency: 8.4 us and 7 steps of 3.4 us)
    # against the two forward matmuls (2 b D F FLOPs each, intensity b D F / (b D + D F + b F),
    # at the MAMF curve); the backward has the same ratio.
    d, f = 8192, 32768
    h100 = get_hardware("h100")
    eff = _quiet("h100", ["nvlink"])
    v = 2 * d * f
    t_comm = 2 * (v * 7 / 8 / 370e9 + 8.4e-6 + 7 * 3.4e-6)

    k = eff.elementwise_passes  # each matmul then reads and writes its output ([b, F], [b, D] bf16) k times

    def excess(b):
        intensity = b * d * f / (b * d + d * f + b * f)
        matmuls = 2 * 2 * b * d * f / (h100.flops() * eff.matmul_fraction(intensity))
        return t_comm - matmuls - k * 2 * b * (f + d) / 3.35e12

    want = root(excess, 1.0, 1e6)
    pair = critical_both("fsdp", "h100", chips=8)
    assert pair.ideal.per_chip_batch == pytest.approx(9.9e14 / 4.5e11)  # SB gpus.md: 2200
    assert pair.calibrated.per_chip_batch == pytest.approx(want, rel=1e-3)
    # here matmuls lose more (to 74%) than the 537 MB gathers (71% x 8/7): compute-bound earlier
    assert pair.calibrated.per_chip_batch < pair.ideal.per_chip_batch


def test_calibrated_critical_batch_is_later_where_messages_are_small():
    # small layers: each 8 MB gradient AllReduce pays NCCL's ring latency (8.4 us + 14 steps of
    # 3.4 us, 56 us against its 31 us at the link rate) and the 83% plateau, so DP turns
    # compute-bound later; TP's activation collectives likewise
    for scheme, d_ff, opts in (("ddp", 4096, {"d_model": 1024, "chips": 8}), ("tp", None, {"chips": 8})):
        pair = critical_both(scheme, "h100", d_ff, **opts)
        assert pair.calibrated.per_chip_batch >= pair.ideal.per_chip_batch
        assert pair.ratio > 1.5
    tpu = critical_both("fsdp", "tpu-v5p", 4096, d_model=1024)  # 8 MB weights: ramp binds a little
    assert tpu.calibrated.per_chip_batch > tpu.ideal.per_chip_batch * 15 / 16


def test_crossover_under_both_models():
    rows, crit = crossover_both(["ddp", "tp"], "h100", [512, 4096], 8192, 32768, chips=8)
    ideal, cal = rows["h100 ideal"], rows["h100 calibrated"]
    assert [(e.scheme, e.per_chip_batch) for e in ideal] == [(e.scheme, e.per_chip_batch) for e in cal]
    assert all(c.mfu < i.mfu for i, c in zip(ideal, cal))
    assert all(e.efficiency.mode == "calibrated" for e in cal)
    assert crit["h100 ideal"]["ddp"] == pytest.approx(2200)
    assert set(crit["h100 calibrated"]) == {"ddp", "tp"}


def test_every_preset_constant_has_a_source_in_the_docs():
    text = DOCS.read_text()
    section = text[text.index("## Efficiency") :]
    for name in CALIBRATED:
        assert re.search(rf"^\| [^|]*`{name}`[^|]* \|", section, re.M), name


def test_cli_estimate_prints_the_efficiency(capsys):
    import argparse

    from shardsim.cli.estimate import add_estimate_arguments, cli_estimate

    p = argparse.ArgumentParser()
    add_estimate_arguments(p)
    for flag, want in (("ideal", "efficiency ideal"), ("calibrated", "efficiency calibrated (matmul up to 80.3%")):
        cli_estimate(p.parse_args(["--hardware", "h100", "--mesh", "X=8", "--efficiency", flag, "--width", "40"]))
        assert want in capsys.readouterr().out
    assert p.parse_args([]).efficiency == "calibrated"
