"""Each weight's gradient reduced over the data (and context) axes as soon as it is complete.

The transformer's step hands every layer's weight gradients to :class:`Gradients` as the
backward pass makes them; a pipeline's stages accumulate them over microbatches and reduce
once after the flush.
"""

from __future__ import annotations

from ..array import ShardedArray
from ..collectives import all_reduce, reduce_scatter
from ..tracing import layer
from .local import rows
from .step import Step


class Gradients:
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
                # the running sum is the same unreduced buffer as its addends, not an activation
                # a microbatch keeps for its backward: it lives until the flush's reduction
                total = self.pending[key] + g if key in self.pending else g
                self.pending[key] = total.as_category("temporaries")
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
