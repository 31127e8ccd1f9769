"""The inverse questions against hand-checkable cases: the ZeRO paper's Table 2.

Rajbhandari et al. 2020, Table 2: the largest model whose model state (16-bit weights and
gradients, K = 12 bytes of Adam state per parameter) fits 32 GB V100s with 64-way data
parallelism under each ZeRO stage and model-parallel degree MP: per device
``16Ψ/MP`` (baseline), ``(4 + 12/64)Ψ/MP`` (P_os), ``(2 + 14/64)Ψ/MP`` (P_os+g),
``16Ψ/(64 MP)`` (P_os+g+p). Printed: MP 1: 2B, 7.6B, 14.4B, 128B; MP 2: 15.2B under P_os;
MP 8: 115.2B under P_os+g. The family is PTD-P's 7.5B scaled in layers.
"""

from __future__ import annotations

import dataclasses

import pytest

from shardsim.cost import get_hardware
from shardsim.errors import PlannerError
from shardsim.models import get
from shardsim.planner import largest_model
from shardsim.plans import Plan

V100 = dataclasses.replace(get_hardware("a100"), name="v100-32gb", hbm_capacity=32e9)
FAMILY = get("ptdp-7.5b").scaled(tie_embeddings=False, dropout=0.0)
BYTES = {0: lambda d: 16.0, 1: lambda d: 4 + 12 / d, 2: lambda d: 2 + 14 / d, 3: lambda d: 16 / d}


@pytest.mark.parametrize(("mp", "zero", "printed"), [(1, 0, 2e9), (1, 1, 7.6e9), (1, 3, 128e9), (8, 2, 115.2e9)])
def test_zero_table2_largest_model(mp, zero, printed):
    plan = Plan(dp=64, tp=mp, zero=zero)
    cfg, _ = largest_model(FAMILY, V100, plan, batch_tokens=64 * 128, seq=128, count="model_state", max_layers=8192)
    theory = V100.hbm_capacity * mp / BYTES[zero](64)  # parameters the formula allows
    per_layer = FAMILY.scaled(layers=2).param_count() - FAMILY.scaled(layers=1).param_count()
    psi = cfg.param_count()
    assert psi <= theory  # the ledger counts the formula's bytes and the replicated norms besides
    assert psi + 2 * per_layer > theory  # one or two layers more would not fit
    assert abs(psi - printed) <= per_layer + 0.01 * printed  # the paper's rounded figure, to a layer


def test_largest_model_counts_the_whole_step_by_default():
    plan = Plan(dp=8, zero=3)
    state, _ = largest_model(FAMILY, "h100", plan, batch_tokens=8 * 2048, seq=2048, count="model_state")
    step, est = largest_model(FAMILY, "h100", plan, batch_tokens=8 * 2048, seq=2048)
    assert step.layers < state.layers and est.fits  # activations take their share


def test_largest_model_bad_input():
    with pytest.raises(PlannerError, match="scale='depth'"):
        largest_model(FAMILY, V100, Plan(dp=2), batch_tokens=256, seq=128, scale="depth")
    with pytest.raises(PlannerError, match="not even 1 layer"):
        largest_model(get("llama3-405b"), V100, Plan(), batch_tokens=8192, seq=8192)


@pytest.mark.parametrize(("policy", "per_param"), [("bf16", 8.0), ("megatron", 18.0), ("scaling-book", 12.0)])
def test_largest_model_under_a_byte_policy(policy, per_param):
    """The model state per parameter as the policy's source counts it (``docs``:
    ``shardsim.training.policies``; scaling-book's 10 leaves out the 2 bytes of bf16 gradients
    the step does keep), read off the ledger: the largest model is the formula's to a layer.
    Two data ranks, as megatron's float32 gradients are those of the reduction over them."""
    cfg, _ = largest_model(
        FAMILY, V100, Plan(dp=2), batch_tokens=256, seq=128, count="model_state", max_layers=4096, policy=policy
    )
    theory = V100.hbm_capacity / per_param
    per_layer = FAMILY.scaled(layers=2).param_count() - FAMILY.scaled(layers=1).param_count()
    assert cfg.param_count() <= theory < cfg.param_count() + 2 * per_layer
