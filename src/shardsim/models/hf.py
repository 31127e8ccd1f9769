"""A :class:`TransformerConfig` from a Hugging Face ``config.json``, and back.

Every open model ships its architecture as a ``config.json``; :func:`from_hf_config` reads it
for the families a :class:`TransformerConfig` expresses exactly: ``gpt2`` (GPT-2), ``llama``
(Llama 2 and 3) and ``mistral`` (without a sliding window). Every field that changes the
computation is read (sizes, heads and key-value heads, ``head_dim``, the vocabulary, tied
embeddings, the rotary base, the norm's epsilon, biases, the activation, dropout); one it
cannot honour (``sliding_window``, a ``rope_scaling`` type, biases on some layers only, an
unknown field) is refused by name with a :class:`~shardsim.errors.ConfigError`, never
ignored. Fields that do not change the step (token ids, the saved dtype, the library version)
are read past. JSON only: no network, no weights, no ``transformers`` import.
:func:`to_hf_config` writes the fields back.

>>> cfg = from_hf_config({
...     "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
...     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
...     "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
...     "rms_norm_eps": 1e-05, "hidden_act": "silu", "tie_word_embeddings": False,
... }, name="llama3-8b")
>>> cfg.param_count()  # Llama 3 8B
8030261248
>>> from_hf_config(to_hf_config(cfg), name="llama3-8b") == cfg
True
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .config import TransformerConfig

#: The ``model_type`` values read.
FAMILIES = ("gpt2", "llama", "mistral")

# fields that do not change one training step's computation: read past
_INERT = frozenset({
    "architectures", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype",
    "transformers_version", "initializer_range", "use_cache", "_name_or_path", "model_type",
    "auto_map", "quantization_config", "attn_implementation", "_attn_implementation",
    "task_specific_params", "id2label", "label2id", "output_attentions", "output_hidden_states",
    "return_dict", "problem_type", "tokenizer_class", "prefix", "decoder_start_token_id",
    "is_encoder_decoder", "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id",
})  # fmt: skip
# GPT-2's sequence-classification head's fields, an alias of n_positions, and an upcast that
# changes rounding only
_GPT2_INERT = frozenset({
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "n_ctx", "reorder_and_upcast_attn", "use_return_dict",
})  # fmt: skip


def from_hf_config(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    seq: int | None = None,
    dropout: float | None = None,
    name: str = "",
) -> TransformerConfig:
    """The :class:`TransformerConfig` of a Hugging Face ``config.json`` (a path or its parsed
    dict; module doc). ``seq`` is the training sequence length (default the config's
    ``max_position_embeddings`` or ``n_positions``); ``dropout`` overrides the config's dropout
    probabilities (GPT-2 drops out the embeddings too, which shardsim does not: pass
    ``dropout=0.0`` or the rate for shardsim's three sites); ``name`` the model's name (default
    the folder of a ``config.json``, the name of another file, else the family).

    >>> from_hf_config({"model_type": "mistral", "sliding_window": 4096})
    Traceback (most recent call last):
    ...
    shardsim.errors.ConfigError: config.json: sliding_window=4096: sliding-window attention is not implemented ...
    """
    fields, where = _read(source)
    path = Path(where)  # named after its folder (.../Meta-Llama-3-8B/config.json), else its file
    where_name = "" if isinstance(source, Mapping) else path.parent.name if path.name == "config.json" else path.stem
    family = fields.get("model_type")
    if family not in FAMILIES:
        raise ConfigError(
            f"{where}: model_type={family!r}: shardsim reads the families {list(FAMILIES)}; describe other "
            "models with TransformerConfig(...)"
        )
    read = _gpt2 if family == "gpt2" else _llama
    kwargs = read(fields, where, dropout)
    if seq is not None:
        kwargs["seq"] = seq
    try:
        return TransformerConfig(**kwargs, name=name or where_name or str(family))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def to_hf_config(cfg: TransformerConfig) -> dict[str, Any]:
    """The ``config.json`` fields of ``cfg`` (module doc): ``llama`` for a SwiGLU, RMSNorm,
    rotary model without biases; ``gpt2`` for a GELU, LayerNorm model with learned positions,
    biases and tied embeddings. A model neither family expresses is refused by the field that
    differs.

    >>> from shardsim.models import get
    >>> to_hf_config(get("llama2-7b"))["num_key_value_heads"]
    32
    """
    if cfg.experts:
        raise ConfigError(
            f"{cfg.name or 'model'}: experts={cfg.experts}: no Hugging Face family here has GShard's GELU experts"
        )
    if cfg.mlp == "swiglu" and cfg.norm == "rmsnorm" and cfg.position == "rope" and not cfg.bias:
        if cfg.dropout:
            raise ConfigError(
                f"{cfg.name or 'model'}: dropout={cfg.dropout}: a llama config drops out the attention probabilities "
                "only; use dropout=0.0"
            )
        return {
            "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": cfg.d_model,
            "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.layers, "num_attention_heads": cfg.heads,
            "num_key_value_heads": cfg.n_kv, "head_dim": cfg.hd, "vocab_size": cfg.vocab,
            "max_position_embeddings": cfg.seq, "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.norm_eps,
            "hidden_act": "silu", "tie_word_embeddings": cfg.tie_embeddings, "attention_bias": False,
            "mlp_bias": False, "attention_dropout": 0.0, "rope_scaling": None,
        }  # fmt: skip
    if cfg.mlp == "gelu" and cfg.norm == "layernorm" and cfg.position == "learned" and cfg.bias:
        if not cfg.tie_embeddings or cfg.hd * cfg.heads != cfg.d_model or cfg.n_kv != cfg.heads:
            raise ConfigError(
                f"{cfg.name or 'model'}: a gpt2 config ties the embeddings and has one key-value head per head of "
                "d_model / heads"
            )
        return {
            "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": cfg.d_model, "n_inner": cfg.d_ff,
            "n_layer": cfg.layers, "n_head": cfg.heads, "vocab_size": cfg.vocab, "n_positions": cfg.seq,
            "layer_norm_epsilon": cfg.norm_eps, "activation_function": "gelu_new", "resid_pdrop": cfg.dropout,
            "attn_pdrop": cfg.dropout, "embd_pdrop": 0.0, "tie_word_embeddings": True,
        }  # fmt: skip
    raise ConfigError(
        f"{cfg.name or 'model'}: mlp={cfg.mlp!r}, norm={cfg.norm!r}, position={cfg.position!r}, bias={cfg.bias}: "
        "neither the llama family (swiglu, rmsnorm, rope, no bias) nor gpt2 (gelu, layernorm, learned, bias)"
    )


def _read(source: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The config's fields and what to call it in messages (its path, or ``config.json``)."""
    if isinstance(source, Mapping):
        return dict(source), "config.json"
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError(f"from_hf_config({source!r:.60}): pass a config.json path or its parsed dict")
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e}); pass the path of a config.json") from None
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(fields, dict):
        raise ConfigError(f"{path}: a config.json is one JSON object, got {type(fields).__name__}")
    return fields, str(path)


