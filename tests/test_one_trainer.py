"""One Trainer class: an MLP with a plan steps as its scheme does, a transformer as Trainer.for_model does.

The reference of each new spelling is the spelling it stands for (``Trainer(scheme, ...)``,
``Trainer.for_model(...)``), which the other training tests hold to the single-device math;
here every step of the new spelling must equal it bit for bit: losses, every state value's
blocks, the trace's collectives, the layouts and every chip's peak bytes.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

import shardsim as ss
from shardsim.errors import ConfigError, PlanError
from shardsim.models import MLP, get, reference
from shardsim.plans import Plan
from shardsim.strategies.plans import SETTINGS, init_of, min_layers, mlp_for, plan_of
from shardsim.training import SGD, Adam, Trainer
from shardsim.training.model_trainer import ModelTrainer

MESHES = {  # two chips on every axis a scheme uses
    "ddp": {"X": 2}, "fsdp": {"X": 2}, "zero1": {"X": 2}, "zero2": {"X": 2}, "zero3": {"X": 2},
    "tp": {"Y": 2}, "tp_ln": {"Y": 2}, "tp_sp": {"Y": 2}, "fsdp_tp": {"X": 2, "Y": 2},
    "pp": {"Z": 2}, "pp_interleaved": {"Z": 2}, "dp_pp": {"X": 2, "Z": 2}, "dp_pp_tp": {"X": 2, "Z": 2, "Y": 2},
    "ep": {"Y": 2}, "dp_ep": {"X": 2, "Y": 2},
}  # fmt: skip
OPTIMIZERS = {"momentum": lambda: SGD(lr=0.1, momentum=0.9), "adam": lambda: Adam(lr=1e-2)}


def state_blocks(t: Trainer) -> dict[tuple[str, ...], np.ndarray]:
    return {path: holder[key].compact().copy() for path, holder, key in t.state_slots()}


def steps(t: Trainer, batches: list[tuple[Any, Any]]) -> list[tuple[Any, ...]]:
    """What each step shows, and the state after it."""
    out = []
    for x, y in batches:
        gc.collect()  # the pipelines' reference cycles freed alike before each step, so the peaks compare
        r = t.step(x, y)
        out.append(
            (r.loss, r.step, r.skipped, r.layouts, r.axes, r.trace.collectives(), r.memory["total"].tolist(),
             {c: v.tolist() for c, v in r.model_state.items()}, r.stored_activations.tolist(), state_blocks(t))
        )  # fmt: skip
    return out


def assert_same(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g[:-1] == w[:-1]
        assert g[-1].keys() == w[-1].keys()
        for path in w[-1]:
            assert g[-1][path].dtype == w[-1][path].dtype, path
            assert g[-1][path].tobytes() == w[-1][path].tobytes(), path  # bit for bit


# -- an MLP with a plan is its scheme -------------------------------------------------------------
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("name", list(SETTINGS))
def test_an_mlp_with_its_plan_steps_as_its_scheme(name: str, opt: str) -> None:
    mesh_sizes = MESHES[name]
    model = mlp_for(name, ss.Mesh(**mesh_sizes), 4, 8, layers=2 * min_layers(name, ss.Mesh(**mesh_sizes)))
    model = model.scaled(activation="gelu")
    params = init_of(name, model, dtype="float64")
    plan = plan_of(name, ss.Mesh(**mesh_sizes))
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((8, 4)), rng.standard_normal((8, 4))) for _ in range(2)]
    want = steps(Trainer(name, ss.Mesh(**mesh_sizes), params, OPTIMIZERS[opt](), activation="gelu"), batches)
    one = Trainer(model, plan, ss.Mesh(**mesh_sizes), params, OPTIMIZERS[opt]())
    assert one.scheme.name == ("fsdp" if name == "zero3" else name)
    assert_same(steps(one, batches), want)
    words = Trainer(model, str(plan), ss.Mesh(**mesh_sizes), params, optimizer=OPTIMIZERS[opt]())  # a plan string
    assert_same(steps(words, batches), want)


@pytest.mark.parametrize("name", ["zero1", "fsdp_tp", "tp"])
def test_the_plan_sets_precision_and_recomputation(name: str) -> None:
    sizes = MESHES[name]
    model = mlp_for(name, ss.Mesh(**sizes), 4, 8, layers=2 * min_layers(name, ss.Mesh(**sizes)))
    params = init_of(name, model)
    plan = plan_of(name, ss.Mesh(**sizes)).replace(precision="bf16", recompute="full")
    x = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)
    want = steps(Trainer(name, ss.Mesh(**sizes), params, "adam", precision="bf16", recompute=True), [(x, 0 * x)])
    one = Trainer(model, plan, ss.Mesh(**sizes), params, "adam")
    assert one.precision.mixed and one.recompute
    assert_same(steps(one, [(x, 0 * x)]), want)
    selective = Trainer(model, plan.replace(recompute="selective"), ss.Mesh(**sizes), params, "adam")
    assert not selective.recompute  # selective recomputes attention, which an MLP has not


def test_an_mlp_with_experts_takes_its_top_k() -> None:
    model = MLP(4, 8, experts=4, top_k=1)
    params = init_of("ep", model, dtype="float64")
    x = np.random.default_rng(2).standard_normal((8, 4))
    want = steps(Trainer("ep", ss.Mesh(expert=2), params, "sgd", top_k=1), [(x, 0 * x)])
    assert_same(steps(Trainer(model, "ep=2", ss.Mesh(expert=2), params, "sgd"), [(x, 0 * x)]), want)
    two = steps(Trainer("ep", ss.Mesh(expert=2), params, "sgd"), [(x, 0 * x)])
    assert two[0][0] != want[0][0]  # top_k matters: the test would see it dropped


def test_an_mlp_plan_is_checked_against_the_mesh_and_the_keywords() -> None:
    model, params = MLP(4, 8), ss.mlp.init(4, 8)
    with pytest.raises(PlanError, match="runs dp=2 over mesh axis 'data', which Mesh\\(X=2\\) does not have"):
        Trainer(model, "dp=2", ss.Mesh(X=2), params)
    with pytest.raises(PlanError, match="no MLP scheme runs dp=2,tp=2"):
        Trainer(model, Plan(dp=2, tp=2), ss.Mesh(data=2, model=2), params)
    with pytest.raises(PlanError, match="names the mesh axes; drop axes="):
        Trainer(model, "dp=2", ss.Mesh(data=2), params, axes={"data": "data"})
    with pytest.raises(ConfigError, match="activation='gelu', but MLP"):
        Trainer(model, "dp=2", ss.Mesh(data=2), params, activation="gelu")
    with pytest.raises(ss.ArgumentTypeError, match=r"Trainer: plan must be a shardsim\.plans\.Plan"):
        Trainer(model, 2, ss.Mesh(data=2), params)
    with pytest.raises(TypeError, match="takes plan, mesh, params and an optional optimizer"):
        Trainer(model, "dp=2", ss.Mesh(data=2))


# -- a transformer: Trainer(cfg, plan, ...) is Trainer.for_model(...) -----------------------------
LLAMA = get("llama-tiny").scaled(dropout=0.1)


@pytest.mark.parametrize(
    "plan",
    [
        Plan(dp=2, zero=1, attention="standard"),  # attention dropout needs the scores in memory
        Plan(dp=2, zero=3, tp=2, attention="standard"),
        Plan(tp=2, pp=2, microbatches=2, attention="standard"),
        Plan(dp=2, zero=2, attention="standard"),
    ],
    ids=str,
)
def test_a_transformer_trainer_is_for_model(plan: Plan) -> None:
    params = reference.init(LLAMA, seed=0, dtype="float64")
    rng = np.random.default_rng(3)
    batches = [(rng.integers(0, LLAMA.vocab, (4, LLAMA.seq)), rng.integers(0, LLAMA.vocab, (4, LLAMA.seq)))] * 2
    old = Trainer.for_model(LLAMA, plan, plan.mesh(), params, "adam", dropout_seed=4)
    new = Trainer(LLAMA, str(plan), plan.mesh(), params, "adam", dropout_seed=4)
    alias = ModelTrainer(LLAMA, plan, plan.mesh(), params, Adam(), dropout_seed=4)
    want = steps(old, batches)
    assert_same(steps(new, batches), want)
    assert_same(steps(alias, batches), want)
    for t in (old, new, alias):
        assert type(t) is Trainer and isinstance(t, ModelTrainer)
    assert new.plan == plan and new.params_global().keys() == old.params_global().keys()


def test_one_class_for_every_spelling() -> None:
    assert ModelTrainer is Trainer is ss.Trainer is ss.training.Trainer
    mlp = Trainer("ddp", ss.Mesh(X=2), ss.mlp.init(4, 8))
    cfg = get("gpt-tiny")
    shapes = {k: ss.ShapeDtype(s) for k, s in cfg.param_shapes().items()}
    model = Trainer.for_model(cfg, Plan(dp=2), Plan(dp=2).mesh(), shapes)
    assert type(mlp) is type(model) is Trainer
    assert type(mlp.program) is not type(model.program)  # what differs is the step program


def test_a_transformer_refuses_the_mlp_keywords_and_float16() -> None:
    params = reference.init(get("llama-tiny"))
    mesh = Plan(dp=2).mesh()
    with pytest.raises(PlanError, match="the transformer's step has no loss scaling yet"):
        Trainer(get("llama-tiny"), "dp=2", mesh, params, precision="fp16")
    with pytest.raises(PlanError, match="the transformer's step has no loss scaling yet"):
        Trainer(get("llama-tiny"), "dp=2", mesh, params, precision="bf16", loss_scale=1024.0)
    with pytest.raises(TypeError, match=r"not \['activation'\]"):  # engine= is a transformer's too
        Trainer(get("llama-tiny"), "dp=2", mesh, params, activation="gelu", engine="jax")
    with pytest.raises(ss.ShardingError, match="engine must be 'numpy' or 'jax'"):
        Trainer(get("llama-tiny"), "dp=2", mesh, params, engine="cuda")
    with pytest.raises(ss.ArgumentTypeError, match=r"^Trainer\.for_model: cfg must be"):
        Trainer.for_model("llama-tiny", "dp=2", mesh, params)
