"""A plan the planner returns estimates, through ``shardsim.cost.estimate`` and ``shardsim
estimate``, to the planner's own step time, memory and verdict.

With a pipeline both read the layer program's clock and the two-stage probe's memory
(``shardsim.cost.pipeline_clock``, ``shardsim.training.stage_memory``); tests/test_pipeline_clock.py
and tests/test_stage_memory.py hold those to the whole program's events and ledger.

Without a pipeline a plan's ``microbatches`` is gradient accumulation: the planner runs the
microbatches one after another, the gradient reduction over the data axis once, after the
last (docs/planner.md), and the estimate's program is one microbatch's program repeated so
(``shardsim.cost.model_steps.accumulated``). The reference for the accumulated step is the
estimate's own one-microbatch step, timed with and without the reduction.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from shardsim import cli, cost
from shardsim.cost.layer_program import LayerCache
from shardsim.cost.model_steps import accumulated, is_sync, model_program
from shardsim.cost.timeline import build_timeline
from shardsim.models import TransformerConfig, get
from shardsim.planner import Candidate, plan
from shardsim.planner.evaluate import evaluate
from shardsim.plans import Plan

KEYS = ("params", "grads", "optimizer", "activations", "total")
TOL = 0.005  # the brief's bar; the figures below agree to about 1e-5


def _disagree(r, e) -> list[str]:
    bad = []
    if not math.isclose(r.step_s, e.step_s, rel_tol=TOL):
        bad.append(f"{r.plan}: step {r.step_s!r} against {e.step_s!r}")
    for k in KEYS:
        if not math.isclose(r.memory[k], e.memory[k], rel_tol=TOL):
            bad.append(f"{r.plan}: {k} {r.memory[k]} against {e.memory[k]}")
    if r.fits != e.fits:
        bad.append(f"{r.plan}: fits {r.fits} against {e.fits}")
    return bad


models = st.builds(
    lambda layers, heads, kv, width, ff, vocab, mlp, tied: TransformerConfig(
        layers=layers, d_model=heads * width, heads=heads, kv_heads=kv if heads % kv == 0 else heads,
        d_ff=ff, vocab=vocab, seq=8, mlp=mlp, tie_embeddings=tied, dropout=0.0,
    ),
    st.integers(1, 3), st.sampled_from([2, 4]), st.sampled_from([1, 2]), st.sampled_from([2, 4]),
    st.sampled_from([8, 16, 24]), st.integers(8, 20), st.sampled_from(["gelu", "swiglu"]), st.booleans(),
)  # fmt: skip


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=[Phase.explicit, Phase.generate]
)
@given(models, st.sampled_from([2, 4]), st.sampled_from([4, 8]))
@example(  # at one layer ZeRO-2's gradient buffer peak is the head's: bytes read off two and three layers
    cfg=TransformerConfig(layers=3, d_model=8, heads=2, kv_heads=1, d_ff=8, vocab=15, seq=8, tie_embeddings=False),
    chips=2,
    sequences=4,
)
def test_every_row_without_a_pipeline_estimates_to_the_planners_figures(cfg, chips, sequences) -> None:
    table = plan(cfg, "h100", chips, batch_tokens=sequences * 8, seq=8, pp=1, micro_range=(1, 2), window=1.0)
    accumulating = [r for r in table.rows if r.plan.microbatches > 1][:1]
    for r in [*table.rows[:3], *accumulating]:  # the best rows, and the best that accumulates
        e = cost.estimate(cfg, str(r.plan), "h100", batch_tokens=r.tokens, seq=8)
        assert not _disagree(r, e), _disagree(r, e)


def test_the_command_line_gives_the_planners_figures_for_an_accumulated_plan(capsys) -> None:
    cfg = get("llama-tiny")
    table = plan(cfg, "h100", 4, batch_tokens=16 * cfg.seq, seq=cfg.seq, pp=1, micro_range=(1, 2))
    r = next(r for r in table.rows if r.plan.microbatches > 1)
    argv = ["estimate", "--model", "llama-tiny", "--plan", str(r.plan), "--hardware", "h100",
            "--batch-tokens", str(r.tokens), "--seq", str(cfg.seq), "--json"]  # fmt: skip
    assert cli.main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert math.isclose(got["step_s"], r.step_s, rel_tol=TOL), (got["step_s"], r.step_s)
    assert math.isclose(got["memory_bytes"], r.memory["total"], rel_tol=TOL)


def test_the_command_line_gives_the_planners_figures_for_a_pipelined_plan(capsys) -> None:
    cfg, seq, p = get("llama3-8b"), 1024, Plan.parse("dp=2,tp=4,pp=4,microbatches=8")
    r = evaluate(LayerCache(cfg, "h100", seq=seq), Candidate(p, 1, 16))
    argv = ["estimate", "--model", "llama3-8b", "--plan", str(p), "--hardware", "h100",
            "--batch-tokens", str(16 * seq), "--seq", str(seq), "--json"]  # fmt: skip
    assert cli.main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert math.isclose(got["step_s"], r.step_s, rel_tol=TOL), (got["step_s"], r.step_s)
    assert math.isclose(got["memory_bytes"], r.memory["total"], rel_tol=TOL)


def test_an_accumulated_step_is_m_microbatches_and_one_reduction() -> None:
    """``m`` microbatches: ``m - 1`` of the microbatch's step without the data-axis reduction,
    then the microbatch's whole step (its backward overlapping the reduction); the memory is
    one microbatch's step's, the model FLOPs the whole batch's."""
    cfg, hw, seq = get("llama-tiny"), cost.get_hardware("h100"), 16
    one = cost.estimate(cfg, "dp=2,tp=2", hw, batch_tokens=4 * seq, seq=seq)
    acc = cost.estimate(cfg, "dp=2,tp=2,microbatches=3", hw, batch_tokens=12 * seq, seq=seq)
    params = frozenset(cfg.param_shapes())
    alone = [s for s in one.program.steps if not is_sync(s.event, params)]
    work = build_timeline(alone, hw, one.placement, efficiency=one.efficiency, mesh=one.mesh).step_s
    assert len(alone) < len(one.program.steps)  # the plan reduces over the data axis
    assert math.isclose(acc.step_s, 2 * work + one.step_s, rel_tol=1e-4), (acc.step_s, 2 * work + one.step_s)
    assert acc.memory == one.memory
    assert math.isclose(acc.model_flops, 3 * one.model_flops, rel_tol=1e-12)
    whole = cost.estimate(cfg, "dp=2,tp=2", hw, batch_tokens=12 * seq, seq=seq)  # one batch of 6 per rank
    assert acc.memory["activations"] < whole.memory["activations"]


