"""The search's counter from the Python API: ``progress=True`` writes it to stderr, ``False``
writes nothing, and the default writes it only to a terminal (pytest's captured stderr is not)."""

from __future__ import annotations

import re

import pytest

from shardsim.models import get
from shardsim.planner import plan

TINY = get("llama-tiny")


def _search(progress: bool | None) -> None:
    plan(TINY, "h100", 2, batch_tokens=4 * 16, seq=16, zero=0, progress=progress)


def test_progress_true_writes_the_counter_to_stderr(capsys):
    _search(True)
    captured = capsys.readouterr()
    last = captured.err.rstrip("\n").split("\r")[-1]
    table = plan(TINY, "h100", 2, batch_tokens=4 * 16, seq=16, zero=0)
    assert re.fullmatch(rf"planning: {table.considered}/{table.considered} candidates, \d+ layer programs traced, "
                        rf"{table.kept} plans kept, [\d.]+ s", last), last  # fmt: skip
    assert captured.err.endswith("\n") and captured.out == ""


@pytest.mark.parametrize("progress", [False, None])
def test_progress_false_or_off_a_terminal_writes_nothing(capsys, progress):
    _search(progress)
    assert capsys.readouterr().err == ""
