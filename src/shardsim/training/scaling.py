"""Loss scaling for float16: the overflow check, the skipped step, and the dynamic scale.

float16's largest value is 65504 and its smallest normal 6.1e-5: small gradients vanish and a
scaled-up loss overflows. Mixed-precision practice (Micikevicius et al. 2018; PyTorch's
``GradScaler``, Megatron-LM's grad scalers) multiplies dOut by a scale ``S``, divides the
gradients by ``S`` before the update, and checks them first:

1. every chip looks for inf/NaN in the gradients it holds; one AllReduce of the flags over
   every mesh axis (``found_inf``, phase ``optimizer``) tells every chip whether any did;
2. if one did, no weight, moment or step count changes: the step is *skipped*, and a dynamic
   scale is multiplied by ``backoff_factor`` (halved);
3. after ``growth_interval`` good steps in a row a dynamic scale is multiplied by
   ``growth_factor`` (doubled). A static scale stays as it is; its overflowing steps are
   skipped all the same, so no NaN ever reaches the master weights.

>>> policy = DynamicLossScale(init_scale=8.0, growth_interval=2)
>>> s, scales = ScaleState(policy.init_scale), []
>>> for overflow in (True, False, False, False):
...     s = s.after(policy, overflow)
...     scales.append(s.scale)
>>> scales
[4.0, 4.0, 8.0, 8.0]
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..array import ShardedArray, from_local
from ..collectives import all_reduce
from ..errors import ShardingError
from ..layout import Dim, Layout
from ..mesh import Mesh


@dataclass(frozen=True)
class DynamicLossScale:
    """A loss scale that halves on overflow and doubles after a run of good steps.

    The defaults are ``torch.cuda.amp.GradScaler``'s: start at ``2**16``, multiply by
    ``backoff_factor = 0.5`` on a step whose gradients hold inf or NaN (the step is skipped),
    by ``growth_factor = 2`` after ``growth_interval = 2000`` good steps in a row.
    Powers of two keep the scaling exact: scaling by ``2**k`` changes no bit of a float's
    mantissa, so a step that does not overflow computes the same update at any scale.

    >>> DynamicLossScale().init_scale
    65536.0
    >>> DynamicLossScale(growth_factor=1.0)
    Traceback (most recent call last):
    ...
    shardsim.errors.ShardingError: DynamicLossScale growth_factor must be a finite number above 1, got 1.0
    """

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        check_scale(self.init_scale, "DynamicLossScale init_scale")
        growth = number(self.growth_factor, "DynamicLossScale growth_factor")
        if not (math.isfinite(growth) and growth > 1):
            raise ShardingError(f"DynamicLossScale growth_factor must be a finite number above 1, got {growth!r}")
        backoff = number(self.backoff_factor, "DynamicLossScale backoff_factor")
        if not 0 < backoff < 1:
            raise ShardingError(f"DynamicLossScale backoff_factor must be between 0 and 1 (exclusive), got {backoff!r}")
        interval = self.growth_interval
        if isinstance(interval, bool) or not isinstance(interval, (int, np.integer)) or interval < 1:
            raise ShardingError(f"DynamicLossScale growth_interval must be a whole number >= 1, got {interval!r}")


@dataclass(frozen=True)
class ScaleState:
    """The running loss scale and the good steps since it last changed."""

    scale: float
    good_steps: int = 0

    def after(self, policy: DynamicLossScale | None, overflow: bool) -> ScaleState:
        """The state after a step that did (``overflow``) or did not find inf/NaN gradients.

        A static scale (``policy`` None) never changes.

        >>> ScaleState(4.0).after(None, True)
        ScaleState(scale=4.0, good_steps=0)
        """
        if policy is None:
            return self
        if overflow:
            return ScaleState(max(self.scale * policy.backoff_factor, _SMALLEST), 0)
        if self.good_steps + 1 >= policy.growth_interval:
            grown = self.scale * policy.growth_factor
            return ScaleState(grown if math.isfinite(grown) else self.scale, 0)
        return ScaleState(self.scale, self.good_steps + 1)


_SMALLEST = 2.0**-24  # float16's smallest subnormal: a scale below it would flush every gradient to zero


def number(value: Any, what: str) -> float:
    """``value`` as a float, or :class:`~shardsim.ShardingError` naming ``what`` (bools and text are refused).

    >>> number(3, "lr")
    3.0
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ShardingError(f"{what} must be a number, got {value!r} ({type(value).__name__})")
    return float(value)


def check_scale(value: Any, what: str = "loss_scale") -> float:
    """A loss scale: a finite number above 0.

    >>> check_scale(0.0)
    Traceback (most recent call last):
    ...
    shardsim.errors.ShardingError: loss_scale must be a finite number above 0, got 0.0
    """
    scale = number(value, what)
    if not (math.isfinite(scale) and scale > 0):
        raise ShardingError(f"{what} must be a finite number above 0, got {scale!r}")
    return scale


def found_inf(grads: Iterable[ShardedArray], mesh: Mesh, label: str) -> bool:
    """Whether any chip holds an inf or NaN in ``grads``, agreed by one AllReduce over every axis.

    Each chip counts 1 if a block it holds has a non-finite value (a partial sum ``[N]{U_...}``
    of one float32 per chip); the AllReduce gives every chip the total. The trace event is
    labelled ``label`` and the outcome (``inf/NaN found: step skipped`` or ``finite``). A
    shape-only run records the same AllReduce (labelled ``label`` alone) and finds nothing.

    >>> import numpy as np, shardsim
    >>> mesh = shardsim.Mesh(X=2)
    >>> g = shardsim.shard(np.array([1.0, np.inf]), mesh, "[D_X]")
    >>> with shardsim.trace() as t:
    ...     found_inf([g], mesh, "found_inf")
    True
    >>> t.collectives(), t.events[0].label
    ([('all_reduce', ('X',))], 'found_inf: inf/NaN found, step skipped')
    """
    grads = list(grads)
    layout = Layout((Dim("N"),), tuple(mesh.axis_names))
    if any(g.is_shape_only for g in grads):  # no values to check; the program still has the AllReduce
        flag = ShardedArray(mesh, layout, (1,), np.dtype(np.float32), label="found_inf")
        all_reduce(flag, tuple(mesh.axis_names), label=label)
        return False
    nm = len(mesh.shape)
    flags = np.zeros(mesh.shape, bool)
    for g in grads:
        c = np.asarray(g.compact())
        bad = ~np.isfinite(c.reshape(c.shape[:nm] + (-1,))).all(axis=-1)  # per chip (1 where replicated)
        flags |= np.broadcast_to(bad, mesh.shape)
    label += ": inf/NaN found, step skipped" if flags.any() else ": finite"
    per_chip = from_local(flags.astype(np.float32)[..., None], mesh, layout, label="found_inf")
    total = all_reduce(per_chip, tuple(mesh.axis_names), label=label)
    return bool(np.asarray(total.to_global())[0] > 0)
