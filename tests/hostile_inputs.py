"""Hostile arguments for the core's public functions, shared by the property tests
(``tests/test_hostile_core.py``) and the hand-run campaign (``benchmarks/campaign_api.py``).

:func:`run_case` calls one public function with arguments taken from ``HOSTILE`` (wrong types,
empty, negative, zero-size, huge, non-finite) and classifies the outcome: ``"ok"`` (a value
NumPy agrees with), ``"documented"`` (a :class:`~shardsim.ShardsimError` with a message),
``"wrong"`` (a value NumPy disagrees with) or ``"undocumented"`` (any other exception).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import shardsim
from shardsim.specs import P

HOSTILE: list[Any] = [
    None, 0, -1, 1, 2, 5, 1.5, math.nan, math.inf, -math.inf, "1", "X", "Y", "", "Z", ("X",), ("X", "Y"),
    ("X", "X"), (), [], ["X", 5], {"X": 2}, b"X", True, 2**63, -(2**63), 10**30, np.int64(1), np.float32(np.nan),
    np.zeros(0), np.ones((2, 3)), object(), 1j, slice(None), Ellipsis, "[B_X, D]", "B_{X,", "[]", "B", "D",
    -2, 0.0, -0.0, 1e308, [(0, 1), (1, 0)], [(0, 1)], "float32", "int8", "bfloat16",
    # JAX's habits: a PartitionSpec as text or as an object, make_mesh's shape and names
    "X, None", "[X, Y]", "None", "P('X', None)", P("X", None), P(("X", "Y")), P("X", unreduced={"Y"}), P(None, "Z"),
    (2, 2), ("data", "model"),
]  # fmt: skip

A = np.arange(8.0).reshape(2, 4) - 3
BLOCKS = np.arange(16.0).reshape(2, 1, 2, 4) - 10  # chips X=0, X=1 of a partial sum over X
REDUCED = BLOCKS[:, 0].sum(axis=0)


def agrees(got: Any, want: Any) -> bool:
    """Same shape and values as NumPy's (NaN where NumPy has NaN); dtype-blind only for 0-d ints."""
    g, w = np.asarray(got), np.asarray(want)
    return g.shape == w.shape and g.dtype == w.dtype and np.array_equal(g, w, equal_nan=g.dtype.kind in "fc")


