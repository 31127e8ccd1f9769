"""Run a pipeline schedule on the mesh: stages exchange activations and gradients by ``ppermute``.

Each pipeline stage is the set of chips at one coordinate of the pipe axis ``Z``; its values
live only there (``holders``), so the ledger shows each stage's own memory. :class:`Pipeline`
runs the schedule's items in time order, each on its stage (Narayanan et al. 2021, §2.2); a
:class:`Stage` says what a stage computes, the executor does the rest:

    F(virtual stage k, microbatch j):
        1. a = the stage's input (k = 0: the microbatch, or its embedding) or what stage k-1 sent
        2. for each of the stage's layers l: a, saved = layer forward(l, a); keep saved in the stash
        3. ppermute Z +1 (a) to stage k+1, or the last stage's output step (its output, its loss)
    B(virtual stage k, microbatch j):
        1. g = the last stage's dOut (given, or its loss's gradient) or what stage k+1 sent
        2. for each layer, last first: g, dW = layer backward(l, stash, g); add dW to the
           stage's gradients; the stash is freed
        3. ppermute Z -1 (g) to stage k-1, or the first stage's input step (dIn, the embedding's gradient)
    W(virtual stage k, microbatch j), when the schedule splits the backward (zero bubble):
        the weight-gradient work each layer's B kept, run now (:meth:`Stage.weights`); its
        gradients are added to the stage's, and what the work held is freed

With ``v`` chunks per stage (interleaved), virtual stage ``k`` is chunk ``k // p`` of stage
``k % p`` and sends wrap around the ring from the last stage to the first. After the last item
the stage program finishes the step: gradients that are partial sums over the data axis are
reduced once, as data parallelism does after the pipeline flush. The executor also keeps the
ledger's stash after every time step, and each layer's stored bytes for microbatch 0.

:class:`PipelineStep` is the MLP stack's stage program: ``W[L_Z, ...]`` held by stages, one
scheme's block per layer, the batch cut into microbatches along its first dimension.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ...array import ShardedArray
from ...collectives import all_reduce, ppermute
from ...errors import ShardingError
from ...mesh import Mesh
from ...ops import add
from ...pieces import concat, place, split, stack, take
from ...tracing import item as in_item
from ...tracing import phase, trace
from .schedule import Item, Schedule

Block = Callable[..., Any]
Loss = Callable[[int, ShardedArray], ShardedArray]  # (microbatch j, its output) → its dOut, on the last stage
Values = dict[str, ShardedArray]  # a layer's saved values, or its weight gradients, by name
STASH = "stash"  # ledger category of what a stage keeps for its backward pass


@dataclass(frozen=True)
class Executed:
    """One item as it ran: its FLOPs and bytes sent per chip of its stage."""

    item: Item
    flops: int
    sent_bytes: int


class Stage(Protocol):
    """What a pipeline stage computes; :class:`Pipeline` walks the schedule and moves the values.

    ``layer`` is the model layer's index: layer ``i`` of virtual stage ``k`` is ``k·n + i`` with
    ``n`` layers per virtual stage; ``j`` is the microbatch, ``stage`` the pipe coordinate.
    :class:`PipelineStep` (an MLP stack) is one; the transformer under ``pp > 1`` has another.

    >>> sorted(name for name in vars(Stage) if not name.startswith("_"))  # doctest: +NORMALIZE_WHITESPACE
    ['accumulate', 'backward_in', 'backward_layer', 'backward_out', 'finish', 'forward_in',
     'forward_layer', 'forward_out', 'message', 'ready', 'weights']
    """

    def ready(self) -> bool:
        """Whether backward items may run: the last stage can get its microbatches' ``dOut``."""
        ...

    def forward_in(self, stage: int, j: int) -> ShardedArray:
        """The first virtual stage's input for microbatch ``j``, held by ``stage``."""
        ...

    def forward_layer(self, layer: int, j: int, x: ShardedArray) -> tuple[ShardedArray, Values]:
        """One layer's forward: its output and what it keeps for its backward."""
        ...

    def forward_out(self, j: int, x: ShardedArray) -> None:
        """The last virtual stage's output of microbatch ``j``: kept as the step's, or fed to the loss."""
        ...

    def backward_in(self, stage: int, j: int) -> tuple[ShardedArray, Values]:
        """The last virtual stage's ``dOut`` of microbatch ``j``, and any weight gradients it made."""
        ...

    def backward_layer(self, layer: int, j: int, saved: Values, g: ShardedArray) -> tuple[ShardedArray, Values]:
        """One layer's backward from its saved values: the gradient of its input, its weights'."""
        ...

    def weights(self, layer: int, j: int, pending: Values) -> Values:
        """A split backward's W: the weight gradients a layer's (or the last stage's, ``layer = -1``)
        B left as work in ``pending``, made now."""
        ...

    def accumulate(self, layer: int, grads: Values) -> None:
        """Add a layer's (or the last stage's, ``layer = -1``) weight gradients to the step's."""
        ...

    def backward_out(self, j: int, g: ShardedArray) -> None:
        """The first virtual stage's gradient of microbatch ``j``'s input."""
        ...

    def message(self, kind: str, j: int) -> str:
        """The label of what a stage sends on: microbatch ``j``'s activation (``"F"``) or gradient (``"B"``)."""
        ...

    def finish(self) -> None:
        """After the last item: the step's results (gradients reduced once, after the flush)."""
        ...


