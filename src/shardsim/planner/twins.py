"""Plans whose programs come out the same: one row for them, the simplest.

Some settings change nothing under the others: selective recomputation recomputes the
attention scores (Korthikanti et al. 2022), which FlashAttention never holds, so under
``attention=flash`` a plan with ``recompute=selective`` runs the program of the same plan
with ``recompute=none``, to the byte and the microsecond. The traced figures say so without a
rule of our own: two plans of the same degrees, microbatch and batch whose step time and
memory per category are equal are *twins*, and the table keeps the one with the fewest
settings away from their defaults (``recompute=none`` over ``selective``).

>>> from shardsim.models import get
>>> from shardsim.plans import Plan
>>> from .evaluate import evaluate
>>> from shardsim.cost.layer_program import LayerCache
>>> from .space import Candidate
>>> cache = LayerCache(get("llama-tiny"), "h100", seq=16)
>>> plain, sel = (Plan(tp=2, attention="flash", recompute=r) for r in ("none", "selective"))
>>> rows = [evaluate(cache, Candidate(p, micro=4, batch=4)) for p in (sel, plain)]
>>> figures(rows[0]) == figures(rows[1]), twin_key(rows[0]) == twin_key(rows[1])
(True, True)
>>> kept, dropped = simplest_of_twins(rows)
>>> [str(e.plan) for e in kept], [(str(e.plan), str(t.plan)) for e, t in dropped]
(['tp=2'], [('tp=2,recompute=selective', 'tp=2')])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence

from ..plans import Plan
from .evaluate import PlanEstimate

_DEFAULTS = Plan()


def figures(e: PlanEstimate) -> tuple[Hashable, ...]:
    """What a reader of the table sees of a plan's program: its step time (to nine digits,
    past any rounding of the same sums in another order) and its bytes per category."""
    return (f"{e.step_s:.9g}", e.tokens, tuple(sorted(e.memory.items())))


def twin_key(e: PlanEstimate) -> tuple[Hashable, ...]:
    """Plans with equal keys are twins: the same degrees, microbatch and batch, the same figures."""
    p, c = e.plan, e.candidate
    return (p.dp, p.tp, p.pp, p.cp, p.ep, c.micro, c.batch, *figures(e))


def settings(plan: Plan) -> int:
    """How many of ``plan``'s fields are away from their defaults (the plan's complexity).

    >>> settings(Plan(tp=2)), settings(Plan(tp=2, recompute="selective"))
    (1, 2)
    """
    return sum(getattr(plan, f.name) != getattr(_DEFAULTS, f.name) for f in dataclasses.fields(Plan))


def simplest_of_twins(
    rows: Sequence[PlanEstimate],
) -> tuple[list[PlanEstimate], list[tuple[PlanEstimate, PlanEstimate]]]:
    """``rows`` (in their order) less every plan with a simpler twin; and the dropped ones,
    each beside the twin kept for it."""
    simplest: dict[tuple[Hashable, ...], PlanEstimate] = {}
    for e in rows:
        k = twin_key(e)
        if k not in simplest or (settings(e.plan), str(e.plan)) < (settings(simplest[k].plan), str(simplest[k].plan)):
            simplest[k] = e
    kept = [e for e in rows if simplest[twin_key(e)] is e]
    dropped = [(e, simplest[twin_key(e)]) for e in rows if simplest[twin_key(e)] is not e]
    return kept, dropped


__all__ = ["figures", "settings", "simplest_of_twins", "twin_key"]
