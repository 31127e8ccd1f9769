"""What one training step shows: :class:`StepResult`, the same for the MLP and the transformer.

>>> import numpy as np, shardsim
>>> from shardsim.training import SGD, Trainer
>>> x = np.ones((2, 4), np.float32)
>>> r = Trainer("ddp", shardsim.Mesh(X=2), shardsim.models.reference_mlp.init(4, 8), SGD(lr=0.1)).step(x, 0 * x)
>>> r.scheme, r.step, sorted(r.model_state) == sorted(MODEL_STATE)
('ddp', 1, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..mesh import Mesh
from ..tracing import Trace

MODEL_STATE = ("params", "grads", "optimizer")  # the ledger categories of StepResult.model_state


@dataclass
class StepResult:
    """What one training step shows.

    ``loss`` is the loss before the update (the mean squared error of an MLP, the mean
    cross-entropy of a transformer; None for a shape-only run).
    ``memory`` is each chip's peak bytes by category during the step, shape ``mesh.shape``,
    plus ``"total"`` — absolute, counting the weights and optimizer state that live across
    steps (unlike :class:`~shardsim.strategies.StrategyResult`, which counts above what was
    live before). ``model_state`` is each chip's live ``params``, ``grads`` and
    ``optimizer`` bytes when the backward pass has finished and the optimizer step has not
    begun: the moment the ZeRO paper's per-device formulas describe.
    ``stored_activations`` is each chip's live activation bytes at the end of the forward
    pass: what the blocks keep for the backward pass, plus the output. ``layouts`` has the
    input, weights, output, reduced gradients (``dw_in``) and optimizer state (``opt_w_in``).
    ``params`` (global weights after the step) is filled by :func:`~shardsim.training.train_step`.
    ``loss_scale`` is the scale this step multiplied dOut by; ``skipped`` is True when its
    gradients held inf/NaN and the update was skipped (then ``step`` did not advance).

    >>> StepResult.__dataclass_fields__["loss_scale"].default
    1.0
    """

    scheme: str
    mesh: Mesh
    step: int
    loss: float | None
    trace: Trace
    memory: dict[str, np.ndarray]
    model_state: dict[str, np.ndarray]
    stored_activations: np.ndarray
    layouts: dict[str, str]
    axes: dict[str, str] = field(default_factory=dict)
    params: dict[str, np.ndarray] | None = None
    loss_scale: float = 1.0
    skipped: bool = False
