"""FSDP (ZeRO-3) — split batch and weights.

Seed: "Same data-parallel batch split as DDP, but the weights are sharded into row-slices.
Each layer does an AllGather to rebuild the full weight just before the matmul, then frees
it; gradients are ReduceScattered back into slices."

    In[B_X, D] · W_in[D_X, F] · W_out[F_X, D] → Out[B_X, D]

(The scaling book slices W_out by columns, ``W_out[F, D_X]``; the seed's row slices
``F_X`` cost the same bytes. Both are ZeRO-3.)

>>> from shardsim.strategies import fsdp
>>> fsdp.layouts(fsdp.Ctx())["w_out"]
'[F_X, D]'
"""

from __future__ import annotations

from ..array import ShardedArray
from ..collectives import all_gather, reduce_scatter
from .base import Ctx, Grads, Params, Saved, Scheme, check_mlp_shapes


def layouts(ctx: Ctx) -> dict[str, str]:
    X = ctx.data
    return {"x": f"[B_{X}, D]", "w_in": f"[D_{X}, F]", "w_out": f"[F_{X}, D]", "out": f"[B_{X}, D]"}


def forward(ctx: Ctx, x: ShardedArray, params: Params) -> tuple[ShardedArray, Saved]:
    w_in, w_out = params["w_in"], params["w_out"]
    X = ctx.data
    w_in_full = all_gather(w_in, X)  # 1. AllGather X (W_in) → W_in[D, F]
    h_pre = (x @ w_in_full).named("H_pre")  # 2. H[B_X, F]
    del w_in_full  # 3. free the full W_in
    h = ctx.act(h_pre)
    w_out_full = all_gather(w_out, X)  # 4. AllGather X (W_out) → W_out[F, D]
    out = (h @ w_out_full).named("Out")  # 5. Out[B_X, D]
    del w_out_full  # 6. free the full W_out
    return out, {"In": x, "H_pre": h_pre, "H": h}


def backward(ctx: Ctx, saved: Saved, dout: ShardedArray, params: Params) -> tuple[ShardedArray, Grads]:
    w_in, w_out = params["w_in"], params["w_out"]
    X = ctx.data
    x, h_pre, h = saved["In"], saved["H_pre"], saved["H"]
    w_out_full = all_gather(w_out, X)  # 1. AllGather X (W_out) again
    dw_out = reduce_scatter(h.T @ dout, X, "F", label="dW_out")  # 2. dW_out[F, D]{U_X} → ReduceScatter X → [F_X, D]
    dh = ctx.act_backward(dout @ w_out_full.T, h_pre)  # 3. dH[B_X, F]
    del w_out_full
    w_in_full = all_gather(w_in, X)  # 4. AllGather X (W_in) again
    dw_in = reduce_scatter(x.T @ dh, X, "D", label="dW_in")  # 5. dW_in[D, F]{U_X} → ReduceScatter X → [D_X, F]
    dx = (dh @ w_in_full.T).named("dIn")  # 6. dIn[B_X, D]
    del w_in_full
    return dx, {"w_in": dw_in, "w_out": dw_out}


SCHEME = Scheme(
    "fsdp",
    roles=("data",),
    layouts=layouts,
    forward=forward,
    backward=backward,
    check_shapes=check_mlp_shapes,
    summary="split batch and weight rows; AllGather each weight to use it, ReduceScatter its gradient",
)
