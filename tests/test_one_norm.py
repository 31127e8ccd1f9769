"""The one sharded norm (``shardsim.strategies.norms``) against the one single-device norm
(``shardsim.models.reference_norm``) and finite differences: LayerNorm and RMSNorm, with and without beta, on
replicated, sequence-parallel, data-parallel and mixed layouts.

Expected values: ``shardsim.models.reference_norm``'s NumPy norms, central differences of the sharded forward
itself, and the order of floating-point operations written out in NumPy below.
"""

from __future__ import annotations

import numpy as np
import pytest

import shardsim as ss
from finite_differences import numeric_grad
from shardsim import norm
from shardsim.models import reference_pieces
from shardsim.strategies import norms, tp_sp
from shardsim.transformer import norms as transformer_norms

EPS = 1e-5

# (mesh, layout of x [.., D]): D is never split; the tokens are split or not.
LAYOUTS = [
    ({"Y": 2}, "[S, D]"),  # tp_ln: every chip holds every token
    ({"Y": 2}, "[S_Y, D]"),  # tp_sp: the tokens split over the sequence
    ({"Y": 3}, "[S_Y, D]"),
    ({"X": 2}, "[B_X, S, D]"),  # data parallel
    ({"X": 2, "Y": 2}, "[B_X, S_Y, D]"),  # data and sequence parallel
    ({"X": 2, "Y": 2}, "[B, S_Y, D]"),  # replicated over X
    ({"X": 2, "Y": 3}, "[S_{X,Y}, D]"),  # the sequence over two axes
]
# (kind, with beta): RMSNorm has no beta.
KINDS = [("layernorm", True), ("layernorm", False), ("rmsnorm", False)]


def shape_of(layout: str) -> tuple[int, ...]:
    return (2, 6, 5) if ss.Layout.parse(layout).rank == 3 else (6, 5)


def inputs(layout: str, seed: int = 0, dtype: str = "float64") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = shape_of(layout)
    return {
        "x": (3.0 * rng.standard_normal(shape) + 1.0).astype(dtype),  # a mean to take away
        "gamma": (1.0 + 0.5 * rng.standard_normal(shape[-1])).astype(dtype),
        "beta": rng.standard_normal(shape[-1]).astype(dtype),
        "dy": rng.standard_normal(shape).astype(dtype),
    }


def sharded(mesh: ss.Mesh, layout: str, v: dict[str, np.ndarray]) -> dict[str, ss.ShardedArray]:
    return {
        "x": ss.shard(v["x"], mesh, layout, label="x"),
        "dy": ss.shard(v["dy"], mesh, layout, label="dy"),
        "gamma": ss.shard(v["gamma"], mesh, "[D]", label="gamma"),
        "beta": ss.shard(v["beta"], mesh, "[D]", label="beta"),
    }