def _need(fields: Mapping[str, Any], key: str, where: str, kind: type = int) -> Any:
    if key not in fields:
        raise ConfigError(f"{where}: {key} is missing; a {fields.get('model_type')} config.json gives it")
    value = fields[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f"{where}: {key}={value!r}: expected {kind.__name__}")
    return value


def _refuse_unknown(fields: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(fields) - known - _INERT)
    if unknown:
        raise ConfigError(
            f"{where}: {', '.join(unknown)}: not fields shardsim knows for {fields.get('model_type')}; it refuses "
            "rather than ignores what may change the computation (remove them if they do not)"
        )


def _llama(fields: Mapping[str, Any], where: str, dropout: float | None) -> dict[str, Any]:
    window = fields.get("sliding_window")
    if window is not None:
        raise ConfigError(
            f"{where}: sliding_window={window!r}: sliding-window attention is not implemented (attention here is "
            'causal over the whole sequence); use a config with "sliding_window": null'
        )
    scaling = fields.get("rope_scaling")
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, Mapping) else scaling
        raise ConfigError(
            f"{where}: rope_scaling type {kind!r}: only unscaled rotary embeddings (base rope_theta) are implemented; "
            'use "rope_scaling": null'
        )
    for key in ("attention_bias", "mlp_bias"):
        if fields.get(key, False):
            raise ConfigError(
                f"{where}: {key}=true: biases on some layers only are not expressible (TransformerConfig.bias puts "
                "one on every linear layer)"
            )
    act = fields.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{where}: hidden_act={act!r}: the llama family's MLP here is SwiGLU (silu)")
    if fields.get("pretraining_tp", 1) != 1:
        raise ConfigError(f"{where}: pretraining_tp={fields['pretraining_tp']!r}: only 1 (one matmul per weight)")
    rate = float(fields.get("attention_dropout", 0.0) or 0.0)
    if dropout is None and rate:
        raise ConfigError(
            f"{where}: attention_dropout={rate}: shardsim drops out three sites alike (attention probabilities, "
            "attention and MLP outputs); pass dropout= to choose their rate"
        )
    heads = _need(fields, "num_attention_heads", where)
    d_model = _need(fields, "hidden_size", where)
    head_dim = fields.get("head_dim")
    _refuse_unknown(fields, {
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "vocab_size", "max_position_embeddings", "rope_theta", "rms_norm_eps", "hidden_act", "tie_word_embeddings",
        "sliding_window", "rope_scaling", "max_window_layers", "use_sliding_window", "pretraining_tp", "head_dim",
        "attention_dropout", "mlp_bias", "attention_bias",
    }, where)  # fmt: skip
    if fields.get("use_sliding_window"):
        raise ConfigError(f"{where}: use_sliding_window=true: sliding-window attention is not implemented")
    return {
        "layers": _need(fields, "num_hidden_layers", where),
        "d_model": d_model,
        "heads": heads,
        "kv_heads": fields.get("num_key_value_heads") or heads,
        "head_dim": None if head_dim is None or head_dim * heads == d_model else head_dim,
        "d_ff": _need(fields, "intermediate_size", where),
        "vocab": _need(fields, "vocab_size", where),
        "seq": _need(fields, "max_position_embeddings", where),
        "mlp": "swiglu",
        "norm": "rmsnorm",
        "position": "rope",
        "rope_theta": float(fields.get("rope_theta", 10000.0)),
        "norm_eps": float(fields.get("rms_norm_eps", 1e-6)),
        "tie_embeddings": bool(fields.get("tie_word_embeddings", False)),
        "dropout": rate if dropout is None else dropout,
    }


