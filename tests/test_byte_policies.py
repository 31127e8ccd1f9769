"""Each byte policy reproduces its source's published example from the ledger of a transformer's
shape-only training step (``model_memory``), and the policies' bad input is named."""

from __future__ import annotations

import pytest

from shardsim import formulas
from shardsim.errors import PlanError
from shardsim.models import get
from shardsim.training import model_memory, policies

# ZeRO (Rajbhandari et al. 2020), Figure 1 and §5.3: Psi = 7.5B, N_d = 64, mixed-precision Adam (K = 12)
FIGURE_1 = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}  # GB: baseline, P_os, P_os+g, P_os+g+p


@pytest.mark.parametrize("zero", list(FIGURE_1))
def test_zero_figure_1(zero: int) -> None:
    cfg = get("ptdp-7.5b")  # 7.47B parameters (Narayanan et al. 2021, Table 1)
    _, state = model_memory(cfg, f"dp=64,zero={zero}", batch=64, seq=64, policy="zero-mixed")
    n = cfg.param_count()
    assert state == formulas.model_state_breakdown(n, 64, zero, "mixed", "adam")  # the paper's closed form
    assert sum(state.values()) / 1e9 == pytest.approx(FIGURE_1[zero], rel=0.01, abs=0.04)


def megatron_params(layers: int, hidden: int, heads: int, groups: int, ffn: int, vocab: int) -> float:
    """``compute_weight_and_optimizer_memory``'s parameter count (Megatron-LM,
    megatron/training/theoretical_memory_usage.py) with untied=False, tp = pp = 1."""
    transformer = (
        10
        * layers
        * hidden
        * hidden
        * ((1 + ffn / hidden) / 5.0 + groups / (5.0 * heads) + 2 / (5 * hidden) + 1 / (5 * layers * hidden))
    )
    return transformer + hidden * vocab  # one embedding, tied to the output layer


@pytest.mark.parametrize(
    ("policy", "zero", "per_param"), [("megatron", 0, 18), ("megatron-distributed", 1, 6 + 12 / 8)]
)
def test_megatron_theoretical_memory(policy: str, zero: int, per_param: float) -> None:
    # the 1.7B GPT of Narayanan et al. 2021 as Megatron's formula counts it: no biases, no
    # position table (rotary), tied embeddings, vocabulary 51200 (already padded to 128·tp)
    cfg = get("ptdp-1.7b").scaled(bias=False, position="rope")
    n = megatron_params(cfg.layers, cfg.d_model, cfg.heads, cfg.n_kv, cfg.d_ff, cfg.vocab)
    assert n == pytest.approx(cfg.param_count(), rel=1e-14)  # the formula counts this model's weights (floats)
    expected = n * per_param  # num_parameters_on_most_loaded_model_shard * num_bytes_per_parameter
    _, state = model_memory(cfg, f"dp=8,zero={zero}", batch=8, seq=128, policy=policy)
    assert sum(state.values()) == pytest.approx(expected, rel=1e-14)
    assert state["grads"] == 4 * cfg.param_count()  # float32 gradients (Megatron's main_grad), whole on every chip


def test_scaling_book_ten_bytes_per_parameter() -> None:
    # "How to Scale Your Model", Part 5: bf16 params and fp32 Adam state are 2 + 8 = 10 bytes per
    # parameter, so pure data parallelism fits HBM / 10 parameters: "about 10B" on a 96 GB TPU v5p
    cfg = get("gpt3-1.3b")
    _, state = model_memory(cfg, "dp=4", batch=4, seq=64, policy="scaling-book")
    n = cfg.param_count()
    per_param = (state["params"] + state["optimizer"]) / n
    assert per_param == 10
    assert 9e9 <= 96e9 / per_param <= 10e9
    assert state["grads"] == 2 * n  # the bf16 gradients the book leaves out


def test_deepspeed_fp32_reduction_and_its_largest_layer_buffer() -> None:
    # DeepSpeed estimate_zero3_model_states_mem_needs: 18 * total_params / total_gpus + 4 * largest_layer_params
    cfg = get("gpt3-350m")
    d = 8
    peak, state = model_memory(cfg, f"dp={d},zero=3", batch=d, seq=64, policy="deepspeed-fp32-reduce")
    n = cfg.param_count()
    assert sum(state.values()) == 18 * n // d
    assert state["grads"] == 4 * n // d  # reduced, and kept, in float32
    largest = max(a * b for a, b in (s for s in cfg.param_shapes().values() if len(s) == 2))
    assert peak["temporaries"] >= 4 * largest  # the gathered weights and unreduced gradients the ledger sees


def test_pure_bf16_is_eight_bytes() -> None:
    cfg = get("gpt3-125m")
    _, state = model_memory(cfg, "dp=2", batch=2, seq=64, policy="bf16")
    n = cfg.param_count()
    assert state == {"params": 2 * n, "grads": 2 * n, "optimizer": 4 * n}


def test_every_preset_has_a_source_and_is_listed() -> None:
    assert policies.names() == [
        "zero-mixed",
        "deepspeed-fp32-reduce",
        "megatron",
        "megatron-distributed",
        "scaling-book",
        "bf16",
    ]
    for name in policies.names():
        p = policies.get(name)
        assert p.name == name and p.source and p.bytes_per_param


def test_bad_policies_are_named() -> None:
    with pytest.raises(PlanError, match="unknown byte policy 'fp8'; the presets are"):
        model_memory("gpt-tiny", "dp=2", batch=2, policy="fp8")
    with pytest.raises(PlanError, match=r"counts ZeRO stage 1.*set zero=1"):
        model_memory("gpt-tiny", "dp=2", batch=2, policy="megatron-distributed")
    with pytest.raises(PlanError, match="not both"):
        model_memory("gpt-tiny", "dp=2", batch=2, policy="bf16", precision="bf16")
