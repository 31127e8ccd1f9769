"""Hostile-input fuzz of the public API: a documented error or the NumPy answer, nothing else.

Every test draws meshes (including malformed ones), layout strings (valid ones in every
spelling, and garbage), shapes with zero-size dimensions, dtypes (bool, ints, float16,
bfloat16, float32/64, complex) and values with NaN and Inf, then calls the API. A call may
raise a :class:`shardsim.ShardsimError` subclass; any other exception fails the test. A call
that returns is checked against plain NumPy: data movement bit for bit, arithmetic with the
dtype's tolerance.

CI runs a fixed set (derandomized, bounded). ``SHARDSIM_FUZZ_SCALE=N`` multiplies every
budget by N and draws fresh examples (seed ``SHARDSIM_FUZZ_SEED``), for long campaigns.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import operator
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given, seed
from hypothesis import strategies as st

import shardsim
from fuzz_budget import budget
from shardsim import checkpoint
from shardsim.dtypes import resolve_dtype, tolerance
from shardsim.errors import DtypeError
from shardsim.layout import Dim, Layout
from shardsim.resharding import reshard

SEED = int(os.environ.get("SHARDSIM_FUZZ_SEED", "20240611"))


# -- outcomes --------------------------------------------------------------------------------------
@contextlib.contextmanager
def documented_errors_only() -> Iterator[None]:
    """Let a ShardsimError through (checking it has a message); any other exception fails the test."""
    try:
        yield
    except shardsim.ShardsimError as e:
        assert str(e).strip(), f"{type(e).__name__} without a message"


def attempt(fn: Callable[[], Any]) -> tuple[bool, Any]:
    """``(True, result)`` or ``(False, error)`` for a ShardsimError; anything else propagates."""
    try:
        out = fn()
    except shardsim.ShardsimError as e:
        assert str(e).strip(), f"{type(e).__name__} without a message"
        event(type(e).__name__)
        return False, e
    event("returned")
    return True, out


def consistent(y: shardsim.ShardedArray) -> shardsim.ShardedArray:
    """The value's own description agrees with its data: dtype, block shape, stacked shape, bytes."""
    assert y.local_nbytes == math.prod(y.local_shape) * y.dtype.itemsize
    if not y.is_shape_only:
        c = y.compact()
        used = set(y.layout.used_axes())
        want = tuple(n if a in used else 1 for a, n in zip(y.mesh.axis_names, y.mesh.shape)) + y.local_shape
        assert c.dtype == y.dtype, f"data is {c.dtype}, the value says {y.dtype}"
        assert c.shape == want, f"stacked data {c.shape}, expected {want} for {y.layout}"
    return y


def same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.tobytes() == want.tobytes()


