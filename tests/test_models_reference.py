"""The transformer reference against independent checks: finite differences, a per-head loop, the spec's formulas."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from finite_differences import numeric_grad
from fuzz_budget import budget
from shardsim.errors import ConfigError, ShapeError
from shardsim.models import TransformerConfig, get
from shardsim.models import reference as ref

OPTIONS = {
    "mlp": ["gelu", "swiglu"],
    "norm": ["layernorm", "rmsnorm"],
    "position": ["learned", "rope", "none"],
    "bias": [False, True],
    "tie_embeddings": [False, True],
    "kv_heads": [4, 2, 1],  # multi-head, grouped-query, multi-query
    "dropout": [0.0, 0.25],
}
# every pair of option values appears in some row: the configs checked entry by entry
PAIRWISE = [
    ("swiglu", "rmsnorm", "rope", False, False, 2, 0.0),
    ("gelu", "layernorm", "rope", True, True, 1, 0.25),
    ("gelu", "rmsnorm", "learned", False, True, 4, 0.25),
    ("swiglu", "layernorm", "none", True, False, 4, 0.25),
    ("gelu", "rmsnorm", "none", True, True, 2, 0.0),
    ("swiglu", "layernorm", "learned", False, False, 1, 0.0),
    ("swiglu", "layernorm", "learned", True, True, 2, 0.25),
    ("gelu", "rmsnorm", "none", False, False, 1, 0.0),
    ("swiglu", "layernorm", "rope", False, True, 4, 0.0),
]
SEED = 5


def small(row: tuple[Any, ...], **sizes: int) -> TransformerConfig:
    base = {"layers": 2, "d_model": 8, "heads": 4, "d_ff": 8, "vocab": 7, "seq": 6, **sizes}
    return TransformerConfig(**base, **dict(zip(OPTIONS, row)))  # type: ignore[arg-type]


def data(cfg: TransformerConfig, b: int = 2, s: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab, (b, s)), rng.integers(0, cfg.vocab, (b, s))


def test_pairwise_table_covers_every_pair_of_options() -> None:
    values = list(OPTIONS.values())
    for (i, a), (j, b) in itertools.combinations(enumerate(values), 2):
        seen = {(row[i], row[j]) for row in PAIRWISE}
        assert seen == set(itertools.product(a, b)), (list(OPTIONS)[i], list(OPTIONS)[j])


# -- the whole model against finite differences (float64) --------------------------------------
@pytest.mark.parametrize("row", PAIRWISE, ids=lambda r: "-".join(map(str, r)))
def test_every_gradient_entry_matches_finite_differences(row: tuple[Any, ...]) -> None:
    cfg = small(row)
    params = ref.init(cfg, seed=1, dtype="float64")
    tokens, targets = data(cfg)
    value, grads = ref.loss_and_grads(cfg, params, tokens, targets, dropout_seed=SEED)
    assert value == ref.loss(cfg, params, tokens, targets, dropout_seed=SEED)
    assert sorted(grads) == sorted(params)

    def f() -> float:
        return ref.loss(cfg, params, tokens, targets, dropout_seed=SEED)

    for name, w in params.items():
        assert grads[name].shape == w.shape and grads[name].dtype == np.float64
        np.testing.assert_allclose(grads[name], numeric_grad(f, w), rtol=1e-5, atol=1e-8, err_msg=name)


@pytest.mark.parametrize("row", list(itertools.product(*OPTIONS.values())), ids=lambda r: "-".join(map(str, r)))
def test_every_gradient_matches_a_directional_derivative(row: tuple[Any, ...]) -> None:
    """All 288 option combinations: each weight's gradient against the derivative along a random direction."""
    cfg = small(row, layers=2, seq=4)
    params = ref.init(cfg, seed=2, dtype="float64")
    tokens, targets = data(cfg, b=2, s=4, seed=3)
    _, grads = ref.loss_and_grads(cfg, params, tokens, targets, dropout_seed=SEED)
    rng = np.random.default_rng(4)
    eps = 1e-6
    for name, w in params.items():
        u = rng.standard_normal(w.shape)
        w += eps * u
        up = ref.loss(cfg, params, tokens, targets, dropout_seed=SEED)
        w -= 2 * eps * u
        down = ref.loss(cfg, params, tokens, targets, dropout_seed=SEED)
        w += eps * u
        numeric = (up - down) / (2 * eps)
        assert np.sum(grads[name] * u) == pytest.approx(numeric, rel=1e-5, abs=1e-9), name


