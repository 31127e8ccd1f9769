"""Pipeline parallelism: the single-device answer, the published bubbles, per-stage memory, the trace."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardsim as ss
from finite_differences import numeric_grad
from shardsim import mlp, strategies
from shardsim.array import shard
from shardsim.dtypes import tolerance
from shardsim.strategies import pp
from shardsim.strategies.base import Ctx
from shardsim.strategies.pipeline import gpipe, interleaved, make, one_f_one_b
from shardsim.tracing import phase, trace


def assert_close(got: np.ndarray, want: np.ndarray, dtype: str, contraction: int, depth: int, what: str) -> None:
    tol = tolerance(dtype, contraction) * 4 * depth  # two matmuls a layer, errors add up over the layers
    scale = float(np.abs(want).max()) or 1.0
    err = float(np.abs(np.asarray(got, np.float64) - want).max())
    assert got.shape == want.shape and err <= tol * scale, f"{what}: error {err:.3g} > {tol * scale:.3g}"


def check(result: ss.strategies.StrategyResult, params, x, dout, activation: str, dtype: str) -> None:
    scheme = strategies.get(result.scheme)
    want_out, want = scheme.reference(params, x, dout, activation)
    depth = int(np.prod(np.shape(params["w_in"])[:-2]))
    contraction = max(x.shape[0], *np.shape(params["w_in"])[-2:])
    assert_close(result.out, want_out, dtype, contraction, depth, "out")
    for k, w in want.items():
        assert_close(result.grads[k], w, dtype, contraction, depth, f"d{k}")


def draw_inputs(rng: np.random.Generator, b: int, d: int, dtype: str):
    return rng.standard_normal((b, d)).astype(dtype), rng.standard_normal((b, d)).astype(dtype)


# -- the single-device answer -------------------------------------------------------------------
@st.composite
def pipeline_cases(draw):
    p = draw(st.integers(1, 4))
    chunks = draw(st.sampled_from([1, 1, 2, 3]))
    m = p * draw(st.integers(1, 2)) if chunks > 1 else draw(st.integers(1, 5))
    b = m * draw(st.integers(1, 2))
    layers = chunks * p * draw(st.integers(1, 2))
    schedule = "interleaved" if chunks > 1 else draw(st.sampled_from(["gpipe", "1f1b"]))
    return (
        p,
        chunks,
        m,
        b,
        layers,
        schedule,
        draw(st.sampled_from(["identity", "relu", "gelu"])),
        draw(st.sampled_from(["float32", "float64"])),
        draw(st.integers(0, 2**16)),
    )


@settings(max_examples=30)
@given(pipeline_cases())
def test_pipeline_equals_the_single_device_stack(case) -> None:
    p, chunks, m, b, layers, schedule, activation, dtype, seed = case
    d, f = 4, 8
    rng = np.random.default_rng(seed)
    if chunks > 1:
        name, params = "pp_interleaved", pp.init_chunked(d, f, seed=seed, dtype=dtype, layers=layers, chunks=chunks)
    else:
        name, params = "pp", pp.init(d, f, seed=seed, dtype=dtype, layers=layers)
    x, dout = draw_inputs(rng, b, d, dtype)
    r = ss.run_strategy(name, ss.Mesh(Z=p), params, x, dout, activation=activation, schedule=schedule, microbatches=m)
    check(r, params, x, dout, activation, dtype)


def test_reference_is_the_mlp_stack() -> None:
    params = pp.init(4, 8, seed=3, dtype="float64", layers=3)
    x = np.random.default_rng(0).standard_normal((5, 4))
    out, _ = pp.reference(params, x, np.ones((5, 4)), "relu")
    want = x
    for i in range(3):
        want = mlp.forward(mlp.layer(params, i), want, "relu")
    np.testing.assert_array_equal(out, want)
    # chunk c holds layers c·L/C ...: the chunks run in order, each layer once
    chunked = pp.init_chunked(4, 8, seed=3, dtype="float64", layers=4, chunks=2)
    dout = np.random.default_rng(1).standard_normal((5, 4))
    out, g = pp.reference(chunked, x, dout, "relu")

    def chunked_forward() -> np.ndarray:
        a = x
        for c in range(2):
            for i in range(2):
                a = mlp.forward({k: v[c, i] for k, v in chunked.items()}, a, "relu")
        return a

    np.testing.assert_array_equal(out, chunked_forward())
    loss = lambda: float((chunked_forward() * dout).sum())  # noqa: E731
    for name, value in {"x": x, **chunked}.items():
        assert g[name].shape == value.shape, name
        np.testing.assert_allclose(g[name], numeric_grad(loss, value), rtol=1e-6, atol=1e-8, err_msg=name)


# -- schedules: the published bubbles -----------------------------------------------------------
GRID = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 8, 16)]


@pytest.mark.parametrize("build", [gpipe, one_f_one_b])
@pytest.mark.parametrize("p,m", GRID)
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m(build, p: int, m: int) -> None:
    s = build(p, m)
    assert s.bubble() == pytest.approx((p - 1) / m, rel=1e-12, abs=1e-12)
    assert s.idle_fraction() == pytest.approx((p - 1) / (m + p - 1), rel=1e-12, abs=1e-12)
    # Narayanan: t_pb = (p-1)(t_f + t_b) for any t_f, t_b; here a backward costs twice a forward
    assert s.bubble(lambda it: 1.0 if it.kind == "F" else 2.0) == pytest.approx((p - 1) / m, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("p,v,m", [(2, 2, 2), (2, 2, 4), (4, 2, 4), (4, 2, 8), (4, 4, 8), (3, 3, 6), (8, 2, 16)])
def test_interleaved_bubble_is_p_minus_1_over_v_m(p: int, v: int, m: int) -> None:
    s = interleaved(p, m, v)
    assert s.bubble() == pytest.approx((p - 1) / (v * m), rel=1e-12)
    assert s.bubble(lambda it: 1.0 if it.kind == "F" else 2.0) == pytest.approx((p - 1) / (v * m), rel=1e-12)


@pytest.mark.parametrize("s", [gpipe(3, 5), one_f_one_b(4, 6), one_f_one_b(4, 2), interleaved(2, 4, 3)])
def test_schedules_are_valid_programs(s) -> None:
    """Each chunk of each microbatch runs F then B once per stage; one item per stage per step;
    an F follows the previous virtual stage's F, a B the next one's B."""
    v_all = s.stages * s.chunks
    when = {(s.virtual_stage(it), it.kind, it.microbatch): it.time for it in s.items}
    assert len(when) == len(s.items) == 2 * v_all * s.microbatches
    assert len({(it.stage, it.time) for it in s.items}) == len(s.items)
    for (k, kind, j), t in when.items():
        if kind == "F" and k > 0:
            assert when[(k - 1, "F", j)] < t
        if kind == "B":
            assert when[(k + 1, "B", j) if k + 1 < v_all else (k, "F", j)] < t


def test_1f1b_warms_up_p_minus_s_minus_1_forwards_then_alternates() -> None:
    s = one_f_one_b(4, 8)
    for stage, order in enumerate(s.orders()):
        kinds = "".join(it.kind for it in order)
        warm = 4 - stage - 1
        assert kinds == "F" * warm + "FB" * (8 - warm) + "B" * warm
    assert s.peak_in_flight() == [4, 3, 2, 1]
    assert gpipe(4, 8).peak_in_flight() == [8, 8, 8, 8]


def test_grid_is_the_classic_picture() -> None:
    assert gpipe(3, 2).grid() == "\n".join(
        [
            "stage 0 | F0 F1 .  .  .  .  B0 B1",
            "stage 1 | .  F0 F1 .  .  B0 B1 .",
            "stage 2 | .  .  F0 F1 B0 B1 .  .",
        ]
    )


def test_schedule_errors() -> None:
    with pytest.raises(ss.ShardingError, match="multiple of stages"):
        interleaved(4, 6, 2)
    with pytest.raises(ss.ShardingError, match="unknown pipeline schedule 'zb'"):
        make("zb", 2, 2)
    with pytest.raises(ss.ShardingError, match="chunks=2 needs 'interleaved'"):
        make("1f1b", 2, 2, chunks=2)


# -- the executed schedule: bubble from the items as they ran, memory from the ledger ----------
D, F = 4, 8
ITEM = 8  # float64


def run_step(name: str, mesh: ss.Mesh, axes: dict, params, x, dout, activation: str = "relu", **options):
    """Run a pipeline scheme's forward and backward and return the step (its executed items)."""
    scheme = strategies.get(name)
    ctx = Ctx(axes=axes, activation=activation, options=options)
    lay = scheme.layouts(ctx)
    with trace() as t:
        xs = shard(x, mesh, lay["x"], label="In")
        ps = {k: shard(v, mesh, lay[k], label=k, category="params") for k, v in params.items()}
        with phase("forward"):
            _, saved = scheme.forward(ctx, xs, ps)
        step = saved.step
        with phase("backward"):
            scheme.backward(ctx, saved, shard(dout, mesh, lay["out"], label="dOut"), ps)
    return step, t


