"""The transformer's description: its sizes and options, and the one list of its weights.

Dimension letters as in the scaling book's transformer chapter and Korthikanti et al. 2022:
B batch, S sequence, D d_model, N query heads, K kv heads, H head dim, F d_ff, V vocab.
A pre-norm decoder block (GPT-2/3, Llama):

    x = x + drop(attn(norm1(x)) @ wo)        x = x + drop(mlp(norm2(x)))

:meth:`TransformerConfig.param_shapes` is the only place the weights are listed; the count,
the initialiser and the reference's checks all read it.

>>> cfg = TransformerConfig(layers=2, d_model=32, heads=4, d_ff=128, vocab=64, seq=16)
>>> cfg.n_kv, cfg.hd, cfg.param_count()
(4, 8, 29504)
>>> cfg.scaled(kv_heads=2).param_shapes()["layers.0.attn.wk"]
(32, 16)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .._divisors import divisors
from ..errors import ConfigError

MLPS = ("gelu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope", "none")
#: The largest value of each size field. Each is far past every published model (the deepest has
#: ~128 layers, 1/128 of the limit, which still leaves the planner's depth search its 8192; the widest
#: d_model 18432 and d_ff 73728; 128 heads; a 256k vocabulary; a 10M-token context; 2**20 experts in
#: PEER), yet small enough that every hint's divisor search and every walk over the layers ends.
LIMITS = {
    "layers": 2**14,
    "d_model": 2**20,
    "heads": 2**16,
    "kv_heads": 2**16,
    "head_dim": 2**16,
    "d_ff": 2**22,
    "vocab": 2**24,
    "seq": 2**30,
    "experts": 2**20,
    "top_k": 2**20,
}


def shown(value: Any) -> str:
    """``repr(value)`` for a message, at most 60 characters (an int past Python's digit limit has no repr)."""
    if isinstance(value, int) and value.bit_length() > 192:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"TransformerConfig.{name} must be a positive whole number, got {shown(value)}")
    if value > LIMITS[name]:
        raise ConfigError(
            f"TransformerConfig.{name}={shown(value)} is past its limit {LIMITS[name]} "
            f"(2**{LIMITS[name].bit_length() - 1}), far beyond any published model; choose {name} <= {LIMITS[name]}"
        )


