"""The transformer block's two halves, forward and backward, as the numbered steps of Megatron-LM.

Pre-norm block (the layout comments are the tensor + sequence parallel ones; under plain TP
``S_Y`` reads ``S`` and ``enter`` / ``leave`` are identity / AllReduce; without TP nothing
is split over Y and no collective runs; B is split over the data axis throughout):

Attention, forward
    1. A = Norm(x)                         [B, S_Y, D]
    2. enter (g): AllGather Y              [B, S, D]
    3. Q, K, V = A @ Wq, A @ Wk, A @ Wv    [B, S, NH_Y], [B, S, KH_Y]  (column parallel)
    4. RoPE(Q), RoPE(K); heads             [B, N_Y, S, H]
    5. P = softmax(Q K^T / sqrt(H))        [B, N_Y, S, S]   (causal, float32)
    6. Pd = dropout(P); C = Pd @ V          [B, S, NH_Y]
    7. C @ Wo                               [B, S, D]{U_Y}   (row parallel)
    8. leave (ḡ): ReduceScatter Y over S   [B, S_Y, D]
    9. x + dropout(.)
MLP, forward
    1. Cn = Norm(x)   2. enter   3. H_pre = Cn @ W_in [B, S, F_Y]   4. H = gelu(H_pre)
    5. H @ W_out [B, S, D]{U_Y}   6. leave   7. x + dropout(.)
    (SwiGLU: H = silu(Cn @ W_gate) * (Cn @ W_up), then H @ W_down.)

Each backward runs the steps in reverse: ``leave``'s backward is ``enter`` (AllGather of
dOut) and ``enter``'s is ``leave`` (ReduceScatter / AllReduce of dA), so TP does one
AllReduce per half-block each way, TP+SP one AllGather and one ReduceScatter. Weight
gradients are sums over the chip's tokens: partial over the data axis, reduced by the caller.

Split backward (the zero-bubble schedules, :mod:`.weight_pass`): each ``X^T dY`` above is
kept with its two operands and run in the later W pass, the sequence-parallel AllGather of
``A`` or ``Cn`` it reads with it; the rest is the backward as written.

Recomputation: ``selective`` stores Q, K, V but not P, its dropout mask or Pd, and
recomputes steps 5-6 of attention in the backward pass (trace phase ``recompute``): Q K^T,
the softmax, the dropout and the product with V, the core-attention forward Megatron-LM reruns;
``full`` is :func:`layer_forward` again from the block input (see :mod:`.run`).

Under ``attention=flash`` (and always under context parallelism) steps 5-6 are FlashAttention
(:mod:`shardsim.strategies.context`): the output and its log-sum-exp are stored, never P, and the backward
pass recomputes each tile's probabilities, so ``selective`` has nothing more to drop.

>>> sorted(SAVED_ATTENTION)
['A', 'C', 'K', 'P', 'Pd', 'Q', 'V', 'mask attn_out', 'mask attn_probs', 'x']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

from ..array import ShardedArray
from ..ops import activation, activation_grad
from ..tracing import phase
from . import context_parallel, moe_block, norms
from .local import (
    causal_softmax,
    dim,
    expand_kv,
    flat_tokens,
    fold_kv,
    heads_first,
    merge_heads,
    place_kv,
    repeat_kv,
    rope,
    silu,
    silu_grad,
    softmax_backward,
    split_heads,
)
from .step import Step
from .weight_pass import WeightGrads

Saved = dict[str, ShardedArray]
Grads = dict[str, ShardedArray]
SAVED_ATTENTION = ("x", "A", "Q", "K", "V", "P", "mask attn_probs", "Pd", "C", "mask attn_out")
SELECTIVE_DROPS = ("P", "mask attn_probs", "Pd")  # recomputed, not stored, under "selective"


def _kv_weight(step: Step, key: str) -> ShardedArray:
    """A KV weight as used: under KV replication each chip's copy of its head's columns."""
    w = step.w(key)
    if step.roles.kv_copies > 1 and key.rsplit(".", 1)[-1] in ("wk", "wv", "bk", "bv"):
        assert step.roles.model is not None
        return expand_kv(w, step.roles.kv_copies, step.roles.model)
    return w


def _linear(x: ShardedArray, step: Step, key: str, bias: str | None, label: str) -> ShardedArray:
    out = x @ _kv_weight(step, key)
    if bias is not None and step.has(bias):
        out = out + _kv_weight(step, bias)
    return out.named(label)


def _weight_grad(inp: ShardedArray, dout: ShardedArray, label: str) -> ShardedArray:
    """``inp^T @ dOut`` summed over every token: ``[T, X]^T @ [T, Y]`` (partial over the data axis)."""
    return (flat_tokens(inp).T @ flat_tokens(dout)).named(label)


def _one_weight_grad(key: str, inp: ShardedArray, dout: ShardedArray, label: str) -> dict[str, ShardedArray]:
    return {key: _weight_grad(inp, dout, label)}


def _input_weight_grads(
    step: Step, x: ShardedArray, label: str, douts: Sequence[tuple[str, str, ShardedArray]]
) -> dict[str, ShardedArray]:
    """The W pass of the matmuls that read one input ``x``: ``x`` entered (SP: gathered) once,
    then ``x^T dOut`` for each ``(key, label, dOut)``."""
    full = step.enter(x, label)
    return {key: step.over_model(_weight_grad(full, d, name)) for key, name, d in douts}


def _norm_keys(step: Step, prefix: str) -> tuple[ShardedArray, ShardedArray | None]:
    beta = f"{prefix}.beta"
    return step.w(f"{prefix}.gamma"), (step.w(beta) if step.has(beta) else None)


def _norm_backward(step: Step, prefix: str, x: ShardedArray, dy: ShardedArray, grads: Grads) -> ShardedArray:
    dx, g = norms.backward(step.cfg.norm, x, step.w(f"{prefix}.gamma"), dy, step.cfg.norm_eps)
    for k, v in g.items():
        grads[f"{prefix}.{k}"] = step.over_model(v)
    return dx


# -- attention ------------------------------------------------------------------------------------
def _core(
    step: Step, i: int, q: ShardedArray, k: ShardedArray, v: ShardedArray
) -> tuple[ShardedArray, ShardedArray | None, ShardedArray]:
    """Steps 5-6 before ``@ V``: ``(P, mask, Pd)`` on heads ``[B, N_Y, S, S]``."""
    cfg, r = step.cfg, step.roles
    groups = cfg.heads // step.kv_heads
    kt = repeat_kv(heads_first(k), groups)
    scores = heads_first(q) @ kt.transpose(0, 1, 3, 2)  # 5. Q K^T per head
    del kt
    p = causal_softmax(scores, 1.0 / math.sqrt(cfg.hd))
    del scores
    mask = step.mask(i, "attn_probs", p, f"[{dim('B', *r.batch)}, {dim('N', r.model)}, S, S]")
    return p, mask, step.drop(p, mask).named("Pd")


def attention_forward(step: Step, i: int, x: ShardedArray) -> tuple[ShardedArray, Saved]:
    cfg, pre = step.cfg, f"layers.{i}"
    a = norms.forward(cfg.norm, x, *_norm_keys(step, f"{pre}.attn_norm"), cfg.norm_eps).named("A")  # 1.
    a_full = step.enter(a, "A")  # 2. g
    q = split_heads(_linear(a_full, step, f"{pre}.attn.wq", f"{pre}.attn.bq", "Q"), cfg.heads)  # 3.
    k = split_heads(_linear(a_full, step, f"{pre}.attn.wk", f"{pre}.attn.bk", "K"), step.kv_heads)
    v = split_heads(_linear(a_full, step, f"{pre}.attn.wv", f"{pre}.attn.bv", "V"), step.kv_heads)
    del a_full
    if cfg.position == "rope":  # 4.
        q, k = rope(q, cfg.rope_theta, positions=step.positions), rope(k, cfg.rope_theta, positions=step.positions)
    saved = {"x": x, "A": a, "Q": q, "K": k, "V": v}
    if step.roles.fused:  # 5-6. FlashAttention (ring / all-gather under CP): no S x S block is kept
        o, saved["lse"] = context_parallel.forward(step.roles, step.positions, q, k, v)
        c = merge_heads(o).named("C")
    else:
        p, mask_p, pd = _core(step, i, q, k, v)  # 5.
        vt = repeat_kv(heads_first(v), cfg.heads // step.kv_heads)
        c = merge_heads(heads_first(pd @ vt)).named("C")  # 6. [B, S, NH_Y]
        del vt
        if step.roles.recompute != "selective":
            saved.update({"P": p, "Pd": pd})
            if mask_p is not None:
                saved["mask attn_probs"] = mask_p
    saved["C"] = c
    y = step.leave(_linear(c, step, f"{pre}.attn.wo", None, "C @ Wo"), "Attn out")  # 7-8.
    if step.has(f"{pre}.attn.bo"):
        y = y + step.w(f"{pre}.attn.bo")
    mask_o = step.mask(i, "attn_out", y, step.roles.act())
    out = (x + step.drop(y, mask_o)).named("x")  # 9.
    if mask_o is not None:
        saved["mask attn_out"] = mask_o
    return out, saved


def attention_backward(step: Step, i: int, saved: Saved, dout: ShardedArray) -> tuple[ShardedArray, WeightGrads]:
    cfg, pre = step.cfg, f"layers.{i}"
    grads = WeightGrads(step.roles.split_backward)
    dy = step.enter(step.drop(dout, saved.get("mask attn_out")), "dAttn out")  # 9-8. ḡ backward
    if step.has(f"{pre}.attn.bo"):
        grads[f"{pre}.attn.bo"] = step.token_sum(dy, "dbo")
    grads.later(partial(_one_weight_grad, f"{pre}.attn.wo", saved["C"], dy, "dWo"))  # 7.
    dc = split_heads((dy @ step.w(f"{pre}.attn.wo").T).named("dC"), cfg.heads)  # [B, S, N_Y, H]
    del dy
    q, k, v = saved["Q"], saved["K"], saved["V"]
    if step.roles.fused:
        o = split_heads(saved["C"], cfg.heads)
        dq, dk, dv = context_parallel.backward(step.roles, step.positions, q, k, v, o, saved["lse"], dc)
        del o, dc
    else:
        dq, dk, dv = _core_backward(step, i, saved, heads_first(dc))
        del dc
    if cfg.position == "rope":  # 4.
        dq = rope(dq, cfg.rope_theta, inverse=True, positions=step.positions)
        dk = rope(dk, cfg.rope_theta, inverse=True, positions=step.positions)
    a_full = None if grads.split else step.enter(saved["A"], "A")  # SP stored A split: AllGather it again
    da = None
    merged = [merge_heads(dq).named("dQ"), merge_heads(dk, "KH").named("dK"), merge_heads(dv, "KH").named("dV")]
    if step.roles.kv_copies > 1:  # each chip's KV-head copy back into the head's columns: {U_Y}
        assert step.roles.model is not None
        merged[1:] = [place_kv(d, step.roles.kv_copies, step.roles.model, cfg.n_kv) for d in merged[1:]]
    for name, d in zip("qkv", merged):  # 3.
        if a_full is not None:
            grads[f"{pre}.attn.w{name}"] = step.over_model(_weight_grad(a_full, d, f"dW{name}"))
        if step.has(f"{pre}.attn.b{name}"):
            grads[f"{pre}.attn.b{name}"] = step.token_sum(d, f"db{name}")
        term = d @ step.w(f"{pre}.attn.w{name}").T
        da = term if da is None else da + term
    if grads.split:
        douts = [(f"{pre}.attn.w{name}", f"dW{name}", d) for name, d in zip("qkv", merged)]
        grads.later(partial(_input_weight_grads, step, saved["A"], "A", douts))
    del a_full, dq, dk, dv, merged
    assert da is not None
    da = step.leave(da, "dA")  # 2. g backward: AllReduce / ReduceScatter
    dx = _norm_backward(step, f"{pre}.attn_norm", saved["x"], da, grads)  # 1.
    return (dout + dx).named("dx"), grads


def _core_backward(
    step: Step, i: int, saved: Saved, dc: ShardedArray
) -> tuple[ShardedArray, ShardedArray, ShardedArray]:
    """Steps 6-5 backward from ``dC [B, N_Y, S, H]``: ``(dQ, dK, dV)`` as ``[B, S, N_Y, H]``."""
    cfg = step.cfg
    groups = cfg.heads // step.kv_heads
    q, k, v = saved["Q"], saved["K"], saved["V"]
    recompute = "P" not in saved  # selective recomputation of the attention core
    if recompute:
        with phase("recompute"):
            p, mask_p, pd = _core(step, i, q, k, v)
    else:
        p, mask_p, pd = saved["P"], saved.get("mask attn_probs"), saved["Pd"]
    vt = repeat_kv(heads_first(v), groups)
    if recompute:  # Megatron-LM reruns the whole core-attention forward (Korthikanti et al. 2022,
        # Section 5), its product with V too, though the output C is stored for Wo's gradient
        with phase("recompute"):
            again = pd @ vt
            del again
    dv = fold_kv(pd.transpose(0, 1, 3, 2) @ dc, groups)  # 6. dV = Pd^T dC
    dpd = dc @ vt.transpose(0, 1, 3, 2)  # dPd = dC V^T
    del vt, pd, dc
    ds = softmax_backward(p, step.drop(dpd, mask_p), 1.0 / math.sqrt(cfg.hd))  # 5.
    del p, dpd, mask_p
    kt = repeat_kv(heads_first(k), groups)
    dq = ds @ kt  # [B, N_Y, S, H]
    dk = fold_kv(ds.transpose(0, 1, 3, 2) @ heads_first(q), groups)
    del ds, kt
    return heads_first(dq), heads_first(dk), heads_first(dv)  # [B, S, N_Y, H]


# -- MLP --------------------------------------------------------------------------------------------
def mlp_forward(step: Step, i: int, x: ShardedArray) -> tuple[ShardedArray, Saved]:
    if step.cfg.experts:
        return moe_block.forward(step, i, x)
    cfg, pre = step.cfg, f"layers.{i}.mlp"
    c = norms.forward(cfg.norm, x, *_norm_keys(step, f"layers.{i}.mlp_norm"), cfg.norm_eps).named("Cn")  # 1.
    c_full = step.enter(c, "Cn")  # 2.
    saved: Saved = {"x": x, "Cn": c}
    if cfg.mlp == "gelu":
        h_pre = _linear(c_full, step, f"{pre}.w_in", f"{pre}.b_in", "H_pre")  # 3.
        h = activation(h_pre, "gelu", label="H")  # 4.
        z = _linear(h, step, f"{pre}.w_out", None, "H @ W_out")  # 5.
        saved.update({"H_pre": h_pre, "H": h})
    else:
        gate = _linear(c_full, step, f"{pre}.w_gate", f"{pre}.b_gate", "Gate")
        up = _linear(c_full, step, f"{pre}.w_up", f"{pre}.b_up", "Up")
        h = (silu(gate) * up).named("H")
        z = _linear(h, step, f"{pre}.w_down", None, "H @ W_down")
        saved.update({"Gate": gate, "Up": up, "H": h})
    del c_full
    y = step.leave(z, "MLP out")  # 6.
    out_b = f"{pre}.b_out" if cfg.mlp == "gelu" else f"{pre}.b_down"
    if step.has(out_b):  # after the reduction: added once, not once per model chip
        y = y + step.w(out_b)
    mask = step.mask(i, "mlp_out", y, step.roles.act())
    if mask is not None:
        saved["mask mlp_out"] = mask
    return (x + step.drop(y, mask)).named("x"), saved  # 7.


def mlp_backward(step: Step, i: int, saved: Saved, dout: ShardedArray) -> tuple[ShardedArray, WeightGrads]:
    if step.cfg.experts:
        dx, g = moe_block.backward(step, i, saved, dout)
        moe = WeightGrads(step.roles.split_backward)
        moe.update(g)  # the experts' gradients come out of the All-to-All backward: in B
        return dx, moe
    cfg, pre = step.cfg, f"layers.{i}.mlp"
    grads = WeightGrads(step.roles.split_backward)
    dz = step.enter(step.drop(dout, saved.get("mask mlp_out")), "dMLP out")  # 7-6.
    out_w, out_b = (f"{pre}.w_out", f"{pre}.b_out") if cfg.mlp == "gelu" else (f"{pre}.w_down", f"{pre}.b_down")
    if step.has(out_b):
        grads[out_b] = step.token_sum(dz, f"d{out_b.rsplit('.', 1)[-1]}")
    grads.later(partial(_one_weight_grad, out_w, saved["H"], dz, "dW_out"))  # 5.
    dh = (dz @ step.w(out_w).T).named("dH")
    del dz
    c_full = None if grads.split else step.enter(saved["Cn"], "Cn")
    douts: list[tuple[str, str, ShardedArray]] = []
    if cfg.mlp == "gelu":
        dh_pre = (dh * activation_grad(saved["H_pre"], "gelu")).named("dH_pre")  # 4.
        douts.append((f"{pre}.w_in", "dW_in", dh_pre))
        if c_full is not None:
            grads[f"{pre}.w_in"] = _weight_grad(c_full, dh_pre, "dW_in")  # 3.
        if step.has(f"{pre}.b_in"):
            grads[f"{pre}.b_in"] = step.token_sum(dh_pre, "db_in")
        dc = dh_pre @ step.w(f"{pre}.w_in").T
    else:
        gate, up = saved["Gate"], saved["Up"]
        dgate = (dh * up * silu_grad(gate)).named("dGate")
        dup = (dh * silu(gate)).named("dUp")
        douts += [(f"{pre}.w_gate", "dW_gate", dgate), (f"{pre}.w_up", "dW_up", dup)]
        if c_full is not None:
            grads[f"{pre}.w_gate"] = _weight_grad(c_full, dgate, "dW_gate")
            grads[f"{pre}.w_up"] = _weight_grad(c_full, dup, "dW_up")
        for name, d in (("b_gate", dgate), ("b_up", dup)):
            if step.has(f"{pre}.{name}"):
                grads[f"{pre}.{name}"] = step.token_sum(d, f"d{name}")
        dc = dgate @ step.w(f"{pre}.w_gate").T + dup @ step.w(f"{pre}.w_up").T
    if grads.split:  # the W pass of step 3; the gradients already are over the model axis's own columns
        grads.later(partial(_input_weight_grads, step, saved["Cn"], "Cn", douts))
    del c_full, dh, douts
    dc = step.leave(dc, "dCn")  # 2.
    dx = _norm_backward(step, f"layers.{i}.mlp_norm", saved["x"], dc, grads)  # 1.
    return (dout + dx).named("dx"), grads


# -- a whole block ----------------------------------------------------------------------------------
def layer_forward(step: Step, i: int, x: ShardedArray) -> tuple[ShardedArray, Saved]:
    """Block ``i``: attention then MLP; what both halves store (keys prefixed ``attn.`` / ``mlp.``)."""
    x2, sa = attention_forward(step, i, x)
    out, sm = mlp_forward(step, i, x2)
    return out, {**{f"attn.{k}": v for k, v in sa.items()}, **{f"mlp.{k}": v for k, v in sm.items()}}


def layer_backward(step: Step, i: int, saved: Saved, dout: ShardedArray) -> tuple[ShardedArray, WeightGrads]:
    """Block ``i`` backward: MLP then attention; empties ``saved`` as it goes. Under a split
    backward the gradients' matmuls are the returned :class:`WeightGrads`' work, for its W pass."""
    sm = {k[4:]: saved.pop(k) for k in list(saved) if k.startswith("mlp.")}
    dx2, gm = mlp_backward(step, i, sm, dout)
    del sm, dout
    sa = {k[5:]: saved.pop(k) for k in list(saved) if k.startswith("attn.")}
    dx, ga = attention_backward(step, i, sa, dx2)
    return dx, ga.absorb(gm)
