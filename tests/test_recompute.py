"""Recomputation: keep each block's input only, run its forward again in the backward pass."""

from __future__ import annotations

import numpy as np
import pytest

import shardsim as ss
from shardsim import formulas, mlp
from shardsim.training import SGD, Trainer

L, B, D, F = 3, 8, 16, 32
CASES = [
    ("ddp", {"X": 4}, {"data": 4}),
    ("zero2", {"X": 4}, {"data": 4}),
    ("zero3", {"X": 4}, {"data": 4}),
    ("tp", {"Y": 4}, {"model": 4}),
    ("fsdp_tp", {"X": 2, "Y": 2}, {"data": 2, "model": 2}),
]


def data():
    rng = np.random.default_rng(11)
    params = mlp.init_stack(L, D, F, seed=5)
    return params, rng.standard_normal((B, D)).astype(np.float32), rng.standard_normal((B, D)).astype(np.float32)


def pair(name: str, sizes: dict[str, int], activation: str = "gelu", residual: bool = False):
    params, x, y = data()
    runs = []
    for recompute in (False, True):
        t = Trainer(
            name, ss.Mesh(sizes), params, SGD(lr=0.1), activation=activation, residual=residual, recompute=recompute
        )
        runs.append((t.step(x, y), t.params_global()))
    return runs


@pytest.mark.parametrize("activation", ["gelu", "identity"])
@pytest.mark.parametrize("name,sizes,axes", CASES)
def test_stored_activations_fall_to_the_block_inputs(name, sizes, axes, activation) -> None:
    """At the end of the forward pass each chip holds, per block, what the formula says, plus the output."""
    (full, _), (recomputed, _) = pair(name, sizes, activation)
    chips = sizes.get("X", 1) * (sizes.get("Y", 1) if name in ("tp", "fsdp_tp") else 1)
    output = B * D * 4 // chips
    for run, recompute in ((full, False), (recomputed, True)):
        block = formulas.mlp_activation_bytes(name, B, D, F, axes, "float32", activation, recompute)
        assert (run.stored_activations == L * sum(block.values()) + output).all(), (recompute, block)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("name,sizes,axes", CASES)
def test_activation_peak_falls_by_all_but_one_block(name, sizes, axes, residual) -> None:
    """The peak comes in the first block the backward pass reaches. Without recomputation every
    block's activations are live then; with it, every block's input plus the one block being
    recomputed. So the peak falls by (L - 1) x (a block's activations - its input)."""
    (full, _), (recomputed, _) = pair(name, sizes, "gelu", residual)
    saved = formulas.mlp_activation_bytes(name, B, D, F, axes, "float32", "gelu")
    kept = formulas.mlp_activation_bytes(name, B, D, F, axes, "float32", "gelu", recompute=True)
    drop = (L - 1) * (sum(saved.values()) - sum(kept.values()))
    assert drop > 0
    assert (full.memory["activations"] - recomputed.memory["activations"] == drop).all()


@pytest.mark.parametrize("name,sizes,axes", CASES)
def test_recompute_costs_one_more_forward_pass(name, sizes, axes) -> None:
    """Per chip: forward 4BDF/chips per block, backward 8BDF/chips; recomputation adds 4BDF/chips."""
    (full, _), (recomputed, _) = pair(name, sizes)
    chips = int(np.prod(list(sizes.values())))
    flops = formulas.mlp_flops(B, D, F, chips)
    assert full.trace.total("flops", phase="forward") == L * flops["forward"]
    assert full.trace.total("flops", phase="backward") == L * flops["backward"]
    assert recomputed.trace.total("flops", phase="recompute") == L * 4 * B * D * F // chips
    extra = recomputed.trace.total("flops") - full.trace.total("flops")
    assert extra == L * (formulas.mlp_flops(B, D, F, chips, recompute=True)["backward"] - flops["backward"])
    assert extra * 3 == full.trace.total("flops")  # a third more: 12 BDF per block becomes 16


@pytest.mark.parametrize("name,sizes,axes", CASES)
def test_recomputation_changes_no_number(name, sizes, axes) -> None:
    (full, w_full), (recomputed, w_rec) = pair(name, sizes)
    assert full.loss == recomputed.loss
    for k in w_full:
        np.testing.assert_array_equal(w_full[k], w_rec[k])


def test_fsdp_gathers_the_weights_again_to_recompute() -> None:
    """The per-layer steps gather a block's weights for its recomputed forward and again for its
    backward: 4Ψ elements moved per step instead of 3Ψ (a fused step could reuse the gather)."""
    (full, _), (recomputed, _) = pair("zero3", {"X": 4})
    psi, n = L * 2 * D * F, 4

    def sent(r):
        return r.trace.total("sent_bytes") - r.trace.total("sent_bytes", phase="loss")

    assert sent(full) == 3 * psi * 4 * (n - 1) // n
    assert sent(recomputed) == 4 * psi * 4 * (n - 1) // n