def same_values(got: np.ndarray, want: np.ndarray) -> None:
    """Equal elementwise, NaN where NumPy has NaN (payloads may differ)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    assert np.array_equal(got, want, equal_nan=want.dtype.kind in "fc" or want.dtype.name == "bfloat16")


def close(got: np.ndarray, want: np.ndarray, scale: np.ndarray, dtype: np.dtype, terms: int) -> None:
    """Within a few ulps times sqrt(terms) of ``scale`` (the sum of |terms|); non-finite must match."""
    assert got.shape == want.shape, (got.shape, want.shape)
    kind = np.complex128 if dtype.kind == "c" else np.float64
    g, w = got.astype(kind), want.astype(kind)
    finite = np.isfinite(w)
    assert np.array_equal(np.isnan(g), np.isnan(w)), "NaN positions differ"
    assert np.array_equal(g[~finite & ~np.isnan(w)], w[~finite & ~np.isnan(w)]), "Inf values differ"
    real = np.finfo(dtype).dtype if dtype.kind == "c" else dtype  # complex64 -> float32
    tol = tolerance(real, max(terms, 1))
    assert (np.abs(g[finite] - w[finite]) <= tol * scale[finite] + 1e-300).all()


# -- references ------------------------------------------------------------------------------------
def chips(mesh: shardsim.Mesh) -> list[dict[str, int]]:
    return [dict(zip(mesh.axis_names, c)) for c in itertools.product(*map(range, mesh.shape))]


def flat_index(mesh: shardsim.Mesh, c: dict[str, int], axes: tuple[str, ...]) -> int:
    k = 0
    for a in axes:
        k = k * mesh.axis_size(a) + c[a]
    return k


def chip_slices(mesh: shardsim.Mesh, layout: Layout, shape: tuple[int, ...], c: dict[str, int]) -> tuple[slice, ...]:
    out = []
    for n, d in zip(shape, layout.dims):
        size = n // math.prod(mesh.axis_size(a) for a in d.axes)
        k = flat_index(mesh, c, d.axes)
        out.append(slice(k * size, (k + 1) * size))
    return tuple(out)


def assert_blocks(x: shardsim.ShardedArray, full: np.ndarray) -> None:
    for c in chips(x.mesh):
        same_bits(np.asarray(x.local(**c)), full[chip_slices(x.mesh, x.layout, full.shape, c)])


def at(mesh: shardsim.Mesh, blocks: np.ndarray, c: dict[str, int]) -> np.ndarray:
    return blocks[tuple(c[a] for a in mesh.axis_names)]


# -- strategies ------------------------------------------------------------------------------------
GOOD_AXES = ("X", "Y", "Z", "data", "model", "p2")
BAD_AXES = ("", "_", "X_Y", "1x", "é", "X Y", "U_X")
DTYPES = ("bool", "int8", "int32", "int64", "uint8", "float16", "bfloat16", "float32", "float64", "complex64")
DIM_NAMES = ("B", "D", "F", "L1", "x", "T")


@st.composite
def meshes(draw: st.DrawFn, max_axes: int = 3, max_size: int = 3) -> shardsim.Mesh:
    n = draw(st.integers(1, max_axes))
    names = draw(st.permutations(GOOD_AXES))[:n]
    return shardsim.Mesh({a: draw(st.integers(1, max_size)) for a in names})


@st.composite
def layouts(
    draw: st.DrawFn, mesh: shardsim.Mesh, rank: int, partial: bool = False, names: tuple[str, ...] | None = None
) -> Layout:
    """A legal layout of ``rank`` dims on ``mesh`` (dimension ``names``, or names from DIM_NAMES)."""
    slots: list[list[str]] = [[] for _ in range(rank + 1)]
    for axis in draw(st.permutations(mesh.axis_names)):
        where = draw(st.integers(-1, rank if partial else rank - 1))
        if where >= 0:
            slots[where].append(axis)
    if names is None or len(names) != rank:
        names = tuple(draw(st.sampled_from(DIM_NAMES)) for _ in range(rank))
    return Layout(tuple(Dim(names[i], tuple(slots[i])) for i in range(rank)), tuple(slots[rank]))


@st.composite
def spellings(draw: st.DrawFn, layout: Layout) -> str:
    """``layout`` written in one of the accepted spellings: brackets or not, commas or spaces, braces."""

    def sub(axes: tuple[str, ...]) -> str:
        if not axes:
            return ""
        if all(len(a) == 1 for a in axes) and draw(st.booleans()):
            return "_" + "".join(axes)
        return "_{" + ",".join(axes) + "}"

    sep = draw(st.sampled_from([", ", " ", ",", " , "]))
    body = sep.join(d.name + sub(d.axes) for d in layout.dims)
    text = f"[{body}]" if draw(st.booleans()) else body
    if layout.partial:
        if draw(st.booleans()):
            text += "{U" + sub(layout.partial) + "}"
        else:
            text += "{" + ", ".join("U" + sub((a,)) for a in layout.partial) + "}"
    return text


garbage = st.one_of(
    st.text(alphabet="[]{}_,U XYZBDF01\t", max_size=16),
    st.text(max_size=12),
    st.sampled_from(["", "[]", "[B_]", "[B_X,]", "{U_X}", "[B]{U}", "[B]{U_}", "[B_{X]", "B__X", "[B_X]{V_Y}"]),
)


@st.composite
def layout_text(
    draw: st.DrawFn, mesh: shardsim.Mesh, rank: int, partial: bool = False, names: tuple[str, ...] | None = None
) -> str:
    """Usually a legal spelling of a legal layout; sometimes garbage, other dimension names or rank."""
    kind = draw(st.sampled_from(["good", "good", "good", "good", "garbage", "other_names", "other_rank"]))
    if kind == "garbage":
        return draw(garbage)
    r = rank if kind != "other_rank" else draw(st.integers(1, 4))
    return draw(spellings(draw(layouts(mesh, r, partial, None if kind == "other_names" else names))))


def parts(mesh: shardsim.Mesh, axes: tuple[str, ...]) -> int:
    return math.prod(mesh.axis_size(a) for a in axes)


@st.composite
def shapes_for(draw: st.DrawFn, mesh: shardsim.Mesh, layout: Layout) -> tuple[int, ...]:
    """Mostly divisible shapes (zero-size dims included), sometimes not."""
    if draw(st.integers(0, 9)) == 0:
        return tuple(draw(st.integers(0, 7)) for _ in layout.dims)
    return tuple(parts(mesh, d.axes) * draw(st.integers(0, 3)) for d in layout.dims)


def make_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, special: bool) -> np.ndarray:
    dt = resolve_dtype(dtype)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        return rng.integers(0 if dt.kind == "u" else -9, 10, shape).astype(dt)
    v = rng.standard_normal(shape)
    if dt.kind == "c":
        v = v + 1j * rng.standard_normal(shape)
    v = v.astype(dt)
    if special and v.size:
        flat = v.reshape(-1)
        for k, s in zip(rng.integers(0, v.size, 3), (np.nan, np.inf, -np.inf)):
            flat[k] = s
    return v


@st.composite
def sharded(draw: st.DrawFn, partial: bool = False, max_rank: int = 3) -> tuple[shardsim.ShardedArray, np.ndarray]:
    """A valid sharded value built from every chip's block, and that stacked block array."""
    mesh = draw(meshes())
    rank = draw(st.integers(1, max_rank))
    layout = draw(layouts(mesh, rank, partial))
    local = tuple(draw(st.integers(0, 3)) for _ in range(rank))
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    used = set(layout.used_axes())
    compact = make_values(
        rng,
        tuple(n if a in used else 1 for a, n in zip(mesh.axis_names, mesh.shape)) + local,
        dtype,
        draw(st.booleans()),
    )
    blocks = np.broadcast_to(compact, mesh.shape + local)
    x = shardsim.from_local(blocks, mesh, layout).named(draw(st.sampled_from(["x", "W_in", "", "a b"])) or None)
    return x, np.asarray(blocks)