def stash_per_microbatch(b: int, layers: int, activation: str) -> int:
    """A stage's stash for one microbatch: each layer's In [b, D], H_pre [b, F] and H [b, F]."""
    h = 1 if activation == "identity" else 2
    return layers * b * (D + h * F) * ITEM


@pytest.mark.parametrize("schedule,p,m", [("gpipe", 4, 8), ("1f1b", 4, 8), ("1f1b", 2, 3), ("gpipe", 3, 2)])
def test_measured_bubble_from_the_executed_items_is_the_published_one(schedule: str, p: int, m: int) -> None:
    params = pp.init(D, F, seed=0, dtype="float64", layers=p)
    x, dout = draw_inputs(np.random.default_rng(0), m, D, "float64")
    step, _ = run_step("pp", ss.Mesh(Z=p), {"pipe": "Z"}, params, x, dout, schedule=schedule, microbatches=m)
    flops = {e.item.kind: e.flops for e in step.executed}
    assert flops["B"] == 2 * flops["F"]  # each item's time is its FLOPs: a backward costs two forwards
    assert step.measured_bubble() == pytest.approx((p - 1) / m, rel=1e-12)


def test_measured_interleaved_bubble() -> None:
    p, v, m = 2, 2, 4
    params = pp.init_chunked(D, F, seed=0, dtype="float64", layers=p * v, chunks=v)
    x, dout = draw_inputs(np.random.default_rng(0), m, D, "float64")
    step, _ = run_step("pp_interleaved", ss.Mesh(Z=p), {"pipe": "Z"}, params, x, dout, microbatches=m)
    assert step.measured_bubble() == pytest.approx((p - 1) / (v * m), rel=1e-12)


