"""Central differences: the check every hand-written backward pass is held to."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def numeric_grad(f: Callable[[], float], value: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar ``f()`` with respect to every entry of ``value`` (float64).

    ``value`` is changed in place entry by entry and put back, so ``f`` reads it as it stands.
    """
    g = np.zeros_like(value)
    for i in np.ndindex(value.shape):
        old = value[i]
        value[i] = old + eps
        up = f()
        value[i] = old - eps
        down = f()
        value[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


def root(f: Callable[[float], float], lo: float, hi: float) -> float:
    """Where a decreasing ``f`` crosses zero in [lo, hi], by bisection (the first x with f(x) <= 0)."""
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    return hi
