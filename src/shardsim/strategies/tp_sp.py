"""Sequence parallelism (Korthikanti et al. 2022) next to plain tensor parallelism, on one block.

The block on tokens ``x[S, D]``: ``Out = x + act(LN(x) @ W_in) @ W_out``, the MLP tensor
parallel over Y as in Megatron-LM (``W_in[D, F_Y]`` by columns, ``W_out[F_Y, D]`` by rows).

``tp_ln`` — Megatron TP. The LayerNorm and the residual run on every chip for every token
(replicated ``[S, D]``); ``f`` is the identity forward and an AllReduce backward, ``g`` the
reverse (Shoeybi et al. 2019, Fig. 3):

    forward:  1. LN(x) → Y[S, D] (every chip)   2. f: identity   3. H[S, F_Y]
              4. Z[S, D]{U_Y}   5. g: AllReduce Y → Z[S, D]   6. Out = x + Z
    backward: 1. g: identity   2. dW_out[F_Y, D]   3. dH[S, F_Y]   4. dW_in[D, F_Y]
              5. dY[S, D]{U_Y}   6. f: AllReduce Y → dY[S, D]   7. LN backward (every chip)
              8. dIn = dOut + dx_LN

``tp_sp`` — TP + sequence parallelism. Outside the TP region the tokens are split over Y
(``[S_Y, D]``): LayerNorm and residual each run on a chip's own S/t tokens and store 1/t
of the activations. ``g`` becomes AllGather forward / ReduceScatter backward, ``ḡ``
ReduceScatter forward / AllGather backward: the same bytes as the AllReduce they replace.

    forward:  1. LN(x[S_Y, D]) → Y[S_Y, D]   2. g: AllGather Y → Y[S, D]   3. H[S, F_Y]
              4. Z[S, D]{U_Y}   5. ḡ: ReduceScatter Y → Z[S_Y, D]   6. Out = x + Z
    backward: 1. ḡ: AllGather Y (dOut) → [S, D]   2. dW_out   3. dH
              4. AllGather Y (Y) again: it was stored split   5. dW_in
              6. g: dY[S, D]{U_Y} → ReduceScatter Y → [S_Y, D]   7. LN backward on own tokens
              8. AllReduce Y (dgamma, dbeta): each chip summed its tokens only   9. dIn

Option ``regather`` (default True, as the paper does): store ``Y`` split and AllGather it
again in the backward pass; False stores the gathered ``Y[S, D]`` (no extra AllGather, S·D
more bytes per chip).

>>> from shardsim.strategies import tp_sp
>>> tp_sp.sp_layouts(tp_sp.Ctx())["x"], tp_sp.tp_layouts(tp_sp.Ctx())["x"]
('[S_Y, D]', '[S, D]')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..array import ShardedArray
from ..collectives import all_gather, all_reduce, reduce_scatter
from ..errors import ShardingError
from ..models import reference_norm as norm
from . import norms
from .base import Ctx, Grads, Params, Saved, Scheme, check_dout, shape_of


# -- LayerNorm on whatever tokens a chip holds (D is never split): shardsim.strategies.norms ----
def layer_norm(x: ShardedArray, gamma: ShardedArray, beta: ShardedArray) -> tuple[ShardedArray, Saved]:
    """``gamma * (x - mu) * rstd + beta`` per token; every op is local (the sums run over D).

    The statistics are kept for the backward pass, as Apex's fused LayerNorm keeps its mean and invvar.
    """
    mu, rstd = norms.statistics("layernorm", x, norm.EPS)  # [S, 1] each
    assert mu is not None  # a LayerNorm's statistics have a mean
    y = norms.forward("layernorm", x, gamma, beta, norm.EPS, norms.Stats(mu, rstd)).named("LN out")
    return y, {"LN in": x, "mu": mu.named("mu"), "rstd": rstd}


def layer_norm_backward(saved: Saved, dy: ShardedArray, gamma: ShardedArray) -> tuple[ShardedArray, Grads]:
    """``dx`` and the weights' gradients; over tokens split on Y those are partial ``{U_Y}``."""
    stats = norms.Stats(saved["mu"], saved["rstd"])
    dx, grads = norms.backward("layernorm", saved["LN in"], gamma, dy, norm.EPS, stats)
    return dx.named("dx LN"), grads


# -- tp_ln: Megatron's f and g --------------------------------------------------------------------
def tp_layouts(ctx: Ctx) -> dict[str, str]:
    Y = ctx.model
    return {
        "x": "[S, D]",
        "gamma": "[D]",
        "beta": "[D]",
        "w_in": f"[D, F_{Y}]",
        "w_out": f"[F_{Y}, D]",
        "out": "[S, D]",
    }


def tp_forward(ctx: Ctx, x: ShardedArray, params: Params) -> tuple[ShardedArray, Saved]:
    Y = ctx.model
    y, saved = layer_norm(x, params["gamma"], params["beta"])  # 1. LN on every chip → Y[S, D]
    h_pre = (y @ params["w_in"]).named("H_pre")  # 2-3. f = identity; H[S, F_Y]
    h = ctx.act(h_pre)
    z = all_reduce(h @ params["w_out"], Y, label="Z")  # 4-5. Z[S, D]{U_Y} → g: AllReduce Y → Z[S, D]
    out = (x + z).named("Out")  # 6. residual
    return out, {**saved, "LN out": y, "H_pre": h_pre, "H": h}


