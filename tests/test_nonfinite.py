"""NaN and infinity go where the single-device reference sends them: every attention kernel
(standard, flash, ring, all-gather) against the plain softmax of ``attention_reference``, the
norms at gains near the float64 limit, and ``run_model`` under random plans against
``shardsim.models.reference``. A value is held by its NaN and ±inf masks, exactly, and its
finite entries to a tight tolerance."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import attention_reference
import shardsim as ss
from shardsim.models import TransformerConfig, reference
from shardsim.models.reference_attention import attention_forward, attention_grads
from shardsim.models.reference_norm import layer_norm
from shardsim.plans import Plan
from shardsim.strategies.context import balanced_order, context_attention, context_attention_backward
from shardsim.transformer import norms
from shardsim.transformer.run import run_model

HUGE = 1e200  # finite, but the product of two overflows float64: a score of ±inf from finite inputs


@contextmanager
def quiet() -> Iterator[None]:
    """Overflow and invalid-operation warnings are what these tests provoke."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def assert_same_nonfinite(got: np.ndarray, want: np.ndarray, name: str, scale: float = 1.0, rtol: float = 1e-9) -> None:
    """NaN exactly where ``want`` is NaN, +inf and -inf exactly where it is; the rest close.

    The finite entries are held relative to the largest of them or ``scale`` (the inputs'
    largest finite entry), so a rounding residue where both should be 0 is not a difference.
    """
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    for mask in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(mask(got), mask(want), err_msg=f"{name}: {mask.__name__} differs")
    finite = np.isfinite(want)
    if finite.any():
        scale = max(float(np.abs(want[finite]).max()), scale)
        np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=rtol * scale, err_msg=name)


# -- attention kernels -----------------------------------------------------------------------------


@st.composite
def plants(draw: st.DrawFn, dims: tuple[int, int, int, int, int]) -> list[tuple[str, tuple, float]]:
    """Values written in turn into the operands, as ``(operand, index, value)``.

    ``nan``/``inf`` land on one entry of q, k, v or the output gradient. ``score`` makes one
    score ±inf from two finite entries whose product overflows (the rest of their column 0, so
    no other score is huge); ``row`` makes every score of one query row -inf (an infinite query
    entry against a key column of -1): the rows that see no finite score.
    """
    b, s, n, kv, h = dims
    kind = draw(st.sampled_from(["nan", "inf", "-inf", "score", "row"]))
    bi, i, head, hi = draw(st.integers(0, b - 1)), draw(st.integers(0, s - 1)), draw(st.integers(0, n - 1)), 0
    group, every = head // (n // kv), slice(None)
    if kind == "score":
        sign, j = draw(st.sampled_from([1.0, -1.0])), draw(st.integers(0, s - 1))
        column = [("q", (bi, every, head, hi), 0.0), ("k", (bi, every, group, hi), 0.0)]
        return [*column, ("q", (bi, i, head, hi), HUGE), ("k", (bi, j, group, hi), sign * HUGE)]
    if kind == "row":
        return [("k", (bi, every, group, hi), -1.0), ("q", (bi, i, head, hi), np.inf)]
    value = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[kind]
    operand = draw(st.sampled_from(["q", "k", "v", "do"] if kind == "nan" else ["q", "k", "v"]))
    width = kv if operand in ("k", "v") else n
    return [(operand, (bi, i, draw(st.integers(0, width - 1)), draw(st.integers(0, h - 1))), value)]


@st.composite
def attention_cases(draw: st.DrawFn) -> tuple:
    kernel = draw(st.sampled_from(["standard", "flash", "ring", "all_gather"]))
    cp = draw(st.sampled_from([2, 3])) if kernel in ("ring", "all_gather") else 1
    causal = kernel == "standard" or draw(st.booleans())  # the standard kernel is causal in arange order
    balanced = kernel in ("ring", "all_gather") and causal and draw(st.booleans())
    kv = draw(st.sampled_from([1, 2]))
    rows = 2 * draw(st.integers(1, 2)) if balanced else draw(st.integers(1, 3))
    dims = (draw(st.integers(1, 2)), cp * rows, kv * draw(st.sampled_from([1, 2])), kv, draw(st.sampled_from([2, 4])))
    return kernel, cp, causal, balanced, dims, draw(plants(dims))


def _kernel(
    kernel: str, cp: int, order: np.ndarray | None, q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray
) -> list[np.ndarray]:
    """``(o, dq, dk, dv)`` of one kernel on global float64 arrays."""
    if kernel == "standard":
        o, saved = attention_forward(q, k, v, causal=order is not None, positions=order)
        return [o, *attention_grads(saved, do)]
    mesh = ss.Mesh(C=cp)
    axis = None if kernel == "flash" else "C"
    layout = "B S N H" if axis is None else "B S_C N H"
    pos = None if order is None else ss.shard(order, mesh, "[S]" if axis is None else "[S_C]", label="positions")
    shard = lambda x: ss.shard(x, mesh, layout)  # noqa: E731
    method = "ring" if kernel == "flash" else kernel
    o, saved = context_attention(shard(q), shard(k), shard(v), pos, axis=axis, causal=order is not None, method=method)
    return [x.to_global() for x in (o, *context_attention_backward(saved, shard(do)))]