def _real(value: Any) -> float | None:
    """``value`` as a finite float if it is a real number (not a bool, not past float's range), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        x = float(value)
    except OverflowError:  # an int past 1.8e308
        return None
    return x if math.isfinite(x) else None


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"TransformerConfig.{name} must be one of {list(choices)}, got {shown(value)}")


@dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer: sizes, options, and the weights they imply.

    ``kv_heads`` None means multi-head attention (K = N); fewer kv heads is grouped-query
    attention (K = 1: multi-query). ``head_dim`` None means ``d_model // heads``.
    ``position``: ``"learned"`` absolute embeddings ``pos_embed[S, D]`` added to the token
    embedding, ``"rope"`` rotary embeddings on q and k (base ``rope_theta``), or ``"none"``.
    ``bias`` puts a bias on every linear layer (GPT-2/3); ``tie_embeddings`` reads the logits
    off ``embed.T`` instead of a separate ``lm_head``. ``dropout`` is the probability of each
    of the three dropout sites (attention probabilities, attention output, MLP output).
    ``experts > 0`` makes every block's MLP a mixture of ``experts`` GELU experts, each token
    routed to its ``top_k`` by a learned router (GShard, Lepikhin et al. 2020): weights
    ``moe.router [D, E]``, ``moe.w_in [E, D, F]``, ``moe.w_out [E, F, D]``. Each sequence is one
    routing group; ``capacity_factor`` None keeps every token (each expert has a slot for every
    token of the group, so the experts' matmuls run ``E/top_k`` times the routed work), a factor
    ``f`` gives each expert ``ceil(f * top_k * seq / E)`` slots per sequence and drops the
    tokens past them in token order (GShard's and Switch's capacity; 1.25 is common).

    >>> TransformerConfig(layers=1, d_model=8, heads=3, d_ff=16, vocab=10, seq=4)
    Traceback (most recent call last):
    ...
    shardsim.errors.ConfigError: TransformerConfig.d_model=8 does not divide by heads=3, ... (e.g. 1, 2, 4, 8)
    """

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
    experts: int = 0
    top_k: int = 2
    capacity_factor: float | None = None

    def __post_init__(self) -> None:
        for field in ("layers", "d_model", "heads", "d_ff", "vocab", "seq"):
            _positive_int(field, getattr(self, field))
        if self.kv_heads is not None:
            _positive_int("kv_heads", self.kv_heads)
            if self.heads % self.kv_heads:
                raise ConfigError(
                    f"TransformerConfig.heads={self.heads} does not divide by kv_heads={self.kv_heads}: every kv head "
                    f"must serve the same number of query heads; choose kv_heads among {divisors(self.heads)}"
                )
        if self.head_dim is not None:
            _positive_int("head_dim", self.head_dim)
        elif self.d_model % self.heads:
            raise ConfigError(
                f"TransformerConfig.d_model={self.d_model} does not divide by heads={self.heads}, so the head "
                f"dimension is not whole; give head_dim explicitly or choose heads dividing d_model "
                f"(e.g. {', '.join(map(str, divisors(self.d_model, at_most=4)))})"
            )
        _choice("mlp", self.mlp, MLPS)
        _choice("norm", self.norm, NORMS)
        _choice("position", self.position, POSITIONS)
        if self.position == "rope" and self.hd % 2:
            raise ConfigError(
                f"TransformerConfig.position='rope' rotates pairs of the head dimension, which must be even; "
                f"head dimension is {self.hd}: choose an even head_dim or position='learned'"
            )
        theta, p, eps = _real(self.rope_theta), _real(self.dropout), _real(self.norm_eps)
        if theta is None or theta <= 0:
            what = shown(self.rope_theta)
            raise ConfigError(f"TransformerConfig.rope_theta must be a positive finite number, got {what}")
        if p is None or not 0.0 <= p < 1.0:
            raise ConfigError(
                f"TransformerConfig.dropout is a probability in [0, 1), got {shown(self.dropout)}; "
                "use 0.0 for no dropout"
            )
        if eps is None or eps <= 0:
            what = shown(self.norm_eps)
            raise ConfigError(f"TransformerConfig.norm_eps must be a positive finite number, got {what}")
        if isinstance(self.experts, bool) or not isinstance(self.experts, int) or self.experts < 0:
            raise ConfigError(
                f"TransformerConfig.experts is the number of experts (0: a dense MLP), got {shown(self.experts)}"
            )
        if self.experts:
            _positive_int("experts", self.experts)  # its upper limit
        if self.experts:
            _positive_int("top_k", self.top_k)
            if self.top_k > self.experts:
                raise ConfigError(
                    f"TransformerConfig.top_k={self.top_k} routes each token to more experts than the "
                    f"{self.experts} there are; choose top_k <= experts"
                )
            if self.mlp != "gelu":
                raise ConfigError(
                    f"TransformerConfig.experts={self.experts} with mlp={self.mlp!r}: the experts are GELU MLPs "
                    "(W_in, W_out); use mlp='gelu'"
                )
        if self.capacity_factor is not None:
            f = self.capacity_factor
            if not self.experts:
                raise ConfigError("TransformerConfig.capacity_factor sizes the experts' slots: give experts > 0 too")
            if (_real(f) or 0) <= 0:
                raise ConfigError(
                    f"TransformerConfig.capacity_factor is a positive number (1.25: a quarter more slots than a "
                    f"balanced load needs), or None to keep every token; got {shown(f)}"
                )
        for field in ("bias", "tie_embeddings"):
            if not isinstance(getattr(self, field), bool):
                raise ConfigError(f"TransformerConfig.{field} must be True or False, got {shown(getattr(self, field))}")

    @property
    def n_kv(self) -> int:
        """K, the number of key/value heads (``heads`` unless grouped-query).

        >>> TransformerConfig(1, 8, 4, 16, 10, 4, kv_heads=1).n_kv
        1
        """
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def hd(self) -> int:
        """H, the head dimension (``d_model // heads`` unless given).

        >>> TransformerConfig(1, 8, 4, 16, 10, 4).hd, TransformerConfig(1, 8, 4, 16, 10, 4, head_dim=6).hd
        (2, 6)
        """
        return self.d_model // self.heads if self.head_dim is None else self.head_dim

    def expert_capacity(self, seq: int) -> int | None:
        """Slots per expert per sequence of ``seq`` tokens, ``ceil(capacity_factor * top_k * seq / experts)``
        (None: every token is kept).

        >>> TransformerConfig(1, 8, 2, 16, 10, 64, experts=8, top_k=2, capacity_factor=1.25).expert_capacity(64)
        20
        """
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * self.top_k * seq / self.experts)

    def _norm_shapes(self, prefix: str) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {f"{prefix}.gamma": (self.d_model,)}
        if self.norm == "layernorm":
            shapes[f"{prefix}.beta"] = (self.d_model,)
        return shapes

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight's name and shape, in the order the forward pass meets them.

        >>> list(TransformerConfig(1, 8, 2, 16, 10, 4, mlp="swiglu", norm="rmsnorm").param_shapes())
        ... # doctest: +NORMALIZE_WHITESPACE
        ['embed', 'pos_embed', 'layers.0.attn_norm.gamma', 'layers.0.attn.wq', 'layers.0.attn.wk',
         'layers.0.attn.wv', 'layers.0.attn.wo', 'layers.0.mlp_norm.gamma', 'layers.0.mlp.w_gate',
         'layers.0.mlp.w_up', 'layers.0.mlp.w_down', 'final_norm.gamma', 'lm_head']
        """
        outer = self.outer_shapes()
        first = {k: v for k, v in outer.items() if k in ("embed", "pos_embed")}  # the forward pass meets them first
        shapes = dict(first)
        for i in range(self.layers):
            shapes.update(self.layer_shapes(i))
        shapes.update({k: v for k, v in outer.items() if k not in first})
        return shapes

    def layer_shapes(self, i: int) -> dict[str, tuple[int, ...]]:
        """Block ``i``'s weights (every block has the same ones, under its own ``layers.{i}.`` prefix).

        >>> TransformerConfig(2, 8, 2, 16, 10, 4).layer_shapes(1)["layers.1.mlp.w_in"]
        (8, 16)
        """
        d, f, p = self.d_model, self.d_ff, f"layers.{i}"
        nh, kh = self.heads * self.hd, self.n_kv * self.hd
        shapes = self._norm_shapes(f"{p}.attn_norm")
        shapes.update({f"{p}.attn.wq": (d, nh), f"{p}.attn.wk": (d, kh), f"{p}.attn.wv": (d, kh)})
        shapes[f"{p}.attn.wo"] = (nh, d)
        if self.bias:
            shapes.update({f"{p}.attn.bq": (nh,), f"{p}.attn.bk": (kh,), f"{p}.attn.bv": (kh,)})
            shapes[f"{p}.attn.bo"] = (d,)
        shapes.update(self._norm_shapes(f"{p}.mlp_norm"))
        if self.experts:  # a mixture of experts in the MLP's place (no biases: GShard's)
            e = self.experts
            shapes.update({f"{p}.moe.router": (d, e), f"{p}.moe.w_in": (e, d, f), f"{p}.moe.w_out": (e, f, d)})
        elif self.mlp == "gelu":
            shapes.update({f"{p}.mlp.w_in": (d, f), f"{p}.mlp.w_out": (f, d)})
            if self.bias:
                shapes.update({f"{p}.mlp.b_in": (f,), f"{p}.mlp.b_out": (d,)})
        else:
            shapes.update({f"{p}.mlp.w_gate": (d, f), f"{p}.mlp.w_up": (d, f), f"{p}.mlp.w_down": (f, d)})
            if self.bias:
                shapes.update({f"{p}.mlp.b_gate": (f,), f"{p}.mlp.b_up": (f,), f"{p}.mlp.b_down": (d,)})
        return shapes

    def outer_shapes(self) -> dict[str, tuple[int, ...]]:
        """The weights outside the blocks: embeddings, final norm, LM head (:meth:`param_shapes` less the blocks').

        >>> list(TransformerConfig(1, 8, 2, 16, 10, 4, position="rope").outer_shapes())
        ['embed', 'final_norm.gamma', 'final_norm.beta', 'lm_head']
        """
        shapes: dict[str, tuple[int, ...]] = {"embed": (self.vocab, self.d_model)}
        if self.position == "learned":
            shapes["pos_embed"] = (self.seq, self.d_model)
        shapes.update(self._norm_shapes("final_norm"))
        if not self.tie_embeddings:
            shapes["lm_head"] = (self.d_model, self.vocab)
        return shapes

    def param_count(self) -> int:
        """The exact number of parameters: the sum over :meth:`param_shapes`, in O(1) of the layers
        (every block holds the same weights).

        >>> TransformerConfig(1, 8, 2, 16, 10, 4, tie_embeddings=True).param_count()
        672
        """
        block = sum(math.prod(shape) for shape in self.layer_shapes(0).values())
        return sum(math.prod(shape) for shape in self.outer_shapes().values()) + self.layers * block

    def scaled(self, **changes: Any) -> TransformerConfig:
        """A copy with ``changes`` applied and validated; the name records what changed.

        >>> cfg = TransformerConfig(2, 8, 2, 16, 10, 4, name="toy")
        >>> small = cfg.scaled(layers=1)
        >>> small.layers, small.name
        (1, 'toy(layers=1)')
        """
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            fields = [f.name for f in dataclasses.fields(self)]
            raise ConfigError(f"TransformerConfig has no field {unknown[0]!r}; the fields are {fields}")
        if self.name and "name" not in changes and changes:
            changes["name"] = f"{self.name}({', '.join(f'{k}={shown(v)}' for k, v in changes.items())})"
        return dataclasses.replace(self, **changes)
