"""``run_model`` with pipeline parallelism: stages of layers over the pipe axis, run by a schedule.

Each stage is the set of chips at one coordinate of the pipe axis; its layers' weights are
held there only, the embedding on the first stage, the final norm and LM head on the last.
The plan's schedule (:mod:`shardsim.strategies.pipeline.schedule`: GPipe, 1F1B or interleaved 1F1B with
``virtual_stages`` chunks per stage) orders the items, and the pipeline executor
(:class:`shardsim.strategies.pipeline.execute.Pipeline`) runs them, the stage program below computing
each (Narayanan et al. 2021, §2.2):

    F(virtual stage k, microbatch j):
        1. x = embed(tokens_j) (k = 0) or the activation stage k-1 sent
        2. each of the stage's layers: x, saved = layer_forward(x); keep saved
        3. ppermute pipe +1 (x) to stage k+1, or the head's forward (the last stage)
    B(virtual stage k, microbatch j):
        1. dx = the head's backward (the last stage) or the gradient stage k+1 sent
        2. each layer, last first: dx, grads = layer_backward(saved, dx); add the grads up
        3. ppermute pipe -1 (dx) to stage k-1, or the embedding's backward (k = 0)
    W(virtual stage k, microbatch j), zero-bubble schedules only: each layer's weight-gradient
        matmuls, which its B kept with their operands (:mod:`.weight_pass`)

Dropout masks are the whole batch's, cut as the batch is cut into microbatches, so the step
equals the single-device reference. The gradients are reduced over the data axis once, after
the last microbatch. ``stored`` gives each layer's bytes for microbatch 0 on its stage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import engines
from ..array import ShardedArray
from ..mesh import Mesh
from ..models import TransformerConfig
from ..pieces import split
from ..plans import Plan
from ..strategies.pipeline.execute import Pipeline, Values
from ..strategies.pipeline.schedule import make
from ..strategies.result import RunResult, StepMemory
from ..tracing import Trace, layer, phase, trace
from . import checks, context_parallel
from .blocks import layer_backward, layer_forward
from .embedding import embed_backward, embed_forward, head_backward, head_forward, loss_value
from .gradients import Gradients
from .placement import compute_dtype, place_tokens, place_weights
from .result import model_result
from .roles import Roles
from .step import Step
from .weight_pass import WeightGrads


class _ModelStage:
    """The transformer's stage program: the embedding on the first stage, a chunk of blocks on
    each, the final norm, LM head and loss on the last; gradients summed over the microbatches.

    ``steps`` are the microbatches' steps (each cuts its dropout masks from the whole batch's),
    ``tokens`` and ``targets`` their pieces, ``grads`` the accumulator the step reduces after the
    flush. ``losses`` collects each microbatch's loss (none when shape-only).
    """

    def __init__(
        self,
        steps: list[Step],
        tokens: list[ShardedArray],
        targets: list[ShardedArray],
        grads: Gradients,
        dtype: np.dtype,
        n_tokens: int,
    ) -> None:
        self.steps, self.tokens, self.targets, self.grads = steps, tokens, targets, grads
        self.dtype, self.n_tokens = dtype, n_tokens
        self.full_recompute = steps[0].roles.recompute == "full"
        self.shape_only = tokens[0].is_shape_only
        self.heads: dict[int, Values] = {}
        self.losses: list[float] = []
        self.loss_blocks: dict[int, dict[str, Any]] = {}
        self.loss_layouts: dict[str, str] = {}
        self.held: Values = {}

    def ready(self) -> bool:
        return True  # the last stage's dOut is its own loss's gradient

    def forward_in(self, stage: int, j: int) -> ShardedArray:
        return embed_forward(self.steps[j], self.tokens[j])

    def forward_layer(self, i: int, j: int, x: ShardedArray) -> tuple[ShardedArray, Values]:
        with layer(i):
            x, saved = layer_forward(self.steps[j], i, x)
        if self.full_recompute:  # only the block's input: the backward recomputes the rest
            saved = {"attn.x": saved["attn.x"]}
        return x, saved

    def forward_out(self, j: int, x: ShardedArray) -> None:
        parts, self.heads[j] = head_forward(self.steps[j], x, self.targets[j])
        self.loss_layouts = {k: str(v.layout) for k, v in parts.items()}
        if self.shape_only:
            return
        if engines.active().reads_data:
            self.losses.append(loss_value(parts))
        else:  # an engine whose numbers cannot be read while it traces: the parts' blocks, per microbatch
            self.loss_blocks[j] = {k: v.compact() for k, v in parts.items()}

    def backward_in(self, stage: int, j: int) -> tuple[ShardedArray, Values]:
        return head_backward(self.steps[j], self.heads.pop(j), self.targets[j], self.dtype, tokens=self.n_tokens)

    def backward_layer(self, i: int, j: int, saved: Values, dx: ShardedArray) -> tuple[ShardedArray, Values]:
        step = self.steps[j]
        with layer(i):
            if self.full_recompute:
                with phase("recompute"):
                    saved = layer_forward(step, i, saved["attn.x"])[1]
            return layer_backward(step, i, saved, dx)

    def weights(self, i: int, j: int, pending: Values) -> Values:
        assert isinstance(pending, WeightGrads)
        with layer(i) if i >= 0 else contextlib.nullcontext():  # the head's (i = -1) is no layer's
            return pending.run()

    def accumulate(self, layer: int, grads: Values) -> None:
        # the latest gradients stay referenced until the next ones replace them: the ledger's
        # temporaries count a microbatch's addends that long
        self.held = grads
        self.grads.add(grads)

    def backward_out(self, j: int, g: ShardedArray) -> None:
        self.grads.add(embed_backward(self.steps[j], self.tokens[j], g))

    def message(self, kind: str, j: int) -> str:
        return "x" if kind == "F" else "dx"

    def finish(self) -> None:
        self.grads.flush()  # after the pipeline flush: one reduction over the data axis


@dataclass
class PipelinedRun:
    """What :func:`run_stages` ran: the stage program (its losses or loss parts), the executor (its
    stored bytes), the trace, the gradients and the placed tokens."""

    stage: _ModelStage
    pipeline: Pipeline
    trace: Trace
    grads: Gradients
    tokens: ShardedArray


def run_stages(
    cfg: TransformerConfig,
    plan: Plan,
    mesh: Mesh,
    params: Mapping[str, Any],
    tokens: Any,
    targets: Any,
    *,
    dropout_seed: int | None = None,
) -> PipelinedRun:
    """The pipelined step of a checked plan, on weights and tokens global or placed already (an
    engine's device blocks, each weight held by its stage)."""
    pipe = plan.axis("pipe")
    assert pipe is not None
    p, m, v = plan.pp, plan.microbatches, plan.virtual_stages
    roles = Roles.of(plan, cfg.n_kv)
    dtype = compute_dtype(plan, params)
    weights = place_weights(cfg, plan, mesh, params, dtype)
    rows_, pos = None, None
    s = checks.shape_of(tokens)[1]
    if roles.context is not None:  # the sequence in its context-parallel order, up front, as run_model does
        rows_ = context_parallel.order(s, plan.cp, balanced=plan.cp_balanced)
        tokens, targets = context_parallel.permuted(tokens, rows_), context_parallel.permuted(targets, rows_)
        pos = context_parallel.positions(mesh, roles, rows_)
    tok, tgt = place_tokens(mesh, roles, tokens, "tokens"), place_tokens(mesh, roles, targets, "targets")
    schedule = make(plan.schedule, p, m, v)
    steps = [Step(cfg, roles, weights, dropout_seed, micro=(j, m), rows=rows_, positions=pos) for j in range(m)]
    grads = Gradients(Step(cfg, roles, weights, dropout_seed, rows=rows_, positions=pos), s, accumulate=True)
    stage = _ModelStage(steps, split(tok, "B", m), split(tgt, "B", m), grads, dtype, tok.global_shape[0] * s)
    # what a stage keeps stays an activation; events name their item, which the cost model reads,
    # and count in the step's one trace (a failed chip's trace event is the step's)
    pipeline = Pipeline(
        schedule, mesh, pipe, cfg.layers // (p * v), category="activations", measure=False, tag_items=True
    )
    mesh.memory.reset_peak()
    with trace() as t:
        pipeline.run(stage)
    return PipelinedRun(stage, pipeline, t, grads, tok)


def stored_of(run: PipelinedRun, cfg: TransformerConfig, mesh: Mesh) -> tuple[list[np.ndarray], list[dict[str, int]]]:
    """Each layer's stored bytes per chip and per value, for microbatch 0 on its stage."""
    zeros = np.zeros(mesh.shape, np.int64)
    stored = [run.pipeline.stored.get(i, zeros) for i in range(cfg.layers)]
    return stored, [run.pipeline.stored_values.get(i, {}) for i in range(cfg.layers)]


def run_pipelined(
    cfg: TransformerConfig,
    plan: Plan,
    mesh: Mesh,
    params: Mapping[str, Any],
    tokens: Any,
    targets: Any,
    *,
    dropout_seed: int | None = None,
) -> RunResult:
    """One step of ``cfg`` under a plan with ``pp > 1``; see the module docstring."""
    b, s = checks.check_tokens(cfg, plan, tokens, targets)
    checks.check_model(cfg, plan, s)
    checks.check_pipeline(cfg, plan, b)
    run = run_stages(cfg, plan, mesh, params, tokens, targets, dropout_seed=dropout_seed)
    stored, stored_values = stored_of(run, cfg, mesh)
    return model_result(
        cfg,
        plan,
        mesh,
        loss=None if run.tokens.is_shape_only else float(np.mean(run.stage.losses)),
        sharded_grads={key: run.grads.done[key] for key in params},
        trace=run.trace,
        memory=StepMemory.since(mesh.memory),  # the weights were placed after the peak's reset: as on a fresh mesh
        stored=stored,
        stored_values=stored_values,
    )
