"""A pipeline's memory from the steady state of a two-stage probe, held to the full trace.

``model_memory`` of a pipelined plan runs two stages with a few layers and microbatches
(``shardsim.training.stage_memory``), never the whole schedule; every figure is checked here
against the fully traced step (``full=True``): the weights, gradients, optimizer state and model
state exactly, the activations and the total within 0.5% (the stash of a deeper schedule is
carried on from the probe's, per layer and per microbatch chunk).
"""

from __future__ import annotations

import math

import pytest

from shardsim.models import get
from shardsim.plans import Plan
from shardsim.training import model_memory
from shardsim.training.stage_memory import pipeline_memory

TINY = get("llama-tiny").scaled(seq=16, tie_embeddings=False)
EXACT = ("params", "grads", "optimizer")
CLOSE = 0.005


@pytest.mark.parametrize(
    ("plan", "layers"),
    [
        ("dp=2,tp=2,pp=2,microbatches=4", 8),
        ("dp=2,pp=4,microbatches=8", 8),
        ("dp=2,pp=2,microbatches=4,schedule=gpipe", 8),
        ("pp=2,microbatches=4,schedule=interleaved,virtual_stages=2", 8),
        ("dp=2,pp=2,microbatches=6,recompute=full", 12),
        ("dp=2,zero=2,pp=2,microbatches=4", 8),
        ("dp=4,zero=1,pp=2,microbatches=6", 12),  # the shards at four ranks, read off two and four
        ("dp=8,zero=3,pp=2,microbatches=4", 4),  # and at eight
        ("dp=2,zero=3,pp=3,microbatches=6", 12),
        ("tp=2,sp,pp=4,microbatches=8,schedule=interleaved,virtual_stages=2", 16),
        ("dp=2,cp=2,pp=2,microbatches=4", 8),
        ("pp=4,microbatches=2", 4),  # one layer a stage, fewer microbatches than stages
        ("pp=2,microbatches=12,recompute=selective", 10),  # 5 layers a stage: beyond the probes
    ],
)
def test_the_probe_gives_the_full_traces_figures(plan: str, layers: int) -> None:
    p = Plan.parse(plan)
    cfg, batch = TINY.scaled(layers=layers), p.dp * p.microbatches
    peak, state = model_memory(cfg, p, batch=batch)
    full, full_state = model_memory(cfg, p, batch=batch, full=True)
    assert state == full_state
    assert {c: peak[c] for c in EXACT} == {c: full[c] for c in EXACT}
    off = {c: peak[c] / full[c] - 1 for c in full if not math.isclose(peak[c], full[c], rel_tol=CLOSE)}
    assert not off, off
    assert set(peak) == set(full)


def test_stages_counted_at_their_deepest_hold_more() -> None:
    """The planner's uneven stages (the first and last a layer short) are counted at the deepest."""
    cfg, p = TINY.scaled(layers=8), Plan.parse("dp=2,pp=2,microbatches=4")
    even, _ = pipeline_memory(cfg, p, batch=8, seq=16)
    deeper, _ = pipeline_memory(cfg, p, batch=8, seq=16, stage_layers=5)
    assert all(deeper[c] > even[c] for c in ("params", "activations", "total"))
    assert even == model_memory(cfg, p, batch=8)[0]
