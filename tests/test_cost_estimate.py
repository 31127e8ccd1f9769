"""estimate, sweep, critical_batch and the CLI functions, against hand-derived values."""

from __future__ import annotations

import argparse

import pytest

from shardsim import Mesh
from shardsim.cli.estimate import (
    add_critical_arguments,
    add_estimate_arguments,
    add_sweep_arguments,
    cli_critical,
    cli_estimate,
    cli_sweep,
)
from shardsim.cost import best_split, critical_batch, estimate, get_hardware, sweep

D, F = 8192, 32768
V5P = get_hardware("tpu-v5p")


def test_mfu_is_model_flops_over_step_time():
    est = estimate("fsdp", Mesh(X=16), V5P, 16 * 4096, D, F, layers=2, efficiency="ideal")
    flops = 12 * 16 * 4096 * D * F * 2
    assert est.mfu == pytest.approx(flops / (16 * est.step_s * 4.59e14))
    # compute-bound: the step is the matmuls plus the first, unhidden weight AllGather
    assert est.step_s == pytest.approx(est.compute_s + 2 * D * F / 1.8e11)
    assert est.compute_s == pytest.approx(12 * 4096 * D * F * 2 / 4.59e14)


def test_bound_flips_at_the_critical_batch():
    c = critical_batch("fsdp", V5P, mesh=Mesh(X=16))
    below = estimate("fsdp", Mesh(X=16), V5P, 16 * int(c.per_chip_batch * 0.97), D, F, efficiency="ideal")
    above = estimate("fsdp", Mesh(X=16), V5P, 16 * int(c.per_chip_batch * 1.03), D, F, efficiency="ideal")
    assert (below.bound, above.bound) == ("communication", "compute")


def test_small_matmuls_are_memory_bound():
    # 64 tokens per chip on one chip's worth of TP: below the v5p critical intensity
    est = estimate("tp", Mesh(Y=2), V5P, 2 * 64, D, F, efficiency="ideal")
    assert est.bound == "memory"
    assert all(b.limit == "memory" for b in est.timeline.bars if b.is_compute)


def test_breakdowns_add_up():
    est = estimate("fsdp_tp", Mesh(X=4, Y=4), V5P, 16 * 1024, D, F, layers=3, efficiency="ideal")
    per_coll = est.breakdown("collective")
    assert sum(r["seconds"] for r in per_coll) == pytest.approx(est.comm_s)
    assert sum(r["count"] for r in per_coll) == 3 * 11
    per_layer = est.breakdown("layer")
    assert {r["layer"] for r in per_layer} == {0, 1, 2}
    assert sum(r["compute_s"] for r in per_layer) == pytest.approx(est.compute_s)
    assert sum(r["exposed_s"] for r in per_layer) == pytest.approx(est.comm_exposed_s)
    assert len(est.breakdown("event")) == len(est.timeline.bars)
    with pytest.raises(ValueError, match="breakdown"):
        est.breakdown("chip")


def test_memory_grows_with_layers_and_can_overflow():
    one = estimate("fsdp", Mesh(X=16), V5P, 16 * 1024, D, F, efficiency="ideal")
    four = estimate("fsdp", Mesh(X=16), V5P, 16 * 1024, D, F, layers=4, efficiency="ideal")
    assert one.memory["params"] == 2 * (2 * D * F) // 16 + 2 * D * F  # shards + one gathered weight
    assert four.memory["params"] == 4 * 2 * (2 * D * F) // 16 + 2 * D * F  # one gathered weight at a time
    assert four.memory["total"] > one.memory["total"]
    # DDP keeps whole weights on every chip: 400 layers of 2 x 512 MiB do not fit 96 GB
    assert not estimate("ddp", Mesh(X=16), V5P, 16 * 1024, D, F, layers=400, efficiency="ideal").fits


def test_best_split_is_the_fastest_split():
    best = best_split(V5P, 64 * 512, D, F, chips=64, efficiency="ideal")
    for y in (1, 2, 4, 16, 32):
        other = estimate("fsdp_tp", Mesh(X=64 // y, Y=y), V5P, 64 * 512, D, F, efficiency="ideal")
        assert best.step_s <= other.step_s


def test_sweep_covers_every_scheme_and_batch():
    rows = sweep(["ddp", "fsdp", "tp", "fsdp_tp"], "h100", [512, 4096], D, F, chips=16, efficiency="ideal")
    assert [(e.scheme, e.per_chip_batch) for e in rows] == [
        (s, b) for s in ("ddp", "fsdp", "tp", "fsdp_tp") for b in (512.0, 4096.0)
    ]
    fsdp = [e for e in rows if e.scheme == "fsdp"]
    assert fsdp[1].mfu > fsdp[0].mfu  # more tokens per chip, better utilisation


def test_fsdp_tp_critical_batch_on_a_fixed_mesh_matches_estimate():
    c = critical_batch("fsdp_tp", V5P, 40960, mesh=Mesh(X=256, Y=16))
    assert c.per_chip_batch == pytest.approx(2550 / 32)
    below = estimate("fsdp_tp", Mesh(X=256, Y=16), V5P, 4096 * 78, D, 40960, efficiency="ideal")
    above = estimate("fsdp_tp", Mesh(X=256, Y=16), V5P, 4096 * 81, D, 40960, efficiency="ideal")
    assert (below.bound, above.bound) == ("communication", "compute")


def run(add, cli, argv):
    parser = argparse.ArgumentParser()
    add(parser)
    return cli(parser.parse_args(argv))


def test_cli_estimate(capsys, tmp_path):
    png = tmp_path / "t.png"
    argv = ["--scheme", "fsdp", "--hardware", "tpu-v5p", "--mesh", "X=16", "--per-chip-batch", "2048", "--layers", "2"]
    argv += ["--breakdown", "--critical", "--png", str(png)]
    assert run(add_estimate_arguments, cli_estimate, argv) == 0
    out = capsys.readouterr().out
    assert "communication-bound" in out
    assert "compute-bound above 2550.0 tokens per chip" in out
    assert "reduce_scatter" in out
    assert png.exists()


def test_cli_sweep(capsys):
    argv = ["--hardware", "h100", "--chips", "8", "--schemes", "ddp,tp", "--batches", "1024,4096"]
    assert run(add_sweep_arguments, cli_sweep, argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + 4
    assert lines[3].split()[0] == "ddp" and lines[3].split()[-1] == "compute"


def test_cli_critical_lists_the_splits(capsys):
    argv = ["--scheme", "fsdp_tp", "--hardware", "tpu-v5p", "--chips", "256"]
    assert run(add_critical_arguments, cli_critical, argv) == 0
    out = capsys.readouterr().out.splitlines()
    # 256 chips on v5p: X = 32 over two ICI axes, Y = 8 on one: 2550 / (8 * 2)
    assert out[0].startswith("fsdp_tp on Mesh(X=32, Y=8) (tpu-v5p): compute-bound above 159.4 tokens per chip")
    assert "  X=16, Y=16: communication-bound at every batch" in out  # 16-way TP: 16 > F / 2550
