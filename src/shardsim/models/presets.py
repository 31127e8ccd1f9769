"""Published model configurations by name.

>>> get("gpt3-175b").d_model
12288
"""

from __future__ import annotations

from ..errors import ShardingError
from .config import TransformerConfig

_PRESETS = {
    "gpt-tiny": TransformerConfig(2, 16, 4, 64, 64, 8, dropout=0.1, name="gpt-tiny"),
    "gpt3-175b": TransformerConfig(96, 12288, 96, 49152, 50257, 2048, bias=True, dropout=0.1, name="gpt3-175b"),
    "llama3-8b": TransformerConfig(
        32,
        4096,
        32,
        14336,
        128256,
        8192,
        kv_heads=8,
        mlp="swiglu",
        norm="rmsnorm",
        position="rope",
        rope_theta=500000.0,
        name="llama3-8b",
    ),
}


def get(name: str) -> TransformerConfig:
    """The preset called ``name``."""
    try:
        return _PRESETS[name]
    except KeyError:
        raise ShardingError(f"unknown model {name!r}; choose one of {names()}") from None


def names() -> list[str]:
    """The presets' names."""
    return list(_PRESETS)
