"""The training step an estimate's memory is measured over, in words, checked before any tracing.

>>> memory_source("adam", None, "bfloat16")  # doctest: +ELLIPSIS
'one training step, adam (...)'
"""

from __future__ import annotations

from ..dtypes import resolve_dtype
from ..errors import ArgumentTypeError


def memory_source(optimizer: str, precision: object, dtype: str) -> str:
    """The training step the memory is measured over, in words; an unknown optimizer or
    precision fails here, before any tracing, with the training package's own error.

    >>> memory_source("sgd", "fp32", "float32")
    'one training step, sgd (compute float32, reduce float32)'
    """
    from ..training import optim
    from ..training.precision import Precision

    if not isinstance(optimizer, str):
        raise ArgumentTypeError(f"optimizer={optimizer!r:.60}: name one, e.g. optimizer='adam'")
    if precision is not None and not isinstance(precision, (str, Precision)):
        raise ArgumentTypeError(f"precision={precision!r:.60}: name one, e.g. precision='bf16', or pass a Precision")
    optim.get(optimizer)
    policy = Precision.of(precision if precision is not None else resolve_dtype(dtype).name)
    return f"one training step, {optimizer} ({policy})"


__all__ = ["memory_source"]