def check_stages(schedule: Schedule, mesh: Mesh, pipe: str) -> None:
    """Raise unless the pipe axis has one coordinate per stage of the schedule.

    >>> from shardsim import Mesh
    >>> from shardsim.strategies.pipeline import gpipe
    >>> check_stages(gpipe(2, 4), Mesh(Z=2), "Z")
    """
    p = schedule.stages
    if mesh.axis_size(pipe) != p:
        raise ShardingError(f"the schedule has {p} stages but the pipe axis {pipe!r} has {mesh.axis_size(pipe)}")


class Pipeline:
    """A schedule run item by item on the mesh, a :class:`Stage` computing each item's layers.

    ``layers`` is the number of layers of one virtual stage; :meth:`run` takes the stage. ``category`` is the ledger
    category of what stages keep for their backward: :attr:`stash_bytes` records it after each
    time step, :attr:`stored` each layer's growth of it on microbatch 0 (``stored_values`` the
    kept values' bytes, by name). With ``measure``, each item runs in its own trace and
    :attr:`executed` records its FLOPs and bytes (a failed chip's trace event then counts from
    the item's start); with ``tag_items``, events carry their item's name (``"F2.0"``).

    >>> import numpy as np, shardsim
    >>> from shardsim.strategies.pipeline import gpipe
    >>> from shardsim.pieces import place
    >>> class Relay:  # each layer passes its input on and keeps nothing
    ...     x, calls = shardsim.shard(np.ones((2, 2)), shardsim.Mesh(Z=2), "[B, D]"), []
    ...     def ready(self): return True
    ...     def forward_in(self, stage, j): return place(self.x, Z=stage)
    ...     def forward_layer(self, layer, j, x): self.calls.append(f"F{layer}.{j}"); return x, {}
    ...     def forward_out(self, j, x): pass
    ...     def backward_in(self, stage, j): return place(self.x, Z=stage), {}
    ...     def backward_layer(self, layer, j, saved, g): self.calls.append(f"B{layer}.{j}"); return g, {}
    ...     def accumulate(self, layer, grads): pass
    ...     def backward_out(self, j, g): pass
    ...     def message(self, kind, j): return f"{kind}{j}"
    ...     def finish(self): pass
    >>> relay = Relay()
    >>> Pipeline(gpipe(2, 2), relay.x.mesh, "Z", layers=1).run(relay)
    True
    >>> relay.calls
    ['F0.0', 'F0.1', 'F1.0', 'F1.1', 'B1.0', 'B0.0', 'B1.1', 'B0.1']
    """

    def __init__(
        self,
        schedule: Schedule,
        mesh: Mesh,
        pipe: str,
        layers: int,
        *,
        category: str = STASH,
        measure: bool = True,
        tag_items: bool = False,
    ) -> None:
        check_stages(schedule, mesh, pipe)
        p = schedule.stages
        self.schedule, self.mesh, self.pipe, self.layers = schedule, mesh, pipe, layers
        self.category, self.measure, self.tag_items = category, measure, tag_items
        self.last = p * schedule.chunks - 1  # the last virtual stage
        self.todo = sorted(schedule.items)
        self.sent: dict[tuple[str, int, int], ShardedArray] = {}  # (kind, virtual stage, mb) → message
        self.stash: dict[tuple[int, int], list[Values]] = {}  # (virtual stage, mb) → its layers' saved values
        self.deferred: dict[tuple[int, int], list[tuple[int, Values]]] = {}  # (virtual stage, mb) → its W's work
        self.executed: list[Executed] = []
        self.stash_bytes: list[np.ndarray] = []  # the ledger's stash bytes per chip after each time step
        self.stored: dict[int, np.ndarray] = {}  # model layer → its stored bytes per chip, microbatch 0
        self.stored_values: dict[int, dict[str, int]] = {}  # model layer → its kept values' bytes
        self.finished = False

    def run(self, stage: Stage) -> bool:
        """Run items in time order, ``stage`` computing them, stopping before a backward item
        while it is not :meth:`~Stage.ready`; True once every item ran and it finished the step.

        The stage is an argument, not an attribute, so that a stage program which holds its
        executor forms no reference cycle: its values die as soon as the step drops them.
        """
        if self.finished:
            return True
        while self.todo:
            it = self.todo[0]
            if it.kind == "B" and not stage.ready():
                return False
            self.todo.pop(0)
            with trace() if self.measure else contextlib.nullcontext() as t:
                {"F": self._forward, "B": self._backward, "W": self._weights}[it.kind](stage, it)
            if t is not None:
                self.executed.append(Executed(it, t.total("flops"), t.total("sent_bytes")))
            if not self.todo or self.todo[0].time != it.time:
                self.stash_bytes.append(self.mesh.memory.live(self.category))
        with phase("backward"):
            stage.finish()
        self.finished = True
        return True

    def _tagged(self, name: str) -> contextlib.AbstractContextManager[None]:
        return in_item(name) if self.tag_items else contextlib.nullcontext()

    def _layers(self, k: int) -> range:
        return range(k * self.layers, (k + 1) * self.layers)

    def _forward(self, stage: Stage, it: Item) -> None:
        k, j = self.schedule.virtual_stage(it), it.microbatch
        with phase("forward"), self._tagged(f"F{k}.{j}"):
            # 1. the first stage makes its input, the others take what the previous one sent
            x = stage.forward_in(it.stage, j) if k == 0 else self.sent.pop(("F", k, j))
            kept = []
            for layer in self._layers(k):  # 2. the stage's layers
                before = self.mesh.memory.live(self.category)
                x, saved = stage.forward_layer(layer, j, x)
                kept.append(saved)
                if j == 0:
                    self.stored[layer] = self.mesh.memory.live(self.category) - before
                    self.stored_values[layer] = {name: v.local_nbytes for name, v in saved.items()}
                del saved
            self.stash[(k, j)] = kept
            if k < self.last:  # 3. send to the next stage
                self.sent[("F", k + 1, j)] = ppermute(x.named(stage.message("F", j)), self.pipe, 1)
            else:
                stage.forward_out(j, x)

    def _backward(self, stage: Stage, it: Item) -> None:
        k, j = self.schedule.virtual_stage(it), it.microbatch
        with phase("backward"), self._tagged(f"B{k}.{j}"):
            # 1. the last stage gets dOut of the microbatch, the others what the next stage sent
            later = self.deferred.setdefault((k, j), []) if self.schedule.split else None
            if k < self.last:
                g = self.sent.pop(("B", k, j))
            else:
                g, grads = stage.backward_in(it.stage, j)
                self._add(stage, -1, grads, later)
            kept = self.stash.pop((k, j))
            for layer in reversed(self._layers(k)):  # 2. the layers, last first
                g, grads = stage.backward_layer(layer, j, kept.pop(), g)
                self._add(stage, layer, grads, later)  # summed over the microbatches
            del grads
            if k > 0:  # 3. send back to the previous stage
                self.sent[("B", k - 1, j)] = ppermute(g.named(stage.message("B", j)), self.pipe, -1)
            else:
                stage.backward_out(j, g)

    @staticmethod
    def _add(stage: Stage, layer: int, grads: Values, later: list[tuple[int, Values]] | None) -> None:
        """Add a B's gradients to the stage's now, or (a split backward) keep them for its W."""
        if later is None:
            stage.accumulate(layer, grads)
        else:
            later.append((layer, grads))

    def _weights(self, stage: Stage, it: Item) -> None:
        k, j = self.schedule.virtual_stage(it), it.microbatch
        with phase("backward"), self._tagged(f"W{k}.{j}"):
            for layer, pending in self.deferred.pop((k, j)):  # in the order B kept them
                stage.accumulate(layer, stage.weights(layer, j, pending))

    def measured_bubble(self) -> float:
        """Bubble over ideal time from the items as they ran, each taking its FLOPs as time."""
        flops = {e.item.key: float(e.flops) for e in self.executed}
        return self.schedule.bubble(lambda it: flops[it.key])


