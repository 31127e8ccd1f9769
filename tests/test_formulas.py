"""The closed forms: the ZeRO paper's worked example, the 16-byte rule, and the ledger for any size."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardsim as ss
from shardsim import formulas, memory, mlp
from shardsim.training import SGD, Adam, Trainer

GB = 1e9  # the ZeRO paper's GB


def test_zero_figure_1_for_7_5b_parameters_on_64_chips() -> None:
    """Ψ = 7.5B, N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB (1.875 exactly)."""
    got = [formulas.model_state_bytes(7.5e9, 64, stage) / GB for stage in range(4)]
    assert got == [120.0, 31.40625, 16.640625, 1.875]
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]


def test_sixteen_bytes_per_parameter() -> None:
    assert sum(formulas.bytes_per_param("mixed", "adam").values()) == 16
    assert formulas.bytes_per_param("mixed", "adam") == {"params": 2, "grads": 2, "optimizer": 12}
    assert formulas.model_state_bytes(1, 1, 0) == 16
    assert formulas.model_state_bytes(1.5e9, 1, 0) == 24e9  # GPT-2 1.5B: at least 24 GB
    assert formulas.model_state_bytes(1e12, 1024, 3) == 16e12 / 1024  # 1T on 1024 GPUs: "16 GB" each (15.6)


def test_reexported_from_memory() -> None:
    assert memory.model_state_bytes is formulas.model_state_bytes
    assert memory.zero_comm_bytes is formulas.zero_comm_bytes


@given(
    psi=st.integers(1, 10**12),
    n=st.integers(1, 4096),
    precision=st.sampled_from(formulas.PRECISIONS),
    optimizer=st.sampled_from(formulas.OPTIMIZERS),
)
def test_the_stages_in_closed_form(psi: int, n: int, precision: str, optimizer: str) -> None:
    per = formulas.bytes_per_param(precision, optimizer)
    p, g, k = per["params"], per["grads"], per["optimizer"]
    got = [formulas.model_state_bytes(psi, n, s, precision, optimizer) for s in range(4)]
    want = [(p + g + k) * psi, (p + g) * psi + k * psi / n, p * psi + (g + k) * psi / n, (p + g + k) * psi / n]
    assert got == pytest.approx(want, rel=1e-15)
    assert got == sorted(got, reverse=True)  # each stage saves memory (or ties at N = 1)
    if n == 1:
        assert got == pytest.approx([got[0]] * 4, rel=1e-15)


def test_reductions_as_n_grows() -> None:
    """The paper's limits: stage 1 → 4Ψ (4x less), stage 2 → 2Ψ (8x less), stage 3 → 0."""
    psi, n = 1e9, 10**12
    assert formulas.model_state_bytes(psi, n, 1) == pytest.approx(4 * psi)
    assert formulas.model_state_bytes(psi, n, 2) == pytest.approx(2 * psi)
    assert formulas.model_state_bytes(psi, n, 3) < 1e-9 * psi


def test_communication_volumes() -> None:
    assert [formulas.zero_comm_elements(100, s) for s in range(4)] == [200, 200, 200, 300]
    assert formulas.zero_comm_bytes(100, 4, 3, "bfloat16") == 300 * 2 * 3 / 4


def test_errors_name_the_choices() -> None:
    with pytest.raises(ValueError, match="ZeRO stage must be one of"):
        formulas.model_state_bytes(10, 2, 4)
    with pytest.raises(ValueError, match="precision must be one of"):
        formulas.model_state_bytes(10, 2, 1, precision="fp8")
    with pytest.raises(ValueError, match="no activation formula for scheme 'pp'"):
        formulas.mlp_activation_bytes("pp", 8, 8, 8)


# -- the ledger holds the formulas for any size ----------------------------------------------------
@settings(max_examples=25)
@given(
    name=st.sampled_from(["ddp", "zero1", "zero2", "zero3"]),
    n=st.integers(1, 8),
    layers=st.integers(1, 3),
    dk=st.integers(1, 3),
    fk=st.integers(1, 3),
    precision=st.sampled_from(["mixed", "fp32"]),
    optimizer=st.sampled_from(["adam", "adamw", "momentum", "sgd"]),
)
def test_ledger_equals_the_formula_for_any_size(name, n, layers, dk, fk, precision, optimizer) -> None:
    d, f = n * dk, n * fk
    params = mlp.init_stack(layers, d, f)
    x = np.ones((n, d), np.float32)
    opt = {"adam": Adam(), "adamw": Adam(decoupled=True), "momentum": SGD(momentum=0.9), "sgd": SGD()}[optimizer]
    r = Trainer(name, ss.Mesh(X=n), params, opt, precision="bf16" if precision == "mixed" else "fp32").step(x, x)
    stage = formulas.SCHEME_STAGES[name]
    want = formulas.model_state_breakdown(layers * 2 * d * f, n, stage, precision, optimizer)
    got = {c: r.model_state[c] for c in want}
    for c in want:
        assert (got[c] == want[c]).all(), (c, got[c], want[c])


def test_activation_formula_per_scheme() -> None:
    b, d, f = 8, 16, 32
    assert formulas.mlp_activation_bytes("ddp", b, d, f, {"data": 4}, "bfloat16") == {
        "In": 2 * 16 * 2,
        "H_pre": 2 * 32 * 2,
        "H": 2 * 32 * 2,
    }
    assert formulas.mlp_activation_bytes("tp", b, d, f, {"model": 4}, activation="identity") == {
        "In": 8 * 16 * 4,  # gathered: dW_in needs it whole
        "H_pre": 8 * 8 * 4,
    }
    assert formulas.mlp_activation_bytes("fsdp_tp", b, d, f, {"data": 2, "model": 4}, recompute=True) == {
        "In": 4 * 4 * 4
    }
    flops = formulas.mlp_flops(b, d, f, chips=2)
    assert flops == {"forward": 4 * b * d * f // 2, "backward": 8 * b * d * f // 2}
