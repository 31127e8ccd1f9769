"""The single-device NumPy reference of the transformer: the oracle every sharded plan is held to.

Token embedding (plus learned positions), then per pre-norm block

    h = norm1(x)      q, k, v = h @ wq, h @ wk, h @ wv    (RoPE on q, k)
    x = x + drop(attention(q, k, v) @ wo)
    x = x + drop(mlp(norm2(x)))      mlp = gelu(h @ w_in) @ w_out  or  swiglu(h @ w_gate, h @ w_up) @ w_down

then the final norm, the LM head (``embed.T`` when tied) and the mean softmax cross-entropy
over all ``B*S`` tokens. The backward pass is derived by hand piece by piece
(:mod:`~shardsim.models.reference_pieces`, :mod:`~shardsim.models.reference_attention`) and
held to finite differences in the tests.

Dropout runs only when ``cfg.dropout > 0`` and a ``dropout_seed`` is given; its masks come
from :func:`dropout_mask` on the global shapes.

>>> import numpy as np
>>> from shardsim.models import get, reference
>>> cfg = get("llama-tiny")
>>> params = reference.init(cfg, seed=0)
>>> tokens = np.arange(16).reshape(2, 8) % cfg.vocab
>>> loss, grads = reference.loss_and_grads(cfg, params, tokens, (tokens + 1) % cfg.vocab)
>>> bool(abs(loss - np.log(cfg.vocab)) < 0.5), grads["embed"].shape, grads["embed"].dtype
(True, (64, 32), dtype('float32'))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import resolve_dtype
from .config import TransformerConfig
from .inputs import check_inputs, check_params
from .reference_attention import (
    attention,
    attention_backward,
    attention_forward,
    attention_grads,
    attention_probs,
    rope,
    rope_backward,
)
from .reference_pieces import (
    SITE_INDEX,
    SITES,
    compute_dtype,
    cross_entropy,
    cross_entropy_backward,
    dropout,
    dropout_mask,
    gelu,
    gelu_backward,
    layer_norm,
    layer_norm_backward,
    rms_norm,
    rms_norm_backward,
    swiglu,
    swiglu_backward,
)

Params = dict[str, np.ndarray]
Cache = dict[str, Any]

__all__ = [
    "SITES",
    "SITE_INDEX",
    "attention",
    "attention_backward",
    "attention_forward",
    "attention_grads",
    "attention_probs",
    "check_inputs",
    "check_params",
    "compute_dtype",
    "cross_entropy",
    "cross_entropy_backward",
    "dropout",
    "dropout_mask",
    "forward",
    "gelu",
    "gelu_backward",
    "init",
    "layer_norm",
    "layer_norm_backward",
    "loss",
    "loss_and_grads",
    "rms_norm",
    "rms_norm_backward",
    "rope",
    "rope_backward",
    "swiglu",
    "swiglu_backward",
]


# -- parameters and inputs ---------------------------------------------------------------------
def init(cfg: TransformerConfig, seed: int = 0, dtype: Any = "float32") -> Params:
    """Every weight of :meth:`TransformerConfig.param_shapes`, seeded, in ``dtype``.

    Matrices N(0, 1/fan_in) (embeddings N(0, 1)·0.5, so tied logits stay moderate); norm
    gains near 1 and biases and norm shifts near 0, not exactly, so a test sees their gradients.

    >>> from shardsim.models import get
    >>> p = init(get("gpt-tiny"), seed=1, dtype="float64")
    >>> p["layers.0.attn.wq"].shape, p["embed"].dtype
    ((32, 32), dtype('float64'))
    """
    rng = np.random.default_rng(seed)
    dt = resolve_dtype(dtype)
    params: Params = {}
    for name, shape in cfg.param_shapes().items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "gamma":
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif leaf == "beta" or leaf.startswith("b"):
            value = 0.1 * rng.standard_normal(shape)
        elif name in ("embed", "pos_embed"):
            value = 0.5 * rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) / np.sqrt(shape[0])
        params[name] = value.astype(dt)
    return params


# -- forward -----------------------------------------------------------------------------------
def _norm(cfg: TransformerConfig, params: Params, prefix: str, x: np.ndarray) -> np.ndarray:
    if cfg.norm == "layernorm":
        return layer_norm(x, params[f"{prefix}.gamma"], params[f"{prefix}.beta"], cfg.norm_eps)
    return rms_norm(x, params[f"{prefix}.gamma"], cfg.norm_eps)


def _norm_backward(
    cfg: TransformerConfig, params: Params, prefix: str, x: np.ndarray, dy: np.ndarray, grads: Params
) -> np.ndarray:
    """Add the norm's weight gradients to ``grads``; return ``dx``."""
    if cfg.norm == "layernorm":
        dx, grads[f"{prefix}.gamma"], grads[f"{prefix}.beta"] = layer_norm_backward(
            x, params[f"{prefix}.gamma"], dy, cfg.norm_eps
        )
    else:
        dx, grads[f"{prefix}.gamma"] = rms_norm_backward(x, params[f"{prefix}.gamma"], dy, cfg.norm_eps)
    return dx


