"""ZeRO stages 0-3: the ledger against the closed forms, and the bytes each chip moves per step."""

from __future__ import annotations

import numpy as np
import pytest

import shardsim as ss
from shardsim import formulas, mlp, strategies
from shardsim.strategies import zero
from shardsim.training import SGD, Adam, Trainer

STAGES = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}
B, D, F, L, N = 8, 16, 32, 3, 4
PSI = L * 2 * D * F  # parameters of the stack


def data(dtype: str = "float32"):
    rng = np.random.default_rng(7)
    params = mlp.init_stack(L, D, F, seed=2)
    x = rng.standard_normal((B, D)).astype(dtype)
    return params, x, rng.standard_normal((B, D)).astype(dtype)


def step(name: str, precision: str, optimizer=None, mesh=None, **kw):
    params, x, y = data()
    trainer = Trainer(name, mesh or ss.Mesh(X=N), params, optimizer or Adam(), precision=precision, **kw)
    return trainer.step(x, y)


# -- memory: the ledger measures what the formulas say -------------------------------------------
@pytest.mark.parametrize("precision", ["mixed", "fp32"])
@pytest.mark.parametrize("optimizer", ["adam", "momentum", "sgd"])
@pytest.mark.parametrize("name", list(STAGES))
def test_ledger_model_state_equals_the_closed_form(name: str, precision: str, optimizer: str) -> None:
    """Live bytes per chip by category once the backward pass is done, on every chip."""
    opt = {"adam": Adam(), "momentum": SGD(momentum=0.9), "sgd": SGD()}[optimizer]
    r = step(name, "bf16" if precision == "mixed" else "fp32", opt)
    want = formulas.model_state_breakdown(PSI, N, STAGES[name], precision, optimizer)
    for category, nbytes in want.items():
        assert (r.model_state[category] == nbytes).all(), f"{name} {category}: {r.model_state[category]} != {nbytes}"


def test_mixed_precision_adam_is_2_2_12_bytes_per_parameter() -> None:
    r = step("ddp", "bf16", mesh=ss.Mesh(X=1))
    per_param = {c: int(r.model_state[c][0]) / PSI for c in ("params", "grads", "optimizer")}
    assert per_param == {"params": 2, "grads": 2, "optimizer": 12}
    assert sum(per_param.values()) == 16


@pytest.mark.parametrize(
    "name,mesh,axes",
    [("tp", ss.Mesh(Y=4), {"model": 4}), ("fsdp_tp", ss.Mesh(X=2, Y=2), {"data": 2, "model": 2})],
)
def test_model_parallel_schemes_shard_all_state_like_their_weights(name, mesh, axes) -> None:
    r = step(name, "bf16", mesh=mesh)
    want = formulas.scheme_model_state(name, PSI, axes)
    for category, nbytes in want.items():
        assert (r.model_state[category] == nbytes).all(), category


