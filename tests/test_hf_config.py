"""Hugging Face ``config.json`` in and out: the published configs of each family read to the
published parameter counts and to the presets, round trips, and every field that cannot be
honoured refused by name.

The files in ``tests/data/hf`` are the released models' ``config.json`` fields as published
with their weights (gpt2, meta-llama/Llama-2-7b-hf, meta-llama/Meta-Llama-3-8B and
Llama-3.1-8B, mistralai/Mistral-7B-v0.1 and v0.3, Qwen/Qwen2-7B).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardsim.errors import ConfigError, ShardsimError
from shardsim.models import get, names
from shardsim.models.hf import from_hf_config, to_hf_config

DATA = Path(__file__).parent / "data" / "hf"


@pytest.mark.parametrize(
    ("file", "count"),
    [
        ("gpt2.json", 124_439_808),  # the Hugging Face model card of gpt2 (124M)
        ("llama-2-7b.json", 6_738_415_616),  # Llama-2-7b-hf's safetensors index
        ("llama-3-8b.json", 8_030_261_248),  # Meta-Llama-3-8B's safetensors index
        # by hand: embeddings 2 x 32768 x 4096; per layer q, o 4096^2, k, v 4096 x 1024, MLP
        # 3 x 4096 x 14336 and two norms; 32 layers and the final norm
        ("mistral-7b-v0.3.json", 2 * 32768 * 4096 + 32 * (2 * 4096**2 + 8192 * 1024 + 3 * 4096 * 14336 + 8192) + 4096),
    ],
)  # fmt: skip
def test_published_configs_read_to_their_published_parameter_counts(file: str, count: int) -> None:
    assert from_hf_config(DATA / file, dropout=0.0).param_count() == count


def test_the_llama_configs_are_the_presets() -> None:
    assert from_hf_config(DATA / "llama-3-8b.json", name="llama3-8b") == get("llama3-8b")
    assert from_hf_config(DATA / "llama-2-7b.json", name="llama2-7b") == get("llama2-7b")
    cfg = from_hf_config(DATA / "mistral-7b-v0.3.json", seq=4096)
    assert (cfg.kv_heads, cfg.rope_theta, cfg.seq, cfg.norm_eps) == (8, 1e6, 4096, 1e-5)


@pytest.mark.parametrize("preset", [n for n in names() if n.startswith(("llama", "gpt3")) and n != "gpt3-13b"])
def test_to_and_from_round_trip(preset: str) -> None:
    cfg = get(preset)
    assert from_hf_config(to_hf_config(cfg), name=cfg.name, dropout=cfg.dropout) == cfg
    assert json.loads(json.dumps(to_hf_config(cfg))) == to_hf_config(cfg)  # a config.json as written


def test_a_folder_or_a_path_names_the_model(tmp_path: Path) -> None:
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text((DATA / "llama-3-8b.json").read_text())
    assert from_hf_config(folder).name == "Meta-Llama-3-8B"
    assert from_hf_config(folder / "config.json") == from_hf_config(folder)
    assert from_hf_config(DATA / "llama-3-8b.json").name == "llama-3-8b"  # another file: its own name
    assert from_hf_config(json.loads((DATA / "gpt2.json").read_text()), dropout=0.0).name == "gpt2"


@pytest.mark.parametrize(
    ("file", "match"),
    [
        ("mistral-7b-v0.1.json", r"sliding_window=4096: sliding-window attention is not implemented"),
        ("llama-3.1-8b.json", r"rope_scaling type 'llama3': only unscaled rotary embeddings"),
        ("qwen2-7b.json", r"model_type='qwen2': shardsim reads the families \['gpt2', 'llama', 'mistral'\]"),
        ("gpt2.json", r"embd_pdrop=0.1: shardsim drops out three sites alike and not the embeddings; pass dropout="),
    ],
)
def test_published_configs_shardsim_cannot_honour_are_refused_by_field(file: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        from_hf_config(DATA / file)
    assert str(DATA / file) in str(err.value)  # the file named


def _llama3(**changes: object) -> dict[str, object]:
    return {**json.loads((DATA / "llama-3-8b.json").read_text()), **changes}


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"attention_bias": True}, r"attention_bias=true: biases on some layers only"),
        ({"hidden_act": "gelu"}, r"hidden_act='gelu'"),
        ({"pretraining_tp": 2}, r"pretraining_tp=2"),
        ({"attention_dropout": 0.1}, r"attention_dropout=0.1: .* pass dropout="),
        ({"qk_layernorm": True}, r"qk_layernorm: not fields shardsim knows for llama"),
        ({"hidden_size": "4096"}, r"hidden_size='4096': expected int"),
        ({"num_attention_heads": 30}, r"heads=30 does not divide by kv_heads=8"),
    ],
)
def test_fields_that_change_the_computation_are_refused_by_name(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        from_hf_config(_llama3(**changes))


def test_missing_fields_and_bad_files(tmp_path: Path) -> None:
    fields = _llama3()
    del fields["vocab_size"]
    with pytest.raises(ConfigError, match="vocab_size is missing"):
        from_hf_config(fields)
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match=r"config.json: not JSON \(.* at line 1"):
        from_hf_config(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="one JSON object, got list"):
        from_hf_config(bad)
    with pytest.raises(ConfigError, match="cannot read it"):
        from_hf_config(tmp_path / "missing.json")
    with pytest.raises(ShardsimError, match=r"pass a config\.json path or its parsed dict"):
        from_hf_config(42)  # type: ignore[arg-type]


def test_models_no_family_expresses_are_refused_on_the_way_out() -> None:
    with pytest.raises(ConfigError, match="experts=4"):
        to_hf_config(get("moe-tiny"))
    with pytest.raises(ConfigError, match="one key-value head per head"):
        to_hf_config(get("gpt3-13b"))  # 40 heads of 128 beside d_model 5140
    with pytest.raises(ConfigError, match="neither the llama family"):
        to_hf_config(get("llama3-8b").scaled(bias=True))


def test_parameter_counts_match_transformers_on_the_meta_device() -> None:
    transformers = pytest.importorskip("transformers", reason="transformers and torch are not installed here")
    torch = pytest.importorskip("torch")
    for file in ("gpt2.json", "llama-2-7b.json", "llama-3-8b.json", "mistral-7b-v0.3.json"):
        fields = json.loads((DATA / file).read_text())
        config = transformers.AutoConfig.for_model(**fields)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        assert from_hf_config(fields, dropout=0.0).param_count() == sum(p.numel() for p in model.parameters()), file


def test_the_cli_estimates_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    from shardsim.cli import main

    path = str(DATA / "llama-3-8b.json")
    ask = ["--batch-tokens", "1M", "--seq", "8192"]
    assert main(["estimate", "--hf-config", path, "--plan", "dp=2,tp=8", *ask, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["parameters"] == 8_030_261_248
    assert main(["estimate", "--model", "llama3-8b", "--plan", "dp=2,tp=8", *ask, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_s"] == record["step_s"]  # the preset's own answer
    refused = str(DATA / "mistral-7b-v0.1.json")
    assert main(["estimate", "--hf-config", refused, "--plan", "dp=2", "--batch-tokens", "64K"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "sliding_window=4096" in err and "Traceback" not in err


def test_the_cli_plans_a_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from shardsim.cli import main

    tiny = {
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 16,
    }  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny))
    ask = ["--hardware", "h100", "--chips", "2", "--batch-tokens", "64", "--seq", "16", "--top", "1", "--json"]
    assert main(["plan", "--hf-config", str(path), *ask]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    cfg = from_hf_config(path)
    from shardsim.planner import plan

    assert rows[0]["step_s"] == plan(cfg, "h100", 2, 64, 16).rows[0].step_s


def test_the_docs_page_runs() -> None:
    from doc_blocks import run_blocks

    names = run_blocks("frameworks.md")
    assert names["cfg"] == from_hf_config(DATA / "llama-3-8b.json", seq=8192)
