"""Megatron-LM's flags in and out: published launches read to their plans, every plan Megatron
can express survives the round trip, and what cannot be honoured is refused by name."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardsim.errors import PlanError, ShardsimError
from shardsim.frameworks import Launch, from_megatron, to_megatron
from shardsim.models import get
from shardsim.plans import Plan

# Llama 3 405B on 16,384 H100s (Dubey et al. 2024, Table 4: TP 8, CP 1, PP 16, DP 128, 16M tokens
# of 8,192 a step) as Megatron-LM flags, with the interleaved schedule of 8 layers a chunk
LLAMA3_405B = (
    "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --sequence-parallel "
    "--use-distributed-optimizer --num-layers 128 --num-layers-per-virtual-pipeline-stage 4 "
    "--micro-batch-size 1 --global-batch-size 2048 --seq-length 8192 --bf16 --lr 8e-5 --overlap-grad-reduce "
    "--data-path /data/tokens --save /ckpt --log-interval 1"
)


def test_a_published_launch_reads_to_its_plan() -> None:
    launch = from_megatron(LLAMA3_405B, world_size=16_384)
    assert launch.plan == Plan(
        dp=128, zero=1, tp=8, sp=True, pp=16, schedule="interleaved", virtual_stages=2, microbatches=16,
        precision="bf16",
    )  # fmt: skip
    assert (launch.batch_tokens, launch.micro_batch) == (16 * 2**20, 1)
    assert launch.plan.chips == 16_384


def test_expert_parallelism_is_carved_out_of_the_data_parallel_group() -> None:
    args = "--expert-model-parallel-size 4 --tensor-model-parallel-size 2 --global-batch-size 64 --seq-length 4096"
    launch = from_megatron(args, world_size=64)
    assert (launch.plan.dp, launch.plan.ep, launch.plan.tp, launch.plan.microbatches) == (8, 4, 2, 2)
    assert launch.plan.chips == 64


def _plan(tp: int, pp: int, cp: int, ep: int, dp: int, v: int, m: int, rec: str, attn: str, ring: str, zero: int,
          sp: bool) -> Plan:  # fmt: skip
    return Plan(
        dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero if dp * ep > 1 else 0, sp=sp and tp > 1,
        schedule="interleaved" if v > 1 and pp > 1 else "1f1b", virtual_stages=v if pp > 1 else 1,
        microbatches=m, recompute=rec, attention=attn, cp_method=ring if cp > 1 else "ring",
    )  # fmt: skip


plans = st.builds(
    _plan, st.sampled_from([1, 2, 8]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]), st.sampled_from([1, 2]),
    st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]), st.sampled_from([1, 4]),
    st.sampled_from(["none", "selective", "full"]), st.sampled_from(["flash", "standard"]),
    st.sampled_from(["ring", "all_gather"]), st.sampled_from([0, 1]), st.booleans(),
)  # fmt: skip


@given(plans, st.sampled_from([1, 2]), st.sampled_from([2048, 8192]), st.sampled_from([None, "bf16", "fp16"]))
def test_every_plan_megatron_expresses_survives_the_round_trip(
    plan: Plan, micro: int, seq: int, precision: str | None
) -> None:
    plan = plan.replace(precision=precision)
    launch = Launch(plan, micro, micro * plan.dp * plan.ep * plan.microbatches, seq)
    assert from_megatron(to_megatron(launch), world_size=plan.chips) == launch


@pytest.mark.parametrize(
    ("plan", "match"),
    [
        (Plan(dp=4, zero=3), r"zero=3: .* ZeRO-1 \(--use-distributed-optimizer\) at most"),
        (Plan(dp=2, pp=2, schedule="gpipe", microbatches=2), "schedule=gpipe"),
        (Plan(dp=2, pp=2, schedule="zb-h1", microbatches=2), "schedule=zb-h1: Megatron-LM's flags here run 1F1B"),
        (Plan(dp=2, cp=2, cp_balanced=False), "cp_balanced=False"),
    ],
)
def test_plans_megatron_cannot_express_are_refused(plan: Plan, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        to_megatron(Launch(plan, 1, 8 * plan.dp, 1024))


BATCH = "--global-batch-size 64 --seq-length 2048"


@pytest.mark.parametrize(
    ("args", "world", "match"),
    [
        ("--sequence-parallel", 8, "--sequence-parallel splits the tensor-parallel group's tokens"),
        (
            "--tensor-model-parallel-size 3",
            8,
            r"world size 8 does not divide by tensor x pipeline x context = 3 x 1 x 1",
        ),
        ("--expert-model-parallel-size 3", 8, r"--expert-model-parallel-size 3: the data-parallel size 8"),
        ("--fp8-format hybrid", 8, "--fp8-format: FP8 training is not modelled here"),
        ("--cp-comm-type a2a --context-parallel-size 2", 8, "--cp-comm-type a2a"),
        ("--recompute-granularity full --recompute-method block --recompute-num-layers 4", 8, "block"),
        ("--recompute-num-layers 1", 8, "give --recompute-granularity full too"),
        ("--attention-backend unfused --use-flash-attn", 8, "choose one"),
        ("--use-megatron-fsdp", 8, "Megatron-FSDP"),
        ("--moe-router-topk 2", 8, "--moe-router-topk: not a Megatron-LM flag shardsim reads"),
        ("--tensor-model-parallel-size two", 8, "--tensor-model-parallel-size two: a whole number >= 1"),
        ("--micro-batch-size 3", 8, r"--global-batch-size 64 does not divide into microbatches of 3 over 8"),
        ("--virtual-pipeline-model-parallel-size 2", 8, "a virtual pipeline needs --pipeline-model-parallel-size > 1"),
    ],
)
def test_flags_that_cannot_be_honoured_are_refused_by_name(args: str, world: int, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        from_megatron(f"{args} {BATCH}", world_size=world)


def test_missing_batch_and_model_flags_that_disagree() -> None:
    with pytest.raises(PlanError, match="--global-batch-size: give it"):
        from_megatron("--tensor-model-parallel-size 2", world_size=4)
    with pytest.raises(PlanError, match="--hidden-size 4096: the model has d_model=8192"):
        from_megatron(f"--hidden-size 4096 {BATCH}", world_size=8, model=get("llama3-70b"))
    launch = from_megatron(f"--num-layers 80 --hidden-size 8192 {BATCH}", world_size=8, model=get("llama3-70b"))
    assert launch.plan == Plan(dp=8, microbatches=8)
    with pytest.raises(ShardsimError, match="world_size=0"):
        from_megatron(BATCH, world_size=0)


def test_the_cli_reads_and_writes_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import shlex

    from shardsim.cli import main

    flags = (
        "--tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 2 --global-batch-size 16 --seq-length 16"
    )
    assert main(["estimate", "--model", "llama-tiny", "--chips", "4", "--megatron", flags, "--json"]) == 0
    by_flags = json.loads(capsys.readouterr().out)
    ask = ["--plan", "dp=2,tp=2,sp,microbatches=4", "--batch-tokens", "256", "--seq", "16", "--json"]
    assert main(["estimate", "--model", "llama-tiny", *ask]) == 0
    assert json.loads(capsys.readouterr().out)["step_s"] == by_flags["step_s"]
    assert main(["estimate", "--model", "llama-tiny", "--megatron", flags]) == 2
    assert "--megatron needs --chips" in capsys.readouterr().err
    search = ["--model", "gpt-tiny", "--hardware", "h100", "--chips", "2", "--batch-tokens", "64", "--seq", "16"]
    assert main(["plan", *search, "--fix", "zero=0,recompute=none", "--top", "1", "--emit", "megatron"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    from shardsim.planner import plan

    best = plan("gpt-tiny", "h100", 2, 64, 16, zero=0, recompute="none").best
    assert from_megatron(shlex.split(last), world_size=2).plan == best.plan