# -- the fuzz --------------------------------------------------------------------------------------
@seed(SEED)
@budget(60)
@given(
    spec=st.dictionaries(
        st.one_of(st.sampled_from(GOOD_AXES + BAD_AXES), st.text(max_size=4)),
        st.one_of(st.integers(-2, 5), st.booleans(), st.floats(allow_nan=True), st.text(max_size=2)),
        max_size=6,
    )
)
def test_fuzz_mesh_construction(spec: dict[str, Any]) -> None:
    ok, mesh = attempt(lambda: shardsim.Mesh(spec))
    if ok:
        assert mesh.axis_names == tuple(spec) and mesh.shape == tuple(spec.values())
        assert mesh.size == math.prod(mesh.shape) and len(mesh.chips()) == mesh.size


@seed(SEED)
@budget(80)
@given(data=st.data())
def test_fuzz_mesh_faults_and_coordinates(data: st.DataObject) -> None:
    mesh = data.draw(meshes())
    coord = st.one_of(st.integers(-2, 4), st.booleans(), st.text(max_size=2), st.floats(), st.none())
    coords = data.draw(st.dictionaries(st.sampled_from(GOOD_AXES + ("Q",)), coord, max_size=3))
    action = data.draw(st.sampled_from(["fail", "slow", "local", "coords"]))
    x = shardsim.shard(np.arange(mesh.size * 2.0), mesh, Layout((Dim("A", mesh.axis_names),)))
    if action == "fail":
        ok, _ = attempt(lambda: mesh.fail(**coords))
        assert ok or not mesh.failed
    elif action == "slow":
        factor = data.draw(st.one_of(st.floats(), st.integers(-2, 5), st.text(max_size=2)))
        ok, _ = attempt(lambda: mesh.slow(factor, **coords))
        if not ok:
            assert (mesh.slowdown == 1.0).all()
    elif action == "local":
        ok, block = attempt(lambda: x.local(**coords))
        if ok:
            k = flat_index(mesh, coords, mesh.axis_names)
            same_bits(np.asarray(block), np.arange(mesh.size * 2.0)[2 * k : 2 * k + 2])
    else:
        chip = data.draw(st.one_of(st.integers(-3, 70), st.booleans()))
        ok, got = attempt(lambda: mesh.coords(chip))
        if ok:
            assert 0 <= chip < mesh.size and flat_index(mesh, got, mesh.axis_names) == chip


@seed(SEED)
@budget(150)
@given(data=st.data())
def test_fuzz_layout_parse_round_trips(data: st.DataObject) -> None:
    mesh = data.draw(meshes())
    text = data.draw(layout_text(mesh, data.draw(st.integers(1, 4)), partial=True))
    names = data.draw(st.sampled_from([mesh.axis_names, None]))
    ok, layout = attempt(lambda: Layout.parse(text, names))
    if ok:
        again = Layout.parse(str(layout), names)
        assert again == layout, (text, str(layout), again)
        with documented_errors_only():
            layout.validate(mesh.axis_names)