# -- the forward pass against a per-head loop written from the formulas -------------------------
def _norm(cfg: TransformerConfig, p: dict[str, np.ndarray], prefix: str, x: np.ndarray) -> np.ndarray:
    if cfg.norm == "layernorm":
        return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + cfg.norm_eps) * p[
            f"{prefix}.gamma"
        ] + p[f"{prefix}.beta"]
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + cfg.norm_eps) * p[f"{prefix}.gamma"]


def _rotate(x: np.ndarray, theta: float) -> np.ndarray:
    """RoPE as complex multiplication: pair (x_j, x_{j+H/2}) times exp(i · t · theta^(-2j/H))."""
    h = x.shape[-1]
    z = x[..., : h // 2] + 1j * x[..., h // 2 :]
    t = np.arange(x.shape[-2])[:, None]
    z = z * np.exp(1j * t * theta ** (-2.0 * np.arange(h // 2) / h))
    return np.concatenate([z.real, z.imag], axis=-1)


def naive_logits(cfg: TransformerConfig, p: dict[str, np.ndarray], tokens: np.ndarray, seed: int | None) -> np.ndarray:
    b, s = tokens.shape
    n, k, h = cfg.heads, cfg.n_kv, cfg.hd
    on = seed is not None and cfg.dropout > 0

    def keep(layer: int, site: int, shape: tuple[int, ...]) -> np.ndarray:
        if not on:
            return np.ones(shape)
        return (np.random.default_rng([seed, layer, site]).random(shape) >= cfg.dropout) / (1 - cfg.dropout)

    x = p["embed"][tokens] + (p["pos_embed"][:s] if cfg.position == "learned" else 0)
    for i in range(cfg.layers):
        pre = f"layers.{i}."
        hh = _norm(cfg, p, pre + "attn_norm", x)
        q, kk, v = (hh @ p[pre + f"attn.w{c}"] + p.get(pre + f"attn.b{c}", 0) for c in "qkv")
        probs_keep = keep(i, 0, (b, n, s, s))
        heads = []
        for head in range(n):
            g = head // (n // k)
            qn, kn, vn = q[..., head * h : (head + 1) * h], kk[..., g * h : (g + 1) * h], v[..., g * h : (g + 1) * h]
            if cfg.position == "rope":
                qn, kn = _rotate(qn, cfg.rope_theta), _rotate(kn, cfg.rope_theta)
            z = qn @ kn.transpose(0, 2, 1) / np.sqrt(h)
            z = np.where(np.tril(np.ones((s, s), bool)), z, -np.inf)
            prob = np.exp(z - z.max(-1, keepdims=True))
            prob = prob / prob.sum(-1, keepdims=True)
            heads.append((prob * probs_keep[:, head]) @ vn)
        a = np.concatenate(heads, axis=-1) @ p[pre + "attn.wo"] + p.get(pre + "attn.bo", 0)
        x = x + a * keep(i, 1, (b, s, cfg.d_model))
        hh = _norm(cfg, p, pre + "mlp_norm", x)
        if cfg.mlp == "gelu":
            u = hh @ p[pre + "mlp.w_in"] + p.get(pre + "mlp.b_in", 0)
            act = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u**3)))
            m = act @ p[pre + "mlp.w_out"] + p.get(pre + "mlp.b_out", 0)
        else:
            gate = hh @ p[pre + "mlp.w_gate"] + p.get(pre + "mlp.b_gate", 0)
            up = hh @ p[pre + "mlp.w_up"] + p.get(pre + "mlp.b_up", 0)
            m = (gate / (1 + np.exp(-gate)) * up) @ p[pre + "mlp.w_down"] + p.get(pre + "mlp.b_down", 0)
        x = x + m * keep(i, 2, (b, s, cfg.d_model))
    head_w = p["embed"].T if cfg.tie_embeddings else p["lm_head"]
    return _norm(cfg, p, "final_norm", x) @ head_w


@pytest.mark.parametrize("row", PAIRWISE, ids=lambda r: "-".join(map(str, r)))
def test_forward_equals_a_per_head_loop(row: tuple[Any, ...]) -> None:
    cfg = small(row)
    params = ref.init(cfg, seed=3, dtype="float64")
    tokens, targets = data(cfg)
    for seed in (None, SEED):
        logits = ref.forward(cfg, params, tokens, dropout_seed=seed)
        np.testing.assert_allclose(logits, naive_logits(cfg, params, tokens, seed), rtol=1e-12, atol=1e-12)
        logp = logits - logits.max(-1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
        expected = -np.mean([logp[b, s, targets[b, s]] for b, s in np.ndindex(*targets.shape)])
        assert ref.loss(cfg, params, tokens, targets, dropout_seed=seed) == pytest.approx(expected, rel=1e-12)


def test_grouped_query_attention_is_multi_head_with_replicated_kv_heads() -> None:
    """Megatron's rule: K kv heads serve N/K query heads each, as N heads whose k, v repeat per group."""
    gqa = small(("swiglu", "rmsnorm", "rope", True, False, 2, 0.0))
    mha = gqa.scaled(kv_heads=4)
    p = ref.init(gqa, seed=6, dtype="float64")
    q = dict(p)
    h = gqa.hd
    for i in range(gqa.layers):
        for c in "kv":
            w, bias = p[f"layers.{i}.attn.w{c}"], p[f"layers.{i}.attn.b{c}"]
            cols = np.concatenate([np.arange(g * h, (g + 1) * h) for g in (0, 0, 1, 1)])  # head n uses n // 2
            q[f"layers.{i}.attn.w{c}"], q[f"layers.{i}.attn.b{c}"] = w[:, cols], bias[cols]
    tokens, _ = data(gqa)
    np.testing.assert_allclose(ref.forward(gqa, p, tokens), ref.forward(mha, q, tokens), rtol=1e-12)


def test_tied_head_is_the_untied_head_set_to_embed_transposed() -> None:
    tied = get("gpt-tiny").scaled(dropout=0.0)
    untied = tied.scaled(tie_embeddings=False)
    p = ref.init(tied, seed=1, dtype="float64")
    q = {**p, "lm_head": p["embed"].T.copy()}
    tokens, targets = data(tied)
    np.testing.assert_allclose(ref.forward(tied, p, tokens), ref.forward(untied, q, tokens), rtol=1e-10, atol=1e-13)
    _, g_tied = ref.loss_and_grads(tied, p, tokens, targets)
    _, g_untied = ref.loss_and_grads(untied, q, tokens, targets)
    np.testing.assert_allclose(g_tied["embed"], g_untied["embed"] + g_untied["lm_head"].T, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_causal_a_later_token_never_changes_earlier_logits(name: str) -> None:
    cfg = get(name)
    params = ref.init(cfg, seed=2)
    tokens, _ = data(cfg, b=1, s=8)
    changed = tokens.copy()
    changed[0, 5] = (changed[0, 5] + 1) % cfg.vocab
    a, b = ref.forward(cfg, params, tokens, dropout_seed=1), ref.forward(cfg, params, changed, dropout_seed=1)
    np.testing.assert_array_equal(a[:, :5], b[:, :5])
    assert not np.allclose(a[:, 5:], b[:, 5:])


def test_dropout_runs_only_with_a_seed_and_is_reproducible() -> None:
    cfg = get("gpt-tiny").scaled(dropout=0.1)
    params = ref.init(cfg, seed=0, dtype="float64")
    tokens, _ = data(cfg)
    plain = ref.forward(cfg.scaled(dropout=0.0), params, tokens, dropout_seed=1)
    np.testing.assert_array_equal(ref.forward(cfg, params, tokens), plain)
    one, again = ref.forward(cfg, params, tokens, dropout_seed=1), ref.forward(cfg, params, tokens, dropout_seed=1)
    np.testing.assert_array_equal(one, again)
    assert not np.allclose(one, plain) and not np.allclose(one, ref.forward(cfg, params, tokens, dropout_seed=2))


# -- float32 -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_float32_keeps_float32_and_agrees_with_float64(name: str) -> None:
    cfg = get(name).scaled(dropout=0.1)
    p64 = ref.init(cfg, seed=3, dtype="float64")
    p32 = {k: v.astype(np.float32) for k, v in p64.items()}
    tokens, targets = data(cfg, s=cfg.seq)
    assert ref.forward(cfg, p32, tokens).dtype == np.float32
    l32, g32 = ref.loss_and_grads(cfg, p32, tokens, targets, dropout_seed=4)
    l64, g64 = ref.loss_and_grads(cfg, p64, tokens, targets, dropout_seed=4)
    assert l32 == pytest.approx(l64, rel=1e-5)
    for k in p64:
        assert g32[k].dtype == np.float32, k
        scale = np.abs(g64[k]).max()
        np.testing.assert_allclose(g32[k], g64[k], rtol=0, atol=2e-4 * scale + 1e-7, err_msg=k)


def test_bfloat16_params_give_float32_logits() -> None:
    cfg = get("llama-tiny")
    p = ref.init(cfg, seed=0, dtype="bfloat16")
    tokens, targets = data(cfg)
    assert ref.forward(cfg, p, tokens).dtype == np.float32
    value, grads = ref.loss_and_grads(cfg, p, tokens, targets)
    assert grads["layers.0.attn.wq"].dtype == p["layers.0.attn.wq"].dtype
    p32 = {k: v.astype(np.float32) for k, v in p.items()}  # the same weights, rounded to bfloat16
    assert value == pytest.approx(ref.loss(cfg, p32, tokens, targets), rel=2e-2)


# -- each piece on its own against finite differences ------------------------------------------
def _fd_check(f: Any, inputs: list[np.ndarray], analytic: list[np.ndarray], rtol: float = 1e-6) -> None:
    for x, g in zip(inputs, analytic, strict=True):
        np.testing.assert_allclose(g, numeric_grad(f, x), rtol=rtol, atol=1e-8)


@pytest.mark.parametrize("kv", [4, 2, 1])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("order", ["natural", "permuted"])
@pytest.mark.parametrize("drop", [False, True])
def test_attention_backward_matches_finite_differences(kv: int, causal: bool, order: str, drop: bool) -> None:
    rng = np.random.default_rng(kv)
    q = rng.standard_normal((2, 5, 4, 3))
    k, v = rng.standard_normal((2, 5, kv, 3)), rng.standard_normal((2, 5, kv, 3))
    do = rng.standard_normal(q.shape)
    positions = np.array([3, 0, 4, 1, 2]) if order == "permuted" else None
    keep = ref.dropout_mask(1, 0, "attn_probs", (2, 4, 5, 5), 0.3) if drop else None
    kw: dict[str, Any] = {"causal": causal, "positions": positions, "dropout_keep": keep, "dropout_p": 0.3}

    def f() -> float:
        return float(np.sum(ref.attention(q, k, v, **kw) * do))

    _fd_check(f, [q, k, v], list(ref.attention_backward(q, k, v, do, **kw)))


def test_attention_equals_a_per_head_loop_and_follows_positions() -> None:
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((2, 6, 6, 4)), rng.standard_normal((2, 6, 3, 4)), rng.standard_normal((2, 6, 3, 4))
    o = ref.attention(q, k, v)
    for n in range(6):
        z = q[:, :, n] @ k[:, :, n // 2].transpose(0, 2, 1) / 2.0
        z = np.where(np.tril(np.ones((6, 6), bool)), z, -np.inf)
        prob = np.exp(z - z.max(-1, keepdims=True))
        np.testing.assert_allclose(o[:, :, n], (prob / prob.sum(-1, keepdims=True)) @ v[:, :, n // 2], rtol=1e-12)
    perm = np.array([0, 5, 1, 4, 2, 3])  # a context-parallel order: the rows carry their positions
    permuted = ref.attention(q[:, perm], k[:, perm], v[:, perm], positions=perm)
    np.testing.assert_allclose(permuted, o[:, perm], rtol=1e-12)
    probs = ref.attention_probs(q, k, v)
    assert probs.shape == (2, 6, 6, 6) and np.allclose(probs.sum(-1), 1) and np.all(np.triu(probs[0, 0], 1) == 0)


def test_attention_softmax_runs_in_float32() -> None:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 4, 2, 8)).astype(np.float16) for _ in range(3))
    assert ref.attention_probs(q, k, v).dtype == np.float32 and ref.attention(q, k, v).dtype == np.float16
    assert ref.attention(*(x.astype(np.float32) for x in (q, k, v))).dtype == np.float32


def test_rope_backward_matches_finite_differences_and_is_relative() -> None:
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((2, 5, 3, 6)), rng.standard_normal((2, 5, 3, 6))
    pos = np.array([4, 0, 2, 1, 3])

    def f() -> float:
        return float(np.sum(ref.rope(x, pos, 100.0) * dy))

    _fd_check(f, [x], [ref.rope_backward(dy, pos, 100.0)])
    by_complex = _rotate(x.transpose(0, 2, 1, 3), 100.0).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(ref.rope(x, np.arange(5), 100.0), by_complex, rtol=1e-12, atol=1e-14)
    a, b = rng.standard_normal((1, 1, 1, 6)), rng.standard_normal((1, 1, 1, 6))
    # <rope(a, m), rope(b, m - 2)> depends on the distance 2 only
    dots = [np.sum(ref.rope(a, np.array([m])) * ref.rope(b, np.array([m - 2]))) for m in (2, 5, 9)]
    np.testing.assert_allclose(dots, dots[0], rtol=1e-12)


def test_norm_backwards_match_finite_differences() -> None:
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 3, 5))
    gamma, beta = rng.standard_normal(5), rng.standard_normal(5)

    def ln() -> float:
        return float(np.sum(ref.layer_norm(x, gamma, beta, 1e-5) * dy))

    _fd_check(ln, [x, gamma, beta], list(ref.layer_norm_backward(x, gamma, dy, 1e-5)))

    def rms() -> float:
        return float(np.sum(ref.rms_norm(x, gamma, 1e-5) * dy))

    _fd_check(rms, [x, gamma], list(ref.rms_norm_backward(x, gamma, dy, 1e-5)))
    expected = x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + 1e-5) * gamma
    np.testing.assert_allclose(ref.rms_norm(x, gamma, 1e-5), expected, rtol=1e-12)


