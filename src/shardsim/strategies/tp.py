"""Tensor parallelism — split weights, replicate batch.

Seed: "The batch is not sharded — it is replicated [...] What is split is the model: the
weights (W_in by columns, W_out by matching rows) and the activations along d_model
(In[B, D_Y]). An AllGather rebuilds the full embedding before the matmul, and a
ReduceScatter at the end keeps the output sharded (Out[B, D_Y])."

    In[B, D_Y] · W_in[D, F_Y] · W_out[F_Y, D] → Out[B, D_Y]

The backward pass is the dual: AllGather dOut, ReduceScatter dIn; the weight gradients need
no communication. The gathered input is kept for dW_in (full size on every chip).

>>> from shardsim.strategies import tp
>>> tp.layouts(tp.Ctx())["w_in"]
'[D, F_Y]'
"""

from __future__ import annotations

from ..array import ShardedArray
from ..collectives import all_gather, reduce_scatter
from .base import Ctx, Grads, Params, Saved, Scheme, check_mlp_shapes


def layouts(ctx: Ctx) -> dict[str, str]:
    Y = ctx.model
    return {"x": f"[B, D_{Y}]", "w_in": f"[D, F_{Y}]", "w_out": f"[F_{Y}, D]", "out": f"[B, D_{Y}]"}


def forward(ctx: Ctx, x: ShardedArray, params: Params) -> tuple[ShardedArray, Saved]:
    w_in, w_out = params["w_in"], params["w_out"]
    Y = ctx.model
    x_full = all_gather(x, Y, label="In")  # 1. AllGather Y (activations) → In[B, D]
    h_pre = (x_full @ w_in).named("H_pre")  # 2. H[B, F_Y]: d_model fully present
    h = ctx.act(h_pre)
    out = h @ w_out  # 3. Out[B, D]{U_Y}: each chip summed its F slice
    out = reduce_scatter(out, Y, "D", label="Out")  # 4. ReduceScatter Y → Out[B, D_Y]
    return out, {"In (gathered)": x_full, "H_pre": h_pre, "H": h}


def backward(ctx: Ctx, saved: Saved, dout: ShardedArray, params: Params) -> tuple[ShardedArray, Grads]:
    w_in, w_out = params["w_in"], params["w_out"]
    Y = ctx.model
    x_full, h_pre, h = saved["In (gathered)"], saved["H_pre"], saved["H"]
    dout_full = all_gather(dout, Y, label="dOut")  # 1. AllGather Y (dOut) → dOut[B, D]
    dw_out = (h.T @ dout_full).named("dW_out")  # 2. dW_out[F_Y, D]: local
    dh = ctx.act_backward(dout_full @ w_out.T, h_pre)  # 3. dH[B, F_Y]
    dw_in = (x_full.T @ dh).named("dW_in")  # 4. dW_in[D, F_Y]: local
    dx = reduce_scatter(dh @ w_in.T, Y, "D", label="dIn")  # 5. dIn[B, D]{U_Y} → ReduceScatter Y → [B, D_Y]
    return dx, {"w_in": dw_in, "w_out": dw_out}


SCHEME = Scheme(
    "tp",
    roles=("model",),
    layouts=layouts,
    forward=forward,
    backward=backward,
    check_shapes=check_mlp_shapes,
    summary="replicate batch, split weights (W_in by columns, W_out by rows); AllGather in, ReduceScatter out",
)
