"""Zero-bubble pipelines (Qi et al. 2024): the backward split into B and W, exact against the
single-device reference under DP, ZeRO, TP, SP, CP and EP; the schedules' bubbles against the
paper's closed forms; ZB-H1's peak from the ledger against 1F1B's; and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim import Mesh, ShapeDtype, ShardingError, planner, shard
from shardsim.cost import estimate
from shardsim.cost.layer_program import LayerCache
from shardsim.cost.pipeline_clock import clock
from shardsim.models import TransformerConfig, get, reference
from shardsim.planner.evaluate import step_clock
from shardsim.planner.space import Candidate
from shardsim.plans import Plan, PlanError
from shardsim.strategies.pipeline.execute import PipelineStep
from shardsim.strategies.pipeline.schedule import make, one_f_one_b, zb_h1, zb_h2
from shardsim.training import AdamW, Trainer, model_memory
from shardsim.transformer.run import run_model
from test_run_model import check_against_reference

BASE = TransformerConfig(layers=4, d_model=8, heads=2, d_ff=16, vocab=8, seq=8)
TINY = get("llama-tiny").scaled(layers=8, tie_embeddings=False, seq=64)  # the cost model's


@st.composite
def cases(draw: st.DrawFn) -> tuple[TransformerConfig, Plan, str, int, int | None]:
    pp = draw(st.sampled_from([2, 4]))
    other = draw(st.sampled_from(["dp", "tp", "sp", "cp", "ep", "zero3", "none"] if pp == 2 else ["none", "dp"]))
    dp = 2 if other in ("dp", "zero3") else 1
    tp = 2 if other in ("tp", "sp") else 1
    cp = 2 if other == "cp" else 1
    ep = 2 if other == "ep" else 1
    m = draw(st.sampled_from([1, 2, 4]))
    layers = pp * draw(st.sampled_from([1, 2]))
    cfg = BASE.scaled(
        layers=layers,
        heads=2 * tp,
        kv_heads=draw(st.sampled_from([1, 2])) * tp,
        d_ff=16 * tp,
        vocab=8 * tp,
        mlp="gelu" if other == "ep" else draw(st.sampled_from(["gelu", "swiglu"])),
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        position=draw(st.sampled_from(["learned", "rope"])),
        bias=draw(st.booleans()) and other != "zero3",
        experts=4 if other == "ep" else 0,
        dropout=0.25 if other not in ("cp", "ep") and draw(st.booleans()) else 0.0,
    )
    plan = Plan(
        dp=dp,
        zero=3 if other == "zero3" else draw(st.sampled_from([0, 1])) if dp > 1 else 0,
        tp=tp,
        sp=other == "sp",
        cp=cp,
        ep=ep,
        pp=pp,
        microbatches=m,
        schedule=draw(st.sampled_from(["zb-h1", "zb-h2"])),
        attention="standard" if cp == 1 else "flash",
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
    )
    b = dp * ep * m * draw(st.sampled_from([1, 2]))
    return cfg, plan, draw(st.sampled_from(["float32", "float64"])), b, 5


@settings(max_examples=30, deadline=None)
@given(cases())
def test_zero_bubble_pipelines_match_the_reference(case: tuple[TransformerConfig, Plan, str, int, int | None]) -> None:
    check_against_reference(*case)


def _step(text: str, b: int = 4, cfg: TransformerConfig = BASE) -> object:
    plan = Plan.parse(text)
    params = reference.init(cfg, seed=1, dtype="float64")
    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, cfg.vocab, (b, cfg.seq)), rng.integers(0, cfg.vocab, (b, cfg.seq))
    return run_model(cfg, plan, plan.mesh(), params, tokens, targets)


def test_w_runs_the_weight_matmuls_b_left_and_nothing_else() -> None:
    """Every weight-gradient matmul of a layer runs in its W pass, none in its B; the W passes
    hold the same products as 1F1B's backward, and the input-gradient products stay in B."""
    split, whole = _step("pp=2,microbatches=2,schedule=zb-h1"), _step("pp=2,microbatches=2")
    w = [e for e in split.trace.events if e.item.startswith("W")]
    assert w and {e.phase for e in w} == {"weight"}
    inputs = {e.label.split(".T @ ")[0] for e in w if e.op == "matmul"}  # X of X^T dY
    assert inputs == {"A", "C", "Cn", "H", "F"}  # Q, K, V; Wo; W_in; W_out; the LM head
    assert all(".T @ d" in e.label for e in w)
    assert not [e for e in split.trace.events if e.item.startswith("B") and ".T @ d" in e.label]

    def products(res: object, items: str) -> list[tuple[str, int]]:
        return sorted((e.label, e.flops) for e in res.trace.events if e.op == "matmul" and e.item[:1] in items)

    assert products(split, "BW") == products(whole, "B")


