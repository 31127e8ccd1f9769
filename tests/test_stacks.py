"""Deep stacks: every scheme's per-layer steps, layer after layer, against the reference stack."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardsim as ss
from shardsim import mlp
from shardsim.dtypes import tolerance
from strategies_core import scheme_meshes


@st.composite
def stack_cases(draw):
    name, sizes, shape = draw(scheme_meshes())
    return dict(
        name=name,
        sizes=sizes,
        shape=shape,
        layers=draw(st.integers(1, 4)),
        activation=draw(st.sampled_from(["identity", "relu", "gelu"])),
        residual=draw(st.booleans()),
        dtype=draw(st.sampled_from(["float32", "float64"])),
        seed=draw(st.integers(0, 2**16)),
    )


def stack_inputs(b: int, d: int, f: int, layers: int, dtype: str, seed: int):
    rng = np.random.default_rng(seed)
    params = mlp.init_stack(layers, d, f, seed=seed, dtype=dtype)
    return params, rng.standard_normal((b, d)).astype(dtype), rng.standard_normal((b, d)).astype(dtype)


@settings(max_examples=60)
@given(stack_cases())
def test_every_scheme_runs_a_stack_like_the_reference(case) -> None:
    b, d, f = case["shape"]
    layers, act, res, dtype = case["layers"], case["activation"], case["residual"], case["dtype"]
    params, x, dout = stack_inputs(b, d, f, layers, dtype, case["seed"])
    r = ss.run_strategy(case["name"], ss.Mesh(case["sizes"]), params, x, dout, activation=act, residual=res)
    want = {"out": mlp.stack_forward(params, x, act, res), **mlp.stack_backward(params, x, dout, act, res)}
    got = {"out": r.out, **r.grads}
    # each block chains 3 matmuls each way; errors add up block after block
    tol = tolerance(dtype, max(b, d, f)) * (4 * layers + 2)
    for k, w in want.items():
        assert got[k].shape == w.shape and got[k].dtype == w.dtype, k
        scale = float(np.abs(w).max()) or 1.0
        err = float(np.abs(got[k] - w).max())
        assert err <= tol * scale, f"{case['name']} {k}: {err:.3g} > {tol * scale:.3g}"


def test_each_layer_is_sharded_with_the_scheme_layout() -> None:
    params, x, dout = stack_inputs(4, 8, 16, 3, "float32", 0)
    r = ss.run_strategy("fsdp_tp", ss.Mesh(X=2, Y=2), params, x, dout)
    assert r.layouts["w_in"] == "[D_X, F_Y]" and r.layouts["dw_out"] == "[F_Y, D_X]"
    labels = [label for op, _, label in r.trace.steps("forward") if op == "all_gather" and label.startswith("W_in")]
    assert labels == ["W_in.0", "W_in.1", "W_in.2"]
    assert r.grads["w_in"].shape == (3, 8, 16) and r.grads["w_out"].shape == (3, 16, 8)


def test_fsdp_gathers_and_frees_layer_by_layer() -> None:
    """Weight peak: every layer's slices plus one gathered weight (never a second one)."""
    layers, b, d, f, n = 4, 8, 16, 32, 4
    params, x, dout = stack_inputs(b, d, f, layers, "float32", 1)
    r = ss.run_strategy("fsdp", ss.Mesh(X=n), params, x, dout, activation="relu")
    weight = d * f * 4
    assert (r.memory["params"] == layers * 2 * weight // n + weight).all()
    ddp = ss.run_strategy("ddp", ss.Mesh(X=n), params, x, dout, activation="relu")
    assert (ddp.memory["params"] == layers * 2 * weight).all()


def test_collectives_repeat_per_layer() -> None:
    params, x, dout = stack_inputs(4, 8, 8, 3, "float32", 2)
    one = ss.run_strategy("tp", ss.Mesh(Y=2), mlp.layer(params, 0), x, dout).trace
    three = ss.run_strategy("tp", ss.Mesh(Y=2), params, x, dout).trace
    assert three.collectives("forward") == one.collectives("forward") * 3
    assert three.collectives("backward") == one.collectives("backward") * 3


def test_residual_one_block_adds_its_input() -> None:
    params, x, dout = stack_inputs(4, 8, 8, 1, "float64", 3)
    r = ss.run_strategy("ddp", ss.Mesh(X=2), mlp.layer(params, 0), x, dout, residual=True)
    np.testing.assert_allclose(r.out, x + mlp.forward(mlp.layer(params, 0), x), rtol=1e-13)
    np.testing.assert_allclose(r.grads["x"], dout + mlp.backward(mlp.layer(params, 0), x, dout)["x"], rtol=1e-13)


def test_shape_only_stack() -> None:
    params, x, dout = stack_inputs(4, 8, 16, 2, "float32", 4)
    data = ss.run_strategy("zero2", ss.Mesh(X=2), params, x, dout)
    spec = {k: ss.ShapeDtype(v.shape, "float32") for k, v in params.items()}
    io = ss.ShapeDtype(x.shape, "float32")
    only = ss.run_strategy("zero2", ss.Mesh(X=2), spec, io, io)
    assert only.out is None
    assert [(e.op, e.label, e.sent_bytes) for e in only.trace] == [(e.op, e.label, e.sent_bytes) for e in data.trace]


def test_params_must_agree_on_depth() -> None:
    params, x, dout = stack_inputs(4, 8, 16, 2, "float32", 5)
    with pytest.raises(ss.ShardingError, match=r"same L >= 1"):
        ss.run_strategy("ddp", ss.Mesh(X=2), {"w_in": params["w_in"], "w_out": params["w_out"][0]}, x, dout)
    with pytest.raises(ss.ShardingError, match=r"same L >= 1"):
        ss.run_strategy("ddp", ss.Mesh(X=2), {"w_in": params["w_in"][:1], "w_out": params["w_out"]}, x, dout)
