"""The transformer's norms: :mod:`shardsim.strategies.norms`, the one sharded LayerNorm and RMSNorm.

The blocks call ``forward`` and ``backward`` without statistics, so a norm stores its input
only and the backward pass recomputes ``mu`` and ``rstd`` from it (Korthikanti et al. 2022:
2sbh per norm). The single-device norms of the reference are :mod:`shardsim.models.reference_norm`'s.

>>> from shardsim.strategies import norms
>>> forward is norms.forward
True
"""

from __future__ import annotations

from ..strategies.norms import KINDS, Stats, backward, forward, normalized, statistics

__all__ = ["KINDS", "Stats", "backward", "forward", "normalized", "statistics"]
