"""One result type and one runner: every MLP scheme that is a plan runs through run_model, and says so."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

import shardsim as ss
from shardsim.errors import ConfigError, PlanError
from shardsim.models import TransformerConfig, reference
from shardsim.models.mlp import MLP
from shardsim.plans import Plan
from shardsim.strategies import (
    RunResult,
    StepMemory,
    StrategyResult,
    init_of,
    mlp_for,
    plan_of,
    reference_of,
    run_strategy,
    scheme_of,
)
from shardsim.strategies.plans import ALIASES, SETTINGS
from shardsim.transformer import ModelResult, run_model

MESHES = {
    "ddp": {"X": 2},
    "fsdp": {"X": 2},
    "zero1": {"X": 2},
    "zero2": {"X": 2},
    "zero3": {"X": 2},
    "tp": {"Y": 2},
    "tp_ln": {"Y": 2},
    "tp_sp": {"Y": 2},
    "fsdp_tp": {"X": 2, "Y": 2},
    "pp": {"Z": 2},
    "pp_interleaved": {"Z": 2},
    "dp_pp": {"X": 2, "Z": 2},
    "dp_pp_tp": {"X": 2, "Y": 2, "Z": 2},
    "ep": {"Y": 2},
    "dp_ep": {"X": 2, "Y": 2},
}
D, F, B = 8, 16, 8
CFG = TransformerConfig(layers=2, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)


Inputs = tuple[MLP, dict[str, np.ndarray], np.ndarray, np.ndarray]


def _inputs(name: str, layers: int, dtype: str = "float32") -> Inputs:
    model = mlp_for(name, ss.Mesh(**MESHES[name]), D, F, layers).scaled(activation="gelu")
    rng = np.random.default_rng(0)
    x, dout = rng.standard_normal((2, B, D)).astype(dtype)
    return model, init_of(name, model, seed=1, dtype=dtype), x, dout


def _events(r: RunResult) -> list[dict[str, Any]]:
    """Every field of every event but the value ids (a counter that runs on across runs)."""
    return [{k: v for k, v in dataclasses.asdict(e).items() if k not in ("inputs", "output")} for e in r.trace.events]


def test_one_type_for_every_step() -> None:
    assert StrategyResult is ModelResult is RunResult
    x = np.ones((4, 8), np.float32)
    mlp = run_strategy("fsdp_tp", ss.Mesh(X=2, Y=2), ss.mlp.init(8, 16), x, x)
    plan = Plan(tp=2)
    tok = np.arange(8).reshape(2, 4)
    model = run_model(CFG, plan, plan.mesh(), reference.init(CFG, seed=0), tok, tok)
    assert type(mlp) is type(model) is RunResult
    assert isinstance(mlp.memory, StepMemory) and isinstance(model.memory, StepMemory)
    assert mlp.loss is None and model.out is None and model.loss is not None
    assert mlp.plan == Plan.parse("dp=2,zero=3,tp=2,data_axis=X,model_axis=Y") and model.model is CFG


@pytest.mark.parametrize("layers", [1, 4])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_run_strategy_is_run_model_of_its_plan(name: str, layers: int) -> None:
    if layers == 1 and name in ("pp", "pp_interleaved", "dp_pp", "dp_pp_tp"):
        pytest.skip("a pipeline holds a layer per stage and chunk")
    model, params, x, dout = _inputs(name, layers)
    a = run_strategy(name, ss.Mesh(**MESHES[name]), params, x, dout, "gelu")
    mesh = ss.Mesh(**MESHES[name])
    b = run_model(model, plan_of(name, mesh), mesh, params, x, dout)
    assert b.scheme == ALIASES.get(name, name) == scheme_of(b.plan, model)
    assert a.plan == b.plan and a.model == b.model == model
    np.testing.assert_array_equal(a.out, b.out)
    assert a.grads is not None and b.grads is not None and a.grads.keys() == b.grads.keys()
    for k in a.grads:
        np.testing.assert_array_equal(a.grads[k], b.grads[k], err_msg=k)
    assert _events(a) == _events(b)
    assert a.memory.keys() == b.memory.keys()
    for c in a.memory:
        np.testing.assert_array_equal(a.memory[c], b.memory[c], err_msg=c)
    assert a.activations == b.activations and a.layouts == b.layouts and a.axes == b.axes
    assert len(a.stored) == len(b.stored) and all((s == t).all() for s, t in zip(a.stored, b.stored))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_an_mlp_through_run_model_is_the_single_device_answer(name: str, residual: bool) -> None:
    pipeline = "pipe" in ss.strategies.get(name).roles
    if residual and pipeline:
        pytest.skip("a pipeline's blocks have no residual")
    model, params, x, dout = _inputs(name, 4 if pipeline else 3, "float64")
    plan = plan_of(name, ss.Mesh(**MESHES[name]))
    r = run_model(model, plan, ss.Mesh(**MESHES[name]), params, x, dout, residual=residual)
    want_out, want = reference_of(name, params, x, dout, "gelu", residual=residual)
    np.testing.assert_allclose(r.out, want_out, rtol=1e-10, atol=1e-12)
    assert r.grads is not None and r.grads.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(r.grads[k], want[k], rtol=1e-10, atol=1e-12, err_msg=k)


def test_recompute_through_run_model_keeps_less_and_gives_the_same_answer() -> None:
    model, params, x, dout = _inputs("fsdp", 3, "float64")
    plan = Plan(dp=2, zero=3)
    kept = run_model(model, plan, plan.mesh(), params, x, dout)
    again = run_model(model, plan, plan.mesh(), params, x, dout, recompute=True)
    np.testing.assert_array_equal(kept.out, again.out)
    assert kept.grads is not None and again.grads is not None
    for k in kept.grads:
        np.testing.assert_allclose(again.grads[k], kept.grads[k], rtol=1e-12, err_msg=k)
    assert [list(v) for v in again.stored_values] == [["In"]] * 3
    assert (again.memory["activations"] < kept.memory["activations"]).all()
    assert any(e.phase == "recompute" for e in again.trace.events)


@pytest.mark.parametrize("text", ["tp=2", "dp=2,zero=2", "dp=2,cp=2", "pp=2,microbatches=2"])
def test_a_steps_memory_on_a_fresh_mesh_is_its_ledgers_peaks(text: str) -> None:
    plan = Plan.parse(text)
    tok = np.arange(16).reshape(4, 4) % CFG.vocab
    r = run_model(CFG, plan, plan.mesh(), reference.init(CFG, seed=0), tok, tok)
    ledger = r.memory.ledger
    assert ledger is r.mesh.memory
    assert r.memory.categories() == ledger.categories()
    for c in ledger.categories():
        np.testing.assert_array_equal(r.memory[c], ledger.peak(c), err_msg=c)
        np.testing.assert_array_equal(r.memory.peak(c), ledger.peak(c), err_msg=c)
    assert r.peak is not None
    np.testing.assert_array_equal(r.memory["total"], r.peak)
    np.testing.assert_array_equal(r.memory.peak(), r.peak)


def test_an_mlp_step_counts_above_what_was_live_before_it() -> None:
    mesh = ss.Mesh(X=2)
    x = np.ones((4, 8), np.float32)
    fresh = run_strategy("ddp", mesh, ss.mlp.init(8, 16), x, x)
    held = ss.shard(np.zeros((64, 64), np.float32), mesh, "A B", category="params")  # noqa: F841  (live through)
    busy = run_strategy("ddp", mesh, ss.mlp.init(8, 16), x, x)
    for c in fresh.memory:
        np.testing.assert_array_equal(busy.memory[c], fresh.memory[c], err_msg=c)
    assert (busy.memory.ledger.peak("params") == fresh.memory["params"] + 64 * 64 * 4).all()  # type: ignore[union-attr]


def test_run_model_refuses_an_mlp_its_params_are_not_and_a_plan_its_scheme_does_not_run() -> None:
    model, params, x, dout = _inputs("ddp", 1)
    plan = Plan(dp=2)
    with pytest.raises(ConfigError, match=r"weights of MLP\(d_model=8, d_ff=16, layers=1.*not of MLP\(d_model=4"):
        run_model(model.scaled(d_model=4), plan, plan.mesh(), params, x, dout)
    with pytest.raises(PlanError, match="ddp has no model role, and plan dp=2,tp=2 sets tp=2"):
        run_model(model, Plan(dp=2, tp=2), Plan(dp=2, tp=2).mesh(), params, x, dout, scheme="ddp")
    with pytest.raises(PlanError, match="sets dp=4 on mesh axis 'data'"):
        run_model(model, Plan(dp=4), Plan(dp=2).mesh(), params, x, dout)


@pytest.mark.parametrize("text", ["pp=2,microbatches=2", "dp=2,pp=2,microbatches=2", "tp=2,pp=2,microbatches=2"])
def test_a_pipelined_step_reads_back_as_the_unpipelined_one(text: str) -> None:
    """The pipelined path gives the one result filled as the plain step fills it: every stored
    activation named by its layer, every gradient's layout, the plan's axes, model, plan, mesh."""
    cfg = TransformerConfig(layers=2, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)
    params = reference.init(cfg, seed=0, dtype="float64")
    tok = np.arange(16).reshape(4, 4) % 8
    piped = Plan.parse(text)
    flat = piped.replace(pp=1, microbatches=1)
    a = run_model(cfg, flat, flat.mesh(), params, tok, tok)
    b = run_model(cfg, piped, piped.mesh(), params, tok, tok)
    assert sorted(b.activations) == sorted(a.activations) and all(n > 0 for n in b.activations.values())
    assert sorted(b.layouts) == sorted(a.layouts) == sorted(f"d{k}" for k in params)
    assert b.axes == {r: a for r, a in piped.axes().items() if piped.degree(r) > 1}
    assert (b.model, b.plan, b.mesh) == (cfg, piped, b.mesh) and b.mesh.shape == piped.mesh().shape
    assert np.isclose(b.loss, a.loss) and b.memory.peak("params").shape == piped.mesh().shape
