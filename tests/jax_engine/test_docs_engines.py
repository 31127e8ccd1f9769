"""The code on ``docs/engines.md`` runs, one block after the other, as a reader would run it."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")

from doc_blocks import python_blocks, run_blocks


def test_engines_page_runs() -> None:
    assert len(python_blocks("engines.md")) == 5
    ns = run_blocks("engines.md")
    assert ns["t"].step_count == 1 and ns["out"].shape == (8, 8)
    assert ns["loss"].shape == () and ns["n"] == 3
