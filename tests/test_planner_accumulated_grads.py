"""A pipeline's steady state holds the stage's summed weight gradients beside its stash.

Under 1F1B with more microbatches than the first stage stashes, that stage runs a forward
after its first backward: the gradients it has summed so far are live while a full stash is.
One microbatch's layer program never holds the two at once, so the planner adds the sum. The
reference is the ledger of the traced pipeline (``model_memory(..., full=True)``): going from
``m = p`` (every backward after the last forward) to ``m = 2p``, the ledger's peak grows by the
sum's bytes plus the extra microbatches' tokens, and the planner's by its own sum's bytes.
"""

from __future__ import annotations

import pytest

from shardsim.models import get
from shardsim.planner.bounds import accumulates_beside_stash
from shardsim.planner.evaluate import evaluate
from shardsim.planner.program import LayerCache
from shardsim.planner.space import Candidate
from shardsim.plans import Plan
from shardsim.training import model_memory

CFG = get("llama-tiny").scaled(layers=8, seq=64)


@pytest.fixture(scope="module")
def cache() -> LayerCache:
    return LayerCache(CFG, "h100", seq=CFG.seq)


def peaks(cache: LayerCache, spec: str, m: int) -> tuple[dict[str, int], dict[str, int]]:
    """(the ledger's, the planner's) per-chip peaks of ``spec`` with ``m`` microbatches of one sequence."""
    plan = Plan.parse(f"{spec},microbatches={m}")
    batch = plan.dp * m
    ledger, _ = model_memory(CFG, plan, batch=batch, full=True)
    return ledger, evaluate(cache, Candidate(plan, 1, batch)).memory


@pytest.mark.parametrize("spec", ["pp=2", "dp=2,zero=1,pp=2", "dp=2,zero=2,pp=2", "tp=2,sp,pp=2"])
def test_the_steady_state_adds_the_summed_gradients_as_the_ledger_does(cache: LayerCache, spec: str) -> None:
    (ledger_p, planner_p), (ledger_2p, planner_2p) = peaks(cache, spec, 2), peaks(cache, spec, 4)
    tokens = 2 * 2 * CFG.seq * 4  # two more microbatches' int32 tokens and targets
    ledger_jump = ledger_2p["total"] - ledger_p["total"]
    planner_jump = planner_2p["total"] - planner_p["total"]
    # the ledger's peak grows by the stage's unreduced gradients (bf16, the weights' size: whole
    # under ZeRO-2 too, which shards them only when reducing) and the extra tokens
    assert 0 <= ledger_jump - ledger_2p["params"] <= tokens
    # the planner's by its own, which differ from the ledger's by the weights it places on the
    # busiest stage (the embedding and the head both): the same offset as its params
    offset = planner_2p["params"] - ledger_2p["params"]
    assert abs(planner_jump - ledger_jump - offset) <= tokens


def test_only_a_forward_after_a_backward_holds_both() -> None:
    p = Plan(pp=4, microbatches=8)
    assert accumulates_beside_stash(Candidate(p, 1, 8))
    assert not accumulates_beside_stash(Candidate(p.replace(microbatches=4), 1, 4))  # all forwards first
    assert not accumulates_beside_stash(Candidate(p.replace(schedule="gpipe"), 1, 8))
    assert not accumulates_beside_stash(Candidate(Plan(dp=2, microbatches=4), 1, 8))  # no pipeline
