"""The command line is one package on top of the library: its entry points, its order, its imports.

``shardsim`` (the console script in ``pyproject.toml``) and ``python -m shardsim`` both reach
``shardsim.cli.main``; the commands are registered in the order ``shardsim --help`` lists
them; nothing below the command line imports it (every import read with ``ast``, inside
functions too), no module of it imports another's ``_private`` name, and each of its files
and functions stays short enough to read.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import shardsim
from shardsim import cli

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(shardsim.__file__).parent
CLI = SRC / "cli"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, line) of every ``from ... import name`` and ``import module`` in ``path``,
    relative imports resolved."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found += [(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names]
    return found


def test_the_console_script_is_the_command_line() -> None:
    scripts = (ROOT / "pyproject.toml").read_text(encoding="utf-8").split("[project.scripts]")[1]
    script = re.search(r'^shardsim = "([^"]+)"', scripts, re.MULTILINE).group(1)
    module, _, name = script.partition(":")
    assert getattr(importlib.import_module(module), name) is cli.main


def test_python_dash_m_shardsim_runs_the_command_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "shardsim", "demo", "--scheme", "ddp", "--quiet"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(SRC.parent), "PATH": ""},
        timeout=120,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ddp on Mesh(X=2): PASS\n", "")


def test_the_commands_are_listed_in_their_order() -> None:
    assert cli.commands() == ["demo", "schemes", "train", "estimate", "sweep", "critical", "plan"]


def test_nothing_below_the_command_line_imports_it() -> None:
    # shardsim.testing is a front end too (it runs the demo for a test suite), in the command line's room
    front_ends = {SRC / "__main__.py", SRC / "testing.py"}
    below = [p for p in SRC.rglob("*.py") if CLI not in p.parents and p not in front_ends]
    assert len(below) > 50
    upward = [
        f"{p.relative_to(SRC)}:{line} imports {module}.{name}"
        for p in below
        for module, name, line in imported(p)
        if module == "shardsim.cli" or module.startswith("shardsim.cli.") or (module, name) == ("shardsim", "cli")
    ]
    assert upward == []


def test_no_module_of_the_command_line_imports_a_private_name() -> None:
    private = [
        f"{p.name}:{line} imports {module}.{name}"
        for p in CLI.glob("*.py")
        for module, name, line in imported(p)
        if name.startswith("_") and not name.startswith("__")
    ]
    assert private == []


@pytest.mark.parametrize("path", sorted(CLI.glob("*.py")), ids=lambda p: p.name)
def test_each_file_and_function_is_short(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 600
    long = [
        (f.name, f.end_lineno - f.lineno + 1)
        for f in ast.walk(ast.parse(text))
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.end_lineno - f.lineno + 1 > 100
    ]
    assert long == []
