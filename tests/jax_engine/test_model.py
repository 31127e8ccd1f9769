"""The transformer under a plan on JAX devices: the single-device loss and gradients, and the same
program as the stacked engine's (every collective in order with its bytes, every chip's memory).

The oracle is twofold: :func:`shardsim.models.reference.loss_and_grads` (one device, float64) and
:func:`shardsim.run_model` on the stacked engine, whose trace and ledger the JAX run must repeat.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

jax = pytest.importorskip("jax")

from test_jaxpr import LAX_TO_SHARDSIM, equations, sent_per_chip  # noqa: E402

import shardsim  # noqa: E402
from shardsim.engines import jax as engine  # noqa: E402
from shardsim.errors import ModelInputError  # noqa: E402
from shardsim.models import TransformerConfig, reference  # noqa: E402
from shardsim.plans import Plan  # noqa: E402

pytestmark = pytest.mark.xdist_group("jax-model")

GPT = dict(layers=2, d_model=16, heads=4, d_ff=32, vocab=16, seq=8)
LLAMA = dict(GPT, kv_heads=2, mlp="swiglu", norm="rmsnorm", position="rope")

PLANS = [
    ("dp=2", GPT),
    ("dp=4,zero=1", GPT),
    ("dp=2,zero=2,tp=2", GPT),
    ("dp=8,zero=3", GPT),
    ("tp=4", GPT),
    ("dp=2,tp=2,sp", GPT),
    ("dp=2,tp=4,sp,attention=standard", LLAMA),  # tp > kv heads: Megatron's KV replication
    ("dp=2,zero=3,tp=2,sp,recompute=full", LLAMA),
    ("tp=2,recompute=selective,attention=standard", dict(GPT, bias=True, tie_embeddings=True)),
    ("dp=2,zero=1,tp=2,sp,recompute=selective", dict(LLAMA, kv_heads=1)),
    ("dp=2,tp=2,sp,attention=standard", dict(GPT, dropout=0.1)),  # the reference's masks, each device's block
    ("dp=2,ep=2,tp=2", dict(GPT, experts=4, top_k=2)),  # experts split whole over ep, their widths over tp
    ("dp=4,ep=2,zero=1", dict(GPT, experts=4, top_k=1, capacity_factor=1.0)),  # tokens over capacity dropped
    ("dp=2,cp=2", GPT),  # ring attention, balanced order, learned positions put back in order
    ("dp=2,zero=3,tp=2,sp,cp=2", LLAMA),  # RoPE at each row's real position
    ("cp=4,cp_method=all_gather,cp_balanced=False", LLAMA),
    ("tp=2,cp=2,attention=standard,recompute=full", GPT),
    ("dp=2,zero=1,tp=2,pp=2,microbatches=2", dict(GPT, layers=4)),  # every stage's code on every device
    ("pp=2,schedule=interleaved,virtual_stages=2,microbatches=4", dict(LLAMA, layers=4)),
    ("dp=2,pp=4,schedule=zb-h2,microbatches=8", dict(GPT, layers=4, batch=16)),
    ("cp=2,tp=2,pp=2,schedule=zb-h1,microbatches=2", LLAMA),
]


def inputs(kw: dict[str, Any], seed: int = 0) -> tuple[TransformerConfig, dict, np.ndarray, np.ndarray]:
    kw = dict(kw)
    batch = kw.pop("batch", 8)
    cfg = TransformerConfig(**kw)
    rng = np.random.default_rng(seed)
    tok, tgt = (rng.integers(0, cfg.vocab, (batch, cfg.seq)) for _ in range(2))
    return cfg, reference.init(cfg, seed=seed, dtype="float64"), tok, tgt


def same_program(got: shardsim.RunResult, want: shardsim.RunResult) -> None:
    """The JAX run recorded the stacked run's program: events, bytes, FLOPs, memory."""
    assert got.trace.collectives() == want.trace.collectives()
    strip = lambda t: [(e.op, e.phase, e.label, e.sent_bytes, e.flops) for e in t.events]  # noqa: E731
    assert strip(got.trace) == strip(want.trace)
    assert sorted(got.memory) == sorted(want.memory)
    for k in want.memory:
        np.testing.assert_array_equal(got.memory[k], want.memory[k], err_msg=k)
    np.testing.assert_array_equal(got.peak, want.peak)
    assert got.activations == want.activations and got.layouts == want.layouts


@pytest.mark.parametrize(("spec", "kw"), PLANS, ids=[p for p, _ in PLANS])
def test_step_is_the_single_device_one_and_the_stacked_program(spec: str, kw: dict[str, Any]) -> None:
    cfg, p, tok, tgt = inputs(kw)
    plan = Plan.parse(spec)
    seed = 5 if cfg.dropout else None
    got = engine.run_model(cfg, plan, plan.mesh(), p, tok, tgt, dropout_seed=seed)
    loss, grads = reference.loss_and_grads(cfg, p, tok, tgt, dropout_seed=seed)
    assert got.loss == pytest.approx(loss, abs=1e-12)
    for k in p:
        np.testing.assert_allclose(got.grads[k], grads[k], atol=1e-12, err_msg=k)
    same_program(got, shardsim.run_model(cfg, plan, plan.mesh(), p, tok, tgt, dropout_seed=seed))