def _attend(case: tuple) -> tuple[list[np.ndarray], list[np.ndarray], float]:
    """The kernel's ``(o, dq, dk, dv)``, the plain softmax's, and the inputs' largest finite entry."""
    kernel, cp, causal, balanced, dims, planted = case
    b, s, n, kv, h = dims
    rng = np.random.default_rng(0)
    x = {"q": rng.standard_normal((b, s, n, h)), "do": rng.standard_normal((b, s, n, h))}
    x.update(k=rng.standard_normal((b, s, kv, h)), v=rng.standard_normal((b, s, kv, h)))
    for operand, index, value in planted:
        x[operand][index] = value
    order = (balanced_order(s, cp) if balanced else np.arange(s)) if causal else None
    scale = 1 / np.sqrt(h)
    with quiet():
        want = [attention_reference.attention(x["q"], x["k"], x["v"], order, scale)]
        want += attention_reference.attention_backward(x["q"], x["k"], x["v"], order, scale, x["do"])
        got = _kernel(kernel, cp, order, x["q"], x["k"], x["v"], x["do"])
    return got, want, max(float(np.abs(a[np.isfinite(a)]).max()) for a in x.values())


@settings(max_examples=60, deadline=None, derandomize=True)
@given(attention_cases())
def test_every_attention_kernel_propagates_nan_and_inf_as_the_plain_softmax(case: tuple) -> None:
    got, want, largest = _attend(case)
    for name, g, w in zip(["o", "dq", "dk", "dv"], got, want):
        assert_same_nonfinite(g, w, f"{case[0]} {name}", largest)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(attention_cases(), st.sampled_from([np.inf, -np.inf]), st.integers(0, 3))
def test_an_infinite_output_gradient_is_non_finite_where_the_plain_softmax_is(
    case: tuple, value: float, h: int
) -> None:
    """``delta = rowsum(dO * O)`` (FlashAttention's identity) for the plain ``rowsum(dP * P)``: with
    an infinite ``dO`` entry the two can differ in NaN against ±inf, never in which entries are finite."""
    dims = case[4]
    planted = [("do", (0, dims[1] - 1, dims[2] - 1, h % dims[4]), value)]
    got, want, largest = _attend((*case[:5], planted))
    for name, g, w in zip(["o", "dq", "dk", "dv"], got, want):
        if name in ("o", "dv"):  # no delta in either
            assert_same_nonfinite(g, w, f"{case[0]} {name}", largest)
        else:
            np.testing.assert_array_equal(np.isfinite(g), np.isfinite(w), err_msg=f"{case[0]} {name}")


# -- norms at gains near the float64 limit ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_norms_normalise_before_the_gain_in_the_reference_and_on_chips(kind: str) -> None:
    """``gamma * x`` overflows at these values; ``gamma * xhat`` does not: both sides normalise first."""
    rng = np.random.default_rng(0)
    x = 1e3 * rng.standard_normal((2, 3, 8))
    gamma, beta = np.full(8, 1e307), rng.standard_normal(8)
    want = reference.rms_norm(x, gamma) if kind == "rmsnorm" else layer_norm(x, gamma, beta)
    mesh = ss.Mesh(X=2)
    on_chips = norms.forward(
        kind,
        ss.shard(x, mesh, "B_X S D"),
        ss.shard(gamma, mesh, "D"),
        ss.shard(beta, mesh, "D") if kind == "layernorm" else None,
        1e-5,
    ).to_global()
    assert np.isfinite(want).all() and np.isfinite(on_chips).all()
    np.testing.assert_allclose(on_chips, want, rtol=8 * np.finfo(np.float64).eps, atol=0)


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize(
    "gain, after", [("final_norm.gamma", "lm_head"), ("layers.0.mlp_norm.gamma", "layers.0.mlp.w_in")]
)
def test_run_model_and_the_reference_agree_at_gains_near_the_float64_limit(kind: str, gain: str, after: str) -> None:
    """Inputs of 1e3 times a gain of 1e307 overflow unless normalised first; the next matmul's tiny
    weights bring the loss back to finite values, the same on both sides."""
    cfg = MODEL.scaled(norm=kind, layers=1)
    params = reference.init(cfg, seed=1, dtype="float64")
    params[gain] = np.full_like(params[gain], 1e307)
    params["embed"] *= 1e3
    params[after] *= 1e-300
    tokens, targets = _tokens(cfg, 2)
    with quiet():
        want_loss, want = reference.loss_and_grads(cfg, params, tokens, targets)
    got = run_model(cfg, Plan(), Plan().mesh(), params, tokens, targets)
    assert np.isfinite(want_loss) and got.loss == pytest.approx(want_loss, rel=4 * np.finfo(np.float64).eps)
    assert got.grads is not None
    for key, grad in want.items():
        assert_same_nonfinite(got.grads[key], grad, key)


