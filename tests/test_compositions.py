"""Compositions: data × pipeline × tensor parallel on a 3-axis mesh, data × expert parallel."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardsim as ss
from shardsim import strategies
from shardsim.dtypes import tolerance
from shardsim.strategies import pp

NEW = ["tp_ln", "tp_sp", "pp", "pp_interleaved", "dp_pp", "dp_pp_tp", "ep", "dp_ep"]


def assert_matches(r, name: str, params, x, dout, activation: str, dtype: str, depth: int = 1, **options) -> None:
    want_out, want = strategies.get(name).reference(params, x, dout, activation, **options)
    tol = tolerance(dtype, max(x.shape[0], *np.shape(params["w_in"])[-2:])) * 8 * depth
    for key, got, expected in [("out", r.out, want_out), *((k, r.grads[k], want[k]) for k in want)]:
        scale = float(np.abs(expected).max()) or 1.0
        assert got.shape == expected.shape and float(np.abs(got - expected).max()) <= tol * scale, f"{name} {key}"


# -- data × pipeline × tensor ---------------------------------------------------------------------
@st.composite
def dp_pp_tp_cases(draw):
    name = draw(st.sampled_from(["dp_pp_tp", "dp_pp_tp", "dp_pp"]))
    x, y, z = draw(st.integers(1, 2)), draw(st.integers(1, 3)) if name == "dp_pp_tp" else 1, draw(st.integers(1, 3))
    m = draw(st.integers(1, 3))
    return (
        name,
        (x, y, z),
        m,
        x * m * draw(st.integers(1, 2)),  # B
        y * draw(st.integers(1, 2)),  # D
        y * draw(st.integers(1, 3)),  # F
        z * draw(st.integers(1, 2)),  # layers
        draw(st.sampled_from(["gpipe", "1f1b"])),
        draw(st.sampled_from(["identity", "relu", "gelu"])),
        draw(st.sampled_from(["float32", "float64"])),
        draw(st.integers(0, 2**16)),
    )


@settings(max_examples=30)
@given(dp_pp_tp_cases())
def test_data_pipeline_tensor_equals_the_single_device_stack(case) -> None:
    name, (xs, ys, zs), m, b, d, f, layers, schedule, activation, dtype, seed = case
    rng = np.random.default_rng(seed)
    params = pp.init(d, f, seed=seed, dtype=dtype, layers=layers)
    x = rng.standard_normal((b, d)).astype(dtype)
    dout = rng.standard_normal((b, d)).astype(dtype)
    mesh = ss.Mesh(X=xs, Y=ys, Z=zs) if name == "dp_pp_tp" else ss.Mesh(X=xs, Z=zs)
    r = ss.run_strategy(name, mesh, params, x, dout, activation=activation, schedule=schedule, microbatches=m)
    assert r.axes == ({"data": "X", "model": "Y", "pipe": "Z"} if name == "dp_pp_tp" else {"data": "X", "pipe": "Z"})
    assert_matches(r, name, params, x, dout, activation, dtype, depth=layers)


X, Y, Z, M, B, D, F, L = 2, 2, 3, 4, 16, 8, 8, 6
ITEM = 8


@pytest.fixture(scope="module")
def three_d() -> ss.strategies.StrategyResult:
    rng = np.random.default_rng(0)
    params = pp.init(D, F, seed=0, dtype="float64", layers=L)
    x, dout = rng.standard_normal((B, D)), rng.standard_normal((B, D))
    return ss.run_strategy("dp_pp_tp", ss.Mesh(X=X, Y=Y, Z=Z), params, x, dout, activation="relu", microbatches=M)


def test_3d_layouts(three_d) -> None:
    assert three_d.layouts["x"] == "[B_X, D_Y]"
    assert three_d.layouts["w_in"] == three_d.layouts["dw_in"] == "[L_Z, D, F_Y]"
    assert three_d.layouts["w_out"] == "[L_Z, F_Y, D]"


def test_3d_each_layer_is_the_tp_scheme_per_microbatch(three_d) -> None:
    t = three_d.trace
    for ph, pair in (
        ("forward", [("all_gather", "In"), ("reduce_scatter", "Out")]),
        ("backward", [("all_gather", "dOut"), ("reduce_scatter", "dIn")]),
    ):
        within = [(e.op, e.label) for e in t if e.phase == ph and e.axes == ("Y",)]
        assert within == pair * (M * L)  # layer after layer, microbatch after microbatch
        stage_of = [e.where for e in t if e.phase == ph and e.axes == ("Y",)]
        assert {s: stage_of.count(s) for s in set(stage_of)} == {f"Z{s}": 2 * M * L // Z for s in range(Z)}


def test_3d_stages_send_a_tensor_parallel_shard_of_the_activation(three_d) -> None:
    """Narayanan et al. §4.1 scatter/gather: a stage sends b·s·h/t, not b·s·h, per microbatch."""
    sends = [e for e in three_d.trace if e.op == "ppermute"]
    assert len(sends) == 2 * M * (Z - 1)
    b = B // X // M
    assert {e.sent_bytes for e in sends} == {b * (D // Y) * ITEM}


def test_3d_data_parallel_allreduce_once_after_the_flush(three_d) -> None:
    events = list(three_d.trace)
    ars = [i for i, e in enumerate(events) if e.op == "all_reduce"]
    assert len(ars) == 2 * L and {events[i].axes for i in ars} == {("X",)}
    last_item = max(i for i, e in enumerate(events) if e.op in ("ppermute", "reduce_scatter", "matmul"))
    assert min(ars) > last_item  # after every microbatch's backward: gradients accumulated first
    assert {events[i].sent_bytes for i in ars} == {2 * (X - 1) * D * (F // Y) * ITEM // X}


def test_3d_each_chip_holds_its_share_of_the_weights_and_gradients(three_d) -> None:
    share = 2 * (L // Z) * D * (F // Y) * ITEM
    assert (three_d.memory["params"] == share).all() and (three_d.memory["grads"] == share).all()


def test_3d_each_chip_does_its_share_of_the_flops(three_d) -> None:
    flops: dict[str, int] = {}
    for e in three_d.trace:
        if e.op == "matmul":
            flops[e.where] = flops.get(e.where, 0) + e.flops
    assert flops == {f"Z{s}": 12 * B * D * F * L // (X * Y * Z) for s in range(Z)}


# -- data × expert ----------------------------------------------------------------------------------
def test_dp_ep_reduces_the_router_over_both_axes_and_the_experts_over_data() -> None:
    from shardsim import moe

    params = moe.init(4, 8, seed=1, dtype="float64", experts=4)
    rng = np.random.default_rng(1)
    x, dout = rng.standard_normal((16, 4)), rng.standard_normal((16, 4))
    r = ss.run_strategy("dp_ep", ss.Mesh(X=2, Y=2), params, x, dout, activation="gelu", top_k=2)
    assert r.layouts["x"] == "[T_XY, D]" and r.layouts["w_in"] == "[E_Y, D, F]"
    assert [(op, ax) for op, ax, _ in r.trace.steps("backward") if op != "matmul"] == [
        ("all_to_all", "Y"),
        ("all_to_all", "Y"),
        ("all_reduce", "XY"),  # router: replicated everywhere, tokens split over X and Y
        ("all_reduce", "X"),  # each expert: replicated over X
        ("all_reduce", "X"),
    ]
    assert_matches(r, "dp_ep", params, x, dout, "gelu", "float64", top_k=2, groups=4)


# -- every new scheme through run_strategy with its own init and defaults --------------------------
@pytest.mark.parametrize("name", NEW)
def test_run_strategy_runs_every_new_scheme_with_its_defaults(name: str) -> None:
    scheme = strategies.get(name)
    sizes = {"data": 2, "model": 2, "pipe": 2, "expert": 2}
    axes = {"data": "X", "model": "Y", "pipe": "Z", "expert": "Y"}
    mesh = ss.Mesh({axes[r]: sizes[r] for r in scheme.roles})
    params = scheme.init(8, 16, seed=0, dtype="float32")
    rng = np.random.default_rng(0)
    tokens = 4 * math.prod(mesh.shape)
    x = rng.standard_normal((tokens, 8)).astype(np.float32)
    dout = rng.standard_normal((tokens, 8)).astype(np.float32)
    r = ss.run_strategy(name, mesh, params, x, dout, activation="relu")
    assert r.scheme == name and set(r.axes) == set(scheme.roles)
    depth = int(np.prod(np.shape(params["w_in"])[:-2])) if name.startswith(("pp", "dp_pp")) else 1
    assert_matches(r, name, params, x, dout, "relu", "float32", depth=depth)
    assert name in strategies.names()


@pytest.mark.parametrize("name", NEW)
def test_shape_only_runs_trace_the_same_program(name: str) -> None:
    scheme = strategies.get(name)
    axes = {"data": "X", "model": "Y", "pipe": "Z", "expert": "Y"}
    mesh_of = lambda: ss.Mesh({axes[r]: 2 for r in scheme.roles})  # noqa: E731
    params = scheme.init(8, 16, seed=0, dtype="float32")
    x = np.ones((16, 8), np.float32)
    data = ss.run_strategy(name, mesh_of(), params, x, x)
    spec = ss.ShapeDtype(x.shape, "float32")
    only = ss.run_strategy(
        name, mesh_of(), {k: ss.ShapeDtype(v.shape, "float32") for k, v in params.items()}, spec, spec
    )
    assert only.out is None

    def program(t):
        return [(e.op, e.axes, e.label, e.after, e.phase, e.sent_bytes, e.flops, e.where) for e in t]

    assert program(only.trace) == program(data.trace)
    for c in data.memory:
        np.testing.assert_array_equal(only.memory[c], data.memory[c])
