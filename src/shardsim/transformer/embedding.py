"""Vocabulary-parallel embedding and cross-entropy (Megatron-LM): the logits are never gathered.

The model axis splits the vocabulary: chip j owns rows ``j*V/t .. (j+1)*V/t`` of ``embed``
and the same columns of ``lm_head``.

Embedding, forward
    1. E = embed[tokens] from own rows, zero elsewhere     [B, S, D]{U_Y}
    2. leave: AllReduce Y (TP) or ReduceScatter Y over S (SP)
    3. + pos_embed (learned positions; under SP each chip adds its own S/t rows)
Cross-entropy, forward (logits ``[B, S, V_Y]`` after the column-parallel LM head)
    1. each chip's max per token; AllGather Y of those t numbers, max of them   [B, S, 1]
       (shardsim's AllReduce sums; Megatron's AllReduce-max moves the same few bytes)
    2. sum of exp(logits - max) over own columns, AllReduce Y                    [B, S, 1]
    3. the target's logit on the chip owning it, 0 elsewhere, AllReduce Y        [B, S]
    4. loss per token = log(sum exp) + max - target logit
Backward: ``dLogits = (softmax - onehot) / (B*S)`` on own columns (no communication);
the embedding's backward adds ``dx`` rows into own vocabulary rows (SP: after AllGather Y).

>>> SITES
('max', 'sum exp', 'target logit')
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import numpy as np

from ..array import ShardedArray
from ..collectives import all_gather, all_reduce
from ..ops import cast, map_blocks, sum_dim
from ..xp import namespace
from . import norms
from .context_parallel import permute_rows, position_grads
from .local import (
    embed_lookup,
    embed_scatter,
    flat_tokens,
    largest,
    minus_onehot,
    rows,
    scatter_to,
    target_logit,
    vocab_max,
)
from .step import Step
from .weight_pass import WeightGrads

SITES = ("max", "sum exp", "target logit")


def embed_forward(step: Step, tokens: ShardedArray) -> ShardedArray:
    r, cfg = step.roles, step.cfg
    e = step.leave(embed_lookup(step.w("embed"), tokens, r.model), "Embedded")  # 1-2.
    if cfg.position != "learned":
        return e.named("x")
    pos = step.w("pos_embed")
    s = tokens.global_shape[1]
    if s < cfg.seq:
        pos = rows(pos, s)
    if r.context is not None:  # each row's own position, then the context block's rows
        assert step.rows is not None
        pos = scatter_to(permute_rows(pos, step.rows, "pos_embed"), 0, r.context)
    if r.seq is not None:
        pos = scatter_to(pos, 0, r.seq)  # own S/t rows: no communication
    return (e + pos).named("x")  # 3.


def embed_backward(step: Step, tokens: ShardedArray, dx: ShardedArray) -> dict[str, ShardedArray]:
    """``{"embed": dEmbed, "pos_embed": dPos}``, partial over the data axis (pos_embed rows ``[:S]``)."""
    r = step.roles
    full = step.enter(dx, "dx")  # SP: the embedding's ReduceScatter backward is an AllGather
    token_axes = tuple(a for a in (*r.batch, r.context) if a is not None)
    grads = {"embed": embed_scatter(full, tokens, step.cfg.vocab, r.model, token_axes)}
    if step.cfg.position == "learned":
        if r.context is not None:  # each row's gradient into the row of its real position
            assert step.positions is not None
            grads["pos_embed"] = position_grads(full, step.positions, token_axes)
        else:
            grads["pos_embed"] = sum_dim(full, "B", label="dpos_embed")
    return grads


def _logit_dtype(x: ShardedArray) -> np.dtype:
    return np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)


def head_forward(
    step: Step, x: ShardedArray, targets: ShardedArray
) -> tuple[dict[str, ShardedArray], dict[str, ShardedArray]]:
    """Final norm, LM head and vocabulary-parallel cross-entropy: ``(per-token parts, saved)``."""
    r, cfg = step.roles, step.cfg
    beta = step.w("final_norm.beta") if step.has("final_norm.beta") else None
    f = norms.forward(cfg.norm, x, step.w("final_norm.gamma"), beta, cfg.norm_eps).named("F")
    f_full = step.enter(f, "F")
    head = step.w("embed").T if cfg.tie_embeddings else step.w("lm_head")
    logits = cast(f_full @ head, _logit_dtype(f_full), label="Logits")  # [B, S, V_Y], never gathered
    del f_full, head
    m = vocab_max(logits, r.model)  # 1.
    if r.model is not None:
        m = all_gather(m, r.model, label="max")
    m = largest(m)
    e = map_blocks(logits - m, lambda a: namespace(a).exp(a), "exp")
    z = sum_dim(e, "V", keepdims=True, label="sum exp")  # 2.
    if r.model is not None:
        z = all_reduce(z, r.model, label="sum exp")
    probs = (e / z).named("Softmax")
    del e
    t = target_logit(logits, targets, r.model)  # 3.
    if r.model is not None:
        t = all_reduce(t, r.model, label="target logit")
    return {"max": m, "sum exp": z, "target logit": t}, {"x": x, "F": f, "Softmax": probs}


def loss_value(parts: Mapping[str, ShardedArray]) -> float:
    """The mean over all tokens of ``log(sum exp) + max - target logit`` (read on the host)."""
    return mean_loss(*(parts[k].to_global() for k in LOSS_PARTS))


LOSS_PARTS = ("sum exp", "max", "target logit")
"""The cross-entropy's per-token parts :func:`head_forward` returns, in :func:`mean_loss`'s order."""


def mean_loss(sum_exp: np.ndarray, largest: np.ndarray, target_logit: np.ndarray) -> float:
    """``mean(log(sum exp) + max - target logit)`` of the global ``[B, S, 1]``, ``[B, S, 1]``, ``[B, S]`` parts.

    >>> mean_loss(np.ones((1, 2, 1)), np.zeros((1, 2, 1)), np.array([[0.0, 1.0]]))
    -0.5
    """
    return float(np.mean(np.log(sum_exp[..., 0]) + largest[..., 0] - target_logit))


def _head_grad(f_full: ShardedArray, dlogits: ShardedArray) -> ShardedArray:
    return (flat_tokens(f_full).T @ flat_tokens(dlogits)).named("dlm_head")


def _head_grads(step: Step, key: str, f: ShardedArray, dlogits: ShardedArray) -> dict[str, ShardedArray]:
    """The head's W pass: F entered (SP: gathered) again, then ``F^T dLogits``."""
    return {key: _head_grad(step.enter(f, "F"), dlogits)}


