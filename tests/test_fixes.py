"""How to fit: each change the summary suggests, estimated on its own, really fits; they come
fastest first; a plan that fits gets no advice; the variants are never advised themselves."""

from __future__ import annotations

import pytest

from shardsim import cost
from shardsim.cost import fixes as fixes_module
from shardsim.cost import model_estimate
from shardsim.cost.fixes import changes, fixes
from shardsim.plans import Plan

PLAN = "dp=2,tp=2,attention=standard"
ASK = {"batch_tokens": 8 * 16, "seq": 16}


def chip(capacity: int) -> cost.Hardware:
    return cost.get_hardware("h100").with_(hbm_capacity=capacity)


def test_every_suggested_change_fits_on_its_own_and_they_come_fastest_first() -> None:
    plain = cost.estimate("llama-tiny", PLAN, "h100", **ASK)
    small = chip(plain.memory["total"] - 1)  # one byte short
    est = cost.estimate("llama-tiny", PLAN, small, **ASK)
    assert not est.fits and est.fixes and est.fixes == fixes("llama-tiny", PLAN, small, **ASK)
    for f in est.fixes:
        alone = cost.estimate("llama-tiny", f.plan, small, **ASK)  # the independent estimate
        assert alone.fits and (alone.memory["total"], alone.step_s) == (f.memory, f.step_s)
        assert f.plan == Plan.parse(PLAN).replace(**_fields(f.change)) and f.plan.chips == 4
        assert f.base_step_s == est.step_s
    steps = [f.step_s for f in est.fixes]
    assert steps == sorted(steps)
    tried = {c for c, _ in changes(est.plan, 8)}
    assert {f.change for f in est.fixes} <= tried
    line = est.summary().splitlines()[est.summary().splitlines().index(est.memory_line().splitlines()[-1])]
    assert line == "to fit: " + " or ".join(str(f) for f in est.fixes[:3])


def _fields(change: str) -> dict[str, object]:
    key, _, value = change.partition("=")
    return {key: True} if not value else {key: int(value) if value.isdigit() else value}


def test_the_changes_tried_are_the_practitioners_single_changes() -> None:
    assert [c for c, _ in changes(Plan(dp=4, zero=1, tp=2, sp=True, recompute="selective"), 4)] == [
        "recompute=full", "zero=2", "zero=3",
    ]  # fmt: skip  # flash already, sp on, one sequence per replica and microbatch
    assert [c for c, _ in changes(Plan(pp=2, microbatches=2, recompute="full", attention="standard"), 12)] == [
        "attention=flash", "microbatches=3", "microbatches=12",
    ]  # fmt: skip
    assert all(p.chips == 8 for _, p in changes(Plan(dp=2, tp=4, attention="standard"), 16))


def test_a_plan_that_fits_gets_no_advice() -> None:
    est = cost.estimate("llama-tiny", PLAN, "h100", **ASK)
    assert est.fits and est.fixes is None and "to fit" not in est.summary()
    assert fixes("llama-tiny", PLAN, "h100", **ASK) == []


def test_when_no_single_change_fits_the_summary_says_what_was_tried() -> None:
    est = cost.estimate("llama-tiny", PLAN, chip(1000), **ASK)
    tried = ", ".join(c for c, _ in changes(est.plan, 8))
    assert est.fixes == [] and f"no single change fits: tried {tried}" in est.summary()


def test_only_the_estimate_asked_for_is_advised_and_only_when_read(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[cost.Estimate] = []
    real = model_estimate.estimate_model

    def counting(*args: object, **kwargs: object) -> cost.Estimate:
        calls.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return calls[-1]

    monkeypatch.setattr(fixes_module, "estimate_model", counting)  # the variants' estimates
    est = cost.estimate("llama-tiny", PLAN, chip(1000), **ASK)
    assert calls == []  # the variants are estimated when the changes are first read
    assert est.fixes == [] and est.fixes == []
    assert [e.plan for e in calls] == [p for _, p in changes(est.plan, 8)]  # each variant once
    assert all(e.fixes is None and e.defaults == {} for e in calls)  # none advised in turn


def test_without_memory_there_is_no_advice() -> None:
    est = cost.estimate_model("llama-tiny", PLAN, chip(1000), memory=False, **ASK)
    assert est.fixes is None and "to fit" not in est.summary()