def _numpy(fn: Callable[[], Any]) -> Any:
    """NumPy's answer, or None where NumPy itself refuses (then shardsim must refuse too)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # not np.errstate: see docs/reliability.md, CPython 3.11
            return fn()
    except Exception:
        return None


def _elementwise(op: Callable[[Any, Any], Any], scalar_first: bool) -> Callable[[Any, Sequence[Any]], bool]:
    def check(v: Any, args: Sequence[Any]) -> bool:
        want = _numpy(lambda: op(args[0], A) if scalar_first else op(A, args[0]))
        return want is not None and agrees(v, want)

    return check


def _scaled_partial(op: Callable[[Any, Any], Any]) -> Callable[[Any, Sequence[Any]], bool]:
    """Scaling each block, then adding, equals scaling the sum up to rounding (a few ulps)."""

    def check(v: Any, args: Sequence[Any]) -> bool:
        want = _numpy(lambda: op(REDUCED, args[0]))
        got = np.asarray(shardsim.all_reduce(v, "X"))
        if want is None or got.shape != np.shape(want) or got.dtype != np.asarray(want).dtype:
            return False
        return bool(np.allclose(got, want, rtol=1e-14, atol=0, equal_nan=True))

    return check


CASES: dict[str, tuple[int, Callable[..., Any], Callable[[Any, Sequence[Any]], bool]]] = {
    # name: (how many hostile arguments, the call, the check of a returned value against NumPy)
    "Mesh": (1, lambda env, s: shardsim.Mesh(X=s), lambda m, a: m.shape == (a[0],)),
    "Mesh(axes)": (1, lambda env, s: shardsim.Mesh(s), lambda m, a: m.shape == tuple(a[0].values())),
    "Layout.parse": (
        1,
        lambda env, t: shardsim.Layout.parse(t, ("X", "Y")),
        lambda v, a: shardsim.Layout.parse(str(v), ("X", "Y")) == v,
    ),
    "shard(array)": (1, lambda env, v: shardsim.shard(v, env["mesh"], "[B_X]"), lambda v, a: agrees(v, a[0])),
    "shard(mesh)": (1, lambda env, m: shardsim.shard(A, m, "[B, D]"), lambda v, a: agrees(v, A)),
    "shard(layout)": (1, lambda env, t: shardsim.shard(A, env["mesh"], t), lambda v, a: agrees(v, A)),
    "ShapeDtype": (1, lambda env, s: shardsim.ShapeDtype((s, 4)), lambda v, a: v.shape == (a[0], 4)),
    "all_gather(axis)": (1, lambda env, ax: shardsim.all_gather(env["x"], ax), lambda v, a: agrees(v, A)),
    "all_gather(x)": (1, lambda env, x: shardsim.all_gather(x, "X"), lambda v, a: False),
    "all_reduce(axis)": (1, lambda env, ax: shardsim.all_reduce(env["p"], ax), lambda v, a: agrees(v, REDUCED)),
    "reduce_scatter(dim)": (
        1,
        lambda env, d: shardsim.reduce_scatter(env["p"], "X", d),
        lambda v, a: agrees(v, REDUCED),
    ),
    "all_to_all(dims)": (2, lambda env, s, d: shardsim.all_to_all(env["x"], "X", s, d), lambda v, a: agrees(v, A)),
    "ppermute(axis, shift)": (2, lambda env, ax, s: shardsim.ppermute(env["x"], ax, s), lambda v, a: _shifted(v, a)),
    "ppermute(perm)": (1, lambda env, p: shardsim.ppermute(env["x"], "X", perm=p), lambda v, a: _permuted(v, a)),
    "reshard(layout)": (1, lambda env, t: shardsim.reshard(env["x"], t), lambda v, a: agrees(v, A)),
    "cast(dtype)": (1, lambda env, d: shardsim.cast(env["x"], d), lambda v, a: agrees(v, A.astype(v.dtype))),
    "matmul(b)": (1, lambda env, b: shardsim.matmul(env["x"], b), lambda v, a: False),
    "x + s": (1, lambda env, s: env["x"] + s, _elementwise(np.add, False)),
    "s / x": (1, lambda env, s: s / env["x"], _elementwise(np.true_divide, True)),
    "x % s": (1, lambda env, s: env["x"] % s, _elementwise(np.remainder, False)),
    "x ** s": (1, lambda env, s: env["x"] ** s, _elementwise(np.power, False)),
    "partial * s": (1, lambda env, s: env["p"] * s, _scaled_partial(np.multiply)),
    "partial / s": (1, lambda env, s: env["p"] / s, _scaled_partial(np.true_divide)),
    "x[i]": (1, lambda env, i: env["r"][i], lambda v, a: agrees(v, A[a[0]])),
    "x.sum(dim)": (1, lambda env, d: env["x"].sum(d), lambda v, a: _summed(v, a)),
    "Layout.parse(axis_names)": (
        1,
        lambda env, n: shardsim.Layout.parse("B_X D", n),
        lambda v, a: v == shardsim.Layout.parse("B_X D") and (a[0] is None or "X" in tuple(a[0])),
    ),
    # JAX's positional Mesh(shape, names) and its devices=: never a mesh
    "Mesh(shape, names)": (2, lambda env, a, b: shardsim.Mesh(a, b), lambda v, a: False),
    "Mesh(devices=)": (1, lambda env, d: shardsim.Mesh(X=2, devices=d), lambda v, a: False),
    # jax.lax's array-dimension axis= beside shardsim's mesh axis: never a value
    "all_gather(axis=)": (1, lambda env, d: shardsim.all_gather(env["x"], "Y", axis=d), lambda v, a: False),
    "reduce_scatter(axis=)": (
        1,
        lambda env, d: shardsim.reduce_scatter(env["p"], "X", "B", axis=d),
        lambda v, a: False,
    ),
    "mesh.coords": (1, lambda env, i: env["mesh"].coords(i), lambda v, a: v == {"X": a[0] // 2, "Y": a[0] % 2}),
    "mesh.slow": (1, lambda env, f: env["mesh"].slow(f, X=0), lambda v, a: env_slow_ok(a)),
    "mesh.fail": (1, lambda env, i: env["mesh"].fail(X=i), lambda v, a: a[0] in (0, 1)),
    "local(X=)": (1, lambda env, i: env["x"].local(X=i, Y=0), lambda v, a: agrees(v, A[a[0] : a[0] + 1, :2])),
    "transpose(order)": (
        2,
        lambda env, i, j: env["x"].transpose(i, j),
        lambda v, a: agrees(v, A.transpose(*map(_dim, a))),
    ),
}


def env_slow_ok(args: Sequence[Any]) -> bool:
    f = args[0]
    return isinstance(f, numbers.Real) and not isinstance(f, bool) and math.isfinite(f) and f > 0


def _dim(d: Any) -> int:
    """A dimension of ``A`` ([B, D]) by name or index."""
    return {"B": 0, "D": 1}[d] if isinstance(d, str) else int(d)


def _summed(v: shardsim.ShardedArray, args: Sequence[Any]) -> bool:
    reduced = shardsim.all_reduce(v, v.layout.partial) if v.is_partial else v
    return agrees(reduced, A.sum(axis=_dim(args[0])))


def _shifted(v: shardsim.ShardedArray, args: Sequence[Any]) -> bool:
    """Chip k of the group (numbered in the order the axes are given) holds chip k - shift's block."""
    axis, shift = args
    if not isinstance(shift, (int, np.integer)) or isinstance(shift, bool):
        return False  # a shift that is not an integer must be refused
    axes = (axis,) if isinstance(axis, str) else tuple(axis)
    before = shardsim.shard(A, shardsim.Mesh(X=2, Y=2), "B_X D_Y").blocks()  # [x, y] = A[x, 2y:2y+2]
    order = [("X", "Y").index(ax) for ax in axes]
    rest = [i for i in range(2) if i not in order]
    moved = np.moveaxis(before, order + rest, list(range(2)))
    n = 2 ** len(order)
    flat = moved.reshape((n, -1) + moved.shape[2:])
    want = flat[[(k - int(shift)) % n for k in range(n)]].reshape(moved.shape)
    return bool(np.array_equal(v.blocks(), np.moveaxis(want, list(range(2)), order + rest)))


