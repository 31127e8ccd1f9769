"""estimate(model, plan): FLOPs, MFU, tokens/s, days, the bound, pipelines' bubble, memory, placement."""

from __future__ import annotations

import pytest

from shardsim import Mesh, cost
from shardsim.cost import estimate, estimate_model
from shardsim.errors import PlanError, ShardsimError
from shardsim.models import TransformerConfig, get
from shardsim.plans import Plan
from shardsim.training import model_memory

SEQ = 16
TINY = get("llama-tiny")


# -- FLOPs, MFU and the training-run questions -------------------------------------------------
def test_model_flops_are_the_matmuls_with_attention_and_not_recompute() -> None:
    """Hand-derived: per token and layer, forward 2 FLOPs per matmul weight plus QK^T and PV
    (2·S·N·H each, the trace's full S x S scores), the LM head 2·D·V; backward twice forward."""
    cfg = TransformerConfig(layers=4, d_model=64, heads=4, d_ff=256, vocab=128, seq=32, name="hand")
    b, s = 8, 32
    matmul_weights = cfg.layers * (4 * 64 * 64 + 2 * 64 * 256) + 64 * 128
    forward = 2 * matmul_weights * b * s + cfg.layers * 2 * (2 * s * 64) * b * s
    for plan in ("dp=2", "dp=2,tp=2,sp", "tp=2,recompute=full", "pp=2,microbatches=4", "dp=2,zero=3"):
        plan += ",attention=standard"  # the full S x S scores the hand count counts
        est = estimate_model(cfg, plan, "h100", batch_tokens=b * s, efficiency="ideal")
        assert est.model_flops == 3 * forward, plan
    full = estimate_model(cfg, "tp=2,attention=standard,recompute=full", "h100", batch_tokens=b * s)
    head = 2 * 64 * 128 * b * s
    assert full.hardware_flops == 4 * forward - head  # the layers' forward again, not model work


def test_mfu_tokens_per_second_and_days_read_the_step() -> None:
    plan = "dp=8,tp=8,zero=1,attention=standard"  # the whole S x S scores' matmuls
    est = estimate_model("llama3-8b", plan, "h100", batch_tokens=64 * 8192, efficiency="ideal")
    assert est.mfu == pytest.approx(est.model_flops / (64 * est.step_s * est.hardware.flops("bfloat16")))
    assert est.tokens_per_s == pytest.approx(64 * 8192 / est.step_s)
    assert est.days(15e12) == pytest.approx(15e12 / (64 * 8192) * est.step_s / 86400)
    assert est.six_nt == 6 * get("llama3-8b").param_count() * 64 * 8192
    assert 1.1 < est.model_flops / est.six_nt < 1.3  # attention at 8,192 tokens adds ~20%
    assert "tokens/s" in est.summary() and "6·N·T" in est.summary()


def test_the_model_call_and_the_scheme_call_share_one_name() -> None:
    a = estimate("llama-tiny", "dp=2,tp=2", "h100", batch_tokens=4 * SEQ, seq=SEQ)
    b = estimate_model(TINY, Plan(dp=2, tp=2), "h100", batch_tokens=4 * SEQ, seq=SEQ)
    assert isinstance(a, cost.ModelEstimate) and a.step_s == b.step_s and a.memory == b.memory
    old = estimate("ddp", Mesh(X=8), "h100", 8 * 1024, 1024, 4096)  # the MLP's call, unchanged
    assert type(old) is cost.Estimate and old.scheme == "ddp"
    with pytest.raises(ShardsimError, match="batch_tokens"):
        estimate("llama-tiny", "dp=2", "h100", 64, 32, 128)


# -- pipelines ---------------------------------------------------------------------------------
def test_a_pipeline_whose_compute_dominates_is_compute_bound() -> None:
    """Before, phase totals summed every stage's collectives against one stage's FLOPs."""
    cfg = get("llama3-70b").scaled(layers=8)
    est = estimate_model(cfg, "dp=2,tp=8,pp=4,zero=1,microbatches=8", "h100", batch_tokens=16 * 8192,
                         efficiency="ideal")  # fmt: skip
    assert est.bound == "compute", est.bound_reason()
    forward = est.phases["forward"]
    assert max(v for k, v in forward.items() if k.startswith("comm ")) < forward["flops"]
    summed = sum(b.seconds for b in est.timeline.bars if b.phase == "forward" and "model" in b.axes)
    assert summed > forward["flops"]  # what the old rule compared: communication-bound
    mlp = estimate("dp_pp_tp", Mesh(X=2, Y=8, Z=4), "h100", batch=2 * 8 * 4 * 8192, d_model=8192, d_ff=32768,
                   layers=8, efficiency="ideal")  # fmt: skip
    assert mlp.bound == "compute", mlp.bound_reason()


