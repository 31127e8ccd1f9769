"""Run a pipeline schedule on the mesh: stages exchange activations and gradients by ``ppermute``.

Each pipeline stage is the set of chips at one coordinate of the pipe axis ``Z``; its values
live only there (``holders``), so the ledger shows each stage's own memory. The schedule's
items run in time order, each on its stage (Narayanan et al. 2021, §2.2):

    F(stage s, microbatch j):
        1. a = the microbatch (first stage) or the activation stage s-1 sent
        2. for each of the stage's layers: a, saved = block forward(a, W_in[l], W_out[l]);
           keep saved in the stash (ledger category ``stash``)
        3. ppermute Z +1 (a) to stage s+1, or keep it as the output (last stage)
    B(stage s, microbatch j):
        1. g = dOut of the microbatch (last stage) or the gradient stage s+1 sent
        2. for each layer, last first: g, dW = block backward(stash, g); add dW to the
           stage's gradients; free the stash
        3. ppermute Z -1 (g) to stage s-1, or keep it as dIn (first stage)

After the last item, gradients that are partial sums over the data axis are AllReduced
(once per step, as data parallelism does after the pipeline flush) and the stages'
per-layer gradients are stacked back into ``W[L_Z, ...]``. With ``v`` chunks per stage
(interleaved), virtual stage ``k`` is chunk ``k // p`` of stage ``k % p`` and sends wrap
around the ring from the last stage to the first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..array import ShardedArray
from ..collectives import all_reduce, ppermute
from ..errors import ShardingError
from ..ops import add
from ..pieces import concat, place, split, stack, take
from ..tracing import phase, trace
from .schedule import Item, Schedule

Block = Callable[..., Any]
Loss = Callable[[int, ShardedArray], ShardedArray]  # (microbatch j, its output) → its dOut, on the last stage
STASH = "stash"  # ledger category of what a stage keeps for its backward pass


@dataclass(frozen=True)
class Executed:
    """One item as it ran: its FLOPs and bytes sent per chip of its stage."""

    item: Item
    flops: int
    sent_bytes: int


class PipelineStep:
    """One forward+backward step of a pipeline, run item by item from its schedule.

    ``params`` are ``{"w_in": W[L_Z, D, F], "w_out": W[L_Z, F, D]}`` (``[C, L_Z, ...]`` with
    ``v = C`` chunks per stage); ``block_forward(ctx, a, w)`` and
    ``block_backward(ctx, saved, g, w)`` are one layer's steps (a scheme's forward and backward,
    whose weight gradients may be partial over the data axis). :meth:`run` executes items until
    the step needs ``dout`` (the first backward) or ends; ``out``, ``dx`` and ``grads`` are ready
    once :attr:`done`. Given a loss instead of ``dout`` (a training step), the last stage turns
    each microbatch's output into its ``dOut`` as soon as it is out, as Megatron's last stage
    does; the outputs are then consumed one by one and ``out`` stays None.
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
        if x.mesh.axis_size(self.pipe) != p:
            raise ShardingError(
                f"the schedule has {p} stages but the pipe axis {self.pipe!r} has {x.mesh.axis_size(self.pipe)}"
            )
        w = self.params["w_in"]
        self.chunked = w.ndim == 4  # [C, L_Z, D, F]: v chunks of layers per stage
        layers = w.global_shape[1] if self.chunked else w.global_shape[0]
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
        self.todo = sorted(schedule.items)
        self.sent: dict[tuple[str, int, int], ShardedArray] = {}  # (kind, virtual stage, mb) → message
        self.stash: dict[tuple[int, int], list[dict[str, ShardedArray]]] = {}
        self.acc: dict[tuple[int, int, str], ShardedArray] = {}  # (virtual stage, layer, weight) → gradient
        self.outs: dict[int, ShardedArray] = {}
        self.dxs: dict[int, ShardedArray] = {}
        self.executed: list[Executed] = []
        self.stash_bytes: list[np.ndarray] = []  # ledger's stash bytes per chip after each time step
        self.out: ShardedArray | None = None
        self.dx: ShardedArray | None = None
        self.grads: dict[str, ShardedArray] = {}

    @staticmethod
    def _batch_dim(x: ShardedArray) -> str:
        """The batch dimension: the first of ``In[B, D]`` (``[B_X, D_Y]`` with data and tensor axes)."""
        return x.layout.dims[0].name

    @property
    def done(self) -> bool:
        return not self.todo and (self.out is not None or self.loss is not None) and self.dx is not None

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
        while self.todo:
            it = self.todo[0]
            if it.kind == "B" and not self.douts and self.loss is None:
                return False
            self.todo.pop(0)
            with trace() as t:
                (self._forward if it.kind == "F" else self._backward)(it)
            self.executed.append(Executed(it, t.total("flops"), t.total("sent_bytes")))
            if not self.todo or self.todo[0].time != it.time:
                self.stash_bytes.append(self.mesh.memory.live(STASH))
        self._finish()
        return True

    def _forward(self, it: Item) -> None:
        k, j = self.schedule.virtual_stage(it), it.microbatch
        with phase("forward"):
            # 1. the first stage loads the microbatch, the others take what the previous one sent
            a = (
                place(self.microbatches[j], label="In", **{self.pipe: it.stage})
                if k == 0
                else self.sent.pop(("F", k, j))
            )
            kept = []
            for i in range(self.per_stage):  # 2. the stage's layers
                a, saved = self.block_forward(self.ctx, a, self._weights(k, i))
                for v in saved.values():
                    v.as_category(STASH)
                kept.append(saved)
            self.stash[(k, j)] = kept
            if k + 1 < self.schedule.stages * self.schedule.chunks:  # 3. send to the next stage
                self.sent[("F", k + 1, j)] = ppermute(a.named(f"Act{j}"), self.pipe, 1)
            else:
                self.outs[j] = a
                self.finished += 1
                if self.finished == self.schedule.microbatches and self.loss is None:  # the last one is out
                    self.out = concat([self.outs.pop(i) for i in range(len(self.outs))], 0, label="Out")

    def _backward(self, it: Item) -> None:
        k, j = self.schedule.virtual_stage(it), it.microbatch
        last = self.schedule.stages * self.schedule.chunks - 1
        with phase("backward"):
            # 1. the last stage gets dOut of the microbatch, the others what the next stage sent
            if k < last:
                g = self.sent.pop(("B", k, j))
            elif self.loss is not None:
                with phase("loss"):
                    g = self.loss(j, self.outs.pop(j))
            else:
                g = place(self.douts[j], label="dOut", **{self.pipe: it.stage})
            kept = self.stash.pop((k, j))
            for i in reversed(range(self.per_stage)):  # 2. the layers, last first
                g, grads = self.block_backward(self.ctx, kept.pop(), g, self._weights(k, i))
                for name, dw in grads.items():  # summed over the microbatches
                    key = (k, i, name)
                    # the sum replaces the running total (which dies first), as an in-place += would;
                    # a partial sum over the data axis is a working value until its AllReduce
                    total = dw if key not in self.acc else add(self.acc.pop(key), dw, label=dw.label)
                    self.acc[key] = total if total.is_partial else total.as_category("grads")
            if k > 0:  # 3. send back to the previous stage
                self.sent[("B", k - 1, j)] = ppermute(g.named(f"Grad{j}"), self.pipe, -1)
            else:
                self.dxs[j] = g

    def _weights(self, k: int, i: int) -> dict[str, ShardedArray]:
        """Layer ``i`` of virtual stage ``k``: views of ``W[L_Z, ...]``, held by its stage."""
        p = self.schedule.stages
        chunk, stage = divmod(k, p)
        out = {}
        for name, w in self.params.items():
            if self.chunked:
                w = take(w, 0, chunk)
            out[name] = take(w, 0, stage * self.per_stage + i)
        return out

    def _finish(self) -> None:
        with phase("backward"):
            m = self.schedule.microbatches
            self.dx = concat([self.dxs.pop(j) for j in range(m)], 0, label="dIn")
            p, v = self.schedule.stages, self.schedule.chunks
            for name, w in self.params.items():
                label = "d" + (w.label or name)
                dim = w.layout.dims[1 if self.chunked else 0]  # L_Z
                per_chunk = []
                for c in range(v):
                    layers = [
                        self._reduced(c * p + layer // self.per_stage, layer % self.per_stage, name)
                        for layer in range(p * self.per_stage)
                    ]
                    per_chunk.append(stack(layers, dim.name, dim.axes, label=label, move=True))  # [L_Z, ...]
                grads = (
                    stack(per_chunk, w.layout.dims[0].name, label=label, move=True) if self.chunked else per_chunk.pop()
                )
                self.grads[name] = grads.as_category("grads")

    def _reduced(self, k: int, i: int, name: str) -> ShardedArray:
        """Layer ``i`` of virtual stage ``k``'s gradient, AllReduced over the data axis if partial there."""
        g = self.acc.pop((k, i, name))
        if self.data is not None and self.data in g.layout.partial:
            g = all_reduce(g, self.data)  # data parallelism: once, after the flush
        return g.as_category("grads")

    # -- measurements -------------------------------------------------------------------------
    def measured_bubble(self) -> float:
        """Bubble over ideal time from the items as they ran, each taking its FLOPs as time."""
        flops = {e.item.key: float(e.flops) for e in self.executed}
        return self.schedule.bubble(lambda it: flops[it.key])
