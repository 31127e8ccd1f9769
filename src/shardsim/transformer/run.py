"""``run_model``: one training forward and backward of the transformer under a :class:`~shardsim.plans.Plan`.

The same program runs on data (small sizes, checked against the single-device reference)
and on shape-only values (real sizes: every trace event and ledger entry, no arithmetic).
It returns the loss, the gradients with the reference's keys, the trace, the mesh's ledger
and, per layer, the bytes every chip stores for the backward pass: the ledger's live
activations after the layer's forward minus before it. Under context parallelism (``cp > 1``)
the sequence is put in its context-parallel order first (:mod:`.context_parallel`).

>>> import numpy as np
>>> from shardsim.models import TransformerConfig, reference
>>> from shardsim.plans import Plan
>>> cfg = TransformerConfig(layers=1, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)
>>> plan = Plan(tp=2)
>>> p = reference.init(cfg, seed=0, dtype="float64")
>>> tok = np.arange(8).reshape(2, 4)
>>> res = run_model(cfg, plan, plan.mesh(), p, tok, tok)
>>> bool(np.isclose(res.loss, reference.loss(cfg, p, tok, tok)))
True
>>> [op for op, _ in res.trace.collectives("forward")]
['all_reduce', 'all_reduce', 'all_reduce', 'all_gather', 'all_reduce', 'all_reduce']
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from .. import engines
from ..array import ShardedArray
from ..errors import ArgumentTypeError
from ..mesh import Mesh
from ..models import TransformerConfig
from ..models.inputs import check_params
from ..models.mlp import MLP
from ..plans import Plan
from ..strategies.result import RunResult
from ..strategies.stack import Stepped, run_step
from ..tracing import layer, phase
from . import checks, context_parallel
from .blocks import layer_backward, layer_forward
from .embedding import embed_backward, embed_forward, head_backward, head_forward, loss_value
from .gradients import Gradients
from .placement import compute_dtype, place_tokens, place_weights
from .result import model_result
from .roles import Roles
from .step import Step
from .weight_pass import WeightGrads

ModelResult = RunResult  # the transformer's name for the one result of a step


class ModelStep:
    """The transformer's layer program (see :mod:`shardsim.strategies.stack`): the embedding, the
    blocks (their residuals their own), the LM head and its loss; gradients reduced as they come."""

    residual = False

    def __init__(self, cfg: TransformerConfig, plan: Plan, mesh: Mesh, params: Mapping[str, Any], seq: int) -> None:
        self.cfg, self.plan, self.mesh, self.params, self.seq, self.depth = cfg, plan, mesh, params, seq, cfg.layers
        self.roles, self.dtype = Roles.of(plan, cfg.n_kv), compute_dtype(plan, params)
        self.loss: float | None = None
        self.held: dict[str, ShardedArray] = {}

    def inputs(self, tokens: Any, targets: Any, dropout_seed: int | None) -> ModelStep:
        self.tokens, self.targets, self.dropout_seed = tokens, targets, dropout_seed
        return self

    def place(self) -> None:
        cfg, plan, mesh, roles, s = self.cfg, self.plan, self.mesh, self.roles, self.seq
        weights = place_weights(cfg, plan, mesh, self.params, self.dtype)
        tokens, targets, rows_, pos = self.tokens, self.targets, None, None
        if roles.context is not None:  # the sequence in its context-parallel order, up front
            rows_ = context_parallel.order(s, plan.cp, balanced=plan.cp_balanced)
            tokens, targets = context_parallel.permuted(tokens, rows_), context_parallel.permuted(targets, rows_)
            pos = context_parallel.positions(mesh, roles, rows_)
        self.tok, self.tgt = place_tokens(mesh, roles, tokens, "tokens"), place_tokens(mesh, roles, targets, "targets")
        self.step = Step(cfg, roles, weights, self.dropout_seed, rows=rows_, positions=pos)
        self.grads = Gradients(self.step, s)

    def start(self) -> ShardedArray:
        return embed_forward(self.step, self.tok)

    def layer_forward(self, i: int, x: ShardedArray) -> tuple[ShardedArray, dict[str, ShardedArray]]:
        with layer(i):
            x, saved = layer_forward(self.step, i, x)
        if self.roles.recompute == "full":
            saved = {"attn.x": saved["attn.x"]}  # the block input only
        return x, saved

    def finish_forward(self, x: ShardedArray) -> None:
        parts, self.head_saved = head_forward(self.step, x, self.tgt)
        self.loss_layouts = {k: str(v.layout) for k, v in parts.items()}
        # an engine whose numbers cannot be read here (JAX's, while it traces) returns the parts'
        # blocks instead; the values themselves die here, as the ledger counts them
        readable = not self.tok.is_shape_only and engines.active().reads_data
        self.loss = loss_value(parts) if readable else None
        self.loss_blocks = {} if readable or self.tok.is_shape_only else {k: v.compact() for k, v in parts.items()}

    def start_backward(self) -> ShardedArray:
        dx, g = head_backward(self.step, self.head_saved, self.tgt, self.dtype)
        self.layer_gradients(self.depth, g)
        return dx

    def layer_backward(
        self, i: int, saved: Mapping[str, ShardedArray], dx: ShardedArray
    ) -> tuple[ShardedArray, dict[str, ShardedArray]]:
        with layer(i):
            if self.roles.recompute == "full":
                with phase("recompute"):
                    saved = layer_forward(self.step, i, saved["attn.x"])[1]  # its output dies at once
            return layer_backward(self.step, i, saved, dx)  # type: ignore[arg-type]

    def layer_gradients(self, i: int, grads: Mapping[str, ShardedArray]) -> None:
        if isinstance(grads, WeightGrads) and grads.work:  # a split backward without a pipeline: W right after B
            with layer(i) if i < self.depth else contextlib.nullcontext():
                grads = grads.run()
        # a layer's unreduced gradients are let go when the next layer's arrive
        self.held = dict(grads)
        self.grads.add(self.held)

    def finish_backward(self, dx: ShardedArray) -> None:
        self.grads.add(embed_backward(self.step, self.tok, dx))

    def result(self, stepped: Stepped) -> ModelResult:
        return model_result(
            self.cfg,
            self.plan,
            self.mesh,
            loss=self.loss,
            sharded_grads={k: self.grads.done[k] for k in self.params},
            trace=stepped.trace,
            memory=stepped.memory,
            stored=stepped.stored,
            stored_values=stepped.stored_values,
        )


def check_step(
    cfg: TransformerConfig,
    plan: Plan | str,
    mesh: Mesh,
    params: Mapping[str, Any],
    inputs: Any,
    targets: Any,
    dropout_seed: Any,
) -> tuple[Plan, int | None, int]:
    """Every check of a step before it runs: the plan (parsed), the dropout seed and the sequence length."""
    plan = checks.check_arguments(cfg, plan, mesh)
    dropout_seed = checks.check_dropout_seed(dropout_seed)
    checks.check_plan(plan, mesh)
    check_params(cfg, params)  # the reference's own check: one list of weights, one message
    _, s = checks.check_tokens(cfg, plan, inputs, targets)
    checks.check_model(cfg, plan, s, dropout_on=dropout_seed is not None and cfg.dropout > 0.0)
    return plan, dropout_seed, s


def run_model(
    model: TransformerConfig | MLP,
    plan: Plan | str,
    mesh: Mesh,
    params: Mapping[str, Any],
    inputs: Any,
    targets: Any,
    *,
    dropout_seed: int | None = None,
    **mlp: Any,
) -> ModelResult:
    """One forward and backward of ``model`` under ``plan`` on ``mesh``; see the module docstring.

    ``plan`` is a :class:`~shardsim.plans.Plan` or a plan string (read by ``Plan.parse``).
    For a :class:`~shardsim.models.TransformerConfig`, ``params`` has the reference's keys
    (:func:`shardsim.models.reference.init`), as NumPy arrays or :class:`~shardsim.ShapeDtype`;
    ``inputs`` / ``targets`` are the ``[B, S]`` token ids and targets (or ShapeDtype). Dropout
    runs when ``cfg.dropout > 0`` and ``dropout_seed`` is given, with the reference's masks.

    For a :class:`~shardsim.models.mlp.MLP`, ``inputs`` is ``x`` and ``targets`` the output's
    gradient ``dout`` (``[B, D]``), ``params`` the scheme's weights, and the step is the MLP
    scheme's that runs the plan (:func:`shardsim.strategies.scheme_of`); its keywords
    (``activation``, ``residual``, ``recompute``, ``options``, ``scheme``) are those of
    :func:`shardsim.strategies.run_mlp`.
    """
    if isinstance(model, MLP):
        from ..strategies.plans import run_mlp

        checks.check_dropout_seed(dropout_seed)  # the MLP has no dropout: a seed changes nothing
        return run_mlp(model, plan, mesh, params, inputs, targets, **mlp)
    if mlp:
        raise ArgumentTypeError(
            f"run_model: {sorted(mlp)} are keywords of an MLP's step (run_model(MLP(...), ...)); a transformer's "
            "step takes dropout_seed only"
        )
    cfg = model
    plan, dropout_seed, s = check_step(cfg, plan, mesh, params, inputs, targets, dropout_seed)
    if plan.pp > 1:
        from .pipelined import run_pipelined

        return run_pipelined(cfg, plan, mesh, params, inputs, targets, dropout_seed=dropout_seed)
    program = ModelStep(cfg, plan, mesh, params, s).inputs(inputs, targets, dropout_seed)
    return program.result(run_step(program))
