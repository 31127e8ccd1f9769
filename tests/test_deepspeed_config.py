"""DeepSpeed's JSON configuration in and out: the ZeRO stages and the batch read to their plan,
round trips, the CLI, and what cannot be honoured refused by key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardsim.errors import PlanError
from shardsim.frameworks import Launch, from_deepspeed, to_deepspeed
from shardsim.plans import Plan

# the shape of DeepSpeed's published ZeRO-3 example configuration (its docs' "ZeRO-3" section),
# with its communication knobs, which change no program
ZERO3 = {
    "train_batch_size": 256,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
    "zero_optimization": {
        "stage": 3, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": 5e8,
        "stage3_prefetch_bucket_size": 5e8, "stage3_param_persistence_threshold": 1e6,
        "stage3_max_live_parameters": 1e9, "stage3_gather_16bit_weights_on_model_save": True,
    },
    "steps_per_print": 100,
    "wall_clock_breakdown": False,
}  # fmt: skip


def test_a_zero3_configuration_reads_to_its_plan(tmp_path: Path) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(ZERO3))
    launch = from_deepspeed(path, world_size=32, seq=2048)
    assert launch == Launch(Plan(dp=32, zero=3, microbatches=2, precision="bf16"), 4, 256, 2048)
    assert launch.batch_tokens == 256 * 2048
    shipped = Path(__file__).parent / "data" / "deepspeed" / "zero3.json"  # the docs' example
    assert from_deepspeed(shipped, world_size=32, seq=2048) == launch


@given(st.sampled_from([1, 2, 8, 64]), st.integers(0, 3), st.integers(1, 8), st.integers(1, 4),
       st.sampled_from([None, "bf16", "fp16"]))  # fmt: skip
def test_every_data_parallel_plan_survives_the_round_trip(
    dp: int, zero: int, m: int, micro: int, prec: str | None
) -> None:
    launch = Launch(
        Plan(dp=dp, zero=zero if dp > 1 else 0, microbatches=m, precision=prec), micro, micro * m * dp, 4096
    )
    assert from_deepspeed(json.loads(json.dumps(to_deepspeed(launch))), world_size=dp, seq=4096) == launch


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}, "offload_optimizer"),
        ({"zero_optimization": {"stage": 3, "zero_quantized_weights": True}}, "ZeRO\\+\\+'s quantised weight gathers"),
        ({"zero_optimization": {"stage": 4}}, "stage=4: 0, 1, 2 or 3"),
        ({"zero_optimization": {"stage": 2, "secret_knob": 1}}, "zero_optimization.secret_knob: not a ZeRO key"),
        ({"train_batch_size": 100}, "train_batch_size=100 is not .* = 4 x 2 x 32"),
        ({"train_micro_batch_size_per_gpu": "auto"}, "'auto': give the number"),
        ({"optimizer": {"type": "Lamb"}}, "optimizer.type='Lamb'"),
        ({"optimizer": "Adam"}, "optimizer='Adam': a JSON object with its type"),
        ({"fp16": {"enabled": True}}, "bf16 and fp16 both enabled"),
        ({"activation_checkpointing": {"partition_activations": True}}, "set the plan's recompute="),
        ({"pipeline": {"stages": 4}}, "pipeline: not DeepSpeed keys shardsim reads"),
    ],
)  # fmt: skip
def test_keys_that_cannot_be_honoured_are_refused_by_name(change: dict[str, object], match: str) -> None:
    with pytest.raises(PlanError, match=match):
        from_deepspeed({**ZERO3, **change}, world_size=32, seq=2048)


def test_plans_deepspeed_cannot_configure_and_bad_files(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="tp=2: a DeepSpeed configuration sets data parallelism and ZeRO only"):
        to_deepspeed(Launch(Plan(dp=2, tp=2), 1, 2, 16))
    bad = tmp_path / "ds.json"
    bad.write_text("{")
    with pytest.raises(PlanError, match="not JSON"):
        from_deepspeed(bad, world_size=2, seq=16)
    with pytest.raises(PlanError, match="cannot read it"):
        from_deepspeed(tmp_path / "none.json", world_size=2, seq=16)


def test_the_cli_reads_and_writes_the_configuration(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from shardsim.cli import main

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 2}))
    assert (
        main(["estimate", "--model", "llama-tiny", "--chips", "4", "--seq", "16", "--deepspeed", str(path), "--json"])
        == 0
    )
    by_config = json.loads(capsys.readouterr().out)
    assert (
        main(
            [
                "estimate",
                "--model",
                "llama-tiny",
                "--plan",
                "dp=4,zero=3",
                "--batch-tokens",
                "128",
                "--seq",
                "16",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["step_s"] == by_config["step_s"]
    assert main(["estimate", "--model", "llama-tiny", "--chips", "4", "--deepspeed", str(path)]) == 2
    assert "--deepspeed needs --seq (the sequence length)" in capsys.readouterr().err
    search = ["--model", "gpt-tiny", "--hardware", "h100", "--chips", "2", "--batch-tokens", "64", "--seq", "16"]
    assert main(["plan", *search, "--allow", "dp,zero", "--top", "1", "--emit", "deepspeed"]) == 0
    written = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    from shardsim.planner import plan

    best = plan("gpt-tiny", "h100", 2, 64, 16, allow=("dp", "zero")).best
    assert from_deepspeed(written, world_size=2, seq=16).plan == best.plan
