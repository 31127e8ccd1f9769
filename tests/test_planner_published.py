"""The planner against published training runs, and against the whole-model estimate.

Llama 3 405B on 16,384 H100s (Llama Team 2024, Table 4: TP 8, CP 1, PP 16, DP 128 at 8K
sequence, 16M tokens per batch) and two rows of PTD-P Table 1 (Narayanan et al. 2021:
1.7B on 32 A100s with TP 1, PP 1; 145.6B on 1,536 A100s with TP 8, PP 8, batch 2,304):
the published configuration is in the table, within 5% of the best plan's time per token
for the two PTD-P rows. Llama 3's is in the table 11% behind a shallower pipeline with a
smaller bubble, as the whole-model estimate also finds (``docs/planner.md``: the cost model
rewards halving the bubble; Meta's choice was made for memory without recomputation, which
the ledger's activations do not reproduce); the test holds the gap to its cause. Where the
planner and a published run disagree (other rows), ``docs/planner.md`` says why.
"""

from __future__ import annotations

import pytest

from shardsim import cost
from shardsim.cost.layer_program import LayerCache
from shardsim.cost.model_estimate import estimate_model
from shardsim.models import get
from shardsim.planner import Candidate, plan
from shardsim.planner.evaluate import evaluate
from shardsim.plans import Plan
from shardsim.training import model_memory

# PTD-P (2021) ran plain data parallelism, no ZeRO, and attention with its scores in memory
# (before FlashAttention): its searches allow what it had
PTDP = {"allow": ("dp", "tp", "sp", "pp", "cp"), "attention": "standard"}
RUNS = [
    # (model, hardware, chips, sequences per batch, seq, constraints, published degrees)
    ("ptdp-1.7b", "a100", 32, 512, 2048, PTDP, {"tp": 1, "pp": 1, "dp": 32}),
    # PTD-P's GPT ties its embeddings; run_model pipelines untied ones (the LM head adds 0.6B)
    ("ptdp-145.6b", "a100", 1536, 2304, 2048, PTDP, {"tp": 8, "pp": 8, "dp": 24}),
]


@pytest.mark.parametrize(("name", "hw", "chips", "batch", "seq", "constraints", "published"), RUNS)
def test_published_configuration_is_in_the_table_within_5_percent(name, hw, chips, batch, seq, constraints, published):
    model = get(name)
    if published["pp"] > 1:
        model = model.scaled(tie_embeddings=False)
    table = plan(model, hw, chips, batch_tokens=batch * seq, seq=seq, **constraints)
    rows = table.find(**published)
    assert rows, f"{published} is not in the table:\n{table}"
    assert table.slowdown(rows[0]) <= 0.05, table.text(20)
    assert table.best.fits and rows[0].fits


def test_llama3_405b_published_configuration_is_in_the_table_behind_by_its_bubble():
    """Llama 3 405B, 16,384 H100s, 16M tokens at 8K: TP 8, PP 16, CP 1, DP 128 is a kept plan;
    the best (a shallower interleaved pipeline) is faster by less than the bubble it saves:
    the whole gap is the bubble ``(p - 1)/(v m)``, 0.23 at PP 16 with 4 chunks against 0.09
    to 0.11 at PP 4 or 8 with 8 chunks (on a 128-layer copy, whose stages divide, the
    whole-model estimate gives 7.93 s against 7.13 s for PP 8 with 8 chunks, the planner
    8.04 s against 7.14 s)."""
    table = plan("llama3-405b", "h100", 16384, batch_tokens=2048 * 8192, seq=8192)
    rows = table.find(tp=8, pp=16, cp=1, dp=128)
    assert rows and rows[0].fits, table.text(20)
    published, best = rows[0], table.best
    assert 0.05 < table.slowdown(published) < 0.15
    assert best.plan.tp == 8 and best.plan.pp < 16 and best.plan.virtual_stages > published.plan.virtual_stages
    saved = published.parts["bubble"] - best.parts["bubble"]
    assert saved >= published.step_s - best.step_s  # the bubble saved pays for all of it


