"""The optimizer step of one weight, and what puts a trainer's state back when a step fails.

:func:`update_weight` is the update of every trainer (the MLP's and the transformer's): each
chip updates the part of the optimizer state it holds (:func:`state_slice`). A step either
happens or it does not: before the first change it cannot take back, the step records an
:class:`Undo` for each state value (:func:`undo_entries`), and :func:`roll_back` restores them
if anything after it raises.

>>> import numpy as np, shardsim
>>> from shardsim.training import SGD
>>> from shardsim.training.state import owned
>>> w = owned(shardsim.shard(np.ones((2, 2)), shardsim.Mesh(X=2), "D F"), "W", "params")
>>> held = {"w": w}
>>> undo = undo_entries([(("moments", "w"), held, "w")])  # as a value the update changes in place
>>> update_weight(SGD(lr=0.5), 1, w, None, shardsim.shard(np.ones((2, 2)), w.mesh, "D F"), {}, "[D, F]")
>>> w.to_global().tolist(), roll_back(w.mesh, undo), w.to_global().tolist()
([[0.5, 0.5], [0.5, 0.5]], None, [[1.0, 1.0], [1.0, 1.0]])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..array import ShardedArray
from ..layout import Layout
from ..mesh import Mesh
from ..ops import cast
from ..resharding import local_slice
from .optim import Optimizer
from .state import owned

# Where each value of a trainer's state lives: its path in Trainer.state(), the dict holding it, its key there.
Slots = Sequence[tuple[tuple[str, ...], dict[str, Any], str]]


def state_slice(w: ShardedArray, layout: str) -> ShardedArray:
    """The part of weights ``w`` each chip updates: ``w`` itself, or under ZeRO-1/2 its slice of the
    optimizer state's ``layout`` (a local slice, no communication; the weights are their own master).

    >>> import numpy as np, shardsim
    >>> w = shardsim.shard(np.ones((4, 2)), shardsim.Mesh(X=2), "D F")
    >>> state_slice(w, "[D_X, F]").layout
    Layout('[D_X, F]')
    """
    want = Layout.parse(layout, w.mesh.axis_names)
    for d, (have, need) in enumerate(zip(w.layout.dims, want.dims)):
        extra = need.axes[len(have.axes) :]
        if extra:
            w = local_slice(w, extra, d)
    return w


def update_weight(
    opt: Optimizer,
    step: int,
    w: ShardedArray,
    master: ShardedArray | None,
    grad: ShardedArray,
    moments: Mapping[str, ShardedArray],
    layout: str,
    *,
    scale: float = 1.0,
    gathered: bool = False,
    sent: str = "params",
) -> ShardedArray | None:
    """The optimizer step of one weight ``w``, whose optimizer state lives in ``layout``.

    Each chip updates what it holds of the state: the float32 ``master`` (mixed precision),
    else ``w`` itself or, when ``layout`` splits it further (ZeRO-1/2), its slice of ``w``.
    ``grad`` (reduced; divided by ``scale`` here) is cut to ``layout`` first, a local slice.
    With ``gathered`` (ZeRO-1/2) the updated slice is returned in ``w``'s dtype for the
    caller's AllGather (in ledger category ``sent``); else ``w`` is updated in place (its 16-bit copy refreshed from the
    master) and None returned.

    >>> import numpy as np, shardsim
    >>> from shardsim.training import SGD
    >>> mesh = shardsim.Mesh(X=2)
    >>> w = owned(shardsim.shard(np.ones((2, 2)), mesh, "D F"), "W", "params")
    >>> g = shardsim.shard(np.ones((2, 2)), mesh, "D F")
    >>> new = update_weight(SGD(lr=0.5), 1, w, None, g, {}, "[D_X, F]", gathered=True)
    >>> new.layout, new.to_global().tolist()
    (Layout('[D_X, F]'), [[0.5, 0.5], [0.5, 0.5]])
    """
    target = master
    if target is None:
        mine = state_slice(w, layout)
        target = w if mine is w else owned(mine, w.label, sent)
        del mine
    grad = state_slice(grad, layout)
    if not grad.is_shape_only:
        g = grad.compact()
        if scale != 1:
            g = g.astype(target.dtype) * target.dtype.type(1.0 / scale)
        opt.update(target.compact(), g, {s: m.compact() for s, m in moments.items()}, step)
        del g
    del grad
    if gathered:
        return target if master is None else cast(target, w.dtype, category=sent, label=w.label)
    if master is not None and not target.is_shape_only:  # refresh the 16-bit copy of the master
        np.copyto(w.compact(), target.compact(), casting="unsafe")
    return None


@dataclass
class Undo:
    """One state value as it was before a step changed it: the value itself and a copy of its
    blocks (changed in place), or what rebuilds it (``spec`` and its untouched ``data``: replaced).

    >>> Undo({}, "w", None, None, 0, None).key
    'w'
    """

    holder: dict[str, Any]
    key: str
    value: ShardedArray | None
    spec: tuple[Any, ...] | None
    uid: int
    data: np.ndarray | None


def undo_entries(slots: Slots) -> list[Undo]:
    """What puts a ZeRO-1/2 trainer's state back: a copy of each value the update changes in
    place (moments, masters); for the weights (paths under ``params``), which the AllGather
    replaces, their untouched blocks.

    >>> import numpy as np, shardsim
    >>> w = shardsim.shard(np.ones(2), shardsim.Mesh(X=2), "[N]")
    >>> [u.value is None for u in undo_entries([(("params", "w"), {"w": w}, "w"), (("master", "w"), {"w": w}, "w")])]
    [True, False]
    """
    entries = []
    for path, holder, key in slots:
        value = holder[key]
        data = None if value.is_shape_only else value.compact()
        if path[0] == "params":
            spec = (value.mesh, value.layout, value.global_shape, value.dtype, value.label, value.category,
                    value.holders)  # fmt: skip
            entries.append(Undo(holder, key, None, spec, value.uid, data))
        else:
            entries.append(Undo(holder, key, value, None, value.uid, None if data is None else data.copy()))
    return entries


def roll_back(mesh: Mesh, undo: list[Undo]) -> None:
    """Put every state value back as its :class:`Undo` recorded it.

    >>> import shardsim
    >>> roll_back(shardsim.Mesh(X=2), [])
    """
    ledger = mesh.memory
    capacity, ledger.capacity = ledger.capacity, None  # the values put back held these bytes before the step
    try:
        for u in undo:
            if u.value is not None:
                u.holder[u.key] = u.value
                if u.data is not None:
                    np.copyto(u.value.compact(), u.data)
            elif u.holder.get(u.key) is None or u.holder[u.key].uid != u.uid:
                u.holder[u.key] = None  # release the new value before the old one is rebuilt
                assert u.spec is not None
                m, layout, shape, dtype, label, category, holders = u.spec
                u.holder[u.key] = ShardedArray(
                    m, layout, shape, dtype, u.data, label=label, category=category, holders=holders
                )
    finally:
        ledger.capacity = capacity