def test_the_optimizer_sees_every_deferred_w() -> None:
    """The step's gradients are whole once the last W has run: equal to 1F1B's, to the bit."""
    a, b = _step("pp=2,microbatches=4,schedule=zb-h2", b=4), _step("pp=2,microbatches=4", b=4)
    for key in a.grads:
        np.testing.assert_array_equal(a.grads[key], b.grads[key], err_msg=key)


@pytest.mark.parametrize("p", [4, 8])
@pytest.mark.parametrize("m", [8, 16, 32])
@pytest.mark.parametrize("times", [(1.0, 1.0, 1.0), (1.0, 1.2, 0.8), (1.0, 2.0, 1.0)])
def test_bubbles_are_the_papers_closed_forms(p: int, m: int, times: tuple[float, float, float]) -> None:
    """Qi et al. 2024, Table 1: ZB-H1 (p-1)(tF+tB-tW) against 1F1B's (p-1)(tF+tB+tW); ZB-H2
    within one step (the optimizer after the flush): (p-1) max(tF, tF+tB-2tW), once m >= 2p."""
    tf, tb, tw = times
    t = {"F": tf, "B": tb, "W": tw}

    def idle(s: object, duration: object) -> float:
        span = max(x.end for x in s.timeline(duration))
        return span - m * (tf + tb + tw)

    assert idle(one_f_one_b(p, m), lambda it: tf if it.kind == "F" else tb + tw) == pytest.approx(
        (p - 1) * (tf + tb + tw)
    )
    assert idle(zb_h1(p, m), lambda it: t[it.kind]) == pytest.approx((p - 1) * (tf + tb - tw))
    if m >= 2 * p:
        assert idle(zb_h2(p, m), lambda it: t[it.kind]) == pytest.approx((p - 1) * max(tf, tf + tb - 2 * tw))


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (3, 5), (4, 2)])
def test_held_microbatches_are_the_papers(p: int, m: int) -> None:
    """ZB-H1 holds at most p microbatches on any stage (1F1B's first stage), ZB-H2 at most 2p-1."""
    assert max(zb_h1(p, m).peak_in_flight()) == max(one_f_one_b(p, m).peak_in_flight()) == min(p, m)
    assert max(zb_h2(p, m).peak_in_flight()) == min(2 * p - 1, m)


def test_zb_h1_peaks_where_1f1b_does_from_the_ledger() -> None:
    """Qi et al.: ZB-H1's peak is 1F1B's, p microbatches' stash. From the ledger of a shape-only
    step: the first stage holds as many microbatches as under 1F1B, those past their B only what
    their W reads, so its peak is at most 1F1B's; the later stages hold more microbatches than
    under 1F1B, but partly, and no stage's peak passes 1F1B's highest (the first stage's) by more
    than the last stage's logit gradients, which its W reads (1% here). ZB-H2 holds more."""
    cfg = BASE.scaled(layers=8, d_model=64, heads=4, d_ff=256, vocab=64, seq=64)
    params = {k: ShapeDtype(s, np.float32) for k, s in cfg.param_shapes().items()}
    tok = ShapeDtype((8, cfg.seq), np.int64)

    def peaks(schedule: str) -> list[int]:
        plan = Plan.parse(f"pp=4,microbatches=8,schedule={schedule}")
        res = run_model(cfg, plan, plan.mesh(), params, tok, tok)
        return [int(v) for v in res.memory["total"].reshape(-1)]

    one, h1, h2 = peaks("1f1b"), peaks("zb-h1"), peaks("zb-h2")
    assert h1[0] <= one[0] and max(h1) <= 1.01 * max(one)
    assert min(h2) > max(one)


