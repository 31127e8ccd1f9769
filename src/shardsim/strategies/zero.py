"""ZeRO stages 1 and 2 — DDP with the redundant state sharded (stage 3 is FSDP: ``zero3``).

Seed, stage 1: "Each worker updates one parameter slice. Everyone computes a full gradient
→ reduce-scatter gradients → each does its slice's update → all-gather updated params.
That's reduce-scatter + all-gather = one all-reduce — identical comms to DDP."

Seed, stage 2: "You can't materialize the whole gradient, but you don't need to: sweep
backward and reduce-scatter each layer's gradient to its owner as you go, freeing it
immediately."

The forward pass is DDP's and so is the backward's arithmetic; what differs is where each
gradient lives and when it is reduced, and who updates what:

======  ===================  ==========================================  ===================
stage   weights              gradients                                   optimizer state
======  ===================  ==========================================  ===================
ddp     W[D, F] on all       AllReduce X per layer → dW[D, F]            whole, on all
zero1   W[D, F] on all       kept whole {U_X} until the step, then       slice [D_X, F]
                             ReduceScatter X → dW[D_X, F]
zero2   W[D, F] on all       ReduceScatter X per layer → dW[D_X, F]      slice [D_X, F]
zero3   W[D_X, F] (fsdp)     ReduceScatter X per layer → dW[D_X, F]      slice [D_X, F]
======  ===================  ==========================================  ===================

The optimizer step of stages 1 and 2 (run by :mod:`shardsim.training`):

    1. ReduceScatter X (dW) → dW[D_X, F]      stage 1 only: stage 2 did it in the backward
    2. each chip updates its slice of the weights and optimizer state → W[D_X, F]
    3. AllGather X (W) → W[D, F]              every chip has the whole updated model again

:func:`shardsim.run_strategy` runs forward and backward only, so for ``zero1`` the
ReduceScatter of step 1 closes its backward phase there (it returns the reduced slices).

>>> from shardsim.strategies import zero
>>> zero.slice_layouts(zero.Ctx())
{'w_in': '[D_X, F]', 'w_out': '[F_X, D]'}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..array import ShardedArray
from ..collectives import all_gather, reduce_scatter
from . import ddp, fsdp
from .base import Ctx, Grads, Params, Saved, Scheme, check_mlp_shapes


@dataclass(frozen=True)
class ZeroScheme(Scheme):
    """A data-parallel scheme whose optimizer state lives in slices (ZeRO stage 1 or 2).

    ``state_layouts(ctx)`` is the layout of each weight's optimizer state (and of its
    reduced gradient); ``reduce_gradients`` runs once the backward pass is done (stage 1);
    ``gather_params`` rebuilds the whole weights from the updated slices.
    """

    stage: int = 1
    state_layouts: Callable[[Ctx], dict[str, str]] | None = None
    reduce_gradients: Callable[[Ctx, Grads], Grads] | None = None
    gather_params: Callable[[Ctx, Params], Params] | None = None


layouts = ddp.layouts  # In[B_X, D] · W_in[D, F] · W_out[F, D] → Out[B_X, D], as DDP
forward = ddp.forward  # 1. H = In @ W_in   2. Out = act(H) @ W_out: local, as DDP


def slice_layouts(ctx: Ctx) -> dict[str, str]:
    """Each chip's share of the optimizer state: the rows FSDP would keep (``[D_X, F]``, ``[F_X, D]``)."""
    X = ctx.data
    return {"w_in": f"[D_{X}, F]", "w_out": f"[F_{X}, D]"}


def backward_stage1(ctx: Ctx, saved: Saved, dout: ShardedArray, params: Params) -> tuple[ShardedArray, Grads]:
    w_in, w_out = params["w_in"], params["w_out"]
    x, h_pre, h = saved["In"], saved["H_pre"], saved["H"]
    dw_out = (h.T @ dout).named("dW_out")  # 1. dW_out[F, D]{U_X}: the full local gradient, kept
    dh = ctx.act_backward(dout @ w_out.T, h_pre)  # 2. dH[B_X, F]
    dw_in = (x.T @ dh).named("dW_in")  # 3. dW_in[D, F]{U_X}: kept
    dx = (dh @ w_in.T).named("dIn")  # 4. dIn[B_X, D]
    return dx, {"w_in": dw_in, "w_out": dw_out}


