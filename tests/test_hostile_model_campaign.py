"""The model-level API under hostile input: every outcome is the independent check's answer or a
documented error, never a wrong value, an undocumented exception or a hang.

A bounded, derandomized draw of the case table that ``benchmarks/campaign_model.py`` runs at
length (``tests/model_hostile_inputs.py``): near-valid configurations, plans and batches with
one thing made hostile, random valid small models under random plans, random plan strings,
and the model command lines. ``SHARDSIM_FUZZ_SCALE`` multiplies the budget.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import model_hostile_inputs as cases
from fuzz_budget import budget

#: Inputs per call: a few hundred in all, the costly calls (a planner search, a command line
#: that estimates or plans) fewer.
BUDGET = {
    "TransformerConfig": 80, "Plan": 80, "Plan.parse": 80, "run_model": 40, "Trainer.for_model": 15,
    "cost.estimate(model)": 20, "planner.plan": 4, "cli": 15,
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BUDGET))
def test_hostile_model_inputs_give_the_checked_answer_or_a_documented_error(name: str) -> None:
    # no shrinking: an input is a recipe drawn from one random stream, and the recipe is the report
    @settings(budget(BUDGET[name]), phases=(Phase.explicit, Phase.generate))
    @given(st.randoms(use_true_random=False))
    def one(rng: random.Random) -> None:
        recipe = cases.draw(name, rng)
        outcome, detail = cases.run_case(name, recipe)
        assert outcome in ("ok", "documented"), f"{outcome}: {detail}\n{cases.describe(recipe)}"

    one()


def test_the_classifier_sees_a_wrong_value_and_agrees_with_the_reference() -> None:
    # a valid run is "ok" (the reference's loss and grads), and the check sees a changed gradient
    rng = random.Random(3)
    cfg = {"layers": 1, "d_model": 8, "heads": 2, "d_ff": 16, "vocab": 12, "seq": 4}
    recipe = {**cases.setup(rng), "cfg": cfg, "plan": {"tp": 2}, "B": 2, "S": 4, "dropout_seed": None}
    assert cases.run_case("run_model", recipe) == ("ok", "")
    res, check = cases.run_run_model(recipe)
    res.grads["embed"] = res.grads["embed"] + 1e-3
    assert "embed" in str(check(res))
    res.loss = np.nan
    assert "loss" in str(check(res))


def test_the_classifier_knows_the_documented_rules() -> None:
    assert cases.config_is_valid({"layers": 1, "d_model": 8, "heads": 2, "d_ff": 16, "vocab": 11, "seq": 4})
    assert not cases.config_is_valid({"layers": True, "d_model": 8, "heads": 2, "d_ff": 16, "vocab": 11, "seq": 4})
    assert cases.plan_is_valid({"tp": 2, "sp": True}) and not cases.plan_is_valid({"tp": 2, "sp": 1})
    assert cases.expected_parse("fsdp=2, tp=2") == {"dp": 2, "zero": 3, "tp": 2}
    with pytest.raises(cases._RefusedError):
        cases.expected_parse("dp=2,dp=2")
    assert cases.run_case("Plan.parse", {"text": "dp=4,tp=2,sp,zero=1"}) == ("ok", "")
    assert cases.run_case("cli", {"argv": ["estimate", "--model", "nosuch"]}) == ("documented", "")
