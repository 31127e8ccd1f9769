"""Sequence parallelism vs tensor parallelism on LayerNorm → MLP → residual: values, memory, bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardsim as ss
from finite_differences import numeric_grad
from shardsim import norm, strategies
from shardsim.array import shard
from shardsim.dtypes import tolerance
from shardsim.strategies.base import Ctx
from shardsim.tracing import phase


# -- the hand-written reference against finite differences ---------------------------------------
@pytest.mark.parametrize("activation", ["identity", "relu", "gelu"])
def test_reference_backward_matches_finite_differences(activation: str) -> None:
    rng = np.random.default_rng(0)
    params = norm.init(5, 7, seed=1, dtype="float64")
    x = rng.standard_normal((4, 5))
    dout = rng.standard_normal((4, 5))
    grads = norm.block_backward(params, x, dout, activation)
    loss = lambda: float((norm.block_forward(params, x, activation) * dout).sum())  # noqa: E731
    for name, value in {"x": x, **params}.items():
        np.testing.assert_allclose(grads[name], numeric_grad(loss, value), rtol=1e-6, atol=1e-7, err_msg=name)


def test_layer_norm_backward_matches_finite_differences() -> None:
    rng = np.random.default_rng(1)
    x, gamma, beta, dy = (
        rng.standard_normal((3, 6)),
        rng.standard_normal(6),
        rng.standard_normal(6),
        rng.standard_normal((3, 6)),
    )
    dx, dgamma, dbeta = norm.layer_norm_backward(x, gamma, dy)
    loss = lambda: float((norm.layer_norm(x, gamma, beta) * dy).sum())  # noqa: E731
    for got, value in ((dx, x), (dgamma, gamma), (dbeta, beta)):
        np.testing.assert_allclose(got, numeric_grad(loss, value), rtol=1e-6, atol=1e-8)
    y = norm.layer_norm(x, np.ones(6), np.zeros(6))
    np.testing.assert_allclose(y.mean(axis=1), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(axis=1), 1 / (1 + norm.EPS / x.var(axis=1)), rtol=1e-12)


# -- both schemes against the reference ---------------------------------------------------------
@st.composite
def block_cases(draw):
    t = draw(st.integers(1, 4))
    return (
        draw(st.sampled_from(["tp_ln", "tp_sp"])),
        t,
        t * draw(st.integers(1, 3)),  # S
        draw(st.integers(2, 6)),  # D
        t * draw(st.integers(1, 3)),  # F
        draw(st.sampled_from(["identity", "relu", "gelu"])),
        draw(st.sampled_from(["float32", "float64"])),
        draw(st.booleans()),
        draw(st.integers(0, 2**16)),
    )


@settings(max_examples=30)
@given(block_cases())
def test_schemes_equal_the_single_device_block(case) -> None:
    name, t, s, d, f, activation, dtype, regather, seed = case
    rng = np.random.default_rng(seed)
    params = norm.init(d, f, seed=seed, dtype=dtype)
    x = rng.standard_normal((s, d)).astype(dtype)
    dout = rng.standard_normal((s, d)).astype(dtype)
    r = ss.run_strategy(name, ss.Mesh(Y=t), params, x, dout, activation=activation, regather=regather)
    want_out, want = strategies.get(name).reference(params, x, dout, activation)
    tol = tolerance(dtype, max(s, d, f)) * 8  # LayerNorm, two matmuls
    for key, got, expected in [("out", r.out, want_out), *((k, r.grads[k], want[k]) for k in want)]:
        scale = float(np.abs(expected).max()) or 1.0
        assert got.dtype == expected.dtype, key
        assert float(np.abs(got - expected).max()) <= tol * scale, f"{name} {key}"


# -- memory: the LayerNorm/residual activations fall by the TP degree ----------------------------
S, D, F, T = 16, 8, 16, 4
ITEM = 8
LN_PART = ("In", "LN out", "mu", "rstd")  # the LN input (= the residual's), its output, its statistics


def forward_only(name: str, t: int = T, **options):
    """Run a scheme's forward on a fresh mesh and keep what it stored (as the backward would)."""
    scheme = strategies.get(name)
    mesh = ss.Mesh(Y=t)
    ctx = Ctx(axes={"model": "Y"}, activation="gelu", options=options)
    lay = scheme.layouts(ctx)
    rng = np.random.default_rng(0)
    params = norm.init(D, F, dtype="float64")
    x = shard(rng.standard_normal((S, D)), mesh, lay["x"], label="In")
    ps = {k: shard(v, mesh, lay[k], label=k, category="params") for k, v in params.items()}
    with phase("forward"):
        out, saved = scheme.forward(ctx, x, ps)
    return mesh, saved, out


