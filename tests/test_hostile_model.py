"""The transformer's door: gradients of short sequences under every plan, bounded config checks,
run_model's and Trainer.for_model's refusals of bad inputs, and ZeRO's splits checked up front."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim import (
    ArgumentTypeError,
    ConfigError,
    DivisibilityError,
    DtypeError,
    Mesh,
    ModelInputError,
    PlanError,
    ShapeError,
    cost,
)
from shardsim.models import TransformerConfig, reference
from shardsim.plans import Plan
from shardsim.training import SGD, Trainer
from shardsim.transformer.run import run_model

CFG = TransformerConfig(layers=2, d_model=8, heads=2, d_ff=16, vocab=8, seq=8)
MOE = CFG.scaled(experts=4)
SHORT_PLANS = (
    "dp=2",
    "dp=2,zero=1",
    "dp=2,zero=2",
    "dp=2,zero=3",
    "tp=2,sp",
    "cp=2",
    "cp=2,cp_balanced=false",
    "dp=2,cp=2",
    "dp=2,zero=1,cp=2",
    "dp=2,zero=2,cp=2",
    "dp=2,zero=3,cp=2,cp_method=all_gather",
    "dp=2,tp=2,cp=2",
    "pp=2,microbatches=2",
    "dp=2,cp=2,pp=2,microbatches=2",
    "dp=2,ep=2",
)


def _batch(cfg: TransformerConfig, plan: Plan, s: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    b = 2 * plan.dp * plan.ep * plan.microbatches
    return rng.integers(0, cfg.vocab, (b, s)), rng.integers(0, cfg.vocab, (b, s))


@pytest.mark.parametrize("text", SHORT_PLANS)
def test_grads_of_a_short_sequence_have_the_params_shapes(text: str, s: int = 4) -> None:
    """With learned positions and S < cfg.seq, every gradient is its weight's shape (pos_embed's rows
    past S zero) and equals the single-device reference's."""
    plan = Plan.parse(text)
    cfg = MOE if plan.ep > 1 else CFG
    params = reference.init(cfg, seed=1, dtype="float64")
    tokens, targets = _batch(cfg, plan, s)
    got = run_model(cfg, plan, plan.mesh(), params, tokens, targets)
    _, want = reference.loss_and_grads(cfg, params, tokens, targets)
    assert got.grads is not None
    for k, v in params.items():
        assert got.grads[k].shape == v.shape, k
        np.testing.assert_allclose(got.grads[k], want[k], rtol=1e-9, atol=1e-12, err_msg=k)
    assert not got.grads["pos_embed"][s:].any()


@pytest.mark.parametrize("text", ["dp=2,cp=2", "dp=2,zero=1,cp=2"])
def test_trainer_steps_twice_on_short_sequences_under_data_and_context(text: str) -> None:
    plan = Plan.parse(text)
    params = reference.init(CFG, seed=1, dtype="float64")
    tokens, targets = _batch(CFG, plan, 4)
    trainer = Trainer.for_model(CFG, plan, plan.mesh(), params, SGD(lr=0.1))
    trainer.step(tokens, targets)
    trainer.step(tokens, targets)  # the first step's update kept every weight's shape
    _, g1 = reference.loss_and_grads(CFG, params, tokens, targets)
    once = {k: v - 0.1 * g1[k] for k, v in params.items()}
    _, g2 = reference.loss_and_grads(CFG, once, tokens, targets)
    for k, v in trainer.params_global().items():
        np.testing.assert_allclose(v, once[k] - 0.1 * g2[k], rtol=1e-9, atol=1e-12, err_msg=k)


