"""Trainer.for_model against single-device training: the reference's gradients
(``shardsim.models.reference``) and the optimizers written from their papers
(``training_reference``), step after step, for every ZeRO stage with TP, PP and CP; where the
optimizer state lives; the collectives of the update; atomic steps; bad input."""

from __future__ import annotations

import numpy as np
import pytest

import shardsim
from shardsim import ChipFailureError, DivisibilityError, ShapeDtype
from shardsim.errors import PlanError, ShapeError
from shardsim.models import TransformerConfig, get, reference
from shardsim.plans import Plan
from shardsim.training import Adam, Trainer
from training_reference import Opt, _step

LLAMA = get("llama-tiny")  # 2 layers, D=32, 4 heads (2 kv), F=96, V=64, S=16, untied
GPT = get("gpt-tiny")  # biases, learned positions, tied embeddings


def batches(cfg: TransformerConfig, b: int, steps: int, seq: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    s = seq or cfg.seq
    return [(rng.integers(0, cfg.vocab, (b, s)), rng.integers(0, cfg.vocab, (b, s))) for _ in range(steps)]


def reference_training(
    cfg: TransformerConfig, params: dict[str, np.ndarray], data: list[tuple[np.ndarray, np.ndarray]], opt: Opt
) -> tuple[dict[str, np.ndarray], list[float]]:
    """One device: the reference's loss and gradients, then the paper's update, step after step."""
    w = {k: v.copy() for k, v in params.items()}
    state: dict[str, dict[str, np.ndarray]] = {k: {} for k in w}
    losses = []
    for t, (tok, tgt) in enumerate(data, start=1):
        loss, grads = reference.loss_and_grads(cfg, w, tok, tgt)
        losses.append(loss)
        for k in w:
            w[k] = _step(opt, w[k], grads[k], state[k], t)[0].astype(w[k].dtype)
    return w, losses


PLANS = [
    Plan(dp=2, zero=0),
    Plan(dp=2, zero=1),
    Plan(dp=2, zero=2),
    Plan(dp=2, zero=3),
    Plan(dp=2, zero=1, tp=2),
    Plan(dp=2, zero=3, tp=2, sp=True),
    Plan(dp=2, zero=1, pp=2, microbatches=2),
    Plan(dp=2, zero=2, tp=2, pp=2, microbatches=2),
    Plan(dp=2, zero=1, cp=2),
    Plan(dp=2, zero=3, cp=2, cp_method="all_gather"),
    Plan(tp=2, pp=2, microbatches=4, schedule="gpipe"),
]
TOL = {"float64": 1e-10, "float32": 2e-5}
# Adam divides each gradient by its running size, so float32 rounding noise on a near-zero
# gradient becomes a full-size step on either side: Adam is held to the reference in float64,
# momentum SGD (which passes gradient error on scaled by lr alone) in both dtypes.
RUNS = [("float64", Opt("adam", lr=1e-2)), ("float64", Opt("momentum", lr=0.5)), ("float32", Opt("momentum", lr=0.5))]


@pytest.mark.parametrize("plan", PLANS, ids=str)
@pytest.mark.parametrize(("dtype", "opt"), RUNS, ids=lambda v: v if isinstance(v, str) else v.kind)
def test_steps_equal_single_device_training(plan: Plan, dtype: str, opt: Opt) -> None:
    cfg = LLAMA
    params = reference.init(cfg, seed=3, dtype=dtype)
    data = batches(cfg, 4, 3)
    want, want_losses = reference_training(cfg, params, data, opt)
    optimizer = Adam(lr=opt.lr) if opt.kind == "adam" else shardsim.training.SGD(lr=opt.lr, momentum=opt.momentum)
    t = Trainer.for_model(cfg, plan, plan.mesh(), params, optimizer)
    losses = [t.step(tok, tgt).loss for tok, tgt in data]
    assert losses == pytest.approx(want_losses, rel=TOL[dtype])
    got = t.params_global()
    assert list(got) == list(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype
        err = np.abs(got[k] - w).max()
        assert err <= TOL[dtype] * max(1.0, np.abs(w).max()), f"{k}: {err:.3g} under {plan}"
    assert t.step_count == 3


def test_tied_embeddings_and_biases_train_exactly() -> None:
    cfg, plan = GPT, Plan(dp=2, zero=2, tp=2)
    params = reference.init(cfg, seed=0, dtype="float64")
    data = batches(cfg, 2, 2)
    want, _ = reference_training(cfg, params, data, Opt("adam", lr=1e-2))
    t = Trainer.for_model(cfg, plan, plan.mesh(), params, Adam(lr=1e-2))
    for tok, tgt in data:
        t.step(tok, tgt)
    for k, w in t.params_global().items():
        np.testing.assert_allclose(w, want[k], atol=1e-10, err_msg=k)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_where_the_optimizer_state_lives_and_the_update_collectives(zero: int) -> None:
    plan = Plan(dp=2, zero=zero, tp=2)
    t = Trainer.for_model(LLAMA, plan, plan.mesh(), reference.init(LLAMA), "adam")
    r = t.step(*batches(LLAMA, 2, 1)[0])
    wq = "layers.0.attn.wq"
    state = r.layouts[f"opt_{wq}"]
    assert state == ("[D, NH_{model}]" if zero == 0 else "[D_{data}, NH_{model}]")
    assert t.moments[wq]["v"].layout == shardsim.Layout.parse(state, plan.mesh().axis_names)
    assert r.layouts[f"d{wq}"] == ("[D_{data}, NH_{model}]" if zero >= 2 else "[D, NH_{model}]")
    optimizer = [op for op, _ in r.trace.collectives("optimizer")]
    # ZeRO-1/2: each chip updates its slice, then one AllGather per weight; ZeRO-0/3: in place
    assert optimizer == (["all_gather"] * len(LLAMA.param_shapes()) if zero in (1, 2) else [])
    reductions = ("all_reduce", "reduce_scatter")
    backward = {op for op, axes in r.trace.collectives("backward") if "data" in axes and op in reductions}
    assert backward == ({"all_reduce"} if zero < 2 else {"reduce_scatter"})


def test_mixed_precision_keeps_float32_masters_and_moments() -> None:
    plan = Plan(dp=2, zero=1)
    params = reference.init(LLAMA, seed=0)
    t = Trainer.for_model(LLAMA, plan, plan.mesh(), params, "adam", precision="bf16")
    r = t.step(*batches(LLAMA, 2, 1)[0])
    assert t.params["embed"].dtype.name == "bfloat16"
    assert t.master["embed"].dtype == np.float32 and t.moments["embed"]["m"].dtype == np.float32
    assert r.loss is not None and np.isfinite(r.loss)
    # the 16-bit weights are the rounded masters
    np.testing.assert_array_equal(
        t.params["embed"].to_global(), t.master["embed"].to_global().astype(t.params["embed"].dtype)
    )


def test_a_failed_step_changes_nothing_and_a_retry_equals_a_clean_run() -> None:
    plan = Plan(dp=2, zero=2)
    params = reference.init(LLAMA, seed=0, dtype="float64")
    data = batches(LLAMA, 2, 2)
    clean = Trainer.for_model(LLAMA, plan, plan.mesh(), params, "adam")
    for tok, tgt in data:
        clean.step(tok, tgt)
    mesh = plan.mesh()
    t = Trainer.for_model(LLAMA, plan, mesh, params, "adam")
    t.step(*data[0])
    before = {k: v.copy() for k, v in t.params_global().items()}
    live = mesh.memory.live().copy()
    mesh.fail(data=1)
    with pytest.raises(ChipFailureError):
        t.step(*data[1])
    mesh.heal()
    assert t.step_count == 1
    assert all(np.array_equal(v, before[k]) for k, v in t.params_global().items())
    assert np.array_equal(mesh.memory.live(), live)
    t.step(*data[1])
    for k, w in clean.params_global().items():
        np.testing.assert_array_equal(t.params_global()[k], w)


def test_shape_only_at_real_size_counts_without_arithmetic() -> None:
    cfg = get("llama3-8b")
    plan = Plan(dp=8, zero=1, tp=8)
    shapes = {k: ShapeDtype(s, "float32") for k, s in cfg.param_shapes().items()}
    t = Trainer.for_model(cfg, plan, plan.mesh(), shapes, "adam", precision="bf16")
    r = t.step(ShapeDtype((8, 8192), "int32"), ShapeDtype((8, 8192), "int32"))
    assert r.loss is None
    n = cfg.param_count()
    # ZeRO-1 mixed-precision Adam: 12 bytes a parameter, split over dp and over tp, except the
    # RMSNorm gains, which every chip of the model axis keeps whole
    gains = (2 * cfg.layers + 1) * cfg.d_model
    assert sum(r.model_state["optimizer"].flat) == 12 * (n + (plan.tp - 1) * gains)
    assert int(r.model_state["params"].max()) == pytest.approx(2 * n / 8, rel=0.01)


def test_bad_input_names_the_culprit() -> None:
    params = reference.init(LLAMA)
    with pytest.raises(PlanError, match="tp=2"):
        Trainer.for_model(LLAMA, Plan(dp=2, tp=2), Plan(dp=2).mesh(), params)
    with pytest.raises(DivisibilityError, match="heads=4 does not divide by tp=8"):
        Trainer.for_model(LLAMA, Plan(tp=8), Plan(tp=8).mesh(), params)
    with pytest.raises(ShapeError, match="missing"):
        Trainer.for_model(LLAMA, Plan(dp=2), Plan(dp=2).mesh(), {"embed": params["embed"]})
    with pytest.raises(PlanError, match="loss scaling"):
        Trainer.for_model(LLAMA, Plan(dp=2), Plan(dp=2).mesh(), params, precision="fp16")
    with pytest.raises(
        shardsim.ArgumentTypeError, match=r"Trainer\.for_model: cfg must be a shardsim\.models\.TransformerConfig"
    ):
        Trainer.for_model("llama-tiny", Plan(dp=2), Plan(dp=2).mesh(), params)  # type: ignore[arg-type]
    t = Trainer.for_model(LLAMA, Plan(dp=4), Plan(dp=4).mesh(), params)
    tok = np.zeros((2, 16), np.int64)
    with pytest.raises(DivisibilityError, match="batch B=2 does not divide by dp=4"):
        t.step(tok, tok)
    assert t.step_count == 0


@pytest.mark.parametrize("plan", [Plan(dp=2, zero=1, pp=2, microbatches=2), Plan(dp=2, zero=3, tp=2)], ids=str)
def test_a_checkpoint_resumes_bit_for_bit_and_loads_under_another_zero_stage(plan: Plan, tmp_path: object) -> None:
    from shardsim import checkpoint

    params = reference.init(LLAMA, seed=0, dtype="float64")
    data = batches(LLAMA, 4, 3)
    clean = Trainer.for_model(LLAMA, plan, plan.mesh(), params, "adam", precision="bf16")
    losses = [clean.step(tok, tgt).loss for tok, tgt in data]
    a = Trainer.for_model(LLAMA, plan, plan.mesh(), params, "adam", precision="bf16")
    a.step(*data[0])
    other = plan.replace(zero=2)  # another stage: the state is assembled and split as that trainer holds it
    b = Trainer.for_model(LLAMA, other, other.mesh(), params, "adam", precision="bf16")
    b.restore(checkpoint.load(checkpoint.save(f"{tmp_path}/step_1", a.state()), b.mesh))
    assert b.step_count == 1
    for k, w in a.params_global().items():
        np.testing.assert_array_equal(b.params_global()[k], w)
    same = Trainer.for_model(LLAMA, plan, plan.mesh(), params, "adam", precision="bf16")
    same.restore(checkpoint.load(checkpoint.save(f"{tmp_path}/again", a.state()), same.mesh))
    assert [same.step(tok, tgt).loss for tok, tgt in data[1:]] == losses[1:]
    held = same.params["layers.1.attn.wq"].holders  # a restored weight stays on its stage
    assert plan.pp == 1 or (held is not None and not held[:, 0].any())
