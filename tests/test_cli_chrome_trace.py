"""``--chrome-trace FILE`` on ``shardsim demo``, ``train`` and ``estimate``: one process per scheme.

Each file is read back as JSON and compared with the run's own trace (or the estimate's time
line): one process per scheme, named after it, and one slice per traced step.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from shardsim import strategies
from shardsim.cli import main, run_demo
from shardsim.cost import estimate, get_hardware
from shardsim.mesh import Mesh


def _processes(doc: dict) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}


def _step_slices(doc: dict, pid: int) -> Counter:
    """The non-phase slices of one process, by name."""
    return Counter(e["name"] for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == pid and e["cat"] != "phase")


def test_demo_writes_one_process_per_scheme_with_every_step(tmp_path) -> None:
    out = tmp_path / "demo.json"
    assert main(["demo", "--scheme", "ddp", "fsdp", "--quiet", "--chrome-trace", str(out)]) == 0
    doc = json.loads(out.read_text())
    procs = _processes(doc)
    assert sorted(procs.values()) == ["ddp", "fsdp"]
    for pid, name in procs.items():
        trace = run_demo(name).result.trace  # the same seed and sizes: the same program
        want = trace.to_chrome_trace()
        assert sum(_step_slices(doc, pid).values()) == len(trace.events) > 0
        assert _step_slices(doc, pid) == _step_slices(want, 1)
    ag = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"].startswith("all_gather")]
    assert ag and all(procs[e["pid"]] == "fsdp" for e in ag)  # ddp gathers no weights


def test_train_writes_each_schemes_last_step(tmp_path) -> None:
    out = tmp_path / "train.json"
    argv = ["train", "--scheme", "ddp", "--scheme", "zero3", "--steps", "2", "--quiet", "--chrome-trace", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    procs = _processes(doc)
    assert sorted(procs.values()) == ["ddp", "zero3"]
    phases = {procs[e["pid"]]: set() for e in doc["traceEvents"] if e["ph"] == "X"}
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["cat"] == "phase":
            phases[procs[e["pid"]]].add(e["name"])
    assert {"forward", "loss", "backward"} <= phases["ddp"]
    assert {"forward", "loss", "backward"} <= phases["zero3"]
    gathers = Counter(procs[e["pid"]] for e in doc["traceEvents"] if e["name"].startswith("all_gather"))
    assert gathers["zero3"] > 0 and gathers["ddp"] == 0  # ZeRO-3 gathers its weights each step, DDP holds them


def test_estimate_writes_the_time_line(tmp_path) -> None:
    out = tmp_path / "est.json"
    argv = ["estimate", "--scheme", "fsdp", "--mesh", "X=16", "--hardware", "v5p", "--chrome-trace", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert list(_processes(doc).values()) == ["fsdp"]
    want = estimate("fsdp", Mesh(X=16), get_hardware("v5p"), 16 * 4096, 8192, 32768).timeline.to_chrome_trace()
    assert _step_slices(doc, 1) == _step_slices(want, 1) and sum(_step_slices(doc, 1).values()) > 0


@pytest.mark.parametrize("command", [["demo", "--scheme", "ddp"], ["train", "--scheme", "ddp"], ["estimate"]])
@pytest.mark.parametrize(
    "path, message", [("/nonexistent-shardsim-dir/x.json", "does not exist"), ("/", "is a folder; give a file name")]
)
def test_a_bad_path_is_one_line_and_exit_2(command, path, message, capsys) -> None:
    assert main([*command, "--chrome-trace", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--chrome-trace" in err and message in err


def test_every_scheme_named_is_a_process(tmp_path) -> None:
    out = tmp_path / "all.json"
    names = ["ddp", "tp", "fsdp_tp"]
    assert main(["demo", "--scheme", *names, "--quiet", "--chrome-trace", str(out)]) == 0
    assert sorted(_processes(json.loads(out.read_text())).values()) == sorted(strategies.get(n).name for n in names)
