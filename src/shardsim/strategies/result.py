"""What one training step shows, whichever model ran it: :class:`RunResult` and its :class:`StepMemory`.

An MLP scheme's step and a transformer's step give the same type; the fields one kind of
model has no value for are None (the transformer has no ``out``, an MLP step driven by
``dout`` has no loss) or empty.

>>> import numpy as np, shardsim
>>> r = shardsim.run_strategy("ddp", shardsim.Mesh(X=2), shardsim.mlp.init(4, 8), np.ones((2, 4)), np.ones((2, 4)))
>>> type(r).__name__, r.loss, sorted(r.memory)[:2], r.memory.peak("params").tolist()
('RunResult', None, ['activations', 'grads'], [512, 512])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..memory import CATEGORIES, MemoryLedger
from ..mesh import Mesh
from ..tracing import Trace

if TYPE_CHECKING:
    from ..array import ShardedArray


class StepMemory(dict[str, np.ndarray]):
    """Each chip's peak bytes during a step by category, above what was live when it began, plus
    ``"total"`` (arrays of shape ``mesh.shape``); ``ledger`` is the mesh's ledger itself.

    On a fresh mesh nothing was live before, so these are the ledger's own peaks.

    >>> from shardsim import Mesh, shard
    >>> mesh = Mesh(X=2)
    >>> before = mesh.memory.snapshot()["live"]
    >>> mesh.memory.reset_peak()
    >>> w = shard(np.zeros((4, 4), np.float32), mesh, "A B", category="params")
    >>> m = StepMemory.since(mesh.memory, before)
    >>> m["params"].tolist(), m.peak().tolist(), m.categories()
    ([64, 64], [64, 64], ['params'])
    """

    ledger: MemoryLedger | None

    def __init__(self, peaks: dict[str, np.ndarray] | None = None, ledger: MemoryLedger | None = None) -> None:
        super().__init__(peaks or {})
        self.ledger = ledger

    @classmethod
    def since(cls, ledger: MemoryLedger, before: dict[str, np.ndarray] | None = None) -> StepMemory:
        """The peaks ``ledger`` saw since its last ``reset_peak``, less the bytes live in ``before``
        (a ``snapshot()["live"]`` taken when the step began; None: nothing was)."""
        start = before or {}
        peaks = ledger.snapshot()["peak"]
        return cls({c: peaks[c] - start.get(c, 0) for c in peaks}, ledger)

    def peak(self, category: str | None = None) -> np.ndarray:
        """Each chip's peak bytes of ``category`` during the step (None: of all of them)."""
        key = "total" if category is None else category
        if key in self:
            return self[key].copy()
        shape = self.ledger.mesh.shape if self.ledger is not None else ()
        return np.zeros(shape, np.int64)

    def categories(self) -> list[str]:
        """The categories the step used, the standard ones first (as the ledger lists them)."""
        seen = [c for c in self if c != "total"]
        return [c for c in CATEGORIES if c in seen] + [c for c in seen if c not in CATEGORIES]


@dataclass(kw_only=True)
class RunResult:
    """One forward and backward step of a model under a plan (or of an MLP scheme).

    ``loss`` is the mean loss (None when shape-only, and for an MLP step, which is driven by
    the output's gradient ``dout`` rather than a loss); ``grads`` are global NumPy arrays
    (None when shape-only): the reference's keys for the transformer, ``x`` and the weights
    for an MLP (a stack's weight gradients ``[L, ...]``); ``sharded_grads`` the gradients as
    the plan leaves them (split over the data axis under ZeRO-2/3); ``trace`` every event of
    the step; ``memory`` the step's :class:`StepMemory`; ``stored`` per layer, each chip's bytes
    of activations kept for the backward pass (the ledger's live activations after the layer's
    forward minus before it, shape ``mesh.shape``); ``stored_values`` per layer, the kept
    values' bytes per chip that holds them, by name; ``peak`` each chip's peak bytes during the
    step, from the ledger. ``out`` is the MLP's output (None for the transformer, and when
    shape-only); ``activations`` the per-chip bytes of each stored activation (an MLP's also
    ``In`` and ``Out``; a stack's named per block: ``H_pre.0``, ``H_pre.1``...); ``layouts``
    the layouts of the inputs, weights, output and gradients (one block's); ``axes`` the mesh
    axis of each role; ``scheme`` the MLP scheme's name, ``model`` the model, ``plan`` the plan
    (None for a scheme that is no plan on the MLP) and ``mesh`` the mesh.
    """

    loss: float | None
    grads: dict[str, np.ndarray] | None
    sharded_grads: dict[str, ShardedArray]
    trace: Trace
    memory: StepMemory
    mesh: Mesh
    stored: list[np.ndarray] = field(default_factory=list)
    stored_values: list[dict[str, int]] = field(default_factory=list)
    peak: np.ndarray | None = None
    out: np.ndarray | None = None
    activations: dict[str, int] = field(default_factory=dict)
    layouts: dict[str, str] = field(default_factory=dict)
    axes: dict[str, str] = field(default_factory=dict)
    scheme: str = ""
    model: Any = None
    plan: Any = None