def test_the_accumulated_program_repeats_the_microbatch_and_reduces_once() -> None:
    cfg, seq = get("gpt-tiny"), 16
    one = model_program(cfg, Plan(dp=2), 2 * seq, seq)
    acc = model_program(cfg, Plan(dp=2, microbatches=4), 8 * seq, seq)
    params = frozenset(cfg.param_shapes())
    syncs = sum(is_sync(s.event, params) for s in one.steps)
    assert syncs > 0 and sum(is_sync(s.event, params) for s in acc.steps) == syncs
    assert len(acc.steps) == 4 * len(one.steps) - 3 * syncs
    assert len({s.output for s in acc.steps}) == len(acc.steps)  # every copy writes its own values
    assert acc.steps == accumulated(one.steps, 4, params)


def test_a_mixture_of_experts_accumulates_and_reduces_its_experts_once() -> None:
    """The experts' gradient reductions (labelled by the weights' last names) run once per
    step, after the last microbatch, as every other weight's."""
    cfg = get("moe-tiny")
    table = plan(cfg, "h100", 4, batch_tokens=16 * cfg.seq, seq=cfg.seq, pp=1, ep=2, micro_range=(1, 2))
    rows = [r for r in table.rows if r.plan.microbatches > 1][:3]
    assert rows, [str(r.plan) for r in table.rows]
    for r in rows:
        e = cost.estimate(cfg, str(r.plan), "h100", batch_tokens=r.tokens, seq=cfg.seq)
        assert not _disagree(r, e), _disagree(r, e)
    params = frozenset(cfg.param_shapes())
    one = model_program(cfg, Plan(dp=2, ep=2), 4 * cfg.seq, cfg.seq)
    experts = [s.event.label for s in one.steps if is_sync(s.event, params) and "expert" not in s.event.axes]
    assert {"dw_in", "dw_out"} <= set(experts), experts


@pytest.mark.parametrize(
    "spec",
    [
        "dp=2,tp=2,pp=2,microbatches=4",
        "dp=2,zero=1,pp=4,microbatches=8",
        "pp=2,microbatches=4,schedule=gpipe,recompute=full",
        "tp=2,sp,pp=2,microbatches=4,schedule=interleaved,virtual_stages=2",
        "dp=2,tp=2,sp,pp=2,microbatches=4,schedule=zb-h1",
        "dp=2,pp=4,microbatches=8,schedule=zb-h2",
    ],
)
def test_a_pipelined_plan_estimates_to_the_planners_figures(spec: str) -> None:
    cfg, seq = get("llama-tiny").scaled(layers=8), 16
    p = Plan.parse(spec)
    batch = p.dp * p.microbatches
    r = evaluate(LayerCache(cfg, "h100", seq=seq), Candidate(p, 1, batch))
    e = cost.estimate(cfg, p, "h100", batch_tokens=batch * seq, seq=seq)
    assert not _disagree(r, e), _disagree(r, e)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([4, 6, 8]), st.sampled_from([4, 8]), st.sampled_from([8, 16]))
def test_every_pipelined_row_estimates_to_the_planners_figures(layers: int, chips: int, sequences: int) -> None:
    """The planner's best pipelined rows, their text given to ``estimate`` (a deeper model, untied)."""
    cfg = get("llama-tiny").scaled(layers=layers, tie_embeddings=False)
    table = plan(cfg, "h100", chips, batch_tokens=sequences * 16, seq=16, micro_range=(1, 2), window=1.0)
    rows = [r for r in table.rows if r.plan.pp > 1][:3]
    assert rows, [str(r.plan) for r in table.rows[:5]]
    for r in rows:
        e = cost.estimate(cfg, str(r.plan), "h100", batch_tokens=r.tokens, seq=16)
        assert not _disagree(r, e), _disagree(r, e)
