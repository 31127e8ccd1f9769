"""A launch: the plan a framework's configuration runs, with the batch it runs it on."""

from __future__ import annotations

from dataclasses import dataclass

from ..plans import Plan


@dataclass(frozen=True)
class Launch:
    """A plan with the batch it runs: ``micro_batch`` sequences per microbatch per data rank,
    ``global_batch`` sequences a step, of ``seq`` tokens.

    >>> Launch(Plan(dp=4, microbatches=2), micro_batch=1, global_batch=8, seq=4096).batch_tokens
    32768
    """

    plan: Plan
    micro_batch: int
    global_batch: int
    seq: int

    @property
    def batch_tokens(self) -> int:
        """Tokens a step: the global batch of sequences times their length."""
        return self.global_batch * self.seq


__all__ = ["Launch"]
