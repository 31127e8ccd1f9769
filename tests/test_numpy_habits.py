"""NumPy habits: np.asarray, np.allclose, ufuncs, basic indexing, astype, one mixed-dtype rule,
lazy submodules and modules that no function shadows."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import subprocess
import sys
import types

import ml_dtypes
import numpy as np
import pytest

import shardsim
from shardsim import Mesh

MESH = Mesh(X=2, Y=2)


def value(a: np.ndarray, layout: str = "B_X D") -> shardsim.ShardedArray:
    return shardsim.shard(a, MESH, layout)


A = np.arange(24.0).reshape(4, 6) - 7.5


def test_asarray_and_allclose_see_the_global_array() -> None:
    x = value(A, "B_X D_Y")
    got = np.asarray(x)
    assert got.dtype == A.dtype and got.shape == A.shape
    np.testing.assert_array_equal(got, A)
    assert np.allclose(x, A) and not np.allclose(x, A + 1)
    assert np.asarray(x, dtype=np.float32).dtype == np.float32


def test_asarray_refuses_partial_sums_and_shape_only_values() -> None:
    mesh = Mesh(X=2)
    p = shardsim.from_local(np.ones((2, 1, 3)), mesh, "[A, B]{U_X}")
    with pytest.raises(shardsim.PartialSumError, match=r"all_reduce\(x, 'X'\)"):
        np.asarray(p)
    with pytest.raises(shardsim.PartialSumError):
        np.allclose(p, 2.0)
    s = shardsim.shard(shardsim.ShapeDtype((4, 4)), mesh, "B_X D")
    with pytest.raises(shardsim.ShapeOnlyError):
        np.asarray(s)


@pytest.mark.parametrize("ufunc", [np.exp, np.negative, np.abs, np.sqrt, np.tanh, np.sign])
def test_unary_ufuncs_run_per_chip_and_keep_the_layout(ufunc: np.ufunc) -> None:
    x = value(A, "B_X D_Y")
    with np.errstate(invalid="ignore"):
        y = ufunc(x)
        want = ufunc(A)
    assert isinstance(y, shardsim.ShardedArray) and y.layout == x.layout and y.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(y), want)


@pytest.mark.parametrize("ufunc", [np.add, np.maximum, np.power, np.remainder, np.arctan2, np.hypot])
def test_binary_ufuncs_and_scalars(ufunc: np.ufunc) -> None:
    x, y = value(A), value(A[::-1].copy())
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(np.asarray(ufunc(x, y)), ufunc(A, A[::-1]))
    np.testing.assert_array_equal(np.asarray(ufunc(x, 2.0)), ufunc(A, 2.0))
    np.testing.assert_array_equal(np.asarray(ufunc(3, x)), ufunc(3, A))


def test_operators_numpy_users_reach_for() -> None:
    x = value(A)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(np.asarray(2 / x), 2 / A)
    np.testing.assert_array_equal(np.asarray(x % 2), A % 2)
    np.testing.assert_array_equal(np.asarray(7 % x), 7 % A)
    np.testing.assert_array_equal(np.asarray(x // 3), A // 3)
    np.testing.assert_array_equal(np.asarray(x**2), A**2)
    np.testing.assert_array_equal(np.asarray(abs(x)), abs(A))


def test_ufuncs_on_partial_sums_only_where_the_sum_survives() -> None:
    mesh = Mesh(X=2)
    blocks = np.array([[[1.0, -2.0]], [[3.0, 5.0]]])
    p = shardsim.from_local(blocks, mesh, "[A, B]{U_X}")
    total = blocks.sum(axis=0)
    np.testing.assert_array_equal(np.asarray(shardsim.all_reduce(np.negative(p), "X")), -total)
    for bad in (lambda: np.exp(p), lambda: np.maximum(p, 0.0), lambda: p % 2, lambda: 2 / p, lambda: p**2):
        with pytest.raises(shardsim.PartialSumError):
            bad()


def test_ufunc_methods_and_keywords_raise_a_documented_error() -> None:
    x = value(A)
    for bad in (
        lambda: np.add.reduce(x),
        lambda: np.add(x, x, out=np.empty((4, 6))),
        lambda: np.divmod(x, 2),
        lambda: np.ones((4, 6)) + x,
        lambda: np.ones((6, 2)).T @ x,
    ):
        with pytest.raises(shardsim.ArgumentTypeError):
            bad()


def test_basic_indexing_along_unsharded_dimensions() -> None:
    x = value(A, "B_X D")
    for index in [
        (slice(None), 2),
        (slice(None), slice(1, 5, 2)),
        (Ellipsis, -1),
        (slice(None), slice(None, None, -1)),
    ]:
        y = x[index]
        np.testing.assert_array_equal(np.asarray(y), A[index])
        assert y.layout.dims[0] == x.layout.dims[0]
    assert x[:, 0].layout == shardsim.Layout.parse("[B_X]")
    mesh = Mesh(Y=2)
    p = shardsim.from_local(np.array([[[1.0, 2.0]], [[3.0, 4.0]]]), mesh, "[A, B]{U_Y}")
    np.testing.assert_array_equal(np.asarray(shardsim.all_reduce(p[0, 1:], "Y")), [6.0])


def test_indexing_refuses_clearly() -> None:
    x = value(A, "B_X D")
    with pytest.raises(shardsim.ShardingError, match="split over"):
        x[0]
    with pytest.raises(shardsim.ShapeError, match="out of range"):
        x[:, 6]
    with pytest.raises(shardsim.ArgumentTypeError, match="advanced indexing"):
        x[:, [0, 1]]
    with pytest.raises(shardsim.ShapeError, match="3 entries"):
        x[:, :, 0]


def test_astype_is_cast() -> None:
    x = value(A)
    y = x.astype("bfloat16")
    assert y.dtype == np.dtype(ml_dtypes.bfloat16) and y.layout == x.layout
    np.testing.assert_array_equal(np.asarray(y), A.astype(ml_dtypes.bfloat16))
    with pytest.raises(shardsim.ShardingError, match="unknown dtype"):
        x.astype("nonsense")


@pytest.mark.parametrize(
    ("left", "right"),
    [(np.float32, np.float64), (np.int32, np.float32), (np.int8, np.int64), (np.float16, np.float32)],
)
def test_mixed_dtypes_promote_as_numpy_and_the_trace_shows_the_cast(left: type, right: type) -> None:
    mesh = Mesh(X=2)
    a, b = np.arange(8).reshape(2, 4).astype(left), np.arange(12).reshape(4, 3).astype(right)
    x = shardsim.shard(a, mesh, "B D_X").named("x")
    w = shardsim.shard(b, mesh, "D_X F").named("w")
    with shardsim.trace() as t:
        y = shardsim.all_reduce(x @ w, "X")
    want = a @ b
    assert y.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(y), want)
    converted = [(name, str(want.dtype)) for name, d in (("x", left), ("w", right)) if np.dtype(d) != want.dtype]
    assert [(e.label, e.dtype) for e in t.events if e.op == "cast"] == converted  # int32 @ float32: both
    # elementwise: the same rule, the same trace entries
    other = shardsim.shard(a.astype(right), mesh, "B D_X")
    with shardsim.trace() as t2:
        z = x + other
    assert z.dtype == (a + a.astype(right)).dtype
    assert len([e for e in t2.events if e.op == "cast"]) == (left != z.dtype) + (right != z.dtype)
    np.testing.assert_array_equal(np.asarray(z), a + a.astype(right))


def test_the_cast_event_counts_the_bytes_read_and_written() -> None:
    mesh = Mesh(X=2)
    x = shardsim.shard(np.ones((4, 4), np.float32), mesh, "B D_X")
    w = shardsim.shard(np.ones((4, 2), np.float64), mesh, "D_X F")
    with shardsim.trace() as t:
        x @ w
    (cast,) = [e for e in t.events if e.op == "cast"]
    assert cast.hbm_bytes == 4 * 2 * (4 + 8)  # a (4, 2) block read as float32, written as float64


def test_pairs_follow_numpys_promotion_or_are_refused() -> None:
    mesh = Mesh(X=2)
    x = shardsim.shard(np.ones((2, 2), ml_dtypes.bfloat16), mesh, "B D")
    for other in (np.int32, np.int64, np.float16):
        y = shardsim.shard(np.ones((2, 2), other), mesh, "D F")
        try:  # ml_dtypes' releases differ on which of these pairs promote: the rule is whatever NumPy says
            common = np.result_type(x.dtype, y.dtype)
        except TypeError:
            with pytest.raises(shardsim.DtypeError, match="no common dtype"):
                x @ y
            with pytest.raises(shardsim.DtypeError, match="no common dtype"):
                x + y
        else:
            assert (x @ y).dtype == common and (x + y.T).dtype == common


# -- imports -------------------------------------------------------------------------------
def submodules() -> list[str]:
    """Every module of the package; the JAX engine's only where JAX is installed (it needs it to import)."""
    names = sorted(m.name for m in pkgutil.walk_packages(shardsim.__path__, "shardsim.") if ".__" not in m.name)
    if importlib.util.find_spec("jax") is None:
        names = [n for n in names if not n.startswith("shardsim.engines.jax") and n != "shardsim.training.jax_step"]
    return names


