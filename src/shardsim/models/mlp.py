"""The seeds' MLP as a model: the sizes every registered MLP scheme runs, one description.

``MLP(d_model, d_ff, layers, activation)`` is ``layers`` blocks ``Out = act(In @ W_in) @ W_out``;
``norm=True`` puts Megatron's LayerNorm in front of each and adds the input back (the block
of ``tp_ln`` and ``tp_sp``); ``experts > 0`` makes each block a mixture of ``experts``
experts, each token going to its ``top_k`` (the block of ``ep`` and ``dp_ep``). Which weights a
scheme holds, and their shapes, is :func:`shardsim.strategies.weights_of`'s to say: it reads
them off the scheme's own layouts.

>>> m = MLP(d_model=8192, d_ff=32768, layers=14)
>>> m.param_count() / 1e9
7.516192768
>>> MLP(d_model=8, d_ff=16, experts=4).param_count()
1056
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..activations import get as get_activation
from ..errors import ConfigError


@dataclass(frozen=True)
class MLP:
    """A stack of MLP blocks; see the module docstring.

    >>> MLP(4, 8).scaled(layers=2)
    MLP(d_model=4, d_ff=8, layers=2, activation='identity', norm=False, experts=0, top_k=2)
    """

    d_model: int
    d_ff: int
    layers: int = 1
    activation: str = "identity"
    norm: bool = False
    experts: int = 0
    top_k: int = 2

    def __post_init__(self) -> None:
        for name in ("d_model", "d_ff", "layers", "top_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"MLP.{name} must be a positive whole number, got {v!r}")
        if isinstance(self.experts, bool) or not isinstance(self.experts, int) or self.experts < 0:
            raise ConfigError(f"MLP.experts is the number of experts (0: a dense MLP), got {self.experts!r}")
        if self.experts and self.top_k > self.experts:
            raise ConfigError(
                f"MLP.top_k={self.top_k} is more than its {self.experts} experts; choose top_k <= experts"
            )
        if self.experts and self.norm:
            raise ConfigError("MLP: norm=True (Megatron's LayerNorm block) and experts > 0 do not combine; pick one")
        get_activation(self.activation)

    @property
    def sizes(self) -> dict[str, int]:
        """The size of each dimension letter a scheme's layouts use: D, F and E."""
        return {"D": self.d_model, "F": self.d_ff, "E": max(self.experts, 1)}

    def param_count(self) -> int:
        """Weights of all blocks: ``2 D F`` per dense block (plus ``2 D`` for the norm), ``E (2 D F) + D E`` per MoE."""
        dense = 2 * self.d_model * self.d_ff
        if self.experts:
            per = self.experts * dense + self.d_model * self.experts
        else:
            per = dense + (2 * self.d_model if self.norm else 0)
        return self.layers * per

    def scaled(self, **changes: Any) -> MLP:
        """A copy with some fields changed (checked again)."""
        return dataclasses.replace(self, **changes)
