"""A mixture of experts in the transformer: the one-device reference, and run_model under EP with DP, TP, SP, PP.

The reference's MoE gradients are held to central differences; run_model to the reference
under every plan (float64); the AllToAll bytes to GShard's count by hand: each of the four
AllToAlls of a layer sends ``(N-1)/N`` of a chip's ``E x S x D`` slot buffer, where a chip's
``S = T_local`` slots per expert (no capacity drops) over the ``N`` chips of the expert axis,
or, under a capacity factor, ``C`` slots per expert for each of the chip's sequences.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from finite_differences import numeric_grad
from shardsim import ConfigError, DivisibilityError, PlanError, ShapeDtype, checkpoint
from shardsim.models import TransformerConfig, get, reference
from shardsim.plans import Plan
from shardsim.training import SGD, Trainer
from shardsim.transformer.run import run_model
from test_run_model import check_against_reference

MOE = TransformerConfig(layers=2, d_model=8, heads=2, d_ff=16, vocab=8, seq=4, experts=4)


def test_a_moe_model_lists_its_router_and_experts() -> None:
    shapes = MOE.param_shapes()
    assert shapes["layers.1.moe.router"] == (8, 4)
    assert shapes["layers.1.moe.w_in"] == (4, 8, 16) and shapes["layers.1.moe.w_out"] == (4, 16, 8)
    assert not any(k.startswith("layers.0.mlp.") for k in shapes)
    dense = MOE.scaled(experts=0).param_count()
    assert MOE.param_count() == dense + MOE.layers * (3 * 2 * 8 * 16 + 8 * 4)  # 3 more experts + router


@pytest.mark.parametrize("key", ["layers.0.moe.router", "layers.0.moe.w_in", "layers.0.moe.w_out", "layers.0.attn.wq"])
def test_the_reference_moe_gradients_are_finite_differences(key: str) -> None:
    cfg = MOE.scaled(layers=1, top_k=2)
    params = reference.init(cfg, seed=4, dtype="float64")
    tok = np.arange(8).reshape(2, 4) % cfg.vocab
    _, grads = reference.loss_and_grads(cfg, params, tok, tok[:, ::-1])
    want = numeric_grad(lambda: reference.loss(cfg, params, tok, tok[:, ::-1]), params[key])
    assert np.allclose(grads[key], want, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize(
    "text",
    [
        "ep=2",
        "ep=4",
        "dp=2,ep=2",
        "dp=2,zero=1,ep=2",
        "tp=2,ep=2",
        "dp=2,tp=2,ep=2",
        "tp=2,sp,ep=2",
        "ep=2,pp=2,microbatches=2",
        "dp=2,ep=2,tp=2,pp=2,microbatches=2,recompute=full",
        "ep=2,recompute=selective",
        "dp=2",
    ],
)
def test_run_model_with_experts_is_the_reference(text: str) -> None:
    plan = Plan.parse(text)
    b = 2 * plan.dp * plan.ep * plan.microbatches
    check_against_reference(MOE, plan, "float64", 2 * b, None)
    check_against_reference(MOE.scaled(norm="rmsnorm", position="rope", top_k=1), plan, "float64", b, None)


def test_the_alltoalls_send_what_gshard_counts() -> None:
    cfg = get("llama3-8b").scaled(layers=1, experts=8, mlp="gelu")
    plan = Plan.parse("dp=2,ep=4")
    shapes = {k: ShapeDtype(v, "bfloat16") for k, v in cfg.param_shapes().items()}
    b = 8
    ids = ShapeDtype((b, cfg.seq), "int64")
    r = run_model(cfg, plan, plan.mesh(), shapes, ids, ids)
    sends = [e for e in r.trace.events if e.op == "all_to_all"]
    assert len(sends) == 4 and all(e.axes == ("expert",) for e in sends)
    tokens_per_chip = b * cfg.seq // (plan.dp * plan.ep)
    n = plan.ep
    want = (n - 1) * cfg.experts * tokens_per_chip * cfg.d_model * 2 // n  # E x S_local slots of D bf16
    assert {e.sent_bytes for e in sends} == {want}


@pytest.mark.parametrize(
    "text", ["dp=2", "ep=2", "dp=2,ep=2", "tp=2,sp,ep=2", "dp=2,ep=2,tp=2,pp=2,microbatches=2,recompute=full"]
)
def test_a_capacity_drops_the_tokens_the_reference_drops(text: str) -> None:
    """Capacity factor 0.5 at top-2 of 4 experts: one slot per expert per 4-token sequence for
    8 choices, so half the choices are dropped, each sequence on its own."""
    cfg = MOE.scaled(capacity_factor=0.5)
    assert cfg.expert_capacity(cfg.seq) == 1
    plan = Plan.parse(text)
    check_against_reference(cfg, plan, "float64", 4 * plan.dp * plan.ep * plan.microbatches, None)


def test_the_reference_drops_past_the_capacity_per_sequence() -> None:
    cfg = MOE.scaled(layers=1, capacity_factor=0.5)
    params = reference.init(cfg, seed=1, dtype="float64")
    tok = np.arange(8).reshape(2, 4) % cfg.vocab
    kept = reference.loss(cfg, params, tok, tok)
    assert kept != reference.loss(MOE.scaled(layers=1), params, tok, tok)  # something was dropped
    # each sequence is its own group: the first sequence's loss is the same alone or beside another
    first = reference.loss(cfg, params, tok[:1], tok[:1])
    second = reference.loss(cfg, params, tok[1:], tok[1:])
    assert kept == pytest.approx((first + second) / 2, rel=1e-12)


def test_a_capacity_sizes_the_experts_matmuls_and_alltoalls() -> None:
    """Per chip: E/ep experts x (B/dp sequences x C slots) rows; C = ceil(1.25 x 2 x 8192 / 8) = 2560."""
    cfg = get("llama3-8b").scaled(layers=1, experts=8, mlp="gelu", capacity_factor=1.25)
    plan = Plan.parse("dp=2,ep=4")
    shapes = {k: ShapeDtype(v, "bfloat16") for k, v in cfg.param_shapes().items()}
    b = 8
    ids = ShapeDtype((b, cfg.seq), "int64")
    events = run_model(cfg, plan, plan.mesh(), shapes, ids, ids).trace.events
    c = 2560
    rows = (cfg.experts // plan.ep) * (b // plan.dp) * c
    expert = [e for e in events if e.op == "matmul" and ("moe.w_" in e.label or e.label in ("H.T @ dY", "Buf.T @ dH"))]
    assert len(expert) == 6 and {e.flops for e in expert} == {2 * rows * cfg.d_model * cfg.d_ff}
    sends = {e.sent_bytes for e in events if e.op == "all_to_all"}
    assert sends == {(plan.ep - 1) * cfg.experts * (b // (plan.dp * plan.ep)) * c * cfg.d_model * 2 // plan.ep}


@pytest.mark.parametrize(
    ("cfg", "text", "error", "words"),
    [
        (MOE.scaled(experts=0), "ep=2", PlanError, "this model has none"),
        (MOE.scaled(experts=3, top_k=1), "ep=2", DivisibilityError, "experts=3 do not divide by ep=2"),
        (MOE, "dp=2,zero=3,ep=2", PlanError, "zero=3 with a mixture of experts"),
        (MOE.scaled(seq=8), "cp=2", PlanError, "cp=2 with a mixture of experts"),
    ],
)
def test_a_plan_the_experts_do_not_fit_names_the_culprit(
    cfg: TransformerConfig, text: str, error: type[Exception], words: str
) -> None:
    plan = Plan.parse(text)
    params = reference.init(cfg, dtype="float64")
    tok = np.zeros((4, cfg.seq), int)
    with pytest.raises(error, match=words):
        run_model(cfg, plan, plan.mesh(), params, tok, tok)


def test_a_bad_moe_config_says_what_to_choose() -> None:
    with pytest.raises(ConfigError, match="top_k=5 routes each token to more experts than the 4"):
        MOE.scaled(top_k=5)
    with pytest.raises(ConfigError, match="use mlp='gelu'"):
        MOE.scaled(mlp="swiglu")
    with pytest.raises(ConfigError, match="number of experts"):
        MOE.scaled(experts=-1)
    with pytest.raises(ConfigError, match="capacity_factor is a positive number"):
        MOE.scaled(capacity_factor=0)
    with pytest.raises(ConfigError, match="give experts > 0 too"):
        MOE.scaled(experts=0, capacity_factor=1.25)


def test_the_batch_must_divide_over_data_and_expert_axes() -> None:
    plan = Plan.parse("dp=2,ep=2")
    params = reference.init(MOE, dtype="float64")
    tok = np.zeros((2, MOE.seq), int)
    with pytest.raises(DivisibilityError, match="dp x ep = 4"):
        run_model(MOE, plan, plan.mesh(), params, tok, tok)


@pytest.mark.parametrize("text", ["dp=2,zero=1,ep=2", "dp=2,tp=2,pp=2,microbatches=2", "ep=2,pp=2,microbatches=2"])
def test_a_transformer_trainer_checkpoint_resumes_bit_for_bit_where_it_was_held(text: str, tmp_path: Path) -> None:
    plan = Plan.parse(text)
    cfg = MOE.scaled(layers=2) if plan.ep > 1 else MOE.scaled(experts=0)
    params = reference.init(cfg, seed=2, dtype="float64")
    rng = np.random.default_rng(0)
    b = 2 * plan.dp * plan.ep * plan.microbatches
    tok, tgt = rng.integers(0, cfg.vocab, (b, cfg.seq)), rng.integers(0, cfg.vocab, (b, cfg.seq))
    a = Trainer.for_model(cfg, plan, plan.mesh(), params, "adam")
    fresh = Trainer.for_model(cfg, plan, plan.mesh(), params, "adam")
    a.step(tok, tgt)
    live = {c: fresh.mesh.memory.live(c).copy() for c in ("params", "optimizer")}
    fresh.restore(checkpoint.load(checkpoint.save(str(tmp_path / "ckpt"), a.state()), fresh.mesh))
    for c, before in live.items():  # the values come back where they were held (a stage's chips)
        assert np.array_equal(fresh.mesh.memory.live(c), before), c
    assert fresh.step_count == 1 and a.step(tok, tgt).loss == fresh.step(tok, tgt).loss
    for k, v in a.params_global().items():
        assert np.array_equal(v, fresh.params_global()[k]), k
    for slot, values in a.moments_global().items():
        for k, v in values.items():
            assert np.array_equal(v, fresh.moments_global()[slot][k]), (slot, k)


@pytest.mark.parametrize("text", ["dp=2,zero=1,ep=2", "dp=2,tp=2,sp,ep=2", "ep=2,pp=2,microbatches=2"])
def test_a_transformer_trainer_with_experts_takes_the_reference_step(text: str) -> None:
    plan = Plan.parse(text)
    params = reference.init(MOE, seed=3, dtype="float64")
    rng = np.random.default_rng(1)
    b = 2 * plan.dp * plan.ep * plan.microbatches
    tok, tgt = rng.integers(0, MOE.vocab, (b, MOE.seq)), rng.integers(0, MOE.vocab, (b, MOE.seq))
    want_loss, want = reference.loss_and_grads(MOE, params, tok, tgt)
    t = Trainer.for_model(MOE, plan, plan.mesh(), params, SGD(lr=0.1))
    assert t.step(tok, tgt).loss == pytest.approx(want_loss, rel=1e-12)
    for k, v in t.params_global().items():
        assert np.allclose(v, params[k] - 0.1 * want[k], rtol=1e-12, atol=1e-14), k


@pytest.mark.parametrize("text", ["cp=2", "cp=2,pp=2,microbatches=2", "dp=2,tp=2,ep=2"])
def test_the_demo_walks_context_parallel_and_expert_plans(text: str) -> None:
    from shardsim.transformer.demo import walk

    got = walk("moe-tiny" if "ep" in text else "llama-tiny", text)
    assert got.rstrip().endswith("PASS")
    op = "all_to_all" if "ep" in text else "ppermute"  # ring attention's K/V hops, or the experts' AllToAll
    assert op in got
