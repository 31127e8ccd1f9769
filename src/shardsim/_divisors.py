"""The divisors of a whole number, found in O(sqrt n) steps.

Hints ("choose dp among ..."), the planner's degrees and microbatch counts, and the critical
batch's mesh splits all list divisors of user-sized numbers (a batch of 2**40 tokens, a
``d_model`` near its limit), so none may walk every integer up to ``n``.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1024)
def _all(n: int) -> tuple[int, ...]:
    small, large = [], []
    d = 1
    while d * d <= n:  # pairs (d, n // d)
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return (*small, *reversed(large))


def divisors(n: int, *, at_most: int | None = None) -> list[int]:
    """The divisors of ``n`` ascending (the first ``at_most`` of them).

    >>> divisors(12), divisors(1048573), divisors(720, at_most=4), len(divisors(2**36))
    ([1, 2, 3, 4, 6, 12], [1, 1048573], [1, 2, 3, 4], 37)
    """
    found = _all(n)
    return list(found if at_most is None else found[:at_most])
