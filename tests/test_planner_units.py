"""The planner writes bytes in GB (10**9 bytes), as ``shardsim estimate`` and the docs do.

Each memory cell of the table is its row's bytes over 10**9 to four significant digits; the
H100's 80 GB of HBM3 (NVIDIA's data sheet) reads "80 GB" in the answer that nothing fits.
"""

from __future__ import annotations

import re

import pytest

from shardsim.errors import PlannerError
from shardsim.models import get
from shardsim.planner import plan

CELL = re.compile(r"^(\d+(?:\.\d+)?) GB$")
COLUMNS = ("params", "grads", "optimizer", "activations", "total")


def test_the_table_speaks_gb():
    table = plan(get("llama-tiny"), "h100", 2, batch_tokens=4 * 16, seq=16)
    lines = str(table).splitlines()
    assert lines[1].startswith("defaults: ")
    head = re.split(r"\s{2,}", lines[2].strip())
    assert all(c in head for c in (*COLUMNS, "headroom"))
    for line, row in zip(lines[3 : 3 + table.kept], table.rows):
        cells = dict(zip(head, re.split(r"\s{2,}", line.strip())))
        for c in COLUMNS:
            value = CELL.match(cells[c])
            assert value, cells[c]
            assert float(value[1]) == pytest.approx(row.memory[c] / 1e9, rel=5e-4)
        assert float(CELL.match(cells["headroom"])[1]) == pytest.approx(row.headroom / 1e9, rel=5e-4)
    assert not re.search(r"[KMGT]iB", str(table) + table.to_json())
    assert re.search(r"memory [\d.]+ GB vs [\d.]+ GB per chip", table.why_best())


def test_the_answer_that_nothing_fits_speaks_gb():
    with pytest.raises(PlannerError) as err:
        plan("llama3-405b", "h100", 8, batch_tokens=16 * 8192, seq=8192, allow=("dp", "zero", "tp"))
    assert "per chip of the chip's 80 GB" in str(err.value) and "iB" not in str(err.value)
