"""docs/own-scheme.md is real: its blocks run, its reference is right, and what it says it wrote is there."""

from __future__ import annotations

import json

import numpy as np
import pytest

from doc_blocks import python_blocks, run_blocks
from finite_differences import numeric_grad
from shardsim import cli, mlp, strategies


@pytest.fixture
def page(tmp_path, monkeypatch, capsys):
    """The page's blocks run in a scratch folder; the scheme they register leaves with the test."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(strategies.registry, "_REGISTRY", dict(strategies.registry._REGISTRY))
    namespace = run_blocks("own-scheme.md")
    return namespace, tmp_path, capsys.readouterr().out


def test_the_page_has_each_step() -> None:
    blocks = python_blocks("own-scheme.md")
    assert len(blocks) == 5
    for words in ("def forward", "strategies.register", "check_scheme(", "to_chrome_trace(", "cost.estimate("):
        assert any(words in b for b in blocks), words


def test_the_worked_example_runs_and_writes_its_traces(page) -> None:
    _, folder, out = page
    assert "megatron_mlp" in strategies.names()
    assert "all_reduce" in out and "-bound: step" in out
    for name in ("megatron_mlp.json", "megatron_mlp_h100.json"):
        doc = json.loads((folder / name).read_text())
        assert any(e["ph"] == "X" and e["cat"] == "collective" for e in doc["traceEvents"])


def test_the_pages_reference_is_the_residual_block(page) -> None:
    """The page's reference against central differences of ``x + MLP(x)`` (float64)."""
    reference = page[0]["reference"]
    rng = np.random.default_rng(3)
    params = mlp.init(4, 6, seed=2, dtype="float64")
    x = rng.standard_normal((3, 4))
    dout = rng.standard_normal((3, 4))
    out, grads = reference(params, x, dout, "gelu")
    np.testing.assert_allclose(out, x + mlp.forward(params, x, "gelu"))

    def loss() -> float:
        return float(np.sum((x + mlp.forward(params, x, "gelu")) * dout))

    for name, value in (("x", x), ("w_in", params["w_in"]), ("w_out", params["w_out"])):
        np.testing.assert_allclose(grads[name], numeric_grad(loss, value), rtol=1e-6, atol=1e-8, err_msg=name)


def test_the_command_line_runs_the_registered_scheme(page, capsys) -> None:
    assert cli.main(["demo", "--scheme", "megatron_mlp"]) == 0
    assert "megatron_mlp: PASS" in capsys.readouterr().out