PIPE = TransformerConfig(layers=8, d_model=2048, heads=16, d_ff=8192, vocab=8, seq=512, position="none", name="pipe")


@pytest.mark.parametrize(
    ("plan", "p", "m", "v"),
    [
        ("pp=4,microbatches=8", 4, 8, 1),
        ("pp=4,microbatches=16,schedule=gpipe", 4, 16, 1),
        ("pp=2,microbatches=4,schedule=interleaved,virtual_stages=2", 2, 4, 2),
        ("pp=4,microbatches=4,schedule=interleaved,virtual_stages=2", 4, 4, 2),
    ],
)
def test_the_bubble_is_the_closed_form(plan: str, p: int, m: int, v: int) -> None:
    """Equal stages (a tiny vocabulary: no heavy head), no data or tensor parallelism, and
    microbatches large enough that the stages' sends are small beside their matmuls."""
    est = estimate_model(PIPE, plan, "h100", batch_tokens=m * 512, efficiency="ideal")
    assert est.bubble_closed_form == pytest.approx((p - 1) / (v * m + p - 1))
    assert est.bubble == pytest.approx(est.bubble_closed_form, abs=0.03)
    assert f"closed form {est.bubble_closed_form:.1%}" in est.summary()
    stages = [s for s in est.timeline.streams() if s.startswith("compute ")]
    assert len(stages) == p  # each stage its own track, idle in the bubble


# -- memory: the training step's ledger ----------------------------------------------------------
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_the_memory_is_the_trainer_ledger(zero: int, precision: str) -> None:
    cfg, plan = TINY.scaled(layers=6), Plan(dp=2, tp=2, zero=zero)
    est = estimate_model(cfg, plan, "h100", batch_tokens=4 * SEQ, seq=SEQ, precision=precision)
    peak, state = model_memory(cfg, plan, batch=4, seq=SEQ, precision=precision, full=True)
    assert est.memory == peak and est.model_state == state
    assert "optimizer" in est.memory and est.memory_source.startswith("one training step, adam")


def test_a_pipeline_memory_is_the_trainer_ledger() -> None:
    cfg, plan = TINY.scaled(layers=8), Plan(dp=2, pp=2, microbatches=4, zero=1)
    est = estimate_model(cfg, plan, "h100", batch_tokens=8 * SEQ, seq=SEQ)
    assert est.memory == model_memory(cfg, plan, batch=8, seq=SEQ, full=True)[0]


def test_the_sizing_trap_is_closed() -> None:
    """GPT-3 6.7B under plain DDP on 64 H100s: Adam's float32 state alone is 80 GB per chip."""
    est = estimate_model("gpt3-6.7b", "dp=64", "h100", batch_tokens=64 * 2048)
    assert not est.fits and est.shortfall > 0
    assert est.largest(1)[0][0] == "optimizer"
    assert est.memory["optimizer"] >= 12 * get("gpt3-6.7b").param_count()
    assert "does not fit" in est.summary() and "optimizer" in est.memory_line().splitlines()[1]


def test_time_only_skips_the_memory_and_says_so() -> None:
    cfg, plan = TINY.scaled(layers=6), "dp=2,pp=2,microbatches=4"
    quick = estimate_model(cfg, plan, "h100", batch_tokens=8 * SEQ, seq=SEQ, memory=False)
    full = estimate_model(cfg, plan, "h100", batch_tokens=8 * SEQ, seq=SEQ)
    assert quick.step_s == full.step_s and quick.memory == {} and full.memory
    assert "memory not measured" in quick.summary()


