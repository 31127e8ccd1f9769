"""The single-device transformer in plain NumPy: forward and hand-derived backward.

>>> from shardsim.models import TransformerConfig
>>> cfg = TransformerConfig(layers=1, d_model=8, heads=2, d_ff=16, vocab=11, seq=4)
>>> p = init(cfg, seed=0, dtype="float64")
>>> tok = np.arange(8).reshape(2, 4) % 11
>>> l, g = loss_and_grads(cfg, p, tok, tok)
>>> sorted(g) == sorted(p)
True
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..activations import get as get_activation
from ..dtypes import resolve_dtype
from .config import TransformerConfig

SITE_INDEX = {"attn_probs": 0, "attn_out": 1, "mlp_out": 2}
Params = dict[str, np.ndarray]
_GELU = get_activation("gelu")


def init(cfg: TransformerConfig, seed: int = 0, dtype: Any = "float32") -> Params:
    """Random weights: matrices ~ N(0, 0.02), gains near 1, biases near 0."""
    rng = np.random.default_rng(seed)
    dt = resolve_dtype(dtype)
    out = {}
    for k, shape in cfg.param_shapes().items():
        if k.endswith("gamma"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:
            w = 0.1 * rng.standard_normal(shape)
        else:
            w = (0.02 if k in ("embed", "pos_embed") else 1.0 / np.sqrt(shape[0])) * rng.standard_normal(shape)
        out[k] = w.astype(dt)
    return out


def dropout_mask(seed: int, layer: int, site: str, shape: tuple[int, ...], p: float = 0.0) -> np.ndarray:
    """The kept elements (True) of dropout site ``site`` of layer ``layer``, on the global shape."""
    return np.random.default_rng([seed, layer, SITE_INDEX[site]]).random(shape) >= p


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * gamma + beta


def layer_norm_backward(x: np.ndarray, gamma: np.ndarray, dy: np.ndarray, eps: float = 1e-5) -> tuple[Any, ...]:
    mu = x.mean(-1, keepdims=True)
    r = 1.0 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    xh = (x - mu) * r
    g = dy * gamma
    dx = r * (g - g.mean(-1, keepdims=True) - xh * (g * xh).mean(-1, keepdims=True))
    lead = tuple(range(x.ndim - 1))
    return dx, (dy * xh).sum(lead), dy.sum(lead)


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gamma


def rms_norm_backward(x: np.ndarray, gamma: np.ndarray, dy: np.ndarray, eps: float = 1e-5) -> tuple[Any, ...]:
    r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    xh = x * r
    g = dy * gamma
    return r * (g - xh * (g * xh).mean(-1, keepdims=True)), (dy * xh).sum(tuple(range(x.ndim - 1)))


def gelu(x: np.ndarray) -> np.ndarray:
    return _GELU.fn(x)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return silu(gate) * up


def rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Rotate ``x[B, S, N, H]`` by ``positions[S]``, half-split (GPT-NeoX / Llama) convention."""
    return _rotate(x, positions, theta, 1.0)


