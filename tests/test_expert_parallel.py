"""Expert parallelism: the single-device MoE, the AllToAll bytes, capacity drops token for token."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardsim as ss
from finite_differences import numeric_grad
from shardsim import moe, strategies
from shardsim.array import shard
from shardsim.dtypes import tolerance
from shardsim.strategies import ep
from shardsim.strategies.base import Ctx
from shardsim.tracing import phase


# -- the hand-written reference against finite differences ---------------------------------------
@pytest.mark.parametrize("top_k,capacity,groups", [(2, None, 1), (1, 2, 2), (2, 1, 3), (3, 2, 1)])
def test_reference_backward_matches_finite_differences(top_k: int, capacity: int | None, groups: int) -> None:
    rng = np.random.default_rng(top_k * 10 + groups)
    params = moe.init(4, 5, seed=3, dtype="float64", experts=4)
    x = rng.standard_normal((6, 4))
    dout = rng.standard_normal((6, 4))
    kw = {"top_k": top_k, "capacity": capacity, "groups": groups}
    grads = moe.backward(params, x, dout, "gelu", **kw)
    routed = moe.route(params, x, **kw)

    def loss() -> float:
        probed = moe.route(params, x, **kw)  # no probe changes which pairs are routed and kept
        np.testing.assert_array_equal(probed["experts"], routed["experts"])
        np.testing.assert_array_equal(probed["kept"], routed["kept"])
        return float((moe.forward(params, x, "gelu", **kw) * dout).sum())

    for name, value in {"x": x, **params}.items():
        np.testing.assert_allclose(grads[name], numeric_grad(loss, value), rtol=1e-6, atol=1e-8, err_msg=name)


def test_reference_drops_in_token_order_per_group() -> None:
    params = moe.init(4, 4, experts=2)
    x = np.ones((6, 4))  # every token picks the same experts
    kept = moe.route(params, x, top_k=1, capacity=2, groups=2)["kept"][:, 0]
    np.testing.assert_array_equal(kept, [True, True, False, True, True, False])


# -- the sharded schemes against the reference ---------------------------------------------------
@st.composite
def moe_cases(draw):
    name = draw(st.sampled_from(["ep", "ep", "dp_ep"]))
    n = draw(st.integers(1, 4))
    x_size = draw(st.integers(1, 2)) if name == "dp_ep" else 1
    experts = n * draw(st.integers(1, 3))
    per_chip_groups = draw(st.integers(1, 2))
    per_group = draw(st.integers(1, 4))
    capacity = draw(st.one_of(st.none(), st.integers(1, per_group)))
    return (
        name,
        n,
        x_size,
        experts,
        draw(st.integers(1, min(3, experts))),
        per_chip_groups,
        per_group,
        capacity,
        draw(st.sampled_from(["identity", "relu", "gelu"])),
        draw(st.sampled_from(["float32", "float64"])),
        draw(st.integers(0, 2**16)),
    )


@settings(max_examples=30)
@given(moe_cases())
def test_expert_parallel_equals_the_single_device_moe(case) -> None:
    name, n, x_size, experts, top_k, per_chip, per_group, capacity, activation, dtype, seed = case
    shards = n * x_size
    tokens = shards * per_chip * per_group
    d, f = 4, 6
    rng = np.random.default_rng(seed)
    params = moe.init(d, f, seed=seed, dtype=dtype, experts=experts)
    x = rng.standard_normal((tokens, d)).astype(dtype)
    dout = rng.standard_normal((tokens, d)).astype(dtype)
    options = {"top_k": top_k, "groups": shards * per_chip}
    if capacity is not None:
        options["capacity"] = capacity
    mesh = ss.Mesh(X=x_size, Y=n) if name == "dp_ep" else ss.Mesh(Y=n)
    r = ss.run_strategy(name, mesh, params, x, dout, activation=activation, **options)
    want_out, want = strategies.get(name).reference(params, x, dout, activation, **options)
    tol = tolerance(dtype, max(tokens, d, f, experts)) * 8  # router, softmax, two matmuls, a weighted sum
    for key, got, expected in [("out", r.out, want_out), *((k, r.grads[k], want[k]) for k in want)]:
        scale = float(np.abs(expected).max()) or 1.0
        assert float(np.abs(got - expected).max()) <= tol * scale, f"{name} {key}"


# -- the AllToAll bytes ---------------------------------------------------------------------------
ITEM = 8


def balanced(tokens: int, experts: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A router that sends token t to experts t and t+1 (mod E): every expert gets 2·T/E tokens."""
    params = moe.init(experts, 8, seed=0, dtype="float64", experts=experts)
    params["router"] = np.eye(experts)
    x = np.zeros((tokens, experts))
    x[np.arange(tokens), np.arange(tokens) % experts] = 10.0
    x[np.arange(tokens), (np.arange(tokens) + 1) % experts] = 5.0
    return params, x