@settings(max_examples=12, deadline=None)
@given(
    degrees=st.sampled_from([(2, 1), (4, 1), (1, 2), (2, 2), (1, 4), (2, 4), (4, 2)]),
    zero=st.integers(0, 3),
    sp=st.booleans(),
    attention=st.sampled_from(["flash", "standard"]),
    recompute=st.sampled_from(["none", "selective", "full"]),
    llama=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_plans_match_the_stacked_engine(
    degrees: tuple[int, int], zero: int, sp: bool, attention: str, recompute: str, llama: bool, seed: int
) -> None:
    dp, tp = degrees
    kw = dict(LLAMA if llama else GPT, kv_heads=2 if llama else None)
    plan = Plan(dp=dp, tp=tp, zero=zero if dp > 1 else 0, sp=sp and tp > 1, attention=attention, recompute=recompute)
    cfg, p, tok, tgt = inputs(kw, seed)
    got = engine.run_model(cfg, plan, plan.mesh(), p, tok, tgt)
    want = shardsim.run_model(cfg, plan, plan.mesh(), p, tok, tgt)
    assert got.loss == pytest.approx(want.loss, abs=1e-12)
    for k in p:
        np.testing.assert_allclose(got.grads[k], want.grads[k], atol=1e-12, err_msg=k)
    same_program(got, want)


@pytest.mark.parametrize("spec", ["dp=2,tp=2,sp", "dp=4,zero=3", "dp=2,tp=4,sp,recompute=full"])
def test_jaxpr_collectives_are_the_trace(spec: str) -> None:
    cfg, p, tok, tgt = inputs(LLAMA)
    plan = Plan.parse(spec)
    fn, args = engine.compile_model(cfg, plan, plan.mesh(), p, tok, tgt)
    eqns = [e for e in equations(jax.make_jaxpr(fn)(*args).jaxpr) if e.primitive.name in LAX_TO_SHARDSIM]
    want = shardsim.run_model(cfg, plan, plan.mesh(), p, tok, tgt).trace
    got = [(LAX_TO_SHARDSIM[e.primitive.name], tuple(e.params.get("axis_name", e.params.get("axes")))) for e in eqns]
    assert got == want.collectives()
    events = [e for e in want.events if e.op in LAX_TO_SHARDSIM.values()]
    mesh = plan.mesh()
    for eqn, (op, axes), event in zip(eqns, got, events):
        n = int(np.prod([mesh.axis_size(a) for a in axes]))
        assert sent_per_chip(op, eqn, n) == event.sent_bytes, (op, axes, event.label)


def test_compiled_step_gives_the_loss_and_sharded_gradients() -> None:
    cfg, p, tok, tgt = inputs(LLAMA)
    plan = Plan.parse("dp=2,zero=3,tp=2,sp")
    fn, args = engine.compile_model(cfg, plan, plan.mesh(), p, tok, tgt)
    loss, grads = fn(*args)
    want_loss, want = reference.loss_and_grads(cfg, p, tok, tgt)
    assert float(loss) == pytest.approx(want_loss, abs=1e-12)
    layouts = shardsim.run_model(cfg, plan, plan.mesh(), p, tok, tgt).layouts
    for k in p:
        assert grads[k].sharding.spec == shardsim.specs.to_partition_spec(layouts[f"d{k}"]), k
        np.testing.assert_allclose(np.asarray(grads[k]), want[k], atol=1e-12, err_msg=k)
    assert args[0]["layers.0.mlp.w_up"].sharding.spec == jax.sharding.PartitionSpec("data", "model")  # ZeRO-3 + TP


def test_bf16_compute_matches_the_stacked_engine() -> None:
    cfg, p, tok, tgt = inputs(GPT)
    p32 = {k: v.astype(np.float32) for k, v in p.items()}
    plan = Plan.parse("dp=2,tp=2,sp,precision=bf16")
    got = engine.run_model(cfg, plan, plan.mesh(), p32, tok, tgt)
    want = shardsim.run_model(cfg, plan, plan.mesh(), p32, tok, tgt)
    assert got.loss == pytest.approx(want.loss, rel=1e-2)
    for k in p:  # bfloat16 sums in another order: equal to bf16 rounding, not bitwise
        scale = np.abs(want.grads[k]).max() + 1e-6
        assert np.abs(got.grads[k] - want.grads[k]).max() <= 0.05 * scale, k
    same_program(got, want)


def test_a_jax_mesh_with_the_plans_axes() -> None:
    cfg, p, tok, tgt = inputs(GPT)
    jmesh = jax.make_mesh((2, 4), ("data", "model"), devices=jax.devices()[:8])
    got = engine.run_model(cfg, "dp=2,tp=4", jmesh, p, tok, tgt)
    assert got.loss == pytest.approx(reference.loss(cfg, p, tok, tgt), abs=1e-12)


def test_bad_tokens_are_the_front_ends_error_before_jax() -> None:
    cfg, p, tok, tgt = inputs(GPT)
    tok[0, 0] = cfg.vocab
    with pytest.raises(ModelInputError, match="vocab"):
        engine.run_model(cfg, "dp=2", shardsim.Mesh(data=2), p, tok, tgt)