# -- run_model under random plans against the single-device reference ------------------------------


MODEL = TransformerConfig(layers=2, d_model=8, heads=4, kv_heads=2, d_ff=16, vocab=16, seq=8)


@st.composite
def nonfinite_runs(draw: st.DrawFn) -> tuple[TransformerConfig, Plan, str, tuple, float]:
    """A small model, a random plan of every parallelism and attention, and what to plant where."""
    cfg = MODEL.scaled(
        mlp=draw(st.sampled_from(["gelu", "swiglu"])),
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        position=draw(st.sampled_from(["rope", "learned"])),
    )
    dp, tp, cp, pp = (draw(st.sampled_from([1, 2])) for _ in range(4))
    if dp * tp * cp * pp > 4:
        dp, pp = 1, 1
    plan = Plan(
        dp=dp,
        zero=draw(st.integers(0, 3)) if dp > 1 else 0,
        tp=tp,
        sp=tp > 1 and draw(st.booleans()),
        cp=cp,
        cp_method=draw(st.sampled_from(["ring", "all_gather"])),
        cp_balanced=draw(st.booleans()),
        pp=pp,
        microbatches=pp,
        attention=draw(st.sampled_from(["flash", "standard"])),
    )
    where = draw(st.sampled_from(["weight", "query or key weight", "embedding", "scores"]))
    if where == "query or key weight":  # a NaN that reaches the scores but not the values
        where, names = "weight", [f"layers.{i}.attn.{w}" for i in range(cfg.layers) for w in ("wq", "wk")]
    else:
        names = sorted(cfg.param_shapes())
    weight = (draw(st.sampled_from(names)), draw(st.integers(0, 10_000)))
    spot = weight if where == "weight" else (draw(st.integers(0, 7)),)
    return cfg, plan, where, spot, draw(st.sampled_from([np.nan, np.inf, -np.inf]))


def _tokens(cfg: TransformerConfig, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Even sequences read the first half of the vocabulary, odd ones the second: a value planted in
    an even sequence's embedding row leaves the odd sequences' rows of the gradient finite."""
    rng = np.random.default_rng(0)
    half = np.where(np.arange(b)[:, None] % 2, cfg.vocab // 2, 0)
    return tuple(half + rng.integers(0, cfg.vocab // 2, (b, cfg.seq)) for _ in range(2))  # type: ignore[return-value]


def _planted(cfg: TransformerConfig, where: str, spot: tuple, value: float, tokens: np.ndarray) -> dict:
    params = reference.init(cfg, seed=1, dtype="float64")
    if where == "weight":
        key, index = spot
        params[key].reshape(-1)[index % params[key].size] = value
    elif where == "embedding":  # a row a token of the first sequence reads
        params["embed"][tokens[0, spot[0]], spot[0] % cfg.d_model] = value
    else:  # queries and keys of layer 0 so large that their products, the scores, overflow to ±inf
        for name in ("layers.0.attn.wq", "layers.0.attn.wk"):
            params[name] *= HUGE
    return params


@settings(max_examples=20, deadline=None, derandomize=True)
@given(nonfinite_runs())
@example((MODEL, Plan(attention="flash"), "weight", ("layers.0.attn.wq", 0), np.nan))  # NaN scores, finite values
@example((MODEL, Plan(cp=2), "weight", ("layers.1.attn.wk", 3), np.nan))
@example((MODEL, Plan(cp=2, cp_method="all_gather", cp_balanced=False), "weight", ("layers.0.attn.wq", 5), np.nan))
def test_run_model_puts_nan_and_inf_where_the_reference_does(run: tuple) -> None:
    cfg, plan, where, spot, value = run
    tokens, targets = _tokens(cfg, 2 * plan.dp * plan.microbatches)
    params = _planted(cfg, where, spot, value, tokens)
    with quiet():
        want_loss, want = reference.loss_and_grads(cfg, params, tokens, targets)
        got = run_model(cfg, plan, plan.mesh(), params, tokens, targets)
    assert got.grads is not None and sorted(got.grads) == sorted(want)
    largest = max(float(np.abs(p[np.isfinite(p)]).max(initial=1.0)) for p in params.values())
    assert_same_nonfinite(np.array(got.loss), np.array(want_loss), f"loss under {plan}", largest)
    for key, grad in want.items():
        assert_same_nonfinite(got.grads[key], grad, f"{key} under {plan}", largest)
