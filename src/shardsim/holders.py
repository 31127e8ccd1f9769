"""Which chips hold a value: the ``holders`` masks that ops, collectives and traces compare.

A value held only on some chips (one pipeline stage's activations) carries a boolean mask of
``mesh.shape``; ``None`` means every chip. These helpers read only ``holders``, ``mesh`` and
``describe()``, so the trace can name where an op ran without knowing about arrays.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .errors import ShardingError
from .mesh import Mesh


class Held(Protocol):
    """What these helpers read of a value (a :class:`~shardsim.array.ShardedArray` is one).

    >>> import numpy as np, shardsim
    >>> held_text(shardsim.shard(np.ones(2), shardsim.Mesh(Z=2), "[D]"))
    'every chip'
    """

    @property
    def holders(self) -> np.ndarray | None: ...
    @property
    def mesh(self) -> Mesh: ...
    def describe(self) -> str: ...


def held_where(*arrays: Held) -> np.ndarray | None:
    """The chips holding every one of ``arrays`` (bool, ``mesh.shape``); None when that is all chips.

    A value held only on some chips (``holders``, e.g. one pipeline stage's activations) can
    meet another only where both are: a local op's result lives there. Values with no chip
    in common raise ShardingError.

    >>> import numpy as np, shardsim
    >>> mesh = shardsim.Mesh(Z=2)
    >>> a = shardsim.shard(np.ones(2), mesh, "[D]")
    >>> held_where(a) is None
    True
    """
    masks = [a.holders for a in arrays if a.holders is not None]
    if not masks:
        return None
    held = np.logical_and.reduce(masks) if len(masks) > 1 else masks[0]
    if not held.any():
        where = "; ".join(f"{a.describe()} on {held_text(a)}" for a in arrays if a.holders is not None)
        raise ShardingError(
            f"no chip holds all of the operands ({where}); move one to the other's chips first (ppermute)"
        )
    return held


def held_text(x: Held) -> str:
    """``every chip`` or the chips holding ``x``, e.g. ``(X0,Z1) (X1,Z1)``.

    >>> import numpy as np, shardsim
    >>> held_text(shardsim.shard(np.ones(2), shardsim.Mesh(Z=2), "[D]"))
    'every chip'
    """
    if x.holders is None:
        return "every chip"
    mesh = x.mesh
    return " ".join(mesh.chip_name(dict(zip(mesh.axis_names, map(int, c)))) for c in np.argwhere(x.holders))
