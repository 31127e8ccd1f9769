"""The package reads bottom-up: rooms in order, and the core in layers inside its room.

A module's room is read from its path: a file at the top of the package is the core (the
command-line front ends aside), a folder is one job and one room. A module imports only
modules of its own room or of a lower one, no modules import each other round in a circle,
and none reaches for another module's ``_private`` name.

Every import is read with ``ast``: at module level, inside functions (still a dependency, just
a later one) and under ``if TYPE_CHECKING:`` (a type checker follows it, and a circle there is
a circle in the design). Inside the core the layer order is for runtime imports only.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

import shardsim

SRC = Path(shardsim.__file__).parent
PACKAGE = SRC.name

# Lowest first: a room imports only from its own room and the rooms before it.
ROOMS = (
    "core",  # arrays, meshes, layouts, collectives, ops, traces, the ledger, plans, pictures
    "checkpoint",  # saves and loads sharded arrays: core only
    "models",  # configs, presets and every single-device reference
    "strategies",  # one module per parallelism or scheme, pipeline and context parallelism
    "transformer",  # the transformer model run under a plan
    "training",  # optimizers, precision, trainers
    "programs",  # an engine's programs of a step (engines/<engine>/program.py, model.py) and their package
    "cost",  # the analytic cost model and estimates
    "planner",  # searches plans with the cost model
    "calibration",  # fits the cost model to measurements by running the planner
    "frameworks",  # the frameworks' launch configurations read as plans and written back
    "cli",  # command-line front ends and the helpers for examples and tests
    "package",  # shardsim/__init__.py: the public face, may name anything
)
# The room of each folder; the engines' kernels sit under the core's seam, their programs above
# the schemes they run.
FOLDERS = {room: room for room in ROOMS if room not in ("core", "package")} | {"engines": "core"}
# Files at the top that are front ends, not core. Any ``cli.py`` is a front end wherever it sits.
FRONT_ENDS = {"__main__", "cli", "_cli_args", "_cli_output", "_options", "support", "testing"}

# The core, lowest first. A module may import modules of its own layer only when listed in the
# same tuple in dependency order (left may not import right).
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    (
        "xp",
        "_blocks",
        "_divisors",
        "dtypes",
        "formulas",
        "activations",
        "_format",
        "host",
        "_files",
        "_output_file",
        "trace_events",
    ),
    ("layout",),
    ("journal",),  # the ledger's changes in order, and peaks replayed from two: NumPy only
    ("memory",),  # the ledger counts bytes per chip: it knows nothing of meshes' users or arrays
    ("mesh",),
    ("specs", "holders"),
    ("engines",),  # every module of engines/
    ("tracing",),  # events name values by uid and label: it knows nothing of arrays
    ("array",),
    ("ops",),
    ("operators", "collectives"),
    ("resharding",),
    ("pieces", "plans"),
    ("pictures",),  # text and HTML, on top of everything; it installs the display methods below it
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}

# Imports that break a rule today, each with the fix it waits for. The tests fail when one of
# them no longer happens, so the lists only shrink.
UPWARD_EXCEPTIONS: set[tuple[str, str]] = set()
CIRCLE_EXCEPTIONS: set[frozenset[str]] = set()
PRIVATE_EXCEPTIONS: set[tuple[str, str, str]] = set()
# Core modules whose runtime imports reach above their layer: (module, layer imported).
LAYER_EXCEPTIONS: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    """One import statement's dependency of ``source`` on ``target`` (dotted module names)."""

    source: str
    target: str
    name: str | None  # the name imported from ``target`` (``from x import name``), else None
    func: str | None  # the enclosing function, None at module level
    type_checking: bool
    line: int


