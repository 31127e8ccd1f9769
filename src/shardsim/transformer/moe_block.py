"""The transformer's MLP as a mixture of experts: GShard's router, top-k and AllToAll, in a block.

The steps are the expert-parallel scheme's own (:mod:`shardsim.strategies.ep`), run on the
block's tokens. The expert axis splits the experts ``[E_expert, D, F]`` and, everywhere else
in the model, the batch: attention is data parallel over it, so each chip routes its own
tokens and the AllToAll over the expert axis takes them to their experts and back.

MoE, forward (x: ``[B_{data,expert}, S, D]``)
    1. Cn = Norm(x)                           [B, S, D]  (SP: AllGather the sequence)
    2. the ep scheme on the tokens [T, D]: router, top-k, dispatch, AllToAll expert,
       the experts, AllToAll expert, combine  (each sequence a group; past the config's
       capacity a token's expert is dropped, as the reference drops it)
    3. x + dropout(.)                         (SP: each chip keeps its own S/t rows)

Under tensor parallelism each model-axis chip runs the experts on the same tokens (the
experts are not split over the model axis), so nothing crosses the model axis but the
sequence-parallel AllGather. The experts' weight gradients are reduced inside the ep
backward (the router's over data and expert axes, the experts' over the data axis).
"""

from __future__ import annotations

from ..array import ShardedArray
from ..strategies import ep
from ..strategies.base import Ctx
from . import norms
from .local import flat_tokens, scatter_to, unflat_tokens
from .step import Step

Saved = dict[str, ShardedArray]
Grads = dict[str, ShardedArray]
WEIGHTS = ("router", "w_in", "w_out")


def _ctx(step: Step, tokens: ShardedArray) -> Ctx:
    """The ep scheme's axes and routing for ``tokens [B, S, D]``: top_k, and with a capacity
    factor each sequence one group of ``cfg.expert_capacity(S)`` slots per expert, as the
    reference routes them."""
    r, cfg = step.roles, step.cfg
    axes = {role: axis for role, axis in (("data", r.data), ("expert", r.expert)) if axis is not None}
    options: dict[str, int] = {"top_k": cfg.top_k}
    capacity = cfg.expert_capacity(tokens.global_shape[1])
    if capacity is not None:
        options.update(capacity=capacity, groups=tokens.global_shape[0])
    return Ctx(axes=axes, activation="gelu", options=options)


def _weights(step: Step, i: int) -> dict[str, ShardedArray]:
    return {k: step.w(f"layers.{i}.moe.{k}") for k in WEIGHTS}


def _own_rows(step: Step, y: ShardedArray) -> ShardedArray:
    """Under SP, each model chip's S/t rows of a value every model chip holds whole (no communication)."""
    return scatter_to(y, 1, step.roles.seq) if step.roles.seq is not None else y


def forward(step: Step, i: int, x: ShardedArray) -> tuple[ShardedArray, Saved]:
    cfg = step.cfg
    beta = f"layers.{i}.mlp_norm.beta"
    gamma = step.w(f"layers.{i}.mlp_norm.gamma")
    c = norms.forward(cfg.norm, x, gamma, step.w(beta) if step.has(beta) else None, cfg.norm_eps).named("Cn")  # 1.
    c_full = step.enter(c, "Cn")
    y, kept = ep.forward(_ctx(step, c_full), flat_tokens(c_full).named("Tokens"), _weights(step, i))  # 2.
    y = _own_rows(step, unflat_tokens(y, c_full).named("MoE out"))
    del c_full
    saved: Saved = {"x": x, "Cn": c, **{f"moe {k}": v for k, v in kept.items()}}
    mask = step.mask(i, "mlp_out", y, step.roles.act())
    if mask is not None:
        saved["mask mlp_out"] = mask
    return (x + step.drop(y, mask)).named("x"), saved  # 3.


def backward(step: Step, i: int, saved: Saved, dout: ShardedArray) -> tuple[ShardedArray, Grads]:
    cfg = step.cfg
    dz = step.enter(step.drop(dout, saved.get("mask mlp_out")), "dMoE out")  # 3.
    kept = {k[4:]: saved.pop(k) for k in list(saved) if k.startswith("moe ")}
    dtok, g = ep.backward(_ctx(step, dz), kept, flat_tokens(dz), _weights(step, i))  # 2.
    del kept
    dc = _own_rows(step, unflat_tokens(dtok, dz).named("dCn"))
    del dz, dtok
    grads: Grads = {f"layers.{i}.moe.{k}": v for k, v in g.items()}
    prefix = f"layers.{i}.mlp_norm"
    dx, ng = norms.backward(cfg.norm, saved["x"], step.w(f"{prefix}.gamma"), dc, cfg.norm_eps)  # 1.
    for k, v in ng.items():
        grads[f"{prefix}.{k}"] = step.over_model(v)
    return (dout + dx).named("dx"), grads
