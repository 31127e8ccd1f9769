"""Roofline: a matmul takes the longer of its FLOPs time and its HBM time (SB ``roofline.md``).

``T = max(flops / C, hbm_bytes / W_hbm)``; the arithmetic intensity ``flops / hbm_bytes``
against the chip's critical intensity ``C / W_hbm`` says which one binds. Calibrated
(:mod:`~shardsim.cost.efficiency`), C is the achieved rate at this intensity: small and
skinny matmuls reach less of the peak than large ones.

>>> from shardsim.cost import get_hardware, matmul_time
>>> v5e = get_hardware("tpu-v5e")
>>> B, D, F = 128, 8192, 32768  # a bf16 [B, D] @ [D, F] with a small batch
>>> r = matmul_time(2 * B * D * F, 2 * (B * D + D * F + B * F), v5e)
>>> r.bound, round(r.intensity)
('memory', 126)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .efficiency import IDEAL, Efficiency
from .hardware import Hardware


@dataclass(frozen=True)
class Roofline:
    """``seconds = max(flops_s, memory_s)``; ``intensity`` in FLOPs per HBM byte."""

    seconds: float
    flops_s: float
    memory_s: float
    intensity: float

    @property
    def bound(self) -> str:
        """``"compute"`` or ``"memory"``: which side of the roofline the matmul sits on."""
        return "memory" if self.memory_s > self.flops_s else "compute"


def matmul_time(
    flops: float, hbm_bytes: float, hardware: Hardware, dtype: Any = "bfloat16", efficiency: Efficiency = IDEAL
) -> Roofline:
    """Roofline time of a matmul doing ``flops`` and moving ``hbm_bytes`` through HBM.

    >>> from shardsim.cost import get_hardware, resolve_efficiency
    >>> h100 = get_hardware("h100")
    >>> big = matmul_time(2 * 8192**3, 6 * 8192**2, h100, efficiency=resolve_efficiency(h100, "calibrated", []))
    >>> round(2 * 8192**3 / big.seconds / 1e12)  # achieved TFLOP/s of an 8192^3 bf16 matmul
    762
    """
    intensity = flops / hbm_bytes if hbm_bytes else float("inf")
    flops_s = flops / (hardware.flops(dtype) * efficiency.matmul_fraction(intensity, dtype)) if flops else 0.0
    memory_s = hbm_bytes / hardware.hbm_bandwidth
    return Roofline(max(flops_s, memory_s), flops_s, memory_s, intensity)


def matmul_critical_batch(
    hardware: Hardware, d_model: int, d_ff: int, dtype: Any = "bfloat16", itemsize: int = 2
) -> float:
    """The batch B above which ``[B, D] @ [D, F]`` is compute-bound, solved on :func:`matmul_time`.

    For B << D, F this tends to the critical intensity (SB ``roofline.md``: B > 240 on v5e).

    >>> from shardsim.cost import get_hardware
    >>> round(matmul_critical_batch(get_hardware("tpu-v5e"), 1 << 20, 1 << 20))
    243
    """

    def slack(b: float) -> float:
        r = matmul_time(2 * b * d_model * d_ff, itemsize * (b * d_model + d_model * d_ff + b * d_ff), hardware, dtype)
        return r.memory_s - r.flops_s

    lo, hi = 0.0, 1.0
    while slack(hi) > 0:
        lo, hi = hi, hi * 2
        if hi > 1e12:
            return float("inf")
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if slack(mid) > 0 else (lo, mid)
    return hi