def reduce_gradients(ctx: Ctx, grads: Grads) -> Grads:
    """Stage 1, after the whole backward pass: ReduceScatter X each full gradient to its owner."""
    X = ctx.data
    dw_in = reduce_scatter(grads["w_in"], X, "D", label="dW_in")  # 1. ReduceScatter X → dW_in[D_X, F]
    dw_out = reduce_scatter(grads["w_out"], X, "F", label="dW_out")  # 1. ReduceScatter X → dW_out[F_X, D]
    return {"w_in": dw_in, "w_out": dw_out}


def backward_stage2(ctx: Ctx, saved: Saved, dout: ShardedArray, params: Params) -> tuple[ShardedArray, Grads]:
    w_in, w_out = params["w_in"], params["w_out"]
    X = ctx.data
    x, h_pre, h = saved["In"], saved["H_pre"], saved["H"]
    dw_out = reduce_scatter(h.T @ dout, X, "F", label="dW_out")  # 1. dW_out{U_X} → RS X → [F_X, D]; full one freed
    dh = ctx.act_backward(dout @ w_out.T, h_pre)  # 2. dH[B_X, F]
    dw_in = reduce_scatter(x.T @ dh, X, "D", label="dW_in")  # 3. dW_in{U_X} → RS X → [D_X, F]; full one freed
    dx = (dh @ w_in.T).named("dIn")  # 4. dIn[B_X, D]
    return dx, {"w_in": dw_in, "w_out": dw_out}


def gather_params(ctx: Ctx, slices: Params) -> Params:
    """Stages 1 and 2, after each chip updated its slice: AllGather X the whole weights back."""
    X = ctx.data
    return {k: all_gather(w, X, label=w.label) for k, w in slices.items()}  # 3. AllGather X → W[D, F]


ZERO1 = ZeroScheme(
    "zero1",
    roles=("data",),
    layouts=layouts,
    forward=forward,
    backward=backward_stage1,
    check_shapes=check_mlp_shapes,
    summary="ZeRO-1: DDP with the optimizer state in slices; ReduceScatter the gradients, AllGather the weights",
    stage=1,
    state_layouts=slice_layouts,
    reduce_gradients=reduce_gradients,
    gather_params=gather_params,
)

ZERO2 = replace(  # stage 1 with the gradients reduced in the backward pass instead of after it
    ZERO1,
    name="zero2",
    backward=backward_stage2,
    summary="ZeRO-2: gradients in slices too, ReduceScattered layer by layer as the backward pass sweeps",
    stage=2,
    reduce_gradients=None,
)

ZERO3 = replace(fsdp.SCHEME, name="zero3", summary="ZeRO-3: the same scheme as fsdp (weights in slices too)")

SCHEMES: tuple[Scheme, ...] = (ZERO1, ZERO2, ZERO3)


def stage(scheme: Scheme) -> int | None:
    """The ZeRO stage a scheme's model state follows (ddp 0, fsdp/zero3 3), None if not data-parallel.

    >>> stage(ZERO2), stage(ddp.SCHEME), stage(ZERO3)
    (2, 0, 3)
    """
    if isinstance(scheme, ZeroScheme):
        return scheme.stage
    return {"ddp": 0, "fsdp": 3, "zero3": 3}.get(scheme.name)


def state_layouts(scheme: Scheme, ctx: Ctx) -> dict[str, str]:
    """The layout of each weight's optimizer state: its slices for ZeRO-1/2, else the weight's own.

    >>> state_layouts(ZERO1, Ctx())["w_in"], state_layouts(ddp.SCHEME, Ctx())["w_in"]
    ('[D_X, F]', '[D, F]')
    """
    if isinstance(scheme, ZeroScheme) and scheme.state_layouts is not None:
        return scheme.state_layouts(ctx)
    lay = scheme.layouts(ctx)
    return {k: v for k, v in lay.items() if k not in ("x", "out")}
