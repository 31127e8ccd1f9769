"""The core reads bottom-up: each module imports only modules of lower layers.

Every import is read with ``ast``, at module level and inside functions alike (an import
inside a function is still a dependency, just a later one). Imports under
``if TYPE_CHECKING:`` are for type checkers only and never run, so they are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shardsim

SRC = Path(shardsim.__file__).parent

# Lowest first. A module may import modules of its own layer only when listed in the same
# tuple in dependency order (left may not import right).
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("_blocks", "_divisors", "dtypes", "formulas", "activations", "trace_events"),
    ("layout",),
    ("memory",),  # the ledger counts bytes per chip: it knows nothing of meshes' users or arrays
    ("mesh",),
    ("specs", "holders"),
    ("engines",),
    ("tracing",),  # events name values by uid and label: it knows nothing of arrays
    ("array",),
    ("ops",),
    ("operators", "collectives"),
    ("resharding",),
    ("pictures",),  # text and HTML, on top of everything
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}

# The one exception: the rich-display methods still import pictures from inside the method.
# Listed by (module, method), so no other upward import can hide among them.
DISPLAY_METHODS = {
    ("array", "_repr_html_"),
    ("mesh", "_repr_html_"),
    ("memory", "__str__"),
    ("memory", "_repr_html_"),
    ("tracing", "__str__"),
    ("tracing", "_repr_html_"),
}


def module_file(name: str) -> Path:
    """The source of core module ``name`` (a package's ``__init__``)."""
    path = SRC / f"{name}.py"
    return path if path.exists() else SRC / name / "__init__.py"


def is_type_checking(node: ast.If) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def core_imports(tree: ast.AST) -> list[tuple[str, str | None, int]]:
    """(core module imported, enclosing function or None, line) for every runtime import."""
    found: list[tuple[str, str | None, int]] = []

    def visit(node: ast.AST, func: str | None) -> None:
        if isinstance(node, ast.If) and is_type_checking(node):
            for child in node.orelse:
                visit(child, func)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = node.name
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:  # from .x import y / from .x.z import y
                found.append((node.module.split(".")[0], func, node.lineno))
            else:  # from . import x, y
                found.extend((alias.name, func, node.lineno) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child, func)

    visit(tree, None)
    return [(name, func, line) for name, func, line in found if name in RANK]


def upward_imports(name: str, source: str) -> list[str]:
    """Imports in ``source`` (core module ``name``) of a module not below it."""
    bad = []
    for target, func, line in core_imports(ast.parse(source)):
        if target == name or ((name, func) in DISPLAY_METHODS and target == "pictures"):
            continue
        same = LAYERS[RANK[name]]
        below = RANK[target] < RANK[name] or (
            RANK[target] == RANK[name] and same.index(target) < same.index(name)
        )
        if not below:
            bad.append(f"{name}.py:{line} ({func or 'module level'}) imports {target}")
    return bad


@pytest.mark.parametrize("name", sorted(RANK))
def test_core_module_imports_only_lower_layers(name: str) -> None:
    assert upward_imports(name, module_file(name).read_text(encoding="utf-8")) == []


def test_every_core_module_is_placed() -> None:
    # A core module that nothing lists would escape the check above.
    for path in (SRC / "engines").glob("*.py"):
        for target, _, _ in core_imports(ast.parse(path.read_text(encoding="utf-8"))):
            assert RANK[target] < RANK["engines"], f"engines/{path.name} imports {target}"
    assert all(module_file(name).exists() for name in RANK)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n    from .ops import add\n", ["array.py:2 (f) imports ops"]),
        ("from . import pictures\n", ["array.py:1 (module level) imports pictures"]),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .ops import add\n", []),
        ("from .mesh import Mesh\nfrom .engines.stacked import STACKED\n", []),
    ],
)
def test_the_check_sees_function_level_imports(source: str, expected: list[str]) -> None:
    assert upward_imports("array", source) == expected