def test_mlp_nonlinearities_match_finite_differences() -> None:
    rng = np.random.default_rng(3)
    x, up, dy = rng.standard_normal((3, 4)) * 3, rng.standard_normal((3, 4)), rng.standard_normal((3, 4))

    def g() -> float:
        return float(np.sum(ref.gelu(x) * dy))

    _fd_check(g, [x], [ref.gelu_backward(x, dy)])

    def s() -> float:
        return float(np.sum(ref.swiglu(x, up) * dy))

    _fd_check(s, [x, up], list(ref.swiglu_backward(x, up, dy)))
    np.testing.assert_allclose(ref.swiglu(x, up), x / (1 + np.exp(-x)) * up, rtol=1e-12)
    big = np.array([-800.0, 800.0])
    with np.errstate(all="raise"):  # no overflow at extreme gate values
        assert ref.swiglu(big, np.ones(2)).tolist() == [-0.0, 800.0]


def test_cross_entropy_backward_matches_finite_differences() -> None:
    rng = np.random.default_rng(4)
    logits, targets = rng.standard_normal((2, 3, 6)) * 4, rng.integers(0, 6, (2, 3))

    def f() -> float:
        return ref.cross_entropy(logits, targets)

    _fd_check(f, [logits], [ref.cross_entropy_backward(logits, targets)])
    shifted = logits + 1000.0  # stable: a constant shift of the logits changes nothing
    assert ref.cross_entropy(shifted, targets) == pytest.approx(f(), rel=1e-12)