def single_device(kind: str, has_beta: bool, v: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``shardsim.models.reference_norm``'s forward and ``(dx, {"gamma", "beta"})``."""
    if kind == "layernorm":
        beta = v["beta"] if has_beta else np.zeros_like(v["beta"])
        dx, dgamma, dbeta = norm.layer_norm_backward(v["x"], v["gamma"], v["dy"], EPS)
        return norm.layer_norm(v["x"], v["gamma"], beta, EPS), {"x": dx, "gamma": dgamma, "beta": dbeta}
    dx, dgamma = norm.rms_norm_backward(v["x"], v["gamma"], v["dy"], EPS)
    return norm.rms_norm(v["x"], v["gamma"], EPS), {"x": dx, "gamma": dgamma}


def reduced(g: ss.ShardedArray) -> np.ndarray:
    """A weight's gradient summed over the chips' tokens, as the caller reduces it."""
    return (ss.all_reduce(g, tuple(g.layout.partial)) if g.is_partial else g).to_global()


def run(kind: str, has_beta: bool, mesh: ss.Mesh, layout: str, v: dict[str, np.ndarray], **kw):
    a = sharded(mesh, layout, v)
    beta = a["beta"] if has_beta else None
    y = norms.forward(kind, a["x"], a["gamma"], beta, EPS, **kw)
    dx, grads = norms.backward(kind, a["x"], a["gamma"], a["dy"], EPS, **kw)
    assert y.layout == a["x"].layout and dx.layout == a["x"].layout  # local: the tokens stay put
    return y.to_global(), {"x": dx.to_global(), **{k: reduced(g) for k, g in grads.items()}}


@pytest.mark.parametrize(("axes", "layout"), LAYOUTS)
@pytest.mark.parametrize(("kind", "has_beta"), KINDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_sharded_norm_equals_the_single_device_norm(axes, layout, kind, has_beta, dtype) -> None:
    v = inputs(layout, dtype=dtype)
    y, grads = run(kind, has_beta, ss.Mesh(**axes), layout, v)
    want_y, want = single_device(kind, has_beta, v)
    assert sorted(grads) == sorted(want)
    rtol = 1e-5 if dtype == "float32" else 1e-13  # the same maths; 1/D multiplied, not divided
    for name, got, expected in [("y", y, want_y), *((k, grads[k], want[k]) for k in want)]:
        assert got.dtype == expected.dtype, name
        scale = float(np.abs(expected).max())
        np.testing.assert_allclose(got, expected, rtol=0, atol=rtol * scale, err_msg=f"{kind} {layout} {name}")


@pytest.mark.parametrize(("axes", "layout"), LAYOUTS[1::2])
@pytest.mark.parametrize(("kind", "has_beta"), KINDS)
def test_the_sharded_backward_matches_finite_differences(axes, layout, kind, has_beta) -> None:
    mesh = ss.Mesh(**axes)
    v = inputs(layout, seed=1)
    _, grads = run(kind, has_beta, mesh, layout, v)

    def loss() -> float:
        a = sharded(mesh, layout, v)
        y = norms.forward(kind, a["x"], a["gamma"], a["beta"] if has_beta else None, EPS)
        return float((y.to_global() * v["dy"]).sum())

    for name in grads if has_beta else [k for k in grads if k != "beta"]:  # no beta: nothing to perturb
        want = numeric_grad(loss, v[name])
        np.testing.assert_allclose(grads[name], want, rtol=1e-6, atol=1e-7, err_msg=f"{kind} {layout} {name}")


@pytest.mark.parametrize(("axes", "layout"), [LAYOUTS[1], LAYOUTS[4]])
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_the_order_of_operations_is_normalise_then_gamma(axes, layout, kind) -> None:
    """Bit for bit the documented order: ``1/D`` multiplied, eps inside the root, then gamma, then beta."""
    v = inputs(layout, seed=2, dtype="float32")
    a = sharded(ss.Mesh(**axes), layout, v)
    x, gamma, beta, dy = v["x"], v["gamma"], v["beta"], v["dy"]
    inv = np.float32(1.0 / x.shape[-1])
    ln = kind == "layernorm"
    xc = x - x.sum(-1, keepdims=True) * inv if ln else x
    rstd = (1.0 / np.sqrt(((xc * xc).sum(-1, keepdims=True) * inv) + np.float32(EPS))).astype(np.float32)
    xhat = xc * rstd
    want_y = xhat * gamma + beta if ln else xhat * gamma
    g = dy * gamma
    dxhat = g - xhat * ((g * xhat).sum(-1, keepdims=True) * inv)
    if ln:
        dxhat = dxhat - g.sum(-1, keepdims=True) * inv
    y = norms.forward(kind, a["x"], a["gamma"], a["beta"] if ln else None, EPS)
    dx, _ = norms.backward(kind, a["x"], a["gamma"], a["dy"], EPS)
    np.testing.assert_array_equal(y.to_global(), want_y)
    np.testing.assert_array_equal(dx.to_global(), dxhat * rstd)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_kept_statistics_give_the_recomputed_answer_bit_for_bit(kind: str) -> None:
    mesh, layout = ss.Mesh(Y=2), "[S_Y, D]"
    v = inputs(layout, seed=3)
    a = sharded(mesh, layout, v)
    stats = norms.statistics(kind, a["x"], EPS)
    assert (stats.mu is None) == (kind == "rmsnorm")
    assert stats.rstd.global_shape == (6, 1) and stats.rstd.layout == ss.Layout.parse("[S_Y, D]")
    y_kept, kept = run(kind, True, mesh, layout, v, stats=stats)
    y, recomputed = run(kind, True, mesh, layout, v)
    np.testing.assert_array_equal(y_kept, y)
    assert sorted(kept) == sorted(recomputed)
    for k in kept:
        np.testing.assert_array_equal(kept[k], recomputed[k], err_msg=k)


def test_the_mlp_schemes_and_the_transformer_use_the_one_norm() -> None:
    # the transformer's module names the same functions; the references the same NumPy ones
    for name in ("forward", "backward", "statistics", "normalized", "Stats"):
        assert getattr(transformer_norms, name) is getattr(norms, name)
    for name in ("layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward"):
        assert getattr(reference_pieces, name) is getattr(norm, name)
    # tp_ln / tp_sp's LayerNorm is the sharded norm's, statistics kept for the backward pass
    mesh, layout = ss.Mesh(Y=2), "[S_Y, D]"
    v = inputs(layout, seed=4)
    a = sharded(mesh, layout, v)
    y, saved = tp_sp.layer_norm(a["x"], a["gamma"], a["beta"])
    assert y.label == "LN out" and set(saved) == {"LN in", "mu", "rstd"}
    assert saved["mu"].label == "mu" and saved["rstd"].label == "rstd"
    np.testing.assert_array_equal(
        y.to_global(), norms.forward("layernorm", a["x"], a["gamma"], a["beta"], EPS).to_global()
    )
    dx, grads = tp_sp.layer_norm_backward(saved, a["dy"], a["gamma"])
    want_dx, want = norms.backward("layernorm", a["x"], a["gamma"], a["dy"], EPS)
    assert dx.label == "dx LN" and sorted(grads) == ["beta", "gamma"]
    np.testing.assert_array_equal(dx.to_global(), want_dx.to_global())
    for k in grads:
        np.testing.assert_array_equal(reduced(grads[k]), reduced(want[k]))


@pytest.mark.parametrize(("kind", "step"), [("layernorm", "both sides must be partial sums"), ("rmsnorm", "rsqrt")])
def test_a_split_d_is_refused(kind: str, step: str) -> None:
    """The sums over D are per chip: D split makes the statistics partial sums, refused where used."""
    mesh = ss.Mesh(Y=2)
    x = ss.shard(np.ones((4, 6)), mesh, "[S, D_Y]")
    with pytest.raises(ss.PartialSumError, match=step):
        norms.forward(kind, x, ss.shard(np.ones(6), mesh, "[D_Y]"), None, EPS)
