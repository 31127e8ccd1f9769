"""Engines: where a value's blocks live and how a kernel runs on them.

The front end (layouts, the sharded-matmul rules, every check and error, the trace and the
ledger) is one piece of code for every engine. An engine is what differs below it: the
data a :class:`~shardsim.ShardedArray` holds and the kernels ops and collectives call.

- :data:`STACKED` (the default): every chip's block stacked in one NumPy array, mesh axes
  leading (:mod:`shardsim.engines.stacked`).
- ``shardsim.engines.jax``: one device's block inside ``jax.shard_map``; collectives are
  ``jax.lax`` collectives (needs ``pip install 'shardsim[jax]'``; importing this package never
  imports JAX).

Data handed to a kernel has the mesh axes as leading dimensions (``nm`` of them) followed
by the block; ``positions`` are mesh-axis indices and ``names`` the same axes by name.

>>> import numpy as np
>>> active() is STACKED
True
>>> STACKED.all_gather(np.arange(4.0).reshape(2, 2), 1, [0], ("X",), 0).shape
(1, 4)
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from .stacked import STACKED, Engine

_active: contextvars.ContextVar[Engine] = contextvars.ContextVar("shardsim_engine", default=STACKED)


def active() -> Engine:
    """The engine the ops and collectives run their kernels on (:data:`STACKED` unless inside :func:`use`)."""
    return _active.get()


@contextlib.contextmanager
def use(engine: Engine) -> Iterator[Engine]:
    """Run the ops and collectives of the block on ``engine``.

    >>> with use(STACKED) as e:
    ...     e.name
    'stacked'
    """
    token = _active.set(engine)
    try:
        yield engine
    finally:
        _active.reset(token)


__all__ = ["STACKED", "Engine", "active", "use"]
