"""The README's numbers come from the code: its ZeRO table is re-measured here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import shardsim as ss
from shardsim.training import Adam, Trainer

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_zero_table() -> dict[str, list[float]]:
    """``{scheme: [params, grads, optimizer, per chip]}`` in GB, from the README's table."""
    rows = {}
    for line in README.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| \d \(`(\w+)`\) \|(.*)\|", line)
        if m:
            cells = [c.strip() for c in m.group(2).split("|")]
            rows[m.group(1)] = [float(c.split()[0]) for c in cells[:4]]
    return rows


@pytest.mark.parametrize("scheme", ["ddp", "zero1", "zero2", "zero3"])
def test_readme_zero_table_is_what_the_ledger_measures(scheme: str) -> None:
    """14 blocks of D=8192, F=32768 on 64 chips, mixed-precision Adam, shape-only."""
    layers, d, f = 14, 8192, 32768
    params = {"w_in": ss.ShapeDtype((layers, d, f)), "w_out": ss.ShapeDtype((layers, f, d))}
    x = ss.ShapeDtype((64, d))
    state = Trainer(scheme, ss.Mesh(X=64), params, Adam(lr=1e-3), precision="bf16").step(x, x).model_state
    measured = [float(state[c].flat[0]) / 1e9 for c in ("params", "grads", "optimizer")]
    measured.append(sum(measured))
    assert readme_zero_table()[scheme] == pytest.approx(measured, abs=0.005)


def test_readme_tour_runs(capsys) -> None:
    """The 15-line tour is real code: it runs and its closing assertion holds."""
    text = README.read_text(encoding="utf-8")
    tour = text.split("## A 15-line tour", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert len(tour.strip().splitlines()) <= 16
    exec(compile(tour, "README tour", "exec"), {})
    out = capsys.readouterr().out
    assert "reduce_scatter" in out and "(X1,Y1)" in out


def test_readme_links_every_docs_page() -> None:
    """Each page of ``docs/`` is a row of the README's documentation table."""
    text = README.read_text(encoding="utf-8")
    table = text.split("## Documentation", 1)[1].split("\n\n", 2)[1]
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)\)", table))
    pages = {f"docs/{p.name}" for p in (README.parent / "docs").glob("*.md")}
    assert pages - linked == set()
