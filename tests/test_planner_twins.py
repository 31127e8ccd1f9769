"""Plans that run one program are listed once, the simplest, and the table's "why" line
compares the best plan with the best plan that differs from it.

Under FlashAttention selective recomputation has nothing to recompute (it recomputes the
attention scores, Korthikanti et al. 2022, which the fused kernel never stores), so the plan
with ``recompute=selective`` and the plan with ``recompute=none`` are one program: traced
apart, their figures are equal to the byte and the nanosecond. The table keeps the plan
without the idle setting.
"""

from __future__ import annotations

from shardsim.cost.layer_program import LayerCache
from shardsim.models import get
from shardsim.planner import Candidate, plan
from shardsim.planner.evaluate import evaluate
from shardsim.plans import Plan

TINY = get("llama-tiny")


def figures(e: object) -> tuple[object, ...]:
    """What a reader of the table sees of a plan: its step time and its bytes per category."""
    return (round(e.step_s, 15), e.tokens, tuple(sorted(e.memory.items())))  # type: ignore[attr-defined]


def _figures(cache: LayerCache, recompute: str) -> tuple[float, dict[str, int]]:
    e = evaluate(cache, Candidate(Plan(tp=2, attention="flash", recompute=recompute), micro=4, batch=4))
    return e.step_s, e.memory


def test_selective_recomputation_under_flash_attention_is_the_program_without_it():
    cache = LayerCache(TINY, "h100", seq=16)
    assert _figures(cache, "selective") == _figures(cache, "none")
    assert _figures(cache, "full") != _figures(cache, "none")  # full recomputation does change the step


def test_the_table_keeps_one_plan_of_each_program_the_simplest():
    table = plan(TINY, "h100", 2, batch_tokens=4 * 16, seq=16, zero=0, tp=2)
    seen = [(r.plan.dp, r.plan.tp, r.candidate.micro, *figures(r)) for r in table.rows]
    assert len(seen) == len(set(seen))
    kept = {str(r.plan) for r in table.rows}
    assert "tp=2" in kept and "tp=2,recompute=selective" not in kept
    twins = {str(r.candidate.plan): r.detail for r in table.rejected if r.kind == "twin"}
    assert twins["tp=2,recompute=selective"] == "tp=2"


def test_why_never_compares_the_best_with_its_own_twin():
    table = plan(TINY, "h100", 2, batch_tokens=4 * 16, seq=16, zero=0, tp=2)
    why = table.why_best()
    assert "by 0.0% per token: the runner-up's parts are equal" not in why
    runner = table.runner_up
    assert runner is None or figures(runner) != figures(table.best)
    if runner is None:  # one program left: the line names the twin it stands for
        assert why == ("tp=2 is the only plan kept; tp=2,recompute=selective runs its very program.")


def test_why_compares_the_best_with_the_fastest_plan_that_differs():
    table = plan(TINY, "h100", 2, batch_tokens=4 * 16, seq=16)
    best, runner = table.best, table.runner_up
    assert runner is not None and figures(runner) != figures(best)
    different = [r for r in table.rows[1:] if figures(r) != figures(best)]
    shape = lambda r: (r.plan.dp, r.plan.tp, r.plan.pp, r.plan.cp, r.plan.ep, r.plan.zero)  # noqa: E731
    assert runner is next((r for r in different if shape(r) != shape(best)), different[0])
    assert f"beats {runner.plan} (mb={runner.candidate.micro})" in table.why_best()
