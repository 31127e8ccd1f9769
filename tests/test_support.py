"""The support matrix: generated from the code, current in the docs, and every "works" checked.

A cell that claims to work is exercised again here against references the matrix does not
use: each scheme's own one-block reference (one block, not the stacked composition the
matrix runs), and ``test_run_model``'s reference check for the transformer plans. A scheme
that computes wrong gradients, or whose shape-only program differs, is caught.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import support_matrix as support
from shardsim import Mesh, strategies
from shardsim.models import TransformerConfig
from shardsim.plans import Plan
from test_run_model import check_against_reference

PAGE = Path(__file__).resolve().parents[1] / "docs" / "support.md"

# the matrix below is computed once per worker that runs it: one worker runs them all (-n, --dist loadgroup)
pytestmark = pytest.mark.xdist_group("support_matrix")


@pytest.fixture(scope="module")
def cells() -> list[support.Cell]:
    return support.matrix()


def test_the_page_is_the_matrix_the_code_generates(cells: list[support.Cell]) -> None:
    assert PAGE.read_text(encoding="utf-8") == support.markdown(cells), (
        "docs/support.md is stale: run python tools/support_matrix.py docs/support.md"
    )


def test_every_registered_scheme_works_in_every_subsystem(cells: list[support.Cell]) -> None:
    broken = [(c.row, c.column, c.note) for c in cells if c.row in strategies.names() and not c.works]
    assert broken == []


def test_the_combinations_people_use_run_exactly(cells: list[support.Cell]) -> None:
    exact = {c.row: c for c in cells if c.column == "exact run"}
    for text in ("dp=2,tp=2", "dp=2,zero=1,tp=2,pp=2,microbatches=2", "cp=2,pp=2,microbatches=2"):
        assert exact[text].works, exact[text].note
    assert exact["dp=2,tp=2,pp=2,schedule=interleaved,virtual_stages=2,microbatches=2"].works


@pytest.mark.parametrize("name", strategies.names())
def test_a_scheme_claimed_exact_holds_to_its_own_one_block_reference(name: str, cells: list[support.Cell]) -> None:
    (cell,) = [c for c in cells if c.row == name and c.column == "exact run"]
    if not cell.works:
        pytest.skip(cell.note)
    mesh = support.scheme_mesh(name)
    layers = strategies.min_layers(name, mesh)
    model = strategies.mlp_for(name, mesh, 8, 16, layers)
    params = strategies.init_of(name, model, seed=3, dtype="float64")
    rng = np.random.default_rng(1)
    x, dout = rng.standard_normal((16, 8)), rng.standard_normal((16, 8))
    got = strategies.run_strategy(name, mesh, params, x, dout, "relu")
    out, grads = strategies.get(name).reference(params, x, dout, "relu")
    assert got.out is not None and got.grads is not None
    assert np.allclose(got.out, out, rtol=1e-12, atol=1e-14)
    for k in grads:
        assert np.allclose(got.grads[k], grads[k], rtol=1e-12, atol=1e-14), k


@pytest.mark.parametrize("text", support.PLANS)
def test_a_plan_claimed_exact_holds_to_the_transformer_reference(text: str, cells: list[support.Cell]) -> None:
    (cell,) = [c for c in cells if c.row == text and c.column == "exact run"]
    if not cell.works:
        assert cell.note  # a refusal says why
        return
    plan = Plan.parse(text)
    experts = 4 if plan.ep > 1 else 0  # expert parallelism splits a mixture of experts
    cfg = TransformerConfig(
        layers=plan.pp * plan.virtual_stages * 2, d_model=8, heads=2, d_ff=16, vocab=8, seq=8, experts=experts
    )
    check_against_reference(cfg, plan, "float64", 2 * plan.dp * plan.ep * plan.microbatches, None)
    check_against_reference(
        cfg.scaled(position="rope", mlp="gelu" if experts else "swiglu", norm="rmsnorm"),
        plan,
        "float64",
        4 * plan.dp * plan.ep,
        None,
    )


def test_every_shape_only_cell_that_works_ran_at_real_width(cells: list[support.Cell]) -> None:
    for c in cells:
        if c.column == "shape-only trace" and c.works:
            assert "same trace as the exact run" in c.note and float(c.note.split(": ")[-1].split()[0]) > 0.1, c


def test_a_scheme_with_wrong_gradients_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    ddp = strategies.get("ddp")

    def backward(ctx, saved, dout, params):  # type: ignore[no-untyped-def]
        dx, grads = ddp.backward(ctx, saved, dout, params)
        return dx, {**grads, "w_in": grads["w_in"] * 2.0}

    monkeypatch.setitem(strategies.registry._REGISTRY, "ddp", dataclasses.replace(ddp, backward=backward))
    row = {c.column: c for c in support.scheme_row("ddp")}
    assert not row["exact run"].works and "differs from the single-device reference" in row["exact run"].note
    assert not row["Trainer step"].works


def test_a_shape_only_program_that_differs_is_caught() -> None:
    p = strategies.init_of("ddp", strategies.mlp_for("ddp", Mesh(X=2), 4, 8))
    x = np.ones((4, 4), np.float32)
    a = strategies.run_strategy("ddp", Mesh(X=2), p, x, x)
    b = strategies.run_strategy("fsdp", Mesh(X=2), p, x, x)
    assert support.same_program(a.trace, a.trace) and not support.same_program(a.trace, b.trace)


def test_a_refusal_is_the_error_a_user_gets() -> None:
    (cell,) = [c for c in support.plan_row("ep=2") if c.column == "exact run"]
    assert cell.works or cell.note.split(":")[0].endswith("Error")
