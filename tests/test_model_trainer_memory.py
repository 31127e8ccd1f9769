"""model_memory: the per-category bytes of a transformer's training step, from its ledger.

The figures of a deep model carried on from a few layers equal the full trace's; they equal
the Trainer's own ledger for every ZeRO stage and precision; the model state is the ZeRO
paper's closed form; activations follow the pipeline schedule's microbatches in flight and
the recomputation policy; bad input is named.
"""

from __future__ import annotations

import numpy as np
import pytest

from shardsim import DivisibilityError, Mesh, ShapeDtype, formulas
from shardsim.errors import ConfigError, ModelInputError, PlanError, ShardingError
from shardsim.models import get
from shardsim.plans import Plan
from shardsim.training import Trainer, footprint, model_memory

TINY = get("llama-tiny").scaled(seq=32)  # D=32, 4 heads (2 kv), F=96, V=64


@pytest.mark.parametrize(
    ("plan", "layers"),
    [
        ("dp=2,zero=0", 6),  # 6 layers: carried on from 2, 3 and 4 (pipelines: tests/test_stage_memory.py)
        ("dp=2,zero=3,tp=2,sp", 6),
        ("dp=2,zero=1,tp=2,recompute=full", 7),
        ("dp=2,zero=2,cp=2", 6),
    ],
)
def test_a_deep_model_carried_on_from_a_few_layers_equals_its_full_trace(
    plan: str, layers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = Plan.parse(plan)
    cfg = TINY.scaled(layers=layers)
    batch = 2 * p.dp * p.microbatches
    lines = []
    carried = footprint._carried
    monkeypatch.setattr(footprint, "_carried", lambda *a: lines.append(carried(*a)) or lines[-1])
    got = model_memory(cfg, p, batch=batch)
    assert lines and None not in lines  # every figure was carried on, none traced in full
    assert got == model_memory(cfg, p, batch=batch, full=True)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "scaling-book"])
def test_model_memory_is_the_trainers_ledger(zero: int, precision: str) -> None:
    cfg, plan = TINY.scaled(layers=6), Plan(dp=4, zero=zero, tp=2)
    kw = {"policy": precision} if precision == "scaling-book" else {"precision": precision}
    peak, state = model_memory(cfg, plan, batch=8, **kw)  # type: ignore[arg-type]
    from shardsim.training import policies

    prec = policies.get(precision).precision if precision == "scaling-book" else precision
    shapes = {k: ShapeDtype(s) for k, s in cfg.param_shapes().items()}
    r = Trainer.for_model(cfg, plan, plan.mesh(), shapes, "adam", precision=prec).step(
        ShapeDtype((8, cfg.seq), "int32"), ShapeDtype((8, cfg.seq), "int32")
    )
    assert peak == {c: int(np.max(v)) for c, v in r.memory.items()}
    assert state == {c: int(np.max(v)) for c, v in r.model_state.items()}
    assert {"params", "grads", "optimizer", "activations", "total"} <= set(peak)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize(("precision", "formula"), [("fp32", "fp32"), ("bf16", "mixed")])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_the_model_state_is_the_zero_papers_closed_form(
    zero: int, precision: str, formula: str, optimizer: str
) -> None:
    cfg = TINY.scaled(layers=2)
    _, state = model_memory(cfg, Plan(dp=4, zero=zero), batch=4, optimizer=optimizer, precision=precision)
    assert state == formulas.model_state_breakdown(cfg.param_count(), 4, zero, formula, optimizer)


def _stage_step(schedule: str, m: int) -> tuple[np.ndarray, np.ndarray]:
    cfg, plan = TINY.scaled(layers=4, seq=64), Plan(pp=2, microbatches=m, schedule=schedule)
    shapes = {k: ShapeDtype(s, "bfloat16") for k, s in cfg.param_shapes().items()}
    r = Trainer.for_model(cfg, plan, plan.mesh(), shapes, "adam", precision="bf16").step(
        ShapeDtype((2 * m, 64), "int32"), ShapeDtype((2 * m, 64), "int32")
    )
    return r.memory["activations"], r.stored_activations  # per stage; stored: one microbatch's layers


def test_1f1b_keeps_pp_microbatches_in_flight_and_gpipe_all_of_them() -> None:
    tokens = 2 * (2 * 64 * 4)  # one microbatch's tokens and targets: 2 sequences of 64 int32
    peak4, stored = _stage_step("gpipe", 4)
    peak8, _ = _stage_step("gpipe", 8)
    assert peak8[0] - peak4[0] == 4 * (stored[0] + tokens)  # the first stage holds every microbatch
    peak4, _ = _stage_step("1f1b", 4)
    peak8, _ = _stage_step("1f1b", 8)
    assert (peak8 - peak4).tolist() == [4 * tokens, 4 * tokens]  # still pp = 2 in flight: only the inputs grow
    peak1, _ = _stage_step("1f1b", 1)
    peak2, _ = _stage_step("1f1b", 2)
    assert peak2[0] - peak1[0] == stored[0] + tokens  # the first stage holds a second microbatch


def test_recomputation_trades_activations() -> None:
    cfg = TINY.scaled(layers=6, dropout=0.1)
    policies = ("none", "selective", "full")
    acts = {r: model_memory(cfg, f"dp=2,attention=standard,recompute={r}", batch=4)[0]["activations"] for r in policies}
    assert acts["full"] < acts["selective"] < acts["none"]


def test_bad_input_names_the_culprit_and_the_fix() -> None:
    with pytest.raises(ModelInputError, match=r"batch=2 sequences is smaller than the data-parallel degree dp=4"):
        model_memory(TINY, "dp=4", batch=2)
    with pytest.raises(PlanError, match=r"use plan\.mesh\(\)"):
        model_memory(TINY, "dp=2,tp=2", Mesh(data=2), batch=2)
    with pytest.raises(DivisibilityError, match="heads=4 does not divide by tp=8"):
        model_memory(TINY, "tp=8", batch=1)
    with pytest.raises(DivisibilityError, match="layers=2 do not divide over pp=4"):
        model_memory(TINY, "pp=4", batch=4)
    with pytest.raises(PlanError, match="unknown plan key 'tq'"):
        model_memory(TINY, "tq=2", batch=1)
    with pytest.raises(ConfigError, match="no model preset 'llama9'"):
        model_memory("llama9", "dp=1", batch=1)
    with pytest.raises(ShardingError, match="unknown precision 'int8'"):
        model_memory(TINY, "dp=1", batch=1, precision="int8")
