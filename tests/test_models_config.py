"""The transformer configuration: validation, the weight list, and the presets' published counts."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

import shardsim
from shardsim.errors import ConfigError
from shardsim.models import TransformerConfig, get, names

TINY = {"layers": 2, "d_model": 32, "heads": 4, "d_ff": 64, "vocab": 50, "seq": 8}


def gpt_closed_form(layers: int, h: int, vocab: int, seq: int) -> int:
    """GPT with biases, LayerNorm, learned positions, tied embeddings, d_ff = 4h, N·H = h.

    Per layer: QKV and output projections 4h² + 4h, MLP 8h² + 5h, two LayerNorms 4h; then the
    token and position embeddings (V + s)h and the final LayerNorm 2h.
    """
    return layers * (12 * h * h + 13 * h) + (vocab + seq) * h + 2 * h


def llama_closed_form(layers: int, d: int, heads: int, kv: int, ff: int, vocab: int) -> int:
    """Llama: q and o d·d each, k and v d·K·H each, three MLP matrices d·F, two RMSNorms, untied head."""
    hd = d // heads
    return layers * (2 * d * d + 2 * d * kv * hd + 3 * d * ff + 2 * d) + 2 * vocab * d + d


# -- published counts, one row per preset, with the printed figure and its rounding ------------
# Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1 (n_params column).
GPT3_TABLE_2_1 = [
    ("gpt3-125m", 125e6, 1e6),
    ("gpt3-760m", 760e6, 1e6),
    ("gpt3-1.3b", 1.3e9, 1e8),
    ("gpt3-2.7b", 2.7e9, 1e8),
    ("gpt3-6.7b", 6.7e9, 1e8),
    ("gpt3-13b", 13e9, 1e9),  # printed "13.0B": the count is 12.94B, so only whole billions agree
    ("gpt3-175b", 175e9, 1e9),  # printed "175.0B": see test_gpt3_175b_accounting
]


@pytest.mark.parametrize(("name", "published", "unit"), GPT3_TABLE_2_1)
def test_gpt3_counts_equal_brown_et_al_table_2_1(name: str, published: float, unit: float) -> None:
    cfg = get(name)
    assert round(cfg.param_count() / unit) == round(published / unit)
    if cfg.heads * cfg.hd == cfg.d_model:  # 13B's attention is 5120 wide beside d_model 5140
        assert cfg.param_count() == gpt_closed_form(cfg.layers, cfg.d_model, cfg.vocab, cfg.seq)


def test_gpt3_13b_counts_its_5120_wide_attention() -> None:
    # Table 2.1: d_model 5140, 40 heads of d_head 128, so Q, K, V, O are 5140 x 5120
    cfg = get("gpt3-13b")
    d, a = 5140, 40 * 128
    per_layer = 4 * d * a + 3 * a + d + 8 * d * d + 5 * d + 4 * d
    assert cfg.param_count() == 40 * per_layer + (50257 + 2048) * d + 2 * d == 12_936_488_380


def test_gpt3_350m_is_brown_et_al_nominal_size() -> None:
    # Table 2.1 prints 350M; the architecture it lists (24 layers, d_model 1024) has 355.9M
    # with tied embeddings, 1.7% more: the printed figure is a nominal size, not a count.
    cfg = get("gpt3-350m")
    assert cfg.param_count() == gpt_closed_form(24, 1024, 50257, 2048) == 355_871_744
    assert abs(cfg.param_count() - 350e6) / 350e6 < 0.02


def test_gpt3_175b_accounting() -> None:
    """Tied embeddings give 174.6B: PTD-P Table 2 prints 174.6B for this model, Brown et al. 175.0B.

    No accounting of the Table 2.1 architecture gives 175.0B itself: untied embeddings give
    175.2B. The tied count (GPT-2/3 tie the LM head to the token embedding) is the one both
    papers agree with, at their rounding: 174.6 to tenths, 175 to whole billions.
    """
    cfg = get("gpt3-175b")
    assert (cfg.layers, cfg.d_model, cfg.heads, cfg.hd, cfg.d_ff) == (96, 12288, 96, 128, 4 * 12288)
    assert cfg.tie_embeddings and cfg.bias and cfg.norm == "layernorm" and cfg.position == "learned"
    assert cfg.param_count() == 174_604_259_328 == gpt_closed_form(96, 12288, 50257, 2048)
    assert round(cfg.param_count() / 1e8) / 10 == 174.6  # Narayanan et al. 2021, Table 2
    assert round(cfg.param_count() / 1e9) == 175  # Brown et al. 2020, Table 2.1
    untied = cfg.scaled(tie_embeddings=False).param_count()
    assert untied - cfg.param_count() == 50257 * 12288 and round(untied / 1e8) / 10 == 175.2


# Llama 3: Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3 (layers, model dimension,
# FFN dimension, heads, 8 KV heads, RoPE base 500000); vocabulary 128256 and the counts
# 8.03B / 70.6B / 405.9B as the released checkpoints report them. Llama 2: Touvron et al. 2023,
# Table 1 and the released configs; the paper's sizes are nominal (7B, 70B), the released
# weights hold 6.74B and 68.98B.
LLAMA = [
    ("llama3-8b", (32, 4096, 32, 8, 14336, 128256), 8.03e9, 1e7),
    ("llama3-70b", (80, 8192, 64, 8, 28672, 128256), 70.6e9, 1e8),
    ("llama3-405b", (126, 16384, 128, 8, 53248, 128256), 405.9e9, 1e8),
    ("llama2-7b", (32, 4096, 32, 32, 11008, 32000), 6.74e9, 1e7),
    ("llama2-70b", (80, 8192, 64, 8, 28672, 32000), 68.98e9, 1e7),
]


@pytest.mark.parametrize(("name", "sizes", "published", "unit"), LLAMA)
def test_llama_counts_equal_published(name: str, sizes: tuple[int, ...], published: float, unit: float) -> None:
    cfg = get(name)
    assert (cfg.layers, cfg.d_model, cfg.heads, cfg.n_kv, cfg.d_ff, cfg.vocab) == sizes
    assert (cfg.mlp, cfg.norm, cfg.position) == ("swiglu", "rmsnorm", "rope")
    assert not cfg.bias and not cfg.tie_embeddings
    assert cfg.rope_theta == (500000.0 if name.startswith("llama3") else 10000.0)
    assert cfg.param_count() == llama_closed_form(*sizes)
    assert round(cfg.param_count() / unit) == round(published / unit)


def test_llama3_8b_exact() -> None:
    assert get("llama3-8b").param_count() == 8_030_261_248


# Narayanan et al. 2021 (PTD-P), Table 1: (billions, heads, hidden, layers); sequence 2048,
# vocabulary 51200; their parameter count is 12·l·h²(1 + 13/(12h) + (V+s)/(12lh)).
PTDP_TABLE_1 = [
    ("ptdp-1.7b", 1.7, 24, 2304, 24),
    ("ptdp-3.6b", 3.6, 32, 3072, 30),
    ("ptdp-7.5b", 7.5, 32, 4096, 36),
    ("ptdp-18.4b", 18.4, 48, 6144, 40),
    ("ptdp-39.1b", 39.1, 64, 8192, 48),
    ("ptdp-76.1b", 76.1, 80, 10240, 60),
    ("ptdp-145.6b", 145.6, 96, 12288, 80),
    ("ptdp-310.1b", 310.1, 128, 16384, 96),
    ("ptdp-529.6b", 529.6, 128, 20480, 105),
    ("ptdp-1t", 1008.0, 160, 25600, 128),
]


@pytest.mark.parametrize(("name", "billions", "heads", "hidden", "layers"), PTDP_TABLE_1)
def test_ptdp_counts_equal_narayanan_et_al_table_1(
    name: str, billions: float, heads: int, hidden: int, layers: int
) -> None:
    cfg = get(name)
    assert (cfg.heads, cfg.d_model, cfg.layers, cfg.seq, cfg.vocab) == (heads, hidden, layers, 2048, 51200)
    h, v, s = hidden, 51200, 2048
    their_formula = 12 * layers * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * layers * h))
    assert round(their_formula / 1e8) / 10 == billions
    # our count adds the final LayerNorm (2h), which their formula leaves out
    assert cfg.param_count() - 2 * h == pytest.approx(their_formula, rel=1e-12)
    assert round(cfg.param_count() / 1e8) / 10 == billions


def test_tiny_presets_are_small_and_cover_both_families() -> None:
    gpt, llama = get("gpt-tiny"), get("llama-tiny")
    assert (gpt.layers, gpt.d_model, gpt.heads, gpt.vocab, gpt.seq) == (2, 32, 4, 64, 16)
    assert (llama.layers, llama.d_model, llama.heads, llama.n_kv, llama.vocab, llama.seq) == (2, 32, 4, 2, 64, 16)
    assert gpt.mlp == "gelu" and llama.mlp == "swiglu" and llama.position == "rope"
    assert max(gpt.param_count(), llama.param_count()) < 50_000


def test_every_preset_is_named_as_listed() -> None:
    assert len(names()) == len(set(names()))
    assert all(get(n).name == n for n in names())
    assert {"gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b", "ptdp-1t", "gpt-tiny", "llama-tiny"} <= set(names())


def test_unknown_preset_names_the_presets() -> None:
    with pytest.raises(ConfigError, match=r"no model preset 'gpt5'.*llama3-8b"):
        get("gpt5")


# -- the weight list --------------------------------------------------------------------------
def test_param_shapes_follow_the_interface() -> None:
    cfg = TransformerConfig(**TINY, kv_heads=2, bias=True)
    s = cfg.param_shapes()
    d, n, k, h, f, v = 32, 4, 2, 8, 64, 50
    assert s["embed"] == (v, d) and s["pos_embed"] == (8, d) and s["lm_head"] == (d, v)
    assert s["layers.1.attn.wq"] == (d, n * h) and s["layers.1.attn.wk"] == s["layers.1.attn.wv"] == (d, k * h)
    assert s["layers.1.attn.wo"] == (n * h, d) and s["layers.0.attn.bq"] == (n * h,)
    assert s["layers.0.attn.bk"] == s["layers.0.attn.bv"] == (k * h,)
    assert s["layers.0.attn.bo"] == (d,) and s["layers.0.mlp.b_in"] == (f,) and s["layers.0.mlp.b_out"] == (d,)
    assert s["layers.0.mlp.w_in"] == (d, f) and s["layers.0.mlp.w_out"] == (f, d)
    assert s["layers.0.attn_norm.beta"] == s["layers.0.mlp_norm.gamma"] == s["final_norm.beta"] == (d,)
    assert cfg.param_count() == sum(math.prod(x) for x in s.values())


def test_param_shapes_options() -> None:
    s = TransformerConfig(**TINY, mlp="swiglu", norm="rmsnorm", position="rope", tie_embeddings=True).param_shapes()
    assert "pos_embed" not in s and "lm_head" not in s and "final_norm.beta" not in s
    assert s["layers.0.mlp.w_gate"] == s["layers.0.mlp.w_up"] == (32, 64) and s["layers.0.mlp.w_down"] == (64, 32)
    assert not any(".b" in k for k in s)
    assert "pos_embed" not in TransformerConfig(**TINY, position="none").param_shapes()
    wide = TransformerConfig(**TINY, head_dim=12).param_shapes()
    assert wide["layers.0.attn.wq"] == (32, 48) and wide["layers.0.attn.wo"] == (48, 32)


def test_resolved_heads() -> None:
    assert TransformerConfig(**TINY).n_kv == 4 and TransformerConfig(**TINY).hd == 8
    assert TransformerConfig(**TINY, kv_heads=1, head_dim=6).n_kv == 1
    assert TransformerConfig(**TINY, kv_heads=1, head_dim=6).hd == 6


def test_scaled_validates_and_renames() -> None:
    cfg = get("gpt3-175b").scaled(layers=2)
    assert cfg.layers == 2 and cfg.d_model == 12288 and cfg.name == "gpt3-175b(layers=2)"
    assert get("gpt3-175b").layers == 96  # frozen: the preset is untouched
    with pytest.raises(ConfigError, match="kv_heads=5"):
        get("llama3-8b").scaled(kv_heads=5)
    with pytest.raises(ConfigError, match="no field 'hidden'"):
        get("gpt-tiny").scaled(hidden=3)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"layers": 0}, r"layers must be a positive whole number, got 0"),
        ({"d_model": 2.5}, r"d_model must be a positive whole number"),
        ({"vocab": True}, r"vocab must be a positive whole number"),
        ({"seq": -1}, r"seq must be"),
        ({"kv_heads": 3}, r"heads=4 does not divide by kv_heads=3.*\[1, 2, 4\]"),
        ({"kv_heads": 0}, r"kv_heads must be a positive"),
        ({"heads": 5}, r"d_model=32 does not divide by heads=5.*head_dim"),
        ({"head_dim": 0}, r"head_dim must be"),
        ({"mlp": "relu"}, r"mlp must be one of \['gelu', 'swiglu'\], got 'relu'"),
        ({"norm": "batchnorm"}, r"norm must be one of"),
        ({"position": "alibi"}, r"position must be one of"),
        ({"position": "rope", "head_dim": 5}, r"head dimension is 5.*even"),
        ({"rope_theta": 0.0}, r"rope_theta must be a positive"),
        ({"dropout": 1.0}, r"dropout is a probability in \[0, 1\), got 1.0"),
        ({"dropout": -0.1}, r"dropout"),
        ({"norm_eps": 0}, r"norm_eps must be a positive"),
        ({"bias": 1}, r"bias must be True or False"),
    ],
)
def test_bad_config_names_the_field(changes: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words) as info:
        TransformerConfig(**{**TINY, **changes})  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError) and isinstance(info.value, shardsim.ShardsimError)


def test_models_is_reachable_from_the_package() -> None:
    assert shardsim.models.get("gpt-tiny") == get("gpt-tiny")
    assert shardsim.ConfigError is ConfigError


# -- the docs page's table is the code's ------------------------------------------------------
DOCS = Path(__file__).resolve().parents[1] / "docs" / "transformer.md"


def test_docs_preset_table_is_what_the_configs_give() -> None:
    rows = {}
    presets = DOCS.read_text(encoding="utf-8").split("\n## Presets\n", 1)[1].split("\n## ", 1)[0]
    for line in presets.splitlines():  # the page goes on to plans, whose tables name fields too
        m = re.match(r"\| `([\w.-]+)` \|(.*)\|", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    assert sorted(rows) == sorted(names())
    for name, cells in rows.items():
        c = get(name)
        numbers = [int(x.replace(",", "")) for x in cells[:9]]
        assert numbers == [c.layers, c.d_model, c.heads, c.n_kv, c.hd, c.d_ff, c.vocab, c.seq, c.param_count()], name


def test_docs_example_runs() -> None:
    code = DOCS.read_text(encoding="utf-8").split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, object] = {}
    exec(compile(code, "docs/transformer.md", "exec"), scope)
    assert isinstance(scope["loss"], float) and sorted(scope["grads"]) == sorted(scope["params"])  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rope_theta", 10**400),  # past the float range
        ("rope_theta", True),
        ("norm_eps", True),
        ("dropout", False),
        ("layers", 10**5000),  # past Python's digit limit for a repr
        ("mlp", np.array(["gelu", "swiglu"])),
        ("position", np.array([])),
    ],
    ids=lambda v: type(v).__name__,
)
def test_numbers_and_words_of_the_wrong_kind_are_config_errors(field: str, value: object) -> None:
    fields: dict[str, object] = {"layers": 1, "d_model": 8, "heads": 2, "d_ff": 8, "vocab": 11, "seq": 4, field: value}
    with pytest.raises(ConfigError, match=f"TransformerConfig.{field}"):
        TransformerConfig(**fields)  # type: ignore[arg-type]


def test_bloom_176b_counts_the_published_parameters_but_its_embedding_norm() -> None:
    # BigScience 2022, "BLOOM", §3.2: 176,247,271,424 parameters; the LayerNorm after the
    # embedding (weight and bias of d_model each) is the one piece the config leaves out.
    cfg = get("bloom-176b")
    h, v = cfg.d_model, cfg.vocab
    per_layer = 12 * h * h + 13 * h  # QKV and output (4h² + 4h), the MLP (8h² + 5h), two LayerNorms (4h)
    assert cfg.param_count() == cfg.layers * per_layer + v * h + 2 * h
    assert cfg.param_count() + 2 * h == 176_247_271_424