def _permuted(v: shardsim.ShardedArray, args: Sequence[Any]) -> bool:
    """Chip ``d`` of X holds chip ``s``'s row for every pair ``(s, d)`` of a full permutation."""
    pairs = [tuple(p) for p in args[0]]
    if sorted(d for _, d in pairs) != [0, 1] or sorted(s for s, _ in pairs) != [0, 1]:
        return False  # not a full permutation: must be refused
    want = A.copy()
    for s, d in pairs:
        want[d] = A[s]
    return agrees(v, want)


def environment() -> dict[str, Any]:
    """Fresh values for one call: on Mesh(X=2, Y=2), x = A as [B_X, D_Y], p a partial sum over X."""
    mesh = shardsim.Mesh(X=2, Y=2)
    return {
        "mesh": mesh,
        "x": shardsim.shard(A, mesh, "B_X D_Y"),
        "r": shardsim.shard(A, mesh, "B D"),
        "p": shardsim.from_local(np.broadcast_to(BLOCKS, (2, 2, 2, 4)), mesh, "[B, D]{U_X}"),
    }


def run_case(name: str, args: Sequence[Any]) -> str:
    """Call case ``name`` with ``args`` and classify the outcome (see the module docstring)."""
    _, call, check = CASES[name]
    env = environment()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # not np.errstate: see docs/reliability.md, CPython 3.11
        try:
            out = call(env, *args)
        except shardsim.ShardsimError as e:
            return "documented" if str(e).strip() else "undocumented"
        except Exception:
            return "undocumented"
        try:
            return "ok" if check(out, args) else "wrong"
        except Exception:
            return "wrong"