def rope_backward(dy: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    return _rotate(dy, positions, theta, -1.0)


def _rotate(x: np.ndarray, positions: np.ndarray, theta: float, sign: float) -> np.ndarray:
    h = x.shape[-1] // 2
    ang = np.asarray(positions, np.float64)[:, None] * theta ** (-np.arange(h) * 2.0 / (2 * h))
    cos, sin = np.cos(ang)[:, None, :].astype(x.dtype), (sign * np.sin(ang))[:, None, :].astype(x.dtype)
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def _expand(k: np.ndarray, n: int) -> np.ndarray:
    return np.repeat(k, n // k.shape[2], axis=2)


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = True,
    positions: Any = None,
    keep: Any = None,
    p: float = 0.0,
) -> np.ndarray:
    """``softmax(q k^T / sqrt(H)) v`` per head; q ``[B, S, N, H]``, k and v ``[B, S, K, H]``."""
    return _attention(q, k, v, causal, positions, keep, p)[0]


def _attention(q: Any, k: Any, v: Any, causal: bool, positions: Any, keep: Any, p: float) -> tuple[Any, ...]:
    n = q.shape[2]
    qt, kt, vt = (a.transpose(0, 2, 1, 3) for a in (q, _expand(k, n), _expand(v, n)))
    s = qt @ kt.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        pos = np.arange(q.shape[1]) if positions is None else np.asarray(positions)
        s = np.where(pos[None, :] <= pos[:, None], s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    probs = e / e.sum(-1, keepdims=True)
    dropped = probs if keep is None else probs * keep / (1.0 - p)
    return (dropped @ vt).transpose(0, 2, 1, 3), (qt, kt, vt, probs, dropped)


def attention_backward(
    q: Any, k: Any, v: Any, do: Any, *, causal: bool = True, positions: Any = None, keep: Any = None, p: float = 0.0
) -> tuple[Any, ...]:
    """``(dq, dk, dv)`` of :func:`attention` for the output cotangent ``do[B, S, N, H]``."""
    _, (qt, kt, vt, probs, dropped) = _attention(q, k, v, causal, positions, keep, p)
    dot = do.transpose(0, 2, 1, 3)
    dvt = dropped.swapaxes(-1, -2) @ dot
    dprobs = dot @ vt.swapaxes(-1, -2)
    if keep is not None:
        dprobs = dprobs * keep / (1.0 - p)
    ds = probs * (dprobs - (dprobs * probs).sum(-1, keepdims=True)) / math.sqrt(q.shape[-1])
    dqt, dkt = ds @ kt, ds.swapaxes(-1, -2) @ qt
    b, s, kh, h = k.shape
    g = q.shape[2] // kh

    def fold(a: Any) -> Any:  # sum each GQA group's query heads onto its kv head
        return a.reshape(b, kh, g, s, h).sum(2).transpose(0, 2, 1, 3)

    return dqt.transpose(0, 2, 1, 3), fold(dkt), fold(dvt)


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> float:
    """Mean softmax cross-entropy of ``logits[B, S, V]`` against ``targets[B, S]``."""
    m = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(-1)) + m[..., 0]
    return float((lse - np.take_along_axis(logits, targets[..., None], -1)[..., 0]).mean())


def cross_entropy_backward(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    d = e / e.sum(-1, keepdims=True)
    np.put_along_axis(d, targets[..., None], np.take_along_axis(d, targets[..., None], -1) - 1.0, -1)
    return d / targets.size


def _norm(cfg: TransformerConfig, x: Any, p: Params, pre: str) -> Any:
    if cfg.norm == "layernorm":
        return layer_norm(x, p[pre + ".gamma"], p[pre + ".beta"], cfg.norm_eps)
    return rms_norm(x, p[pre + ".gamma"], cfg.norm_eps)


def _norm_backward(cfg: TransformerConfig, x: Any, p: Params, pre: str, dy: Any, g: Params) -> Any:
    if cfg.norm == "layernorm":
        dx, g[pre + ".gamma"], g[pre + ".beta"] = layer_norm_backward(x, p[pre + ".gamma"], dy, cfg.norm_eps)
    else:
        dx, g[pre + ".gamma"] = rms_norm_backward(x, p[pre + ".gamma"], dy, cfg.norm_eps)
    return dx


def _masks(cfg: TransformerConfig, seed: Any, i: int, b: int, s: int) -> dict[str, Any]:
    if seed is None or cfg.dropout == 0.0:
        return {}
    shapes = {"attn_probs": (b, cfg.heads, s, s), "attn_out": (b, s, cfg.d_model), "mlp_out": (b, s, cfg.d_model)}
    return {k: dropout_mask(seed, i, k, sh, cfg.dropout) for k, sh in shapes.items()}


def _drop(x: Any, keep: Any, p: float) -> Any:
    return x if keep is None else x * keep / (1.0 - p)


def _run(cfg: TransformerConfig, p: Params, tokens: Any, seed: Any) -> tuple[Any, list[Any]]:
    b, s = tokens.shape
    n, kv, h = cfg.heads, cfg.n_kv, cfg.hd
    pos = np.arange(s)
    x = p["embed"][tokens]
    if cfg.position == "learned":
        x = x + p["pos_embed"][:s]
    tape = []
    for i in range(cfg.layers):
        pre, m = f"layers.{i}", _masks(cfg, seed, i, b, s)
        a = _norm(cfg, x, p, pre + ".attn_norm")
        q, k, v = (a @ p[f"{pre}.attn.w{c}"] + (p[f"{pre}.attn.b{c}"] if cfg.bias else 0) for c in "qkv")
        q, k, v = q.reshape(b, s, n, h), k.reshape(b, s, kv, h), v.reshape(b, s, kv, h)
        if cfg.position == "rope":
            q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
        o = attention(q, k, v, keep=m.get("attn_probs"), p=cfg.dropout).reshape(b, s, n * h)
        y = o @ p[pre + ".attn.wo"] + (p[pre + ".attn.bo"] if cfg.bias else 0)
        x2 = x + _drop(y, m.get("attn_out"), cfg.dropout)
        c = _norm(cfg, x2, p, pre + ".mlp_norm")
        if cfg.mlp == "gelu":
            hp = c @ p[pre + ".mlp.w_in"] + (p[pre + ".mlp.b_in"] if cfg.bias else 0)
            hh, gate, up = gelu(hp), None, None
            z = hh @ p[pre + ".mlp.w_out"] + (p[pre + ".mlp.b_out"] if cfg.bias else 0)
        else:
            hp, gate, up = None, c @ p[pre + ".mlp.w_gate"], c @ p[pre + ".mlp.w_up"]
            hh = swiglu(gate, up)
            z = hh @ p[pre + ".mlp.w_down"]
        tape.append((x, a, q, k, v, o, x2, c, hp, hh, gate, up, m))
        x = x2 + _drop(z, m.get("mlp_out"), cfg.dropout)
    return x, tape


def forward(cfg: TransformerConfig, params: Params, tokens: Any, *, dropout_seed: Any = None) -> np.ndarray:
    """The logits ``[B, S, V]``."""
    x, _ = _run(cfg, params, np.asarray(tokens), dropout_seed)
    f = _norm(cfg, x, params, "final_norm")
    return f @ (params["embed"].T if cfg.tie_embeddings else params["lm_head"])


def loss(cfg: TransformerConfig, params: Params, tokens: Any, targets: Any, *, dropout_seed: Any = None) -> float:
    """The mean cross-entropy over all ``B * S`` tokens."""
    return cross_entropy(forward(cfg, params, tokens, dropout_seed=dropout_seed), np.asarray(targets))


def loss_and_grads(
    cfg: TransformerConfig, params: Params, tokens: Any, targets: Any, *, dropout_seed: Any = None
) -> tuple[float, Params]:
    """The loss and the gradient of every parameter (same keys as ``params``)."""
    p, tokens, targets = params, np.asarray(tokens), np.asarray(targets)
    b, s = tokens.shape
    n, h = cfg.heads, cfg.hd
    pos = np.arange(s)
    x, tape = _run(cfg, p, tokens, dropout_seed)
    f = _norm(cfg, x, p, "final_norm")
    head = p["embed"].T if cfg.tie_embeddings else p["lm_head"]
    logits = f @ head
    value = cross_entropy(logits, targets)
    dl = cross_entropy_backward(logits, targets)
    g: Params = {}
    dhead = f.reshape(-1, f.shape[-1]).T @ dl.reshape(-1, dl.shape[-1])
    dx = _norm_backward(cfg, x, p, "final_norm", dl @ head.T, g)
    dembed = np.zeros_like(p["embed"])
    if cfg.tie_embeddings:
        dembed += dhead.T
    else:
        g["lm_head"] = dhead

    def lin(pre: str, w: str, bname: str | None, inp: Any, dout: Any) -> Any:
        g[f"{pre}.{w}"] = inp.reshape(-1, inp.shape[-1]).T @ dout.reshape(-1, dout.shape[-1])
        if cfg.bias and bname:
            g[f"{pre}.{bname}"] = dout.reshape(-1, dout.shape[-1]).sum(0)
        return dout @ p[f"{pre}.{w}"].T

    for i in reversed(range(cfg.layers)):
        xi, a, q, k, v, o, x2, c, hp, hh, gate, up, m = tape[i]
        pre = f"layers.{i}"
        dz = _drop(dx, m.get("mlp_out"), cfg.dropout)
        if cfg.mlp == "gelu":
            dhh = lin(pre + ".mlp", "w_out", "b_out", hh, dz)
            dc = lin(pre + ".mlp", "w_in", "b_in", c, dhh * _GELU.grad(hp))
        else:
            dhh = lin(pre + ".mlp", "w_down", None, hh, dz)
            sg = 1.0 / (1.0 + np.exp(-gate))
            dgate = dhh * up * sg * (1.0 + gate * (1.0 - sg))
            dc = lin(pre + ".mlp", "w_gate", None, c, dgate) + lin(pre + ".mlp", "w_up", None, c, dhh * silu(gate))
        dx2 = dx + _norm_backward(cfg, x2, p, pre + ".mlp_norm", dc, g)
        dy = _drop(dx2, m.get("attn_out"), cfg.dropout)
        do = lin(pre + ".attn", "wo", "bo", o, dy).reshape(b, s, n, h)
        dq, dk, dv = attention_backward(q, k, v, do, keep=m.get("attn_probs"), p=cfg.dropout)
        if cfg.position == "rope":
            dq, dk = rope_backward(dq, pos, cfg.rope_theta), rope_backward(dk, pos, cfg.rope_theta)
        da = sum(lin(pre + ".attn", f"w{ch}", f"b{ch}", a, d.reshape(b, s, -1)) for ch, d in zip("qkv", (dq, dk, dv)))
        dx = dx2 + _norm_backward(cfg, xi, p, pre + ".attn_norm", da, g)
    if cfg.position == "learned":
        g["pos_embed"] = np.zeros_like(p["pos_embed"])
        g["pos_embed"][:s] = dx.sum(0)
    np.add.at(dembed, tokens, dx)
    g["embed"] = dembed
    return value, {k: g[k] for k in p}
