"""The transformer's step on one device's blocks: what an engine whose data is a device's own block runs.

Inside an SPMD program (JAX's ``shard_map``) each device holds only its own block of every
value. :class:`DeviceStep` is :class:`~shardsim.transformer.run.ModelStep` made from those
blocks: each weight and token block becomes a :class:`~shardsim.ShardedArray` where the step
places its inputs, so the step's trace and memory are the stacked engine's, and the loss
comes back as the cross-entropy's per-token parts (:attr:`ModelStep.loss_blocks`), which the
program returns and the host reduces. Under a pipeline the step is
:func:`~.pipelined.run_stages` on the blocks instead, each weight held by its stage's chips
(:func:`run_pipelined_on_device`). :func:`probe` lays a step out before the program traces.

>>> from shardsim.models import TransformerConfig
>>> from shardsim.plans import Plan
>>> cfg = TransformerConfig(layers=2, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)
>>> laid = probe(cfg, Plan(tp=2), Plan(tp=2).mesh(), {**cfg.param_shapes(), "tokens": (2, 4)},
...              {**{k: np.dtype("float32") for k in cfg.param_shapes()}, "tokens": np.dtype("int32")})
>>> laid.layouts["layers.0.mlp.w_in"], laid.layouts["dlayers.0.mlp.w_in"], laid.layouts["tokens"]
('[D, F_{model}]', '[D, F_{model}]', '[B, S]')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..array import ShapeDtype, ShardedArray
from ..layout import Layout
from ..mesh import Mesh
from ..models import TransformerConfig
from ..plans import Plan
from ..strategies.context.problem import WorkLog, work_log
from ..strategies.result import StepMemory
from ..strategies.stack import Stepped, run_step
from .embedding import LOSS_PARTS
from .pipelined import run_stages, stored_of
from .placement import compute_dtype, stage_of
from .run import ModelStep


def device_value(
    mesh: Mesh,
    block: Any,
    layout: str,
    shape: tuple[int, ...],
    dtype: np.dtype,
    label: str,
    category: str,
    holders: np.ndarray | None = None,
) -> ShardedArray:
    """A device's ``block`` (inside the program) as the value of global ``shape`` it is a block of, in
    ``dtype``, held by the chips ``holders`` says (all if None: a pipeline stage's weights, its chips)."""
    data = block.astype(dtype).reshape((1,) * len(mesh.shape) + tuple(block.shape))  # the stacked engine's indexing
    return ShardedArray(mesh, Layout.parse(layout), shape, dtype, data, label=label, category=category, holders=holders)


def stage_chips(cfg: TransformerConfig, plan: Plan, mesh: Mesh, key: str) -> np.ndarray | None:
    """The chips of the pipeline stage holding weight ``key`` (None without a pipeline).

    >>> from shardsim.models import TransformerConfig
    >>> cfg = TransformerConfig(layers=2, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)
    >>> stage_chips(cfg, Plan(pp=2), Plan(pp=2).mesh(), "lm_head").tolist()
    [False, True]
    """
    pipe = plan.axis("pipe")
    if pipe is None:
        return None
    along = [mesh.axis_size(pipe) if a == pipe else 1 for a in mesh.axis_names]
    stage = np.arange(mesh.axis_size(pipe)).reshape(along) == stage_of(cfg, plan, key)
    return np.broadcast_to(stage, mesh.shape).copy()


def device_inputs(
    cfg: TransformerConfig,
    plan: Plan,
    mesh: Mesh,
    blocks: Mapping[str, Any],
    tokens: Any,
    targets: Any,
    laid: Laid,
    shapes: Mapping[str, tuple[int, ...]],
) -> tuple[dict[str, ShardedArray], ShardedArray, ShardedArray]:
    """The weights (in the compute dtype, each held by its pipeline stage), the token ids and the
    targets as the values a device's blocks are blocks of."""
    lay = laid.layouts
    weights = {
        k: device_value(mesh, b, lay[k], shapes[k], laid.compute, k, "params", stage_chips(cfg, plan, mesh, k))
        for k, b in blocks.items()
    }
    tok, tgt = (
        device_value(mesh, v, lay["tokens"], shapes["tokens"], np.dtype(v.dtype), k, "activations")
        for k, v in (("tokens", tokens), ("targets", targets))
    )
    return weights, tok, tgt


def run_pipelined_on_device(
    cfg: TransformerConfig,
    plan: Plan,
    mesh: Mesh,
    blocks: Mapping[str, Any],
    tokens: Any,
    targets: Any,
    *,
    laid: Laid,
    shapes: Mapping[str, tuple[int, ...]],
    dropout_seed: int | None = None,
) -> tuple[Stepped, dict[str, ShardedArray], list[dict[str, Any]]]:
    """The pipelined step (:func:`~.pipelined.run_stages`) on a device's blocks, each weight held by its
    stage: what it measured, the gradients, and each microbatch's blocks of the loss parts."""
    weights, tok, tgt = device_inputs(cfg, plan, mesh, blocks, tokens, targets, laid, shapes)
    with work_log(WorkLog(list(laid.attention_work), replaying=True)):
        run = run_stages(cfg, plan, mesh, weights, tok, tgt, dropout_seed=dropout_seed)
    del weights, tok, tgt
    stored, stored_values = stored_of(run, cfg, mesh)
    nm = len(mesh.shape)
    parts = [
        {k: v.reshape(v.shape[nm:]) for k, v in run.stage.loss_blocks[j].items()} for j in range(plan.microbatches)
    ]
    return Stepped(run.trace, StepMemory.since(mesh.memory), stored, stored_values), dict(run.grads.done), parts


def local_block(v: ShardedArray) -> Any:
    """The device's block of ``v`` (inside the program), without the mesh dims."""
    return v.compact().reshape(v.local_shape)


@dataclass(frozen=True)
class Laid:
    """How a step lays its values out, read before an SPMD program traces: every weight's
    storage layout (by key) and ``"tokens"``'s, every gradient's (``"d"`` + key), the loss
    parts' (:data:`~.embedding.LOSS_PARTS`), the compute dtype, and the attention blocks' work
    per chip in program order (which the step replays where the positions are traced)."""

    layouts: dict[str, str]
    compute: np.dtype
    attention_work: tuple[np.ndarray, ...]


def probe(
    cfg: TransformerConfig,
    plan: Plan,
    mesh: Mesh,
    shapes: Mapping[str, tuple[int, ...]],
    dtypes: Mapping[str, np.dtype],
) -> Laid:
    """The step run shape-only on a twin of ``mesh`` (its own ledger): its :class:`Laid`.
    ``shapes`` and ``dtypes`` hold every weight's and ``"tokens"``'s."""
    twin = Mesh(dict(zip(mesh.axis_names, mesh.shape)))
    weights = {k: ShapeDtype(v, dtypes[k]) for k, v in shapes.items() if k not in ("tokens", "targets")}
    ids = ShapeDtype(shapes["tokens"], dtypes["tokens"])
    with work_log(WorkLog([])) as log:  # the causal mask's work per chip, read from the positions' values
        if plan.pp > 1:
            run = run_stages(cfg, plan, twin, weights, ids, ids)
            placed, tok, grads, loss = run.grads.step.weights, run.tokens, run.grads.done, run.stage.loss_layouts
        else:
            step = ModelStep(cfg, plan, twin, weights, shapes["tokens"][1]).inputs(ids, ids, None)
            run_step(step)
            placed, tok, grads, loss = step.step.weights, step.tok, step.grads.done, step.loss_layouts
    layouts = {k: str(v.layout) for k, v in placed.items()} | {"tokens": str(tok.layout)}
    layouts |= {f"d{k}": str(grads[k].layout) for k in weights} | dict(loss)
    return Laid(layouts, compute_dtype(plan, weights), tuple(log.works))


def loss_layouts(
    cfg: TransformerConfig, plan: Plan, mesh: Mesh, shapes: Mapping[str, tuple[int, ...]], ids: np.dtype
) -> dict[str, str]:
    """The layouts of the cross-entropy's per-token parts (:data:`~.embedding.LOSS_PARTS`) under ``plan``.

    >>> from shardsim.models import TransformerConfig
    >>> cfg = TransformerConfig(layers=1, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)
    >>> shapes = {**cfg.param_shapes(), "tokens": (2, 4)}
    >>> loss_layouts(cfg, Plan(dp=2, tp=2), Plan(dp=2, tp=2).mesh(), shapes, np.dtype("int32"))["target logit"]
    '[B_{data}, S]'
    """
    dtypes = {k: np.dtype(np.float32) for k in shapes} | {"tokens": ids}
    return {k: probe(cfg, plan, mesh, shapes, dtypes).layouts[k] for k in LOSS_PARTS}


class DeviceStep(ModelStep):
    """:class:`ModelStep` on a device's blocks of the weights (``blocks``, by the reference's key),
    the token ids and the targets, laid out as ``laid`` says, of global ``shapes``."""

    def __init__(
        self,
        cfg: TransformerConfig,
        plan: Plan,
        mesh: Mesh,
        blocks: Mapping[str, Any],
        tokens: Any,
        targets: Any,
        *,
        laid: Laid,
        shapes: Mapping[str, tuple[int, ...]],
        dropout_seed: int | None = None,
    ) -> None:
        super().__init__(cfg, plan, mesh, blocks, shapes["tokens"][1])
        self.inputs(tokens, targets, dropout_seed)
        self.laid, self.shapes = laid, shapes

    def run(self) -> Stepped:
        """The step (:func:`run_step`), the attention's work per chip replayed from :func:`probe`'s run."""
        with work_log(WorkLog(list(self.laid.attention_work), replaying=True)):
            return run_step(self)

    def place(self) -> None:
        args = (self.cfg, self.plan, self.mesh, self.params, self.tokens, self.targets, self.laid, self.shapes)
        self.params, self.tokens, self.targets = device_inputs(*args)
        super().place()

    def loss_parts(self) -> dict[str, Any]:
        """The device's blocks of the cross-entropy's per-token parts (:data:`~.embedding.LOSS_PARTS`)."""
        nm = len(self.mesh.shape)
        return {k: v.reshape(v.shape[nm:]) for k, v in self.loss_blocks.items()}


__all__ = [
    "DeviceStep",
    "Laid",
    "device_inputs",
    "device_value",
    "local_block",
    "loss_layouts",
    "probe",
    "run_pipelined_on_device",
    "stage_chips",
]
