"""The skeleton of one training step, written once for every model: each model supplies its layer program.

    1. place the weights and inputs; start measuring the peak
    2. forward: the program's start (an embedding, or the input itself), then layer after layer,
       each keeping what its backward needs (counted: the live activations it adds)
    3. backward: the program's start (a loss head's gradient, or ``dout``), then the layers
       last first, each freeing what it kept and handing its gradients over as they come
    4. the program's finish (the embedding's gradient, the gradient reductions left)

With ``residual`` the step adds each layer's input to its output (and the output's
gradient to the input's): a stack of blocks with a skip connection around each.

>>> import numpy as np, shardsim
>>> r = shardsim.run_strategy("tp", shardsim.Mesh(Y=2), shardsim.mlp.init(4, 8), np.ones((2, 4)), np.ones((2, 4)))
>>> r.trace.events[0].phase, len(r.stored), sorted(r.stored_values[0])
('forward', 1, ['H', 'H_pre', 'In (gathered)'])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..array import ShardedArray
from ..mesh import Mesh
from ..ops import add
from ..tracing import Trace, phase, trace
from .result import StepMemory

Kept = Mapping[str, ShardedArray]


class Layers(Protocol):
    """``depth`` layers, each a forward and a backward: what :func:`forward_layers` and
    :func:`backward_layers` run."""

    depth: int
    residual: bool

    def layer_forward(self, i: int, x: ShardedArray) -> tuple[ShardedArray, Kept]:
        """Layer ``i``'s output and what its backward needs (under recompute, only what that reruns from)."""

    def layer_backward(self, i: int, kept: Kept, dx: ShardedArray) -> tuple[ShardedArray, Mapping[str, ShardedArray]]:
        """Layer ``i``'s input gradient and weight gradients, from what it kept and its output's gradient."""

    def layer_gradients(self, i: int, grads: Mapping[str, ShardedArray]) -> None:
        """Take layer ``i``'s weight gradients (reduce them now, or keep them for later)."""


class LayerProgram(Layers, Protocol):
    """What a model supplies to :func:`run_step`: its layers on ``mesh`` and the steps around them."""

    mesh: Mesh

    def place(self) -> None:
        """Put the weights and inputs on the mesh (the step's memory counts them)."""

    def start(self) -> ShardedArray:
        """The first layer's input (inside the forward phase)."""

    def finish_forward(self, x: ShardedArray) -> None:
        """Whatever follows the last layer (a loss head), given its output."""

    def start_backward(self) -> ShardedArray:
        """The gradient of the last layer's output (inside the backward phase)."""

    def finish_backward(self, dx: ShardedArray) -> None:
        """Whatever precedes the first layer's backward (an embedding), and the reductions left."""


@dataclass
class Stepped:
    """What :func:`run_step` measured: the trace, the memory, and per layer the stored bytes."""

    trace: Trace
    memory: StepMemory
    stored: list[np.ndarray]
    stored_values: list[dict[str, int]]


def run_step(program: LayerProgram) -> Stepped:
    """One forward and backward of ``program``, traced, with its memory above what was live before it."""
    ledger = program.mesh.memory
    before = ledger.snapshot()["live"]
    program.place()
    ledger.reset_peak()
    with trace() as t:  # each pass's first input is handed over, not held here: it dies when its layer is done
        with phase("forward"):
            x, kept, stored, stored_values = forward_layers(program, program.start())
            program.finish_forward(x)
            del x
        with phase("backward"):
            dx = backward_layers(program, kept, program.start_backward())
            program.finish_backward(dx)
            del dx
    return Stepped(t, StepMemory.since(ledger, before), stored, stored_values)


def forward_layers(
    program: Layers, x: ShardedArray
) -> tuple[ShardedArray, list[Kept], list[np.ndarray], list[dict[str, int]]]:
    """The layers' forward, first to last: the output, what each layer keeps, and per layer the
    per-chip bytes it adds to the live activations and the bytes of each value it keeps."""
    ledger = x.mesh.memory
    kept: list[Kept] = []
    stored: list[np.ndarray] = []
    stored_values: list[dict[str, int]] = []
    for i in range(program.depth):
        before = ledger.live("activations")
        y, saved = program.layer_forward(i, x)
        kept.append(saved)
        del saved
        x = add(x, y, label="Out") if program.residual else y
        del y
        stored.append(ledger.live("activations") - before)
        stored_values.append({k: v.local_nbytes for k, v in kept[-1].items()})
    return x, kept, stored, stored_values


def backward_layers(program: Layers, kept: list[Kept], dx: ShardedArray) -> ShardedArray:
    """The layers' backward, last first; empties ``kept`` as it goes and returns the input's gradient."""
    for i in reversed(range(program.depth)):
        # handed over, not held here: what the layer kept dies inside its backward
        d_layer, grads = program.layer_backward(i, _take(kept, i), dx)
        if not program.residual:
            dx = d_layer
        program.layer_gradients(i, grads)
        del grads
        if program.residual:
            dx = add(dx, d_layer, label="dOut")
        del d_layer
    return dx


def _take(kept: list[Kept], i: int) -> Kept:
    saved, kept[i] = kept[i], {}
    return saved
