"""The array namespace a block's kernels run in, and the few operations the array API lacks.

Every kernel that runs on a chip's block (activations, norms, attention, the embedding and
the loss) takes its namespace from the block: NumPy on the stacked engine, ``jax.numpy``
inside ``shard_map``. The same code runs on both, so an engine cannot change the maths.

>>> import numpy as np
>>> namespace(np.ones(2)) is np
True
>>> scatter_add(np.zeros((3, 1)), np.array([0, 2, 0]), np.ones((3, 1))).ravel()
array([2., 0., 1.])
"""

from __future__ import annotations

from typing import Any

import numpy as np


def namespace(x: Any) -> Any:
    """The array API namespace of ``x`` (NumPy for NumPy arrays and scalars)."""
    get = getattr(x, "__array_namespace__", None)
    return np if get is None else get()


def scatter_add(out: Any, index: Any, values: Any, *, where: Any = None) -> Any:
    """``out`` with ``values[i]`` added to row ``index[i]`` (repeated rows add up), only where
    ``where`` holds (all rows if None); ``out`` is updated in place on NumPy, returned new where
    arrays are immutable (JAX, whose shapes cannot depend on ``where``: the rows left out add 0)."""
    if namespace(out) is np:
        np.add.at(out, index if where is None else index[where], values if where is None else values[where])
        return out
    if where is not None:
        xp = namespace(out)
        index, values = xp.where(where, index, 0), xp.where(where[..., None], values, 0)
    return out.at[index].add(values)


def causal(n: int, xp: Any = np) -> Any:
    """The ``[n, n]`` boolean mask of key position <= query position."""
    return xp.arange(n)[:, None] >= xp.arange(n)[None, :]


__all__ = ["causal", "namespace", "scatter_add"]
