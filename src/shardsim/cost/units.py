"""Token counts as people write them (``16M`` = 16 x 2**20), read once for the library and the command line.

:func:`token_count` is the command line's argparse type (``--batch-tokens 16M``);
:func:`tokens_argument` reads the same text, or a whole number, for a Python argument
(``batch_tokens="16M"``), refusing anything else with the argument's name. Both hold a count
to 1 .. :data:`MAX_TOKENS`.

>>> token_count("16M"), tokens_argument("4K", "batch_tokens"), tokens_argument(4096, "batch_tokens")
(16777216, 4096, 4096)
"""

from __future__ import annotations

import argparse
import numbers

from ..errors import ArgumentTypeError, CostModelError, ShardsimError

SUFFIX = {"K": 2**10, "M": 2**20, "G": 2**30}
#: The most tokens a batch may hold: 65,536 times Llama 3's 16M-token batch.
MAX_TOKENS = 2**40


def token_count(text: str) -> int:
    """An argparse type: tokens, a whole number or one with a binary suffix (``16M`` = 16 x 2**20).

    >>> token_count("16M"), token_count("4096")
    (16777216, 4096)
    """
    t = text.strip().upper()
    scale = SUFFIX.get(t[-1:], 1)
    digits = t[:-1] if scale > 1 else t
    try:
        n = int(digits) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected tokens such as 4096 or 16M, got {text!r}") from None
    if not 1 <= n <= MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"expected tokens from 1 to 2**40, got {n}")
    return n


def tokens_argument(value: object, name: str, error: type[ShardsimError] = CostModelError) -> int:
    """``value`` as a token count: a whole number or a string :func:`token_count` reads, from 1 to
    :data:`MAX_TOKENS`; otherwise ``error`` (a wrong kind: :class:`~shardsim.errors.ArgumentTypeError`)
    naming ``name``.

    >>> tokens_argument("16m", "batch_tokens")
    16777216
    >>> tokens_argument(0, "batch_tokens")
    Traceback (most recent call last):
    ...
    shardsim.errors.CostModelError: batch_tokens=0: a token count is from 1 to 2**40 (1,099,511,627,776); ...
    """
    if isinstance(value, str):
        try:
            return token_count(value)
        except argparse.ArgumentTypeError as err:
            raise error(f"{name}={value!r}: {err}") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(
            f"{name}={value!r} ({type(value).__name__}): a token count is a whole number or a string such as "
            f"'16M' (16 x 2**20); pass e.g. {name}=4096"
        )
    n = int(value)
    if not 1 <= n <= MAX_TOKENS:
        raise error(
            f"{name}={n}: a token count is from 1 to 2**40 ({MAX_TOKENS:,}); "
            f"use a positive number of tokens, at most {MAX_TOKENS:,}"
        )
    return n


__all__ = ["MAX_TOKENS", "SUFFIX", "token_count", "tokens_argument"]
