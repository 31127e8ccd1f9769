"""torchtitan's TOML job configuration in and out: a published configuration read to its plan,
round trips, the CLI, and what cannot be honoured refused by key."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
from hypothesis import given
from hypothesis import strategies as st

from shardsim.errors import PlanError
from shardsim.frameworks import Launch, from_torchtitan, to_torchtitan
from shardsim.plans import Plan

LLAMA3_8B = Path(__file__).parent / "data" / "torchtitan" / "llama3_8b.toml"


def test_the_published_llama3_8b_configuration_reads_to_its_plan() -> None:
    with pytest.raises(PlanError, match=r"per-op checkpointing .* pass recompute= to from_torchtitan"):
        from_torchtitan(LLAMA3_8B, world_size=8)  # its selective checkpointing is per op: not modelled
    launch = from_torchtitan(LLAMA3_8B, world_size=8, recompute="full")
    assert launch == Launch(Plan(dp=8, zero=3, recompute="full", precision="bf16"), 1, 8, 8192)


def _plan(dp: int, fsdp: bool, tp: int, pp: int, cp: int, m: int, sched: str, rec: str, ring: str, prec: str) -> Plan:
    return Plan(
        dp=dp, zero=3 if fsdp and dp > 1 else 0, tp=tp, sp=tp > 1, pp=pp, cp=cp, recompute=rec, precision=prec,
        microbatches=m, schedule=sched if pp > 1 else "1f1b", cp_method=ring if cp > 1 else "ring",
    )  # fmt: skip


plans = st.builds(
    _plan, st.sampled_from([1, 2, 4]), st.booleans(), st.sampled_from([1, 2, 8]), st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2]), st.sampled_from([1, 4]), st.sampled_from(["gpipe", "1f1b"]),
    st.sampled_from(["none", "full"]), st.sampled_from(["ring", "all_gather"]),
    st.sampled_from(["bf16", "fp32"]),
)  # fmt: skip


@given(plans, st.sampled_from([1, 2]))
def test_every_plan_torchtitan_expresses_survives_the_round_trip(plan: Plan, micro: int) -> None:
    launch = Launch(plan, micro, micro * plan.microbatches * plan.dp, 2048)
    text = to_torchtitan(launch)
    assert tomllib.loads(text)  # TOML as torchtitan's parser reads it
    assert from_torchtitan(text, world_size=plan.chips) == launch


def _with(section: str, **keys: object) -> dict[str, object]:
    config = tomllib.loads(LLAMA3_8B.read_text())
    config["activation_checkpoint"] = {"mode": "full"}
    config[section] = {**config.get(section, {}), **keys}
    return config


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (_with("parallelism", data_parallel_replicate_degree=2), "HSDP is not modelled"),
        (_with("parallelism", fsdp_reshard_after_forward="never"), "fsdp_reshard_after_forward='never'"),
        (_with("parallelism", expert_parallel_degree=2), "expert parallelism is not read yet"),
        (_with("parallelism", pipeline_parallel_degree=2, pipeline_parallel_schedule="ZBVZeroBubble"), "ZBVZeroBubble"),
        (_with("parallelism", tensor_parallel_degree=3), "does not divide by replicate x tensor"),
        (_with("parallelism", data_parallel_shard_degree=4), "the shard degree would be 8"),
        (
            _with(
                "parallelism",
                tensor_parallel_degree=2,
                context_parallel_degree=2,
                context_parallel_rotate_method="ring",
            ),
            "context_parallel_rotate_method='ring'",
        ),
        (_with("parallelism", secret=1), r"\[parallelism\] secret: not keys shardsim reads"),
        (_with("activation_checkpoint", mode="selective", selective_ac_option="2"), "every N layers is not modelled"),
        (_with("float8", enable_fsdp_float8_all_gather=True), "FP8 training is not modelled"),
        (_with("optimizer", name="Lion"), "name='Lion'"),
        (_with("training", global_batch_size=12), "global_batch_size=12 is not a multiple"),
        (_with("quantize", linear=True), r"\[quantize\]: not a torchtitan section"),
    ],
)
def test_keys_that_cannot_be_honoured_are_refused_by_name(config: dict[str, object], match: str) -> None:
    with pytest.raises(PlanError, match=match):
        from_torchtitan(config, world_size=8)


def test_plans_torchtitan_cannot_express_and_bad_files(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="zero=1: torchtitan runs FSDP"):
        to_torchtitan(Launch(Plan(dp=2, zero=1), 1, 2, 16))
    with pytest.raises(PlanError, match="sp=False"):
        to_torchtitan(Launch(Plan(tp=2), 1, 1, 16))
    with pytest.raises(PlanError, match="recompute=selective: torchtitan's selective checkpointing is per op"):
        to_torchtitan(Launch(Plan(dp=2, recompute="selective", attention="standard"), 1, 2, 16))
    with pytest.raises(PlanError, match="schedule=zb-h1: torchtitan's schedules here are"):
        to_torchtitan(Launch(Plan(dp=2, zero=3, pp=2, microbatches=2, schedule="zb-h1"), 1, 4, 16))
    bad = tmp_path / "job.toml"
    bad.write_text("[training\n")
    with pytest.raises(PlanError, match="not TOML"):
        from_torchtitan(bad, world_size=1)
    with pytest.raises(PlanError, match="cannot read it"):
        from_torchtitan(tmp_path / "none.toml", world_size=1)
    interleaved = _with("parallelism", pipeline_parallel_degree=2, pipeline_parallel_schedule="Interleaved1F1B",
                        pipeline_parallel_layers_per_stage=4)  # fmt: skip
    interleaved["training"] = {**interleaved["training"], "local_batch_size": 4}  # type: ignore[dict-item]
    assert from_torchtitan(interleaved, world_size=8, layers=32).plan.virtual_stages == 4
    with pytest.raises(PlanError, match="give pipeline_parallel_layers_per_stage and layers="):
        from_torchtitan(interleaved, world_size=8)


def test_the_cli_reads_and_writes_the_configuration(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import json

    from shardsim.cli import main

    assert main(["estimate", "--model", "llama3-8b", "--chips", "8", "--torchtitan", str(LLAMA3_8B)]) == 2
    assert "per-op checkpointing" in capsys.readouterr().err
    full = Path(tmp_path) / "job.toml"
    full.write_text(LLAMA3_8B.read_text().replace('mode = "selective"', 'mode = "full"'))
    assert main(["estimate", "--model", "llama3-8b", "--chips", "8", "--torchtitan", str(full), "--json"]) == 0
    by_config = json.loads(capsys.readouterr().out)
    ask = ["--plan", "dp=8,zero=3,recompute=full,precision=bf16", "--batch-tokens", "65536", "--seq", "8192"]
    assert main(["estimate", "--model", "llama3-8b", *ask, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_s"] == by_config["step_s"]
    search = ["--model", "gpt-tiny", "--hardware", "h100", "--chips", "2", "--batch-tokens", "64", "--seq", "16"]
    assert main(["plan", *search, "--fix", "zero=3", "--top", "1", "--emit", "torchtitan"]) == 0
    text = capsys.readouterr().out.split("[training]", 1)[1]
    from shardsim.planner import plan

    best = plan("gpt-tiny", "h100", 2, 64, 16, zero=3).best
    assert from_torchtitan("[training]" + text, world_size=2).plan == best.plan.replace(precision="bf16")
