"""Every ``shardsim`` command shown in the docs and the README runs as shown.

A line starting ``shardsim `` or ``$ shardsim `` inside a fenced block is a command; when the
block's next line is ``shardsim NAME: error: ...`` it is an error example and must exit 2 with
that message, else it must exit 0. Lines of output (``shardsim demo: error: ...``) are not
commands. The "adding a subcommand" example of ``docs/cli.md`` runs and does not clash.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from shardsim import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
OUTPUT = re.compile(r"^shardsim( \S+)?: error:")


def shown_commands() -> list[tuple[str, str, str | None]]:
    found = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        fenced = False
        for i, line in enumerate(lines):
            if line.startswith("```"):
                fenced = not fenced
                continue
            text = line.removeprefix("$ ")
            if fenced and text.startswith("shardsim ") and not OUTPUT.match(text):
                after = lines[i + 1] if i + 1 < len(lines) else ""
                found.append((page.name, text, after if OUTPUT.match(after) else None))
    return found


def test_the_docs_show_commands() -> None:
    assert len(shown_commands()) >= 10


@pytest.mark.parametrize(("page", "line", "error"), shown_commands(), ids=lambda v: str(v)[:60])
def test_a_command_in_the_docs_runs(capsys, page, line, error) -> None:
    argv = shlex.split(line, comments=True)[1:]
    code = cli.main(argv)
    _, err = capsys.readouterr()
    if error is None:
        assert code == 0, (page, line, err)
    else:
        assert code == 2 and err.startswith(error.rstrip()), (page, line, err)


def test_the_adding_a_subcommand_example_runs_and_clashes_with_no_command(capsys) -> None:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    code = text.split("## Adding a subcommand", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    name = re.search(r'@subcommand\("(\w+)"', code).group(1)
    assert name not in cli.commands()
    try:
        exec(compile(code, "docs/cli.md", "exec"), {})
        assert cli.main([name, "--mesh", "X=2,Y=2"]) == 0
        assert capsys.readouterr().out == "(X0,Y0) (X0,Y1) (X1,Y0) (X1,Y1)\n"
    finally:
        cli.COMMANDS.pop(name, None)


def test_every_subcommand_is_documented() -> None:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for name in cli.commands():
        assert f"`shardsim {name}`" in text, name
