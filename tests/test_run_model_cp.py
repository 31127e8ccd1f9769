"""run_model with context parallelism: every plan against the single-device reference, the
memory of a shape-only run at s = 131,072, the ring's collectives, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim import DivisibilityError, PlanError, ShapeDtype
from shardsim.models import TransformerConfig, reference
from shardsim.plans import Plan
from shardsim.transformer.run import run_model
from test_run_model import check_against_reference

BASE = TransformerConfig(layers=1, d_model=8, heads=2, d_ff=16, vocab=8, seq=8)


@st.composite
def cases(draw: st.DrawFn) -> tuple[TransformerConfig, Plan, str, int, None]:
    cp = draw(st.sampled_from([2, 4]))
    tp = draw(st.sampled_from([1, 2])) if cp == 2 else 1
    dp = draw(st.sampled_from([1, 2])) if cp * tp < 4 else 1
    kv = draw(st.sampled_from([k for k in (1, 2) if k % tp == 0 or tp % k == 0]))
    heads = max(kv, tp) * draw(st.sampled_from([1, 2]))
    sp = tp > 1 and draw(st.booleans())
    seq = 2 * cp * tp * draw(st.sampled_from([1, 2]))  # whole zigzag chunks, also per model chip under SP
    cfg = TransformerConfig(
        layers=draw(st.integers(1, 2)),
        d_model=dp * 4,
        heads=heads,
        kv_heads=kv,
        head_dim=draw(st.sampled_from([2, 4])),
        d_ff=tp * dp * 4,
        vocab=tp * draw(st.sampled_from([3, 5])),
        seq=seq,
        mlp=draw(st.sampled_from(["gelu", "swiglu"])),
        norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        position=draw(st.sampled_from(["learned", "rope", "none"])),
        bias=draw(st.booleans()),
        tie_embeddings=draw(st.booleans()),
    )
    zero = draw(st.sampled_from([0, 2, 3])) if dp > 1 and not cfg.bias else 0
    plan = Plan(
        dp=dp,
        zero=zero,
        tp=tp,
        sp=sp,
        cp=cp,
        cp_method=draw(st.sampled_from(["ring", "all_gather"])),
        cp_balanced=draw(st.booleans()),
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
    )
    return cfg, plan, draw(st.sampled_from(["float32", "float64"])), dp * draw(st.sampled_from([1, 2])), None


@settings(max_examples=25)
@given(cases())
def test_context_parallel_plans_match_the_reference(case: tuple[TransformerConfig, Plan, str, int, None]) -> None:
    check_against_reference(*case)


@pytest.mark.parametrize(
    "text",
    ["cp=4", "cp=4,cp_method=all_gather", "cp=4,cp_balanced=false", "cp=2,tp=2,sp", "dp=2,cp=2,zero=3"],
)
def test_named_context_parallel_plans_match_the_reference(text: str) -> None:
    cfg = BASE.scaled(layers=2, heads=4, kv_heads=2, position="rope", seq=16)
    check_against_reference(cfg, Plan.parse(text), "float64", 2, None)


def _stored(seq: int, cp: int, method: str = "ring") -> tuple[int, int]:
    """Block 0's stored activation bytes and the peak bytes of chip 0, shape-only."""
    cfg = TransformerConfig(layers=1, d_model=64, heads=4, d_ff=256, vocab=64, seq=seq, position="rope")
    plan = Plan(cp=cp, cp_method=method)
    params = {k: ShapeDtype(v, "bfloat16") for k, v in cfg.param_shapes().items()}
    tok = ShapeDtype((1, seq), "int32")
    res = run_model(cfg, plan, plan.mesh(), params, tok, tok)
    assert res.loss is None and res.peak is not None
    assert len(set(res.stored[0].ravel().tolist())) == 1  # the balanced split: every chip the same
    return int(res.stored[0].ravel()[0]), int(res.peak.ravel()[0])


