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


def scatter_set(out: Any, index: tuple[Any, ...], values: Any, *, where: Any) -> Any:
    """``out`` with ``out[index[i]] = values[i]`` where ``where`` holds (the indexed places distinct);
    in place on NumPy, new where arrays are immutable (JAX: the places left out are sent out of
    bounds and dropped, so no shape depends on ``where``).

    >>> scatter_set(np.zeros(3), (np.array([2, 0]),), np.array([5.0, 7.0]), where=np.array([True, False]))
    array([0., 0., 5.])
    """
    if namespace(out) is np:
        out[tuple(i[where] for i in index)] = values[where]
        return out
    xp = namespace(out)
    first = xp.where(where, index[0], out.shape[0])  # out of bounds: dropped
    return out.at[(first, *index[1:])].set(values, mode="drop")


def causal(n: int, xp: Any = np) -> Any:
    """The ``[n, n]`` boolean mask of key position <= query position."""
    return xp.arange(n)[:, None] >= xp.arange(n)[None, :]


__all__ = ["causal", "namespace", "scatter_add", "scatter_set"]
