"""Hardware: one chip's FLOP/s and HBM, and the networks a mesh axis can run over.

A :class:`Hardware` names its networks, innermost first: a TPU has its ICI torus
(:class:`Torus`) and the data-center network (DCN, :class:`Switched`); a GPU has NVLink in
a node and the scale-out network across nodes (both :class:`Switched`). Which mesh axis runs
over which network is the placement (:mod:`shardsim.cost.placement`).

Every preset peak comes from the scaling book ("How to Scale Your Model") or, for the A100,
from PTD-P, and every measured efficiency (``calibration``) from a published measurement:
``docs/cost-model.md`` lists each with its source.

>>> from shardsim.cost import get_hardware
>>> v5p = get_hardware("tpu-v5p")
>>> v5p.flops() / v5p.networks["ici"].bidirectional  # the ICI operational intensity C / W_ici
2550.0
>>> int(get_hardware("h100").critical_intensity())  # FLOPs per HBM byte (SB: about 295)
295
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ..dtypes import resolve_dtype
from ..errors import CostModelError, ShardsimError
from .efficiency import Calibration

RING_MODES = ("book", "exact")
WRAP_RULES = ("full", "cube", "always", "never")


@dataclass(frozen=True)
class Torus:
    """A TPU ICI network: each hardware axis is a ring of chips joined by full-duplex links.

    ``bandwidth`` is one link's **one-way** bytes/s (the book's unidirectional figure);
    :attr:`bidirectional` is W_ici = 2 x that. ``latency`` is the per-hop T_min.
    ``dims`` hardware axes; the default placement cuts a mesh axis into rings of at most
    ``max_ring`` chips. ``wrap`` says which rings have
    wraparound links: ``"full"`` only a ring of exactly ``max_ring`` chips (v5e, v6e),
    ``"cube"`` any ring whose length is a multiple of 4 (v4p, v5p), ``"always"``, ``"never"``.
    ``pod`` is the shape of the largest slice (SB tpus.md: 16x20x28 for v5p): no hardware
    axis of a placement may be longer than the pod's, nor the slice hold more chips.

    >>> Torus(bandwidth=4.5e10).bidirectional
    90000000000.0
    >>> Torus(bandwidth=9e10, pod=(16, 20, 28)).chips
    8960
    """

    bandwidth: float
    latency: float = 1e-6
    dims: int = 3
    max_ring: int = 16
    wrap: str = "cube"
    pod: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.wrap not in WRAP_RULES:
            raise ShardsimError(f"Torus wrap rule must be one of {WRAP_RULES}, got {self.wrap!r}")
        _positive(bandwidth=self.bandwidth, max_ring=self.max_ring, dims=self.dims)
        if self.pod is not None and (len(self.pod) != self.dims or not all(n >= 1 for n in self.pod)):
            raise CostModelError(f"Torus pod {self.pod} must give {self.dims} axis lengths of at least 1")

    @property
    def chips(self) -> int | None:
        """Chips in the largest slice (None: no pod limit)."""
        return None if self.pod is None else int(math.prod(self.pod))

    @property
    def kind(self) -> str:
        return "torus"

    @property
    def bidirectional(self) -> float:
        """W_ici: both directions of a link together, what the book's AllGather formula divides by."""
        return 2 * self.bandwidth

    def has_wraparound(self, ring: int) -> bool:
        """Whether a ring of ``ring`` chips on this torus closes into a bidirectional ring.

        >>> Torus(bandwidth=4.5e10, wrap="full").has_wraparound(4)
        False
        """
        if self.wrap == "always":
            return True
        if self.wrap == "never":
            return False
        if self.wrap == "full":
            return ring == self.max_ring
        return ring % 4 == 0


@dataclass(frozen=True)
class Switched:
    """A switched network (NVLink, InfiniBand, DCN): every chip egresses ``bandwidth`` bytes/s.

    ``bandwidth`` is one chip's one-way egress into this network. ``domain`` is how many chips
    it joins (8 for NVLink in a DGX node; None for a network across the whole cluster).
    ``latency`` is the time of one step of a ring over it.

    >>> Switched(bandwidth=4.5e11, domain=8).domain
    8
    """

    bandwidth: float
    latency: float = 1e-6
    domain: int | None = None

    def __post_init__(self) -> None:
        _positive(bandwidth=self.bandwidth)
        if self.domain is not None:
            _positive(domain=self.domain)

    @property
    def kind(self) -> str:
        return "switched"


