"""``estimate(model, plan, ..., policy=name)``: a byte policy reaches the model's estimate.

The policy decides the ledger's bytes, so the estimate with it is
:func:`~shardsim.cost.model_estimate.estimate_model`'s with it, and its gradient bytes follow the
policy's reduction dtype: ``megatron-distributed`` reduces in float32 (4 bytes a parameter), the
default bf16 policy in bfloat16 (2 bytes), so the gradients' bytes double. An unknown name is the
presets' ``PlanError``; a scheme's MLP has no byte policy and says what it takes instead.
"""

from __future__ import annotations

import pytest

from shardsim import Mesh
from shardsim.cost import estimate
from shardsim.cost.model_estimate import estimate_model
from shardsim.errors import CostModelError, PlanError

MODEL, PLAN, TOKENS = "gpt-tiny", "dp=2,zero=1", 2 * 16


@pytest.mark.parametrize("policy", ["megatron-distributed", "bf16"])
def test_estimate_passes_policy_to_the_model_estimate(policy: str) -> None:
    got = estimate(MODEL, PLAN, "h100", batch_tokens=TOKENS, policy=policy)
    want = estimate_model(MODEL, PLAN, "h100", batch_tokens=TOKENS, policy=policy)
    assert got.memory == want.memory and got.model_state == want.model_state
    assert got.memory_source == want.memory_source and policy in got.memory_source
    assert got.step_s == want.step_s


def test_a_float32_reduction_doubles_the_gradient_bytes() -> None:
    default = estimate(MODEL, PLAN, "h100", batch_tokens=TOKENS)  # bf16 weights, reduced in bfloat16
    fp32_reduce = estimate(MODEL, PLAN, "h100", batch_tokens=TOKENS, policy="megatron-distributed")
    assert fp32_reduce.memory["grads"] == 2 * default.memory["grads"]
    assert fp32_reduce.memory["params"] == default.memory["params"]


def test_an_unknown_policy_names_the_presets() -> None:
    with pytest.raises(PlanError, match=r"unknown byte policy 'fp8'; the presets are \['zero-mixed'"):
        estimate(MODEL, PLAN, "h100", batch_tokens=TOKENS, policy="fp8")


def test_a_scheme_takes_optimizer_and_precision_not_a_policy() -> None:
    with pytest.raises(CostModelError, match="policy='megatron': a byte policy is the transformer's"):
        estimate("fsdp", Mesh(X=2), "h100", batch=8, d_model=4, d_ff=8, policy="megatron")
