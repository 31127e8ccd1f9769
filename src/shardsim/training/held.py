"""What a step program reads and writes of the trainer it runs for.

A step program (:class:`~shardsim.training.mlp_step.MLPStep`,
:class:`~shardsim.training.model_step.ModelStep`, the JAX step) is handed its
:class:`~shardsim.training.Trainer` on every call. It reads and writes the fields this
protocol names, and no others, so the step programs depend on this list, not on the
trainer that holds them (the trainer imports the step programs; they do not import it).

>>> from shardsim.training import Trainer
>>> [c.__name__ for c in Trainer.__mro__[:3]], "scheme" in TrainerState.__annotations__
(['Trainer', 'Checkpointed', 'TrainerState'], True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..mesh import Mesh
    from ..models import TransformerConfig
    from ..plans import Plan
    from ..strategies.base import Ctx, Scheme
    from .optim import Optimizer
    from .precision import Precision
    from .scaling import ScaleState
    from .update import Slots


class TrainerState(Protocol):
    """The trainer's fields a step program uses: its mesh, precision, optimizer and state."""

    mesh: Mesh
    precision: Precision
    optimizer: Optimizer
    scale: ScaleState
    step_count: int
    skipped_steps: int
    plan: Plan | None
    params: Any  # the weights the chips compute with (compute dtype): list of blocks, or dict by key
    master: Any  # float32 master weights (mixed precision only), state layout
    moments: Any  # optimizer state, state layout: {key: {slot: value}} (per block for an MLP)
    state_layouts: dict[str, str]
    names: list[str]
    depth: int | None
    # an MLP's
    scheme: Scheme
    axes: dict[str, str]
    ctx: Ctx
    layouts: dict[str, str]
    residual: bool
    recompute: bool
    block_shapes: list[dict[str, Any]]
    # a transformer's
    cfg: TransformerConfig
    roles: Any  # the plan's Roles
    data_axis: str | None
    gathers: bool
    dropout_seed: int | None

    def state_slots(self) -> Slots:
        """Where each value of the trainer's state lives: its path, the dict holding it, its key there."""
        ...


__all__ = ["TrainerState"]
