"""The transformer's pieces on plain NumPy arrays, each with its hand-derived backward pass.

The single-device reference (:mod:`shardsim.models.reference`) is built from these and from
:mod:`shardsim.models.reference_attention`, and a sharded program can hold each of its own
pieces to them. The norms (``layer_norm``, ``rms_norm`` and their backward passes) are
:mod:`shardsim.models.reference_norm`'s, named here too. Shapes: ``x [B, S, D]``, logits ``[..., V]``.
Cross-entropy runs in float32 (float64 when an input is float64); everything else keeps the
inputs' dtype.

>>> import numpy as np
>>> x = np.random.default_rng(0).standard_normal((2, 3, 8))
>>> y = layer_norm(x, np.ones(8), np.zeros(8))
>>> bool(np.allclose(y.mean(-1), 0)), bool(np.allclose(y.std(-1), 1, atol=1e-4))
(True, True)
"""

from __future__ import annotations

import numpy as np

from ..activations import get as _activation
from ..errors import ConfigError

# The norms live in shardsim.models.reference_norm, the one home of the single-device norms; named here too,
# beside the transformer's other pieces.
from .reference_norm import layer_norm as layer_norm
from .reference_norm import layer_norm_backward as layer_norm_backward
from .reference_norm import rms_norm as rms_norm
from .reference_norm import rms_norm_backward as rms_norm_backward

SITES = ("attn_probs", "attn_out", "mlp_out")
SITE_INDEX = {site: i for i, site in enumerate(SITES)}

_GELU = _activation("gelu")


def compute_dtype(*arrays: np.ndarray) -> np.dtype:
    """float64 if any input is float64, else float32: the dtype of softmax and cross-entropy.

    >>> compute_dtype(np.zeros(2, np.float32)), compute_dtype(np.zeros(2), np.zeros(2, np.float32))
    (dtype('float32'), dtype('float64'))
    """
    return np.dtype(np.float64 if any(a.dtype == np.float64 for a in arrays) else np.float32)


# -- dropout -----------------------------------------------------------------------------------
def dropout_mask(seed: int, layer: int, site: str, shape: tuple[int, ...], p: float) -> np.ndarray:
    """The keep-mask of dropout site ``site`` of block ``layer``: True where the value is kept.

    Drawn on the GLOBAL ``shape`` from ``default_rng([seed, layer, SITE_INDEX[site]])``, so a
    sharded program draws the same mask and takes its blocks. Sites: ``"attn_probs"``
    ``[B, N, S, S]``, ``"attn_out"`` and ``"mlp_out"`` ``[B, S, D]``.

    >>> dropout_mask(0, 1, "mlp_out", (2, 3), 0.5).shape
    (2, 3)
    >>> bool((dropout_mask(0, 1, "mlp_out", (4, 4), 0.5) == dropout_mask(0, 1, "mlp_out", (4, 4), 0.5)).all())
    True
    """
    if site not in SITE_INDEX:
        raise ConfigError(f"unknown dropout site {site!r}; the sites are {list(SITES)}")
    return np.random.default_rng([seed, layer, SITE_INDEX[site]]).random(shape) >= p


def dropout(x: np.ndarray, keep: np.ndarray | None, p: float) -> np.ndarray:
    """``x`` with the dropped entries zeroed and the kept ones scaled by ``1/(1-p)``.

    Linear in ``x``, so the same call is its backward pass. ``keep`` None means no dropout.

    >>> dropout(np.ones(4, np.float32), np.array([True, False, True, True]), 0.5)
    array([2., 0., 2., 2.], dtype=float32)
    """
    if keep is None:
        return x
    return x * keep * (1.0 / (1.0 - p))


# -- MLP nonlinearities ------------------------------------------------------------------------
def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (Hendrycks & Gimpel 2016), as GPT-2/3 and Megatron use it.

    >>> gelu(np.array([0.0, 10.0])).tolist()
    [0.0, 10.0]
    """
    return _GELU.fn(x)


def gelu_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """``dy * gelu'(x)``.

    >>> gelu_backward(np.array([0.0]), np.array([2.0])).tolist()
    [1.0]
    """
    return dy * _GELU.grad(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|, unlike 1 / (1 + exp(-x))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """SwiGLU (Shazeer 2020): ``silu(gate) * up`` with ``silu(g) = g * sigmoid(g)``.

    >>> swiglu(np.array([0.0, 20.0]), np.array([5.0, 2.0])).round(6).tolist()
    [0.0, 40.0]
    """
    return gate * _sigmoid(gate) * up


def swiglu_backward(gate: np.ndarray, up: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(dgate, dup)``: ``silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g)))``.

    >>> dgate, dup = swiglu_backward(np.array([0.0]), np.array([3.0]), np.array([1.0]))
    >>> dgate.tolist(), dup.tolist()
    ([1.5], [0.0])
    """
    sig = _sigmoid(gate)
    return dy * up * (sig * (1.0 + gate * (1.0 - sig))), dy * gate * sig


# -- loss --------------------------------------------------------------------------------------
def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(compute_dtype(logits), copy=False)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> float:
    """Mean softmax cross-entropy of ``logits [..., V]`` against integer ``targets [...]``.

    >>> round(cross_entropy(np.zeros((2, 4)), np.array([0, 3])), 6) == round(float(np.log(4)), 6)
    True
    """
    logp = _log_softmax(logits)
    picked = np.take_along_axis(logp, np.asarray(targets)[..., None], axis=-1)
    return float(-picked.mean())


def cross_entropy_backward(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The gradient of the mean cross-entropy: ``(softmax(logits) - onehot(targets)) / tokens``.

    >>> cross_entropy_backward(np.zeros((1, 2)), np.array([1])).tolist()
    [[0.5, -0.5]]
    """
    grad = np.exp(_log_softmax(logits))
    t = np.asarray(targets)[..., None]
    np.put_along_axis(grad, t, np.take_along_axis(grad, t, axis=-1) - 1.0, axis=-1)
    return grad / t.size
