"""The program a cost is read from: a scheme's own forward+backward, run on shape-only values.

:func:`scheme_program` runs ``shardsim.run_strategy`` with :class:`~shardsim.ShapeDtype`
inputs at the real sizes (no data, milliseconds). With ``layers=L`` the weights are stacked
``[L, D, F]`` / ``[L, F, D]``, so the strategy runs its deep stack: the scheme's per-layer
steps, layer after layer, each layer's input the previous layer's output. The result is a
list of :class:`Step`: each event with its layer and the value ids it waits for and writes.

The output gradient ``dOut`` comes from the loss, so the steps make it wait for the last
forward value; the layer of an event is its position in the forward (or, reversed, the
backward) pass, which runs the same steps for every layer (-1 when chips run different
steps, as pipeline stages do).

>>> from shardsim import Mesh
>>> p = scheme_program("fsdp", Mesh(X=4), batch=64, d_model=32, d_ff=128, layers=2)
>>> [(s.layer, s.event.op, s.event.label) for s in p.steps][:3]
[(0, 'all_gather', 'W_in.0'), (0, 'matmul', 'In @ W_in.0'), (0, 'all_gather', 'W_out.0')]
>>> len(p.steps), p.steps[8].layer, p.steps[8].event.phase
(24, 1, 'backward')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..array import ShapeDtype
from ..dtypes import resolve_dtype
from ..errors import ShardsimError
from ..memory import per_chip
from ..mesh import Mesh
from ..models.mlp import MLP
from ..tracing import Event, Trace


@dataclass(frozen=True)
class Step:
    """One event of the program, in a layer, with the value ids it reads and writes."""

    event: Event
    layer: int
    inputs: tuple[int, ...]
    output: int


@dataclass
class Program:
    """A scheme's step as :class:`Step`s, and its per-chip peak memory by category (bytes)."""

    scheme: str
    mesh: Mesh
    steps: list[Step]
    layers: int
    memory: dict[str, int]


def trace_steps(trace: Trace | Sequence[Event]) -> list[Step]:
    """A recorded trace as steps (layer 0), each reading and writing the ids it recorded.

    >>> import shardsim
    >>> w = shardsim.shard(shardsim.ShapeDtype((8, 8), "bfloat16"), shardsim.Mesh(X=2), "D_X F")
    >>> with shardsim.trace() as t:
    ...     full = shardsim.all_gather(w, "X")
    >>> [(s.event.op, s.inputs == (w.uid,), s.output == full.uid) for s in trace_steps(t)]
    [('all_gather', True, True)]
    """
    events = trace.events if isinstance(trace, Trace) else list(trace)
    return [Step(e, 0, e.inputs, e.output) for e in events]


def scheme_program(
    scheme: str,
    mesh: Mesh,
    batch: int,
    d_model: int,
    d_ff: int,
    *,
    layers: int = 1,
    dtype: Any = "bfloat16",
    activation: str = "identity",
    axes: Mapping[str, str] | None = None,
) -> Program:
    """Run ``scheme`` shape-only at these sizes on a fresh copy of ``mesh``; see the module doc."""
    model = scheme_model(scheme, mesh, d_model, d_ff, layers, axes)
    return mlp_program(scheme, model, mesh, batch, dtype=dtype, activation=activation, axes=axes)


def scheme_model(
    scheme: str, mesh: Mesh, d_model: int, d_ff: int, layers: int = 1, axes: Mapping[str, str] | None = None
) -> MLP:
    """The :class:`~shardsim.models.MLP` scheme ``scheme`` runs at these sizes (its norm and experts).

    >>> from shardsim import Mesh
    >>> scheme_model("tp_ln", Mesh(Y=2), 8, 16, layers=2)
    MLP(d_model=8, d_ff=16, layers=2, activation='identity', norm=True, experts=0, top_k=2)
    """
    from ..strategies import mlp_for

    if layers < 1:
        raise ShardsimError(f"layers must be at least 1, got {layers}")
    return mlp_for(scheme, mesh, d_model, d_ff, layers, axes)


def mlp_program(
    scheme: str,
    model: MLP,
    mesh: Mesh,
    batch: int,
    *,
    dtype: Any = "bfloat16",
    activation: str | None = None,
    axes: Mapping[str, str] | None = None,
) -> Program:
    """Run ``scheme`` shape-only on ``model``'s weights and ``batch`` tokens, on a fresh copy of
    ``mesh`` (its slow chips kept); ``activation`` defaults to the model's.

    >>> from shardsim import Mesh
    >>> from shardsim.models import MLP
    >>> len(mlp_program("ddp", MLP(32, 128, layers=2), Mesh(X=4), 64).steps)
    16
    """
    from ..strategies import run_strategy

    fresh, params, x = _shape_only_inputs(scheme, model, mesh, batch, dtype)
    for chip in np.argwhere(mesh.slowdown != 1.0):  # the cost model reads the slow chips off the mesh
        fresh.slow(float(mesh.slowdown[tuple(chip)]), **dict(zip(mesh.axis_names, map(int, chip))))
    act = model.activation if activation is None else activation
    result = run_strategy(scheme, fresh, params, x, x, activation=act, axes=axes)
    layers = model.layers
    return Program(scheme, fresh, program_steps(result.trace.events, layers), layers, per_chip(result.memory))


