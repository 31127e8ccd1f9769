"""A walk through one small transformer block under a plan, step by step (``shardsim demo --model``).

For the plan: the mesh, each weight's layout and block per chip, every forward and backward
step of block 0 (collective or matmul, axis, layouts, bytes and FLOPs per chip), what the
block stores for backward, and the check of the whole step against the single-device reference.

>>> text = walk("gpt-tiny", "tp=2,sp")
>>> "all_gather" in text and "reduce_scatter" in text and text.rstrip().endswith("PASS")
True
"""

from __future__ import annotations

import numpy as np

from ..array import shard
from ..memory import fmt_bytes
from ..models import TransformerConfig, get, reference
from ..pictures import trace_table
from ..plans import Plan
from ..strategies.pipeline.schedule import make
from ..tracing import Trace, phase, trace
from . import context_parallel
from .blocks import layer_backward, layer_forward
from .embedding import embed_forward
from .placement import place_tokens, place_value
from .roles import Roles
from .run import run_model
from .step import Step

RULE = "=" * 96


def walk(model: str | TransformerConfig, plan: str | Plan) -> str:
    """The walk-through text of block 0 of ``model`` (a preset name or a config) under ``plan``."""
    cfg = get(model) if isinstance(model, str) else model
    plan = Plan.parse(plan) if isinstance(plan, str) else plan
    mesh = plan.mesh()
    roles = Roles.of(plan, cfg.n_kv)
    params = reference.init(cfg, seed=0, dtype="float64")
    rng = np.random.default_rng(0)
    b = 2 * plan.dp * plan.ep  # outside the experts the expert axis splits the batch too
    tokens, targets = rng.integers(0, cfg.vocab, (b, cfg.seq)), rng.integers(0, cfg.vocab, (b, cfg.seq))
    seed = 0 if cfg.dropout else None
    dtype = np.dtype("float64")
    weights = {k: place_value(mesh, v, roles.weight_layout(k), k, dtype, "params") for k, v in params.items()}
    walked, order, pos = tokens, None, None
    if roles.context is not None:  # the sequence in its context-parallel order, as run_model puts it
        order = context_parallel.order(cfg.seq, plan.cp, balanced=plan.cp_balanced)
        walked, pos = context_parallel.permuted(tokens, order), context_parallel.positions(mesh, roles, order)
    step = Step(cfg, roles, weights, seed, rows=order, positions=pos)
    out = [RULE, f"{cfg.name or 'model'} block 0 under {plan} on {mesh}", RULE]
    out.append(
        f"B={b}, S={cfg.seq}, d_model={cfg.d_model}, heads={cfg.heads} (kv {cfg.n_kv}), d_ff={cfg.d_ff}, "
        f"vocab={cfg.vocab}, {cfg.norm}, {cfg.mlp}, dropout={cfg.dropout}, float64\n"
    )
    out.append("Weights of block 0: stored layout, block per chip")
    for k, w in weights.items():
        if k.startswith("layers.0."):
            out.append(f"  {k:<26} {w.layout!s:<24} {w.local_shape}")
    with trace() as t:
        with phase("forward"):
            x = embed_forward(step, place_tokens(mesh, roles, walked, "tokens"))
            start = len(t.events)
            y, saved = layer_forward(step, 0, x)
            fwd = t.events[start:]
        kept = {k: v.local_nbytes for k, v in saved.items()}
        dout = shard(np.ones(y.global_shape) / y.global_shape[0], mesh, roles.act(), label="dOut")
        with phase("backward"):
            start = len(t.events)
            _, grads = layer_backward(step, 0, saved, dout)
            bwd = t.events[start:]
            start = len(t.events)
            grads.run()  # a split backward's W pass (nothing left to run otherwise)
            wgt = t.events[start:]
    passes = [("Forward", fwd), ("Backward", bwd)]
    if wgt:
        passes = [("Forward", fwd), ("Backward, B: the input's gradient", bwd), ("Backward, W: the weights'", wgt)]
    for name, events in passes:
        coll = [e for e in events if e.is_collective]
        sent = sum(e.sent_bytes for e in coll)
        flops = sum(e.flops for e in events)
        out.append(f"\n{name}: {len(coll)} collectives, {fmt_bytes(sent)} sent and {flops:,} FLOPs per chip")
        out.append(trace_table(Trace(events=list(events))))
    if plan.pp > 1:  # the stages' order of work, as the papers draw it
        sched = make(plan.schedule, plan.pp, plan.microbatches, plan.virtual_stages)
        out.append(f"\nThe {plan.schedule} schedule, one column per step:\n{sched.grid()}")
    out.append("\nStored for the backward pass, per chip:")
    for k, n in kept.items():
        out.append(f"  {k:<22} {fmt_bytes(n):>10}")
    out.append(f"  {'total':<22} {fmt_bytes(sum(kept.values())):>10}")
    res = run_model(cfg, plan, mesh, params, tokens, targets, dropout_seed=seed)
    want_loss, want = reference.loss_and_grads(cfg, params, tokens, targets, dropout_seed=seed)
    assert res.grads is not None and res.loss is not None
    err = max(float(np.abs(res.grads[k] - g).max()) for k, g in want.items())
    ok = abs(res.loss - want_loss) <= 1e-12 * abs(want_loss) and err <= 1e-12
    out.append(
        f"\nWhole step ({cfg.layers} layers) against the single-device reference: loss {res.loss:.12f} vs "
        f"{want_loss:.12f}, largest gradient difference {err:.1e}: {'PASS' if ok else 'FAIL'}"
    )
    return "\n".join(out)


def walk_all(model: str | TransformerConfig = "gpt-tiny", plans: tuple[str, ...] = ("tp=2", "tp=2,sp")) -> str:
    """:func:`walk` for each plan, one after the other: the demo's text."""
    return "\n\n".join(walk(model, p) for p in plans)
