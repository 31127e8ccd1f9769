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

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..array import ShapeDtype, ShardedArray
from ..collectives import all_reduce, reduce_scatter
from ..errors import ArgumentTypeError
from ..mesh import Mesh
from ..models import TransformerConfig
from ..models.inputs import check_params
from ..models.mlp import MLP
from ..plans import Plan
from ..strategies.result import RunResult
from ..strategies.stack import Stepped, run_step
from ..tracing import layer, phase
from ..training.precision import Precision
from . import checks, context_parallel
from .blocks import layer_backward, layer_forward
from .embedding import embed_backward, embed_forward, head_backward, head_forward, loss_value
from .local import dim, rows
from .placement import place_value as _place
from .placement import place_weights
from .roles import Roles
from .step import Step

ModelResult = RunResult  # the transformer's name for the one result of a step


def _compute_dtype(plan: Plan, params: Mapping[str, Any]) -> np.dtype:
    if plan.precision is not None:
        return Precision.of(plan.precision).compute
    first = next(iter(params.values()))
    return np.dtype(first.dtype)


def _tokens(mesh: Mesh, roles: Roles, value: Any, label: str) -> ShardedArray:
    dt = value.dtype if isinstance(value, ShapeDtype) else np.asarray(value).dtype
    layout = f"[{dim('B', *roles.batch)}, {dim('S', roles.context)}]"
    return _place(mesh, value, layout, label, np.dtype(dt), "activations")


class _Gradients:
    """Each weight's gradient reduced over the data axis as soon as it is complete (as DDP buckets
    and FSDP do): AllReduce for ZeRO-0/1, ReduceScatter to the weight's shard for ZeRO-2/3."""

    def __init__(self, step: Step, seq: int, *, accumulate: bool = False) -> None:
        self.step, self.seq, self.done = step, seq, {}  # type: ignore[var-annotated]
        self.pending: dict[str, ShardedArray] = {}
        self.accumulate = accumulate  # pipelines: sum over microbatches, reduce once after the flush

    def add(self, grads: dict[str, ShardedArray]) -> None:
        for key, g in grads.items():
            g.as_category("temporaries")  # unreduced: a buffer for the reduction, until finish() holds the result
            if self.accumulate:
                self.pending[key] = self.pending[key] + g if key in self.pending else g
                continue
            if key == "embed.T":  # the tied LM head's gradient: embed's, added once the embedding's is known
                self.pending["embed"] = g.T
            elif key == "embed" and key in self.pending:
                self.finish(key, self.pending.pop(key) + g)
            else:
                self.finish(key, g)

    def flush(self) -> None:
        """Reduce every accumulated gradient (a pipeline's, after its last microbatch)."""
        for key in list(self.pending):
            self.finish(key, self.pending.pop(key))

    def finish(self, key: str, g: ShardedArray) -> None:
        with layer(int(key.split(".")[1]) if key.startswith("layers.") else -1):  # a layer's weight: its layer's work
            self._reduce(key, g)

    def _reduce(self, key: str, g: ShardedArray) -> None:
        g = self._reduced(key, g)
        if key == "pos_embed" and self.seq < self.step.cfg.seq:
            g = rows(g, self.seq, total=self.step.cfg.seq)  # positions past the sequence get no gradient
        self.done[key] = g.named(f"d{key}").as_category("grads")

    def _reduced(self, key: str, g: ShardedArray) -> ShardedArray:
        """``g`` summed over the context and data axes its partial sum spans (ZeRO-2/3: scattered over data)."""
        r = self.step.roles
        if r.context is not None and r.context in g.layout.partial:  # a sum over the context block's tokens
            if r.data is not None and r.zero < 2:  # one AllReduce over the data x context group, as Megatron
                return all_reduce(g, (r.data, r.context), label=f"d{key}")
            g = all_reduce(g, r.context, label=f"d{key}")
        over = tuple(a for a in r.batch if a in g.layout.partial)  # the experts' own reduced theirs already
        if not over:
            return g
        if r.zero < 2:
            return all_reduce(g, over, label=f"d{key}")
        return reduce_scatter(g, over, r.shard_dim(key), label=f"d{key}")


class _ModelStep:
    """The transformer's layer program (see :mod:`shardsim.strategies.stack`): the embedding, the
    blocks (their residuals their own), the LM head and its loss; gradients reduced as they come."""

    residual = False

    def __init__(self, cfg: TransformerConfig, plan: Plan, mesh: Mesh, params: Mapping[str, Any], seq: int) -> None:
        self.cfg, self.plan, self.mesh, self.params, self.seq, self.depth = cfg, plan, mesh, params, seq, cfg.layers
        self.roles, self.dtype = Roles.of(plan, cfg.n_kv), _compute_dtype(plan, params)
        self.loss: float | None = None
        self.held: dict[str, ShardedArray] = {}

    def inputs(self, tokens: Any, targets: Any, dropout_seed: int | None) -> _ModelStep:
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
        self.tok, self.tgt = _tokens(mesh, roles, tokens, "tokens"), _tokens(mesh, roles, targets, "targets")
        self.step = Step(cfg, roles, weights, self.dropout_seed, rows=rows_, positions=pos)
        self.grads = _Gradients(self.step, s)

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
        self.loss = None if self.tok.is_shape_only else loss_value(parts)

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
        # a layer's unreduced gradients are let go when the next layer's arrive
        self.held = dict(grads)
        self.grads.add(self.held)

    def finish_backward(self, dx: ShardedArray) -> None:
        self.grads.add(embed_backward(self.step, self.tok, dx))

    def result(self, stepped: Stepped) -> ModelResult:
        ordered = {k: self.grads.done[k] for k in self.params}
        shape_only = self.tok.is_shape_only
        return ModelResult(
            self.loss,
            None if shape_only else {k: v.to_global() for k, v in ordered.items()},
            ordered,
            stepped.trace,
            stepped.memory,
            stepped.stored,
            stepped.stored_values,
            self.mesh.memory.peak(),
            activations={f"{k}.{i}": n for i, values in enumerate(stepped.stored_values) for k, n in values.items()},
            layouts={f"d{k}": str(v.layout) for k, v in ordered.items()},
            axes={r: a for r, a in self.plan.axes().items() if self.plan.degree(r) > 1},
            model=self.cfg,
            plan=self.plan,
            mesh=self.mesh,
        )


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
    plan = checks.check_arguments(cfg, plan, mesh)
    dropout_seed = checks.check_dropout_seed(dropout_seed)
    checks.check_plan(plan, mesh)
    check_params(cfg, params)  # the reference's own check: one list of weights, one message
    _, s = checks.check_tokens(cfg, plan, inputs, targets)
    checks.check_model(cfg, plan, s, dropout_on=dropout_seed is not None and cfg.dropout > 0.0)
    if plan.pp > 1:
        from .pipelined import run_pipelined

        return run_pipelined(cfg, plan, mesh, params, inputs, targets, dropout_seed=dropout_seed)
    program = _ModelStep(cfg, plan, mesh, params, s).inputs(inputs, targets, dropout_seed)
    return program.result(run_step(program))