def training_memory(
    scheme: str,
    mesh: Mesh,
    batch: int,
    d_model: int,
    d_ff: int,
    *,
    layers: int = 1,
    dtype: Any = "bfloat16",
    optimizer: str = "adam",
    precision: Any = None,
    activation: str = "identity",
    axes: Mapping[str, str] | None = None,
) -> tuple[dict[str, int], dict[str, int]]:
    """Each category's per-chip peak bytes (and ``"total"``) over one shape-only training step,
    and the model state (``params``, ``grads``, ``optimizer``) live when the backward pass has
    finished and the update has not begun: the moment the ZeRO paper's figures describe.

    The step is :class:`~shardsim.training.Trainer`'s own (forward, loss, backward, gradient
    synchronisation, optimizer update), so the weights' master copies and the optimizer's
    moments are counted where the plan keeps them; ``precision`` defaults to ``dtype``'s
    policy (``bfloat16``: bf16 weights, float32 master weights and moments).

    >>> from shardsim import Mesh
    >>> peak, state = training_memory("zero3", Mesh(X=4), batch=64, d_model=32, d_ff=128)
    >>> state["optimizer"] == 12 * (2 * 32 * 128) // 4  # float32 master + Adam's m and v, sharded
    True
    >>> peak["params"] > state["params"]  # the gathered weights come and go
    True
    """
    model = scheme_model(scheme, mesh, d_model, d_ff, layers, axes)
    return mlp_training_memory(
        scheme, model, mesh, batch, dtype=dtype, optimizer=optimizer, precision=precision, activation=activation,
        axes=axes,
    )  # fmt: skip


def mlp_training_memory(
    scheme: str,
    model: MLP,
    mesh: Mesh,
    batch: int,
    *,
    dtype: Any = "bfloat16",
    optimizer: str = "adam",
    precision: Any = None,
    activation: str | None = None,
    axes: Mapping[str, str] | None = None,
) -> tuple[dict[str, int], dict[str, int]]:
    """:func:`training_memory` of ``scheme`` on ``model``'s weights (its activation by default).

    >>> from shardsim import Mesh
    >>> from shardsim.models import MLP
    >>> peak, _ = mlp_training_memory("ddp", MLP(32, 128), Mesh(X=4), 64)
    >>> peak["optimizer"] == 12 * 2 * 32 * 128  # float32 master + Adam's m and v, replicated
    True
    """
    from ..training import Trainer

    fresh, params, x = _shape_only_inputs(scheme, model, mesh, batch, dtype)
    policy = resolve_dtype(dtype).name if precision is None else precision
    act = model.activation if activation is None else activation
    trainer = Trainer(scheme, fresh, params, optimizer, precision=policy, activation=act, axes=axes)
    result = trainer.step(x, x)
    return per_chip(result.memory), per_chip(result.model_state)


def _shape_only_inputs(
    scheme: str, model: MLP, mesh: Mesh, batch: int, dtype: Any
) -> tuple[Mesh, dict[str, ShapeDtype], ShapeDtype]:
    """A fresh mesh of ``mesh``'s shape, the scheme's weights and the batch, all shape-only."""
    from ..strategies import weights_of

    params = weights_of(scheme, model, dtype)
    return Mesh(dict(zip(mesh.axis_names, mesh.shape))), params, ShapeDtype((batch, model.d_model), dtype)


def program_steps(events: Sequence[Event], layers: int = 1) -> list[Step]:
    """Steps of a forward+backward trace of ``layers`` equal layers (see the module doc)."""
    fwd = [e for e in events if e.phase == "forward"]
    bwd = [e for e in events if e.phase == "backward"]
    produced = {e.output for e in events}
    read_forward = {i for e in fwd for i in e.inputs}
    loss = {i for e in bwd for i in e.inputs} - produced - read_forward  # dOut
    after_forward = fwd[-1].output if fwd else None

    position: dict[int, int] = {}
    if any(e.where for e in events):  # stages run different steps (a pipeline): no uniform layer order
        position = {id(e): -1 for e in events}
    elif layers > 1:
        for part, reverse in ((fwd, False), (bwd, True)):
            per_layer = len(part) // layers if len(part) % layers == 0 else 0
            for k, e in enumerate(part):
                block = k // per_layer if per_layer else -1
                position[id(e)] = layers - 1 - block if reverse and per_layer else block
    steps = []
    for e in events:
        inputs = e.inputs
        if after_forward is not None and loss & set(inputs):
            inputs = tuple(after_forward if i in loss else i for i in inputs)
        steps.append(Step(e, position.get(id(e), 0), inputs, e.output))
    return steps


def chips_running(mesh: Mesh, where: str) -> int:
    """How many chips run an event held ``where`` (``""``: all; ``"pipe1"``: that stage's)."""
    if not where:
        return int(mesh.size)
    fixed = 1
    for token in where.split(","):
        hits = [a for a in mesh.axis_names if token.startswith(a) and token[len(a) :].isdigit()]
        if hits:
            fixed *= mesh.axis_size(max(hits, key=len))
    return int(mesh.size) // fixed
