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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..array import ShapeDtype, ShardedArray, shard
from ..collectives import all_reduce, reduce_scatter
from ..errors import ShardingError
from ..layout import Layout
from ..memory import MemoryLedger
from ..mesh import Mesh
from ..models import TransformerConfig
from ..models.inputs import check_params
from ..plans import Plan
from ..tracing import Trace, layer, phase, trace
from ..training.precision import Precision
from . import checks, context_parallel
from .blocks import layer_backward, layer_forward
from .embedding import embed_backward, embed_forward, head_backward, head_forward, loss_value
from .local import dim, rows
from .roles import Roles
from .step import Step


@dataclass
class ModelResult:
    """What one step gives: ``loss`` (None when shape-only), ``grads`` (global NumPy arrays with
    the reference's keys; None when shape-only), ``sharded_grads`` (as the plan leaves them:
    split over the data axis under ZeRO-2/3), ``trace``, ``memory`` (the mesh's ledger),
    ``stored`` (per layer, each chip's bytes of activations kept for backward, shape
    ``mesh.shape``), ``stored_values`` (per layer, the kept values' bytes per chip that holds
    them, by name) and ``peak`` (each chip's peak bytes during the step, from the ledger)."""

    loss: float | None
    grads: dict[str, np.ndarray] | None
    sharded_grads: dict[str, ShardedArray]
    trace: Trace
    memory: MemoryLedger
    stored: list[np.ndarray] = field(default_factory=list)
    stored_values: list[dict[str, int]] = field(default_factory=list)
    peak: np.ndarray | None = None


def _compute_dtype(plan: Plan, params: Mapping[str, Any]) -> np.dtype:
    if plan.precision is not None:
        return Precision.of(plan.precision).compute
    first = next(iter(params.values()))
    return np.dtype(first.dtype)


def _place(mesh: Mesh, value: Any, layout: str, label: str, dtype: np.dtype, category: str) -> ShardedArray:
    if isinstance(value, ShapeDtype):
        value = ShapeDtype(value.shape, dtype)
    else:
        value = np.asarray(value).astype(dtype, copy=False)
    try:
        return shard(value, mesh, layout, label=label, category=category)
    except ShardingError as e:
        raise type(e)(f"{label} as {layout}: {e}") from None


