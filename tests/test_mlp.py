"""The reference MLP against finite differences: the oracle's own check."""

from __future__ import annotations

import numpy as np
import pytest

from finite_differences import numeric_grad
from shardsim import mlp


@pytest.mark.parametrize("activation", ["identity", "relu", "gelu"])
def test_backward_matches_finite_differences(activation: str) -> None:
    rng = np.random.default_rng(3)
    params = mlp.init(4, 6, seed=1, dtype="float64")
    x = rng.standard_normal((3, 4))
    dout = rng.standard_normal((3, 4))

    def loss() -> float:  # <Out, dOut>: its gradient is the backward pass for cotangent dOut
        return float(np.sum(mlp.forward(params, x, activation) * dout))

    grads = mlp.backward(params, x, dout, activation)
    for name, value in (("x", x), ("w_in", params["w_in"]), ("w_out", params["w_out"])):
        np.testing.assert_allclose(grads[name], numeric_grad(loss, value), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("residual", [False, True])
def test_stack_backward_matches_finite_differences(residual: bool) -> None:
    rng = np.random.default_rng(4)
    params = mlp.init_stack(3, 4, 6, seed=2, dtype="float64")
    x = rng.standard_normal((2, 4))
    dout = rng.standard_normal((2, 4))

    def loss() -> float:
        return float(np.sum(mlp.stack_forward(params, x, "gelu", residual) * dout))

    grads = mlp.stack_backward(params, x, dout, "gelu", residual)
    for name, value in (("x", x), ("w_in", params["w_in"]), ("w_out", params["w_out"])):
        np.testing.assert_allclose(grads[name], numeric_grad(loss, value), rtol=1e-6, atol=1e-8)


def test_one_block_stack_is_the_mlp() -> None:
    params = mlp.init(4, 8, seed=5, dtype="float64")
    stack = {k: v[None] for k, v in params.items()}
    x = np.random.default_rng(0).standard_normal((2, 4))
    np.testing.assert_array_equal(mlp.stack_forward(stack, x, "relu"), mlp.forward(params, x, "relu"))


def test_init_is_seeded_and_typed() -> None:
    a, b = mlp.init(4, 8, seed=7, dtype="float32"), mlp.init(4, 8, seed=7, dtype="float32")
    assert a["w_in"].dtype == np.float32 and a["w_in"].shape == (4, 8) and a["w_out"].shape == (8, 4)
    np.testing.assert_array_equal(a["w_in"], b["w_in"])
    assert not np.array_equal(a["w_in"], mlp.init(4, 8, seed=8)["w_in"])