def head_backward(
    step: Step, saved: dict[str, ShardedArray], targets: ShardedArray, x_dtype: np.dtype, tokens: int | None = None
) -> tuple[ShardedArray, WeightGrads]:
    """``tokens``: the number the loss averages over (default the targets'; a microbatch's is fewer).
    Under a split backward the LM head's gradient is the returned :class:`WeightGrads`' work."""
    r, cfg = step.roles, step.cfg
    probs = saved.pop("Softmax")
    count = tokens if tokens is not None else targets.global_shape[0] * targets.global_shape[1]
    dlogits = minus_onehot(probs, targets, r.model, 1.0 / count)
    del probs
    dlogits = cast(dlogits, x_dtype, label="dLogits")
    grads = WeightGrads(r.split_backward)
    key = "embed.T" if cfg.tie_embeddings else "lm_head"
    f_full = None
    if grads.split:  # the W pass gathers F (SP) and makes the head's gradient [D, V_Y]{U_data}
        grads.later(partial(_head_grads, step, key, saved.pop("F"), dlogits))
    else:
        f_full = step.enter(saved.pop("F"), "F")
        grads[key] = _head_grad(f_full, dlogits)
    head = step.w("embed").T if cfg.tie_embeddings else step.w("lm_head")
    df = step.leave(dlogits @ head.T, "dF")
    del f_full, dlogits, head
    beta = "final_norm.beta"
    dx, g = norms.backward(cfg.norm, saved.pop("x"), step.w("final_norm.gamma"), df, cfg.norm_eps)
    grads["final_norm.gamma"] = step.over_model(g["gamma"])
    if step.has(beta):
        grads[beta] = step.over_model(g["beta"])
    return dx, grads
