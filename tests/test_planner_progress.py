"""The search's counter from the Python API: ``progress=True`` writes it to stderr, ``False``
writes nothing, and the default writes it only to a terminal (pytest's captured stderr is not)
once the search has run a second; the calibration table's line alike."""

from __future__ import annotations

import io
import re

import pytest

from shardsim.models import get
from shardsim.planner import plan
from shardsim.planner import progress as progress_module
from shardsim.planner.progress import Progress

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


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_automatic_line_waits_a_second_on_a_terminal(monkeypatch):
    quick = _Terminal()
    bar = Progress(5, stream=quick)  # enabled=None: automatic
    bar.update(considered=1, traced=1, kept=0, force=True)
    bar.close()
    assert quick.getvalue() == ""  # under a second: nothing, not even the closing newline
    monkeypatch.setattr(progress_module, "DELAY", 0.0)
    slow = _Terminal()
    bar = Progress(5, stream=slow)
    bar.update(considered=5, traced=2, kept=1, force=True)
    bar.close()
    assert slow.getvalue().startswith("\rplanning: 5/5 candidates, 2 layer programs traced, 1 plans kept, ")
    assert slow.getvalue().endswith(" s\n")
    piped = io.StringIO()  # not a terminal: never, however long
    bar = Progress(5, stream=piped)
    bar.update(considered=5, traced=2, kept=1, force=True)
    assert piped.getvalue() == ""


def test_the_calibration_table_shows_its_progress_too(capsys):
    from shardsim import calibration

    [p] = calibration.predictions(calibration.RUNS[:1], progress=True)
    err = capsys.readouterr().err
    assert err.split("\r")[-1].startswith("calibration: 1/1 runs, ") and err.endswith("\n")
    assert p.run is calibration.RUNS[0]
    calibration.predictions(calibration.RUNS[:1])  # automatic: captured stderr is no terminal
    assert capsys.readouterr().err == ""
