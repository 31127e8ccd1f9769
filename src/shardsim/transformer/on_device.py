"""The transformer's step on one device's blocks: what an engine whose data is a device's own block runs.

Inside an SPMD program (JAX's ``shard_map``) each device holds only its own block of every
value. :class:`DeviceStep` is :class:`~shardsim.transformer.run.ModelStep` made from those
blocks: each weight and token block becomes a :class:`~shardsim.ShardedArray` where the step
places its inputs, so the step's trace and memory are the stacked engine's, and the loss
comes back as the cross-entropy's per-token parts (:attr:`ModelStep.loss_blocks`), which the
program returns and the host reduces. :func:`unsupported` names what such a step cannot
run yet.

>>> from shardsim.models import TransformerConfig
>>> from shardsim.plans import Plan
>>> cfg = TransformerConfig(layers=2, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)
>>> unsupported(cfg, Plan(tp=2)) is None, unsupported(cfg, Plan(pp=2))
(True, 'pipeline parallelism (pp > 1)')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..array import ShapeDtype, ShardedArray
from ..layout import Layout
from ..mesh import Mesh
from ..models import TransformerConfig
from ..plans import Plan
from ..strategies.context.problem import WorkLog, work_log
from ..strategies.stack import Stepped, run_step
from .run import ModelStep


def unsupported(cfg: TransformerConfig, plan: Plan) -> str | None:
    """What of ``plan`` a step on device blocks cannot run yet (None: it runs all of it)."""
    if plan.pp > 1:
        return "pipeline parallelism (pp > 1)"
    return None


def device_value(
    mesh: Mesh, block: Any, layout: str, shape: tuple[int, ...], dtype: np.dtype, label: str, category: str
) -> ShardedArray:
    """A device's ``block`` (inside the program) as the value of global ``shape`` it is a block of, in ``dtype``."""
    data = block.astype(dtype).reshape((1,) * len(mesh.shape) + tuple(block.shape))  # the stacked engine's indexing
    return ShardedArray(mesh, Layout.parse(layout), shape, dtype, data, label=label, category=category)


def local_block(v: ShardedArray) -> Any:
    """The device's block of ``v`` (inside the program), without the mesh dims."""
    return v.compact().reshape(v.local_shape)


def probe(
    cfg: TransformerConfig,
    plan: Plan,
    mesh: Mesh,
    shapes: Mapping[str, tuple[int, ...]],
    dtypes: Mapping[str, np.dtype],
) -> tuple[ModelStep, list[np.ndarray]]:
    """The step run shape-only on a twin of ``mesh`` (its own ledger), for the layouts an SPMD
    program needs before it traces: the weights', the tokens', the gradients' and the loss parts',
    and, second, the attention blocks' work per chip, which :class:`DeviceStep` replays where the
    positions are traced. ``shapes`` and ``dtypes`` hold every weight's and ``"tokens"``."""
    twin = Mesh(dict(zip(mesh.axis_names, mesh.shape)))
    weights = {k: ShapeDtype(v, dtypes[k]) for k, v in shapes.items() if k not in ("tokens", "targets")}
    ids = ShapeDtype(shapes["tokens"], dtypes["tokens"])
    step = ModelStep(cfg, plan, twin, weights, shapes["tokens"][1]).inputs(ids, ids, None)
    with work_log(WorkLog([])) as log:  # the causal mask's work per chip, read from the positions' values
        run_step(step)
    return step, log.works


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
    return probe(cfg, plan, mesh, shapes, dtypes)[0].loss_layouts


class DeviceStep(ModelStep):
    """:class:`ModelStep` on a device's blocks of the weights (``blocks``, by the reference's key),
    the token ids and the targets, laid out as ``layouts`` says (each weight's key, and
    ``"tokens"``), of global ``shapes``; the weights computed in ``compute``."""

    def __init__(
        self,
        cfg: TransformerConfig,
        plan: Plan,
        mesh: Mesh,
        seq: int,
        blocks: Mapping[str, Any],
        tokens: Any,
        targets: Any,
        *,
        layouts: Mapping[str, str],
        shapes: Mapping[str, tuple[int, ...]],
        compute: np.dtype,
        dropout_seed: int | None = None,
        attention_work: list[np.ndarray] | None = None,
    ) -> None:
        super().__init__(cfg, plan, mesh, blocks, seq)
        self.inputs(tokens, targets, dropout_seed)
        self.layouts, self.shapes, self.compute = layouts, shapes, compute
        self.attention_work = list(attention_work or [])

    def run(self) -> Stepped:
        """The step (:func:`run_step`), the attention's work per chip replayed from :func:`probe`'s run."""
        with work_log(WorkLog(list(self.attention_work), replaying=True)):
            return run_step(self)

    def place(self) -> None:
        mesh, lay, shapes = self.mesh, self.layouts, self.shapes
        self.params = {
            k: device_value(mesh, b, lay[k], shapes[k], self.compute, k, "params") for k, b in self.params.items()
        }
        self.tokens, self.targets = (
            device_value(mesh, v, lay["tokens"], shapes["tokens"], np.dtype(v.dtype), k, "activations")
            for k, v in (("tokens", self.tokens), ("targets", self.targets))
        )
        super().place()

    def loss_parts(self) -> dict[str, Any]:
        """The device's blocks of the cross-entropy's per-token parts (:data:`~.embedding.LOSS_PARTS`)."""
        nm = len(self.mesh.shape)
        return {k: v.reshape(v.shape[nm:]) for k, v in self.loss_blocks.items()}


__all__ = ["DeviceStep", "device_value", "local_block", "loss_layouts", "probe", "unsupported"]
