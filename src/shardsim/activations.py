"""Activation functions and their derivatives, written once against the array API standard.

The same functions serve the single-device reference and every chip of a sharded run, so a
scheme and its oracle can differ only by how the sums are split, never by the maths. They
take the array's own namespace (``x.__array_namespace__()``: NumPy for the stacked engine,
``jax.numpy`` inside ``shard_map``), so every engine runs the same code.

>>> import numpy as np
>>> from shardsim.activations import get
>>> act = get("relu")
>>> act.fn(np.array([-1.0, 2.0])), act.grad(np.array([-1.0, 2.0]))
(array([0., 2.]), array([0., 1.]))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .errors import ShardingError
from .xp import namespace

Fn = Callable[[np.ndarray], np.ndarray]

_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))
_GELU_C = 0.044715


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _ones(x: np.ndarray) -> np.ndarray:
    return namespace(x).ones_like(x)


def _relu(x: np.ndarray) -> np.ndarray:
    return namespace(x).maximum(x, 0).astype(x.dtype, copy=False)


def _relu_grad(x: np.ndarray) -> np.ndarray:
    return (x > 0).astype(x.dtype)


def _gelu(x: np.ndarray) -> np.ndarray:
    # tanh form (Hendrycks & Gimpel), the one GPT-2 and Megatron use; x * x * x, because NumPy
    # computes x**3 through pow, much slower than two multiplications
    inner = _SQRT_2_OVER_PI * (x + _GELU_C * (x * x * x))
    return (0.5 * x * (1.0 + namespace(x).tanh(inner))).astype(x.dtype, copy=False)


def _gelu_grad(x: np.ndarray) -> np.ndarray:
    inner = _SQRT_2_OVER_PI * (x + _GELU_C * (x * x * x))
    t = namespace(x).tanh(inner)
    d_inner = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * (x * x))
    return (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner).astype(x.dtype, copy=False)


@dataclass(frozen=True)
class Activation:
    """An activation: ``fn`` and its elementwise derivative ``grad`` (both of the pre-activation)."""

    name: str
    fn: Fn
    grad: Fn


ACTIVATIONS: dict[str, Activation] = {
    "identity": Activation("identity", _identity, _ones),
    "relu": Activation("relu", _relu, _relu_grad),
    "gelu": Activation("gelu", _gelu, _gelu_grad),
}


def get(name: str) -> Activation:
    """The activation called ``name`` (``identity``, ``relu`` or ``gelu``)."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ShardingError(f"unknown activation {name!r}; choose one of {list(ACTIVATIONS)}") from None
