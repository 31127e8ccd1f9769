"""Bytes, FLOPs and memory per chip of every scheme equal the closed forms of ``docs/schemes.md``.

Each step's closed form is written twice: by hand below, from the ring formulas
(AllGather/ReduceScatter move (N-1)/N of the array, AllReduce twice that) and the matmul
shapes, and in the tables of ``docs/schemes.md``, which are parsed and evaluated. Both are
held to the trace of real runs (and shape-only runs at larger sizes) on several meshes,
sizes and dtypes, step by step, forward and backward.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import shardsim as ss
from shardsim import mlp
from shardsim.dtypes import resolve_dtype

DOC = Path(__file__).resolve().parents[1] / "docs" / "schemes.md"

Sizes = dict[str, Fraction]  # B, D, F, X, Y, s
Formula = Callable[[Sizes], Fraction]


def ag(n: str, *numel: str) -> Formula:
    """AllGather or ReduceScatter over axis ``n`` of an array of ``numel`` elements per group."""
    return lambda v: (v[n] - 1) / v[n] * _prod(v, numel) * v["s"]


def ar(n: str, *numel: str) -> Formula:
    """AllReduce over axis ``n``: twice an AllGather."""
    return lambda v: 2 * (v[n] - 1) / v[n] * _prod(v, numel) * v["s"]


def mm(*factors: str) -> Formula:
    """FLOPs of a matmul: 2 · m · k · n, each factor a size or a size over an axis (``B/X``)."""
    return lambda v: 2 * _prod(v, factors)


def _prod(v: Sizes, factors: tuple[str, ...]) -> Fraction:
    out = Fraction(1)
    for f in factors:
        num, _, den = f.partition("/")
        out *= v[num] / (v[den] if den else 1)
    return out


# (phase, op, axis, array label of a collective, layout after, bytes sent per chip, FLOPs per chip)
ZERO: Formula = lambda v: Fraction(0)  # noqa: E731
STEPS: dict[str, list[tuple[str, str, str, str | None, str, Formula, Formula]]] = {
    "ddp": [
        ("forward", "matmul", "", None, "[B_X, F]", ZERO, mm("B/X", "D", "F")),
        ("forward", "matmul", "", None, "[B_X, D]", ZERO, mm("B/X", "F", "D")),
        ("backward", "matmul", "", None, "[F, D]{U_X}", ZERO, mm("B/X", "F", "D")),
        ("backward", "all_reduce", "X", "dW_out", "[F, D]", ar("X", "F", "D"), ZERO),
        ("backward", "matmul", "", None, "[B_X, F]", ZERO, mm("B/X", "D", "F")),
        ("backward", "matmul", "", None, "[D, F]{U_X}", ZERO, mm("B/X", "D", "F")),
        ("backward", "all_reduce", "X", "dW_in", "[D, F]", ar("X", "D", "F"), ZERO),
        ("backward", "matmul", "", None, "[B_X, D]", ZERO, mm("B/X", "F", "D")),
    ],
    "fsdp": [
        ("forward", "all_gather", "X", "W_in", "[D, F]", ag("X", "D", "F"), ZERO),
        ("forward", "matmul", "", None, "[B_X, F]", ZERO, mm("B/X", "D", "F")),
        ("forward", "all_gather", "X", "W_out", "[F, D]", ag("X", "F", "D"), ZERO),
        ("forward", "matmul", "", None, "[B_X, D]", ZERO, mm("B/X", "F", "D")),
        ("backward", "all_gather", "X", "W_out", "[F, D]", ag("X", "F", "D"), ZERO),
        ("backward", "matmul", "", None, "[F, D]{U_X}", ZERO, mm("B/X", "F", "D")),
        ("backward", "reduce_scatter", "X", "dW_out", "[F_X, D]", ag("X", "F", "D"), ZERO),
        ("backward", "matmul", "", None, "[B_X, F]", ZERO, mm("B/X", "D", "F")),
        ("backward", "all_gather", "X", "W_in", "[D, F]", ag("X", "D", "F"), ZERO),
        ("backward", "matmul", "", None, "[D, F]{U_X}", ZERO, mm("B/X", "D", "F")),
        ("backward", "reduce_scatter", "X", "dW_in", "[D_X, F]", ag("X", "D", "F"), ZERO),
        ("backward", "matmul", "", None, "[B_X, D]", ZERO, mm("B/X", "F", "D")),
    ],
    "tp": [
        ("forward", "all_gather", "Y", "In", "[B, D]", ag("Y", "B", "D"), ZERO),
        ("forward", "matmul", "", None, "[B, F_Y]", ZERO, mm("B", "D", "F/Y")),
        ("forward", "matmul", "", None, "[B, D]{U_Y}", ZERO, mm("B", "F/Y", "D")),
        ("forward", "reduce_scatter", "Y", "Out", "[B, D_Y]", ag("Y", "B", "D"), ZERO),
        ("backward", "all_gather", "Y", "dOut", "[B, D]", ag("Y", "B", "D"), ZERO),
        ("backward", "matmul", "", None, "[F_Y, D]", ZERO, mm("B", "F/Y", "D")),
        ("backward", "matmul", "", None, "[B, F_Y]", ZERO, mm("B", "D", "F/Y")),
        ("backward", "matmul", "", None, "[D, F_Y]", ZERO, mm("B", "D", "F/Y")),
        ("backward", "matmul", "", None, "[B, D]{U_Y}", ZERO, mm("B", "F/Y", "D")),
        ("backward", "reduce_scatter", "Y", "dIn", "[B, D_Y]", ag("Y", "B", "D"), ZERO),
    ],
    "fsdp_tp": [
        ("forward", "all_gather", "Y", "In", "[B_X, D]", ag("Y", "B/X", "D"), ZERO),
        ("forward", "all_gather", "X", "W_in", "[D, F_Y]", ag("X", "D", "F/Y"), ZERO),
        ("forward", "matmul", "", None, "[B_X, F_Y]", ZERO, mm("B/X", "D", "F/Y")),
        ("forward", "all_gather", "X", "W_out", "[F_Y, D]", ag("X", "F/Y", "D"), ZERO),
        ("forward", "matmul", "", None, "[B_X, D]{U_Y}", ZERO, mm("B/X", "F/Y", "D")),
        ("forward", "reduce_scatter", "Y", "Out", "[B_X, D_Y]", ag("Y", "B/X", "D"), ZERO),
        ("backward", "all_gather", "Y", "dOut", "[B_X, D]", ag("Y", "B/X", "D"), ZERO),
        ("backward", "matmul", "", None, "[F_Y, D]{U_X}", ZERO, mm("B/X", "F/Y", "D")),
        ("backward", "reduce_scatter", "X", "dW_out", "[F_Y, D_X]", ag("X", "F/Y", "D"), ZERO),
        ("backward", "all_gather", "X", "W_out", "[F_Y, D]", ag("X", "F/Y", "D"), ZERO),
        ("backward", "matmul", "", None, "[B_X, F_Y]", ZERO, mm("B/X", "D", "F/Y")),
        ("backward", "all_gather", "Y", "In", "[B_X, D]", ag("Y", "B/X", "D"), ZERO),
        ("backward", "matmul", "", None, "[D, F_Y]{U_X}", ZERO, mm("B/X", "D", "F/Y")),
        ("backward", "reduce_scatter", "X", "dW_in", "[D_X, F_Y]", ag("X", "D", "F/Y"), ZERO),
        ("backward", "all_gather", "X", "W_in", "[D, F_Y]", ag("X", "D", "F/Y"), ZERO),
        ("backward", "matmul", "", None, "[B_X, D]{U_Y}", ZERO, mm("B/X", "F/Y", "D")),
        ("backward", "reduce_scatter", "Y", "dIn", "[B_X, D_Y]", ag("Y", "B/X", "D"), ZERO),
    ],
}

# meshes per scheme (the scheme's roles: data on X, model on Y) and (B, D, F) sizes that divide
MESHES = {
    "ddp": [{"X": 1}, {"X": 2}, {"X": 3}, {"X": 4}],
    "fsdp": [{"X": 1}, {"X": 2}, {"X": 3}, {"X": 4}],
    "tp": [{"Y": 1}, {"Y": 2}, {"Y": 3}, {"Y": 4}],
    "fsdp_tp": [{"X": 2, "Y": 2}, {"X": 1, "Y": 2}, {"X": 2, "Y": 1}, {"X": 2, "Y": 3}, {"X": 4, "Y": 2}],
}
SIZES = [(12, 12, 24), (24, 36, 12)]
CASES = [
    (name, mesh, sizes, dtype)
    for name, meshes in MESHES.items()
    for mesh in meshes
    for sizes, dtype in zip(SIZES, ("float32", "float64"))
]
# shape-only runs: real sizes and bfloat16
BIG = [
    ("ddp", {"X": 8}, (4096, 1024, 4096), "bfloat16"),
    ("fsdp", {"X": 8}, (4096, 1024, 4096), "bfloat16"),
    ("tp", {"Y": 8}, (4096, 1024, 4096), "bfloat16"),
    ("fsdp_tp", {"X": 4, "Y": 8}, (4096, 1024, 4096), "bfloat16"),
    ("fsdp_tp", {"X": 3, "Y": 5}, (30, 15, 45), "float32"),  # fractional bytes, rounded down
]


def values(mesh: dict[str, int], b: int, d: int, f: int, dtype: str) -> Sizes:
    v = {"B": b, "D": d, "F": f, "X": mesh.get("X", 1), "Y": mesh.get("Y", 1), "s": resolve_dtype(dtype).itemsize}
    return {k: Fraction(n) for k, n in v.items()}


def run(name: str, mesh: dict[str, int], sizes: tuple[int, int, int], dtype: str, shape_only: bool = False):
    b, d, f = sizes
    if shape_only:
        params = {"w_in": ss.ShapeDtype((d, f), dtype), "w_out": ss.ShapeDtype((f, d), dtype)}
        x = dout = ss.ShapeDtype((b, d), dtype)
    else:
        rng = np.random.default_rng(0)
        params = mlp.init(d, f, seed=1, dtype=dtype)
        x, dout = (rng.standard_normal((b, d)).astype(dtype) for _ in range(2))
    return ss.run_strategy(name, ss.Mesh(mesh), params, x, dout, activation="relu")


def check_steps(name: str, mesh: dict[str, int], sizes: tuple[int, int, int], dtype: str, shape_only: bool) -> None:
    v = values(mesh, *sizes, dtype)
    events = list(run(name, mesh, sizes, dtype, shape_only).trace)
    want = STEPS[name]
    assert len(events) == len(want), [(e.op, e.axes, e.label) for e in events]
    for i, (e, (phase, op, axis, label, after, sent, flops)) in enumerate(zip(events, want)):
        where = f"{name} on {mesh} {sizes} {dtype}, step {i} ({phase} {op} {axis} {label})"
        assert (e.phase, e.op, "".join(e.axes), e.after) == (phase, op, axis, after), where
        if label is not None:
            assert e.label == label, where
        assert e.sent_bytes == math.floor(sent(v)), where
        assert e.flops == flops(v), where


@pytest.mark.parametrize(("name", "mesh", "sizes", "dtype"), CASES)
def test_every_step_costs_its_closed_form(name, mesh, sizes, dtype) -> None:
    check_steps(name, mesh, sizes, dtype, shape_only=False)


@pytest.mark.parametrize(("name", "mesh", "sizes", "dtype"), BIG)
def test_closed_forms_at_real_sizes_shape_only(name, mesh, sizes, dtype) -> None:
    check_steps(name, mesh, sizes, dtype, shape_only=True)


# -- the tables of docs/schemes.md say the same ------------------------------------------------
OPS = {"AllGather": "all_gather", "ReduceScatter": "reduce_scatter", "AllReduce": "all_reduce", "matmul": "matmul"}


def doc_tables() -> dict[str, list[tuple[str, str, str, str, str, str, str]]]:
    """``{scheme: [(#, op, axis, array, layout after, bytes, flops), ...]}`` from docs/schemes.md."""
    tables: dict[str, list] = {}
    current = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        header = re.match(r"## .*\(`(\w+)`\)\s*$", line)
        if header:
            current = tables.setdefault(header.group(1), [])
        elif line.startswith("## "):
            current = None
        elif current is not None and re.match(r"\|\s*[FB]\d+\s*\|", line):
            cells = [c.strip().strip("`").strip() for c in line.strip().strip("|").split("|")]
            assert len(cells) == 7, line
            current.append(tuple(cells))
    return tables


def evaluate(expr: str, v: Sizes) -> Fraction:
    """A closed form of the docs (``(X-1)/X · D · F/Y · s``) at sizes ``v``; ``–`` is zero."""
    if expr in ("–", "-", ""):
        return Fraction(0)
    text = expr.replace("·", "*").replace("−", "-")
    if not re.fullmatch(r"[BDFXYs0-9()+\-*/ ]+", text):
        raise AssertionError(f"not a closed form in B, D, F, X, Y, s: {expr!r}")
    return eval(text, {"__builtins__": {}}, dict(v))  # only sizes, numbers and + - * / (checked above)


def test_docs_tables_cover_every_scheme_step_by_step() -> None:
    tables = doc_tables()
    assert sorted(tables) == sorted(STEPS)
    for name, rows in tables.items():
        want = STEPS[name]
        assert len(rows) == len(want), name
        for row, (phase, op, axis, label, after, _, _) in zip(rows, want):
            num, step, ax, array, lay, _, _ = row
            assert num[0] == phase[0].upper(), (name, row)
            assert (OPS[step], ax.replace("–", ""), lay) == (op, axis, after), (name, row)
            if label is not None:
                assert array == label, (name, row)
        numbers = [r[0] for r in rows]
        fwd = [n for n in numbers if n.startswith("F")]
        assert numbers == fwd + [f"B{i}" for i in range(1, len(numbers) - len(fwd) + 1)], name
        assert fwd == [f"F{i}" for i in range(1, len(fwd) + 1)], name


@pytest.mark.parametrize(("name", "mesh", "sizes", "dtype"), CASES[::3] + BIG)
def test_docs_closed_forms_equal_the_trace(name, mesh, sizes, dtype) -> None:
    v = values(mesh, *sizes, dtype)
    rows = doc_tables()[name]
    events = list(run(name, mesh, sizes, dtype, shape_only=dtype == "bfloat16").trace)
    for row, e, (*_, sent, flops) in zip(rows, events, STEPS[name]):
        assert evaluate(row[5], v) == sent(v), (name, row)  # the docs' bytes = the hand-derived form
        assert evaluate(row[6], v) == flops(v), (name, row)
        assert e.sent_bytes == math.floor(evaluate(row[5], v)), (name, mesh, row)
        assert e.flops == evaluate(row[6], v), (name, mesh, row)


# -- totals against the scaling book's per-layer table (bfloat16, (N-1)/N -> 1) ---------------
BOOK = {  # (forward bytes, backward bytes) as functions of B, D, F, X, Y; s = 2 folded in
    "ddp": (lambda B, D, F, X, Y: 0, lambda B, D, F, X, Y: 8 * D * F),
    "fsdp": (lambda B, D, F, X, Y: 4 * D * F, lambda B, D, F, X, Y: 8 * D * F),
    "tp": (lambda B, D, F, X, Y: 4 * B * D, lambda B, D, F, X, Y: 4 * B * D),
    "fsdp_tp": (
        lambda B, D, F, X, Y: Fraction(4 * B * D, X) + Fraction(4 * D * F, Y),
        lambda B, D, F, X, Y: Fraction(6 * B * D, X) + Fraction(8 * D * F, Y),
    ),
}


@pytest.mark.parametrize("name", list(BOOK))
def test_totals_are_the_books_per_layer_bytes_without_the_ring_factor(name) -> None:
    mesh = {"ddp": {"X": 4}, "fsdp": {"X": 4}, "tp": {"Y": 4}, "fsdp_tp": {"X": 2, "Y": 4}}[name]
    b, d, f = 64, 32, 128
    t = run(name, mesh, (b, d, f), "bfloat16", shape_only=True).trace
    for phase, book in zip(("forward", "backward"), BOOK[name]):
        # undo the ring's (N-1)/N per collective: what the book counts
        total = sum(
            Fraction(e.sent_bytes * mesh[e.axes[0]], mesh[e.axes[0]] - 1)
            for e in t
            if e.phase == phase and e.is_collective
        )
        assert total == book(b, d, f, mesh.get("X", 1), mesh.get("Y", 1)), (name, phase)
        flops = sum(e.flops for e in t if e.phase == phase)
        n = mesh.get("X", 1) * mesh.get("Y", 1)
        assert flops == (4 if phase == "forward" else 8) * b * d * f // n, (name, phase)


# -- memory per chip ---------------------------------------------------------------------------
MEMORY = {  # params peak, grads, stored activations {name: bytes} per chip
    "ddp": lambda B, D, F, X, Y, s: (2 * D * F * s, 2 * D * F * s, {"In": B * D * s / X, "H_pre": B * F * s / X}),
    "fsdp": lambda B, D, F, X, Y, s: (
        2 * D * F * s / X + D * F * s,
        2 * D * F * s / X,
        {"In": B * D * s / X, "H_pre": B * F * s / X},
    ),
    "tp": lambda B, D, F, X, Y, s: (
        2 * D * F * s / Y,
        2 * D * F * s / Y,
        {"In": B * D * s / Y, "In (gathered)": B * D * s, "H_pre": B * F * s / Y},
    ),
    "fsdp_tp": lambda B, D, F, X, Y, s: (
        2 * D * F * s / (X * Y) + D * F * s / Y,
        2 * D * F * s / (X * Y),
        {"In": B * D * s / (X * Y), "H_pre": B * F * s / (X * Y)},
    ),
}


@pytest.mark.parametrize(("name", "mesh", "sizes", "dtype"), [c for c in CASES if max(c[1].values()) > 1] + BIG[:4])
def test_memory_per_chip_is_the_closed_form(name, mesh, sizes, dtype) -> None:
    r = run(name, mesh, sizes, dtype, shape_only=dtype == "bfloat16")
    v = values(mesh, *sizes, dtype)
    params, grads, stored = MEMORY[name](*(v[k] for k in "BDFXYs"))
    assert (r.memory["params"] == params).all(), (name, mesh)
    assert (r.memory["grads"] == grads).all(), (name, mesh)
    for label, nbytes in stored.items():
        assert r.activations[label] == nbytes, (name, mesh, label)
    assert r.activations["H"] == r.activations["H_pre"]
