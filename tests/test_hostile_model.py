"""The transformer's door: gradients of short sequences under every plan, bounded config checks,
run_model's and Trainer.for_model's refusals of bad inputs, and ZeRO's splits checked up front."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim import ArgumentTypeError, ConfigError, DivisibilityError, Mesh, ModelInputError, PlanError
from shardsim.errors import ShardsimError
from shardsim.models import TransformerConfig, reference
from shardsim.plans import Plan
from shardsim.training import SGD, Trainer
from shardsim.transformer.run import run_model

CFG = TransformerConfig(layers=2, d_model=8, heads=2, d_ff=16, vocab=8, seq=8)
MOE = CFG.scaled(experts=4)
SHORT_PLANS = (
    "dp=2",
    "dp=2,zero=1",
    "dp=2,zero=2",
    "dp=2,zero=3",
    "tp=2,sp",
    "cp=2",
    "cp=2,cp_balanced=false",
    "dp=2,cp=2",
    "dp=2,zero=1,cp=2",
    "dp=2,zero=2,cp=2",
    "dp=2,zero=3,cp=2,cp_method=all_gather",
    "dp=2,tp=2,cp=2",
    "pp=2,microbatches=2",
    "dp=2,cp=2,pp=2,microbatches=2",
    "dp=2,ep=2",
)


def _batch(cfg: TransformerConfig, plan: Plan, s: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    b = 2 * plan.dp * plan.ep * plan.microbatches
    return rng.integers(0, cfg.vocab, (b, s)), rng.integers(0, cfg.vocab, (b, s))


@pytest.mark.parametrize("text", SHORT_PLANS)
def test_grads_of_a_short_sequence_have_the_params_shapes(text: str, s: int = 4) -> None:
    """With learned positions and S < cfg.seq, every gradient is its weight's shape (pos_embed's rows
    past S zero) and equals the single-device reference's."""
    plan = Plan.parse(text)
    cfg = MOE if plan.ep > 1 else CFG
    params = reference.init(cfg, seed=1, dtype="float64")
    tokens, targets = _batch(cfg, plan, s)
    got = run_model(cfg, plan, plan.mesh(), params, tokens, targets)
    _, want = reference.loss_and_grads(cfg, params, tokens, targets)
    assert got.grads is not None
    for k, v in params.items():
        assert got.grads[k].shape == v.shape, k
        np.testing.assert_allclose(got.grads[k], want[k], rtol=1e-9, atol=1e-12, err_msg=k)
    assert not got.grads["pos_embed"][s:].any()


@pytest.mark.parametrize("text", ["dp=2,cp=2", "dp=2,zero=1,cp=2"])
def test_trainer_steps_twice_on_short_sequences_under_data_and_context(text: str) -> None:
    plan = Plan.parse(text)
    params = reference.init(CFG, seed=1, dtype="float64")
    tokens, targets = _batch(CFG, plan, 4)
    trainer = Trainer.for_model(CFG, plan, plan.mesh(), params, SGD(lr=0.1))
    trainer.step(tokens, targets)
    trainer.step(tokens, targets)  # the first step's update kept every weight's shape
    _, g1 = reference.loss_and_grads(CFG, params, tokens, targets)
    once = {k: v - 0.1 * g1[k] for k, v in params.items()}
    _, g2 = reference.loss_and_grads(CFG, once, tokens, targets)
    for k, v in trainer.params_global().items():
        np.testing.assert_allclose(v, once[k] - 0.1 * g2[k], rtol=1e-9, atol=1e-12, err_msg=k)
