"""Korthikanti et al. 2022 (arXiv:2205.05198), Table 2, measured: the ledger of a shape-only
GPT-3 175B run gives each row's per-layer activation bytes exactly.

GPT-3 175B: s = 2048, h = 12288, a = 96, d_ff = 4h, LayerNorm, GELU, dropout on, 16-bit
activations and 1-byte dropout masks; b = 1, t = 8. The vocabulary is padded to 51,200
(a multiple of 128·t, as Megatron pads it) so that it divides by t. The closed forms are only
the expected values; the measured number is the ledger's live activation bytes after a
layer's forward minus before it. The table is about standard attention (the scores and
probabilities in memory, as Megatron-LM ran before FlashAttention): every plan says so.
"""

from __future__ import annotations

import numpy as np
import pytest

from shardsim import ShapeDtype
from shardsim.models import get
from shardsim.plans import Plan
from shardsim.transformer.run import run_model

S, B, H, A, T = 2048, 1, 12288, 96, 8
SBH = S * B * H
ATTN = 5 * A * S * S * B  # 5as/h · sbh: softmax out, its dropout mask, dropout out

STANDARD = "attention=standard"
TABLE_2 = [  # (plan, per-layer bytes per chip), the table's rows in order
    (STANDARD, 34 * SBH + ATTN),  # sbh(34 + 5as/h)
    (f"tp=8,{STANDARD}", 10 * SBH + 24 * SBH // T + ATTN // T),  # sbh(10 + 24/t + 5as/(ht))
    (f"tp=8,sp,{STANDARD}", 34 * SBH // T + ATTN // T),  # sbh(34/t + 5as/(ht))
    (f"tp=8,{STANDARD},recompute=selective", 10 * SBH + 24 * SBH // T),  # sbh(10 + 24/t)
    (f"tp=8,sp,{STANDARD},recompute=selective", 34 * SBH // T),  # sbh(34/t)
    (f"{STANDARD},recompute=full", 2 * SBH),  # sbh(2)
]


def gpt3(**changes: object) -> object:
    cfg = get("gpt3-175b")
    assert (cfg.seq, cfg.d_model, cfg.heads, cfg.d_ff, cfg.norm, cfg.mlp) == (S, H, A, 4 * H, "layernorm", "gelu")
    return cfg.scaled(**{"layers": 2, "vocab": 51200, "dropout": 0.1, **changes})


def measure(text: str, **changes: object) -> object:
    cfg = gpt3(**changes)
    plan = Plan.parse(text)
    params = {k: ShapeDtype(v, "bfloat16") for k, v in cfg.param_shapes().items()}  # type: ignore[attr-defined]
    tokens = ShapeDtype((B, S), "int32")
    return run_model(cfg, plan, plan.mesh(), params, tokens, tokens, dropout_seed=0)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "expected"), TABLE_2)
def test_table_2_row_measured(text: str, expected: int) -> None:
    res = measure(text)
    for per_chip in res.stored:  # type: ignore[attr-defined]
        assert (per_chip == expected).all(), f"{text}: measured {per_chip.ravel()[0]} B, table {expected} B"


def test_the_breakdown_is_the_papers() -> None:
    """§4.1: attention 11sbh + 5as²b, MLP 19sbh, the two LayerNorm inputs 4sbh (no parallelism)."""
    kept = measure(STANDARD).stored_values[0]  # type: ignore[attr-defined]
    norms = kept["attn.x"] + kept["mlp.x"]
    attention = sum(v for k, v in kept.items() if k.startswith("attn.")) - kept["attn.x"]
    mlp = sum(v for k, v in kept.items() if k.startswith("mlp.")) - kept["mlp.x"]
    assert (norms, attention, mlp) == (4 * SBH, 11 * SBH + ATTN, 19 * SBH)
    assert kept["attn.mask attn_probs"] == A * S * S * B  # 1-byte masks
    assert kept["attn.P"] == 2 * A * S * S * B


def test_masks_are_one_byte_and_activations_sixteen_bits() -> None:
    """Without dropout the three masks go and the dropout output is the softmax output itself."""
    res = measure(STANDARD, dropout=0.0)
    assert (res.stored[0] == 32 * SBH + 2 * A * S * S * B).all()  # type: ignore[attr-defined]


def test_gqa_and_swiglu_store_what_their_shapes_say() -> None:
    """LLaMA-style block (no table for it): K, V have K/N of Q's bytes, SwiGLU keeps gate, up and H."""
    cfg = get("gpt3-175b").scaled(layers=1, vocab=51200, kv_heads=8, mlp="swiglu", norm="rmsnorm", dropout=0.0)
    plan = Plan(tp=8, sp=True, attention="standard", recompute="selective")
    params = {k: ShapeDtype(v, "bfloat16") for k, v in cfg.param_shapes().items()}
    res = run_model(cfg, plan, plan.mesh(), params, ShapeDtype((B, S), "int32"), ShapeDtype((B, S), "int32"))
    f = cfg.d_ff
    expected = (2 * 6 * SBH + 2 * 2 * SBH * 8 // A + 3 * 2 * S * B * f) // T  # x, A, Q, C, x2, Cn; K, V; gate, up, H
    assert int(np.unique(res.stored[0])[0]) == expected
