"""Transformer models: the configuration, published presets and the single-device reference.

>>> from shardsim.models import TransformerConfig
>>> TransformerConfig(layers=1, d_model=8, heads=2, d_ff=16, vocab=11, seq=4).hd
4
"""

from __future__ import annotations

from . import reference
from .config import TransformerConfig
from .presets import get, names

__all__ = ["TransformerConfig", "get", "names", "reference"]
