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
from ..errors import ConfigError
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
from .reference_block import (
    Cache,
    Params,
    apply_norm,
    block,
    block_backward,
    block_forward,
    block_grads,
    dropout_masks,
    norm_backward,
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

__all__ = [
    "SITES",
    "SITE_INDEX",
    "attention",
    "attention_backward",
    "attention_forward",
    "attention_grads",
    "attention_probs",
    "block",
    "block_grads",
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
def init(cfg: TransformerConfig, seed: int = 0, dtype: Any = "float32", *, max_bytes: int = 8 * 2**30) -> Params:
    """Every weight of :meth:`TransformerConfig.param_shapes`, seeded, in ``dtype``.

    Matrices N(0, 1/fan_in) (embeddings N(0, 1)·0.5, so tied logits stay moderate); norm
    gains near 1 and biases and norm shifts near 0, not exactly, so a test sees their gradients.
    Refuses (:class:`ConfigError`) to allocate more than ``max_bytes``: a published preset at
    full size is for shape-only runs, not for arrays on this host.

    >>> from shardsim.models import get
    >>> p = init(get("gpt-tiny"), seed=1, dtype="float64")
    >>> p["layers.0.attn.wq"].shape, p["embed"].dtype
    ((32, 32), dtype('float64'))
    """
    dt = resolve_dtype(dtype)
    size = cfg.param_count() * dt.itemsize
    if size > max_bytes:
        raise ConfigError(
            f"init of {cfg.name or 'this config'} would allocate {size / 2**30:.1f} GiB of {dt} weights "
            f"(max_bytes={max_bytes / 2**30:.1f} GiB): shrink it with cfg.scaled(layers=..., d_model=...) "
            f"or raise max_bytes"
        )
    rng = np.random.default_rng(seed)
    params: Params = {}
    for name, shape in cfg.param_shapes().items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "gamma":
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif leaf == "beta" or leaf.startswith("b"):
            value = 0.1 * rng.standard_normal(shape)
        elif name in ("embed", "pos_embed"):
            value = 0.5 * rng.standard_normal(shape)
        else:  # fan-in: the first dimension of a matrix, the middle one of a stack of experts [E, in, out]
            value = rng.standard_normal(shape) / np.sqrt(shape[-2] if len(shape) == 3 else shape[0])
        params[name] = value.astype(dt)
    return params


# -- the model ---------------------------------------------------------------------------------
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
        x, cache = block_forward(cfg, params, i, x, dropout_masks(cfg, i, seed, b, s))
        caches.append(cache)
    w = _head_weight(cfg, params)
    dt = compute_dtype(x, w)  # logits in float32, float64 for float64 params
    hf = apply_norm(cfg, params, "final_norm", x)
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
    dx = norm_backward(cfg, params, "final_norm", x, (dlogits @ w.T.astype(dlogits.dtype)).astype(x.dtype), grads)
    for i in reversed(range(cfg.layers)):
        dx = block_backward(cfg, params, i, caches[i], dx, grads)
    d_embed = dw.T.astype(params["embed"].dtype) if cfg.tie_embeddings else np.zeros_like(params["embed"])
    np.add.at(d_embed, tok.reshape(-1), dx.reshape(-1, cfg.d_model))  # each token's row gathers its gradient
    grads["embed"] = d_embed
    if not cfg.tie_embeddings:
        grads["lm_head"] = dw.astype(params["lm_head"].dtype, copy=False)
    if cfg.position == "learned":
        grads["pos_embed"] = np.zeros_like(params["pos_embed"])
        grads["pos_embed"][: tok.shape[1]] = dx.sum(axis=0)
    return value, {name: grads[name].astype(params[name].dtype, copy=False) for name in params}