def _linear(params: Params, w: str, b: str, x: np.ndarray) -> np.ndarray:
    y = x @ params[w]
    return y + params[b] if b in params else y


def _linear_backward(params: Params, w: str, b: str, x: np.ndarray, dy: np.ndarray, grads: Params) -> np.ndarray:
    """Add ``dW = x^T dy`` (summed over every token) and ``db`` to ``grads``; return ``dx = dy W^T``."""
    d_in, d_out = params[w].shape
    grads[w] = x.reshape(-1, d_in).T @ dy.reshape(-1, d_out)
    if b in params:
        grads[b] = dy.reshape(-1, d_out).sum(axis=0)
    return dy @ params[w].T


def _masks(cfg: TransformerConfig, layer: int, seed: int | None, b: int, s: int) -> dict[str, np.ndarray | None]:
    if seed is None or cfg.dropout == 0.0:
        return dict.fromkeys(SITES)
    shapes = {"attn_probs": (b, cfg.heads, s, s), "attn_out": (b, s, cfg.d_model), "mlp_out": (b, s, cfg.d_model)}
    return {site: dropout_mask(seed, layer, site, shape, cfg.dropout) for site, shape in shapes.items()}


def _block_forward(
    cfg: TransformerConfig, params: Params, i: int, x: np.ndarray, masks: dict[str, np.ndarray | None]
) -> tuple[np.ndarray, Cache]:
    """Block ``i`` on ``x [B, S, D]``: its output and what its backward pass reads."""
    p, b, s = f"layers.{i}", x.shape[0], x.shape[1]
    positions = np.arange(s)
    c: Cache = {"x": x, "masks": masks}
    c["h1"] = h1 = _norm(cfg, params, f"{p}.attn_norm", x)
    q = _linear(params, f"{p}.attn.wq", f"{p}.attn.bq", h1).reshape(b, s, cfg.heads, cfg.hd)
    k = _linear(params, f"{p}.attn.wk", f"{p}.attn.bk", h1).reshape(b, s, cfg.n_kv, cfg.hd)
    v = _linear(params, f"{p}.attn.wv", f"{p}.attn.bv", h1).reshape(b, s, cfg.n_kv, cfg.hd)
    if cfg.position == "rope":
        q, k = rope(q, positions, cfg.rope_theta), rope(k, positions, cfg.rope_theta)
    o, c["attn"] = attention_forward(q, k, v, positions=positions, keep=masks["attn_probs"], p=cfg.dropout)
    c["o"] = o = o.reshape(b, s, cfg.heads * cfg.hd)
    c["x_mid"] = x = x + dropout(_linear(params, f"{p}.attn.wo", f"{p}.attn.bo", o), masks["attn_out"], cfg.dropout)
    c["h2"] = h2 = _norm(cfg, params, f"{p}.mlp_norm", x)
    if cfg.mlp == "gelu":
        c["u"] = u = _linear(params, f"{p}.mlp.w_in", f"{p}.mlp.b_in", h2)
        c["act"] = act = gelu(u)
        m = _linear(params, f"{p}.mlp.w_out", f"{p}.mlp.b_out", act)
    else:
        c["gate"] = gate = _linear(params, f"{p}.mlp.w_gate", f"{p}.mlp.b_gate", h2)
        c["up"] = up = _linear(params, f"{p}.mlp.w_up", f"{p}.mlp.b_up", h2)
        c["act"] = act = swiglu(gate, up)
        m = _linear(params, f"{p}.mlp.w_down", f"{p}.mlp.b_down", act)
    return x + dropout(m, masks["mlp_out"], cfg.dropout), c


