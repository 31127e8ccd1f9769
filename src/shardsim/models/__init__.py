"""Transformer models: the configuration, published presets, Hugging Face ``config.json`` in and
out, and the single-device reference.

>>> from shardsim import models
>>> cfg = models.get("gpt-tiny")
>>> cfg.layers, cfg.d_model, cfg.heads, cfg.vocab
(2, 32, 4, 64)
"""

from __future__ import annotations

from . import reference
from .config import TransformerConfig
from .hf import from_hf_config, to_hf_config
from .mlp import MLP
from .presets import get, names

__all__ = ["MLP", "TransformerConfig", "from_hf_config", "get", "names", "reference", "to_hf_config"]