@pytest.mark.parametrize("activation", ["identity", "gelu"])
def test_ledger_1f1b_stashes_at_most_p_microbatches_on_the_first_stage_gpipe_m(activation: str) -> None:
    p, m, layers, b = 4, 8, 8, 2
    params = pp.init(D, F, seed=0, dtype="float64", layers=layers)
    x, dout = draw_inputs(np.random.default_rng(1), m * b, D, "float64")
    one = stash_per_microbatch(b, layers // p, activation)
    for schedule, want in (("gpipe", [m] * p), ("1f1b", [p - s for s in range(p)])):
        mesh = ss.Mesh(Z=p)
        step, _ = run_step("pp", mesh, {"pipe": "Z"}, params, x, dout, activation, schedule=schedule, microbatches=m)
        np.testing.assert_array_equal(mesh.memory.peak("stash"), [n * one for n in want])
        # and step by step: the ledger's stash is the schedule's microbatches in flight
        counts = np.zeros(p, int)
        for t, live in enumerate(step.stash_bytes):
            for it in step.schedule.items:
                if it.time == t:
                    counts[it.stage] += 1 if it.kind == "F" else -1
            np.testing.assert_array_equal(live, counts * one)


def test_interleaved_first_stage_holds_korthikanti_share() -> None:
    """Korthikanti et al. (2022): interleaving multiplies the first stage's activations by
    1 + (p-1)/(p·v): L layers' worth of 1F1B becomes (v·p + p - 1) chunks of L/(v·p) layers."""
    p, v, m, b = 2, 2, 4, 1
    layers = p * v  # one layer per chunk
    params = pp.init_chunked(D, F, seed=0, dtype="float64", layers=layers, chunks=v)
    x, dout = draw_inputs(np.random.default_rng(2), m * b, D, "float64")
    mesh = ss.Mesh(Z=p)
    run_step("pp_interleaved", mesh, {"pipe": "Z"}, params, x, dout, "relu", microbatches=m)
    chunk = stash_per_microbatch(b, 1, "relu")
    first = int(mesh.memory.peak("stash")[0])
    assert first == (v * p + p - 1) * chunk
    assert first / (layers * chunk) == pytest.approx(1 + (p - 1) / (p * v))


# -- the trace: point-to-point sends, each stage its own work -----------------------------------
def test_trace_sends_activations_forward_and_gradients_backward_by_ppermute() -> None:
    p, m, b = 3, 4, 2
    params = pp.init(D, F, seed=0, dtype="float64", layers=2 * p)
    x, dout = draw_inputs(np.random.default_rng(3), m * b, D, "float64")
    r = ss.run_strategy("pp", ss.Mesh(Z=p), params, x, dout, activation="relu", microbatches=m)
    for ph in ("forward", "backward"):
        sends = [e for e in r.trace if e.is_collective and e.phase == ph]
        assert {(e.op, e.axes) for e in sends} == {("ppermute", ("Z",))}
        assert len(sends) == m * (p - 1)  # one per microbatch per stage boundary
        assert {e.sent_bytes for e in sends} == {b * D * ITEM}  # b·s·h (Narayanan et al.)
    # every stage does 1/p of the single-device FLOPs: 12·B·D·F per layer, forward and backward
    per_stage = {f"Z{s}": 0 for s in range(p)}
    for e in r.trace:
        if e.op == "matmul":
            per_stage[e.where] += e.flops
    assert set(per_stage.values()) == {12 * m * b * D * F * 2}


def test_each_stage_holds_its_layers_weights_and_gradients_once() -> None:
    p, layers = 3, 6
    params = pp.init(D, F, seed=0, dtype="float64", layers=layers)
    x, dout = draw_inputs(np.random.default_rng(4), 8, D, "float64")
    r = ss.run_strategy("pp", ss.Mesh(Z=p), params, x, dout, microbatches=4)
    weights = 2 * (layers // p) * D * F * ITEM
    np.testing.assert_array_equal(r.memory["params"], [weights] * p)
    np.testing.assert_array_equal(r.memory["grads"], [weights] * p)  # accumulated as if in place


def test_pipeline_errors_name_what_does_not_fit() -> None:
    params = pp.init(D, F, layers=4)
    x = np.ones((6, D), np.float32)
    with pytest.raises(ss.DivisibilityError, match="do not divide by 4"):
        ss.run_strategy("pp", ss.Mesh(Z=2), params, x, x, microbatches=4)
    with pytest.raises(ss.DivisibilityError, match="dimension L of size 4 does not divide"):
        ss.run_strategy("pp", ss.Mesh(Z=3), params, x, x)
    with pytest.raises(ss.ShardingError, match="W_out must be"):
        ss.run_strategy("pp", ss.Mesh(Z=2), {"w_in": params["w_in"], "w_out": params["w_in"]}, x, x)