def test_shape_only_and_exact_runs_trace_the_same_split_program() -> None:
    cfg = BASE
    plan = Plan.parse("pp=2,microbatches=2,schedule=zb-h1")
    params = reference.init(cfg, seed=1, dtype="float32")
    tokens = np.zeros((4, cfg.seq), np.int64)
    exact = run_model(cfg, plan, plan.mesh(), params, tokens, tokens)
    shapes = {k: ShapeDtype(v.shape, v.dtype) for k, v in params.items()}
    traced = run_model(
        cfg, plan, plan.mesh(), shapes, ShapeDtype((4, cfg.seq), np.int64), ShapeDtype((4, cfg.seq), np.int64)
    )
    assert [(e.op, e.label, e.item) for e in exact.trace.events] == [
        (e.op, e.label, e.item) for e in traced.trace.events
    ]


def test_bad_zero_bubble_plans_are_refused_by_rule() -> None:
    with pytest.raises(PlanError, match="virtual_stages=2 needs schedule='interleaved'"):
        Plan.parse("pp=2,schedule=zb-h1,virtual_stages=2")
    with pytest.raises(ShardingError, match="runs one chunk per stage"):
        make("zb-h2", 2, 4, 2)
    mesh = Mesh(Z=2)
    x = shard(np.ones((4, 4)), mesh, "[B, D]")
    w = shard(np.ones((2, 4, 4)), mesh, "[L_Z, D, F]")
    from shardsim.strategies.base import Ctx

    ctx = Ctx(axes={"pipe": "Z"})
    with pytest.raises(ShardingError, match="splits each backward into B and W"):
        PipelineStep(ctx, x, {"w_in": w, "w_out": w}, zb_h1(2, 2), lambda *a: a, lambda *a: a)


@pytest.mark.parametrize("p", [4, 8])
@pytest.mark.parametrize("m", [8, 16, 32])
def test_the_clock_on_the_traced_layer_gives_the_closed_forms(p: int, m: int) -> None:
    """T_F, T_B and T_W read off the traced layer (its B and W passes timed apart), every stage
    given the same layers: the pipeline clock's bubble is each schedule's closed form."""
    cache = LayerCache(TINY, "h100", seq=64)
    for schedule in ("1f1b", "zb-h1", "zb-h2"):
        lay = cache.layer(Plan.parse(f"pp={p},microbatches={m},schedule={schedule}"), 1)
        per = lay.per_layer
        tf, tw = per.fwd, per.wgt
        tb = per.bwd - tw
        assert tw == 0 if schedule == "1f1b" else tb > tw > 0
        span, _, busy = clock(make(schedule, p, m, 1), [tf] * p, [per.bwd] * p, wgt=[tw] * p)
        assert busy == pytest.approx(m * (tf + tb + tw))
        want = {"1f1b": (p - 1) * (tf + tb + tw), "zb-h1": (p - 1) * (tf + tb - tw),
                "zb-h2": (p - 1) * max(tf, tf + tb - 2 * tw)}[schedule]  # fmt: skip
        if schedule == "zb-h2" and m < 2 * p:
            continue
        assert span - busy == pytest.approx(want), schedule  # exact: the issue asks 2%


def test_an_estimate_of_a_zero_bubble_plan_reads_its_w_passes() -> None:
    """The estimate's time line runs the W passes (their own phase), its bubble is smaller than
    1F1B's, and its step is the planner's clock for the same plan."""
    cfg = TINY
    one = estimate(cfg, "pp=4,microbatches=8", "h100", batch_tokens=8 * 64, seq=64)
    zb = estimate(cfg, "pp=4,microbatches=8,schedule=zb-h1", "h100", batch_tokens=8 * 64, seq=64)
    assert "weight" in zb.phases and "weight" not in one.phases
    assert zb.bubble_s < one.bubble_s and zb.step_s < one.step_s
    cache = LayerCache(cfg, "h100", seq=64)
    c = Candidate(Plan.parse("pp=4,microbatches=8,schedule=zb-h1"), 1, 8)
    assert step_clock(cache, c)[0] == pytest.approx(zb.step_s, rel=1e-9)


