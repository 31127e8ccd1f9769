"""Why a search has no plan, and the nearest request that has one.

Three things leave a request without a plan, and each answer names the nearest request that
does have one, found by the search's own rules rather than a second copy of them:

- the **batch**: its sequences divide over none of the data-parallel degrees the other
  degrees leave (:func:`nearest_batches` asks :func:`~.space.candidates` itself for the
  largest batch below and the smallest above that its divisibility rules accept);
- the **mesh**: the chips do not form whole nodes, a pod's torus, or a multiple of the fixed
  degrees, or no degrees the constraints allow multiply to them (:func:`nearest_chips`
  walks the chip counts either side with the search's own test);
- **memory**: every plan is out of memory (the search runs again at larger chip counts,
  reusing its traced layer programs, until one fits).

>>> nearest_chips(lambda n: n % 8 == 0, 12, step=1)
(8, 16)
>>> tokens_text(3 * 2**20), tokens_text(4096 * 3), tokens_text(100)
("'3M'", "'12K'", '100')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from ..cost.units import MAX_TOKENS
from ..mesh import MAX_CHIPS
from ..models import TransformerConfig
from .space import Candidate, Constraints, candidates

#: Chip counts tried on each side of a request's before a search says none is near.
TRIES = 512


def tokens_text(n: int) -> str:
    """A token count as ``batch_tokens`` reads it: ``'3M'`` where a binary suffix is exact.

    >>> tokens_text(2**21), tokens_text(96)
    ("'2M'", '96')
    """
    for suffix, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n % scale == 0:
            return f"'{n // scale}{suffix}'"
    return str(n)


def nearest_batches(
    model: TransformerConfig, *, chips: int, batch_tokens: int, seq: int, domain: int, constraints: Constraints
) -> tuple[int | None, int | None, list[int]]:
    """The largest batch (in sequences) below the request's and the smallest above it that the
    space holds a plan for, or None; and the data-parallel degrees (ranks of data x expert) the
    other degrees leave. The space itself picks each degree's batch: a ``batch_range`` below
    or above the request makes :func:`~.space.batch_sizes` take its multiple nearest the
    request, so a batch is found exactly as a search would take it.

    >>> from shardsim.models import get
    >>> nearest_batches(get("llama-tiny"), chips=8, batch_tokens=6 * 16, seq=16, domain=8,
    ...                 constraints=Constraints.of(allow=("dp", "tp"), tp=2))
    (4, 8, [4])
    """
    lo, hi = constraints.batch_range or (batch_tokens, batch_tokens)

    def found(rng: tuple[int, int]) -> list[Candidate]:
        if rng[1] < rng[0] or rng[1] < seq:
            return []
        within = dataclasses.replace(constraints, batch_range=rng)
        return list(
            candidates(model, chips=chips, batch_tokens=batch_tokens, seq=seq, domain=domain, constraints=within)
        )

    below, above = found((seq, lo - 1)), found((hi + 1, MAX_TOKENS))
    ranks = sorted({c.plan.dp * c.plan.ep for c in below + above})
    return (max((c.batch for c in below), default=None), min((c.batch for c in above), default=None), ranks)


def nearest_chips(
    works: Callable[[int], bool], chips: int, *, step: int, tries: int = TRIES
) -> tuple[int | None, int | None]:
    """The nearest chip counts below and above ``chips``, multiples of ``step`` within ``tries``
    steps, for which ``works`` (the search's own test) holds; None where none does.

    >>> nearest_chips(lambda n: n % 24 == 0, 16, step=8), nearest_chips(lambda n: False, 16, step=8)
    ((None, 24), (None, None))
    """
    down = (n for n in range(chips - chips % step, 0, -step) if n < chips)
    up = range((chips // step + 1) * step, min(MAX_CHIPS, chips + tries * step) + 1, step)
    return _first(works, down, tries), _first(works, up, tries)


def _first(works: Callable[[int], bool], counts: Iterable[int], tries: int) -> int | None:
    for i, n in enumerate(counts):
        if i >= tries:
            return None
        if works(n):
            return n
    return None


def either(counts: tuple[int | None, int | None], unit: str = "chips") -> str:
    """``'8 or 16 chips'``, ``'16 chips'``, or ``''`` when neither was found.

    >>> either((8, 16)), either((None, 1024), "sequences"), either((None, None))
    ('8 or 16 chips', '1,024 sequences', '')
    """
    found = [f"{n:,}" for n in counts if n is not None]
    return f"{' or '.join(found)} {unit}" if found else ""


__all__ = ["TRIES", "either", "nearest_batches", "nearest_chips", "tokens_text"]