@pytest.mark.parametrize(
    "text", ["dp=32", "dp=16,tp=2,sp", "dp=32,zero=1", "dp=32,zero=3", "dp=32,zero=2,recompute=selective"]
)
def test_figures_equal_the_whole_model_estimate(text):
    """Where the planner and ``cost.estimate(model, plan)`` model the same step (no pipeline,
    one microbatch), every second and every byte is the same: one program, two readers."""
    cfg, p = get("ptdp-1.7b"), Plan.parse(text).replace(attention="standard")  # PTD-P's kernel, 2021
    whole = cost.estimate(cfg, p, "a100", batch_tokens=64 * 2048, seq=2048)
    mine = evaluate(LayerCache(cfg, "a100", seq=2048), Candidate(p, 64 // p.dp, 64))
    assert mine.step_s == pytest.approx(whole.step_s, rel=1e-9)
    for category in ("params", "grads", "optimizer", "activations", "total"):
        assert mine.memory[category] == whole.memory[category], category


@pytest.mark.parametrize(
    ("text", "policy"), [("dp=32", "megatron"), ("dp=32,zero=1", "megatron-distributed"), ("dp=16,tp=2,sp", "bf16")]
)
def test_a_byte_policy_changes_the_memory_as_it_changes_model_memory(text, policy):
    """The planner's memory is the training step's ledger under the byte policy, as
    ``model_memory``'s (the whole model's step) is."""
    cfg, p = get("ptdp-1.7b"), Plan.parse(text)
    whole, _ = model_memory(cfg, p, batch=64, seq=2048, policy=policy)
    mine = evaluate(LayerCache(cfg, "a100", seq=2048, policy=policy), Candidate(p, 64 // p.dp, 64))
    default = evaluate(LayerCache(cfg, "a100", seq=2048), Candidate(p, 64 // p.dp, 64))
    assert mine.memory != default.memory  # float32 gradients, or bf16 moments
    for category in ("params", "grads", "optimizer", "activations", "total"):
        assert mine.memory[category] == whole[category], category


@pytest.mark.parametrize("text", ["dp=2,tp=2,sp,pp=4,microbatches=8", "dp=4,pp=8,microbatches=16"])
def test_pipeline_step_agrees_with_the_whole_model_estimate(text):
    """One pipeline step assembly: the planner's clock runs the sends and the gradient
    reductions where the estimate's time line does (on their links, under the compute), so
    the two agree within 3%. Not exactly: the planner times a layer from the one- and
    two-layer programs and runs whole schedule items on its clock, where the estimate
    schedules every op of the whole model (a collective may straddle two items; the
    embedding runs on the first stage, where the planner charges it with the head to the
    last). Measured: -0.2% (TP 2, PP 4 in one node) and -2.5% (PP 8 in a node, DP 4 across
    nodes, part of the gradient AllReduce exposed)."""
    cfg, p = get("ptdp-1.7b").scaled(tie_embeddings=False), Plan.parse(text).replace(attention="standard")
    whole = estimate_model(cfg, p, "a100", batch_tokens=64 * 2048, seq=2048, memory=False)
    mine = evaluate(LayerCache(cfg, "a100", seq=2048), Candidate(p, 64 // p.dp // p.microbatches, 64))
    assert mine.step_s == pytest.approx(whole.step_s, rel=0.03)


@pytest.mark.parametrize("text", ["dp=8,cp=4", "dp=4,tp=2,cp=4,cp_method=all_gather"])
def test_context_parallel_figures_equal_the_whole_model_estimate(text):
    """Under context parallelism a chip's share of causal attention is an event held on that
    chip alone (all-gather attention: each chip's queries see a different number of keys).
    The planner counts each such event on the chips that run it, as the estimate does, so the
    model FLOPs (and the MFU) are the estimate's; counted once per event they were 25% high."""
    cfg, p = get("ptdp-1.7b"), Plan.parse(text)
    whole = cost.estimate(cfg, p, "a100", batch_tokens=64 * 2048, seq=2048)
    mine = evaluate(LayerCache(cfg, "a100", seq=2048), Candidate(p, 64 // p.dp, 64))
    assert mine.model_flops == whole.model_flops
    assert mine.step_s == pytest.approx(whole.step_s, rel=1e-4)


@pytest.mark.parametrize(
    ("text", "layers"),
    [("dp=2,cp=4,pp=4,microbatches=16,cp_method=all_gather", 16), ("cp=4,pp=4,microbatches=8,cp_method=all_gather", 8)],
)
def test_pipelined_context_parallel_step_agrees_with_the_whole_model_estimate(text, layers):
    """Inside a pipeline each context-parallel chip's share of causal attention runs on that
    chip of that stage alone; the stage's other work runs on all its chips, that chip
    included, so the two cannot overlap. The whole-model time line keeps them apart and
    agrees with the planner's layer-program assembly within 4% (-1.5% and -3.6% measured:
    the A100's fused attention runs on the matmul curve with no passes over scores it never
    writes, so the assembly's other differences are a larger share of a shorter step); letting them
    overlap made the whole-model step 31% and 27% shorter. Without a data axis the weight gradients
    are reduced over the context axis alone, once a step: the planner charged that reduction
    to every microbatch (+15%)."""
    cfg = get("ptdp-1.7b").scaled(tie_embeddings=False, layers=layers)
    p = Plan.parse(text)
    batch = p.dp * p.microbatches
    whole = estimate_model(cfg, p, "a100", batch_tokens=batch * 2048, seq=2048, memory=False)
    mine = evaluate(LayerCache(cfg, "a100", seq=2048), Candidate(p, 1, batch))
    assert mine.step_s == pytest.approx(whole.step_s, rel=0.04)
