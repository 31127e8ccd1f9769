"""The planner's figures for a plan are ``shardsim.cost.estimate``'s for the same plan (docs/planner.md).

Small models (tied and untied embeddings, with and without flash attention) searched over
data, tensor and ZeRO plans on 4 chips of an A100 and an H100: the best plan and every kept
row without a pipeline or gradient accumulation (the step the whole-model estimate models
too) agree with the estimate on the step time (to 1e-6) and on every memory category (exactly).
"""

from __future__ import annotations

import math

import pytest

from shardsim import cost
from shardsim.models import TransformerConfig
from shardsim.planner import plan

KEYS = ("params", "grads", "optimizer", "activations", "total")

MODELS = {
    "tied-gelu": dict(layers=1, d_model=8, heads=2, d_ff=12, vocab=16, seq=8, position="none", norm="layernorm",
                      bias=False, tie_embeddings=True, mlp="gelu", dropout=0.0),
    "untied-swiglu": dict(layers=2, d_model=16, heads=4, d_ff=32, vocab=12, seq=8, position="rope", norm="rmsnorm",
                          bias=False, tie_embeddings=False, mlp="swiglu", dropout=0.0),
    "tied-bias-gqa": dict(layers=1, d_model=16, heads=4, kv_heads=2, d_ff=16, vocab=11, seq=8, position="learned",
                          norm="layernorm", bias=True, tie_embeddings=True, mlp="gelu", dropout=0.0),
}  # fmt: skip


def _disagreements(table, cfg: TransformerConfig, hw: str, seq: int) -> tuple[int, list[str]]:
    rows = [table.best, *table.rows]
    checked, bad = 0, []
    for r in rows:
        if r.plan.pp != 1 or r.plan.microbatches != 1:
            continue
        e = cost.estimate(cfg, r.plan, hw, batch_tokens=r.tokens, seq=seq)
        checked += 1
        if not math.isclose(r.step_s, e.step_s, rel_tol=1e-6):
            bad.append(f"{r.plan}: planner step {r.step_s!r}, estimate {e.step_s!r}")
        mem = {k: r.memory[k] for k in KEYS}
        if any(mem[k] != e.memory[k] for k in KEYS):
            bad.append(f"{r.plan}: planner memory {mem}, estimate {dict((k, e.memory[k]) for k in KEYS)}")
    return checked, bad


@pytest.mark.parametrize("hw", ["a100", "h100"])
@pytest.mark.parametrize("attention", [None, "standard", "flash"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_planner_rows_agree_with_estimate(name: str, attention: str | None, hw: str) -> None:
    cfg = TransformerConfig(**MODELS[name])
    fixed = {} if attention is None else {"attention": attention}
    table = plan(cfg, hw, chips=4, batch_tokens=32, seq=8, allow=("dp", "tp", "zero"), micro_range=(1, 2),
                 recompute="none", window=1.0, **fixed)  # fmt: skip
    checked, bad = _disagreements(table, cfg, hw, 8)
    assert checked >= 2, f"only {checked} rows without a pipeline or accumulation"
    assert not bad, "\n".join(bad)


def test_reported_case_agrees() -> None:
    """The hostile-input campaign's case: dp=2,zero=2,tp=2 (FlashAttention), tiny tied model on 4 x A100."""
    cfg = TransformerConfig(**MODELS["tied-gelu"])
    table = plan(cfg, "a100", chips=4, batch_tokens=32, seq=8, allow=("dp", "tp", "zero"), micro_range=(1, 2),
                 recompute="none")  # fmt: skip
    rows = [table.best, *(r for r in table.rows if str(r.plan) == "dp=2,zero=2,tp=2")]
    assert len(rows) == 2, [str(r.plan) for r in table.rows]
    for b in rows:
        e = cost.estimate(cfg, b.plan, "a100", batch_tokens=b.tokens, seq=8)
        assert math.isclose(b.step_s, e.step_s, rel_tol=1e-6), (str(b.plan), b.step_s, e.step_s)
        assert all(b.memory[k] == e.memory[k] for k in KEYS)
