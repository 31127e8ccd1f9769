"""Checkpointing a trainer: its state as ShardedArrays, and a trainer continued from one.

:meth:`Checkpointed.state` lists every value a resumed run needs (weights, master weights,
optimizer moments, the step count and a dynamic loss scale's counters), each as the trainer
holds it; :meth:`Checkpointed.restore` copies such a state back, from any layout or mesh.

>>> import numpy as np, shardsim
>>> from shardsim.training import Trainer
>>> t = Trainer("ddp", shardsim.Mesh(X=2), shardsim.models.reference_mlp.init(4, 8), "adam")
>>> sorted(t.state()), sorted(t.state()["moments"])
(['moments', 'params', 'step'], ['m', 'v'])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..array import ShardedArray, shard
from ..errors import ShardingError
from ..mesh import Mesh
from .precision import Precision
from .scaling import ScaleState


class Checkpointed:
    """:meth:`state` and :meth:`restore` of a trainer, from the list of its state's values
    (``state_slots``: each value's path, the dict holding it and its key there) and its name
    (``_name``, for the errors): those of :class:`~shardsim.training.Trainer`, an MLP's or a
    transformer's.

    >>> Checkpointed.state.__name__, Checkpointed.restore.__name__
    ('state', 'restore')
    """

    mesh: Mesh
    precision: Precision
    scale: ScaleState
    step_count: int

    @property
    def _name(self) -> str:
        raise NotImplementedError

    def state_slots(self) -> Sequence[tuple[tuple[str, ...], dict[str, Any], str]]:
        """Where each value of :meth:`state` lives: its path, the dict holding it, and its key there."""
        raise NotImplementedError

    # -- checkpointing ---------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What a resumed run needs, as ShardedArrays: a state for :func:`shardsim.checkpoint.save`.

        ``{"params": P, "moments": {slot: P}, "step": [1] int64}``, plus ``"master": P`` in
        mixed precision and ``"loss_scale": [2] float64`` (the running scale and its good steps)
        with a dynamic loss scale, where ``P`` is ``{"w_in": ..., "w_out": ...}`` for one block and
        ``{"0": {...}, "1": {...}, ...}`` for a stack. Each value is held as the trainer holds
        it (weights in the scheme's layout, optimizer state in its own) and is the trainer's
        own, not a copy: save it before the next step updates it. :meth:`restore` puts it back.

        >>> import tempfile, numpy as np, shardsim
        >>> from shardsim import checkpoint
        >>> from shardsim.training import Adam, Trainer
        >>> params = shardsim.models.reference_mlp.init_stack(2, 4, 8, dtype="float64")
        >>> t = Trainer("fsdp", shardsim.Mesh(X=4), params, Adam(lr=0.1))
        >>> x = np.ones((4, 4))
        >>> _ = t.step(x, 0 * x)
        >>> s = t.state()
        >>> s["params"]["1"]["w_in"], s["moments"]["v"]["0"]["w_out"].layout, int(s["step"].to_global()[0])
        (ShardedArray(W_in.1[D_X, F] float64 (4, 8) on Mesh(X=4), local (1, 8)), Layout('[F_X, D]'), 1)
        >>> path = checkpoint.save(tempfile.mkdtemp() + "/step_1", s)
        >>> again = Trainer("fsdp", shardsim.Mesh(X=2), params, Adam(lr=0.1))  # fewer chips
        >>> again.restore(checkpoint.load(path, again.mesh))
        >>> again.step_count, bool((again.params_global()["w_in"] == t.params_global()["w_in"]).all())
        (1, True)
        """
        out: dict[str, Any] = {}
        for path, holder, key in self.state_slots():
            node = out
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = holder[key]
        out["step"] = shard(np.array([self.step_count], np.int64), self.mesh, "[N]", label="step", category="optimizer")
        if self.precision.dynamic is not None:
            running = np.array([self.scale.scale, self.scale.good_steps], np.float64)
            out["loss_scale"] = shard(running, self.mesh, "[N]", label="loss_scale", category="optimizer")
        return out

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``, as :meth:`state` returned it (or ``checkpoint.load`` read it back).

        The same names, global shapes and dtypes as this trainer's own state are required
        (else :class:`~shardsim.ShardingError`, before anything changes); the layouts and the
        mesh may differ. A value already in this trainer's layout on a mesh of this shape is
        taken block for block; any other is assembled on the host and split as this trainer
        holds it. Either way the values are copied bit for bit, and the step count with them,
        so the next :meth:`step` is the one after the saved step.

        >>> import numpy as np, shardsim
        >>> from shardsim.training import Adam, Trainer
        >>> params = shardsim.models.reference_mlp.init(4, 8, dtype="float64")
        >>> a = Trainer("zero1", shardsim.Mesh(X=2), params, Adam(lr=0.1))
        >>> b = Trainer("zero1", shardsim.Mesh(X=2), params, Adam(lr=0.1))
        >>> x = np.ones((2, 4))
        >>> _ = a.step(x, 0 * x)
        >>> b.restore(a.state())
        >>> a.step(x, 0 * x).loss == b.step(x, 0 * x).loss, b.step_count
        (True, 2)
        """
        want = {path: holder[key] for path, holder, key in self.state_slots()}
        have = _flat_state(state)
        counters = {("step",)} | ({("loss_scale",)} if self.precision.dynamic is not None else set())
        missing = sorted("/".join(p) for p in set(want) - set(have) | (counters - set(have)))
        extra = sorted("/".join(p) for p in set(have) - set(want) - counters)
        if missing or extra:
            raise ShardingError(
                f"cannot restore {self._name} trainer state: missing {missing}, unexpected {extra}; "
                "pass what Trainer.state() returns (or checkpoint.load reads back)"
            )
        step = have[("step",)]
        if step.is_shape_only or step.global_shape != (1,) or step.dtype.kind not in "iu":
            raise ShardingError(f"cannot restore the step count from {step.describe()}: expected [1] integers")
        count = int(step.to_global()[0])
        if count < 0:
            raise ShardingError(f"cannot restore a negative step count ({count})")
        scale = self.scale
        if self.precision.dynamic is not None:
            running = have[("loss_scale",)]
            if running.is_shape_only or running.global_shape != (2,) or running.dtype.kind != "f":
                raise ShardingError(
                    f"cannot restore the loss scale from {running.describe()}: expected [2] floats (scale, good steps)"
                )
            value, good = (float(v) for v in running.to_global())
            if not (np.isfinite(value) and value > 0 and good >= 0 and good == int(good)):
                raise ShardingError(f"cannot restore the loss scale {value!r} with {good!r} good steps")
            scale = ScaleState(value, int(good))
        fresh: dict[tuple[str, ...], ShardedArray] = {}
        for path, mine in want.items():
            given = have[path]
            name = "/".join(path)
            if mine.is_shape_only:
                raise ShardingError(f"cannot restore {name}: this trainer is shape-only, it holds no values")
            if given.global_shape != mine.global_shape or given.dtype != mine.dtype:
                raise ShardingError(
                    f"cannot restore {name}: this trainer holds {mine.global_shape} {mine.dtype}, "
                    f"the state has {given.global_shape} {given.dtype}"
                )
            if given.is_shape_only or given.is_partial:
                raise ShardingError(f"cannot restore {name} from {given.describe()}: need data, not a partial sum")
            same = (given.mesh.axis_names, given.mesh.shape, given.layout) == (
                mine.mesh.axis_names,
                mine.mesh.shape,
                mine.layout,
            )
            if not same:
                given = shard(given.to_global(), mine.mesh, mine.layout)
            blocks = np.array(given.compact(), order="C")  # held as every trainer holds its state
            fresh[path] = ShardedArray(
                mine.mesh,
                mine.layout,
                mine.global_shape,
                mine.dtype,
                blocks,
                label=mine.label,
                category=mine.category,
                holders=mine.holders,
            )
        del want
        for path, holder, key in self.state_slots():
            holder[key] = fresh.pop(path)
        self.step_count = count
        self.scale = scale


def _flat_state(state: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], ShardedArray]:
    """A nested state as paths to ShardedArrays."""
    if not isinstance(state, Mapping):
        raise ShardingError(f"a trainer state is a dict of names to ShardedArrays, got {type(state).__name__}")
    flat: dict[tuple[str, ...], ShardedArray] = {}
    for key, value in state.items():
        path = (*prefix, str(key))
        if isinstance(value, Mapping):
            flat.update(_flat_state(value, path))
        elif isinstance(value, ShardedArray):
            flat[path] = value
        else:
            raise ShardingError(f"trainer state {'/'.join(path)} is a {type(value).__name__}, not a ShardedArray")
    return flat
