"""Estimates of several schemes at several per-chip batches on the same chips.

>>> rows = sweep(["ddp", "tp"], "h100", [1024, 4096], 8192, 32768, chips=8, efficiency="ideal")
>>> [(e.scheme, e.per_chip_batch, e.bound) for e in rows]  # doctest: +NORMALIZE_WHITESPACE
[('ddp', 1024.0, 'communication'), ('ddp', 4096.0, 'compute'),
 ('tp', 1024.0, 'compute'), ('tp', 4096.0, 'compute')]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .critical import best_split, scheme_mesh
from .efficiency import Efficiency
from .estimator import estimate
from .hardware import Hardware
from .presets import get_hardware
from .step_estimate import Estimate


def sweep(
    schemes: Sequence[str],
    hardware: Hardware | str,
    per_chip_batches: Iterable[int],
    d_model: int,
    d_ff: int,
    *,
    chips: int,
    layers: int = 1,
    overlap: bool = True,
    dtype: str = "bfloat16",
    topology: str | Sequence[int] | None = None,
    efficiency: str | Efficiency = "calibrated",
) -> list[Estimate]:
    """Estimates for every scheme at every per-chip batch on ``chips`` chips, each the one
    estimate of the scheme's MLP under its plan (:func:`~shardsim.cost.estimate`).

    ``ddp``/``fsdp`` run on ``Mesh(X=chips)``, ``tp`` on ``Mesh(Y=chips)``, ``fsdp_tp`` on the
    split ``Mesh(X=chips/Y, Y=Y)`` with the shortest step (:func:`~shardsim.cost.best_split`).

    >>> [e.scheme for e in sweep(["fsdp"], "h100", [1024], 8192, 32768, chips=8)]
    ['fsdp']
    """
    hw = get_hardware(hardware)
    opts: dict[str, Any] = {"layers": layers, "overlap": overlap, "dtype": dtype, "topology": topology}
    eff = efficiency
    out = []
    for scheme in schemes:
        for b in per_chip_batches:
            if scheme == "fsdp_tp":
                out.append(best_split(hw, b * chips, d_model, d_ff, chips=chips, efficiency=eff, **opts))
            else:
                mesh = scheme_mesh(scheme, chips)
                out.append(estimate(scheme, mesh, hw, b * chips, d_model, d_ff, efficiency=eff, **opts))
    return out


__all__ = ["sweep"]
