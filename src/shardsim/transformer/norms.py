"""The transformer's norms: :mod:`shardsim.strategies.norms`, the one sharded LayerNorm and RMSNorm.

The blocks call ``forward`` and ``backward`` without statistics, so a norm stores its input
only and the backward pass recomputes ``mu`` and ``rstd`` from it (Korthikanti et al. 2022:
2sbh per norm). The single-device norms of the reference are :mod:`shardsim.models.reference_norm`'s.

>>> import numpy as np, shardsim
>>> x = shardsim.shard(np.random.default_rng(0).standard_normal((2, 3, 4)), shardsim.Mesh(X=2), "B_X S D")
>>> g = shardsim.shard(np.ones(4), x.mesh, "D")
>>> y = forward("rmsnorm", x, g, None, 1e-5)
>>> bool(np.allclose((y.to_global() ** 2).mean(-1), 1, atol=1e-4))
True
"""

from __future__ import annotations

from ..strategies.norms import KINDS, Stats, backward, forward, normalized, statistics

__all__ = ["KINDS", "Stats", "backward", "forward", "normalized", "statistics"]