@pytest.mark.parametrize("n,experts,per_chip", [(2, 4, 8), (4, 4, 4), (4, 8, 16), (1, 4, 4)])
def test_each_alltoall_moves_k_tokens_times_d_model_times_n_minus_1_over_n(n: int, experts: int, per_chip: int) -> None:
    """At a balanced load with capacity factor 1 a chip's buffer holds exactly its k·T_local
    routed tokens: each AllToAll sends (N-1)/N · k · T_local · D · itemsize bytes per chip."""
    k, tokens = 2, n * per_chip
    params, x = balanced(tokens, experts)
    r = ss.run_strategy("ep", ss.Mesh(Y=n), params, x, x, activation="relu", top_k=k, capacity_factor=1.0, groups=n)
    a2a = [e for e in r.trace if e.op == "all_to_all"]
    assert [(e.phase, e.label) for e in a2a] == [
        ("forward", "Buf"),
        ("forward", "Y"),
        ("backward", "dY"),
        ("backward", "dBuf"),
    ]
    want = (n - 1) * k * per_chip * experts * ITEM // n  # D = experts here
    assert {e.sent_bytes for e in a2a} == {want}
    assert {e.received_bytes for e in a2a} == {want}
    out, _ = strategies.get("ep").reference(params, x, x, "relu", top_k=k, capacity_factor=1.0, groups=n)
    np.testing.assert_allclose(r.out, out, rtol=1e-12, atol=1e-12)
    assert moe.route(params, x, top_k=k, capacity=2 * per_chip // experts, groups=n)["kept"].all()  # no drops


def test_alltoall_bytes_are_the_buffer_e_g_c_d_whatever_the_load() -> None:
    n, experts, tokens, cap, groups = 4, 8, 32, 3, 8
    params = moe.init(4, 8, seed=1, dtype="float64", experts=experts)
    x = np.random.default_rng(2).standard_normal((tokens, 4))
    r = ss.run_strategy("ep", ss.Mesh(Y=n), params, x, x, top_k=2, capacity=cap, groups=groups)
    per_chip_buffer = experts * (groups // n) * cap * 4 * ITEM  # E · G_local · C · D · itemsize
    assert {e.sent_bytes for e in r.trace if e.op == "all_to_all"} == {(n - 1) * per_chip_buffer // n}


# -- capacity: a skewed router drops the same tokens as the reference ---------------------------
def test_skewed_router_drops_exactly_the_reference_tokens() -> None:
    n, experts, tokens, cap, groups = 4, 4, 24, 2, 8
    rng = np.random.default_rng(5)
    params = moe.init(4, 8, seed=5, dtype="float64", experts=experts)
    params["router"][0] = [10.0, 0.0, 0.0, 0.0]  # feature 0 pulls every token to expert 0
    x = rng.standard_normal((tokens, 4))
    x[:, 0] = 5.0
    dout = rng.standard_normal((tokens, 4))
    options = {"top_k": 1, "capacity": cap, "groups": groups}
    ctx = Ctx(axes={"expert": "Y"}, activation="relu", options=options)
    mesh = ss.Mesh(Y=n)
    lay = ep.layouts(ctx)
    xs = shard(x, mesh, lay["x"], label="In")
    ps = {k: shard(v, mesh, lay[k], label=k, category="params") for k, v in params.items()}
    with phase("forward"):
        out, saved = ep.forward(ctx, xs, ps)
    kept = saved["slot"].to_global() >= 0
    want = moe.route(params, x, **options)["kept"]
    per_group = tokens // groups
    first_c = (np.arange(tokens) % per_group < cap)[:, None]
    np.testing.assert_array_equal(want, first_c)  # the first C tokens of each group, in token order
    np.testing.assert_array_equal(kept, want)
    assert kept.sum() == groups * cap < tokens
    np.testing.assert_array_equal(saved["experts"].to_global()[:, 0], 0)
    want_out, want_grads = ep.reference(params, x, dout, "relu", **options)
    np.testing.assert_allclose(out.to_global(), want_out, rtol=1e-12, atol=1e-12)
    assert not out.to_global()[~want[:, 0]].any()  # a dropped token gets nothing from the block
    r = ss.run_strategy("ep", ss.Mesh(Y=n), params, x, dout, activation="relu", **options)
    for k, w in want_grads.items():
        np.testing.assert_allclose(r.grads[k], w, rtol=1e-10, atol=1e-12, err_msg=k)


def test_capacity_needs_the_groups_spelled_out() -> None:
    params = moe.init(4, 8, experts=4)
    x = np.ones((8, 4), np.float32)
    with pytest.raises(ss.ShardingError, match=r"pass groups= .* e\.g\. groups=2"):
        ss.run_strategy("ep", ss.Mesh(Y=2), params, x, x, capacity=1)
    with pytest.raises(ss.ShardingError, match="top_k=5 must be between 1 and the number of experts 4"):
        ss.run_strategy("ep", ss.Mesh(Y=2), params, x, x, top_k=5)
    with pytest.raises(ss.ShardingError, match="groups=3 must be a multiple of the 2 token shards"):
        ss.run_strategy("ep", ss.Mesh(Y=2), params, x, x, groups=3)


def test_trace_forward_is_router_alltoall_experts_alltoall() -> None:
    params = moe.init(4, 8, experts=4)
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    r = ss.run_strategy("ep", ss.Mesh(Y=2), params, x, x, activation="relu")
    assert [(op, label) for op, _, label in r.trace.steps("forward")] == [
        ("matmul", "In @ Router"),  # 1. the router's logits
        ("all_to_all", "Buf"),  # 4. dispatch
        ("matmul", "Buf @ W_in"),  # 5. the experts
        ("matmul", "H @ W_out"),
        ("all_to_all", "Y"),  # 6. back home
    ]
    assert r.trace.collectives("backward") == [
        ("all_to_all", ("Y",)),
        ("all_to_all", ("Y",)),
        ("all_reduce", ("Y",)),  # the router's gradient: each chip summed its own tokens
    ]
    assert r.layouts["w_in"] == "[E_Y, D, F]" and r.layouts["drouter"] == "[D, E]"


def test_flops_per_chip_are_the_router_and_the_experts_slots() -> None:
    n, experts, tokens, cap, groups, d, f = 2, 4, 16, 3, 4, 4, 6
    params = moe.init(d, f, seed=2, dtype="float64", experts=experts)
    x = np.random.default_rng(3).standard_normal((tokens, d))
    r = ss.run_strategy("ep", ss.Mesh(Y=n), params, x, x, top_k=2, capacity=cap, groups=groups)
    rows = experts * (groups // n) * cap  # every slot of the chip's E/N experts, from all N chips
    router = 2 * tokens // n * d * experts
    assert r.trace.total("flops", "forward") == router + 4 * rows * d * f
    assert r.trace.total("flops", "backward") == 2 * router + 8 * rows * d * f