def test_the_estimated_memory_of_a_split_pipeline_bounds_the_traced_one() -> None:
    """The two-stage probe counts each microbatch held until its W as a whole stash: at or above
    the fully traced step's peak, and within a quarter of it."""
    cfg = TINY
    for text in ("pp=4,microbatches=8,schedule=zb-h1", "pp=4,microbatches=8,schedule=zb-h2",
                 "dp=2,tp=2,sp,pp=2,microbatches=4,schedule=zb-h1"):  # fmt: skip
        plan = Plan.parse(text)
        probed = model_memory(cfg, plan, batch=plan.dp * 8, seq=16)[0]["total"]
        traced = model_memory(cfg, plan, batch=plan.dp * 8, seq=16, full=True)[0]["total"]
        assert traced <= probed <= 1.25 * traced, text


def test_the_planner_says_how_zero_bubble_compares() -> None:
    table = planner.plan(TINY, "h100", 8, 8 * 64, 64, pp=4, zero_bubble=True)
    line = next(x for x in str(table).splitlines() if x.startswith("schedule: "))
    assert "zero bubble" in line or table.best.plan.schedule in ("zb-h1", "zb-h2")


def test_three_adamw_steps_equal_1f1b_with_every_w_before_the_update() -> None:
    """The optimizer steps once every deferred W has run: three AdamW steps under ZB-H1 and
    ZB-H2 leave the weights 1F1B leaves, to the bit."""
    plan_of = {s: Plan.parse(f"dp=2,pp=2,microbatches=2,schedule={s}") for s in ("1f1b", "zb-h1", "zb-h2")}
    params = reference.init(BASE, seed=1, dtype="float64")
    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, BASE.vocab, (8, BASE.seq)), rng.integers(0, BASE.vocab, (8, BASE.seq))
    after = {}
    for name, plan in plan_of.items():
        trainer = Trainer.for_model(BASE, plan, plan.mesh(), params, AdamW(lr=1e-2))
        for _ in range(3):
            trainer.step(tokens, targets)
        after[name] = trainer.params_global()
    for key, want in after["1f1b"].items():
        for name in ("zb-h1", "zb-h2"):
            np.testing.assert_array_equal(after[name][key], want, err_msg=f"{name} {key}")


def test_the_planner_searches_zero_bubble_when_asked() -> None:
    """Off by default (each split backward is its own layer program and memory probe); on with
    ``zero_bubble=True``; by name (``schedule="zb-h2"``) whatever ``m``."""

    def schedules(**options: object) -> set[str]:
        table = planner.plan(TINY, "h100", 8, 8 * 64, 64, pp=4, microbatches=4, **options)
        return {e.plan.schedule for e in table.rows} | {r.candidate.plan.schedule for r in table.rejected}

    assert not schedules() & {"zb-h1", "zb-h2"}
    assert "zb-h1" in schedules(zero_bubble=True) and "zb-h2" not in schedules(zero_bubble=True)  # m < 2p
    assert schedules(schedule="zb-h2") == {"zb-h2"}


def test_shardsim_plan_and_estimate_take_zero_bubble(capsys: pytest.CaptureFixture[str]) -> None:
    from shardsim import cli

    argv = ["plan", "--model", "llama-tiny", "--hardware", "h100", "--chips", "8", "--batch-tokens", "64",
            "--seq", "16", "--fix", "pp=2,microbatches=4", "--zero-bubble"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "zb-h1" in out and any(line.startswith("schedule: ") for line in out.splitlines())
    argv = ["estimate", "--model", "llama-tiny", "--plan", "pp=2,microbatches=4,schedule=zb-h2", "--hardware",
            "h100", "--chips", "2", "--batch-tokens", "64", "--seq", "16"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "pipeline zb-h2, 2 stages x 4 microbatches" in out and "w/W weight gradients" in out