def test_dropout_mask_is_the_seeded_global_draw() -> None:
    shape = (2, 3, 50)
    mask = ref.dropout_mask(7, 1, "attn_out", shape, 0.25)
    np.testing.assert_array_equal(mask, np.random.default_rng([7, 1, 1]).random(shape) >= 0.25)
    assert ref.SITES == ("attn_probs", "attn_out", "mlp_out")
    others = [ref.dropout_mask(7, 0, "attn_out", shape, 0.25), ref.dropout_mask(7, 1, "mlp_out", shape, 0.25)]
    assert all(not np.array_equal(mask, o) for o in others)
    assert 0.6 < mask.mean() < 0.9
    x = np.ones(shape)
    np.testing.assert_allclose(ref.dropout(x, mask, 0.25), mask / 0.75)
    with pytest.raises(ConfigError, match="unknown dropout site 'mlp'"):
        ref.dropout_mask(0, 0, "mlp", shape, 0.1)


# -- bad input ---------------------------------------------------------------------------------
@pytest.fixture
def tiny() -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    cfg = get("gpt-tiny")
    return cfg, ref.init(cfg)


def test_tokens_outside_the_vocabulary(tiny: Any) -> None:
    cfg, params = tiny
    with pytest.raises(ConfigError, match=r"tokens\[1, 0\] = 64 is outside the vocabulary \[0, 64\)"):
        ref.forward(cfg, params, [[1, 2], [64, 3]])
    with pytest.raises(ConfigError, match=r"targets\[0, 1\] = -1 is outside"):
        ref.loss(cfg, params, [[1, 2]], [[1, -1]])