@seed(SEED)
@budget(150)
@given(data=st.data())
def test_fuzz_shard_and_back(data: st.DataObject) -> None:
    """shard() of any array with any layout text: a documented error, or blocks that are NumPy slices."""
    mesh = data.draw(meshes())
    rank = data.draw(st.integers(0, 4))
    text = data.draw(layout_text(mesh, max(rank, 1)))
    ok, layout = attempt(lambda: Layout.parse(text, mesh.axis_names))
    shape = data.draw(shapes_for(mesh, layout)) if ok else tuple(data.draw(st.integers(0, 4)) for _ in range(rank))
    dtype = data.draw(st.sampled_from([*DTYPES, "object", "str"]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    if dtype in ("object", "str"):
        full = np.full(shape, "a", dtype=dtype)
    else:
        full = make_values(rng, shape, dtype, data.draw(st.booleans()))
    ok, x = attempt(lambda: shardsim.shard(full, mesh, text))
    if not ok:
        return
    assert x.global_shape == full.shape and x.dtype == full.dtype
    consistent(x)
    same_bits(np.asarray(x.to_global()), full)
    assert_blocks(x, full)
    assert int(mesh.memory.live()[(0,) * len(mesh.shape)]) >= x.local_nbytes
    with documented_errors_only():
        str(shardsim.show(x))


@seed(SEED)
@budget(200)
@given(value=sharded(partial=True), data=st.data())
def test_fuzz_collectives(value: tuple[shardsim.ShardedArray, np.ndarray], data: st.DataObject) -> None:
    """Every collective with any axes and dims: a documented error, or the blocks NumPy says."""
    x, blocks = value
    mesh = x.mesh
    lay = x.layout
    split = [d.axes[-k:] for d in lay.dims for k in range(1, len(d.axes) + 1)]  # un-splittable minor ends
    sensible = [*split, *(lay.partial[:k] for k in range(1, len(lay.partial) + 1))]
    any_axes = st.lists(st.sampled_from([*mesh.axis_names, "Q"]), min_size=1, max_size=3).map(tuple)
    axes = data.draw(st.one_of(st.sampled_from(sensible), any_axes) if sensible else any_axes)
    dim = data.draw(st.one_of(st.integers(0, lay.rank - 1), st.integers(-4, 4), st.sampled_from([*DIM_NAMES, "no"])))
    src_dim = lay.axis_dim(axes[0]) if axes[0] in mesh.axis_names else None
    src = data.draw(st.one_of(st.just(src_dim if src_dim is not None else 0), st.integers(-4, 4)))
    shift = data.draw(st.integers(-5, 5))
    op = data.draw(st.sampled_from(["all_gather", "all_to_all", "ppermute", "all_reduce", "reduce_scatter"]))
    calls = {
        "all_gather": lambda: shardsim.all_gather(x, axes),
        "all_to_all": lambda: shardsim.all_to_all(x, axes, src, dim),
        "ppermute": lambda: shardsim.ppermute(x, axes, shift),
        "all_reduce": lambda: shardsim.all_reduce(x, axes),
        "reduce_scatter": lambda: shardsim.reduce_scatter(x, axes, dim),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NaN, Inf and complex casts warn, as in NumPy
        ok, y = attempt(calls[op])
        if not ok:
            return
        assert y.mesh is mesh and y.dtype == x.dtype and y.global_shape == x.global_shape
        consistent(y)
        n = mesh.axis_size(axes)
        for c in chips(mesh):
            got = np.asarray(y.local(**c))
            group = [
                dict(c, **dict(zip(axes, i))) for i in itertools.product(*(range(mesh.axis_size(a)) for a in axes))
            ]
            k = flat_index(mesh, c, axes)
            if op == "ppermute":
                assert y.layout == x.layout
                same_bits(got, at(mesh, blocks, group[(k - shift) % n]))
            elif op in ("all_gather", "all_to_all"):
                s = x.layout.axis_dim(axes[0])
                assert s is not None and x.layout.dims[s].axes[-len(axes) :] == axes
                gathered = np.concatenate([at(mesh, blocks, g) for g in group], axis=s)
                if op == "all_gather":
                    assert y.layout == x.layout.with_dim(s, x.layout.dims[s].axes[: -len(axes)])
                    same_bits(got, gathered)
                else:
                    d = x.layout.dim_index(dim)
                    assert y.layout.dims[d].axes == x.layout.dims[d].axes + axes
                    same_bits(got, np.split(gathered, n, axis=d)[k])
            else:
                assert set(axes) <= set(x.layout.partial)
                want, scale = group_sum(mesh, blocks, c, axes)
                if op == "reduce_scatter":
                    d = x.layout.dim_index(dim)
                    assert y.layout.dims[d].axes == x.layout.dims[d].axes + axes
                    want, scale = np.split(want, n, axis=d)[k], np.split(scale, n, axis=d)[k]
                matches(got, want.astype(x.dtype), scale, n)


def group_sum(mesh: shardsim.Mesh, blocks: np.ndarray, c: dict, axes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The sum of chip ``c``'s group's blocks over ``axes`` (in chip order) and the sum of their |values|."""
    total, scale = None, None
    for idx in itertools.product(*(range(mesh.axis_size(a)) for a in axes)):
        b = at(mesh, blocks, dict(c, **dict(zip(axes, idx))))
        total = b if total is None else total + b
        mag = np.abs(b.astype(np.complex128 if b.dtype.kind == "c" else np.float64))
        scale = mag if scale is None else scale + mag
    assert total is not None and scale is not None
    return total, scale


def matches(got: np.ndarray, want: np.ndarray, scale: np.ndarray, terms: int) -> None:
    """Integers and booleans exactly; floating point within the dtype's tolerance for ``terms`` terms."""
    if want.dtype.kind in "biu":
        same_bits(got, want)
    else:
        assert got.dtype == want.dtype
        close(got, want, scale, want.dtype, terms)


@seed(SEED)
@budget(150)
@given(data=st.data())
def test_fuzz_matmul(data: st.DataObject) -> None:
    """a @ b for random layouts and shapes (matching or not): a documented error or NumPy's product."""
    mesh = data.draw(meshes())
    other = data.draw(st.sampled_from([mesh, mesh, mesh, shardsim.Mesh(dict(zip(mesh.axis_names, mesh.shape)))]))
    batch = data.draw(st.integers(0, 1))
    la = data.draw(layouts(mesh, 2 + batch, names=("B", "M", "K")[1 - batch :]))
    lb = data.draw(layouts(mesh, data.draw(st.sampled_from([2, 2 + batch]))))
    if data.draw(st.booleans()):  # often a legal pair: same batch dims, contracting dims split alike
        used = {a for d in la.dims for a in d.axes}
        n_axes = tuple(a for a in lb.dims[-1].axes if a not in used)
        lb = Layout((*la.dims[:-2], Dim("K", la.dims[-1].axes), Dim("N", n_axes))[-lb.rank :])
    unit = [parts(mesh, d.axes) for d in la.dims]
    m, k = unit[-2] * data.draw(st.integers(0, 2)), math.lcm(unit[-1], parts(mesh, lb.dims[-2].axes))
    k *= data.draw(st.integers(0, 2))
    n = parts(mesh, lb.dims[-1].axes) * data.draw(st.integers(0, 2))
    bs = tuple(unit[0] * data.draw(st.integers(1, 2)) for _ in range(batch))
    kb = k if data.draw(st.integers(0, 9)) else k + 1
    shape_b = (*bs[: lb.rank - 2], kb, n)
    dtype = data.draw(st.sampled_from(["bool", "int32", "float16", "float32", "float64", "complex64"]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    a_full = make_values(rng, (*bs, m, k), dtype, special=False)
    b_full = make_values(rng, shape_b, dtype, special=False)
    with documented_errors_only():
        a = shardsim.shard(a_full, mesh, la)
        b = shardsim.shard(b_full, other, lb)
        ok, out = attempt(lambda: a @ b)
        if not ok:
            return
        consistent(out)
        assert other is mesh and kb == k
        if out.layout.partial:
            out = shardsim.all_reduce(out, out.layout.partial)
        want = np.matmul(a_full, b_full)
        got = np.asarray(out.to_global())
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        if want.dtype.kind in "biu":
            same_bits(got, want)
        else:
            scale = np.matmul(np.abs(a_full).astype(np.float64), np.abs(b_full).astype(np.float64))
            close(got, want, scale, want.dtype, k)


@seed(SEED)
@budget(150)
@given(value=sharded(), data=st.data())
def test_fuzz_elementwise_and_local_ops(value: tuple[shardsim.ShardedArray, np.ndarray], data: st.DataObject) -> None:
    """Elementwise ops, casts, transposes, sums and activations against NumPy on the global array."""
    x, _ = value
    full = np.asarray(x.to_global())
    op = data.draw(st.sampled_from(["+", "-", "*", "/", "scalar", "cast", "T", "transpose", "sum", "act", "neg"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NaN, Inf and complex casts warn, as in NumPy
        if op in "+-*/":
            same_layout = data.draw(st.booleans())
            lay = x.layout if same_layout else data.draw(layouts(x.mesh, x.ndim))
            other_dtype = data.draw(st.sampled_from([str(x.dtype), *DTYPES]))
            rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
            o_full = make_values(rng, full.shape, other_dtype, data.draw(st.booleans()))
            ok, o = attempt(lambda: shardsim.shard(o_full, x.mesh, lay))
            if not ok:
                return
            fn = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}[op]
            compare(lambda: fn(x, o), lambda: fn(full, o_full))
        elif op == "scalar":
            s = data.draw(
                st.one_of(
                    st.integers(-3, 3),
                    st.floats(allow_nan=True),
                    st.booleans(),
                    st.sampled_from([np.float16(2), 300, 2**70, "a", None, 1j]),
                )
            )
            fn = data.draw(st.sampled_from([operator.add, operator.mul, operator.sub, operator.truediv]))
            compare(lambda: fn(x, s), lambda: fn(full, s))
        elif op == "cast":
            dt = data.draw(st.sampled_from([*DTYPES, "nonsense", "bf16"]))
            compare(lambda: shardsim.cast(x, dt), lambda: full.astype(resolve_dtype(dt)))
        elif op == "T":
            compare(lambda: x.T, lambda: np.swapaxes(full, -1, -2))
        elif op == "transpose":
            order = tuple(data.draw(st.lists(st.integers(-3, 3), max_size=4)))
            compare(lambda: x.transpose(*order), lambda: np.transpose(full, order or None))
        elif op == "neg":
            compare(lambda: -x, lambda: full * -1.0)
        elif op == "sum":
            dim = data.draw(st.integers(-3, 3))
            ok, y = attempt(lambda: x.sum(dim))
            if ok:
                consistent(y)
                if y.layout.partial:
                    y = shardsim.all_reduce(y, y.layout.partial)
                want = np.sum(full, axis=dim)
                got = np.asarray(y.to_global())
                if want.dtype.kind in "biu":
                    same_bits(got, want.astype(got.dtype))
                else:
                    close(got, want, np.sum(np.abs(full).astype(np.float64), axis=dim), got.dtype, full.shape[dim])
        else:
            name = data.draw(st.sampled_from(["relu", "gelu", "identity", "tanh"]))
            compare(lambda: shardsim.activation(x, name), lambda: _act(full, name))


def _act(full: np.ndarray, name: str) -> np.ndarray:
    from shardsim import activations

    return activations.get(name).fn(full)


def compare(ours: Callable[[], Any], numpys: Callable[[], np.ndarray]) -> None:
    """Either a documented error, or NumPy's answer; NumPy refusing (TypeError, ValueError) counts too."""
    ok, y = attempt(ours)
    if not ok:
        return
    consistent(y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NaN, Inf and complex casts warn, as in NumPy
        want = np.asarray(numpys())
    got = np.asarray(y.to_global())
    same_values(got, want)


@seed(SEED)
@budget(120)
@given(value=sharded(partial=True), data=st.data())
def test_fuzz_reshard(value: tuple[shardsim.ShardedArray, np.ndarray], data: st.DataObject) -> None:
    """reshard to any layout text, on the same mesh or another: a documented error or the same bits."""
    x, blocks = value
    target_mesh = data.draw(st.sampled_from([x.mesh, x.mesh, data.draw(meshes())]))
    text = data.draw(layout_text(target_mesh, x.ndim, partial=True, names=x.layout.names))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NaN, Inf and complex casts warn, as in NumPy
        ok, y = attempt(lambda: reshard(x, text, mesh=target_mesh))
        if not ok:
            return
        assert y.mesh is target_mesh and y.layout == Layout.parse(text, target_mesh.axis_names)
        consistent(y)
        if not x.layout.partial:
            same_bits(np.asarray(y.to_global()), np.asarray(x.to_global()))
            return
        if y.layout.partial:  # kept partial axes: reduce them too, then compare the sums
            y = shardsim.all_reduce(y, y.layout.partial)
        assert_reduced(np.asarray(y.to_global()), x, blocks)


def assert_reduced(got: np.ndarray, x: shardsim.ShardedArray, blocks: np.ndarray) -> None:
    """``got`` is the global value of ``x`` with its partial axes added up (plain NumPy reference)."""
    mesh = x.mesh
    want = np.empty(x.global_shape, x.dtype)
    scale = np.empty(x.global_shape, np.float64)
    for c in chips(mesh):
        total, mag = group_sum(mesh, blocks, c, x.layout.partial)
        want[chip_slices(mesh, x.layout, x.global_shape, c)] = total
        scale[chip_slices(mesh, x.layout, x.global_shape, c)] = np.abs(mag)
    matches(got, want, scale, math.prod(mesh.axis_size(a) for a in x.layout.partial))


@seed(SEED)
@budget(40)
@given(
    values=st.lists(sharded(partial=True), min_size=1, max_size=3),
    keys=st.lists(st.one_of(st.sampled_from(["w", "a/b", "", "layer.0", "W", "ü"]), st.text(max_size=3)), max_size=3),
    data=st.data(),
)
def test_fuzz_checkpoint(values: list, keys: list[str], data: st.DataObject) -> None:
    """Save any state, load on any mesh with any layouts: a documented error or the same global bits."""
    names = list(dict.fromkeys([*keys, *(f"v{i}" for i in range(len(values)))]))[: len(values)]
    nested = data.draw(st.booleans())
    state: dict[str, Any] = (
        {"group": dict(zip(names, (v for v, _ in values)))} if nested else dict(zip(names, (v for v, _ in values)))
    )
    target = data.draw(st.sampled_from([values[0][0].mesh, data.draw(meshes())]))
    layouts_arg = {}
    for name, (v, _) in zip(names, values):
        if data.draw(st.booleans()):
            layouts_arg[("group/" if nested else "") + str(name)] = data.draw(layout_text(target, v.ndim))
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ok, path = attempt(lambda: checkpoint.save(Path(tmp) / "c", state))
        if not ok:
            return
        ok, got = attempt(lambda: checkpoint.load(path, target, layouts=layouts_arg))
        if not ok:
            return
    flat = got["group"] if nested else got
    for name, (v, blocks) in zip(names, values):
        y = consistent(flat[name])
        assert y.mesh is target and y.dtype == v.dtype and y.global_shape == v.global_shape
        if y.layout.partial:  # only with the saved layout on the same mesh: every block as saved
            assert y.layout == v.layout
            same_bits(np.asarray(y.blocks()), np.asarray(v.blocks()))
        elif v.layout.partial:
            assert_reduced(np.asarray(y.to_global()), v, blocks)
        else:
            same_bits(np.asarray(y.to_global()), np.asarray(v.to_global()))


json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-3, 10),
        st.text(max_size=6),
        st.sampled_from(["*", "X", "[A_X]", "float32"]),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6,
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside nested dicts and lists."""
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


@seed(SEED)
@budget(60)
@given(value=sharded(partial=True), data=st.data())
def test_fuzz_checkpoint_forged_index(value: tuple[shardsim.ShardedArray, np.ndarray], data: st.DataObject) -> None:
    """An index edited anywhere and re-signed (a buggy or hostile writer): only documented errors."""
    x, _ = value
    with tempfile.TemporaryDirectory() as tmp:
        path = checkpoint.save(Path(tmp) / "c", {"x": x})
        index = json.loads((path / "index.json").read_text())
        for _ in range(data.draw(st.integers(1, 3))):
            where = data.draw(st.sampled_from(_paths(index)[1:]))
            node = index
            for k in where[:-1]:
                node = node[k]
            if data.draw(st.booleans()) and isinstance(node, dict):
                del node[where[-1]]
            else:
                node[where[-1]] = data.draw(json_values)
        index["sha256"] = checkpoint._index_digest(index) if isinstance(index, dict) else None
        (path / "index.json").write_text(json.dumps(index))
        with documented_errors_only():
            got = checkpoint.load(path, x.mesh)
            assert isinstance(got, dict)


@pytest.mark.parametrize(
    ("shape", "layout"), [((0,), "A_XY"), ((0, 6), "A_X B_Y"), ((6, 0), "A_Y B_X"), ((0, 0), "A_XY B")]
)
def test_zero_size_dimensions_are_allowed(shape: tuple[int, ...], layout: str) -> None:
    """Zero divides by anything: a zero-size dimension may be split over any axes."""
    mesh = shardsim.Mesh(X=2, Y=3)
    x = shardsim.shard(np.zeros(shape, np.float32), mesh, layout)
    assert x.to_global().shape == shape and x.local_nbytes == 0
    with shardsim.trace() as t:
        y = shardsim.all_gather(x, x.layout.dims[0].axes)
        z = shardsim.ppermute(x, "X", 1)
    assert y.to_global().shape == shape and z.to_global().shape == shape
    assert t.total("sent_bytes") == 0


# -- regressions: each input below once escaped as a non-shardsim error or a wrong result -----------
def test_chip_coordinates_must_be_integers() -> None:
    mesh = shardsim.Mesh(X=2)
    x = shardsim.shard(np.arange(4.0), mesh, "A_X")
    with pytest.raises(shardsim.MeshAxisError, match=r"X='1': a chip coordinate is an integer index along axis 'X'"):
        mesh.fail(X="1")  # type: ignore[arg-type]
    with pytest.raises(shardsim.MeshAxisError, match=r"X=None: a chip coordinate is an integer"):
        mesh.slow(2.0, X=None)  # type: ignore[arg-type]
    with pytest.raises(shardsim.ShardingError, match=r"X=0\.5: a chip coordinate is an integer"):
        x.local(X=0.5)  # type: ignore[arg-type]
    np.testing.assert_array_equal(x.local(X=np.int64(1)), [2.0, 3.0])  # NumPy integers are integers


def test_ppermute_of_zero_size_blocks() -> None:
    x = shardsim.shard(np.zeros((4, 0)), shardsim.Mesh(X=2), "A_X B")
    assert shardsim.ppermute(x, "X", 1).to_global().shape == (4, 0)


@pytest.mark.parametrize(
    ("dtype", "blocks", "want"),
    [("bool", [[True, False], [True, False]], [True, False]), ("int8", [[100, 1]] * 2, [-56, 2])],
)
def test_reductions_keep_the_value_dtype(dtype: str, blocks: list, want: object) -> None:
    """Partials of bool add as logical or, int8 wraps: the sum keeps the dtype the value declares."""
    p = shardsim.from_local(np.array(blocks, dtype), shardsim.Mesh(X=2), "[A]{U_X}")
    for y in (shardsim.all_reduce(p, "X"), shardsim.reduce_scatter(p, "X", 0)):
        assert y.dtype == np.dtype(dtype) and consistent(y).compact().dtype == np.dtype(dtype)
    same_bits(np.asarray(shardsim.all_reduce(p, "X").to_global()), np.array(want, dtype))


def test_sum_of_bools_counts_like_numpy() -> None:
    full = np.array([[True, True], [True, False]])
    x = shardsim.shard(full, shardsim.Mesh(X=2), "A_X B")
    y = shardsim.all_reduce(x.sum(0), "X")
    same_bits(np.asarray(consistent(y).to_global()), np.sum(full, axis=0))


def test_elementwise_dtypes_numpy_refuses() -> None:
    mesh = shardsim.Mesh(X=2)
    b = shardsim.shard(np.array([True, False]), mesh, "A_X")
    with pytest.raises(DtypeError, match=r"array\[A_X\] \(2,\) - array\[A_X\] \(2,\): NumPy refuses") as e:
        _ = b - b
    assert isinstance(e.value, TypeError)  # as NumPy's own refusal is
    with pytest.raises(DtypeError, match="the result would have dtype object"):
        _ = b + None
    with pytest.raises(DtypeError, match="NumPy refuses"):
        _ = shardsim.shard(np.zeros(2, np.int8), mesh, "A") + 300


def test_shape_only_results_declare_numpys_dtype() -> None:
    mesh = shardsim.Mesh(X=2)
    ints = shardsim.shard(shardsim.ShapeDtype((4,), "int32"), mesh, "A_X")
    assert (ints / ints).dtype == np.float64 and (ints / 2).dtype == np.float64 and (ints * 2).dtype == np.int32
    real = shardsim.shard(np.ones(4, np.int32), mesh, "A_X")
    assert (real / real).dtype == (ints / ints).dtype


def test_transpose_without_order_reverses_like_numpy() -> None:
    full = np.arange(24.0).reshape(2, 3, 4)
    x = shardsim.shard(full, shardsim.Mesh(X=2), "A_X B C")
    y = x.transpose()
    assert str(y.layout) == "[C, B, A_X]"
    same_bits(np.asarray(y.to_global()), full.transpose())


@pytest.mark.parametrize(("la", "lb", "k"), [("M_X K", "K N", 0), ("M K", "K N_{X}", 0), ("M K", "K N_X", 3)])
def test_matmul_with_zero_size_dimensions(la: str, lb: str, k: int) -> None:
    """The one-large-matmul paths reshape the chips' blocks; a zero-size dimension must not confuse them."""
    mesh = shardsim.Mesh(X=8)
    a, b = np.ones((8 if "M_X" in la else 0, k)), np.ones((k, 8))
    out = shardsim.shard(a, mesh, la) @ shardsim.shard(b, mesh, lb)
    same_bits(np.asarray(out.to_global()), a @ b)


def test_layout_parse_with_an_empty_axis_name_terminates() -> None:
    """An empty name among the axes once made the subscript splitter loop forever."""
    assert str(Layout.parse("A_X", ["", "X"])) == "[A_X]"
    with pytest.raises(shardsim.LayoutParseError, match="'Q' is not a mesh axis"):
        Layout.parse("A_Q", [""])


@pytest.mark.parametrize("name", ["nonsense", "{'': None}", "i4,f8", "U5", "object", "datetime64[s]"])
def test_dtype_names_that_are_not_numeric_dtypes(name: str) -> None:
    x = shardsim.shard(np.ones(2), shardsim.Mesh(X=2), "A_X")
    with pytest.raises(shardsim.ShardingError, match=r"unknown dtype|is not numeric"):
        shardsim.cast(x, name)
