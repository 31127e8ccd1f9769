"""Each registered MLP scheme is a Plan on the seeds' MLP, and back; its weights read off its layouts.

Expected values: the scheme's own ``init`` (the shapes), its own one-block reference and the
seed's MLP stack (``mlp.stack_forward``/``stack_backward``) for the stacked reference, and the
Plan each scheme name stands for, written out by hand below.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_budget import budget
from shardsim import ConfigError, Mesh, PlanError, mlp, strategies
from shardsim.models import MLP
from shardsim.plans import Plan
from shardsim.strategies.runner import resolve_axes
from shardsim.training import SGD, Trainer
from support_matrix import scheme_mesh

# What each name means, by hand (Megatron-LM's degrees; ZeRO stages as the ZeRO paper numbers them).
MEANING = {
    "ddp": "dp=2",
    "fsdp": "dp=2,zero=3",
    "zero1": "dp=2,zero=1",
    "zero2": "dp=2,zero=2",
    "zero3": "dp=2,zero=3",
    "tp": "tp=2",
    "tp_ln": "tp=2",
    "tp_sp": "tp=2,sp",
    "fsdp_tp": "dp=2,zero=3,tp=2",
    "pp": "pp=2",
    "pp_interleaved": "pp=2,schedule=interleaved,virtual_stages=2",
    "dp_pp": "dp=2,pp=2",
    "dp_pp_tp": "dp=2,tp=2,pp=2",
    "ep": "ep=2",
    "dp_ep": "dp=2,ep=2",
}


def _axes(name: str) -> str:
    mesh = scheme_mesh(name)
    chosen = resolve_axes(strategies.get(name), mesh, None)
    return ",".join(f"{role}_axis={axis}" for role, axis in chosen.items())


def test_every_registered_scheme_has_a_meaning() -> None:
    assert sorted(MEANING) == sorted(strategies.names())


@pytest.mark.parametrize("name", sorted(MEANING))
def test_a_scheme_is_its_plan_and_back(name: str) -> None:
    mesh = scheme_mesh(name)
    plan = strategies.plan_of(name, mesh)
    assert plan == Plan.parse(MEANING[name] + "," + _axes(name))
    plan.check(mesh)  # the plan runs on the scheme's own mesh
    model = MLP(8, 16, norm=name in ("tp_ln", "tp_sp"), experts=4 if "ep" in name else 0)
    assert strategies.scheme_of(plan, model) == {"zero3": "fsdp"}.get(name, name)
    assert strategies.axes_of(plan, name) == resolve_axes(strategies.get(name), mesh, None)


def test_a_pipeline_plan_carries_its_schedule_and_microbatches() -> None:
    plan = strategies.plan_of("dp_pp", Mesh(X=2, Z=4), schedule="gpipe", microbatches=8)
    assert (plan.schedule, plan.microbatches, plan.pp, plan.dp) == ("gpipe", 8, 4, 2)
    assert strategies.options_of(plan, "dp_pp") == {"schedule": "gpipe", "microbatches": 8}
    assert strategies.options_of(plan, "ddp") == {}


@pytest.mark.parametrize("name", sorted(MEANING))
def test_every_scheme_runs_from_its_plan_on_the_plans_own_mesh(name: str) -> None:
    """The plan's mesh has multi-letter axes (data, model, pipe, expert): the scheme named back
    runs there, output and gradients equal to its own reference, and a Trainer steps it."""
    plan = Plan.parse(MEANING[name])
    mesh = plan.mesh()
    assert set(mesh.axis_names) <= {"data", "model", "pipe", "expert"}
    block = MLP(8, 16, norm=name in ("tp_ln", "tp_sp"), experts=4 if "ep" in name else 0)
    scheme = strategies.scheme_of(plan, block)
    axes, options = strategies.axes_of(plan, scheme), strategies.options_of(plan, scheme)
    layers = max(2, strategies.min_layers(scheme, mesh, axes))
    params = strategies.init_of(scheme, strategies.mlp_for(scheme, mesh, 8, 16, layers, axes), dtype="float64")
    x = np.random.default_rng(0).standard_normal((16, 8))
    got = strategies.run_strategy(scheme, mesh, params, x, x, "gelu", axes=axes, **options)
    out, grads = strategies.reference_of(scheme, params, x, x, "gelu")
    assert got.out is not None and got.grads is not None
    assert np.allclose(got.out, out, rtol=1e-12, atol=1e-14)
    for k in grads:
        assert np.allclose(got.grads[k], grads[k], rtol=1e-12, atol=1e-14), k
    step = Trainer(scheme, mesh, params, SGD(lr=0.1), axes=axes, activation="gelu", **options).step(x, x)
    assert step.loss == pytest.approx(float(np.mean((out - x) ** 2)), rel=1e-12)


@pytest.mark.parametrize(
    ("text", "model", "words"),
    [
        ("cp=2", None, "context parallelism"),
        ("dp=2,tp=2", None, "zero=0: the MLP's 2-D scheme is fsdp_tp"),
        ("dp=2,zero=1,tp=2", None, "zero=1"),
        ("ep=2,tp=2", None, "split experts and tokens only"),
        ("dp=2,zero=1,pp=2", None, "no ZeRO"),
        ("tp=2,pp=2", None, "needs a data axis"),
        ("dp=2,pp=2,schedule=interleaved,virtual_stages=2", None, "pipe axis alone"),
        ("dp=2,tp=2,sp", None, "model axis alone"),
        ("ep=2", MLP(8, 16), "has none"),
        ("dp=2", MLP(8, 16, experts=4), "set ep > 1"),
    ],
)
def test_a_plan_no_mlp_scheme_runs_names_what_is_missing(text: str, model: MLP | None, words: str) -> None:
    with pytest.raises(PlanError, match=words) as e:
        strategies.scheme_of(Plan.parse(text), model)
    assert text.split(",")[0] in str(e.value)  # it names the plan


@pytest.mark.parametrize("name", sorted(MEANING))
def test_weights_read_off_the_layouts_are_the_schemes_own(name: str) -> None:
    mesh = scheme_mesh(name)
    layers = max(2, strategies.min_layers(name, mesh))
    model = strategies.mlp_for(name, mesh, 8, 16, layers)
    scheme = strategies.get(name)
    if "microbatches" in scheme.options:  # a pipeline's init lays out the layers itself
        extra = {"layers": layers, **({"chunks": 2} if name == "pp_interleaved" else {})}
        want = {k: v.shape for k, v in scheme.init(8, 16, **extra).items()}
    else:
        block = scheme.init(8, 16, **({"experts": model.experts} if model.experts else {}))
        want = {k: (layers, *v.shape) for k, v in block.items()}
    assert {k: v.shape for k, v in strategies.weights_of(name, model).items()} == want
    assert {k: v.shape for k, v in strategies.init_of(name, model).items()} == want


def test_the_stacked_reference_is_the_seeds_mlp_stack() -> None:
    p = mlp.init_stack(3, 4, 8, seed=2, dtype="float64")
    rng = np.random.default_rng(0)
    x, dout = rng.standard_normal((5, 4)), rng.standard_normal((5, 4))
    for residual in (False, True):
        out, grads = strategies.reference_of("ddp", p, x, dout, "gelu", residual)
        assert np.allclose(out, mlp.stack_forward(p, x, "gelu", residual), rtol=1e-13, atol=0)
        want = mlp.stack_backward(p, x, dout, "gelu", residual)
        for k in want:
            assert np.allclose(grads[k], want[k], rtol=1e-13, atol=1e-15), k


def test_a_model_that_does_not_fit_the_scheme_says_so() -> None:
    with pytest.raises(ConfigError, match="runs experts"):
        strategies.weights_of("ep", MLP(8, 16))
    with pytest.raises(ConfigError, match="no LayerNorm"):
        strategies.weights_of("ddp", MLP(8, 16, norm=True))
    with pytest.raises(ConfigError, match="layers=3 does not divide by 2: use layers=4"):
        strategies.mlp_for("pp", Mesh(Z=2), 8, 16, 3)
    with pytest.raises(ConfigError, match="top_k=3 is more than its 2 experts"):
        MLP(8, 16, experts=2, top_k=3)


def test_a_pipeline_refuses_a_residual() -> None:
    p = strategies.init_of("pp", MLP(4, 8, layers=2))
    x = np.ones((4, 4), np.float32)
    with pytest.raises(strategies.runner.ShardingError, match="leave residual off for a pipeline"):
        strategies.run_strategy("pp", Mesh(Z=2), p, x, x, residual=True)


@budget(30)
@given(
    name=st.sampled_from(sorted(MEANING)),
    activation=st.sampled_from(["identity", "relu", "gelu"]),
    width=st.sampled_from([4, 8]),
    rows=st.sampled_from([8, 16]),
    optimizer=st.sampled_from(["sgd", "adam"]),
    seed=st.integers(0, 2**16),
)
def test_every_scheme_trains_two_steps_as_one_device_does(
    name: str, activation: str, width: int, rows: int, optimizer: str, seed: int
) -> None:
    """Two optimizer steps of the Trainer against the same optimizer on whole arrays of the
    scheme's own reference (``training.optim``'s update, float64)."""
    from shardsim.training import optim

    mesh = scheme_mesh(name)
    layers = max(2, strategies.min_layers(name, mesh))
    model = strategies.mlp_for(name, mesh, width, 2 * width, layers)
    params = strategies.init_of(name, model, seed=seed % 97, dtype="float64")
    rng = np.random.default_rng(seed)
    x, target = rng.standard_normal((rows, width)), rng.standard_normal((rows, width))
    trainer = Trainer(name, mesh, params, optimizer, activation=activation)
    opt = optim.get(optimizer)
    w = {k: v.copy() for k, v in params.items()}
    state = {k: opt.init_state(v) for k, v in w.items()}
    for step in (1, 2):
        out, _ = strategies.reference_of(name, w, x, np.zeros_like(x), activation)
        got = trainer.step(x, target).loss
        assert got == pytest.approx(float(np.mean((out - target) ** 2)), rel=1e-10)
        _, grads = strategies.reference_of(name, w, x, 2 * (out - target) / out.size, activation)
        for k in w:
            opt.update(w[k], grads[k], state[k], step)
    new = trainer.params_global()
    for k in w:
        assert np.allclose(new[k], w[k], rtol=1e-9, atol=1e-12), k
