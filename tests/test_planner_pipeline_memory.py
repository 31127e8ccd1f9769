"""The planner's memory of a pipelined plan is ``model_memory``'s, and the fully traced step's.

Both read the steady state of the pipeline's two-stage probe (``shardsim.training.stage_memory``):
the stage's own state, the stage's weight gradients summed over the microbatches so far (live
beside a full stash once the first stage runs a forward after its first backward, as 1F1B does
with more microbatches than stages), and the stash of the microbatches in flight. The reference
is the ledger of the traced pipeline (``model_memory(..., full=True)``).
"""

from __future__ import annotations

import math

import pytest

from shardsim.cost.layer_program import LayerCache
from shardsim.models import get
from shardsim.planner.evaluate import evaluate
from shardsim.planner.space import Candidate
from shardsim.plans import Plan
from shardsim.training import model_memory

CFG = get("llama-tiny").scaled(layers=8, seq=64)


@pytest.fixture(scope="module")
def cache() -> LayerCache:
    return LayerCache(CFG, "h100", seq=CFG.seq)


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("spec", ["pp=2", "dp=2,zero=1,pp=2", "dp=2,zero=2,pp=2", "tp=2,sp,pp=2", "pp=4"])
def test_the_planners_pipeline_memory_is_the_ledgers(cache: LayerCache, spec: str, m: int) -> None:
    plan = Plan.parse(f"{spec},microbatches={m}")
    batch = plan.dp * m
    row = evaluate(cache, Candidate(plan, 1, batch)).memory
    probed, _ = model_memory(CFG, plan, batch=batch)
    ledger, _ = model_memory(CFG, plan, batch=batch, full=True)
    assert row == {k: probed[k] for k in row}
    for k in row:
        assert math.isclose(row[k], ledger[k], rel_tol=0.005), (k, row[k], ledger[k])


def test_the_summed_gradients_beside_the_stash_are_counted(cache: LayerCache) -> None:
    """From ``m = p`` (every backward after the last forward) to ``m = 2p`` the first stage's
    peak grows by its unreduced gradients (the weights' size) and the extra microbatches' tokens."""
    low, high = (Plan.parse(f"pp=2,microbatches={m}") for m in (2, 4))
    before = evaluate(cache, Candidate(low, 1, 2)).memory
    after = evaluate(cache, Candidate(high, 1, 4)).memory
    tokens = 2 * 2 * CFG.seq * 4  # two more microbatches' int32 tokens and targets
    assert 0 <= after["total"] - before["total"] - after["params"] <= tokens
