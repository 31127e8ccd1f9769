"""Labels the command line prints agree with the numbers beside them."""

from __future__ import annotations

import re

import pytest

import shardsim
from shardsim import Mesh, cli, cost


def test_pp_header_shows_the_real_weight_shape(capsys) -> None:
    assert cli.main(["demo", "--scheme", "pp"]) == 0
    assert "B=2 tokens, d_model=4, d_ff=8, W_in (4, 4, 8), float32" in capsys.readouterr().out


def test_backward_matmuls_print_their_transposes(capsys) -> None:
    assert cli.main(["demo", "--scheme", "ddp"]) == 0
    backward = capsys.readouterr().out.split("Backward:", 1)[1].split("\n\n", 1)[0]
    labels = [re.split(r"\s{2,}", line.strip())[3] for line in backward.splitlines()[2:]]
    # ddp.py: h.T @ dout, dout @ w_out.T, x.T @ dh, dh @ w_in.T
    assert labels == ["H_pre.T @ dOut", "dW_out", "dOut @ W_out.T", "In.T @ dH", "dW_in", "dH @ W_in.T"]


def test_comm_parts_add_up_and_leave_out_comm_behind_comm() -> None:
    est = cost.estimate("fsdp_tp", Mesh(X=16, Y=8), "tpu-v5p", 65536, 8192, 32768, 4)
    parts = est.timeline.comm_parts()
    assert sum(parts.values()) == pytest.approx(est.comm_s, rel=1e-9)
    assert parts["behind other comm"] > 0  # X and Y collectives overlap with compute idle
    assert parts["under compute"] == pytest.approx(est.comm_hidden_s - parts["behind other comm"], rel=1e-9)
    assert f"behind other comm {parts['behind other comm'] * 1e3:.4g}" in est.summary()


def test_no_float_noise_in_the_summary() -> None:
    est = cost.estimate("tp", Mesh(Y=16), "tpu-v5p", 1024, 8192, 32768)
    assert "e-1" not in est.summary() and "under compute 0," in est.summary()


@pytest.mark.parametrize(
    ("scheme", "mesh", "batch"),
    [("fsdp_tp", Mesh(X=16, Y=8), 65536), ("fsdp", Mesh(X=16), 16 * 2048), ("fsdp", Mesh(X=16), 16 * 4096)],
)
def test_the_bound_agrees_with_the_numbers_printed_beside_it(scheme, mesh, batch) -> None:
    est = cost.estimate(scheme, mesh, "tpu-v5p", batch, 8192, 32768, 2)
    line = est.summary().splitlines()[2]
    comm, sign, flops = re.search(r"comm \S+ ([\d.]+) ms (<=|>) FLOPs ([\d.]+) ms", line).groups()
    assert (sign == ">") == (float(comm) > float(flops)) == (est.bound == "communication")
    assert f"{est.bound}-bound" in line


def test_flops_print_the_same_way_in_traces_and_the_demo(capsys) -> None:
    mesh = Mesh(X=2)
    x = shardsim.shard(shardsim.ShapeDtype((64, 16)), mesh, "B_X D", label="In")
    w = shardsim.shard(shardsim.ShapeDtype((16, 32)), mesh, "D F", label="W")
    with shardsim.trace() as t:
        x @ w
    assert "32,768" in str(t) and "e+" not in str(t)  # 2 x 32 tokens x 16 x 32 FLOPs per chip