def test_stage_2_frees_each_full_gradient_as_the_backward_sweeps() -> None:
    """zero1 keeps every block's full gradient until the step; zero2 never more than one."""
    full = D * F * 4  # one weight's full float32 gradient
    one = step("zero1", "fp32")
    two = step("zero2", "fp32")
    # zero1's peak: every block's two full gradients, plus block 0's two slices while they are
    # ReduceScattered (its full gradients die once both slices exist)
    assert (one.memory["grads"] == 2 * L * full + 2 * full // N).all()
    assert (two.memory["grads"] == 2 * L * full // N).all()
    assert (two.memory["total"] < one.memory["total"]).all()


def test_fsdp_weight_peak_is_all_slices_plus_one_gathered_weight() -> None:
    """FSDP gathers and frees layer by layer: never more than one block's weights whole."""
    r = step("zero3", "fp32")
    weight = D * F * 4
    slices = 2 * L * weight // N
    assert (r.memory["params"] == slices + weight).all()  # less than one block's two full weights


# -- communication: 2Ψ for stages 0-2, 3Ψ for stage 3 -------------------------------------------
@pytest.mark.parametrize("precision,dtype", [("fp32", "float32"), ("bf16", "bfloat16")])
@pytest.mark.parametrize("name", list(STAGES))
def test_bytes_each_chip_sends_per_step(name: str, precision: str, dtype: str) -> None:
    """Compared: the sum of ``sent_bytes`` over the trace events of the forward, backward and
    optimizer phases (every collective on weights or gradients), against Ψ elements × 2 (stages
    0-2) or × 3 (stage 3) × the dtype's bytes × (N-1)/N — the ring's share each chip sends.
    The loss phase's AllReduce of one float32 number is left out (it is not model state)."""
    r = step(name, precision)
    moved = sum(r.trace.total("sent_bytes", phase=p) for p in ("forward", "backward", "optimizer"))
    want = formulas.zero_comm_bytes(PSI, N, STAGES[name], dtype)
    assert moved == want
    itemsize = 2 if precision == "bf16" else 4
    assert moved == formulas.zero_comm_elements(PSI, STAGES[name]) * itemsize * (N - 1) / N
    assert r.trace.total("sent_bytes", phase="loss") == 2 * (N - 1) * 4 // N


def test_stages_0_to_2_move_what_one_allreduce_moves() -> None:
    sent = {name: step(name, "fp32").trace.total("sent_bytes") for name in STAGES}
    assert sent["ddp"] == sent["zero1"] == sent["zero2"]
    loss = 2 * (N - 1) * 4 // N
    assert (sent["zero3"] - loss) * 2 == (sent["ddp"] - loss) * 3


# -- the programs ------------------------------------------------------------------------------
def test_where_each_stage_reduces_its_gradients() -> None:
    rs, ag, ar = ("reduce_scatter", ("X",)), ("all_gather", ("X",)), ("all_reduce", ("X",))
    progs = {name: step(name, "fp32").trace for name in STAGES}
    assert progs["ddp"].collectives("backward") == [ar, ar] * L
    assert progs["ddp"].collectives("optimizer") == []
    assert progs["zero1"].collectives("backward") == []  # full gradients kept whole
    assert progs["zero1"].collectives("optimizer") == [rs, rs, ag, ag] * L
    assert progs["zero2"].collectives("backward") == [rs, rs] * L  # reduced as the backward sweeps
    assert progs["zero2"].collectives("optimizer") == [ag, ag] * L
    assert progs["zero3"].collectives("forward") == [ag, ag] * L
    assert progs["zero3"].collectives("backward") == [ag, rs, ag, rs] * L
    assert progs["zero3"].collectives("optimizer") == []


def test_run_strategy_zero1_reduces_at_the_end_of_the_backward_pass() -> None:
    params, x, y = data("float64")
    params = {k: v.astype("float64") for k, v in params.items()}
    r = ss.run_strategy("zero1", ss.Mesh(X=2), params, x, y, activation="gelu")
    n_rs = 2 * L
    assert r.trace.collectives("backward") == [("reduce_scatter", ("X",))] * n_rs
    assert r.layouts["dw_in"] == "[D_X, F]" and r.layouts["w_in"] == "[D, F]"
    want = mlp.stack_backward(params, x, y, "gelu")
    for k in ("w_in", "w_out", "x"):
        np.testing.assert_allclose(r.grads[k], want[k], rtol=1e-12, atol=1e-14)


def test_registry_names_and_zero3_is_fsdp() -> None:
    assert {"zero1", "zero2", "zero3"} <= set(strategies.names())
    z3, fsdp = strategies.get("zero3"), strategies.get("fsdp")
    assert (z3.forward, z3.backward, z3.layouts) == (fsdp.forward, fsdp.backward, fsdp.layouts)
    assert [zero.stage(strategies.get(n)) for n in ("ddp", "zero1", "zero2", "zero3", "fsdp", "tp")] == [
        0,
        1,
        2,
        3,
        3,
        None,
    ]
