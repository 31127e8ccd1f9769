"""How an estimate writes its figures: seconds as milliseconds, bytes as GB, four significant digits.

>>> ms(0.0123456), gb(80e9)
('12.35', '80')
"""

from __future__ import annotations


def ms(seconds: float) -> str:
    """Seconds as milliseconds, four significant digits.

    >>> ms(1.5)
    '1500'
    """
    return f"{seconds * 1e3:.4g}"


def gb(n: float) -> str:
    """Bytes as GB, four significant digits.

    >>> gb(90.912e9)
    '90.91'
    """
    return f"{n / 1e9:.4g}"


__all__ = ["gb", "ms"]
