"""Files that hold one idea: no source file over 600 lines, no function over 100.

A function may run longer only when its docstring says why its length is earned (the words
"length is earned" and the reason), so a long function is a decision someone wrote down.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shardsim

SRC = Path(shardsim.__file__).parent
FILES = sorted(SRC.rglob("*.py"))
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 100


def long_functions(code: str) -> list[tuple[str, int]]:
    """The functions of ``code`` longer than the limit whose docstring does not earn it."""
    out = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES and "length is earned" not in (ast.get_docstring(node) or ""):
                out.append((node.name, lines))
    return out


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_each_source_file_and_function_is_short(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_FILE_LINES, f"split {path.name}: one idea a file"
    assert long_functions(text) == []


def test_the_check_sees_a_long_function_and_its_reason() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\n") == [("f", MAX_FUNCTION_LINES + 1)]
    earned = f'def f():\n    """Its length is earned: one table."""\n{body}\n'
    assert long_functions(earned) == []
    assert long_functions("def g():\n    return 1\n") == []
