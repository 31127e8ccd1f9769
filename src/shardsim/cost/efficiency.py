"""Efficiency: how far below peak real matmuls and collectives run, as others measured it.

Two modes. ``"ideal"`` is the scaling book's model: every matmul at peak FLOP/s (or HBM
bandwidth, whichever binds), every collective at full link bandwidth at any size; the
book's formulas and closed forms use it. ``"calibrated"`` applies each hardware preset's
measured curves (constants and sources in ``docs/cost-model.md``):

- **matmul**: achieved FLOP/s = peak x ``peak_fraction`` x I / (I + ``half_intensity``),
  I the matmul's arithmetic intensity (FLOPs per HBM byte, about the smallest dimension of a
  skinny matmul). Large matmuls reach ``peak_fraction`` (the maximum achievable matmul FLOP/s,
  MAMF); small and skinny ones less.
- **collective**: the bandwidth term of each network a collective crosses is divided by
  ``peak_fraction`` x V / (V + ``half_bytes``): the achieved bus bandwidth of a ring climbs
  with the message size V to a plateau below the link rate (nccl-tests' busbw). Rings pay
  (N-1)/N, as measured rings do, and ``launch_s`` is added once per collective; ``step_s``
  is charged per ring step over the network (a ring's latency grows with its length).
- **the kernels a trace does not time** (norms, softmax, GeLU, dropout, bias and residual
  adds, gradient accumulation): they read and write the values matmuls produce, so their time
  is bytes over HBM bandwidth, not FLOPs over peak. Each matmul is followed on the compute
  stream by ``elementwise_passes`` (k) passes over its output: ``k x output bytes / HBM
  bandwidth``. A chip's k is fitted to published end-to-end runs (``docs/calibration.md``
  says which rows); 0 where none.

A chip whose preset lacks a curve runs that part at the ideal rate and
:func:`resolve_efficiency` warns (:class:`CalibrationWarning`), naming what is missing.

>>> m = MatmulEfficiency(peak_fraction=0.8, half_intensity=100.0)
>>> round(m.fraction(100.0), 3), round(m.fraction(1e9), 3)  # half of the plateau at I = 100
(0.4, 0.8)
>>> CollectiveEfficiency(peak_fraction=0.9, half_bytes=1e6).fraction(1e6)
0.45
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import CostModelError

EFFICIENCY_MODES = ("ideal", "calibrated")


class CalibrationWarning(UserWarning):
    """Calibrated times asked of a chip that lacks some measured curve (it runs ideal there)."""


def _fraction(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and 0 < value <= 1):
        raise CostModelError(
            f"{name} = {value!r}: an efficiency is a fraction of peak, above 0 and at most 1; "
            "a measured rate above the preset's peak means the peak is wrong, fix the peak instead"
        )


def _non_negative(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
        raise CostModelError(f"{name} = {value!r} must be a finite number >= 0")


@dataclass(frozen=True)
class MatmulEfficiency:
    """Achieved over peak FLOP/s of a matmul: ``peak_fraction x I / (I + half_intensity)``.

    ``by_dtype`` overrides ``peak_fraction`` for some dtypes (fp8 reaches less of its peak);
    ``source`` says where the numbers come from.

    >>> MatmulEfficiency(1.2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    shardsim.errors.CostModelError: peak_fraction = 1.2: an efficiency is a fraction of peak, above 0 and at most 1; ...
    """

    peak_fraction: float
    half_intensity: float = 0.0
    by_dtype: Mapping[str, float] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
        _fraction("peak_fraction", self.peak_fraction)
        _non_negative("half_intensity", self.half_intensity)
        for dtype, value in self.by_dtype.items():
            _fraction(f"by_dtype[{dtype!r}]", value)

    def fraction(self, intensity: float, dtype: str = "bfloat16") -> float:
        """Achieved / peak FLOP/s at arithmetic ``intensity`` (FLOPs per HBM byte)."""
        peak = self.by_dtype.get(str(dtype), self.peak_fraction)
        if math.isinf(intensity) or self.half_intensity == 0:
            return peak
        return peak * intensity / (intensity + self.half_intensity) if intensity > 0 else 0.0


@dataclass(frozen=True)
class CollectiveEfficiency:
    """Achieved over link bandwidth of a collective moving V bytes: ``peak_fraction x V / (V + half_bytes)``.

    ``launch_s`` is a fixed time every collective pays on top (measured small-message time
    beyond the per-hop latency); ``step_s`` the latency of each step of a ring over this
    network, paid on top of the bandwidth term (NCCL's time model; 0: none).

    >>> CollectiveEfficiency(0.83, half_bytes=86e6).fraction(10e9) > 0.82
    True
    """

    peak_fraction: float
    half_bytes: float = 0.0
    launch_s: float = 0.0
    source: str = ""
    step_s: float = 0.0

    def __post_init__(self) -> None:
        _fraction("peak_fraction", self.peak_fraction)
        _non_negative("half_bytes", self.half_bytes)
        _non_negative("launch_s", self.launch_s)
        _non_negative("step_s", self.step_s)

    def fraction(self, nbytes: float) -> float:
        """Achieved / link bandwidth for an array of ``nbytes`` (V)."""
        if self.half_bytes == 0:
            return self.peak_fraction
        return self.peak_fraction * nbytes / (nbytes + self.half_bytes) if nbytes > 0 else 0.0


@dataclass(frozen=True)
class AttentionEfficiency:
    """Achieved over peak FLOP/s of a fused attention kernel (FlashAttention: the scores never
    leave the chip), ``forward`` and ``backward`` (the backward recomputes the scores); the
    measured rate at long sequences. ``source`` says where the numbers come from.

    >>> AttentionEfficiency(0.6, 1.1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    shardsim.errors.CostModelError: backward = 1.1: an efficiency is a fraction of peak, above 0 and at most 1; ...
    """

    forward: float
    backward: float
    source: str = ""

    def __post_init__(self) -> None:
        _fraction("forward", self.forward)
        _fraction("backward", self.backward)

    def fraction(self, phase: str) -> float:
        """The rate of a block in ``phase`` (a recomputed forward runs the forward kernel, a split
        backward's W pass the backward's)."""
        return self.backward if phase in ("backward", "weight") else self.forward


@dataclass(frozen=True)
class Calibration:
    """A chip's measured curves: ``matmul``, one :class:`CollectiveEfficiency` per network name,
    ``elementwise_passes``, the HBM passes the untimed kernels make over each matmul's
    output (``source`` says where from), and ``attention``, the fused attention kernel's rate
    (None: its block matmuls run on the matmul curve).

    >>> Calibration(elementwise_passes=-0.1)
    Traceback (most recent call last):
    ...
    shardsim.errors.CostModelError: elementwise_passes = -0.1 must be a finite number >= 0
    """

    matmul: MatmulEfficiency | None = None
    networks: Mapping[str, CollectiveEfficiency] = field(default_factory=dict)
    elementwise_passes: float = 0.0
    source: str = ""
    attention: AttentionEfficiency | None = None

    def __post_init__(self) -> None:
        _non_negative("elementwise_passes", self.elementwise_passes)


@dataclass(frozen=True)
class Efficiency:
    """The efficiency an estimate runs at: the mode and the curves in force (None: ideal).

    ``missing`` names the parts a calibrated chip has no curve for (they run ideal);
    ``elementwise_passes`` and ``attention`` are the chip's :class:`Calibration` values (0 and
    None when ideal).
    """

    mode: str
    matmul: MatmulEfficiency | None = None
    networks: Mapping[str, CollectiveEfficiency] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    elementwise_passes: float = 0.0
    attention: AttentionEfficiency | None = None

    @property
    def calibrated(self) -> bool:
        return self.mode == "calibrated"

    def matmul_fraction(self, intensity: float, dtype: Any = "bfloat16") -> float:
        """Achieved / peak FLOP/s for a matmul of this intensity (1 when ideal)."""
        return 1.0 if self.matmul is None else self.matmul.fraction(intensity, str(dtype))

    def untimed_s(self, output_bytes: float, hbm_bandwidth: float) -> float:
        """Seconds of the untimed kernels after a matmul writing ``output_bytes``: each of the
        ``elementwise_passes`` reads or writes the output once at ``hbm_bandwidth`` (0 when ideal).

        >>> Efficiency("calibrated", elementwise_passes=4.0).untimed_s(1e9, 2e12)  # 4 GB at 2 TB/s
        0.002
        """
        return self.elementwise_passes * output_bytes / hbm_bandwidth

    def describe(self) -> str:
        """One line: ``efficiency ideal`` or what the calibrated mode uses and lacks."""
        if not self.calibrated:
            return "efficiency ideal (peak FLOP/s, full link bandwidth)"
        parts = []
        if self.matmul is not None:
            parts.append(f"matmul up to {self.matmul.peak_fraction:.1%} of peak")
        parts += [f"{name} up to {c.peak_fraction:.1%} of link rate" for name, c in self.networks.items()]
        if self.elementwise_passes:
            parts.append(f"untimed kernels {self.elementwise_passes:.3g} HBM passes over each matmul output")
        if self.attention is not None:
            a = self.attention
            parts.append(f"fused attention {a.forward:.1%} / {a.backward:.1%} of peak forward / backward")
        text = "efficiency calibrated (" + ", ".join(parts or ["no measured curves"]) + ")"
        if self.missing:
            text += "; ideal for " + ", ".join(self.missing) + " (no measured data)"
        return text


IDEAL = Efficiency("ideal")


class Measured(Protocol):
    """What :func:`resolve_efficiency` reads of a chip (a :class:`~shardsim.cost.Hardware` is one):
    hardware presets carry their calibrations, so the calibrations sit below them.

    >>> from shardsim.cost import get_hardware
    >>> sorted(get_hardware("h100").calibration.networks)
    ['nvlink', 'scaleout']
    """

    @property
    def name(self) -> str: ...
    @property
    def networks(self) -> Mapping[str, object]: ...
    @property
    def calibration(self) -> Calibration | None: ...


def resolve_efficiency(
    hardware: Measured, efficiency: str | Efficiency = "ideal", networks: Sequence[str] | None = None
) -> Efficiency:
    """The :class:`Efficiency` of ``hardware`` in mode ``efficiency`` ("ideal" or "calibrated").

    Calibrated on a chip without some measured curve warns, naming what is missing among
    the matmuls and ``networks`` (default: all the chip's networks; an estimate passes the
    ones its placement uses).

    >>> from shardsim.cost import get_hardware
    >>> round(resolve_efficiency(get_hardware("h100"), "calibrated", ["nvlink"]).matmul.peak_fraction, 3)
    0.803
    >>> resolve_efficiency(get_hardware("h100"), "fast")
    Traceback (most recent call last):
    ...
    shardsim.errors.CostModelError: efficiency 'fast': use one of ('ideal', 'calibrated')
    """
    if isinstance(efficiency, Efficiency):
        return efficiency
    if not isinstance(efficiency, str) or efficiency not in EFFICIENCY_MODES:
        raise CostModelError(f"efficiency {efficiency!r}: use one of {EFFICIENCY_MODES}")
    if efficiency == "ideal":
        return IDEAL
    cal = hardware.calibration or Calibration()
    missing = [] if cal.matmul is not None else ["matmul"]
    used = list(hardware.networks) if networks is None else list(networks)
    missing += [name for name in used if name not in cal.networks]
    if missing:
        warnings.warn(
            CalibrationWarning(
                f"{hardware.name} has no measured efficiency for {', '.join(missing)}: those run at the "
                "ideal rate in calibrated estimates; give the curves with "
                "hw.with_(calibration=Calibration(matmul=..., networks={...}))"
            ),
            stacklevel=2,
        )
    curves = {name: cal.networks[name] for name in used if name in cal.networks}
    return Efficiency("calibrated", cal.matmul, curves, tuple(missing), cal.elementwise_passes, cal.attention)
