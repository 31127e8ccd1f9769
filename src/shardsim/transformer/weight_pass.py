"""The backward pass split in two, as zero-bubble pipelines run it (Qi et al. 2024, §2).

``B`` is the gradient of a layer's input, which the previous layer (and stage) waits for;
``W`` is its weights' gradients, ``X^T dY`` for every matmul, which nothing downstream
needs before the optimizer step. A backward function hands each weight-gradient product to
:class:`WeightGrads`: without a split it runs there and then (the backward as it always
ran, in the same order); with one it is kept as work, with the values it reads (the
matmul's input and its output's gradient), until :meth:`WeightGrads.run` does it in the
``weight`` phase. What the work holds is what ``W`` keeps alive after ``B``: the ledger
counts it where the stash was.

The token sums (biases, norm gains) and the embedding's scatter stay in ``B``: they read only
the gradient ``B`` has just made and cost no matmul. So do a mixture of experts' expert
weights, whose gradients its All-to-All backward makes on the way.

>>> import numpy as np, shardsim
>>> from shardsim.tracing import trace
>>> x = shardsim.shard(np.ones((4, 2)), shardsim.Mesh(X=1), "[T, D]")
>>> g = WeightGrads(split=True)
>>> g.later(lambda: {"w": (x.T @ x).named("dW")})
>>> with trace() as t:
...     done = g.run()
>>> sorted(done), [e.phase for e in t.events]
(['w'], ['weight'])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..array import ShardedArray
from ..tracing import phase

Work = Callable[[], Mapping[str, ShardedArray]]


class WeightGrads(dict[str, ShardedArray]):
    """A backward pass's weight gradients by key, and (``split``) the work that makes the rest later."""

    def __init__(self, split: bool) -> None:
        super().__init__()
        self.split = split
        self.work: list[Work] = []

    def later(self, work: Work) -> None:
        """Make the gradients of ``work`` now, or keep it for :meth:`run` when the backward is split."""
        if self.split:
            self.work.append(work)
        else:
            self.update(work())

    def absorb(self, other: WeightGrads) -> WeightGrads:
        """Take ``other``'s gradients and work as well (a block's two halves, one layer's)."""
        self.update(other)
        self.work += other.work
        other.work = []
        return self

    def run(self) -> dict[str, ShardedArray]:
        """The W pass: every kept piece of work, in the order ``B`` kept it; then every gradient."""
        with phase("weight"):
            while self.work:  # popped, so each piece's operands are let go as soon as it has run
                self.update(self.work.pop(0)())
        return dict(self)


__all__ = ["WeightGrads", "Work"]
