"""FlashAttention without context parallelism (``Plan.attention="flash"``): the single-device
reference, the tile pairs its FLOPs count, the memory it does not hold, its time on a chip with
a measured kernel, the planner's default, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

import attention_reference
from shardsim import Mesh, PlanError, PlannerError, ShapeDtype, ShapeError, ShardingError, shard
from shardsim.cost import get_hardware, timeline_of
from shardsim.models import TransformerConfig, get
from shardsim.planner import plan as search
from shardsim.plans import Plan
from shardsim.strategies.context import context_attention, context_attention_backward
from shardsim.transformer.run import run_model
from test_run_model import check_against_reference

CFG = TransformerConfig(layers=2, d_model=8, heads=4, kv_heads=2, d_ff=16, vocab=8, seq=16, position="rope")


@pytest.mark.parametrize(
    "text",
    [
        "attention=flash",
        "dp=2,tp=2,sp,attention=flash",
        "dp=2,zero=3,attention=flash,recompute=selective",
        "tp=4,attention=flash,recompute=full",  # KV heads replicated over the model axis
        "pp=2,microbatches=2,attention=flash",
    ],
)
@pytest.mark.parametrize("position", ["rope", "learned"])
def test_flash_plans_match_the_reference(text: str, position: str) -> None:
    check_against_reference(CFG.scaled(position=position), Plan.parse(text), "float64", 2, None)


def _shape_only(attention: str, seq: int, *, heads: int = 4, hd: int = 32, batch: int = 1):  # type: ignore[no-untyped-def]
    cfg = TransformerConfig(
        layers=1, d_model=heads * hd, heads=heads, d_ff=256, vocab=64, seq=seq, position="rope", dropout=0.0
    )
    plan = Plan(attention=attention)
    params = {k: ShapeDtype(v, "bfloat16") for k, v in cfg.param_shapes().items()}
    tok = ShapeDtype((batch, seq), "int32")
    return run_model(cfg, plan, plan.mesh(), params, tok, tok)


def test_flash_counts_the_visible_128_row_tile_pairs() -> None:
    seq, heads, hd, batch = 512, 4, 32, 2
    res = _shape_only("flash", seq, heads=heads, hd=hd, batch=batch)
    tiles = seq // 128
    visible = tiles * (tiles + 1) // 2  # causal: the tiles on and below the diagonal, 10 of 16
    tile = 2 * batch * heads * 128 * 128 * hd  # one matmul of one tile pair, all heads
    attention = [e for e in res.trace.events if e.kernel == "attention"]
    by_phase = {p: sum(e.flops for e in attention if e.phase == p) for p in ("forward", "backward")}
    assert by_phase == {"forward": 2 * visible * tile, "backward": 5 * visible * tile}  # QK^T, PV; 5 in backward
    standard = _shape_only("standard", seq, heads=heads, hd=hd, batch=batch)
    assert not [e for e in standard.trace.events if e.kernel == "attention"]
    dense = 2 * batch * heads * seq * seq * hd  # Q K^T over every key, as the scores in memory count it
    flops = {a: sum(e.flops for e in r.trace.events if e.phase == "forward") for a, r in (("f", res), ("s", standard))}
    assert flops["s"] - flops["f"] == 2 * dense - 2 * visible * tile


def test_flash_keeps_no_scores() -> None:
    seq, heads = 4096, 4
    flash, standard = _shape_only("flash", seq, heads=heads), _shape_only("standard", seq, heads=heads)
    kept = {name: dict(r.stored_values[0]) for name, r in (("flash", flash), ("standard", standard))}
    scores = heads * seq * seq  # one [B, N, S, S] value, B = 1
    assert kept["standard"]["attn.P"] == kept["standard"]["attn.Pd"] == 2 * scores  # bfloat16
    # the same values kept, but P and its dropped copy give way to the log-sum-exp (float32 per row and head)
    others = {k: v for k, v in kept["standard"].items() if k not in ("attn.P", "attn.Pd")}
    assert kept["flash"] == {**others, "attn.lse": 4 * heads * seq}
    # at a time a fused kernel holds one 128 x 128 float32 tile of the scores and one of their gradient
    assert int(flash.memory.peak("scores").max()) == 2 * 4 * heads * 128 * 128
    assert int(flash.peak.max()) < int(standard.peak.max()) - 2 * scores


def test_flash_is_timed_at_the_measured_kernel_rate() -> None:
    hw = get_hardware("h100")
    assert hw.calibration is not None and hw.calibration.attention is not None
    kernel = hw.calibration.attention
    res = _shape_only("flash", 4096, heads=8, hd=128)
    tl = timeline_of(res.trace, hw, Plan().mesh(), efficiency="calibrated")
    attention = [(b, res.trace.events[b.index]) for b in tl.bars if res.trace.events[b.index].kernel == "attention"]
    assert len(attention) == 7  # QK^T and PV forward, five matmuls backward
    for bar, e in attention:
        rate = kernel.forward if e.phase == "forward" else kernel.backward
        assert bar.seconds == pytest.approx(e.flops / (hw.flops("bfloat16") * rate), rel=1e-9)


def test_the_planner_runs_flash_unless_told_otherwise() -> None:
    model = get("gpt-tiny")
    table = search(model, "h100", chips=4, batch_tokens=8 * model.seq, seq=model.seq)
    assert {row.plan.attention for row in table.rows} == {"flash"}
    fixed = search(model, "h100", chips=4, batch_tokens=8 * model.seq, seq=model.seq, attention="standard")
    assert {row.plan.attention for row in fixed.rows} == {"standard"}
    # the same plans with the scores in memory are never faster
    pairs = [
        (row, other)
        for row in table.rows
        for other in fixed.rows
        if other.plan.replace(attention="flash") == row.plan and other.candidate.micro == row.candidate.micro
    ]
    assert pairs and all(row.step_s <= other.step_s * (1 + 1e-9) for row, other in pairs)
    with pytest.raises(PlannerError, match=r"attention='fast'.*standard.*flash"):
        search(model, "h100", chips=4, batch_tokens=8 * model.seq, seq=model.seq, attention="fast")


def test_bad_attention_is_refused() -> None:
    with pytest.raises(PlanError, match=r"attention='fast'.*standard.*flash"):
        Plan.parse("attention=fast")
    assert Plan.parse(str(Plan(attention="flash"))) == Plan(attention="flash")
    cfg = CFG.scaled(dropout=0.1)
    params = {k: np.zeros(v) for k, v in cfg.param_shapes().items()}
    tok = np.zeros((2, cfg.seq), np.int64)
    with pytest.raises(PlanError, match=r"attention=flash.*dropout_seed.*attention=standard"):
        run_model(cfg, Plan(attention="flash"), Plan().mesh(), params, tok, tok, dropout_seed=0)


def test_context_attention_without_an_axis_is_attention_on_every_chip() -> None:
    """``axis=None``: each chip's whole sequence, heads split over Y, against the definition."""
    rng = np.random.default_rng(0)
    b, s, n, kv, h = 2, 256, 4, 2, 8  # two 128-row tiles
    q, k, v, do = (rng.standard_normal(shape) for shape in ((b, s, n, h), (b, s, kv, h), (b, s, kv, h), (b, s, n, h)))
    mesh = Mesh(X=2, Y=2)
    pos = shard(np.arange(s), mesh, "[S]")
    sq, sk, sv, sdo = (shard(x, mesh, "B_X S N_Y H") for x in (q, k, v, do))
    o, saved = context_attention(sq, sk, sv, pos, axis=None)
    scale = 1 / np.sqrt(h)
    np.testing.assert_allclose(o.to_global(), attention_reference.attention(q, k, v, np.arange(s), scale), atol=1e-12)
    got = context_attention_backward(saved, sdo)
    want = attention_reference.attention_backward(q, k, v, np.arange(s), scale, do)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.to_global(), w, atol=1e-11)
    with pytest.raises(ShardingError, match=r"without a context axis.*gather it first"):
        context_attention(*(shard(x, mesh, "B S_X N_Y H") for x in (q, k, v)), pos, axis=None)
    with pytest.raises(ShapeError, match=r"must be \[S\]"):
        context_attention(sq, sk, sv, shard(np.arange(s), mesh, "[S_X]"), axis=None)