def module_name(path: Path) -> str:
    """``shardsim.cost.timeline`` for ``.../shardsim/cost/timeline.py`` (a package: its folder)."""
    parts = [PACKAGE, *path.relative_to(SRC).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def room_of(name: str) -> str:
    """The room of module ``name``, read from where its file sits."""
    path = modules()[name].relative_to(SRC)
    if path.parts == ("__init__.py",):
        return "package"
    if len(path.parts) == 1:
        return "cli" if path.stem in FRONT_ENDS else "core"
    if path.stem == "cli":
        return "cli"
    if path.parts[0] == "engines" and len(path.parts) == 3 and path.stem in ("program", "model", "__init__"):
        return "programs"
    return FOLDERS[path.parts[0]]


def core_layer(name: str) -> str:
    """The entry of ``LAYERS`` of core module ``name``: its file's name, or its top folder's."""
    return name.split(".")[1]


def is_type_checking(node: ast.If) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(source: str, code: str, is_package: bool, known: dict[str, Path] | None = None) -> list[Import]:
    """Every import of the package's modules in ``code``, the source of module ``source``."""
    known = modules() if known is None else known
    package = source.split(".") if is_package else source.split(".")[:-1]
    found: list[Import] = []

    def add(target: str, name: str | None, func: str | None, checking: bool, line: int) -> None:
        full = f"{target}.{name}" if name else target
        if full in known:  # from . import x: the module x
            found.append(Import(source, full, None, func, checking, line))
        elif target in known:
            found.append(Import(source, target, name, func, checking, line))

    def visit(node: ast.AST, func: str | None, checking: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = node.name
        if isinstance(node, ast.If) and is_type_checking(node):
            for child in node.body:
                visit(child, func, True)
            for child in node.orelse:
                visit(child, func, checking)
            return
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                add(target, alias.name, func, checking, node.lineno)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, None, func, checking, node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, func, checking)

    visit(ast.parse(code), None, False)
    return found


@cache
def all_imports() -> list[Import]:
    """The imports of every module of the package."""
    return [
        imp
        for name, path in modules().items()
        for imp in imports_of(name, path.read_text(encoding="utf-8"), path.name == "__init__.py")
    ]


def upward(imports: list[Import]) -> set[tuple[str, str]]:
    """(importing module, imported module) for each import of a higher room."""
    return {
        (imp.source, imp.target)
        for imp in imports
        if ROOMS.index(room_of(imp.target)) > ROOMS.index(room_of(imp.source))
        and not (imp.target == PACKAGE and (imp.name or "").startswith("__"))  # __version__ is no dependency
    }


def circles(imports: list[Import]) -> set[frozenset[str]]:
    """The sets of modules that import each other round (strongly connected, more than one)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.source, set()).add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = {stack.pop()}
            while v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.add(frozenset(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(modules()) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def private_names(imports: list[Import]) -> set[tuple[str, str, str]]:
    """(importing module, module, name) for each ``_private`` name taken from another module."""
    return {
        (imp.source, imp.target, imp.name)
        for imp in imports
        if imp.name and imp.name.startswith("_") and not imp.name.startswith("__") and imp.target != imp.source
    }


def test_every_module_has_a_room() -> None:
    unplaced = []
    for name, path in modules().items():
        try:
            room = room_of(name)
        except KeyError:
            unplaced.append(f"{path.relative_to(SRC)}: folder {path.relative_to(SRC).parts[0]}/ has no room")
            continue
        if room == "core" and core_layer(name) not in RANK:
            unplaced.append(f"{path.relative_to(SRC)}: a core module in no layer")
    assert unplaced == []


def test_every_core_layer_exists() -> None:
    core = {core_layer(name) for name in core_modules() if name != PACKAGE}
    assert set(RANK) - core == set()


def test_no_module_imports_a_higher_room() -> None:
    found = upward([imp for imp in all_imports() if placed(imp.source) and placed(imp.target)])
    assert sorted(found - UPWARD_EXCEPTIONS) == []
    assert sorted(UPWARD_EXCEPTIONS - found) == [], "fixed: take these out of UPWARD_EXCEPTIONS"


def test_no_modules_import_each_other_round() -> None:
    found = circles(all_imports())
    assert sorted(map(sorted, found - CIRCLE_EXCEPTIONS)) == []
    assert sorted(map(sorted, CIRCLE_EXCEPTIONS - found)) == [], "fixed: take these out of CIRCLE_EXCEPTIONS"


def test_no_module_imports_another_modules_private_name() -> None:
    found = private_names(all_imports())
    assert sorted(found - PRIVATE_EXCEPTIONS) == []
    assert sorted(PRIVATE_EXCEPTIONS - found) == [], "fixed: take these out of PRIVATE_EXCEPTIONS"


def core_upward(name: str, imports: list[Import]) -> list[str]:
    """The runtime imports by core module ``name`` of a core module not below it."""
    bad = []
    for imp in imports:
        if imp.type_checking or room_of(imp.target) != "core" or imp.target == PACKAGE:
            continue
        target, mine = core_layer(imp.target), core_layer(name)
        if target == mine or (name, target) in LAYER_EXCEPTIONS:
            continue
        same = LAYERS[RANK[mine]]
        below = RANK[target] < RANK[mine] or (RANK[target] == RANK[mine] and same.index(target) < same.index(mine))
        if not below:
            bad.append(f"{name.removeprefix(PACKAGE + '.')}:{imp.line} ({imp.func or 'module level'}) imports {target}")
    return bad


def placed(name: str) -> bool:
    """Whether module ``name`` sits in a room (test_every_module_has_a_room names those that do not)."""
    try:
        room_of(name)
    except KeyError:
        return False
    return True


def core_modules() -> list[str]:
    """The core's modules."""
    return sorted(name for name in modules() if placed(name) and room_of(name) == "core")


@pytest.mark.parametrize("name", core_modules())
def test_core_module_imports_only_lower_layers(name: str) -> None:
    if core_layer(name) not in RANK:
        pytest.skip("in no layer (test_every_module_has_a_room says so)")
    assert core_upward(name, [imp for imp in all_imports() if imp.source == name]) == []


def test_every_layer_exception_still_happens() -> None:
    found = {
        (imp.source, core_layer(imp.target))
        for imp in all_imports()
        if not imp.type_checking and placed(imp.target) and room_of(imp.target) == "core"
    }
    assert sorted(LAYER_EXCEPTIONS - found) == [], "fixed: take these out of LAYER_EXCEPTIONS"


def test_plans_loads_only_the_core() -> None:
    # A plan is a description: building one must not load a scheme, a model or the cost model.
    code = f"import sys, {PACKAGE}.plans; print('\\n'.join(m for m in sys.modules if m.startswith('{PACKAGE}.')))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=SRC.parent.parent
    ).stdout
    loaded = out.split()
    assert f"{PACKAGE}.plans" in loaded
    assert sorted(m for m in loaded if m in modules() and not (placed(m) and room_of(m) == "core")) == []


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("def f():\n    from .ops import add\n", [("ops", "f", False)]),
        ("from . import pictures\n", [("pictures", None, False)]),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .ops import add\n", [("ops", None, True)]),
        ("import shardsim.cost.timeline\n", [("cost.timeline", None, False)]),
        ("from .engines.stacked import STACKED\n", [("engines.stacked", None, False)]),
    ],
)
def test_the_check_sees_every_kind_of_import(code: str, expected: list[tuple[str, str | None, bool]]) -> None:
    known = dict.fromkeys(["shardsim.ops", "shardsim.pictures", "shardsim.cost.timeline", "shardsim.engines.stacked"])
    found = imports_of("shardsim.array", code, False, known)  # type: ignore[arg-type]
    assert [(i.target.removeprefix("shardsim."), i.func, i.type_checking) for i in found] == expected


