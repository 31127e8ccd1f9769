"""``run_model`` with pipeline parallelism: stages of layers over the pipe axis, run by a schedule.

Each stage is the set of chips at one coordinate of the pipe axis; its layers' weights are
held there only, the embedding on the first stage, the final norm and LM head on the last.
The plan's schedule (:mod:`shardsim.pipeline.schedule`: GPipe, 1F1B or interleaved 1F1B with
``virtual_stages`` chunks per stage) orders the items (Narayanan et al. 2021, §2.2):

    F(virtual stage k, microbatch j):
        1. x = embed(tokens_j) (k = 0) or the activation stage k-1 sent
        2. each of the stage's layers: x, saved = layer_forward(x); keep saved
        3. ppermute pipe +1 (x) to stage k+1, or the head's forward (the last stage)
    B(virtual stage k, microbatch j):
        1. dx = the head's backward (the last stage) or the gradient stage k+1 sent
        2. each layer, last first: dx, grads = layer_backward(saved, dx); add the grads up
        3. ppermute pipe -1 (dx) to stage k-1, or the embedding's backward (k = 0)

Dropout masks are the whole batch's, cut as the batch is cut into microbatches, so the step
equals the single-device reference. The gradients are reduced over the data axis once, after
the last microbatch. ``stored`` gives each layer's bytes for microbatch 0 on its stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..array import ShardedArray
from ..collectives import ppermute
from ..mesh import Mesh
from ..models import TransformerConfig
from ..pieces import split
from ..pipeline.schedule import make
from ..plans import Plan
from ..tracing import item as in_item
from ..tracing import layer, phase, trace
from . import checks, context_parallel
from .blocks import layer_backward, layer_forward
from .embedding import embed_backward, embed_forward, head_backward, head_forward, loss_value
from .roles import Roles
from .run import ModelResult, _compute_dtype, _Gradients, _tokens, place_weights
from .step import Step


def run_pipelined(
    cfg: TransformerConfig,
    plan: Plan,
    mesh: Mesh,
    params: Mapping[str, Any],
    tokens: Any,
    targets: Any,
    *,
    dropout_seed: int | None = None,
) -> ModelResult:
    """One step of ``cfg`` under a plan with ``pp > 1``; see the module docstring."""
    b, s = checks.check_tokens(cfg, plan, tokens, targets)
    checks.check_model(cfg, plan, s)
    checks.check_pipeline(cfg, plan, b)
    pipe = plan.axis("pipe")
    assert pipe is not None
    p, m, v = plan.pp, plan.microbatches, plan.virtual_stages
    per_virtual = cfg.layers // (p * v)
    roles = Roles.of(plan, cfg.n_kv)
    dtype = _compute_dtype(plan, params)
    weights = place_weights(cfg, plan, mesh, params, dtype)
    rows_, pos = None, None
    if roles.context is not None:  # the sequence in its context-parallel order, up front, as run_model does
        rows_ = context_parallel.order(s, plan.cp, balanced=plan.cp_balanced)
        tokens, targets = context_parallel.permuted(tokens, rows_), context_parallel.permuted(targets, rows_)
        pos = context_parallel.positions(mesh, roles, rows_)
    tok, tgt = _tokens(mesh, roles, tokens, "tokens"), _tokens(mesh, roles, targets, "targets")
    tok_mb, tgt_mb = split(tok, "B", m), split(tgt, "B", m)
    schedule = make(plan.schedule, p, m, v)
    base = Step(cfg, roles, weights, dropout_seed, rows=rows_, positions=pos)
    grads = _Gradients(base, s, accumulate=True)
    sent: dict[tuple[str, int, int], ShardedArray] = {}
    kept: dict[tuple[int, int], list[dict[str, ShardedArray]]] = {}
    heads: dict[int, dict[str, ShardedArray]] = {}
    stored: list[np.ndarray] = [np.zeros(mesh.shape, np.int64)] * cfg.layers
    stored_values: list[dict[str, int]] = [{} for _ in range(cfg.layers)]
    losses: list[float] = []
    last = p * v - 1
    mesh.memory.reset_peak()
    with trace() as t:
        for item in sorted(schedule.items):
            k, j = schedule.virtual_stage(item), item.microbatch
            step = Step(cfg, roles, weights, dropout_seed, micro=(j, m), rows=rows_, positions=pos)
            layers = range(k * per_virtual, (k + 1) * per_virtual)
            if item.kind == "F":
                with phase("forward"), in_item(f"F{k}.{j}"):
                    x = embed_forward(step, tok_mb[j]) if k == 0 else sent.pop(("F", k, j))
                    stash = []
                    for i in layers:
                        before = mesh.memory.live("activations")
                        with layer(i):
                            x, saved = layer_forward(step, i, x)
                        if roles.recompute == "full":
                            saved = {"attn.x": saved["attn.x"]}
                        stash.append(saved)
                        del saved
                        if j == 0:
                            stored[i] = mesh.memory.live("activations") - before
                            stored_values[i] = {n: a.local_nbytes for n, a in stash[-1].items()}
                    kept[(k, j)] = stash
                    if k == last:
                        parts, heads[j] = head_forward(step, x, tgt_mb[j])
                        if not tok.is_shape_only:
                            losses.append(loss_value(parts))
                        del parts
                    else:
                        sent[("F", k + 1, j)] = ppermute(x, pipe, 1, label="x")
                    del x
            else:
                with phase("backward"), in_item(f"B{k}.{j}"):
                    if k == last:
                        dx, g = head_backward(step, heads.pop(j), tgt_mb[j], dtype, tokens=b * s)
                        grads.add(g)
                    else:
                        dx = sent.pop(("B", k, j))
                    stash = kept.pop((k, j))
                    for i in reversed(layers):
                        saved = stash.pop()
                        with layer(i):
                            if roles.recompute == "full":
                                with phase("recompute"):
                                    saved = layer_forward(step, i, saved["attn.x"])[1]
                            dx, g = layer_backward(step, i, saved, dx)
                        del saved
                        grads.add(g)
                    if k == 0:
                        grads.add(embed_backward(step, tok_mb[j], dx))
                    else:
                        sent[("B", k - 1, j)] = ppermute(dx, pipe, -1, label="dx")
                    del dx
        with phase("backward"):
            grads.flush()  # after the pipeline flush: one reduction over the data axis
    ordered = {key: grads.done[key] for key in params}
    loss = None if tok.is_shape_only else float(np.mean(losses))
    global_grads = None if tok.is_shape_only else {key: g.to_global() for key, g in ordered.items()}
    return ModelResult(loss, global_grads, ordered, t, mesh.memory, stored, stored_values, mesh.memory.peak())
