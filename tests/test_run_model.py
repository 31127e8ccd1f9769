"""run_model against the single-device reference: every plan's loss and every gradient, the
collectives of each half-block, recomputation in the trace, shape-only runs, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim import DivisibilityError, ShapeDtype, ShapeError
from shardsim.dtypes import tolerance
from shardsim.models import TransformerConfig, get, reference
from shardsim.plans import Plan, PlanError
from shardsim.transformer.checks import ModelInputError
from shardsim.transformer.run import run_model

BASE = TransformerConfig(layers=1, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)


def batch(cfg: TransformerConfig, b: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab, (b, cfg.seq)), rng.integers(0, cfg.vocab, (b, cfg.seq))


def check_against_reference(cfg: TransformerConfig, plan: Plan, dtype: str, b: int, dropout_seed: int | None) -> None:
    params = reference.init(cfg, seed=1, dtype=dtype)
    tokens, targets = batch(cfg, b)
    want_loss, want = reference.loss_and_grads(cfg, params, tokens, targets, dropout_seed=dropout_seed)
    got = run_model(cfg, plan, plan.mesh(), params, tokens, targets, dropout_seed=dropout_seed)
    contraction = max(cfg.d_model, cfg.d_ff, cfg.vocab, b * cfg.seq)
    tol = tolerance(dtype, contraction, ulps=64)
    assert got.loss == pytest.approx(want_loss, rel=tol)
    assert got.grads is not None and list(got.grads) == list(want)
    scale = max(np.abs(g).max() for g in want.values())
    for k, g in want.items():
        assert got.grads[k].dtype == g.dtype, k
        if k.endswith(".attn.bk") and cfg.position != "rope":
            # 0 in exact arithmetic (softmax ignores a shift shared by every key): both sides are
            # rounding noise of products of size ~scale, so each is held to zero, not to the other
            for name, value in (("run_model", got.grads[k]), ("reference", g)):
                assert np.abs(value).max() <= tol * 1e-2 * scale, f"{k} of the {name} is not 0 under {plan}"
            continue
        err = np.abs(got.grads[k] - g).max()
        assert err <= tol * max(np.abs(g).max(), 1e-3 * scale), f"{k}: error {err:.3g} under {plan}"


@st.composite
def cases(draw: st.DrawFn) -> tuple[TransformerConfig, Plan, str, int, int | None]:
    tp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2])) if tp < 4 else 1
    kv = draw(st.sampled_from([k for k in (1, 2, 4, 8) if k % tp == 0 or tp % k == 0]))  # KV split or replicated
    heads = max(kv, tp) * draw(st.sampled_from([1, 2]))
    hd = draw(st.sampled_from([2, 4]))
    seq = draw(st.sampled_from([2, 4, 8]))
    cfg = TransformerConfig(
        layers=draw(st.integers(1, 2)),
        d_model=dp * draw(st.sampled_from([4, 8])),
        heads=heads,
        kv_heads=kv,
        head_dim=hd,
        d_ff=tp * dp * draw(st.sampled_from([2, 4])),
        vocab=tp * draw(st.sampled_from([3, 5])),
        seq=seq,
        mlp=draw(st.sampled_from(["gelu", "swiglu"])),
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        position=draw(st.sampled_from(["learned", "rope", "none"])),
        bias=draw(st.booleans()),
        tie_embeddings=draw(st.booleans()),
        dropout=draw(st.sampled_from([0.0, 0.25])),
    )
    zero = draw(st.integers(0, 3))
    if zero == 3 and cfg.bias and (hd * kv // tp if kv >= tp else hd * kv) % dp:
        zero = 2  # FSDP splits a bias over data within each chip's heads
    plan = Plan(
        dp=dp,
        tp=tp,
        zero=zero,
        sp=tp > 1 and seq % tp == 0 and draw(st.booleans()),
        attention="standard",  # the reference's kernel, and attention dropout's
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
    )
    return cfg, plan, draw(st.sampled_from(["float32", "float64"])), dp * draw(st.sampled_from([1, 2])), 7


@settings(max_examples=60)
@given(cases())
def test_every_plan_matches_the_reference(case: tuple[TransformerConfig, Plan, str, int, int | None]) -> None:
    check_against_reference(*case)


@pytest.mark.parametrize("text", ["dp=1", "dp=2", "fsdp=2", "dp=2,zero=2", "tp=2", "tp=2,sp", "dp=2,tp=2,sp,zero=3"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_named_plans_match_the_reference(text: str, dtype: str) -> None:
    cfg = BASE.scaled(layers=2, heads=4, kv_heads=2, bias=True, dropout=0.1)
    check_against_reference(cfg, Plan.parse(text).replace(attention="standard"), dtype, 4, dropout_seed=3)


def _run(cfg: TransformerConfig, text: str, b: int = 2, **kw: object) -> object:
    plan = Plan.parse(text)
    tokens, targets = batch(cfg, b)
    return run_model(cfg, plan, plan.mesh(), reference.init(cfg, dtype="float64"), tokens, targets, **kw)  # type: ignore[arg-type]


def _layer_ops(res: object, ph: str) -> list[str]:
    """Collectives of block 0's matmul region (between the embedding's and the head's)."""
    return [f"{e.op}:{e.label}" for e in res.trace.events if e.is_collective and e.phase == ph]  # type: ignore[attr-defined]


