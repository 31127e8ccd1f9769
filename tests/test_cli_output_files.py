"""Every file the command line writes (``--chrome-trace``, ``--png``) and ``export_chrome_trace``:
a path that is not a regular file in an existing folder is refused up front, by name, before any
work or output; a written file replaces the path in one rename, never writing through a link.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardsim import Mesh, _output_file
from shardsim.cli import main
from shardsim.cost import estimate, get_hardware
from shardsim.trace_events import export_chrome_trace

#: Every command-line option that writes a file, on a cheap invocation of its command.
FILE_OPTIONS = [
    (["demo", "--scheme", "ddp"], "--chrome-trace"),
    (["train", "--scheme", "ddp", "--steps", "1"], "--chrome-trace"),
    (["estimate"], "--chrome-trace"),
    (["estimate"], "--png"),
    (["estimate", "--model", "gpt-tiny", "--plan", "tp=2", "--batch-tokens", "64", "--seq", "16"], "--png"),
    (["sweep", "--chips", "8", "--hardware", "h100", "--batches", "1024,4096"], "--png"),
]


class _Hang(BaseException):  # not an Exception: main() must not turn it into an error line
    pass


@pytest.fixture
def no_hang() -> Iterator[None]:
    """Fail, rather than block the suite, if a write waits on a FIFO's reader."""

    def alarm(signum: int, frame: object) -> None:
        raise _Hang

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(60)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _link_to_file(d: Path) -> Path:
    (d / "victim.txt").write_text("keep me")
    (d / "out").symlink_to(d / "victim.txt")
    return d / "out"


def _dangling_link(d: Path) -> Path:
    (d / "out").symlink_to(d / "created-through-the-link")
    return d / "out"


def _fifo(d: Path) -> Path:
    os.mkfifo(d / "out")
    return d / "out"


def _folder(d: Path) -> Path:
    (d / "out").mkdir()
    return d / "out"


#: Each kind of unwritable path, how to make it in a folder, and the words that refuse it.
HOSTILE: dict[str, tuple[Callable[[Path], Path | str], str]] = {
    "link to a file": (_link_to_file, "is a symbolic link; give the path of a regular file"),
    "dangling link": (_dangling_link, "is a symbolic link"),
    "fifo": (_fifo, "is a named pipe (FIFO); give the path of a regular file"),
    "folder": (_folder, "is a folder; give a file name"),
    "missing folder": (lambda d: d / "no-such-folder" / "out", "the folder '"),
    "empty": (lambda d: "", "is empty; give a file name"),
    "device": (lambda d: "/dev/null", "is a character device"),
}


@pytest.mark.parametrize(("command", "flag"), FILE_OPTIONS, ids=lambda v: v if isinstance(v, str) else v[0])
@pytest.mark.parametrize("kind", list(HOSTILE))
def test_an_unwritable_output_path_is_refused_before_any_output(command, flag, kind, tmp_path, capsys, no_hang) -> None:
    make, words = HOSTILE[kind]
    path = str(make(tmp_path))
    before = sorted(p.name for p in tmp_path.iterdir())
    code = main([*command, flag, path])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out[-200:], err)
    assert len(err.splitlines()) == 1 and err.startswith(f"shardsim {command[0]}: error: {flag} {path!r} "), err
    assert words in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created, through a link or beside it
    if kind == "link to a file":
        assert (tmp_path / "victim.txt").read_text() == "keep me"


def test_a_written_file_replaces_the_path_in_one_rename(tmp_path, capsys) -> None:
    out = tmp_path / "trace.json"
    out.write_text("old")
    os.link(out, tmp_path / "other-name")  # the old file's second name keeps the old bytes
    assert main(["estimate", "--chrome-trace", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert json.loads(out.read_text())["traceEvents"]
    assert (tmp_path / "other-name").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-name", "trace.json"]  # no temporary left


def test_a_link_planted_after_the_check_is_replaced_not_written_through(tmp_path, monkeypatch) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "out.json").symlink_to(victim)
    monkeypatch.setattr(_output_file, "output_problem", lambda path, suffix=".json": None)  # the check has passed
    _output_file.write_output(tmp_path / "out.json", b"{}")
    assert victim.read_text() == "keep me"
    assert not (tmp_path / "out.json").is_symlink() and (tmp_path / "out.json").read_bytes() == b"{}"


def test_export_chrome_trace_refuses_a_link_and_a_fifo(tmp_path, no_hang) -> None:
    timeline = estimate("fsdp", Mesh(X=16), get_hardware("v5p"), 16 * 4096, 8192, 32768).timeline
    for make in (_link_to_file, _fifo):
        folder = tmp_path / make.__name__
        folder.mkdir()
        path = make(folder)
        with pytest.raises(OSError, match="give the path of a regular file"):
            export_chrome_trace({"fsdp": timeline}, path)
    assert (tmp_path / "_link_to_file" / "victim.txt").read_text() == "keep me"


def test_png_is_written_as_a_png(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "t.png"
    assert main(["estimate", "--png", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_without_matplotlib_is_refused_before_any_output(tmp_path, capsys, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main(["estimate", "--png", str(tmp_path / "t.png")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--png" in err and "needs matplotlib" in err and not (tmp_path / "t.png").exists()
