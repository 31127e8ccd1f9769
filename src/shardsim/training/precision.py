"""Precision policies: the dtypes of weights, activations, gradients, reductions and optimizer state.

Mixed precision (Micikevicius et al. 2018; ZeRO §3.1): the chips compute with 16-bit
weights, activations and gradients; the optimizer keeps float32 master weights and moments
and updates those; the 16-bit weights are a rounded copy of the masters, refreshed after
every step. Per parameter that is 2 + 2 + 12 bytes with Adam (master 4, m 4, v 4).

>>> p = Precision.of("bf16")
>>> p.compute.name, p.master.name, p.reduce.name
('bfloat16', 'float32', 'bfloat16')
>>> Precision.of("fp32").master is None  # the weights are their own master
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import FLOAT_NAMES, PRECISION_DTYPES, resolve_dtype
from ..errors import DtypeError, ShardingError
from .scaling import DynamicLossScale, check_scale


@dataclass(frozen=True)
class Precision:
    """The dtypes of a training step.

    ``compute``: weights as the chips use them, activations and gradients. ``master``: the
    optimizer's weights and moments (None: the weights are their own master and the
    moments share their dtype). ``reduce``: the dtype gradients are summed over the
    data-parallel chips in, and so the bytes they put on the wire; by default the compute
    dtype (16 bits: the ZeRO paper's accounting). ``loss_scale`` multiplies dOut and divides
    the gradients before the update, for float16's narrow range: a number (a static scale),
    or ``"dynamic"`` / a :class:`~shardsim.training.scaling.DynamicLossScale` (halved on
    overflow, doubled after a run of good steps). With float16 compute or any loss scale the
    gradients are checked for inf/NaN before the update and an overflowing step is skipped
    (:mod:`shardsim.training.scaling`).

    >>> Precision.of("fp16", loss_scale="dynamic").loss_scale
    DynamicLossScale(init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000)
    """

    compute: np.dtype
    master: np.dtype | None = None
    reduce: np.dtype = None  # type: ignore[assignment]  # set in __post_init__
    loss_scale: float | DynamicLossScale = 1.0
    moments: np.dtype | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "compute", precision_dtype(self.compute, "compute"))
        if self.master is not None:
            object.__setattr__(self, "master", precision_dtype(self.master, "master"))
        if self.moments is not None:
            object.__setattr__(self, "moments", precision_dtype(self.moments, "moments"))
        reduce = self.compute if self.reduce is None else precision_dtype(self.reduce, "reduce")
        object.__setattr__(self, "reduce", reduce)
        object.__setattr__(self, "loss_scale", _scale_policy(self.loss_scale))

    @classmethod
    def of(
        cls, spec: str | Precision, reduce: Any = None, loss_scale: float | str | DynamicLossScale | None = None
    ) -> Precision:
        """A policy by name: ``fp32``, ``fp64``, ``bf16`` (= ``mixed``) or ``fp16``.

        >>> Precision.of("fp16", reduce="float32").reduce.name
        'float32'
        """
        if isinstance(spec, Precision):
            base = spec
        elif isinstance(spec, str) and spec in PRECISION_DTYPES:
            compute, master = PRECISION_DTYPES[spec]
            base = cls(resolve_dtype(compute), None if master is None else resolve_dtype(master))
        else:
            raise ShardingError(
                f"unknown precision {spec!r}; choose one of {sorted(PRECISION_DTYPES)} "
                "or pass a shardsim.training.Precision"
            )
        return cls(
            base.compute,
            base.master,
            base.reduce if reduce is None else reduce,
            base.loss_scale if loss_scale is None else _scale_policy(loss_scale),
            base.moments,
        )

    @property
    def mixed(self) -> bool:
        """True when the optimizer keeps master weights apart from the compute weights."""
        return self.master is not None

    @property
    def dynamic(self) -> DynamicLossScale | None:
        """The dynamic loss-scale policy, or None for a static scale."""
        return self.loss_scale if isinstance(self.loss_scale, DynamicLossScale) else None

    @property
    def initial_scale(self) -> float:
        """The loss scale of the first step.

        >>> Precision.of("fp16", loss_scale=256).initial_scale, Precision.of("fp16", loss_scale="dynamic").initial_scale
        (256.0, 65536.0)
        """
        return self.loss_scale.init_scale if isinstance(self.loss_scale, DynamicLossScale) else self.loss_scale

    @property
    def checks_overflow(self) -> bool:
        """True when a step checks its gradients for inf/NaN first: float16 compute, or a loss scale.

        >>> Precision.of("fp16").checks_overflow, Precision.of("bf16").checks_overflow
        (True, False)
        """
        return self.compute == np.float16 or self.dynamic is not None or self.loss_scale != 1

    @property
    def state_dtype(self) -> np.dtype:
        """The dtype of the master weights and of the optimizer's moments."""
        return self.master if self.master is not None else self.compute

    @property
    def moment_dtype(self) -> np.dtype:
        """The dtype of the optimizer's moments: ``moments`` if given, else :attr:`state_dtype`.

        >>> Precision("bfloat16", moments="float32").moment_dtype.name
        'float32'
        """
        return self.moments if self.moments is not None else self.state_dtype

    @property
    def formula_name(self) -> str:
        """``mixed`` or ``fp32``: the name :mod:`shardsim.formulas` uses for this policy.

        >>> Precision.of("bf16").formula_name
        'mixed'
        """
        master = self.master
        if self.moment_dtype != self.state_dtype:
            raise ShardingError(f"no closed form for {self}: its moments are not in the master weights' dtype")
        if master is not None and self.compute.itemsize == 2 and master.itemsize == 4 and self.reduce.itemsize == 2:
            return "mixed"
        if not self.mixed and self.compute.itemsize == 4 and self.reduce.itemsize == 4:
            return "fp32"
        raise ShardingError(f"no closed form for {self}: the formulas cover 16-bit mixed precision and plain float32")

    def __str__(self) -> str:
        master = f", master {self.master}" if self.master is not None else ""
        if self.moments is not None and self.moments != self.state_dtype:
            master += f", moments {self.moments}"
        if self.dynamic is not None:
            scale = f", dynamic loss scale from {self.dynamic.init_scale:g}"
        else:
            scale = f", loss scale {self.loss_scale:g}" if self.loss_scale != 1 else ""
        return f"compute {self.compute}{master}, reduce {self.reduce}{scale}"


def precision_dtype(value: Any, field: str) -> np.dtype:
    """``value`` as one of a precision's dtypes: a floating-point dtype shardsim computes in.

    Training needs a real floating-point type in each role (an integer or bool gradient sum
    wraps around or saturates, a complex one has no order for the loss), so anything else is
    refused here, naming the field, before a step runs.

    >>> precision_dtype("bf16", "compute").name
    'bfloat16'
    >>> precision_dtype("int8", "reduce")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    shardsim.errors.DtypeError: Precision reduce='int8' is not a floating-point dtype; ... (e.g. reduce='float32')
    """
    dtype = resolve_dtype(value)
    if dtype.name not in FLOAT_NAMES:
        raise DtypeError(
            f"Precision {field}={dtype.name!r} is not a floating-point dtype; a precision's dtypes are one of "
            f"{list(FLOAT_NAMES)} (e.g. {field}='float32')"
        )
    return dtype


def _scale_policy(scale: Any) -> float | DynamicLossScale:
    """A loss scale as given: a number (static), ``"dynamic"`` or a :class:`DynamicLossScale`."""
    if isinstance(scale, DynamicLossScale):
        return scale
    if isinstance(scale, str):
        if scale != "dynamic":
            raise ShardingError(f"loss_scale must be a number, 'dynamic' or a DynamicLossScale, got {scale!r}")
        return DynamicLossScale()
    return check_scale(scale)