def test_sequence_longer_than_the_config(tiny: Any) -> None:
    cfg, params = tiny
    with pytest.raises(ConfigError, match=r"sequence length 17, longer than the config's seq=16.*scaled\(seq=17\)"):
        ref.loss_and_grads(cfg, params, np.zeros((1, 17), int), np.zeros((1, 17), int))


def test_token_shapes_and_types(tiny: Any) -> None:
    cfg, params = tiny
    with pytest.raises(ShapeError, match=r"tokens must be an integer array \[B, S\], got dtype float64"):
        ref.forward(cfg, params, np.zeros((1, 4)))
    with pytest.raises(ShapeError, match=r"shape \(4,\)"):
        ref.forward(cfg, params, np.zeros(4, int))
    with pytest.raises(ShapeError, match=r"targets have shape \(1, 3\) but tokens \(1, 4\)"):
        ref.loss(cfg, params, np.zeros((1, 4), int), np.zeros((1, 3), int))


def test_params_that_do_not_fit_the_config(tiny: Any) -> None:
    cfg, params = tiny
    with pytest.raises(ShapeError, match=r"param 'layers.1.attn.wk' has shape \(32, 16\).*needs \(32, 32\)"):
        ref.forward(cfg, {**params, "layers.1.attn.wk": np.zeros((32, 16), np.float32)}, [[1]])
    with pytest.raises(ShapeError, match=r"missing \['lm_head'\], unexpected \[\]"):
        ref.forward(cfg.scaled(tie_embeddings=False), params, [[1]])
    with pytest.raises(ShapeError, match=r"unexpected \['extra'\].*param_shapes"):
        ref.forward(cfg, {**params, "extra": np.zeros(1)}, [[1]])


