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

from ..dtypes import resolve_dtype

_NAMES = {
    "fp32": ("float32", None),
    "float32": ("float32", None),
    "fp64": ("float64", None),
    "float64": ("float64", None),
    "bf16": ("bfloat16", "float32"),
    "bfloat16": ("bfloat16", "float32"),
    "mixed": ("bfloat16", "float32"),
    "fp16": ("float16", "float32"),
    "float16": ("float16", "float32"),
}


@dataclass(frozen=True)
class Precision:
    """The dtypes of a training step.

    ``compute``: weights as the chips use them, activations and gradients. ``master``: the
    optimizer's weights and moments (None: the weights are their own master and the
    moments share their dtype). ``reduce``: the dtype gradients are summed over the
    data-parallel chips in, and so the bytes they put on the wire; by default the compute
    dtype (16 bits: the ZeRO paper's accounting). ``loss_scale`` multiplies dOut and divides
    the gradients before the update (static loss scaling, for float16's narrow range).
    """

    compute: np.dtype
    master: np.dtype | None = None
    reduce: np.dtype = None  # type: ignore[assignment]  # set in __post_init__
    loss_scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "compute", resolve_dtype(self.compute))
        if self.master is not None:
            object.__setattr__(self, "master", resolve_dtype(self.master))
        reduce = self.compute if self.reduce is None else resolve_dtype(self.reduce)
        object.__setattr__(self, "reduce", reduce)

    @classmethod
    def of(cls, spec: str | Precision, reduce: Any = None, loss_scale: float | None = None) -> Precision:
        """A policy by name: ``fp32``, ``fp64``, ``bf16`` (= ``mixed``) or ``fp16``.

        >>> Precision.of("fp16", reduce="float32").reduce.name
        'float32'
        """
        if isinstance(spec, Precision):
            base = spec
        else:
            try:
                compute, master = _NAMES[spec]
            except KeyError:
                raise ValueError(f"unknown precision {spec!r}; choose one of {sorted(_NAMES)}") from None
            base = cls(compute, master)
        return cls(
            base.compute,
            base.master,
            base.reduce if reduce is None else reduce,
            base.loss_scale if loss_scale is None else loss_scale,
        )

    @property
    def mixed(self) -> bool:
        """True when the optimizer keeps master weights apart from the compute weights."""
        return self.master is not None

    @property
    def state_dtype(self) -> np.dtype:
        """The dtype of the master weights and of the optimizer's moments."""
        return self.master if self.master is not None else self.compute

    @property
    def formula_name(self) -> str:
        """``mixed`` or ``fp32``: the name :mod:`shardsim.formulas` uses for this policy.

        >>> Precision.of("bf16").formula_name
        'mixed'
        """
        if self.mixed and self.compute.itemsize == 2 and self.master.itemsize == 4 and self.reduce.itemsize == 2:
            return "mixed"
        if not self.mixed and self.compute.itemsize == 4 and self.reduce.itemsize == 4:
            return "fp32"
        raise ValueError(f"no closed form for {self}: the formulas cover 16-bit mixed precision and plain float32")

    def __str__(self) -> str:
        master = f", master {self.master}" if self.master is not None else ""
        scale = f", loss scale {self.loss_scale:g}" if self.loss_scale != 1 else ""
        return f"compute {self.compute}{master}, reduce {self.reduce}{scale}"