Network = Torus | Switched


@dataclass(frozen=True)
class Hardware:
    """One chip type and its networks.

    ``flops_by_dtype`` maps a dtype name to dense FLOP/s per chip (``"bfloat16"`` is
    required; other float dtypes are costed at the bf16 rate). ``hbm_bandwidth`` bytes/s,
    ``hbm_capacity`` bytes. ``networks`` maps a name to a :class:`Torus` or
    :class:`Switched`, innermost first. ``ring`` chooses the AllGather bandwidth term on
    rings with wraparound and on switched networks: ``"book"`` keeps the scaling book's
    headline form V / W (the large-ring limit), ``"exact"`` keeps the factor (N-1)/N.
    Rings without wraparound always pay (N-1)/N: that is the book's own formula for them.
    ``calibration`` holds the measured efficiencies (:mod:`~shardsim.cost.efficiency`) that
    ``efficiency="calibrated"`` uses; None: the chip has none.

    >>> hw = Hardware("toy", {"bfloat16": 1e12}, 1e11, 8e9, {"ici": Torus(bandwidth=1e9)})
    >>> hw.critical_intensity()
    10.0
    """

    name: str
    flops_by_dtype: Mapping[str, float]
    hbm_bandwidth: float
    hbm_capacity: float
    networks: Mapping[str, Network]
    ring: Literal["book", "exact"] = "book"
    host_bandwidth: float | None = None
    kind: Literal["tpu", "gpu", "custom"] = "custom"
    notes: Mapping[str, str] = field(default_factory=dict)
    calibration: Calibration | None = None

    def __post_init__(self) -> None:
        if "bfloat16" not in self.flops_by_dtype:
            raise ShardsimError(
                f"{self.name}: flops_by_dtype needs a 'bfloat16' entry, got {dict(self.flops_by_dtype)}"
            )
        if self.ring not in RING_MODES:
            raise ShardsimError(f"{self.name}: ring must be one of {RING_MODES}, got {self.ring!r}")
        if not self.networks:
            raise ShardsimError(f"{self.name}: name at least one network, e.g. {{'ici': Torus(bandwidth=9e10)}}")
        _positive(hbm_bandwidth=self.hbm_bandwidth, hbm_capacity=self.hbm_capacity)

    def flops(self, dtype: Any = "bfloat16") -> float:
        """Peak dense FLOP/s per chip for matmuls in ``dtype`` (bf16 rate for unlisted floats)."""
        try:
            name = resolve_dtype(dtype).name
        except ShardsimError:  # a dtype NumPy does not know by that name (e.g. "float8_e4m3fn")
            name = str(dtype)
        if name in self.flops_by_dtype:
            return float(self.flops_by_dtype[name])
        return float(self.flops_by_dtype["bfloat16"])

    def critical_intensity(self, dtype: Any = "bfloat16") -> float:
        """FLOPs per HBM byte above which a matmul is compute-bound: C / HBM bandwidth."""
        return self.flops(dtype) / self.hbm_bandwidth

    def network(self, name: str) -> Network:
        """The network called ``name``, or an error naming the ones this hardware has."""
        try:
            return self.networks[name]
        except KeyError:
            raise ShardsimError(f"{self.name} has no network {name!r}; it has {list(self.networks)}") from None

    def with_(self, **changes: Any) -> Hardware:
        """A copy with some fields changed, e.g. ``hw.with_(ring="exact")``."""
        return replace(self, **changes)

    def __repr__(self) -> str:
        nets = ", ".join(f"{k}={type(v).__name__}" for k, v in self.networks.items())
        return f"Hardware({self.name!r}, {self.flops():.3g} FLOP/s, HBM {self.hbm_capacity / 1e9:.0f} GB, {nets})"


def _positive(**values: float) -> None:
    for name, v in values.items():
        if not v > 0:
            raise ShardsimError(f"{name} must be positive, got {v!r}")