def test_tensor_parallel_does_one_all_reduce_per_half_block_each_way() -> None:
    res = _run(BASE, "tp=2")
    fwd = _layer_ops(res, "forward")
    assert fwd == [
        "all_reduce:Embedded",
        "all_reduce:Attn out",
        "all_reduce:MLP out",
        "all_gather:max",
        "all_reduce:sum exp",
        "all_reduce:target logit",
    ]
    assert _layer_ops(res, "backward") == ["all_reduce:dF", "all_reduce:dCn", "all_reduce:dA"]


def test_sequence_parallel_gathers_before_and_scatters_after_each_tp_region() -> None:
    res = _run(BASE, "tp=2,sp")
    assert _layer_ops(res, "forward") == [
        "reduce_scatter:Embedded",
        "all_gather:A",
        "reduce_scatter:Attn out",
        "all_gather:Cn",
        "reduce_scatter:MLP out",
        "all_gather:F",
        "all_gather:max",
        "all_reduce:sum exp",
        "all_reduce:target logit",
    ]
    norm_grads = ["all_reduce:dgamma", "all_reduce:dbeta"]  # each chip summed its own tokens only
    assert _layer_ops(res, "backward") == [
        "all_gather:F",  # the head: F was stored split
        "reduce_scatter:dF",
        *norm_grads,
        "all_gather:dMLP out",  # ḡ backward
        "all_gather:Cn",  # Cn stored split, gathered again
        "reduce_scatter:dCn",  # g backward
        *norm_grads,
        "all_gather:dAttn out",
        "all_gather:A",
        "reduce_scatter:dA",
        *norm_grads,
        "all_gather:dx",  # the embedding's ReduceScatter backward
    ]


def test_fewer_kv_heads_than_chips_are_replicated_as_megatron_does() -> None:
    """K = 1 < t = 4: every chip computes its query heads' one KV head; the KV weights' gradients,
    summed over the chips holding a copy, take one AllReduce over the model axis each."""
    cfg = BASE.scaled(heads=4, kv_heads=1, bias=True)
    check_against_reference(cfg, Plan(tp=4, sp=True), "float64", 2, None)
    res = _run(cfg, "tp=4")
    assert res.sharded_grads["layers.0.attn.wk"].layout.dims[1].axes == ()  # type: ignore[attr-defined]
    reduced = [e.label for e in res.trace.events if e.op == "all_reduce" and e.phase == "backward"]  # type: ignore[attr-defined]
    assert reduced == ["dF", "dCn", "dWk", "dbk", "dWv", "dbv", "dA"]


def test_the_logits_are_never_gathered() -> None:
    cfg = BASE.scaled(heads=4, vocab=64)
    res = _run(cfg, "tp=4,sp", b=2)
    logits_bytes = 2 * cfg.seq * cfg.vocab * 8
    moved = [e for e in res.trace.events if e.is_collective]  # type: ignore[attr-defined]
    assert moved and max(e.array_bytes for e in moved) < logits_bytes / 4


