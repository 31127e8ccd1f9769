"""``--json`` and ``--csv``: parseable, the keys docs/cli.md lists, and the Python API's numbers."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import numpy as np

from shardsim import Mesh, cli, cost, strategies

DOC = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text(encoding="utf-8")


def documented(name: str) -> set[str]:
    block = DOC.split("```json-schema\n", 1)[1].split("```", 1)[0]
    line = next(x for x in block.splitlines() if x.startswith(name + ":"))
    return {k.strip() for k in line.split(":", 1)[1].split(",")}


def run_json(capsys, *argv: str) -> dict:
    assert cli.main(list(argv)) == 0
    out, err = capsys.readouterr()
    assert all(": warning: " in line for line in err.splitlines()), err  # stderr holds warnings only
    return json.loads(out)


def test_estimate_json_is_the_apis_estimate(capsys) -> None:
    got = run_json(capsys, "estimate", "--json", "--hardware", "tpu-v5p", "--mesh", "X=16", "--per-chip-batch", "2048",
                   "--layers", "2")  # fmt: skip
    assert set(got) == documented("estimate")
    want = cost.estimate("fsdp", Mesh(X=16), "tpu-v5p", 16 * 2048, 8192, 32768, 2)
    assert (got["step_s"], got["comm_s"], got["mfu"], got["bound"]) == (want.step_s, want.comm_s, want.mfu, want.bound)
    assert got["memory_bytes"] == want.memory["total"]


def test_sweep_json_and_csv_are_the_apis_sweep(capsys) -> None:
    argv = ["sweep", "--hardware", "h100", "--chips", "8", "--batches", "1024,4096"]
    got = run_json(capsys, *argv, "--json")
    assert set(got) == documented("sweep")
    want = cost.sweep(["ddp", "fsdp", "tp", "fsdp_tp"], "h100", [1024, 4096], 8192, 32768, chips=8)
    assert [r["step_s"] for r in got["rows"]] == [e.step_s for e in want]
    assert cli.main([*argv, "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [float(r["mfu"]) for r in rows] == [e.mfu for e in want]


def test_critical_json_is_the_apis_critical_batch(capsys) -> None:
    got = run_json(capsys, "critical", "--json", "--scheme", "ddp", "--hardware", "h100", "--chips", "256")
    assert set(got) == documented("critical")
    assert got["per_chip_batch"] == cost.critical_batch("ddp", "h100", chips=256).per_chip_batch


def test_demo_json_is_the_runs_trace_and_ledger(capsys) -> None:
    got = run_json(capsys, "demo", "--json", "--scheme", "fsdp_tp")
    assert set(got) == documented("demo") and got["ok"] is True
    (s,) = got["schemes"]
    assert set(s) == documented("demo.schemes[]")
    r = cli.run_demo("fsdp_tp").result
    assert s["forward_sent_bytes"] == r.trace.total("sent_bytes", "forward")
    assert s["peak_bytes"] == int(r.memory["total"].max()) and len(s["steps"]) == len(r.trace.events)
    assert [c["ok"] for c in s["checks"]] == [True] * 4


def test_train_json_losses_are_single_device_training(capsys) -> None:
    got = run_json(capsys, "train", "--json", "--scheme", "ddp", "--steps", "3")
    assert set(got) == documented("train") and set(got["schemes"][0]) == documented("train.schemes[]")
    from shardsim.cli import train as train_cli
    from shardsim.training import optim

    p, x, y = train_cli.problem(2, 8, 16, 32)
    want = train_cli.reference_losses(p, x, y, optim.get("adam", lr=got["lr"]), 3, "gelu", False)
    assert np.allclose(got["reference_losses"], want, rtol=0, atol=0)
    assert np.allclose(got["schemes"][0]["losses"], want, rtol=got["tolerance"])
    assert got["schemes"][0]["verdict"] == "PASS" and got["reference_losses"][-1] < got["reference_losses"][0]
    assert re.fullmatch(r"[0-9.e-]+", str(got["lr"])) and strategies.get("ddp")