@pytest.mark.parametrize("method", ["ring", "all_gather"])
def test_long_sequence_activations_per_chip_scale_as_s_over_cp(method: str) -> None:
    s = 131_072
    stored4, peak4 = _stored(s, 4, method)
    stored8, peak8 = _stored(s, 8, method)
    half, _ = _stored(s // 2, 4, method)
    assert stored4 == 2 * stored8 == 2 * half  # linear in s/cp: no term in s^2 is stored
    # an attention that formed one chip's scores against every key, [N, S/cp, S] in float32, alone
    # would outgrow the whole step's peak
    assert peak4 < 4 * (s // 4) * s * 4
    # a fused kernel holds its scores one tile at a time, so nothing of (s/cp)^2 is ever held: the
    # ring's peak halves with cp doubled, as the stored values do (the weights' bytes do not);
    # all-gather's holds full-length K, V and their partial gradients, which no cp shrinks
    if method == "ring":
        assert 1.99 * peak8 < peak4 < 2 * peak8
    else:
        assert peak8 < peak4 < 1.5 * peak8


def test_ring_passes_the_kv_blocks_round_the_context_axis() -> None:
    cfg = BASE.scaled(seq=16)
    params = reference.init(cfg, dtype="float64")
    tok = np.arange(32).reshape(2, 16) % cfg.vocab
    ring = run_model(cfg, Plan(cp=4), Plan(cp=4).mesh(), params, tok, tok)
    gather = run_model(cfg, Plan(cp=4, cp_method="all_gather"), Plan(cp=4).mesh(), params, tok, tok)
    fwd = [e for e in ring.trace.events if e.phase == "forward" and e.is_collective]
    assert {e.op for e in fwd} == {"ppermute"} and all(e.axes == ("context",) for e in fwd)
    assert len(fwd) == 3 * 3  # K, V and the positions, cp - 1 steps each
    ops = {e.op for e in gather.trace.events if e.phase == "forward" and e.is_collective}
    assert ops == {"all_gather"}
    assert ring.loss == pytest.approx(gather.loss, rel=1e-12)


@pytest.mark.parametrize(
    ("cfg", "text", "seed", "error", "words"),
    [
        (BASE.scaled(seq=12), "cp=4", None, DivisibilityError, "2*cp = 8 chunks"),
        (BASE.scaled(seq=12), "cp=4,cp_balanced=false", None, None, ""),
        (BASE.scaled(seq=8), "cp=2,tp=4,sp", None, DivisibilityError, "heads=2 does not divide by tp=4"),
        (BASE.scaled(heads=6, d_model=12, kv_heads=3, d_ff=8), "cp=2,tp=2", None, DivisibilityError, "kv_heads=3"),
        (BASE.scaled(dropout=0.1), "cp=2", 3, PlanError, "attention dropout"),
        (BASE.scaled(layers=2), "cp=2,pp=2", None, None, ""),  # pipelined context parallelism runs
    ],
)
def test_bad_context_parallel_input_names_the_culprit(
    cfg: TransformerConfig, text: str, seed: int | None, error: type[Exception] | None, words: str
) -> None:
    plan = Plan.parse(text)
    params = reference.init(cfg, dtype="float64")
    tok = np.zeros((2, cfg.seq), int)
    if error is None:
        run_model(cfg, plan, plan.mesh(), params, tok, tok)  # contiguous blocks need only S % cp
        return
    with pytest.raises(error, match=words):
        run_model(cfg, plan, plan.mesh(), params, tok, tok, dropout_seed=seed)


def test_context_axis_cannot_share_an_axis_with_another_parallelism() -> None:
    with pytest.raises(PlanError, match="both run over mesh axis 'model'"):
        Plan.parse("cp=2,tp=2,context_axis=model")
    with pytest.raises(PlanError, match="cp_method"):
        Plan.parse("cp=2,cp_method=ulysses")
    from shardsim.transformer.demo import walk

    assert walk("gpt-tiny", "cp=2").rstrip().endswith("PASS")  # the walk puts the sequence in its cp order