def stage_of(cfg: TransformerConfig, plan: Plan, key: str) -> int:
    """The pipeline stage holding weight ``key``: its layer's (interleaved: its chunk's), the
    embedding's on the first stage, the final norm's and LM head's on the last."""
    p = plan.pp
    if key.startswith("layers."):
        return (int(key.split(".")[1]) // (cfg.layers // (p * plan.virtual_stages))) % p
    return 0 if key in ("embed", "pos_embed") else p - 1


def place_weights(
    cfg: TransformerConfig,
    plan: Plan,
    mesh: Mesh,
    params: Mapping[str, Any],
    dtype: Any,
    *,
    layout: Any = None,
    category: str = "params",
) -> dict[str, ShardedArray]:
    """Each weight in ``dtype`` and its layout (``layout(key)``, by default the plan's storage
    layout), held under ``pp > 1`` by its stage only. A :class:`ShardedArray` already in that
    layout (a trainer's own weights) is used as it is.

    >>> from shardsim.models import TransformerConfig
    >>> cfg = TransformerConfig(layers=2, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)
    >>> plan = Plan(pp=2)
    >>> shapes = {k: ShapeDtype(s) for k, s in cfg.param_shapes().items()}
    >>> w = place_weights(cfg, plan, plan.mesh(), shapes, "float32")
    >>> int(w["layers.1.attn.wq"].holders[1]), int(w["layers.1.attn.wq"].holders[0])
    (1, 0)
    """
    from ..pieces import place

    roles = Roles.of(plan, cfg.n_kv)
    layout_of = layout or roles.weight_layout
    pipe = plan.axis("pipe")
    out = {}
    for key, value in params.items():
        want = layout_of(key)
        if isinstance(value, ShardedArray):
            if value.mesh is not mesh or str(value.layout) != str(Layout.parse(want, mesh.axis_names)):
                raise ShardingError(f"weight {key} is {value.describe()}; run_model needs it as {want} on {mesh}")
            out[key] = value
            continue
        whole = _place(mesh, value, want, key, np.dtype(dtype), category)
        out[key] = whole if pipe is None else place(whole, label=key, **{pipe: stage_of(cfg, plan, key)})
        del whole  # the stage's copy is the only one
    return out


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


def run_model(
    cfg: TransformerConfig,
    plan: Plan | str,
    mesh: Mesh,
    params: Mapping[str, Any],
    tokens: Any,
    targets: Any,
    *,
    dropout_seed: int | None = None,
) -> ModelResult:
    """One forward and backward of ``cfg`` under ``plan`` on ``mesh``; see the module docstring.

    ``plan`` is a :class:`~shardsim.plans.Plan` or a plan string (read by ``Plan.parse``).
    ``params`` has the reference's keys (:func:`shardsim.models.reference.init`), as NumPy
    arrays or :class:`~shardsim.ShapeDtype`; ``tokens`` / ``targets`` are ``[B, S]`` ids (or
    ShapeDtype). Dropout runs when ``cfg.dropout > 0`` and ``dropout_seed`` is given, with the
    reference's masks.
    """
    plan = checks.check_arguments(cfg, plan, mesh)
    dropout_seed = checks.check_dropout_seed(dropout_seed)
    checks.check_plan(plan, mesh)
    check_params(cfg, params)  # the reference's own check: one list of weights, one message
    _, s = checks.check_tokens(cfg, plan, tokens, targets)
    checks.check_model(cfg, plan, s, dropout_on=dropout_seed is not None and cfg.dropout > 0.0)
    if plan.pp > 1:
        from .pipelined import run_pipelined

        return run_pipelined(cfg, plan, mesh, params, tokens, targets, dropout_seed=dropout_seed)
    roles = Roles.of(plan, cfg.n_kv)
    dtype = _compute_dtype(plan, params)
    weights = place_weights(cfg, plan, mesh, params, dtype)
    rows_, pos = None, None
    if roles.context is not None:  # the sequence in its context-parallel order, up front
        rows_ = context_parallel.order(s, plan.cp, balanced=plan.cp_balanced)
        tokens, targets = context_parallel.permuted(tokens, rows_), context_parallel.permuted(targets, rows_)
        pos = context_parallel.positions(mesh, roles, rows_)
    tok, tgt = _tokens(mesh, roles, tokens, "tokens"), _tokens(mesh, roles, targets, "targets")
    step = Step(cfg, roles, weights, dropout_seed, rows=rows_, positions=pos)
    grads = _Gradients(step, s)
    stored: list[np.ndarray] = []
    stored_values: list[dict[str, int]] = []
    mesh.memory.reset_peak()
    with trace() as t:
        with phase("forward"):
            x = embed_forward(step, tok)
            kept: list[dict[str, ShardedArray]] = []
            for i in range(cfg.layers):
                before = mesh.memory.live("activations")
                with layer(i):
                    x, saved = layer_forward(step, i, x)
                if roles.recompute == "full":
                    saved = {"attn.x": saved["attn.x"]}  # the block input only
                kept.append(saved)
                del saved
                stored.append(mesh.memory.live("activations") - before)
                stored_values.append({k: v.local_nbytes for k, v in kept[-1].items()})
            parts, head_saved = head_forward(step, x, tgt)
            del x
        loss = None if tok.is_shape_only else loss_value(parts)
        del parts
        with phase("backward"):
            dx, g = head_backward(step, head_saved, tgt, dtype)
            grads.add(g)
            for i in reversed(range(cfg.layers)):
                saved, kept[i] = kept[i], {}
                with layer(i):
                    if roles.recompute == "full":
                        with phase("recompute"):
                            saved = layer_forward(step, i, saved["attn.x"])[1]  # its output dies at once
                    dx, g = layer_backward(step, i, saved, dx)
                del saved
                grads.add(g)
            grads.add(embed_backward(step, tok, dx))
            del dx
    out = grads.done
    ordered = {k: out[k] for k in params}
    global_grads = None if tok.is_shape_only else {k: v.to_global() for k, v in ordered.items()}
    return ModelResult(loss, global_grads, ordered, t, mesh.memory, stored, stored_values, mesh.memory.peak())
