"""One set of defaults: the Python API and the command line apply the same ones (FlashAttention,
an H100 on the command line, bf16 weights with float32 master weights and moments, Adam, the
calibrated efficiency, the model's sequence) and print them with every answer."""

from __future__ import annotations

import json

from shardsim import cli, cost
from shardsim.cost.defaults import line
from shardsim.planner import plan
from shardsim.plans import Plan
from shardsim.training import model_memory

PLAN = "dp=2,tp=2"
ASK = ["--model", "llama-tiny", "--plan", PLAN, "--batch-tokens", "64"]


def test_a_plan_without_attention_runs_flash_and_its_text_round_trips() -> None:
    assert Plan().attention == "flash" and Plan.parse(PLAN) == Plan.parse(PLAN + ",attention=flash")
    standard = Plan.parse(PLAN).replace(attention="standard")
    assert str(standard) == PLAN + ",attention=standard" and Plan.parse(str(standard)) == standard
    assert str(Plan.parse(PLAN + ",attention=flash")) == PLAN


def test_the_api_and_the_command_line_apply_and_print_the_same_defaults(capsys) -> None:
    # the same question, asked through the Python API with every default spelled out
    spelled = cost.estimate(
        "llama-tiny", PLAN + ",attention=flash", "h100", batch_tokens=64, seq=16,
        efficiency="calibrated", optimizer="adam", precision="bf16",
    )  # fmt: skip
    api = cost.estimate("llama-tiny", PLAN, "h100", batch_tokens=64)
    assert (api.step_s, api.memory) == (spelled.step_s, spelled.memory)
    want = {
        "attention": "flash",
        "precision": "bf16 (fp32 master weights and moments)",
        "optimizer": "adam",
        "efficiency": "calibrated",
        "seq": "16 (the model's)",
    }
    assert api.defaults == want and api.summary().splitlines()[-1] == line(want)
    # the command line without --hardware: the same figures, and the hardware named too
    assert cli.main(["estimate", *ASK, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["step_s"], got["memory_bytes"], got["hardware"]) == (api.step_s, api.memory["total"], "h100")
    assert got["defaults"] == {"hardware": "h100", **want}
    assert cli.main(["estimate", *ASK]) == 0
    assert line({"hardware": "h100", **want}) in capsys.readouterr().out.splitlines()
    # a setting away from its default is no longer named
    assert cli.main(["estimate", *ASK, "--hardware", "h100", "--json", "--efficiency", "ideal"]) == 0
    assert set(json.loads(capsys.readouterr().out)["defaults"]) == set(want) - {"efficiency"}


def test_the_mlp_estimate_defaults_to_the_h100_as_the_planner_does(capsys) -> None:
    argv = ["estimate", "--mesh", "X=8", "--per-chip-batch", "1024", "--json"]
    assert cli.main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    want = cost.estimate("fsdp", {"X": 8}, "h100", 8 * 1024, 8192, 32768)
    assert (got["hardware"], got["step_s"]) == ("h100", want.step_s)
    assert got["defaults"] == {"hardware": "h100", **want.defaults} and "attention" not in want.defaults


def test_the_planner_searches_and_names_the_same_defaults(capsys) -> None:
    table = plan("llama-tiny", "h100", 2, batch_tokens=4 * 16, zero=0, recompute="none")
    assert all(r.plan.attention == "flash" for r in table.rows)
    want = cost.estimate("llama-tiny", table.best.plan, "h100", batch_tokens=64).defaults
    assert table.defaults == want and table.text().splitlines()[1] == line(want)
    argv = ["plan", "--model", "llama-tiny", "--chips", "2", "--batch-tokens", "64", "--fix", "zero=0,recompute=none"]
    assert cli.main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["defaults"] == {"hardware": "h100", **want}
    fixed = plan("llama-tiny", "h100", 2, batch_tokens=64, seq=16, zero=0, recompute="none", attention="standard")
    assert "attention" not in fixed.defaults and "seq" not in fixed.defaults
    spelled = cost.estimate("llama-tiny", "dp=2,attention=standard", "h100", batch_tokens=64, seq=16,
                            efficiency="ideal", optimizer="sgd", precision="fp32")  # fmt: skip
    assert spelled.defaults == {} and not spelled.summary().splitlines()[-1].startswith("defaults:")


def test_model_memory_takes_the_same_attention() -> None:
    # gpt3-125m at its 2,048 tokens: the standard kernel keeps the [B, N, S, S] probabilities
    default, _ = model_memory("gpt3-125m", "dp=1", batch=1)
    flash, _ = model_memory("gpt3-125m", "dp=1,attention=flash", batch=1)
    standard, _ = model_memory("gpt3-125m", "dp=1,attention=standard", batch=1)
    assert default == flash and standard["activations"] > flash["activations"]
