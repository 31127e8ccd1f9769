"""One transformer block on one device, forward and hand-derived backward: the reference's inner loop.

``block(cfg, params, layer, x)`` runs block ``layer`` on ``x [B, S, D]``,
``block_grads(..., dy)`` its backward pass; the whole-model reference
(:mod:`shardsim.models.reference`) runs them in turn between the embedding and the loss.

>>> import numpy as np
>>> from shardsim.models import get, reference
>>> cfg = get("gpt-tiny")
>>> x = np.random.default_rng(0).standard_normal((2, 4, 32))
>>> dx, grads = block_grads(cfg, reference.init(cfg, dtype="float64"), 1, x, np.ones_like(x))
>>> dx.shape, grads["layers.1.mlp.w_in"].shape
((2, 4, 32), (32, 128))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError, ShapeError
from . import reference_moe as moe
from .config import TransformerConfig
from .inputs import check_params
from .reference_attention import attention_forward, attention_grads, rope, rope_backward
from .reference_pieces import (
    SITES,
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


def apply_norm(cfg: TransformerConfig, params: Params, prefix: str, x: np.ndarray) -> np.ndarray:
    """The config's norm (LayerNorm or RMSNorm) with the weights under ``prefix``.

    >>> from shardsim.models import get, reference
    >>> cfg = get("gpt-tiny")
    >>> y = apply_norm(cfg, reference.init(cfg, dtype="float64"), "final_norm", np.ones((1, 2, 32)))
    >>> y.shape
    (1, 2, 32)
    """
    if cfg.norm == "layernorm":
        return layer_norm(x, params[f"{prefix}.gamma"], params[f"{prefix}.beta"], cfg.norm_eps)
    return rms_norm(x, params[f"{prefix}.gamma"], cfg.norm_eps)


def norm_backward(
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


def _experts(params: Params, prefix: str) -> Params:
    """Block ``prefix``'s router and experts under :mod:`shardsim.models.reference_moe`'s names."""
    return {k: params[f"{prefix}.moe.{k}"] for k in ("router", "w_in", "w_out")}


def _routing(cfg: TransformerConfig, shape: tuple[int, ...]) -> dict[str, Any]:
    """top_k, and each sequence of ``shape = (B, S, D)`` one group with the config's capacity."""
    b, s = shape[0], shape[1]
    return {"top_k": cfg.top_k, "capacity": cfg.expert_capacity(s), "groups": b}


def dropout_masks(cfg: TransformerConfig, layer: int, seed: int | None, b: int, s: int) -> dict[str, np.ndarray | None]:
    if seed is None or cfg.dropout == 0.0:
        return dict.fromkeys(SITES)
    shapes = {"attn_probs": (b, cfg.heads, s, s), "attn_out": (b, s, cfg.d_model), "mlp_out": (b, s, cfg.d_model)}
    return {site: dropout_mask(seed, layer, site, shape, cfg.dropout) for site, shape in shapes.items()}


def block_forward(
    cfg: TransformerConfig, params: Params, i: int, x: np.ndarray, masks: dict[str, np.ndarray | None]
) -> tuple[np.ndarray, Cache]:
    """Block ``i`` on ``x [B, S, D]``: its output and what its backward pass reads."""
    p, b, s = f"layers.{i}", x.shape[0], x.shape[1]
    positions = np.arange(s)
    c: Cache = {"x": x, "masks": masks}
    c["h1"] = h1 = apply_norm(cfg, params, f"{p}.attn_norm", x)
    q = _linear(params, f"{p}.attn.wq", f"{p}.attn.bq", h1).reshape(b, s, cfg.heads, cfg.hd)
    k = _linear(params, f"{p}.attn.wk", f"{p}.attn.bk", h1).reshape(b, s, cfg.n_kv, cfg.hd)
    v = _linear(params, f"{p}.attn.wv", f"{p}.attn.bv", h1).reshape(b, s, cfg.n_kv, cfg.hd)
    if cfg.position == "rope":
        q, k = rope(q, positions, cfg.rope_theta), rope(k, positions, cfg.rope_theta)
    o, c["attn"] = attention_forward(q, k, v, positions=positions, keep=masks["attn_probs"], p=cfg.dropout)
    c["o"] = o = o.reshape(b, s, cfg.heads * cfg.hd)
    c["x_mid"] = x = x + dropout(_linear(params, f"{p}.attn.wo", f"{p}.attn.bo", o), masks["attn_out"], cfg.dropout)
    c["h2"] = h2 = apply_norm(cfg, params, f"{p}.mlp_norm", x)
    if cfg.experts:  # the mixture of experts on every token of the batch, token by token
        m = moe.forward(_experts(params, p), h2.reshape(-1, cfg.d_model), "gelu", **_routing(cfg, h2.shape))
        m = m.reshape(h2.shape)
    elif cfg.mlp == "gelu":
        c["u"] = u = _linear(params, f"{p}.mlp.w_in", f"{p}.mlp.b_in", h2)
        c["act"] = act = gelu(u)
        m = _linear(params, f"{p}.mlp.w_out", f"{p}.mlp.b_out", act)
    else:
        c["gate"] = gate = _linear(params, f"{p}.mlp.w_gate", f"{p}.mlp.b_gate", h2)
        c["up"] = up = _linear(params, f"{p}.mlp.w_up", f"{p}.mlp.b_up", h2)
        c["act"] = act = swiglu(gate, up)
        m = _linear(params, f"{p}.mlp.w_down", f"{p}.mlp.b_down", act)
    return x + dropout(m, masks["mlp_out"], cfg.dropout), c