# -- the configuration: every size bounded, every hint found in O(sqrt n) ----------------------
TINY = {"layers": 1, "d_model": 8, "heads": 2, "d_ff": 16, "vocab": 8, "seq": 4}


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"d_model": 2**61 + 1, "heads": 3}, r"d_model=2305843009213693953 is past its limit 1048576"),
        ({"d_model": 2**20 - 1, "heads": 2}, r"d_model=1048575 does not divide by heads=2.*\(e\.g\. 1, 3, 5, 11\)"),
        ({"d_model": 2**20, "heads": 65521}, r"does not divide by heads=65521.*\(e\.g\. 1, 2, 4, 8\)"),
        ({"heads": 65521, "kv_heads": 7, "head_dim": 2}, r"heads=65521 does not divide by kv_heads=7.*\[1, 65521\]"),
        ({"heads": 2**17}, r"heads=131072 is past its limit 65536"),
        ({"layers": 10**12}, r"layers=1000000000000 is past its limit 16384"),
        ({"vocab": 2**40}, r"vocab=1099511627776 is past its limit"),
        ({"seq": 2**31}, r"seq=2147483648 is past its limit"),
        ({"d_ff": 2**23}, r"d_ff=8388608 is past its limit"),
        ({"experts": 2**21}, r"experts=2097152 is past its limit"),
        ({"head_dim": 2**17}, r"head_dim=131072 is past its limit"),
        ({"norm_eps": float("inf")}, r"norm_eps must be a positive finite number"),
    ],
)
def test_huge_config_fields_are_refused_at_once(changes: dict[str, object], words: str) -> None:
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=words):
        TransformerConfig(**{**TINY, **changes})  # type: ignore[arg-type]
    assert time.perf_counter() - start < 0.5


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    st.sampled_from(["layers", "d_model", "heads", "kv_heads", "head_dim", "d_ff", "vocab", "seq", "experts"]),
    st.integers(1, 2**64),
)
def test_every_size_is_bounded_and_counts_fast(field: str, value: int) -> None:
    """Each size is refused past its limit, or taken; a taken one counts its parameters at once
    (the count multiplies one block's weights by the layers) and equals the sum over the weights."""
    start = time.perf_counter()
    try:
        cfg = TransformerConfig(**{**TINY, "head_dim": 2, field: value})  # type: ignore[arg-type]
    except ConfigError as e:
        assert field in str(e)
    else:
        count = cfg.param_count()
        if cfg.layers <= 64:
            assert count == sum(int(np.prod(s)) for s in cfg.param_shapes().values())
    assert time.perf_counter() - start < 0.5


def test_param_count_is_the_sum_over_every_weight() -> None:
    for cfg in (CFG, MOE, CFG.scaled(bias=True, tie_embeddings=True, mlp="swiglu", position="rope", layers=3)):
        assert cfg.param_count() == sum(int(np.prod(s)) for s in cfg.param_shapes().values())


def test_tensor_parallel_hint_of_a_wide_model_is_quick() -> None:
    from shardsim.transformer import checks

    cfg = TransformerConfig(layers=1, d_model=2**20, heads=3 * 2**14, kv_heads=3, head_dim=2, d_ff=16, vocab=8, seq=4)
    start = time.perf_counter()
    with pytest.raises(DivisibilityError, match=r"kv_heads=3 and tp=2 .* use tp in \[1, 3, 6, 12, 24, 48, 96, 192\]$"):
        checks.check_model(cfg, Plan(tp=2), 4)
    assert time.perf_counter() - start < 0.5


# -- run_model's door: every bad argument named ------------------------------------------------
PARAMS = reference.init(CFG, seed=0, dtype="float64")
TOKENS = np.arange(16).reshape(2, 8) % 8
BAD_INPUTS = [
    ({"tokens": TOKENS.astype(float)}, ModelInputError, r"tokens must be integer token ids, got dtype float64"),
    ({"tokens": TOKENS.astype(bool)}, ModelInputError, r"tokens must be integer token ids, got dtype bool"),
    ({"tokens": TOKENS.astype(object)}, ModelInputError, r"tokens must be integer token ids, got dtype object"),
    ({"tokens": [[1, 2], [3]]}, ModelInputError, r"tokens must be a rectangular \[B, S\] array.*pad or cut"),
    ({"tokens": TOKENS[0]}, ModelInputError, r"tokens must be \[B, S\] token ids, got shape \(8,\)"),
    ({"tokens": -TOKENS}, ModelInputError, r"tokens\[0, 1\] = -1 is outside the vocabulary \[0, 8\)"),
    ({"tokens": TOKENS + 8}, ModelInputError, r"tokens\[0, 0\] = 8 is outside the vocabulary"),
    ({"targets": TOKENS[:, :4]}, ModelInputError, r"targets must have the tokens' shape \(2, 8\), got \(2, 4\)"),
    ({"targets": TOKENS.astype(np.float32)}, ModelInputError, r"targets must be integer token ids"),
    ({"params": {k: v for k, v in PARAMS.items() if k != "embed"}}, ShapeError, r"missing \['embed'\]"),
    ({"params": {**PARAMS, "extra": np.zeros(3)}}, ShapeError, r"unexpected \['extra'\]"),
    ({"params": {**PARAMS, "embed": np.zeros((3, 8))}}, ShapeError, r"param 'embed' has shape \(3, 8\).*\(8, 8\)"),
    ({"params": {**PARAMS, "embed": np.zeros((8, 8), int)}}, DtypeError, r"param 'embed' has dtype int64.*astype"),
    ({"params": list(PARAMS.values())}, ArgumentTypeError, r"params is a mapping of weight names to arrays, got list"),
    ({"params": {**PARAMS, "embed": PARAMS["embed"].tolist()}}, ArgumentTypeError, r"param 'embed' is a list, not an"),
    ({"tokens": TOKENS.astype(np.uint64)}, ModelInputError, r"tokens of dtype uint64 .* tokens.astype\(np.int64\)"),
    ({"targets": TOKENS.astype(np.uint64)}, ModelInputError, r"targets of dtype uint64"),
]


