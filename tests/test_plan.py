"""Plan: fields named as Megatron names them, parse / str round trip, the mesh, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim import Mesh, ShardingError
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


# every field's hostile values: wrong types, out-of-set words, axis names the mesh refuses
ANY = st.one_of(st.none(), st.booleans(), st.integers(-2, 9), st.floats(allow_nan=True), st.text(max_size=6))
FIELD_VALUES = {
    **{f: st.one_of(st.integers(1, 4), ANY) for f in ("dp", "tp", "pp", "ep", "cp", "microbatches", "virtual_stages")},
    "zero": st.one_of(st.integers(0, 3), ANY),
    **{f: st.one_of(st.booleans(), ANY) for f in ("sp", "cp_balanced")},
    "schedule": st.one_of(st.sampled_from(["gpipe", "1f1b", "interleaved"]), ANY),
    "cp_method": st.one_of(st.sampled_from(["ring", "all_gather"]), ANY),
    "attention": st.one_of(st.sampled_from(["standard", "flash"]), ANY),
    "recompute": st.one_of(st.sampled_from(["none", "selective", "full"]), ANY),
    "precision": st.one_of(st.sampled_from([None, "bf16", "fp32"]), ANY, st.just(["bf16"])),
    **{
        f"{r}_axis": st.one_of(st.sampled_from(["X", "Y", "a,b", "a_b", "a=b", "shape", "Z2"]), ANY)
        for r in ("data", "model", "pipe", "expert", "context")
    },
}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.fixed_dictionaries({}, optional=FIELD_VALUES))
def test_every_plan_parses_back_or_is_refused(fields: dict[str, object]) -> None:
    """A Plan of any field values is either refused with a PlanError or written by str() as text
    that Plan.parse reads back to the same plan."""
    try:
        plan = Plan(**fields)  # type: ignore[arg-type]
    except PlanError:
        return
    assert Plan.parse(str(plan)) == plan


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("fsdp=4,zero=1", r"fsdp=4 means dp=4,zero=3 \(FSDP\), but 'fsdp=4,zero=1' also sets zero=1"),
        ("zero=2,fsdp=4", r"also sets zero=2; write fsdp=4 alone, or dp=4,zero=2"),
        ("fsdp=2,dp=2", r"plan key 'dp' given twice .* \(fsdp=2 sets dp\)"),
        ("fsdp", r"'fsdp' needs the data-parallel degree"),
    ],
)
def test_fsdp_and_a_contradicting_key_are_refused(text: str, words: str) -> None:
    with pytest.raises(PlanError, match=words):
        Plan.parse(text)
    assert Plan.parse("fsdp=4,zero=3") == Plan.parse("zero=3,fsdp=4") == Plan(dp=4, zero=3)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"dp": 2, "data_axis": "a,b"}, r"Plan.data_axis='a,b': mesh axis name 'a,b' must be letters and digits"),
        ({"tp": 2, "sp": 2}, r"Plan.sp is True \(sequence parallelism on\) or False, got 2"),
        ({"model_axis": "shape"}, r"Plan.model_axis='shape': .* collides"),
        ({"precision": ["bf16"]}, r"Plan.precision=\['bf16'\]: choose one of"),
        ({"schedule": None}, r"Plan.schedule=None: choose one of"),
    ],
)
def test_plan_checks_every_field(fields: dict[str, object], words: str) -> None:
    with pytest.raises(PlanError, match=words):
        Plan(**fields)  # type: ignore[arg-type]


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
        ("tp=2,model_axis=a_b", PlanError, "model_axis=.a_b.: mesh axis name .a_b. must be letters and digits"),
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


@pytest.mark.parametrize("zero", [1.0, -0.0, np.int64(1)], ids=repr)
def test_the_zero_stage_is_a_python_int_as_every_degree_is(zero: object) -> None:
    with pytest.raises(PlanError, match=r"Plan\.zero is the ZeRO stage 0, 1, 2 or 3"):
        Plan(dp=2, zero=zero)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"Plan\.dp must be a whole number"):
        Plan(dp=np.int64(2))  # type: ignore[arg-type]
