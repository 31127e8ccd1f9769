"""``shardsim estimate --model --plan``: the API's numbers, token suffixes, one-line errors; the docs' example."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from shardsim import cli, cost
from shardsim.cli.estimate import tokens_type

DOCS = Path(__file__).resolve().parents[1] / "docs"


def documented(name: str) -> set[str]:
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    block = text.split("```json-schema\n", 1)[1].split("```", 1)[0]
    line = next(x for x in block.splitlines() if x.startswith(name + ":"))
    return {k.strip() for k in line.split(":", 1)[1].split(",")}


BRIEF = ["estimate", "--model", "llama3-70b", "--plan", "dp=16,tp=8,pp=4,zero=1", "--hardware", "h100",
         "--chips", "512", "--batch-tokens", "16M", "--seq", "8192"]  # fmt: skip


def test_the_model_command_prints_the_apis_estimate(capsys) -> None:
    assert cli.main([*BRIEF, "--json", "--train-tokens", "15e12"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    got = json.loads(out)
    assert set(got) == documented("estimate --model")
    want = cost.estimate("llama3-70b", "dp=16,tp=8,pp=4,zero=1", "h100", batch_tokens=2**24, seq=8192, chips=512)
    assert (got["step_s"], got["mfu"], got["bound"], got["memory_bytes"]) == (
        want.step_s, want.mfu, want.bound, want.memory["total"],
    )  # fmt: skip
    assert got["batch_tokens"] == 2**24 and got["days"] == want.days(15 * 10**12)
    assert any("microbatches=1" in w for w in got["warnings"])  # pp=4 with one microbatch: a 75% bubble


def test_the_text_output_has_the_summary_and_the_stage_tracks(capsys) -> None:
    argv = ["estimate", "--model", "llama-tiny", "--plan", "dp=2,pp=2,microbatches=4,data_axis=replica",
            "--hardware", "a100", "--batch-tokens", "128", "--seq", "16", "--width", "60"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "llama-tiny" in out and "bubble" in out and "tokens/s" in out
    assert re.search(r"^compute pipe0 ", out, re.M) and re.search(r"^comm replica", out, re.M)


def test_the_chrome_trace_has_a_track_per_stage(capsys, tmp_path) -> None:
    path = tmp_path / "model.json"
    argv = ["estimate", "--model", "llama-tiny", "--plan", "pp=2,microbatches=2", "--hardware", "h100",
            "--batch-tokens", "64", "--seq", "16", "--chrome-trace", str(path)]  # fmt: skip
    assert cli.main(argv) == 0
    capsys.readouterr()
    doc = json.loads(path.read_text())
    tracks = {e["args"]["name"] for e in doc["traceEvents"] if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert {"compute pipe0", "compute pipe1"} <= tracks


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--chips", "256"], "multiplies to 512 chips"),
        (["--model", "llama3-71b"], "no model preset 'llama3-71b'"),
        (["--plan", "dp=16,tp=3"], "does not divide by tp=3"),
        (["--batch-tokens", "1.5M"], "--batch-tokens"),
        (["--plan", "dp=4096"], "fewer than dp=4096"),
        (["--d-model", "512"], "--d-model: the MLP's options"),
        (["--mesh", "X=4"], "--mesh: the MLP's options"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, extra: list[str], needle: str) -> None:
    argv = ["estimate", "--model", "llama3-70b", "--plan", "dp=16,tp=8,pp=4", "--hardware", "h100",
            "--batch-tokens", "16M", "--chips", "512"]  # fmt: skip
    for flag, value in zip(extra[::2], extra[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    if "--plan" in extra and "--chips" in argv:
        del argv[argv.index("--chips") : argv.index("--chips") + 2]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_model_flags_without_a_model_are_refused(capsys) -> None:
    assert cli.main(["estimate", "--plan", "dp=2"]) == 2
    assert "--plan belongs to a model estimate" in capsys.readouterr().err


def test_token_suffixes_are_powers_of_two() -> None:
    assert tokens_type("16M") == 2**24 == 2048 * 8192
    assert (tokens_type("1k"), tokens_type("2G"), tokens_type("1T")) == (1024, 2**31, 2**40)
    assert tokens_type("15e12") == 15 * 10**12 and tokens_type("4096") == 4096
    for bad in ("1.5M", "M", "0", "-4", "1e-3", "inf"):
        with pytest.raises(Exception, match="expected a"):
            tokens_type(bad)


def test_the_docs_worked_example_runs() -> None:
    text = (DOCS / "cost-model.md").read_text(encoding="utf-8")
    section = text.split("## Estimating a model under a plan", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```", section, flags=re.S | re.M)
    assert blocks
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "docs/cost-model.md", "exec"), namespace)
    est = namespace["est"]
    assert isinstance(est, cost.ModelEstimate)
    first = est.summary().splitlines()[0]
    assert first in section  # the output shown is this estimate's
