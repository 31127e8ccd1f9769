"""Plan: fields named as Megatron names them, parse / str round trip, the mesh, and the errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardsim import Mesh, MeshAxisError, ShardingError
from shardsim.plans import Plan, PlanError


def test_parse_reads_every_field() -> None:
    plan = Plan.parse("dp=4,tp=2,sp,zero=1,recompute=selective,precision=bf16")
    got = (plan.dp, plan.tp, plan.sp, plan.zero, plan.recompute, plan.precision)
    assert got == (4, 2, True, 1, "selective", "bf16")
    assert plan.chips == 8
    assert Plan.parse("fsdp=8") == Plan(dp=8, zero=3)
    assert Plan.parse("pp=4,schedule=interleaved,virtual_stages=2,microbatches=8").virtual_stages == 2
    assert Plan.parse("") == Plan()


plans = st.builds(
    Plan,
    dp=st.integers(1, 8),
    zero=st.integers(0, 3),
    tp=st.integers(2, 8),
    sp=st.booleans(),
    pp=st.integers(1, 4),
    microbatches=st.integers(1, 8),
    ep=st.integers(1, 4),
    cp=st.integers(1, 4),
    cp_method=st.sampled_from(["ring", "all_gather"]),
    cp_balanced=st.booleans(),
    recompute=st.sampled_from(["none", "selective", "full"]),
    precision=st.sampled_from([None, "fp32", "bf16"]),
    model_axis=st.sampled_from(["model", "Y"]),
)


@given(plans)
def test_str_parses_back(plan: Plan) -> None:
    assert Plan.parse(str(plan)) == plan
    assert eval(repr(plan), {"Plan": Plan}) == plan


def test_mesh_has_one_axis_per_parallelism_tp_innermost() -> None:
    mesh = Plan.parse("dp=2,tp=4,pp=2").mesh()
    assert mesh.axis_names == ("data", "pipe", "model") and mesh.shape == (2, 2, 4)
    assert Plan().mesh().shape == (1,)
    Plan(dp=2, tp=2).check(Mesh(data=2, model=2))
    Plan(dp=2, tp=2, data_axis="X", model_axis="Y").check(Mesh(X=2, Y=2))


@pytest.mark.parametrize(
    ("text", "error", "words"),
    [
        ("dp=2,fancy=3", PlanError, "unknown plan key 'fancy'"),
        ("dp=two", PlanError, "whole number"),
        ("dp=0", PlanError, "Plan.dp"),
        ("zero=4", PlanError, "ZeRO stage"),
        ("sp", PlanError, "tp > 1"),
        ("recompute=some", PlanError, "selective"),
        ("schedule=zigzag", PlanError, "1f1b"),
        ("precision=fp8", PlanError, "bf16"),
        ("virtual_stages=2", PlanError, "interleaved"),
        ("dp=2,tp=2,model_axis=data", PlanError, "both run over mesh axis 'data'"),
        ("dp=2,dp=4", PlanError, "twice"),
        ("tp", PlanError, "needs a value"),
        ("tp=2,model_axis=a_b", MeshAxisError, "letters and digits"),
    ],
)
def test_bad_plans_name_the_culprit(text: str, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        Plan.parse(text)


def test_plan_must_fit_its_mesh() -> None:
    with pytest.raises(PlanError, match=r"mesh axis 'model', which Mesh\(data=2\) does not have"):
        Plan(dp=2, tp=2).check(Mesh(data=2))
    with pytest.raises(PlanError, match=r"tp=2 but mesh axis 'model' of .* has 4 chips"):
        Plan(tp=2).check(Mesh(model=4))
    with pytest.raises(PlanError, match="plays no part"):
        Plan(tp=2).check(Mesh(model=2, X=2))
    with pytest.raises(PlanError, match="sets dp=1 on it"):
        Plan(tp=2).check(Mesh(data=2, model=2))
    assert issubclass(PlanError, ShardingError)