def block(
    cfg: TransformerConfig, params: Params, layer: int, x: np.ndarray, *, dropout_seed: int | None = None
) -> np.ndarray:
    """Block ``layer`` alone on ``x [B, S, D]``: ``x + attn(norm1(x))``, then ``+ mlp(norm2(.))``.

    Dropout masks as in the whole model (global shapes, this block's index), so a sharded
    block can be held to it without the embedding or the loss.

    >>> from shardsim.models import get
    >>> from shardsim.models.reference import init
    >>> cfg = get("llama-tiny")
    >>> block(cfg, init(cfg), 1, np.zeros((2, 4, 32), np.float32)).shape
    (2, 4, 32)
    """
    check_params(cfg, params)
    _check_block_input(cfg, layer, x)
    return block_forward(cfg, params, layer, x, dropout_masks(cfg, layer, dropout_seed, *x.shape[:2]))[0]


def _check_block_input(cfg: TransformerConfig, layer: int, x: np.ndarray) -> None:
    if not 0 <= layer < cfg.layers:
        raise ConfigError(f"block {layer} does not exist: the config has layers 0..{cfg.layers - 1}")
    if x.ndim != 3 or x.shape[2] != cfg.d_model or x.shape[1] > cfg.seq:
        raise ShapeError(
            f"a block takes x [B, S, D] with D = d_model = {cfg.d_model} and S <= seq = {cfg.seq}; got shape {x.shape}"
        )


def block_backward(
    cfg: TransformerConfig, params: Params, i: int, c: Cache, dx: np.ndarray, grads: Params
) -> np.ndarray:
    """Block ``i``'s weight gradients into ``grads``; return the cotangent of its input."""
    p, masks, (b, s) = f"layers.{i}", c["masks"], c["x"].shape[:2]
    dm = dropout(dx, masks["mlp_out"], cfg.dropout)
    if cfg.experts:
        flat = c["h2"].reshape(-1, cfg.d_model)
        g = moe.backward(_experts(params, p), flat, dm.reshape(flat.shape), "gelu", **_routing(cfg, c["h2"].shape))
        grads.update({f"{p}.moe.{k}": g[k] for k in ("router", "w_in", "w_out")})
        dh2 = g["x"].reshape(c["h2"].shape)
    elif cfg.mlp == "gelu":
        dact = _linear_backward(params, f"{p}.mlp.w_out", f"{p}.mlp.b_out", c["act"], dm, grads)
        dh2 = _linear_backward(params, f"{p}.mlp.w_in", f"{p}.mlp.b_in", c["h2"], gelu_backward(c["u"], dact), grads)
    else:
        dact = _linear_backward(params, f"{p}.mlp.w_down", f"{p}.mlp.b_down", c["act"], dm, grads)
        dgate, dup = swiglu_backward(c["gate"], c["up"], dact)
        dh2 = _linear_backward(params, f"{p}.mlp.w_gate", f"{p}.mlp.b_gate", c["h2"], dgate, grads)
        dh2 = dh2 + _linear_backward(params, f"{p}.mlp.w_up", f"{p}.mlp.b_up", c["h2"], dup, grads)
    dx = dx + norm_backward(cfg, params, f"{p}.mlp_norm", c["x_mid"], dh2, grads)
    da = dropout(dx, masks["attn_out"], cfg.dropout)
    do = _linear_backward(params, f"{p}.attn.wo", f"{p}.attn.bo", c["o"], da, grads)
    dq, dk, dv = attention_grads(c["attn"], do.reshape(b, s, cfg.heads, cfg.hd))
    if cfg.position == "rope":
        positions = np.arange(s)
        dq, dk = rope_backward(dq, positions, cfg.rope_theta), rope_backward(dk, positions, cfg.rope_theta)
    dh1 = _linear_backward(params, f"{p}.attn.wq", f"{p}.attn.bq", c["h1"], dq.reshape(b, s, -1), grads)
    dh1 = dh1 + _linear_backward(params, f"{p}.attn.wk", f"{p}.attn.bk", c["h1"], dk.reshape(b, s, -1), grads)
    dh1 = dh1 + _linear_backward(params, f"{p}.attn.wv", f"{p}.attn.bv", c["h1"], dv.reshape(b, s, -1), grads)
    return dx + norm_backward(cfg, params, f"{p}.attn_norm", c["x"], dh1, grads)


def block_grads(
    cfg: TransformerConfig,
    params: Params,
    layer: int,
    x: np.ndarray,
    dy: np.ndarray,
    *,
    dropout_seed: int | None = None,
) -> tuple[np.ndarray, Params]:
    """``(dx, grads)`` of :func:`block` for the output cotangent ``dy``; ``grads`` holds this block's weights.

    >>> from shardsim.models import get
    >>> from shardsim.models.reference import init
    >>> cfg = get("gpt-tiny")
    >>> dx, grads = block_grads(cfg, init(cfg), 0, np.ones((1, 3, 32)), np.ones((1, 3, 32)))
    >>> dx.shape, sorted(grads)[:2]
    ((1, 3, 32), ['layers.0.attn.bk', 'layers.0.attn.bo'])
    """
    check_params(cfg, params)
    _check_block_input(cfg, layer, x)
    if dy.shape != x.shape:
        raise ShapeError(f"dy has shape {dy.shape} but the block's input x {x.shape}; the cotangent matches the output")
    _, cache = block_forward(cfg, params, layer, x, dropout_masks(cfg, layer, dropout_seed, *x.shape[:2]))
    grads: Params = {}
    return block_backward(cfg, params, layer, cache, dy, grads), grads
