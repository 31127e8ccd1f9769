"""One estimate: a scheme's is its MLP's under its plan, field for field, and one builder's programs.

The reference for the (MLP, plan) estimate is the scheme's own spelling, whose numbers the
cost tests and the docs pin; the reference for the builder's shared training steps is a
fresh trace of the same step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from shardsim import Mesh, cost
from shardsim.cost import builder
from shardsim.cost.fixes import advise
from shardsim.cost.placement import Placement
from shardsim.errors import CostModelError
from shardsim.models import MLP, get
from shardsim.plans import Plan
from shardsim.strategies import mlp_for
from shardsim.strategies.plans import plan_of
from shardsim.training import model_memory
from shardsim.training.precision import Precision


def _ids(steps: list[Any]) -> dict[int, int]:
    """Value ids renumbered by first appearance: two traces of one program number them alike."""
    order: dict[int, int] = {}
    for st in steps:
        for v in (*st.inputs, st.output):
            order.setdefault(v, len(order))
    return order


def _same(a: Any, b: Any, where: str) -> None:
    """``a`` and ``b`` hold the same figures, compared field by field (a trace's value ids by
    their order of appearance)."""
    if isinstance(a, Mesh):
        assert isinstance(b, Mesh), where
        assert (a.axis_names, a.shape) == (b.axis_names, b.shape), where
        assert np.array_equal(a.slowdown, b.slowdown), where
    elif isinstance(a, Placement):
        assert (a.axis_sizes, a.parts, a.topology, a.hardware) == (b.axis_sizes, b.parts, b.topology, b.hardware), where
    elif isinstance(a, cost.Program):
        assert type(a) is type(b), where
        ia, ib = _ids(a.steps), _ids(b.steps)
        assert len(a.steps) == len(b.steps), where
        for k, (sa, sb) in enumerate(zip(a.steps, b.steps)):
            ea = dataclasses.replace(sa.event, inputs=tuple(ia[v] for v in sa.event.inputs if v in ia), output=0)
            eb = dataclasses.replace(sb.event, inputs=tuple(ib[v] for v in sb.event.inputs if v in ib), output=0)
            assert ea == eb, f"{where}.steps[{k}]"
            assert [ia[v] for v in sa.inputs] == [ib[v] for v in sb.inputs], f"{where}.steps[{k}].inputs"
            assert (sa.layer, ia[sa.output]) == (sb.layer, ib[sb.output]), f"{where}.steps[{k}]"
        for f in dataclasses.fields(a):
            if f.name not in ("steps", "mesh"):
                _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
        _same(a.mesh, b.mesh, f"{where}.mesh")
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), where
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{k}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _same(a[k], b[k], f"{where}[{k!r}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


CASES = [
    ("fsdp", Mesh(X=8), 8 * 512, 256, 1024, 2),
    ("ddp", Mesh(X=4), 4 * 256, 128, 512, 1),
    ("zero1", Mesh(X=4), 4 * 256, 128, 512, 1),
    ("tp", Mesh(Y=4), 4 * 256, 128, 512, 2),
    ("tp_ln", Mesh(Y=4), 4 * 256, 128, 512, 1),
    ("fsdp_tp", Mesh(X=2, Y=4), 8 * 256, 128, 512, 1),
    ("dp_ep", Mesh(X=2, Y=2), 4 * 64, 64, 256, 1),
    ("pp", Mesh(Z=4), 4 * 64, 64, 256, 4),
]


@pytest.mark.parametrize("scheme, mesh, batch, d, f, layers", CASES, ids=[c[0] for c in CASES])
def test_a_scheme_estimate_is_its_mlp_under_its_plan_field_for_field(scheme, mesh, batch, d, f, layers) -> None:
    by_name = cost.estimate(scheme, mesh, "h100", batch, d, f, layers)
    model, plan = mlp_for(scheme, mesh, d, f, layers), plan_of(scheme, mesh)
    by_plan = cost.estimate(model, plan, "h100", batch_tokens=batch)
    _same(by_name, by_plan, "estimate")
    assert type(by_name) is type(by_plan) is cost.Estimate is cost.ModelEstimate
    assert by_name.summary() == by_plan.summary() and by_name.figures() == by_plan.figures()
    assert by_plan.scheme == scheme and by_plan.plan == plan and by_plan.model == model


def test_a_scheme_of_another_name_keeps_its_name_and_its_numbers() -> None:
    by_name = cost.estimate("zero3", Mesh(X=4), "tpu-v5p", 4 * 256, 128, 512, efficiency="ideal")
    fsdp = cost.estimate(MLP(128, 512), "dp=4,zero=3,data_axis=X", "tpu-v5p", batch_tokens=4 * 256, efficiency="ideal")
    assert by_name.scheme == "zero3" and fsdp.scheme == "fsdp"
    assert (by_name.step_s, by_name.memory, by_name.model_state) == (fsdp.step_s, fsdp.memory, fsdp.model_state)


def test_the_scheme_spelling_keeps_a_wider_mesh_and_its_slow_chips() -> None:
    mesh = Mesh(X=2, Y=4)
    mesh.slow(2.0, X=1, Y=3)
    by_name = cost.estimate("tp", mesh, "h100", 8 * 256, 128, 512)
    by_plan = cost.estimate_model(MLP(128, 512), plan_of("tp", mesh), "h100", batch_tokens=8 * 256, mesh=mesh)
    _same(by_name, advise(by_plan, seq=None), "estimate")  # estimate_model is bare; estimate names its defaults
    assert by_name.mesh.shape == (2, 4) and by_name.mesh.slowdown.max() == 2.0
    plain = cost.estimate(MLP(128, 512), plan_of("tp", mesh), "h100", batch_tokens=8 * 256)
    assert plain.mesh.shape == (4,) and plain.step_s < by_name.step_s  # the slow chip is gone with its axis


def test_padding_is_said_and_the_model_flops_are_the_given_sizes() -> None:
    e = cost.estimate("fsdp", Mesh(X=3), "h100", 3 * 256, 100, 400, pad=True)
    assert e.padding == {"d_model": (100, 102), "d_ff": (400, 402)}
    assert (e.d_model, e.d_ff) == (100, 400) and e.model_flops == 12.0 * 3 * 256 * 100 * 400
    assert isinstance(e.model, MLP) and e.model.d_model == 102  # the MLP traced


def test_an_mlp_estimate_refuses_what_belongs_to_a_transformer() -> None:
    with pytest.raises(CostModelError, match="an MLP's batch is tokens"):
        cost.estimate(MLP(8, 16), "dp=2", "h100", batch_tokens=16, seq=4)
    with pytest.raises(CostModelError, match="belong to an MLP"):
        cost.estimate_model("llama-tiny", "dp=2", "h100", batch_tokens=2 * 16, seq=16, scheme="ddp")


def test_the_builder_gives_the_scheme_programs_and_the_model_programs() -> None:
    mesh = Mesh(X=2, Y=4)
    want = cost.scheme_program("fsdp_tp", mesh, 8 * 64, 64, 256, layers=2)
    got = builder.program_of(MLP(64, 256, layers=2), plan_of("fsdp_tp", mesh), 8 * 64)
    _same(want, got, "program")
    cfg, plan = get("llama-tiny"), Plan(dp=2, tp=2)
    assert builder.program_of(cfg, plan, 2 * 16, 16) is cost.model_program(cfg, plan, 2 * 16, 16)


def test_model_memory_and_the_planner_share_each_training_step() -> None:
    from shardsim.cost.layer_program import LayerCache

    builder.clear_steps()
    cfg = get("gpt-tiny")
    cache = LayerCache(cfg, "h100", seq=16)
    cache.layer(Plan(dp=2, tp=2), micro=2)
    held = builder.steps_held()
    one = cfg.scaled(layers=1, seq=max(16, cfg.seq), name="")
    step = builder.trained_step(one, Plan(dp=2, tp=2), Plan(dp=2, tp=2).mesh(), (4, 16), "adam", Precision.of("bf16"))
    assert builder.steps_held() == held  # read, not traced again
    fresh = builder.trained_step(one, Plan(dp=2, tp=2), Mesh(data=2, model=2), (4, 16), "adam", Precision.of("bf16"))
    assert fresh is step
    builder.clear_steps()
    again = builder.trained_step(one, Plan(dp=2, tp=2), Plan(dp=2, tp=2).mesh(), (4, 16), "adam", Precision.of("bf16"))
    assert again is not step and (again.memory, again.model_state, again.stored) == (
        step.memory,
        step.model_state,
        step.stored,
    )
    assert [dataclasses.replace(e, inputs=(), output=0) for e in again.events] == [
        dataclasses.replace(e, inputs=(), output=0) for e in step.events
    ]


def test_a_cached_model_memory_is_the_full_trace_field_by_field() -> None:
    cfg, plan = get("llama-tiny").scaled(layers=12), Plan(dp=2, pp=2, microbatches=12, zero=1)
    builder.clear_steps()
    carried = model_memory(cfg, plan, batch=24, seq=16)
    again = model_memory(cfg, plan, batch=24, seq=16)  # every step read from the cache
    full = model_memory(cfg, plan, batch=24, seq=16, full=True)
    assert carried == again == full