def test_the_check_resolves_relative_imports_from_a_package() -> None:
    known = dict.fromkeys(["shardsim.errors", "shardsim.cost.timeline", "shardsim.cost"])
    found = imports_of("shardsim.cost", "from ..errors import X\nfrom .timeline import _y\n", True, known)  # type: ignore[arg-type]
    assert [(i.target, i.name) for i in found] == [("shardsim.errors", "X"), ("shardsim.cost.timeline", "_y")]
    assert private_names(found) == {("shardsim.cost", "shardsim.cost.timeline", "_y")}


def test_the_check_finds_a_circle() -> None:
    a_b = [
        Import("a", "b", None, None, True, 1),
        Import("b", "a", None, "f", False, 1),
        Import("b", "c", None, None, False, 1),
    ]
    assert circles(a_b) == {frozenset({"a", "b"})}


def test_moved_modules_keep_their_old_names() -> None:
    # Each old name, a submodule under it and the package attribute give the module itself.
    code = (
        "import importlib, pkgutil, shardsim\n"
        "for old, new in shardsim._MOVED.items():\n"
        "    assert importlib.import_module(old) is importlib.import_module(new), old\n"
        "    parent, _, leaf = old.rpartition('.')\n"
        "    assert getattr(importlib.import_module(parent), leaf) is importlib.import_module(new), old\n"
        "    for sub in pkgutil.iter_modules(getattr(importlib.import_module(new), '__path__', [])):\n"
        "        moved = importlib.import_module(f'{old}.{sub.name}')\n"
        "        assert moved is importlib.import_module(f'{new}.{sub.name}'), sub.name\n"
        "print(len(shardsim._MOVED))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=SRC.parent.parent)
    assert out.returncode == 0, out.stderr