@pytest.mark.parametrize(("bad", "error", "words"), BAD_INPUTS)
def test_run_model_and_the_trainer_name_a_bad_input(bad: dict[str, object], error: type, words: str) -> None:
    args = {"params": PARAMS, "tokens": TOKENS, "targets": TOKENS, **bad}
    plan = Plan(dp=2)
    with pytest.raises(error, match=words):
        run_model(CFG, plan, plan.mesh(), args["params"], args["tokens"], args["targets"])
    with pytest.raises(error, match=words):
        Trainer.for_model(CFG, plan, plan.mesh(), args["params"], SGD(lr=0.1)).step(args["tokens"], args["targets"])


@pytest.mark.parametrize(
    ("cfg", "plan", "mesh", "words"),
    [
        ({}, Plan(dp=2), Mesh(data=2), r"run_model: cfg must be a shardsim.models.TransformerConfig .*, got dict"),
        (CFG, None, Mesh(data=2), r"run_model: plan must be a shardsim.plans.Plan or a plan string"),
        (CFG, 2, Mesh(data=2), r"plan must be .* got int"),
        (CFG, Plan(dp=2), {"data": 2}, r"mesh must be a shardsim.Mesh, got dict; pass Mesh\(\{'data': 2\}\)"),
        (CFG, Plan(dp=2), None, r"mesh must be a shardsim.Mesh, got NoneType; pass plan.mesh\(\)"),
    ],
)
def test_run_model_names_an_argument_of_the_wrong_kind(cfg: object, plan: object, mesh: object, words: str) -> None:
    with pytest.raises(ArgumentTypeError, match=words):
        run_model(cfg, plan, mesh, PARAMS, TOKENS, TOKENS)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match=words.replace("run_model", "Trainer.for_model")):  # the same check
        Trainer.for_model(cfg, plan, mesh, PARAMS, SGD(lr=0.1))  # type: ignore[arg-type]


def test_run_model_reads_a_plan_string() -> None:
    plan = Plan(dp=2, tp=2)
    by_text = run_model(CFG, "dp=2,tp=2", plan.mesh(), PARAMS, TOKENS, TOKENS)
    want_loss, want = reference.loss_and_grads(CFG, PARAMS, TOKENS, TOKENS)
    assert by_text.loss == pytest.approx(want_loss, rel=1e-12)
    assert by_text.grads is not None
    np.testing.assert_allclose(by_text.grads["layers.1.attn.wq"], want["layers.1.attn.wq"], rtol=1e-9, atol=1e-12)
    with pytest.raises(PlanError, match="unknown plan key 'tpp'"):
        run_model(CFG, "tpp=2", plan.mesh(), PARAMS, TOKENS, TOKENS)


