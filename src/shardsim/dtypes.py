"""Dtypes by name, with bfloat16 from ``ml_dtypes`` (imported only when asked for).

>>> from shardsim.dtypes import resolve_dtype
>>> resolve_dtype("float32").itemsize
4
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import DtypeError

FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")

# A training precision by name: (compute dtype, master dtype or None for none). Here, below
# plans and training both, so a plan checks its precision's name without loading the trainer.
PRECISION_DTYPES: dict[str, tuple[str, str | None]] = {
    "fp32": ("float32", None),
    "float32": ("float32", None),
    "fp64": ("float64", None),
    "float64": ("float64", None),
    "bf16": ("bfloat16", "float32"),
    "bfloat16": ("bfloat16", "float32"),
    "mixed": ("bfloat16", "float32"),
    "fp16": ("float16", "float32"),
    "float16": ("float16", "float32"),
}


def resolve_dtype(dtype: Any) -> np.dtype:
    """A NumPy dtype from a name (``"bfloat16"`` comes from ml_dtypes) or a dtype."""
    if isinstance(dtype, str) and dtype in ("bfloat16", "bf16"):
        return _resolve(dtype)  # imports ml_dtypes, each time: a missing package is reported
    try:  # every op of a shape-only step asks again: answers are remembered
        key = (type(dtype), dtype)
        known = _resolved.get(key)
    except TypeError:  # unhashable: resolved (or refused) below, each time
        return _resolve(dtype)
    if known is None:
        known = _resolved[key] = _resolve(dtype)
    return known


_resolved: dict[tuple[type, Any], np.dtype] = {}


def _resolve(dtype: Any) -> np.dtype:
    if isinstance(dtype, str) and dtype in ("bfloat16", "bf16"):
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - depends on the environment
            raise DtypeError(
                "bfloat16 needs the package ml_dtypes, a dependency of shardsim: pip install ml_dtypes"
            ) from None
        return np.dtype(ml_dtypes.bfloat16)
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError) as e:  # "nonsense", "{'a': 1}", "," (a field list)
        raise DtypeError(f"unknown dtype {dtype!r}; use one of {list(FLOAT_NAMES)}") from e
    if dt.kind not in "biufc" and dt.name != "bfloat16":
        raise DtypeError(f"dtype {dt} is not numeric; use one of {list(FLOAT_NAMES)} or an integer or bool dtype")
    return dt


def eps(dtype: Any) -> float:
    """Machine epsilon of a float dtype (bfloat16 included)."""
    dt = resolve_dtype(dtype)
    if dt.name == "bfloat16":
        return 2.0**-7
    return float(np.finfo(dt).eps)


def tolerance(dtype: Any, contraction: int, ulps: float = 8.0) -> float:
    """Relative tolerance for a sum of ``contraction`` products: a few ulps times sqrt(length).

    >>> round(tolerance("float64", 100) / tolerance("float64", 1), 6)
    10.0
    """
    return ulps * eps(dtype) * max(1.0, float(contraction)) ** 0.5