# -- placement on GPUs ---------------------------------------------------------------------------
def test_tensor_parallelism_goes_on_nvlink() -> None:
    est = estimate_model("llama3-8b", "dp=4,pp=2,tp=8", "h100", batch_tokens=8 * 8192)
    assert est.placement is not None
    parts = {a: [p.network for p in ps] for a, ps in est.placement.parts.items()}
    assert parts == {"data": ["scaleout"], "pipe": ["scaleout"], "model": ["nvlink"]}
    # the MLP's dp_pp_tp on Mesh(X, Y, Z): row-major would put the pipeline Z on NVLink, Y across it
    sizes = {"batch": 64 * 1024, "d_model": 4096, "d_ff": 16384, "layers": 4}
    mlp = estimate("dp_pp_tp", Mesh(X=2, Y=8, Z=4), "h100", **sizes)
    tp_on_nvlink = estimate("dp_pp_tp", Mesh(X=2, Y=8, Z=4), "h100", **sizes,
                            links={"X": "scaleout", "Y": "nvlink", "Z": "scaleout"})  # fmt: skip
    assert mlp.step_s == tp_on_nvlink.step_s


def test_explicit_links_win_and_a_tp_wider_than_a_node_is_said() -> None:
    links = {"data": "nvlink", "model": "scaleout"}
    est = estimate_model("llama3-8b", "dp=2,tp=4", "h100", batch_tokens=8 * 8192, links=links)
    assert est.placement is not None and est.placement.parts["model"][0].network == "scaleout"
    wide = estimate_model("llama3-8b", "dp=2,tp=16", "h100", batch_tokens=8 * 8192)
    assert any("tp=16 is larger than h100's nvlink domain of 8" in w for w in wide.warnings)
    assert "warning: tp=16" in wide.summary()


def test_multi_letter_axis_names() -> None:
    plan = "dp=2,tp=2,pp=2,microbatches=2,data_axis=replica,model_axis=tensor,pipe_axis=stage"
    est = estimate_model(TINY.scaled(layers=4), plan, "h100", batch_tokens=4 * SEQ, seq=SEQ)
    assert est.mesh.axis_names == ("replica", "stage", "tensor")
    assert {a for b in est.timeline.bars for a in b.axes} == {"replica", "stage", "tensor"}
    assert est.placement is not None and est.placement.parts["tensor"][0].network == "nvlink"


# -- bad input -----------------------------------------------------------------------------------
def test_bad_input_names_the_culprit() -> None:
    with pytest.raises(PlanError, match=r"multiplies to 8 chips .* not chips=16"):
        estimate_model(TINY, "dp=2,tp=4", "h100", batch_tokens=4 * SEQ, seq=SEQ, chips=16)
    with pytest.raises(ShardsimError, match="no model preset 'llama9'"):
        estimate_model("llama9", "dp=2", "h100", batch_tokens=4 * SEQ)
    with pytest.raises(ShardsimError, match="no model preset 'llama9'"):  # nor a scheme: the presets' error
        estimate("llama9", "dp=2", "h100", batch_tokens=4 * SEQ)
    with pytest.raises(ShardsimError, match="does not divide by tp=3"):
        estimate_model(TINY, "tp=3", "h100", batch_tokens=4 * SEQ, seq=SEQ)
    with pytest.raises(ShardsimError, match="fewer than dp=8"):
        estimate_model(TINY, "dp=8", "h100", batch_tokens=4 * SEQ, seq=SEQ)
    with pytest.raises(ShardsimError, match="dp=2 x microbatches=4"):
        estimate_model(TINY, "dp=2,pp=2,microbatches=4", "h100", batch_tokens=6 * SEQ, seq=SEQ)


def test_figures_are_worded_as_the_summary_prints_them() -> None:
    est = estimate_model(TINY.scaled(layers=4), "dp=2,pp=2,microbatches=2", "h100", batch_tokens=4 * SEQ, seq=SEQ)
    summary = est.summary()
    assert [q for q, _ in est.figures()][:3] == ["step", "tokens/s", "MFU"]
    for quantity, value in est.figures():
        assert value.split()[0] in summary, quantity
    assert "bubble" in est._repr_html_() and est.breakdown("layer")


@pytest.mark.parametrize("policy", ["scaling-book", "bf16"])
def test_a_byte_policy_is_the_trainer_ledgers(policy: str) -> None:
    cfg, plan = TINY.scaled(layers=4), Plan(dp=2, tp=2)
    est = estimate_model(cfg, plan, "h100", batch_tokens=4 * SEQ, seq=SEQ, policy=policy)
    assert est.memory == model_memory(cfg, plan, batch=4, seq=SEQ, policy=policy, full=True)[0]
    assert f"byte policy {policy}" in est.memory_source