def test_fsdp_gathers_weights_in_forward_and_backward_and_scatters_grads() -> None:
    res = _run(BASE, "fsdp=2", b=2)
    events = [e for e in res.trace.events if e.is_collective]  # type: ignore[attr-defined]
    gathers = {ph: sum(e.op == "all_gather" for e in events if e.phase == ph) for ph in ("forward", "backward")}
    n = len(BASE.param_shapes())
    assert gathers["forward"] == n  # every weight once (the tied-free head: embed and lm_head each once)
    assert gathers["backward"] == n - 5  # not the three betas, embed and pos_embed: their gradients need no weight
    assert sum(e.op == "reduce_scatter" for e in events) == n and not any(e.op == "all_reduce" for e in events)


@pytest.mark.parametrize(("policy", "recomputed"), [("none", 0), ("selective", 2), ("full", 8)])
def test_recomputation_shows_in_the_trace(policy: str, recomputed: int) -> None:
    res = _run(BASE, f"tp=2,attention=standard,recompute={policy}")
    again = [e for e in res.trace.events if e.phase == "recompute" and e.op == "matmul"]  # type: ignore[attr-defined]
    assert len(again) == recomputed * BASE.layers  # selective: Q K^T and P V; full: the block's eight forward matmuls


def test_shape_only_run_traces_the_same_program() -> None:
    cfg = BASE.scaled(dropout=0.1)
    data = _run(cfg, "dp=2,tp=2,sp,attention=standard", b=2, dropout_seed=0)
    plan = Plan.parse("dp=2,tp=2,sp,attention=standard")
    shapes = {k: ShapeDtype(v, "float64") for k, v in cfg.param_shapes().items()}
    tok = ShapeDtype((2, cfg.seq), "int64")
    shape_only = run_model(cfg, plan, plan.mesh(), shapes, tok, tok, dropout_seed=0)
    assert shape_only.loss is None and shape_only.grads is None
    key = [(e.op, e.axes, e.label, e.after, e.sent_bytes, e.flops) for e in data.trace.events]  # type: ignore[attr-defined]
    assert [(e.op, e.axes, e.label, e.after, e.sent_bytes, e.flops) for e in shape_only.trace.events] == key
    assert all((a == b).all() for a, b in zip(shape_only.stored, data.stored))  # type: ignore[attr-defined]


