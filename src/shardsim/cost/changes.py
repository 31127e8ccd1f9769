"""The single changes to a transformer's plan a practitioner tries first when its step does not
fit the chip, each at the same chip count, and one that fits (:class:`Fix`); which of them fit
is :mod:`~shardsim.cost.fixes`' to find.

>>> [text for text, _ in changes(Plan(dp=2, attention="standard", recompute="selective"), 2)]
['attention=flash', 'recompute=full', 'zero=1', 'zero=2', 'zero=3']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..plans import RECOMPUTE, Plan
from ..transformer.roles import Roles
from .numbers import gb


@dataclass(frozen=True)
class Fix:
    """One change that fits: ``change`` as plan text (``"recompute=selective"``), the ``plan``
    it makes, its per-chip ``memory`` bytes, its ``step_s`` and the unchanged plan's ``base_step_s``.

    >>> str(Fix("zero=3", Plan(dp=8, zero=3), 61_200_000_000, 1.03, 1.0))
    'zero=3 (61.2 GB, +3% step)'
    """

    change: str
    plan: Plan
    memory: int
    step_s: float
    base_step_s: float

    @property
    def slowdown(self) -> float:
        """The step's change against the plan's own (0.03: 3% slower)."""
        return self.step_s / self.base_step_s - 1 if self.base_step_s > 0 else 0.0

    def __str__(self) -> str:
        return f"{self.change} ({gb(self.memory)} GB, {round(100 * self.slowdown):+d}% step)"


def changes(plan: Plan, sequences: int) -> list[tuple[str, Plan]]:
    """The single changes tried on ``plan`` with a global batch of ``sequences``, as (text, plan):
    FlashAttention; recomputation, selective (unless FlashAttention leaves it nothing to drop)
    then full; each higher ZeRO stage (with data
    parallelism); more microbatches of the same batch, the next count and the most (one
    sequence each); sequence parallelism when ``tp > 1``.

    >>> [c for c, _ in changes(Plan(dp=2, tp=2, attention="standard"), 8)]  # doctest: +NORMALIZE_WHITESPACE
    ['attention=flash', 'recompute=selective', 'recompute=full', 'zero=1', 'zero=2', 'zero=3',
     'microbatches=2', 'microbatches=4', 'sp']
    >>> [c for c, _ in changes(Plan(dp=2, tp=2, sp=True), 2)]  # FlashAttention: selective would drop nothing
    ['recompute=full', 'zero=1', 'zero=2', 'zero=3']
    """
    out: list[tuple[str, dict[str, Any]]] = []
    if plan.attention != "flash" and plan.cp == 1:
        out.append(("attention=flash", {"attention": "flash"}))
    for r in RECOMPUTE[RECOMPUTE.index(plan.recompute) + 1 :]:
        # under FlashAttention selective recomputation has nothing to drop: the same program
        if Roles.of(plan.replace(recompute=r)).recompute != Roles.of(plan).recompute:
            out.append((f"recompute={r}", {"recompute": r}))
    if plan.dp > 1:
        out += [(f"zero={z}", {"zero": z}) for z in range(plan.zero + 1, 4)]
    per_replica = sequences // plan.dp
    more = [m for m in range(plan.microbatches + 1, per_replica + 1) if per_replica % m == 0]
    out += [(f"microbatches={m}", {"microbatches": m}) for m in dict.fromkeys(more[:1] + more[-1:])]
    if plan.tp > 1 and not plan.sp:
        out.append(("sp", {"sp": True}))
    return [(text, plan.replace(**change)) for text, change in out]


class Advice:
    """The changes that fit, found when first asked: each is a whole estimate of the changed
    plan, so an estimate read for its time or memory alone never pays for them. Two are equal
    when they find the same changes.

    >>> calls = []
    >>> advice = Advice(lambda: calls.append("found") or [])
    >>> len(calls)
    0
    >>> advice.found(), advice.found(), calls
    ([], [], ['found'])
    """

    def __init__(self, find: Callable[[], list[Fix]]) -> None:
        self._find: Callable[[], list[Fix]] | None = find
        self._found: list[Fix] = []

    def found(self) -> list[Fix]:
        """The changes that fit, fastest first (found once)."""
        if self._find is not None:
            self._found, self._find = self._find(), None
        return self._found

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Advice) and self.found() == other.found()

    __hash__ = None  # type: ignore[assignment]  # mutable until found


def advice_line(fixes: Sequence[Fix], plan: Plan, sequences: int) -> str:
    """The summary's line: the three fastest changes that fit, or that none does and what was tried.

    >>> advice_line([], Plan(tp=8, sp=True, recompute="full"), 1)
    'no single change fits: tried nothing, every lever is pulled; try more chips or a shorter sequence'
    """
    if fixes:
        return "to fit: " + " or ".join(str(f) for f in fixes[:3])
    tried = ", ".join(text for text, _ in changes(plan, sequences)) or "nothing, every lever is pulled"
    return f"no single change fits: tried {tried}; try more chips or a shorter sequence"


__all__ = ["Fix", "advice_line", "changes"]
