"""The trace's matmul FLOPs of a training step against the closed forms that count matmuls only.

Korthikanti et al. 2022, Appendix A (and Narayanan et al. 2021): a GPT step costs
``72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))`` FLOPs, i.e. per layer forward ``24Bsh² + 4Bs²h``
(QKV, scores, attention over V, output projection, the 4h MLP), the LM head ``2BshV``, and
backward twice forward. The scores are counted whole (no causal saving), as the formula does.
Recomputation adds the recomputed forward matmuls: ``full`` the whole block
(``24Bsh² + 4Bs²h`` per layer; the LM head is not recomputed), ``selective`` the attention
core's forward, ``Q K^T`` and ``P V`` (``4Bs²h`` per layer), as Megatron-LM reruns it.
"""

from __future__ import annotations

import pytest

from shardsim import ShapeDtype
from shardsim.models import TransformerConfig, get
from shardsim.plans import Plan
from shardsim.transformer.run import run_model


def traced_flops(cfg: TransformerConfig, text: str, b: int) -> int:
    """Matmul FLOPs of the whole step, summed over the chips that run each event."""
    plan = Plan.parse(text).replace(attention="standard")  # the closed forms count the whole S x S scores
    mesh = plan.mesh()
    params = {k: ShapeDtype(v, "bfloat16") for k, v in cfg.param_shapes().items()}
    tokens = ShapeDtype((b, cfg.seq), "int32")
    res = run_model(cfg, plan, mesh, params, tokens, tokens)
    events = [e for e in res.trace.events if e.op == "matmul"]
    assert all(e.where == "" for e in events)  # every chip runs every matmul
    return sum(e.flops for e in events) * mesh.size


def gpt_formula(b: int, s: int, layers: int, h: int, v: int) -> int:
    """``72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))``, multiplied out to integers."""
    return 72 * b * s * layers * h * h + 12 * b * s * s * layers * h + 6 * b * s * h * v


GPT3 = get("gpt3-175b").scaled(vocab=51200)  # padded to a multiple of 128·t, as Megatron does


@pytest.mark.parametrize(("text", "layers"), [("tp=8,sp", 96), ("dp=1", 8), ("dp=2,tp=4,zero=3", 8)])
def test_gpt3_step_flops_equal_the_closed_form(text: str, layers: int) -> None:
    cfg, b = GPT3.scaled(layers=layers), 2
    assert traced_flops(cfg, text, b) == gpt_formula(b, cfg.seq, layers, cfg.d_model, cfg.vocab)


@pytest.mark.parametrize(
    ("policy", "extra_per_layer"),
    [
        ("full", lambda b, s, h: 24 * b * s * h * h + 4 * b * s * s * h),
        ("selective", lambda b, s, h: 4 * b * s * s * h),
    ],
)
def test_recomputation_adds_the_recomputed_matmuls(policy: str, extra_per_layer: object) -> None:
    cfg = GPT3.scaled(layers=4)
    b, s, h = 1, cfg.seq, cfg.d_model
    base = gpt_formula(b, s, cfg.layers, h, cfg.vocab)
    got = traced_flops(cfg, f"tp=8,recompute={policy}", b)
    assert got == base + cfg.layers * extra_per_layer(b, s, h)  # type: ignore[operator]
    if policy == "full":  # the "4/3" of the literature, less the LM head that is not recomputed
        assert got == pytest.approx(4 / 3 * base - 2 * b * s * h * cfg.vocab, rel=1e-12)


def llama_formula(cfg: TransformerConfig, b: int) -> int:
    """SwiGLU + GQA: per layer forward 2Bs·h·(N+2K)·H (QKV) + 2Bs·NH·h (out) + 4Bs²·NH (scores, P V)
    + 6Bs·h·F (gate, up, down); the head 2BshV; training three times forward."""
    s, h, nh, kh, f = cfg.seq, cfg.d_model, cfg.heads * cfg.hd, cfg.n_kv * cfg.hd, cfg.d_ff
    layer = 2 * b * s * h * (nh + 2 * kh) + 2 * b * s * nh * h + 4 * b * s * s * nh + 6 * b * s * h * f
    return 3 * (cfg.layers * layer + 2 * b * s * h * cfg.vocab)


def test_llama3_8b_step_flops_equal_the_swiglu_gqa_closed_form() -> None:
    cfg = get("llama3-8b")
    assert (cfg.mlp, cfg.n_kv < cfg.heads) == ("swiglu", True)
    assert traced_flops(cfg, "tp=8,sp", 1) == llama_formula(cfg, 1)