def _gpt2(fields: Mapping[str, Any], where: str, dropout: float | None) -> dict[str, Any]:
    act = fields.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ConfigError(f"{where}: activation_function={act!r}: the GELU here is the tanh form (gelu_new)")
    if fields.get("scale_attn_by_inverse_layer_idx", False):
        raise ConfigError(f"{where}: scale_attn_by_inverse_layer_idx=true: attention here scales by 1/sqrt(head_dim)")
    if not fields.get("scale_attn_weights", True):
        raise ConfigError(f"{where}: scale_attn_weights=false: attention here scales by 1/sqrt(head_dim)")
    if not fields.get("tie_word_embeddings", True):
        raise ConfigError(f"{where}: tie_word_embeddings=false: GPT-2's head is its embedding here")
    rates = {k: float(fields.get(k, 0.1)) for k in ("resid_pdrop", "attn_pdrop", "embd_pdrop")}
    if dropout is None and (rates["embd_pdrop"] or rates["resid_pdrop"] != rates["attn_pdrop"]):
        raise ConfigError(
            f"{where}: resid_pdrop={rates['resid_pdrop']}, attn_pdrop={rates['attn_pdrop']}, "
            f"embd_pdrop={rates['embd_pdrop']}: shardsim drops out three sites alike and not the embeddings; "
            "pass dropout= (0.0 to train without) to choose their rate"
        )
    _refuse_unknown(fields, {
        "n_embd", "n_inner", "n_layer", "n_head", "vocab_size", "n_positions", "layer_norm_epsilon",
        "activation_function", "resid_pdrop", "attn_pdrop", "embd_pdrop", "tie_word_embeddings",
        "scale_attn_weights", "scale_attn_by_inverse_layer_idx", *_GPT2_INERT,
    }, where)  # fmt: skip
    d_model = _need(fields, "n_embd", where)
    return {
        "layers": _need(fields, "n_layer", where),
        "d_model": d_model,
        "heads": _need(fields, "n_head", where),
        "d_ff": fields.get("n_inner") or 4 * d_model,
        "vocab": _need(fields, "vocab_size", where),
        "seq": _need(fields, "n_positions", where),
        "mlp": "gelu",
        "norm": "layernorm",
        "position": "learned",
        "bias": True,
        "tie_embeddings": True,
        "norm_eps": float(fields.get("layer_norm_epsilon", 1e-5)),
        "dropout": rates["resid_pdrop"] if dropout is None else dropout,
    }


__all__ = ["FAMILIES", "from_hf_config", "to_hf_config"]
