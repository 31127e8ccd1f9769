"""Transformer models: the configuration, published presets, and the single-device reference.

>>> from shardsim import models
>>> cfg = models.get("gpt-tiny")
>>> cfg.layers, cfg.d_model, cfg.heads, cfg.vocab
(2, 32, 4, 64)
"""

from __future__ import annotations

from . import reference
from .config import TransformerConfig
from .mlp import MLP
from .presets import get, names

__all__ = ["MLP", "TransformerConfig", "get", "names", "reference"]