def tp_backward(ctx: Ctx, saved: Saved, dout: ShardedArray, params: Params) -> tuple[ShardedArray, Grads]:
    Y = ctx.model
    y, h_pre, h = saved["LN out"], saved["H_pre"], saved["H"]
    dw_out = (h.T @ dout).named("dW_out")  # 1-2. g = identity; dW_out[F_Y, D]
    dh = ctx.act_backward(dout @ params["w_out"].T, h_pre)  # 3. dH[S, F_Y]
    dw_in = (y.T @ dh).named("dW_in")  # 4. dW_in[D, F_Y]
    dy = all_reduce(dh @ params["w_in"].T, Y, label="dY")  # 5-6. dY[S, D]{U_Y} → f: AllReduce Y
    dx_ln, dln = layer_norm_backward(saved, dy, params["gamma"])  # 7. LN backward on every chip
    dx = (dout + dx_ln).named("dIn")  # 8. the residual passes dOut through
    return dx, {**dln, "w_in": dw_in, "w_out": dw_out}


# -- tp_sp: the tokens split over Y outside the TP region ----------------------------------------
def sp_layouts(ctx: Ctx) -> dict[str, str]:
    Y = ctx.model
    return {
        "x": f"[S_{Y}, D]",
        "gamma": "[D]",
        "beta": "[D]",
        "w_in": f"[D, F_{Y}]",
        "w_out": f"[F_{Y}, D]",
        "out": f"[S_{Y}, D]",
    }


def sp_forward(ctx: Ctx, x: ShardedArray, params: Params) -> tuple[ShardedArray, Saved]:
    Y = ctx.model
    y, saved = layer_norm(x, params["gamma"], params["beta"])  # 1. LN on own tokens → Y[S_Y, D]
    y_full = all_gather(y, Y, label="LN out")  # 2. g: AllGather Y → Y[S, D]
    h_pre = (y_full @ params["w_in"]).named("H_pre")  # 3. H[S, F_Y]
    h = ctx.act(h_pre)
    z = reduce_scatter(h @ params["w_out"], Y, "S", label="Z")  # 4-5. Z[S, D]{U_Y} → ḡ: ReduceScatter Y
    out = (x + z).named("Out")  # 6. residual on own tokens: Out[S_Y, D]
    kept = {"LN out": y} if ctx.options.get("regather", True) else {"LN out (gathered)": y_full}
    return out, {**saved, **kept, "H_pre": h_pre, "H": h}


def sp_backward(ctx: Ctx, saved: Saved, dout: ShardedArray, params: Params) -> tuple[ShardedArray, Grads]:
    Y = ctx.model
    h_pre, h = saved["H_pre"], saved["H"]
    dout_full = all_gather(dout, Y, label="dOut")  # 1. ḡ backward: AllGather Y → dOut[S, D]
    dw_out = (h.T @ dout_full).named("dW_out")  # 2. dW_out[F_Y, D]
    dh = ctx.act_backward(dout_full @ params["w_out"].T, h_pre)  # 3. dH[S, F_Y]
    del dout_full
    stored_split = "LN out" in saved  # 4. Y was stored split: AllGather Y again
    y_full = all_gather(saved["LN out"], Y, label="LN out") if stored_split else saved["LN out (gathered)"]
    dw_in = (y_full.T @ dh).named("dW_in")  # 5. dW_in[D, F_Y]
    del y_full
    dy = reduce_scatter(dh @ params["w_in"].T, Y, "S", label="dY")  # 6. g backward: ReduceScatter Y
    dx_ln, dln = layer_norm_backward(saved, dy, params["gamma"])  # 7. LN backward on own tokens
    dln = {k: all_reduce(g, Y, label=f"d{k}") for k, g in dln.items()}  # 8. AllReduce Y: all tokens' sum
    dx = (dout + dx_ln).named("dIn")  # 9. dIn[S_Y, D]
    return dx, {**dln, "w_in": dw_in, "w_out": dw_out}


# -- reference and checks ---------------------------------------------------------------------
def reference(
    params: Mapping[str, np.ndarray], x: np.ndarray, dout: np.ndarray, activation: str = "identity", **options: Any
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The block on one device (:mod:`shardsim.norm`): ``(out, {"x", "gamma", "beta", "w_in", "w_out"})``."""
    p = dict(params)
    return norm.block_forward(p, x, activation), norm.block_backward(p, x, dout, activation)


def check_shapes(params: Mapping[str, Any], x: Any, dout: Any) -> None:
    if len(shape_of(x)) != 2:
        raise ShardingError(f"x must be tokens [S, D], got shape {shape_of(x)}")
    s, d = shape_of(x)
    f = shape_of(params["w_in"])[-1] if len(shape_of(params["w_in"])) == 2 else None
    want = {"gamma": (d,), "beta": (d,), "w_in": (d, f), "w_out": (f, d)}
    for k, w in want.items():
        if shape_of(params[k]) != w:
            raise ShardingError(f"{k} must have shape {w} for x of shape {(s, d)}, got {shape_of(params[k])}")
    check_dout(dout, "[S, D]", (s, d))


SCHEMES = (
    Scheme(
        "tp_ln",
        roles=("model",),
        layouts=tp_layouts,
        forward=tp_forward,
        backward=tp_backward,
        check_shapes=check_shapes,
        summary="LayerNorm → TP MLP → residual, Megatron's f/g: LN and residual replicated; an AllReduce each way",
        init=norm.init,
        reference=reference,
    ),
    Scheme(
        "tp_sp",
        roles=("model",),
        layouts=sp_layouts,
        forward=sp_forward,
        backward=sp_backward,
        check_shapes=check_shapes,
        summary="tensor + sequence parallel: LN and residual on S/t tokens; AllGather in, ReduceScatter out",
        init=norm.init,
        reference=reference,
        options=("regather",),
    ),
)