def test_init_is_seeded_and_follows_the_weight_list() -> None:
    cfg = get("llama-tiny")
    a, b, c = ref.init(cfg, seed=3), ref.init(cfg, seed=3), ref.init(cfg, seed=4, dtype="float64")
    assert {k: v.shape for k, v in a.items()} == cfg.param_shapes()
    assert all(np.array_equal(a[k], b[k]) for k in a) and not np.allclose(a["embed"], c["embed"])
    assert a["embed"].dtype == np.float32 and c["embed"].dtype == np.float64


# -- one block on its own ----------------------------------------------------------------------
@pytest.mark.parametrize("row", PAIRWISE[:3], ids=lambda r: "-".join(map(str, r)))
def test_block_grads_match_finite_differences(row: tuple[Any, ...]) -> None:
    cfg = small(row)
    params = ref.init(cfg, seed=4, dtype="float64")
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal((2, 5, cfg.d_model)), rng.standard_normal((2, 5, cfg.d_model))
    dx, grads = ref.block_grads(cfg, params, 1, x, dy, dropout_seed=SEED)
    assert sorted(grads) == sorted(k for k in params if k.startswith("layers.1."))

    def f() -> float:
        return float(np.sum(ref.block(cfg, params, 1, x, dropout_seed=SEED) * dy))

    np.testing.assert_allclose(dx, numeric_grad(f, x), rtol=1e-6, atol=1e-8)
    for name, g in grads.items():
        np.testing.assert_allclose(g, numeric_grad(f, params[name]), rtol=1e-6, atol=1e-8, err_msg=name)


