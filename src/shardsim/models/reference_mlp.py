"""The single-device reference MLP: the oracle every sharded scheme is held to.

``Out = act(X @ W_in) @ W_out`` with X ``[B, D]``, W_in ``[D, F]``, W_out ``[F, D]``; the
backward pass is derived by hand (and checked against finite differences in the tests):

    H_pre = X @ W_in          H = act(H_pre)          Out = H @ W_out
    dW_out = H.T @ dOut       dH = dOut @ W_out.T     dH_pre = dH * act'(H_pre)
    dW_in  = X.T @ dH_pre     dX = dH_pre @ W_in.T

>>> import numpy as np
>>> from shardsim import mlp
>>> params = mlp.init(d_model=4, d_ff=8, seed=0)
>>> x = np.ones((2, 4), np.float32)
>>> mlp.forward(params, x).shape
(2, 4)
>>> sorted(mlp.backward(params, x, np.ones((2, 4), np.float32)))
['w_in', 'w_out', 'x']
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..activations import get as get_activation
from ..dtypes import resolve_dtype

Params = dict[str, np.ndarray]


def init(d_model: int, d_ff: int, seed: int = 0, dtype: Any = "float32") -> Params:
    """Weights ``{"w_in": [D, F], "w_out": [F, D]}`` drawn N(0, 1/fan_in), in ``dtype``."""
    rng = np.random.default_rng(seed)
    dt = resolve_dtype(dtype)
    return {
        "w_in": (rng.standard_normal((d_model, d_ff)) / np.sqrt(d_model)).astype(dt),
        "w_out": (rng.standard_normal((d_ff, d_model)) / np.sqrt(d_ff)).astype(dt),
    }


def forward(params: Params, x: np.ndarray, activation: str = "identity") -> np.ndarray:
    """``act(x @ W_in) @ W_out``."""
    act = get_activation(activation)
    return act.fn(x @ params["w_in"]) @ params["w_out"]


def backward(params: Params, x: np.ndarray, dout: np.ndarray, activation: str = "identity") -> dict[str, np.ndarray]:
    """Gradients ``{"x", "w_in", "w_out"}`` for the output cotangent ``dout``."""
    act = get_activation(activation)
    h_pre = x @ params["w_in"]
    h = act.fn(h_pre)
    dh_pre = (dout @ params["w_out"].T) * act.grad(h_pre)
    return {
        "x": dh_pre @ params["w_in"].T,
        "w_in": x.T @ dh_pre,
        "w_out": h.T @ dout,
    }


# -- deep stacks: L blocks of the two-matmul MLP ----------------------------------------------
def init_stack(layers: int, d_model: int, d_ff: int, seed: int = 0, dtype: Any = "float32") -> Params:
    """``{"w_in": [L, D, F], "w_out": [L, F, D]}``: the weights of ``layers`` MLP blocks.

    >>> init_stack(3, 4, 8)["w_in"].shape
    (3, 4, 8)
    """
    blocks = [init(d_model, d_ff, seed=seed + i, dtype=dtype) for i in range(layers)]
    return {k: np.stack([b[k] for b in blocks]) for k in ("w_in", "w_out")}


def layer(params: Params, i: int) -> Params:
    """Block ``i``'s weights out of a stack."""
    return {k: v[i] for k, v in params.items()}


def stack_forward(params: Params, x: np.ndarray, activation: str = "identity", residual: bool = False) -> np.ndarray:
    """``x`` through every block in order; with ``residual``, each block adds its input."""
    for i in range(params["w_in"].shape[0]):
        y = forward(layer(params, i), x, activation)
        x = x + y if residual else y
    return x


def stack_backward(
    params: Params, x: np.ndarray, dout: np.ndarray, activation: str = "identity", residual: bool = False
) -> dict[str, np.ndarray]:
    """Gradients ``{"x", "w_in": [L, D, F], "w_out": [L, F, D]}`` of a stack.

    >>> p = init_stack(2, 4, 8)
    >>> g = stack_backward(p, np.ones((3, 4)), np.ones((3, 4)), residual=True)
    >>> g["w_in"].shape, g["x"].shape
    ((2, 4, 8), (3, 4))
    """
    layers = params["w_in"].shape[0]
    inputs = []
    for i in range(layers):
        inputs.append(x)
        y = forward(layer(params, i), x, activation)
        x = x + y if residual else y
    grads: dict[str, list[np.ndarray]] = {"w_in": [], "w_out": []}
    for i in reversed(range(layers)):
        g = backward(layer(params, i), inputs[i], dout, activation)
        grads["w_in"].append(g["w_in"])
        grads["w_out"].append(g["w_out"])
        dout = dout + g["x"] if residual else g["x"]
    return {"x": dout, **{k: np.stack(v[::-1]) for k, v in grads.items()}}