def _head_weight(cfg: TransformerConfig, params: Params) -> np.ndarray:
    """The LM head ``[D, V]``: ``embed.T`` when tied."""
    return params["embed"].T if cfg.tie_embeddings else params["lm_head"]


def _run(
    cfg: TransformerConfig, params: Params, tokens: np.ndarray, seed: int | None
) -> tuple[np.ndarray, list[Cache], np.ndarray, np.ndarray]:
    """``(logits, per-block caches, final-norm input, final-norm output)`` for checked ``tokens``."""
    b, s = tokens.shape
    x = params["embed"][tokens]
    if cfg.position == "learned":
        x = x + params["pos_embed"][:s]
    caches = []
    for i in range(cfg.layers):
        x, cache = _block_forward(cfg, params, i, x, _masks(cfg, i, seed, b, s))
        caches.append(cache)
    w = _head_weight(cfg, params)
    dt = compute_dtype(x, w)  # logits in float32, float64 for float64 params
    hf = _norm(cfg, params, "final_norm", x)
    return hf.astype(dt, copy=False) @ w.astype(dt, copy=False), caches, x, hf


def forward(cfg: TransformerConfig, params: Params, tokens: Any, *, dropout_seed: int | None = None) -> np.ndarray:
    """The logits ``[B, S, V]`` of ``tokens [B, S]`` (float32, float64 for float64 params).

    >>> from shardsim.models import get
    >>> cfg = get("gpt-tiny")
    >>> forward(cfg, init(cfg), np.zeros((2, 5), int)).shape
    (2, 5, 64)
    """
    tok, _ = check_inputs(cfg, params, tokens)
    return _run(cfg, params, tok, dropout_seed)[0]


def loss(
    cfg: TransformerConfig, params: Params, tokens: Any, targets: Any, *, dropout_seed: int | None = None
) -> float:
    """Mean softmax cross-entropy of the logits of ``tokens`` against ``targets``, over all ``B*S`` tokens.

    >>> from shardsim.models import get
    >>> cfg = get("gpt-tiny")
    >>> round(loss(cfg, init(cfg), [[1, 2]], [[2, 3]]), 3) > 0
    True
    """
    tok, tgt = check_inputs(cfg, params, tokens, targets)
    assert tgt is not None  # check_inputs returns targets when given them
    return cross_entropy(_run(cfg, params, tok, dropout_seed)[0], tgt)