def ledger_bytes(mesh: ss.Mesh, labels: tuple[str, ...]) -> int:
    """Per-chip bytes of the live values with these labels, as chip 0's ledger lists them."""
    rows = mesh.memory.largest((0,), n=100)
    assert {lbl for lbl, *_ in rows} >= set(labels)
    return sum(b for lbl, _, cat, b in rows if lbl in labels and cat == "activations")


def test_ledger_sequence_parallel_divides_the_layernorm_and_residual_memory_by_t() -> None:
    mesh_tp, saved_tp, _ = forward_only("tp_ln")  # the stored values stay alive, as for the backward
    mesh_sp, saved_sp, _ = forward_only("tp_sp")
    assert set(saved_tp) == set(saved_sp) == {"LN in", "mu", "rstd", "LN out", "H_pre", "H"}
    tp = ledger_bytes(mesh_tp, LN_PART)
    sp = ledger_bytes(mesh_sp, LN_PART)
    assert tp == (2 * S * D + 2 * S) * ITEM  # replicated: every chip holds every token's copy
    assert sp * T == tp  # split over the sequence: 1/t of it (Korthikanti et al. 2022, Table 2)
    # the MLP's own activations are split over F either way
    assert ledger_bytes(mesh_tp, ("H_pre", "H")) == ledger_bytes(mesh_sp, ("H_pre", "H")) == 2 * S * F // T * ITEM
    assert (mesh_sp.memory.live("activations") < mesh_tp.memory.live("activations")).all()


def test_storing_the_gathered_layernorm_output_costs_the_full_copy() -> None:
    _, saved, _ = forward_only("tp_sp", regather=False)
    assert saved["LN out (gathered)"].local_nbytes == S * D * ITEM
    assert "LN out" not in saved


# -- the trace: an AllGather/ReduceScatter pair for each AllReduce, the same bytes --------------
def run(name: str, **options) -> ss.strategies.StrategyResult:
    rng = np.random.default_rng(1)
    params = norm.init(D, F, dtype="float64")
    x, dout = rng.standard_normal((S, D)), rng.standard_normal((S, D))
    return ss.run_strategy(name, ss.Mesh(Y=T), params, x, dout, activation="relu", **options)


def collectives(r, ph: str) -> list[tuple[str, str, int]]:
    return [(e.op, e.label, e.sent_bytes) for e in r.trace if e.is_collective and e.phase == ph]


def test_trace_sequence_parallel_replaces_each_allreduce_by_allgather_and_reducescatter() -> None:
    tp, sp = run("tp_ln"), run("tp_sp")
    full = S * D * ITEM  # the [S, D] activation
    ar = 2 * (T - 1) * full // T
    ag = rs = (T - 1) * full // T
    assert collectives(tp, "forward") == [("all_reduce", "Z", ar)]  # g
    assert collectives(sp, "forward") == [("all_gather", "LN out", ag), ("reduce_scatter", "Z", rs)]  # g, ḡ
    assert collectives(tp, "backward") == [("all_reduce", "dY", ar)]  # f
    lnw = 2 * (T - 1) * D * ITEM // T  # the LayerNorm weights' gradients, [D] each
    assert collectives(sp, "backward") == [
        ("all_gather", "dOut", ag),  # ḡ backward
        ("all_gather", "LN out", ag),  # Y stored split: gathered again
        ("reduce_scatter", "dY", rs),  # g backward
        ("all_reduce", "dgamma", lnw),
        ("all_reduce", "dbeta", lnw),
    ]
    for ph in ("forward", "backward"):  # the pair moves exactly the AllReduce's bytes
        pair = sum(b for op, lbl, b in collectives(sp, ph) if lbl in ("LN out", "Z", "dOut", "dY"))
        extra = ag if ph == "backward" else 0
        assert pair - extra == sum(b for *_, b in collectives(tp, ph)) == ar


def test_without_regather_the_backward_has_only_the_pair() -> None:
    r = run("tp_sp", regather=False)
    assert [op for op, *_ in collectives(r, "backward")] == ["all_gather", "reduce_scatter", "all_reduce", "all_reduce"]


def test_layouts_and_errors() -> None:
    r = run("tp_sp")
    assert r.layouts["x"] == "[S_Y, D]" and r.layouts["dgamma"] == "[D]" and r.layouts["w_in"] == "[D, F_Y]"
    params = norm.init(D, F)
    with pytest.raises(ss.ShardingError, match=r"gamma must have shape \(8,\)"):
        ss.run_strategy("tp_sp", ss.Mesh(Y=2), {**params, "gamma": np.ones(3)}, np.ones((4, D)), np.ones((4, D)))
    with pytest.raises(ss.DivisibilityError, match="dimension S of size 6"):
        ss.run_strategy("tp_sp", ss.Mesh(Y=4), params, np.ones((6, D)), np.ones((6, D)))
