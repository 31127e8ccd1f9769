"""``estimate``'s memory is the Trainer ledger's over the same shape-only training step.

The expected values are the Trainer's own ledger (the same model and plan stepped directly),
the ZeRO paper's closed forms (``shardsim.formulas``) and its Figure 1 figures.
"""

from __future__ import annotations

import numpy as np
import pytest

import shardsim as ss
from shardsim import Mesh, formulas
from shardsim.cost import estimate
from shardsim.errors import ShardingError
from shardsim.training import Trainer

# 27 blocks of D=5120, F=20480: 5.66B parameters
L, D, F = 27, 5120, 20480
N_PARAMS = 2 * L * D * F


def test_ddp_adam_on_h100_does_not_fit_and_names_the_optimizer_state() -> None:
    est = estimate("ddp", Mesh(X=64), "h100", 64 * 1024, D, F, layers=L)
    assert not est.fits
    assert est.memory["optimizer"] == 12 * N_PARAMS  # float32 master + m + v, unsharded under DDP
    assert est.largest(1) == [("optimizer", 12 * N_PARAMS)]
    assert est.shortfall == est.memory["total"] - 80e9 > 10e9
    text = est.summary()
    assert "does not fit: needs 90.91 GB of 80 GB" in text
    assert "largest: optimizer 67.95 GB" in text
    assert "adam (compute bfloat16, master float32" in text  # says what it assumes


def test_zero3_fits_where_ddp_does_not() -> None:
    est = estimate("zero3", Mesh(X=64), "h100", 64 * 1024, D, F, layers=L)
    assert est.fits and est.shortfall == 0
    assert "memory " in est.summary() and "does not fit" not in est.summary()


SCHEMES = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("precision", ["fp32", "fp64", "bf16", "fp16"])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_per_category_bytes_are_the_trainer_ledgers(scheme: str, precision: str, optimizer: str) -> None:
    layers, d, f, mesh = 3, 64, 256, Mesh(X=4)
    est = estimate(scheme, mesh, "h100", 32, d, f, layers=layers, optimizer=optimizer, precision=precision)
    params = {"w_in": ss.ShapeDtype((layers, d, f)), "w_out": ss.ShapeDtype((layers, f, d))}
    x = ss.ShapeDtype((32, d))
    result = Trainer(scheme, Mesh(X=4), params, optimizer, precision=precision).step(x, x)
    assert est.memory == {c: int(np.max(v)) for c, v in result.memory.items()}
    assert est.model_state == {c: int(np.max(v)) for c, v in result.model_state.items()}
    # the optimizer state lives across the step: its peak is the ZeRO closed form
    if precision in ("fp32", "bf16") and optimizer != "sgd":
        closed = formulas.model_state_breakdown(
            2 * layers * d * f, 4, SCHEMES[scheme], {"fp32": "fp32", "bf16": "mixed"}[precision], optimizer
        )
        assert est.memory["optimizer"] == closed["optimizer"]


# ZeRO (Rajbhandari et al. 2020), Figure 1: 7.5B parameters, N_d = 64, mixed-precision Adam
FIGURE_1 = {"ddp": 120.0, "zero1": 31.4, "zero2": 16.6, "zero3": 1.9}


@pytest.mark.parametrize("scheme", list(FIGURE_1))
def test_zero_figure_1_from_estimate(scheme: str) -> None:
    est = estimate(scheme, Mesh(X=64), "a100", 64, 8192, 32768, layers=14, precision="bf16")
    model_state = sum(est.model_state.values()) / 1e9
    # the paper rounds Psi = 7.5e9; 14 blocks of 2 x 8192 x 32768 are 7.52e9
    assert model_state == pytest.approx(FIGURE_1[scheme], rel=0.01, abs=0.06)
    assert est.memory["total"] >= sum(est.model_state.values())  # the peak adds what comes and goes


@pytest.mark.parametrize(("option", "value"), [("optimizer", "adagrad"), ("precision", "int8")])
def test_unknown_optimizer_or_precision_is_named(option: str, value: str) -> None:
    with pytest.raises(ShardingError, match=value):
        estimate("ddp", Mesh(X=4), "h100", 32, 64, 256, **{option: value})


def test_a_pipeline_estimate_counts_the_optimizer_state_its_training_step_holds() -> None:
    from shardsim import ShapeDtype

    est = estimate("pp", Mesh(Z=4), "h100", 4 * 64, 64, 256, layers=4)
    shapes = {"w_in": ShapeDtype((4, 64, 256), "bfloat16"), "w_out": ShapeDtype((4, 256, 64), "bfloat16")}
    x = ShapeDtype((4 * 64, 64), "bfloat16")
    step = Trainer("pp", Mesh(Z=4), shapes, "adam", precision="bfloat16").step(x, x)
    assert est.memory["optimizer"] == int(step.memory["optimizer"].max()) > 0
    # one stage holds one layer: float32 master, m and v of its 2 * 64 * 256 weights
    assert est.model_state["optimizer"] == 12 * 2 * 64 * 256
    assert "no optimizer state" not in est.summary()