# -- ZeRO's splits and the interleaved schedule's rule, checked against the config up front -----
BIASED = TransformerConfig(layers=2, d_model=8, heads=2, head_dim=3, d_ff=16, vocab=8, seq=4, bias=True)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("fsdp=4", r"weight layers.0.attn.bq \[NH\] of shape \(6,\): NH=6 does not divide by dp=4: ZeRO-3"),
        ("dp=4,zero=2", r"weight layers.0.attn.bq .* ZeRO-2 splits every weight's gradient.*dp among \[1, 2, 3, 6\]"),
        ("dp=4,zero=1", r"layers.0.attn.bq .* ZeRO-1 splits every weight's optimizer state .* or zero=0"),
        ("dp=4,zero=1,tp=2", r"NH=6 does not divide by tp=2 x dp=4.*dp among \[1, 3\]"),
        ("dp=3,zero=2", r"d_model=8 does not divide by dp=3: ZeRO-2 .*dp among \[1, 2, 4, 8\]"),
    ],
)
def test_zero_names_the_weight_it_cannot_split(text: str, words: str) -> None:
    plan = Plan.parse(text)
    params = reference.init(BIASED, seed=0, dtype="float64")
    tokens = np.zeros((2 * plan.dp, 4), int)
    with pytest.raises(DivisibilityError, match=words):
        run_model(BIASED, plan, plan.mesh(), params, tokens, tokens)
    with pytest.raises(DivisibilityError, match=words):
        Trainer.for_model(BIASED, plan, plan.mesh(), params, SGD(lr=0.1))


@st.composite
def zero_cases(draw: st.DrawFn) -> tuple[TransformerConfig, Plan]:
    tp = draw(st.sampled_from([1, 2]))
    cfg = TransformerConfig(
        layers=1,
        d_model=draw(st.sampled_from([8, 12, 6])),
        heads=2,
        kv_heads=draw(st.sampled_from([1, 2])),
        head_dim=draw(st.sampled_from([4, 2, 3])),
        d_ff=4 * draw(st.sampled_from([3, 2, 1])),
        vocab=4,
        seq=2,
        mlp=draw(st.sampled_from(["gelu", "swiglu"])),
        bias=True,
    )
    return cfg, Plan(dp=draw(st.sampled_from([2, 4, 3])), zero=draw(st.integers(1, 3)), tp=tp)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(zero_cases())
def test_a_zero_plan_is_refused_up_front_or_trains(case: tuple[TransformerConfig, Plan]) -> None:
    """Under ZeRO 1-3 every split of a weight (biases of any size included) is either refused by the
    plan's checks before any work, naming the weight or d_model, or the step runs and is the reference's."""
    cfg, plan = case
    params = reference.init(cfg, seed=2, dtype="float64")
    tokens = np.random.default_rng(0).integers(0, cfg.vocab, (plan.dp, cfg.seq))
    try:
        trainer = Trainer.for_model(cfg, plan, plan.mesh(), params, SGD(lr=0.1))
    except DivisibilityError as e:
        assert "does not divide" in str(e) and f"ZeRO-{plan.zero}" in str(e)
        with pytest.raises(DivisibilityError):
            run_model(cfg, plan, plan.mesh(), params, tokens, tokens)
        return
    trainer.step(tokens, tokens)
    _, want = reference.loss_and_grads(cfg, params, tokens, tokens)
    for k, v in trainer.params_global().items():
        np.testing.assert_allclose(v, params[k] - 0.1 * want[k], rtol=1e-9, atol=1e-12, err_msg=k)


def test_interleaved_microbatches_not_a_multiple_of_pp_is_a_plan_error() -> None:
    plan = Plan(pp=2, schedule="interleaved", virtual_stages=2, microbatches=3)
    params = reference.init(CFG.scaled(layers=4), seed=0, dtype="float64")
    tokens = np.zeros((6, 4), int)
    words = r"schedule=interleaved runs microbatches in groups of pp=2.*microbatches in \[2, 4\] or schedule=1f1b"
    with pytest.raises(PlanError, match=words):
        run_model(CFG.scaled(layers=4), plan, plan.mesh(), params, tokens, tokens)
    with pytest.raises(PlanError, match=words):
        Trainer.for_model(CFG.scaled(layers=4), plan, plan.mesh(), params, SGD(lr=0.1))
    with pytest.raises(PlanError, match=words):  # the estimate's shape-only program checks it the same way
        cost.estimate(CFG.scaled(layers=4), plan, "h100", batch_tokens=6 * 4, seq=4)
