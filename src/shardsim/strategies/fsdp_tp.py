"""Mixed FSDP + TP on a 2-D mesh: axis X = FSDP (data), axis Y = TP (model).

Seed: "Everything is doubly-sharded: the input is In[B_X, D_Y] [...] and the weights are
quadrants, W_in[D_X, F_Y] and W_out[F_Y, D_X]." The forward pass is exactly one
AllGather-Y (activations), two AllGather-X (the two weights) and one ReduceScatter-Y
(output). The backward pass follows the scaling book's algorithm: AllGather-Y dOut,
ReduceScatter-X dW_out, AllGather-X W_out, AllGather-Y In (re-gathered, so the stored input
stays split over Y), ReduceScatter-X dW_in, AllGather-X W_in, ReduceScatter-Y dIn.

    In[B_X, D_Y] · W_in[D_X, F_Y] · W_out[F_Y, D_X] → Out[B_X, D_Y]

>>> from shardsim.strategies import fsdp_tp
>>> fsdp_tp.layouts(fsdp_tp.Ctx())["w_out"]
'[F_Y, D_X]'
"""

from __future__ import annotations

from ..array import ShardedArray
from ..collectives import all_gather, reduce_scatter
from .base import Ctx, Grads, Params, Saved, Scheme, check_mlp_shapes


def layouts(ctx: Ctx) -> dict[str, str]:
    X, Y = ctx.data, ctx.model
    return {"x": f"[B_{X}, D_{Y}]", "w_in": f"[D_{X}, F_{Y}]", "w_out": f"[F_{Y}, D_{X}]", "out": f"[B_{X}, D_{Y}]"}


def forward(ctx: Ctx, x: ShardedArray, params: Params) -> tuple[ShardedArray, Saved]:
    w_in, w_out = params["w_in"], params["w_out"]
    X, Y = ctx.data, ctx.model
    x_full = all_gather(x, Y, label="In")  # 1. AllGather Y (activations) → In[B_X, D]
    w_in_full = all_gather(w_in, X)  # 2. AllGather X (W_in) → W_in[D, F_Y]
    h_pre = (x_full @ w_in_full).named("H_pre")  # 3. matmul 1 → H[B_X, F_Y]
    del x_full, w_in_full
    h = ctx.act(h_pre)
    w_out_full = all_gather(w_out, X)  # 4. AllGather X (W_out) → W_out[F_Y, D]
    out = h @ w_out_full  # 5. matmul 2 → Out[B_X, D]{U_Y}
    del w_out_full
    out = reduce_scatter(out, Y, "D", label="Out")  # 6. ReduceScatter Y → Out[B_X, D_Y]
    return out, {"In": x, "H_pre": h_pre, "H": h}


def backward(ctx: Ctx, saved: Saved, dout: ShardedArray, params: Params) -> tuple[ShardedArray, Grads]:
    w_in, w_out = params["w_in"], params["w_out"]
    X, Y = ctx.data, ctx.model
    x, h_pre, h = saved["In"], saved["H_pre"], saved["H"]
    dout_full = all_gather(dout, Y, label="dOut")  # 1. AllGather Y (dOut) → dOut[B_X, D]
    dw_out = reduce_scatter(h.T @ dout_full, X, "D", label="dW_out")  # 2. dW_out[F_Y, D]{U_X} → RS X → [F_Y, D_X]
    w_out_full = all_gather(w_out, X)  # 3. AllGather X (W_out) → W_out[F_Y, D]
    dh = ctx.act_backward(dout_full @ w_out_full.T, h_pre)  # 4. dH[B_X, F_Y]
    del dout_full, w_out_full
    x_full = all_gather(x, Y, label="In")  # 5. AllGather Y (In) → In[B_X, D]
    dw_in = reduce_scatter(x_full.T @ dh, X, "D", label="dW_in")  # 6. dW_in[D, F_Y]{U_X} → RS X → [D_X, F_Y]
    del x_full
    w_in_full = all_gather(w_in, X)  # 7. AllGather X (W_in) → W_in[D, F_Y]
    dx = reduce_scatter(dh @ w_in_full.T, Y, "D", label="dIn")  # 8. dIn[B_X, D]{U_Y} → RS Y → [B_X, D_Y]
    return dx, {"w_in": dw_in, "w_out": dw_out}


SCHEME = Scheme(
    "fsdp_tp",
    roles=("data", "model"),
    layouts=layouts,
    forward=forward,
    backward=backward,
    check_shapes=check_mlp_shapes,
    summary="FSDP over X and TP over Y at once: AllGather-X for weights, AllGather/ReduceScatter-Y for activations",
)
