"""Local ops: every legal sharded matmul equals the global matmul; illegal ones are refused.

Tolerances come from the dtype and the contraction length (``shardsim.dtypes.tolerance``)
applied to ``|A| @ |B|``, the bound on a floating-point dot product in any summation order.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardsim
from shardsim import Layout, MatmulShardingError, Mesh, PartialSumError
from shardsim.activations import get as get_activation
from strategies_core import MatmulCase, all_chips, assert_close, cases, deep, legal_matmuls, meshes, random_array, seeds

MODES = (
    "all_reduce",
    "one_axis_at_a_time",
    "reduce_scatter_M",
    "reduce_scatter_N",
    "scatter_one_reduce_rest",
    "compact_first",
    "local_sum",
)


def _check(c: MatmulCase, got: np.ndarray) -> None:
    a64, b64 = c.a.astype(np.float64), c.b.astype(np.float64)
    assert_close(got, a64 @ b64, np.abs(a64) @ np.abs(b64), c.a.dtype, c.a.shape[-1])


def _reduce(p: shardsim.ShardedArray, c: MatmulCase, mode: str) -> np.ndarray:
    """The global value of a partial product, cleared the way ``mode`` says."""
    axes = c.k_axes
    arg = axes[0] if len(axes) == 1 else axes
    if mode == "all_reduce":
        out = shardsim.all_reduce(p, arg)
    elif mode == "one_axis_at_a_time":
        out = p
        for ax in reversed(axes):
            out = shardsim.all_reduce(out, ax)
    elif mode in ("reduce_scatter_M", "reduce_scatter_N"):
        out = shardsim.reduce_scatter(p, arg, mode[-1])
        assert out.layout.dim_axes(mode[-1])[-len(axes) :] == axes
    elif mode == "scatter_one_reduce_rest":  # ReduceScatter over one K axis, AllReduce the others
        out = shardsim.reduce_scatter(p, axes[-1], "N")
        if len(axes) > 1:
            out = shardsim.all_reduce(out, axes[:-1])
    elif mode == "compact_first":
        p.compact()  # materialise the chips' partials, then reduce them the plain way
        out = shardsim.all_reduce(p, arg)
    else:  # local_sum: add every chip's block by hand, the definition of {U_K}
        total = np.zeros(p.local_shape, np.float64)
        fixed = {a: 0 for a in c.mesh.axis_names if a not in axes}
        for chip in all_chips(c.mesh):
            if all(chip[a] == v for a, v in fixed.items()):
                total += p.local(**chip)
        assert p.local_shape == p.global_shape  # only K split: each chip holds a full-size partial
        return total
    assert not out.is_partial
    return out.to_global()


@deep
@given(legal_matmuls(), st.sampled_from(MODES))
def test_legal_matmul_equals_global(c: MatmulCase, mode: str) -> None:
    x = shardsim.shard(c.a, c.mesh, c.la)
    w = shardsim.shard(c.b, c.mesh, c.lb)
    p = x @ w
    want = Layout(c.la.dims[:-1] + (c.lb.dims[-1],), c.k_axes)
    assert p.layout == want
    assert p.global_shape == c.a.shape[:-1] + c.b.shape[-1:]
    if not c.k_axes:  # case 1: no communication
        _check(c, p.to_global())
        return
    if mode == "local_sum" and any(d.axes for d in p.layout.dims):
        mode = "all_reduce"
    _check(c, _reduce(p, c, mode))


@deep
@given(legal_matmuls(batch=True), st.sampled_from(MODES[:-1]))
def test_batched_matmul(c: MatmulCase, mode: str) -> None:
    p = shardsim.shard(c.a, c.mesh, c.la) @ shardsim.shard(c.b, c.mesh, c.lb)
    _check(c, _reduce(p, c, mode) if c.k_axes else p.to_global())


@given(legal_matmuls(batch=True, rhs_batched=False), st.sampled_from(MODES[:-1]))
def test_batched_lhs_times_matrix(c: MatmulCase, mode: str) -> None:
    p = shardsim.shard(c.a, c.mesh, c.la) @ shardsim.shard(c.b, c.mesh, c.lb)
    _check(c, _reduce(p, c, mode) if c.k_axes else p.to_global())


@deep
@given(legal_matmuls(split_k=True))
def test_lazy_fold_and_materialised_partials_agree(c: MatmulCase) -> None:
    arg = c.k_axes if len(c.k_axes) > 1 else c.k_axes[0]
    x, w = shardsim.shard(c.a, c.mesh, c.la), shardsim.shard(c.b, c.mesh, c.lb)
    lazy = shardsim.all_reduce(x @ w, arg)
    eager = x @ w
    eager.compact()
    eager = shardsim.all_reduce(eager, arg)
    for chip in all_chips(c.mesh):  # the lazy result's per-chip block also matches
        a64 = np.abs(c.a.astype(np.float64))
        scale = np.max(a64) * np.max(np.abs(c.b)) * c.a.shape[-1]
        assert_close(lazy.local(**chip), eager.local(**chip), np.full(lazy.local_shape, scale), c.a.dtype, 1)
    _check(c, lazy.to_global())
    _check(c, eager.to_global())


@given(legal_matmuls())
def test_transpose_of_a_partial_product(c: MatmulCase) -> None:
    p = (shardsim.shard(c.a, c.mesh, c.la) @ shardsim.shard(c.b, c.mesh, c.lb)).T
    assert p.layout.partial == c.k_axes
    arg = c.k_axes if len(c.k_axes) > 1 else (c.k_axes[0] if c.k_axes else None)
    got = (shardsim.all_reduce(p, arg) if arg else p).to_global()
    a64, b64 = c.a.astype(np.float64), c.b.astype(np.float64)
    assert_close(got, (a64 @ b64).T, (np.abs(a64) @ np.abs(b64)).T, c.a.dtype, c.a.shape[-1])


def test_partial_operand_times_replicated_matrix() -> None:
    # [B, D]{U_X} @ [D, F_Y] -> [B, F_Y]{U_X}: the sum of a's blocks, times b
    mesh = Mesh(X=3, Y=2)
    rng = np.random.default_rng(1)
    blocks = rng.standard_normal((3, 1, 4, 5))
    b = rng.standard_normal((5, 6))
    full = np.broadcast_to(blocks, (3, 2, 4, 5))  # replicated over Y: every Y chip holds the same block
    p = shardsim.from_local(full, mesh, "[B, D]{U_X}") @ shardsim.shard(b, mesh, "D F_Y")
    assert str(p.layout) == "[B, F_Y]{U_X}"
    got = shardsim.all_reduce(p, "X").to_global()
    want = blocks[:, 0].sum(axis=0) @ b
    assert_close(got, want, np.abs(blocks[:, 0]).sum(axis=0) @ np.abs(b), np.float64, 15)


# -- illegal cases ---------------------------------------------------------------------------------
@st.composite
def illegal_matmuls(draw: st.DrawFn) -> tuple[Mesh, str, str, list[str]]:
    """An illegal pair of layouts on a mesh with at least two axes, and the words the error must say."""
    mesh = draw(meshes(min_axes=2))
    x, y = draw(st.permutations(mesh.axis_names))[:2]
    kind = draw(st.sampled_from(["case2_left", "case2_right", "case4", "mismatch", "both_partial"]))
    return {
        "case2_left": (mesh, f"B D_{{{x}}}", "D F", ["case 2", "AllGather it first", "left operand"]),
        "case2_right": (mesh, "B D", f"D_{{{x}}} F", ["case 2", "AllGather it first", "right operand"]),
        "case4": (mesh, f"B_{{{x}}} D", f"D F_{{{x}}}", ["case 4", "diagonal", "AllGather one of them"]),
        "mismatch": (mesh, f"B D_{{{x}}}", f"D_{{{y}}} F", ["split differently", "AllGather one side"]),
        "both_partial": (mesh, f"[B, D]{{U_{{{x}}}}}", f"[D, F]{{U_{{{x}}}}}", ["both operands", "AllReduce one"]),
    }[kind]


@deep
@given(illegal_matmuls(), seeds)
def test_illegal_matmuls_are_refused(case: tuple[Mesh, str, str, list[str]], seed: int) -> None:
    mesh, la, lb, words = case
    n = mesh.size
    lay_a, lay_b = Layout.parse(la, mesh.axis_names), Layout.parse(lb, mesh.axis_names)

    def make(lay: Layout, shape: tuple[int, int]) -> shardsim.ShardedArray:
        if lay.partial:  # varies along the partial axis only
            stored = tuple(s if a in lay.partial else 1 for a, s in zip(mesh.axis_names, mesh.shape))
            blocks = np.broadcast_to(random_array(stored + shape, np.float64, seed), mesh.shape + shape)
            return shardsim.from_local(blocks, mesh, lay)
        return shardsim.shard(random_array(shape, np.float64, seed), mesh, lay)

    a = make(lay_a, (n, n))
    b = make(lay_b, (n, n))
    with pytest.raises(MatmulShardingError) as info:
        a @ b
    for w in words:
        assert w in str(info.value)


def test_matmul_shape_and_type_errors() -> None:
    mesh = Mesh(X=2)
    a = shardsim.shard(np.ones((2, 4)), mesh, "B D")
    with pytest.raises(shardsim.ShapeError, match=r"shapes \(2, 4\) and \(3, 2\) do not fit"):
        a @ shardsim.shard(np.ones((3, 2)), mesh, "D F")
    with pytest.raises(shardsim.ShardingError, match="shard it first"):
        np.ones((3, 2)) @ a
    with pytest.raises(shardsim.ShardingError, match="matmul needs two ShardedArrays"):
        shardsim.matmul(a, np.ones((4, 2)))  # type: ignore[arg-type]


# -- elementwise, activations, reductions -------------------------------------------------------------
@given(cases(), st.sampled_from(["+", "-", "*", "/"]))
def test_elementwise_matches_numpy(case, sym: str) -> None:  # type: ignore[no-untyped-def]
    a = case.array
    b = random_array(a.shape, a.dtype, 3)
    b = np.where(np.abs(b) < 0.1, 1.0, b).astype(a.dtype)
    x, y = shardsim.shard(a, case.mesh, case.layout), shardsim.shard(b, case.mesh, case.layout)
    ops = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}
    got = {"+": x + y, "-": x - y, "*": x * y, "/": x / y}[sym]
    assert got.layout == case.layout
    np.testing.assert_array_equal(got.to_global(), ops[sym](a, b))  # one rounding each: exact
    np.testing.assert_array_equal((x * 2.0).to_global(), a * 2.0)
    np.testing.assert_array_equal((-x).to_global(), -a)
    np.testing.assert_array_equal((1.0 - x).to_global(), 1.0 - a)


@given(cases(), st.sampled_from(["identity", "relu", "gelu"]))
def test_activations_match_the_formula(case, name: str) -> None:  # type: ignore[no-untyped-def]
    a = case.array.astype(np.float64)
    x = shardsim.shard(a, case.mesh, case.layout)
    formula = {
        "identity": a,
        "relu": np.maximum(a, 0.0),
        "gelu": 0.5 * a * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (a + 0.044715 * a**3))),
    }[name]
    got = shardsim.activation(x, name).to_global()
    np.testing.assert_allclose(got, formula, rtol=shardsim.dtypes.tolerance(np.float64, 1), atol=0)
    # the derivative against a central difference
    h = 1e-6
    fd = (get_activation(name).fn(a + h) - get_activation(name).fn(a - h)) / (2 * h)
    smooth = np.abs(a) > 1e-3  # relu has a kink at 0
    grad = shardsim.activation_grad(x, name).to_global()
    np.testing.assert_allclose(grad[smooth], fd[smooth], rtol=1e-6, atol=1e-8)


def test_partial_sum_rules_for_elementwise_ops() -> None:
    mesh = Mesh(X=2)
    blocks = np.array([[[1.0, 2.0]], [[3.0, 4.0]]])
    p = shardsim.from_local(blocks, mesh, "[B, D]{U_X}")
    q = shardsim.from_local(blocks * 10, mesh, "[B, D]{U_X}")
    r = shardsim.shard(np.array([[2.0, 3.0]]), mesh, "B D")
    np.testing.assert_array_equal(shardsim.all_reduce(p + q, "X").to_global(), [[44.0, 66.0]])
    np.testing.assert_array_equal(shardsim.all_reduce(p * r, "X").to_global(), [[8.0, 18.0]])
    np.testing.assert_array_equal(shardsim.all_reduce(p / 2.0, "X").to_global(), [[2.0, 3.0]])
    np.testing.assert_array_equal(shardsim.all_reduce(shardsim.activation(p, "identity"), "X").to_global(), [[4, 6]])
    with pytest.raises(PartialSumError, match="added once per chip"):
        p + 1.0
    with pytest.raises(PartialSumError, match="both sides must be partial sums over the same axes"):
        p + r
    with pytest.raises(PartialSumError, match="product of two partial sums"):
        p * q
    with pytest.raises(PartialSumError, match="cannot divide by a partial sum"):
        r / p


@given(cases(min_split=1))
def test_sum_over_a_split_dim_is_a_partial(case) -> None:  # type: ignore[no-untyped-def]
    x = shardsim.shard(case.array, case.mesh, case.layout)
    dim = next(i for i, d in enumerate(case.layout.dims) if d.axes)
    axes = case.layout.dims[dim].axes
    s = x.sum(dim)
    assert s.layout.partial == axes
    arg = axes if len(axes) > 1 else axes[0]
    got = shardsim.all_reduce(s, arg).to_global()
    a64 = case.array.astype(np.float64)
    assert_close(got, a64.sum(axis=dim), np.abs(a64).sum(axis=dim), case.array.dtype, case.array.shape[dim])


@given(cases(rank=st.integers(2, 3)))
def test_transpose_keeps_each_dims_sharding(case) -> None:  # type: ignore[no-untyped-def]
    x = shardsim.shard(case.array, case.mesh, case.layout)
    np.testing.assert_array_equal(x.T.to_global(), np.swapaxes(case.array, -1, -2))
    assert x.T.layout.dims == case.layout.dims[:-2] + case.layout.dims[-2:][::-1]
    order = tuple(reversed(range(case.array.ndim)))
    np.testing.assert_array_equal(x.transpose(*order).to_global(), case.array.transpose(order))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cast(dtype: str) -> None:
    mesh = Mesh(X=2)
    a = np.linspace(-2, 2, 8)
    x = shardsim.shard(a, mesh, "D_X", label="W", category="params")
    y = shardsim.cast(x, dtype)
    dt = shardsim.dtypes.resolve_dtype(dtype)
    assert y.dtype == dt and (y.label, y.category, y.layout) == ("W", "params", x.layout)
    np.testing.assert_array_equal(y.to_global(), a.astype(dt))
    assert mesh.memory.live("params").tolist() == [32 + 4 * dt.itemsize] * 2


def test_same_program_twice_is_bitwise_equal() -> None:
    def program() -> list[np.ndarray]:
        rng = np.random.default_rng(11)
        mesh = Mesh(X=4, Y=2)
        x = shardsim.shard(rng.standard_normal((16, 64)).astype(np.float32), mesh, "B_Y D_X")
        w = shardsim.shard(rng.standard_normal((64, 32)).astype(np.float32), mesh, "D_X F")
        p = x @ w
        eager = x @ w
        eager.compact()
        return [
            shardsim.all_reduce(p, "X").to_global(),
            shardsim.reduce_scatter(p, "X", "F").to_global(),
            shardsim.all_reduce(eager, "X").to_global(),
            shardsim.activation(shardsim.all_reduce(p, "X"), "gelu").to_global(),
        ]

    for first, second in zip(program(), program()):
        assert np.array_equal(first, second)