def test_no_public_name_shadows_a_module() -> None:
    for name in submodules():
        parent, _, child = name.rpartition(".")
        module = importlib.import_module(name)
        assert isinstance(module, types.ModuleType)
        assert getattr(importlib.import_module(parent), child) is module, f"{parent}.{child} is not the module"
    import shardsim.resharding as r

    assert isinstance(r, types.ModuleType) and callable(shardsim.reshard) and r.reshard is shardsim.reshard


def fresh(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip()


def test_submodules_load_on_first_use() -> None:
    code = (
        "import sys, shardsim\n"
        "light = not any(m in sys.modules for m in "
        "('shardsim.checkpoint', 'shardsim.training', 'shardsim.cost', 'shardsim.strategies', 'json'))\n"
        "e = shardsim.cost.estimate('ddp', {'X': 8}, 'h100', 8 * 4096, 1024, 4096, efficiency='ideal')\n"
        "print(light, e.bound, shardsim.memory.MemoryLedger.__name__, shardsim.training.Trainer is shardsim.Trainer,"
        " callable(shardsim.checkpoint.save), shardsim.run_strategy.__module__)"
    )
    assert fresh(code) == "True compute MemoryLedger True True shardsim.strategies"


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        shardsim.nonexistent  # noqa: B018
    assert "cost" in dir(shardsim) and "Trainer" in dir(shardsim)


def test_bfloat16_promotes_with_ints_and_float16_as_the_docs_say() -> None:
    # docs/errors.md and docs/design.md: with ml_dtypes >= 0.7 these pairs promote, they are not refused
    mesh = Mesh(X=2)
    b = shardsim.shard(np.ones((2, 2), ml_dtypes.bfloat16), mesh, "B D")
    i = shardsim.shard(np.full((2, 2), 3, np.int32), mesh, "D F")
    h = shardsim.shard(np.ones((2, 2), np.float16), mesh, "B D")
    assert (b @ i).dtype == np.float64 and np.array_equal(np.asarray(b @ i), np.full((2, 2), 6.0))
    assert (b + h).dtype == np.float32 and np.array_equal(np.asarray(b + h), np.full((2, 2), 2.0, np.float32))