# -- backward ----------------------------------------------------------------------------------
def _block_backward(
    cfg: TransformerConfig, params: Params, i: int, c: Cache, dx: np.ndarray, grads: Params
) -> np.ndarray:
    """Block ``i``'s weight gradients into ``grads``; return the cotangent of its input."""
    p, masks, (b, s) = f"layers.{i}", c["masks"], c["x"].shape[:2]
    dm = dropout(dx, masks["mlp_out"], cfg.dropout)
    if cfg.mlp == "gelu":
        dact = _linear_backward(params, f"{p}.mlp.w_out", f"{p}.mlp.b_out", c["act"], dm, grads)
        dh2 = _linear_backward(params, f"{p}.mlp.w_in", f"{p}.mlp.b_in", c["h2"], gelu_backward(c["u"], dact), grads)
    else:
        dact = _linear_backward(params, f"{p}.mlp.w_down", f"{p}.mlp.b_down", c["act"], dm, grads)
        dgate, dup = swiglu_backward(c["gate"], c["up"], dact)
        dh2 = _linear_backward(params, f"{p}.mlp.w_gate", f"{p}.mlp.b_gate", c["h2"], dgate, grads)
        dh2 = dh2 + _linear_backward(params, f"{p}.mlp.w_up", f"{p}.mlp.b_up", c["h2"], dup, grads)
    dx = dx + _norm_backward(cfg, params, f"{p}.mlp_norm", c["x_mid"], dh2, grads)
    da = dropout(dx, masks["attn_out"], cfg.dropout)
    do = _linear_backward(params, f"{p}.attn.wo", f"{p}.attn.bo", c["o"], da, grads)
    dq, dk, dv = attention_grads(c["attn"], do.reshape(b, s, cfg.heads, cfg.hd))
    if cfg.position == "rope":
        positions = np.arange(s)
        dq, dk = rope_backward(dq, positions, cfg.rope_theta), rope_backward(dk, positions, cfg.rope_theta)
    dh1 = _linear_backward(params, f"{p}.attn.wq", f"{p}.attn.bq", c["h1"], dq.reshape(b, s, -1), grads)
    dh1 = dh1 + _linear_backward(params, f"{p}.attn.wk", f"{p}.attn.bk", c["h1"], dk.reshape(b, s, -1), grads)
    dh1 = dh1 + _linear_backward(params, f"{p}.attn.wv", f"{p}.attn.bv", c["h1"], dv.reshape(b, s, -1), grads)
    return dx + _norm_backward(cfg, params, f"{p}.attn_norm", c["x"], dh1, grads)


def loss_and_grads(
    cfg: TransformerConfig, params: Params, tokens: Any, targets: Any, *, dropout_seed: int | None = None
) -> tuple[float, Params]:
    """The loss and the gradient of every parameter (same keys, shapes and dtypes as ``params``).

    >>> from shardsim.models import get
    >>> cfg = get("gpt-tiny")
    >>> params = init(cfg)
    >>> value, grads = loss_and_grads(cfg, params, [[1, 2, 3]], [[2, 3, 4]])
    >>> value == loss(cfg, params, [[1, 2, 3]], [[2, 3, 4]]), sorted(grads) == sorted(params)
    (True, True)
    """
    tok, tgt = check_inputs(cfg, params, tokens, targets)
    assert tgt is not None  # check_inputs returns targets when given them
    logits, caches, x, hf = _run(cfg, params, tok, dropout_seed)
    value = cross_entropy(logits, tgt)
    dlogits = cross_entropy_backward(logits, tgt)
    grads: Params = {}
    w = _head_weight(cfg, params)
    d, v = w.shape
    dw = hf.reshape(-1, d).astype(dlogits.dtype, copy=False).T @ dlogits.reshape(-1, v)
    dx = _norm_backward(cfg, params, "final_norm", x, (dlogits @ w.T.astype(dlogits.dtype)).astype(x.dtype), grads)
    for i in reversed(range(cfg.layers)):
        dx = _block_backward(cfg, params, i, caches[i], dx, grads)
    d_embed = dw.T.astype(params["embed"].dtype) if cfg.tie_embeddings else np.zeros_like(params["embed"])
    np.add.at(d_embed, tok.reshape(-1), dx.reshape(-1, cfg.d_model))  # each token's row gathers its gradient
    grads["embed"] = d_embed
    if not cfg.tie_embeddings:
        grads["lm_head"] = dw.astype(params["lm_head"].dtype, copy=False)
    if cfg.position == "learned":
        grads["pos_embed"] = np.zeros_like(params["pos_embed"])
        grads["pos_embed"][: tok.shape[1]] = dx.sum(axis=0)
    return value, {name: grads[name].astype(params[name].dtype, copy=False) for name in params}
