"""DDP — replicate weights, split batch.

Seed: "Every chip holds the whole model and runs its own token. The forward pass is entirely
local (no communication). The only synchronization is a single AllReduce of the gradients
in the backward pass." Memory-heavy: the full model lives on every chip.

    In[B_X, D] · W_in[D, F] · W_out[F, D] → Out[B_X, D]

>>> from shardsim.strategies import ddp
>>> ddp.layouts(ddp.Ctx())["x"]
'[B_X, D]'
"""

from __future__ import annotations

from ..array import ShardedArray
from ..collectives import all_reduce
from .base import Ctx, Grads, Params, Saved, Scheme, check_mlp_shapes


def layouts(ctx: Ctx) -> dict[str, str]:
    X = ctx.data
    return {"x": f"[B_{X}, D]", "w_in": "[D, F]", "w_out": "[F, D]", "out": f"[B_{X}, D]"}


def forward(ctx: Ctx, x: ShardedArray, params: Params) -> tuple[ShardedArray, Saved]:
    w_in, w_out = params["w_in"], params["w_out"]
    h_pre = (x @ w_in).named("H_pre")  # 1. H[B_X, F]: local, weights are whole on every chip
    h = ctx.act(h_pre)
    out = (h @ w_out).named("Out")  # 2. Out[B_X, D]: local
    return out, {"In": x, "H_pre": h_pre, "H": h}


def backward(ctx: Ctx, saved: Saved, dout: ShardedArray, params: Params) -> tuple[ShardedArray, Grads]:
    w_in, w_out = params["w_in"], params["w_out"]
    X = ctx.data
    x, h_pre, h = saved["In"], saved["H_pre"], saved["H"]
    dw_out = h.T @ dout  # 1. dW_out[F, D]{U_X}: each chip's tokens only
    dw_out = all_reduce(dw_out, X, label="dW_out")  # 2. AllReduce X → dW_out[F, D]
    dh = ctx.act_backward(dout @ w_out.T, h_pre)  # 3. dH[B_X, F]: local
    dw_in = x.T @ dh  # 4. dW_in[D, F]{U_X}
    dw_in = all_reduce(dw_in, X, label="dW_in")  # 5. AllReduce X → dW_in[D, F]
    dx = (dh @ w_in.T).named("dIn")  # 6. dIn[B_X, D]: local
    return dx, {"w_in": dw_in, "w_out": dw_out}


SCHEME = Scheme(
    "ddp",
    roles=("data",),
    layouts=layouts,
    forward=forward,
    backward=backward,
    check_shapes=check_mlp_shapes,
    summary="replicate weights, split batch; one AllReduce per weight gradient",
)