def test_the_model_is_its_blocks_in_turn() -> None:
    cfg = get("llama-tiny").scaled(dropout=0.2)
    params = ref.init(cfg, seed=1, dtype="float64")
    tokens, _ = data(cfg)
    x = params["embed"][tokens]
    for i in range(cfg.layers):
        x = ref.block(cfg, params, i, x, dropout_seed=3)
    h = ref.rms_norm(x, params["final_norm.gamma"], cfg.norm_eps)
    np.testing.assert_allclose(ref.forward(cfg, params, tokens, dropout_seed=3), h @ params["lm_head"], rtol=1e-12)


def test_block_bad_input() -> None:
    cfg = get("gpt-tiny")
    params = ref.init(cfg)
    with pytest.raises(ConfigError, match=r"block 2 does not exist: the config has layers 0..1"):
        ref.block(cfg, params, 2, np.zeros((1, 4, 32)))
    with pytest.raises(ShapeError, match=r"x \[B, S, D\] with D = d_model = 32.*got shape \(1, 4, 16\)"):
        ref.block(cfg, params, 0, np.zeros((1, 4, 16)))
    with pytest.raises(ShapeError, match=r"dy has shape \(1, 3, 32\)"):
        ref.block_grads(cfg, params, 0, np.zeros((1, 4, 32)), np.zeros((1, 3, 32)))


# -- random sizes ------------------------------------------------------------------------------
@st.composite
def configs(draw: st.DrawFn) -> TransformerConfig:
    kv = draw(st.sampled_from([1, 2, 3]))
    heads = kv * draw(st.integers(1, 3))
    hd = draw(st.sampled_from([2, 4]))
    return TransformerConfig(
        layers=draw(st.integers(1, 2)),
        d_model=draw(st.sampled_from([4, 6, 8])),
        heads=heads,
        kv_heads=kv,
        head_dim=hd,
        d_ff=draw(st.sampled_from([4, 10])),
        vocab=draw(st.integers(2, 13)),
        seq=draw(st.integers(1, 6)),
        mlp=draw(st.sampled_from(["gelu", "swiglu"])),
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        position=draw(st.sampled_from(["learned", "rope", "none"])),
        bias=draw(st.booleans()),
        tie_embeddings=draw(st.booleans()),
        dropout=draw(st.sampled_from([0.0, 0.3])),
    )


@budget(25)
@given(cfg=configs(), batch=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_random_configs_forward_and_gradients(cfg: TransformerConfig, batch: int, seed: int) -> None:
    """Random heads, kv heads, head dims, sequence and vocabulary: the loop oracle and a directional derivative."""
    params = ref.init(cfg, seed=seed, dtype="float64")
    rng = np.random.default_rng(seed)
    s = int(rng.integers(1, cfg.seq + 1))
    tokens, targets = rng.integers(0, cfg.vocab, (batch, s)), rng.integers(0, cfg.vocab, (batch, s))
    logits = ref.forward(cfg, params, tokens, dropout_seed=seed)
    np.testing.assert_allclose(logits, naive_logits(cfg, params, tokens, seed), rtol=1e-10, atol=1e-12)
    _, grads = ref.loss_and_grads(cfg, params, tokens, targets, dropout_seed=seed)
    direction = {k: rng.standard_normal(v.shape) for k, v in params.items()}
    eps = 1e-6

    def shifted(sign: float) -> float:
        moved = {k: v + sign * eps * direction[k] for k, v in params.items()}
        return ref.loss(cfg, moved, tokens, targets, dropout_seed=seed)

    numeric = (shifted(1.0) - shifted(-1.0)) / (2 * eps)
    assert sum(np.sum(grads[k] * direction[k]) for k in params) == pytest.approx(numeric, rel=1e-5, abs=1e-9)


def test_init_refuses_a_full_size_preset() -> None:
    with pytest.raises(ConfigError, match=r"init of gpt3-175b would allocate 650.5 GiB of float32.*scaled"):
        ref.init(get("gpt3-175b"))
    assert ref.init(get("gpt-tiny"), max_bytes=28032 * 4)["embed"].shape == (64, 32)
    with pytest.raises(ConfigError, match="max_bytes"):
        ref.init(get("gpt-tiny"), max_bytes=28032 * 4 - 1)
