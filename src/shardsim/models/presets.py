"""Published transformer configurations by name, each with its source.

GPT-3 (Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1): LayerNorm,
GELU MLP with d_ff = 4·d_model, learned absolute positions, biases on every linear layer,
embeddings tied to the LM head (as GPT-2), vocabulary 50257, context 2048.

Llama 2 (Touvron et al. 2023, Table 1 and the released configs) and Llama 3 (Llama Team,
Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3 and the released configs):
RMSNorm, SwiGLU MLP, RoPE, no biases, untied embeddings; Llama 3 with a 128256-token
vocabulary, RoPE base 500000 and 8 kv heads.

PTD-P (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", Table 1): GPT models with sequence 2048 and vocabulary 51200,
named by their published parameter count.

BLOOM (BigScience 2022, "BLOOM: A 176B-Parameter Open-Access Multilingual Language Model",
Table 1 and the released config): 70 layers of width 14336 with 112 heads, GELU MLP of
4·d_model, biases, tied embeddings, a vocabulary padded to 250880 for tensor parallelism,
context 2048, no dropout. Its ALiBi attention biases are no parameters (``position="none"``);
the LayerNorm after its embedding is not modelled, 28,672 parameters (2·d_model) short of the
published 176,247,271,424.

Dropout 0.1 on the GPT-style presets is Megatron-LM's default (``--hidden-dropout`` and
``--attention-dropout``), the setting of Korthikanti et al. 2022's activation accounting; the
Llama configs train without dropout.

>>> get("llama3-8b").param_count()
8030261248
>>> "gpt-tiny" in names()
True
"""

from __future__ import annotations

from ..errors import ConfigError
from .config import TransformerConfig


def _gpt3(name: str, layers: int, d_model: int, heads: int, head_dim: int | None = None) -> TransformerConfig:
    return TransformerConfig(
        layers=layers,
        d_model=d_model,
        heads=heads,
        head_dim=head_dim,
        d_ff=4 * d_model,
        vocab=50257,
        seq=2048,
        bias=True,
        tie_embeddings=True,
        dropout=0.1,
        name=name,
    )


def _llama(
    name: str, layers: int, d_model: int, heads: int, kv_heads: int, d_ff: int, vocab: int, seq: int, theta: float
) -> TransformerConfig:
    return TransformerConfig(
        layers=layers,
        d_model=d_model,
        heads=heads,
        kv_heads=kv_heads,
        d_ff=d_ff,
        vocab=vocab,
        seq=seq,
        mlp="swiglu",
        norm="rmsnorm",
        position="rope",
        rope_theta=theta,
        name=name,
    )


def _ptdp(name: str, heads: int, d_model: int, layers: int) -> TransformerConfig:
    return _gpt3(name, layers, d_model, heads).scaled(vocab=51200, name=name)


_PRESETS: dict[str, TransformerConfig] = {
    # Brown et al. 2020, Table 2.1 (n_params, n_layers, d_model, n_heads, d_head). The XL row's
    # 24 heads of 128 (3072) do not fit d_model 2048; its 1.3B counts projections of width
    # d_model, which 16 heads of 128 give. 13B's 40 heads of 128 are 5120 wide beside d_model 5140.
    "gpt3-125m": _gpt3("gpt3-125m", 12, 768, 12),
    "gpt3-350m": _gpt3("gpt3-350m", 24, 1024, 16),
    "gpt3-760m": _gpt3("gpt3-760m", 24, 1536, 16),
    "gpt3-1.3b": _gpt3("gpt3-1.3b", 24, 2048, 16),
    "gpt3-2.7b": _gpt3("gpt3-2.7b", 32, 2560, 32),
    "gpt3-6.7b": _gpt3("gpt3-6.7b", 32, 4096, 32),
    "gpt3-13b": _gpt3("gpt3-13b", 40, 5140, 40, head_dim=128),
    "gpt3-175b": _gpt3("gpt3-175b", 96, 12288, 96),
    # Touvron et al. 2023 (Llama 2), Table 1 and config.json of the released weights
    "llama2-7b": _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, 10000.0),
    "llama2-70b": _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, 10000.0),
    # Dubey et al. 2024 (Llama 3), Table 3 and config.json of the released weights
    "llama3-8b": _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 500000.0),
    "llama3-70b": _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 500000.0),
    "llama3-405b": _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192, 500000.0),
    # Narayanan et al. 2021, Table 1 (heads, hidden size, layers)
    "ptdp-1.7b": _ptdp("ptdp-1.7b", 24, 2304, 24),
    "ptdp-3.6b": _ptdp("ptdp-3.6b", 32, 3072, 30),
    "ptdp-7.5b": _ptdp("ptdp-7.5b", 32, 4096, 36),
    "ptdp-18.4b": _ptdp("ptdp-18.4b", 48, 6144, 40),
    "ptdp-39.1b": _ptdp("ptdp-39.1b", 64, 8192, 48),
    "ptdp-76.1b": _ptdp("ptdp-76.1b", 80, 10240, 60),
    "ptdp-145.6b": _ptdp("ptdp-145.6b", 96, 12288, 80),
    "ptdp-310.1b": _ptdp("ptdp-310.1b", 128, 16384, 96),
    "ptdp-529.6b": _ptdp("ptdp-529.6b", 128, 20480, 105),
    "ptdp-1t": _ptdp("ptdp-1t", 160, 25600, 128),
    # BigScience 2022 (BLOOM), Table 1 and config.json of the released weights
    "bloom-176b": TransformerConfig(
        layers=70,
        d_model=14336,
        heads=112,
        d_ff=4 * 14336,
        vocab=250880,
        seq=2048,
        bias=True,
        tie_embeddings=True,
        position="none",
        name="bloom-176b",
    ),
    # small enough to run exactly and check against finite differences
    "gpt-tiny": TransformerConfig(
        layers=2, d_model=32, heads=4, d_ff=128, vocab=64, seq=16, bias=True, tie_embeddings=True, name="gpt-tiny"
    ),
    "llama-tiny": _llama("llama-tiny", 2, 32, 4, 2, 96, 64, 16, 10000.0),
    "moe-tiny": TransformerConfig(  # llama-tiny's attention, 4 GELU experts per block (GShard's top-2)
        layers=2,
        d_model=32,
        heads=4,
        kv_heads=2,
        d_ff=64,
        vocab=64,
        seq=16,
        norm="rmsnorm",
        position="rope",
        experts=4,
        top_k=2,
        name="moe-tiny",
    ),
}


def names() -> list[str]:
    """The preset names, in the order above (GPT-3, Llama 2, Llama 3, PTD-P, BLOOM, tiny).

    >>> names()[:2]
    ['gpt3-125m', 'gpt3-350m']
    """
    return list(_PRESETS)


def get(name: str) -> TransformerConfig:
    """The preset called ``name``; change it with :meth:`TransformerConfig.scaled`.

    >>> cfg = get("gpt3-175b")
    >>> cfg.layers, cfg.d_model, cfg.heads, cfg.param_count()
    (96, 12288, 96, 174604259328)
    """
    try:
        return _PRESETS[name]
    except KeyError:
        raise ConfigError(f"no model preset {name!r}; the presets are {names()}") from None