class PipelineStep:
    """One forward+backward step of an MLP stack's pipeline, run item by item from its schedule.

    ``params`` are ``{"w_in": W[L_Z, D, F], "w_out": W[L_Z, F, D]}`` (``[C, L_Z, ...]`` with
    ``v = C`` chunks per stage); ``block_forward(ctx, a, w)`` and
    ``block_backward(ctx, saved, g, w)`` are one layer's steps (a scheme's forward and backward,
    whose weight gradients may be partial over the data axis). :meth:`run` executes items until
    the step needs ``dout`` (the first backward) or ends; ``out``, ``dx`` and ``grads`` are ready
    once :attr:`done`. Given a loss instead of ``dout`` (a training step), the last stage turns
    each microbatch's output into its ``dOut`` as soon as it is out, as Megatron's last stage
    does; the outputs are then consumed one by one and ``out`` stays None. It is the
    :class:`Stage` its :attr:`pipeline` runs.
    """

    def __init__(
        self,
        ctx: Any,
        x: ShardedArray,
        params: Mapping[str, ShardedArray],
        schedule: Schedule,
        block_forward: Block,
        block_backward: Block,
    ) -> None:
        self.ctx, self.schedule = ctx, schedule
        self.block_forward, self.block_backward = block_forward, block_backward
        self.pipe = ctx.axis("pipe")
        self.data = ctx.axes.get("data")
        self.params = dict(params)
        p, m, v = schedule.stages, schedule.microbatches, schedule.chunks
        check_stages(schedule, x.mesh, self.pipe)
        w = self.params["w_in"]
        self.chunked = w.ndim == 4  # [C, L_Z, D, F]: v chunks of layers per stage
        layers = w.global_shape[1] if self.chunked else w.global_shape[0]
        if schedule.split:
            raise ShardingError(
                f"the {schedule.name} schedule splits each backward into B and W: the transformer's pipeline "
                "runs it (run_model with a Plan); an MLP scheme's block backward is one step, run it under "
                "'1f1b', 'gpipe' or 'interleaved'"
            )
        if self.chunked and w.global_shape[0] != v:
            raise ShardingError(f"W_in has {w.global_shape[0]} chunks but the schedule runs {v} per stage")
        if layers % p:
            raise ShardingError(f"{layers} layers per chunk do not divide over {p} stages")
        self.per_stage = layers // p  # layers of one virtual stage
        self.mesh = x.mesh
        self.microbatches = split(x, self._batch_dim(x), m, label="In")
        self.douts: list[ShardedArray] = []
        self.loss: Loss | None = None
        self.finished = 0  # microbatches out of the last stage
        self.acc: dict[tuple[int, str], ShardedArray] = {}  # (model layer, weight) → gradient
        self.outs: dict[int, ShardedArray] = {}
        self.dxs: dict[int, ShardedArray] = {}
        self.out: ShardedArray | None = None
        self.dx: ShardedArray | None = None
        self.grads: dict[str, ShardedArray] = {}
        self.pipeline = Pipeline(schedule, x.mesh, self.pipe, self.per_stage)

    @staticmethod
    def _batch_dim(x: ShardedArray) -> str:
        """The batch dimension: the first of ``In[B, D]`` (``[B_X, D_Y]`` with data and tensor axes)."""
        return x.layout.dims[0].name

    @property
    def done(self) -> bool:
        return self.pipeline.finished and (self.out is not None or self.loss is not None) and self.dx is not None

    @property
    def executed(self) -> list[Executed]:
        """Each item as it ran, in time order."""
        return self.pipeline.executed

    @property
    def stash_bytes(self) -> list[np.ndarray]:
        """The ledger's stash bytes per chip after each time step."""
        return self.pipeline.stash_bytes

    # -- running ----------------------------------------------------------------------------
    def run(self, dout: ShardedArray | Loss | None = None) -> bool:
        """Run items in time order; without ``dout``, stop before the first backward. True if done.

        ``dout`` is the whole batch's ``dOut``, or a loss ``(j, out_j) -> dOut_j`` the last
        stage calls on each microbatch's output.
        """
        if self.done:
            return True
        if callable(dout) and self.loss is None:
            self.loss = dout
            if self.out is not None:  # every microbatch is out already (GPipe): its pieces, as views
                self.outs = dict(enumerate(split(self.out, self._batch_dim(self.out), self.schedule.microbatches)))
                self.out = None
        elif isinstance(dout, ShardedArray) and not self.douts:
            self.douts = split(dout, self._batch_dim(dout), self.schedule.microbatches, label="dOut")
        return self.pipeline.run(self)

    # -- the stage program --------------------------------------------------------------------
    def ready(self) -> bool:
        return bool(self.douts) or self.loss is not None

    def forward_in(self, stage: int, j: int) -> ShardedArray:
        return place(self.microbatches[j], label="In", **{self.pipe: stage})

    def forward_layer(self, layer: int, j: int, x: ShardedArray) -> tuple[ShardedArray, Values]:
        a, saved = self.block_forward(self.ctx, x, self._weights(layer))
        for v in saved.values():
            v.as_category(STASH)
        return a, saved

    def forward_out(self, j: int, x: ShardedArray) -> None:
        self.outs[j] = x
        self.finished += 1
        if self.finished == self.schedule.microbatches and self.loss is None:  # the last one is out
            self.out = concat([self.outs.pop(i) for i in range(len(self.outs))], 0, label="Out")

    def backward_in(self, stage: int, j: int) -> tuple[ShardedArray, Values]:
        if self.loss is None:
            return place(self.douts[j], label="dOut", **{self.pipe: stage}), {}
        with phase("loss"):
            return self.loss(j, self.outs.pop(j)), {}

    def backward_layer(self, layer: int, j: int, saved: Values, g: ShardedArray) -> tuple[ShardedArray, Values]:
        return self.block_backward(self.ctx, saved, g, self._weights(layer))  # type: ignore[no-any-return]

    def weights(self, layer: int, j: int, pending: Values) -> Values:
        return pending  # a scheme's block backward makes its weights' gradients in B (no split schedule runs here)

    def accumulate(self, layer: int, grads: Values) -> None:
        for name, dw in grads.items():  # summed over the microbatches
            key = (layer, name)
            # the sum replaces the running total (which dies first), as an in-place += would;
            # a partial sum over the data axis is a working value until its AllReduce
            total = dw if key not in self.acc else add(self.acc.pop(key), dw, label=dw.label)
            self.acc[key] = total if total.is_partial else total.as_category("grads")

    def backward_out(self, j: int, g: ShardedArray) -> None:
        self.dxs[j] = g

    def message(self, kind: str, j: int) -> str:
        return f"Act{j}" if kind == "F" else f"Grad{j}"

    def _weights(self, layer: int) -> dict[str, ShardedArray]:
        """Model layer ``layer`` (layer ``i`` of virtual stage ``k``): views of ``W[L_Z, ...]``, held by its stage."""
        k, i = divmod(layer, self.per_stage)
        chunk, stage = divmod(k, self.schedule.stages)
        out = {}
        for name, w in self.params.items():
            if self.chunked:
                w = take(w, 0, chunk)
            out[name] = take(w, 0, stage * self.per_stage + i)
        return out

    def finish(self) -> None:
        m = self.schedule.microbatches
        self.dx = concat([self.dxs.pop(j) for j in range(m)], 0, label="dIn")
        p, v = self.schedule.stages, self.schedule.chunks
        for name, w in self.params.items():
            label = "d" + (w.label or name)
            dim = w.layout.dims[1 if self.chunked else 0]  # L_Z
            per_chunk = []
            for c in range(v):
                layers = [self._reduced(c * p * self.per_stage + layer, name) for layer in range(p * self.per_stage)]
                per_chunk.append(stack(layers, dim.name, dim.axes, label=label, move=True))  # [L_Z, ...]
            grads = stack(per_chunk, w.layout.dims[0].name, label=label, move=True) if self.chunked else per_chunk.pop()
            self.grads[name] = grads.as_category("grads")

    def _reduced(self, layer: int, name: str) -> ShardedArray:
        """Model layer ``layer``'s gradient, AllReduced over the data axis if partial there."""
        g = self.acc.pop((layer, name))
        if self.data is not None and self.data in g.layout.partial:
            g = all_reduce(g, self.data)  # data parallelism: once, after the flush
        return g.as_category("grads")

    # -- measurements -------------------------------------------------------------------------
    def measured_bubble(self) -> float:
        """Bubble over ideal time from the items as they ran, each taking its FLOPs as time."""
        return self.pipeline.measured_bubble()