# -- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cfg", "text", "error", "words"),
    [
        (BASE, "tp=4", DivisibilityError, "heads=2 does not divide by tp=4"),
        (BASE.scaled(heads=6, kv_heads=3, head_dim=2), "tp=2", DivisibilityError, "replicates each KV head"),
        (BASE.scaled(d_ff=6), "tp=4", DivisibilityError, "heads=2"),
        (BASE.scaled(heads=4, d_ff=6), "tp=4", DivisibilityError, "d_ff=6"),
        (BASE.scaled(heads=4, vocab=10), "tp=4", DivisibilityError, "vocab=10 .* pads the vocabulary"),
        (BASE.scaled(seq=3, heads=4, vocab=12), "tp=4,sp", DivisibilityError, "sequence length 3"),
        (BASE.scaled(d_model=6, heads=2), "fsdp=4", DivisibilityError, "d_model=6"),
        (BASE, "dp=2,ep=2", PlanError, "ep=2 splits a mixture of experts, and this model has none"),
        (BASE.scaled(layers=3), "pp=2", DivisibilityError, "layers=3 do not divide over pp=2"),
        (BASE.scaled(layers=2), "pp=2,microbatches=3", DivisibilityError, "microbatches=3"),
        (BASE.scaled(layers=2, tie_embeddings=True), "pp=2", PlanError, "tie_embeddings with pp > 1"),
    ],
)
def test_model_that_does_not_fit_the_plan(cfg: TransformerConfig, text: str, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        _run(cfg, text, b=4)


def test_bad_inputs_name_the_culprit() -> None:
    from shardsim import Mesh

    plan, params = Plan(tp=2), reference.init(BASE)
    tok = np.zeros((2, 4), np.int64)
    with pytest.raises(PlanError, match="runs tp=2 over mesh axis 'model', which Mesh\\(data=2\\) does not have"):
        run_model(BASE, Plan(dp=2, tp=2), Mesh(data=2), params, tok, tok)
    with pytest.raises(PlanError, match="both run over"):
        run_model(BASE, Plan(dp=2, tp=2, model_axis="data"), Mesh(data=2), params, tok, tok)
    bad = tok.copy()
    bad[1, 2] = 8
    with pytest.raises(ModelInputError, match=r"tokens\[1, 2\] = 8 is outside the vocabulary \[0, 8\)"):
        run_model(BASE, plan, plan.mesh(), params, bad, tok)
    with pytest.raises(ModelInputError, match=r"targets.*outside"):
        run_model(BASE, plan, plan.mesh(), params, tok, bad - 9)
    long = np.zeros((2, 5), np.int64)
    with pytest.raises(ModelInputError, match=r"sequence length 5 is longer than the model's cfg\.seq=4"):
        run_model(BASE, plan, plan.mesh(), params, long, long)
    with pytest.raises(DivisibilityError, match="batch B=3 does not divide by dp=2"):
        run_model(BASE, Plan(dp=2), Plan(dp=2).mesh(), params, np.zeros((3, 4), int), np.zeros((3, 4), int))
    with pytest.raises(ShapeError, match="missing"):
        run_model(BASE, plan, plan.mesh(), {k: v for k, v in params.items() if k != "embed"}, tok, tok)
    wrong = {**params, "embed": ShapeDtype((params["embed"].shape[0] + 1, params["embed"].shape[1]), "float32")}
    with pytest.raises(ShapeError, match=r"param 'embed' has shape \(\d+, \d+\), but the config"):
        run_model(BASE, plan, plan.mesh(), wrong, tok, tok)  # shape-only weights are checked by shape too
    with pytest.raises(ModelInputError, match="integer token ids"):
        run_model(BASE, plan, plan.mesh(), params, tok.astype(float), tok)


def test_shorter_sequences_use_the_first_positions() -> None:
    cfg = BASE.scaled(seq=8)
    params = reference.init(cfg, dtype="float64")
    tokens, targets = batch(cfg.scaled(seq=4), 2)
    want_loss, want = reference.loss_and_grads(cfg, params, tokens, targets)
    plan = Plan(tp=2, sp=True)
    got = run_model(cfg, plan, plan.mesh(), params, tokens, targets)
    assert got.loss == pytest.approx(want_loss, rel=1e-12)
    assert got.grads is not None
    np.testing.assert_allclose(got.grads["pos_embed"], want["pos_embed"], atol=1e-14)


def test_demo_walks_a_block_through_tp_and_tp_sp() -> None:
    from shardsim.transformer.demo import walk, walk_all

    tp = walk("gpt-tiny", "tp=2")
    assert "Forward: 2 collectives" in tp and "Backward: 2 collectives" in tp  # one AllReduce per half-block
    assert tp.rstrip().endswith("PASS")
    assert "attn.mask attn_probs" not in tp  # gpt-tiny trains without dropout: no masks
    text = walk_all(get("gpt-tiny").scaled(dropout=0.1), ("tp=2,attention=standard", "tp=2,sp,attention=standard"))
    assert text.count("PASS") == 2 and "reduce_scatter  model  Attn out" in text
    assert "attn.mask attn_probs" in text  # with dropout its masks are stored


def test_bf16_precision_computes_in_bfloat16() -> None:
    """``precision=bf16``: the chips run in bfloat16 (weights cast from the float32 masters); the loss
    and gradients stay within bfloat16's tolerance of the float32 reference."""
    cfg = BASE.scaled(layers=2)
    params = reference.init(cfg, seed=1, dtype="float32")
    tokens, targets = batch(cfg, 2)
    want_loss, want = reference.loss_and_grads(cfg, params, tokens, targets)
    plan = Plan(tp=2, sp=True, precision="bf16")
    got = run_model(cfg, plan, plan.mesh(), params, tokens, targets)
    assert got.grads is not None and all(g.dtype.name == "bfloat16" for g in got.grads.values())
    tol = tolerance("bfloat16", cfg.d_ff, ulps=4)
    assert got.loss == pytest.approx(want_loss, rel=tol)
    scale = max(np.abs(g).max() for g in want.values())
    for k, g in want.items():
        assert np.abs(got.grads[k].astype(np.float32) - g).max() <= tol * scale, k


def test_zero_stages_leave_gradients_where_the_optimizer_wants_them() -> None:
    """ZeRO-0/1: every data chip holds the whole gradient; ZeRO-2/3: its 1/dp slice of D."""
    for zero, axes in ((0, ()), (1, ()), (2, ("data",)), (3, ("data",))):
        res = _run(BASE, f"dp=2,zero={zero}", b=2)
        g = res.sharded_grads["layers.0.attn.wq"]  # type: ignore[attr-defined]
        assert g.layout.dims[0].axes == axes and not g.is_partial, zero


def test_sequence_parallelism_moves_the_same_bytes_as_tensor_parallelism() -> None:
    """Korthikanti et al. 2022 §4.2.2: SP's AllGather + ReduceScatter replace TP's AllReduce at the
    same bandwidth. Measured on a shape-only GPT-3 layer (t = 8): the forward's model-axis bytes
    are equal; the backward's differ only by the two re-gathers of the stored-split norm outputs
    and the norm gains' AllReduces (each chip summed its own tokens)."""
    from shardsim.models import get

    cfg = get("gpt3-175b").scaled(layers=1, vocab=51200)
    params = {k: ShapeDtype(v, "bfloat16") for k, v in cfg.param_shapes().items()}
    tok = ShapeDtype((1, cfg.seq), "int32")

    def layer_bytes(text: str, ph: str) -> list[int]:
        plan = Plan.parse(text)
        res = run_model(cfg, plan, plan.mesh(), params, tok, tok)
        block = ("A", "Attn out", "Cn", "MLP out", "dAttn out", "dMLP out", "dA", "dCn", "dgamma", "dbeta")
        events = [e for e in res.trace.events if e.is_collective and e.phase == ph and e.label in block]
        return [e.sent_bytes for e in events]

    gather = 7 * cfg.seq * cfg.d_model * 2 // 8  # AllGather of [S, D] bfloat16 on 8 chips: (t-1) blocks
    tp, sp = layer_bytes("tp=8", "forward"), layer_bytes("tp=8,sp", "forward")
    assert len(tp) == 2 and len(sp) == 4 and sum(tp) == sum(sp) == 4 * gather  # an AllReduce is 2 x (t-1)/t
    tp_b, sp_b = layer_bytes("tp=8", "backward"), layer_bytes("tp=8,sp", "backward")
    gains = 2 * 7 * cfg.d_model * 2 // 8  # AllReduce of a [D] gain gradient
    assert sum(tp_b) == 4 * gather
    assert sum(sp_b) == 4 * gather + 2 * gather + 6 * gains  # + re-gathers of A and Cn, + 3 norms' gamma, beta


PIPELINES = [
    "pp=2",
    "pp=2,microbatches=4,schedule=gpipe",
    "pp=2,microbatches=2,schedule=interleaved,virtual_stages=2",
    "dp=2,pp=2,tp=2,sp,microbatches=2,recompute=selective",
    "fsdp=2,pp=2,microbatches=2,recompute=full",
]


@pytest.mark.parametrize("text", PIPELINES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pipelines_match_the_reference(text: str, dtype: str) -> None:
    cfg = BASE.scaled(layers=4, heads=4, kv_heads=2, bias=True, dropout=0.1, mlp="swiglu", position="rope")
    check_against_reference(cfg, Plan.parse(text).replace(attention="standard"), dtype, 4, dropout_seed=3)


def test_pipeline_stages_hold_their_own_layers_and_send_by_ppermute() -> None:
    cfg = BASE.scaled(layers=4)
    res = _run(cfg, "pp=2,microbatches=2", b=4)
    sends = [e for e in res.trace.events if e.op == "ppermute"]  # type: ignore[attr-defined]
    assert [(e.label, e.axes, e.where) for e in sends] == [
        ("x", ("pipe",), "pipe0"),
        ("x", ("pipe",), "pipe0"),
        ("dx", ("pipe",), "pipe1"),
        ("dx", ("pipe",), "pipe1"),
    ]  # 1F1B with p = 2, m = 2: F0 F1 on stage 0, then each microbatch's gradient back
    w = res.sharded_grads["layers.3.mlp.w_in"]  # type: ignore[attr-defined]
    assert w.holders is not None and w.holders.tolist() == [False, True]  # layer 3 lives on stage 1
    params = res.memory.peak("params")  # type: ignore[attr-defined]  # held through the step
    shapes = cfg.param_shapes()
    first = sum(
        int(np.prod(v))
        for k, v in shapes.items()
        if k in ("embed", "pos_embed") or k.startswith(("layers.0", "layers.1"))
    )
    assert params.tolist() == [first * 8, (sum(int(np.prod(v)) for v in shapes.values()) - first) * 8]
