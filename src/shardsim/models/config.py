"""The configuration of a decoder-only transformer: its sizes and its options.

>>> cfg = TransformerConfig(layers=2, d_model=8, heads=2, d_ff=32, vocab=16, seq=4)
>>> cfg.n_kv, cfg.hd, cfg.param_count()
(2, 4, 1904)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..errors import ShardingError

_CHOICES = {"mlp": ("gelu", "swiglu"), "norm": ("layernorm", "rmsnorm"), "position": ("learned", "rope", "none")}


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes (layers, d_model, heads, d_ff, vocab, seq, kv_heads, head_dim) and options of a model."""

    layers: int
    d_model: int
    heads: int
    d_ff: int
    vocab: int
    seq: int
    kv_heads: int | None = None
    head_dim: int | None = None
    mlp: str = "gelu"
    norm: str = "layernorm"
    position: str = "learned"
    rope_theta: float = 10000.0
    bias: bool = False
    tie_embeddings: bool = False
    dropout: float = 0.0
    norm_eps: float = 1e-5
    name: str = ""

    def __post_init__(self) -> None:
        for f in ("layers", "d_model", "heads", "d_ff", "vocab", "seq"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ShardingError(f"TransformerConfig.{f} must be a positive integer, got {v!r}")
        for f, allowed in _CHOICES.items():
            if getattr(self, f) not in allowed:
                raise ShardingError(f"TransformerConfig.{f}={getattr(self, f)!r}: choose one of {list(allowed)}")
        if self.heads % self.n_kv:
            raise ShardingError(f"TransformerConfig.kv_heads={self.n_kv} must divide heads={self.heads}")
        if self.head_dim is None and self.d_model % self.heads:
            raise ShardingError(f"TransformerConfig.d_model={self.d_model} must divide by heads={self.heads}")
        if self.position == "rope" and self.hd % 2:
            raise ShardingError(f"TransformerConfig.head_dim={self.hd} must be even for rope")
        if not 0.0 <= self.dropout < 1.0:
            raise ShardingError(f"TransformerConfig.dropout={self.dropout} must be in [0, 1)")

    @property
    def n_kv(self) -> int:
        """The number of key/value heads (``heads`` without grouped-query attention)."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def hd(self) -> int:
        """The head dimension H."""
        return self.d_model // self.heads if self.head_dim is None else self.head_dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight's name and shape, in order: the one list of the model's parameters."""
        d, f, v = self.d_model, self.d_ff, self.vocab
        nh, kh = self.heads * self.hd, self.n_kv * self.hd
        out: dict[str, tuple[int, ...]] = {"embed": (v, d)}
        if self.position == "learned":
            out["pos_embed"] = (self.seq, d)

        def norm(prefix: str) -> None:
            out[f"{prefix}.gamma"] = (d,)
            if self.norm == "layernorm":
                out[f"{prefix}.beta"] = (d,)

        for i in range(self.layers):
            p = f"layers.{i}"
            norm(f"{p}.attn_norm")
            out.update({f"{p}.attn.wq": (d, nh), f"{p}.attn.wk": (d, kh), f"{p}.attn.wv": (d, kh)})
            out[f"{p}.attn.wo"] = (nh, d)
            if self.bias:
                out.update({f"{p}.attn.bq": (nh,), f"{p}.attn.bk": (kh,), f"{p}.attn.bv": (kh,), f"{p}.attn.bo": (d,)})
            norm(f"{p}.mlp_norm")
            if self.mlp == "gelu":
                out.update({f"{p}.mlp.w_in": (d, f), f"{p}.mlp.w_out": (f, d)})
                if self.bias:
                    out.update({f"{p}.mlp.b_in": (f,), f"{p}.mlp.b_out": (d,)})
            else:
                out.update({f"{p}.mlp.w_gate": (d, f), f"{p}.mlp.w_up": (d, f), f"{p}.mlp.w_down": (f, d)})
        norm("final_norm")
        if not self.tie_embeddings:
            out["lm_head"] = (d, v)
        return out

    def param_count(self) -> int:
        """The exact number of parameters, from :meth:`param_shapes`."""
        return sum(math.prod(s) for s in self.param_shapes().values())

    def scaled(self, **changes: Any) -> TransformerConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
