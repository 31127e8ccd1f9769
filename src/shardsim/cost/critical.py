"""Critical batch: the tokens per chip above which a scheme is compute-bound, found on the model.

:func:`critical_batch` runs the scheme's program shape-only at a per-chip batch b, costs it
(:func:`~shardsim.cost.estimate`), and bisects on b for the point where every phase's
collectives take no longer than its matmuls (the book's test, phase by phase). Between the
two integers that bracket it, the crossing is interpolated linearly, so a bandwidth-bound
FSDP gives the book's ``C / W`` exactly. For ``fsdp_tp`` it also searches the split of the
chips between X and Y and reports the best, beside the book's closed forms
``X_opt = sqrt((B/F)(M_X/M_Y)N)`` and ``B/N > alpha^2 / (M_X M_Y F)``. The splits include
those where X and Y share a hardware axis (a sub-ring, :mod:`~shardsim.cost.placement`).

``efficiency="ideal"`` (the default: the book's quantity) or ``"calibrated"`` (measured
rates, :mod:`~shardsim.cost.efficiency`); :func:`critical_both` gives both side by side.

>>> c = critical_batch("fsdp", "tpu-v5p")  # SB training.md: 2,550 tokens per chip on one axis
>>> round(c.per_chip_batch, 1), c.mesh
(2550.0, Mesh(X=16))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import strategies
from .._divisors import divisors
from ..errors import CostModelError, ShardsimError
from ..mesh import Mesh
from ..strategies.base import ROLE_DEFAULTS
from .bound import excess_terms
from .collectives import collective_time
from .efficiency import Efficiency, resolve_efficiency
from .estimator import estimate, is_model
from .hardware import Hardware
from .placement import AxisLink, place
from .presets import get_hardware
from .step_estimate import Estimate

Links = Mapping[str, str | AxisLink] | None
Topology = str | Sequence[int] | None

ROLE_AXES = {"ddp": ("X",), "fsdp": ("X",), "tp": ("Y",), "fsdp_tp": ("X", "Y")}


@dataclass
class Critical:
    """A critical batch: ``per_chip_batch`` tokens per chip (inf: never compute-bound).

    ``mesh`` is the mesh it holds for (for ``fsdp_tp``, the best split); ``closed_form`` the
    book's formula on the same hardware numbers (None where the book's condition is not on
    the batch, as for TP); ``bandwidth`` the effective AllGather bandwidth of each mesh axis
    (``M x W_ici`` on a torus); ``x_opt`` the book's optimal FSDP size at this batch.
    """

    scheme: str
    hardware: str
    per_chip_batch: float
    mesh: Mesh
    closed_form: float | None
    bandwidth: dict[str, float]
    x_opt: float | None = None
    splits: dict[int, float] = field(default_factory=dict)
    efficiency: str = "ideal"
    placement: str = ""

    def __str__(self) -> str:
        eff = "" if self.efficiency == "ideal" else f", {self.efficiency}"
        head = f"{self.scheme} on {self.mesh} ({self.hardware}{eff}): "
        if math.isinf(self.per_chip_batch):
            text = head + "communication-bound at every batch"
        elif self.per_chip_batch < 1:  # the crossing is below one token (pp's sends grow with the batch as its matmuls)
            text = head + "compute-bound at every batch (from 1 token per chip)"
        else:
            text = head + f"compute-bound above {self.per_chip_batch:.1f} tokens per chip"
        if self.closed_form is not None:
            text += f" (closed form {self.closed_form:.1f})"
        if self.x_opt is not None:
            text += f"; book's X_opt = {self.x_opt:.1f}"
        return text


def critical_batch(
    scheme: str,
    hardware: Hardware | str,
    d_ff: int | None = None,
    *,
    d_model: int = 8192,
    chips: int | None = None,
    mesh: Mesh | Mapping[str, int] | None = None,
    links: Links = None,
    dtype: str = "bfloat16",
    max_per_chip: int = 1 << 22,
    topology: Topology = None,
    efficiency: str | Efficiency = "ideal",
) -> Critical:
    """The per-chip batch above which ``scheme`` is compute-bound on ``hardware``.

    ``d_ff`` defaults to ``4 * d_model``. Give ``mesh`` (and ``links``, ``topology``) for a
    fixed layout; otherwise ``chips`` (default: one ring of 16 TPUs or one node of 8 GPUs for
    the 1-D schemes; 16**dims TPUs or 256 GPUs for ``fsdp_tp``) laid out as the scheme needs,
    with the best X x Y split for ``fsdp_tp`` (sub-rings included).

    >>> c = critical_batch("fsdp_tp", "tpu-v5p", d_ff=32768, chips=4096)  # 16x16x16
    >>> c.mesh, c.placement, round(c.per_chip_batch)
    (Mesh(X=1024, Y=4), 'X=1024: ici 4:4x16x16 / Y=4: ici 4', 300)
    """
    if is_model(scheme):  # the book's test is on one MLP layer's phases; a model's batch is whole sequences
        raise CostModelError(
            "critical_batch finds the per-chip batch of an MLP scheme (e.g. critical_batch('fsdp', 'h100')); for a "
            "model under a plan, read estimate(model, plan, hardware, batch_tokens=...).bound at the batches you "
            "would train with"
        )
    hw = get_hardware(hardware)
    f = 4 * d_model if d_ff is None else d_ff
    where = (links, topology, efficiency)
    if mesh is not None:
        m = mesh if isinstance(mesh, Mesh) else Mesh(dict(mesh))
        return _critical_on(scheme, hw, m, d_model, f, where, dtype, max_per_chip)
    n = chips or default_chips(hw, scheme)
    if scheme != "fsdp_tp":
        return _critical_on(scheme, hw, scheme_mesh(scheme, n), d_model, f, where, dtype, max_per_chip)
    best: Critical | None = None
    splits: dict[int, float] = {}
    for y in divisors(n):
        m = Mesh(X=n // y, Y=y)
        try:
            c = _critical_on(scheme, hw, m, d_model, f, where, dtype, max_per_chip)
        except ShardsimError:
            continue  # this split does not fit the hardware or does not divide the sizes
        splits[y] = c.per_chip_batch
        if best is None or c.per_chip_batch < best.per_chip_batch:
            best = c
    if best is None:
        raise ShardsimError(f"no X x Y split of {n} chips fits {hw.name} with d_model={d_model}, d_ff={f}")
    best.splits = splits
    return best


@dataclass
class CriticalPair:
    """A scheme's critical batch under the ideal and the calibrated model, side by side."""

    ideal: Critical
    calibrated: Critical

    @property
    def ratio(self) -> float:
        """How much later (in tokens per chip) the scheme turns compute-bound once efficiency counts."""
        return self.calibrated.per_chip_batch / self.ideal.per_chip_batch

    def __str__(self) -> str:
        return f"ideal: {self.ideal}\ncalibrated: {self.calibrated} ({self.ratio:.2f}x the ideal)"


def critical_both(scheme: str, hardware: Hardware | str, d_ff: int | None = None, **options: Any) -> CriticalPair:
    """:func:`critical_batch` under ``efficiency="ideal"`` and ``"calibrated"``; same options.

    >>> pair = critical_both("fsdp", "h100", chips=8)  # one node: NVLink and matmuls both measured
    >>> round(pair.ideal.per_chip_batch), round(pair.calibrated.per_chip_batch)
    (2200, 1735)
    """
    options.pop("efficiency", None)
    return CriticalPair(
        critical_batch(scheme, hardware, d_ff, efficiency="ideal", **options),
        critical_batch(scheme, hardware, d_ff, efficiency="calibrated", **options),
    )


# (scheme, hardware, d_ff, options) of the ideal-vs-calibrated table in docs/cost-model.md
COMPARED: tuple[tuple[str, str, int | None, dict[str, Any]], ...] = (
    ("fsdp", "tpu-v5p", None, {}),
    ("fsdp", "tpu-v5p", None, {"chips": 4096}),
    ("fsdp_tp", "tpu-v5p", 32768, {"chips": 4096}),
    ("ddp", "h100", None, {"chips": 8}),
    ("fsdp", "h100", None, {"chips": 256}),
    ("tp", "h100", None, {"chips": 8}),
    ("fsdp", "a100", None, {"chips": 256}),
    ("tp", "a100", None, {"chips": 8}),
)


def critical_table(cases: Sequence[tuple[str, str, int | None, dict[str, Any]]] = COMPARED) -> str:
    """Critical batches under both models as a Markdown table (``docs/cost-model.md`` shows it)."""
    lines = [
        "| scheme | chip | chips | placement (calibrated) | ideal | calibrated | ratio |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    for scheme, hw, d_ff, options in cases:
        pair = critical_both(scheme, hw, d_ff, **options)
        c = pair.calibrated
        lines.append(
            f"| {scheme} | {hw} | {c.mesh.size:,} | {c.placement} | {pair.ideal.per_chip_batch:,.1f} "
            f"| {c.per_chip_batch:,.1f} | {pair.ratio:.2f} |"
        )
    return "\n".join(lines)


def default_chips(hw: Hardware, scheme: str) -> int:
    """One ring of 16 TPUs or a node of 8 GPUs; for ``fsdp_tp`` a full TPU torus or 256 GPUs."""
    first = next(iter(hw.networks.values()))
    if scheme == "fsdp_tp":
        return 16 ** getattr(first, "dims", 2) if hw.kind == "tpu" else 256
    return 16 if hw.kind == "tpu" else getattr(first, "domain", None) or 8


def scheme_mesh(scheme: str, chips: int) -> Mesh:
    """``Mesh(X=chips)`` for the data-parallel schemes, ``Mesh(Y=chips)`` for TP.

    >>> scheme_mesh("tp", 8)
    Mesh(Y=8)
    """
    if scheme == "fsdp_tp":
        raise ShardsimError("fsdp_tp needs an X x Y split; pass mesh=Mesh(X=..., Y=...) or use best_split")
    roles = strategies.get(scheme).roles
    if len(roles) > 1:
        example = ", ".join(f"{ROLE_DEFAULTS[r]}=..." for r in roles)
        raise ShardsimError(
            f"{scheme} needs a mesh axis for each of its roles {list(roles)}; pass mesh=Mesh({example})"
        )
    return Mesh({ROLE_DEFAULTS[roles[0]]: chips})


def best_split(
    hardware: Hardware | str,
    batch: int,
    d_model: int,
    d_ff: int,
    *,
    chips: int,
    layers: int = 1,
    overlap: bool = True,
    dtype: str = "bfloat16",
    links: Links = None,
    topology: Topology = None,
    efficiency: str | Efficiency = "calibrated",
    pad: bool = False,
) -> Estimate:
    """The ``fsdp_tp`` estimate with the shortest step over the splits ``Mesh(X=chips/Y, Y=Y)``.

    ``links``, ``topology``, ``efficiency`` and ``pad`` are :func:`~shardsim.cost.estimate`'s.

    >>> best_split("tpu-v5p", 64 * 512, 8192, 32768, chips=64, efficiency="ideal").mesh  # 512 tokens per chip
    Mesh(X=8, Y=8)
    """
    hw = get_hardware(hardware)
    opts: dict[str, Any] = {"links": links, "topology": topology, "efficiency": efficiency, "pad": pad}
    best: Estimate | None = None
    for y in divisors(chips):
        try:
            e = estimate("fsdp_tp", Mesh(X=chips // y, Y=y), hw, batch, d_model, d_ff, layers, overlap, dtype, **opts)
        except ShardsimError:
            continue
        if best is None or e.step_s < best.step_s:
            best = e
    if best is None:
        raise ShardsimError(f"no X x Y split of {chips} chips fits {hw.name} with batch {batch}")
    return best


def axis_bandwidth(hw: Hardware, mesh: Mesh, axis: str, links: Links = None, topology: Topology = None) -> float:
    """Effective AllGather bandwidth of ``axis`` (bytes/s): V over the bandwidth term of its time.

    >>> axis_bandwidth(get_hardware("tpu-v5p"), Mesh(X=256), "X")  # two ICI axes: 2 x W_ici
    360000000000.0
    """
    route = place(hw, mesh, links, topology=topology).route(axis)
    volume = 1e12
    t = collective_time("all_gather", volume, route, hw.ring)
    return volume / t.bandwidth_s if t.bandwidth_s else math.inf


def _critical_on(
    scheme: str,
    hw: Hardware,
    mesh: Mesh,
    d_model: int,
    d_ff: int,
    where: tuple[Links, Topology, str | Efficiency],
    dtype: str,
    max_per_chip: int,
) -> Critical:
    links, topology, efficiency = where
    placement = place(hw, mesh, links, topology=topology)
    eff = resolve_efficiency(hw, efficiency, placement.networks())

    layers = strategies.min_layers(scheme, mesh)  # a pipeline needs a layer per stage

    def excess(b: int) -> dict[tuple[str, str], float]:
        est = estimate(
            scheme,
            mesh,
            hw,
            b * mesh.size,
            d_model,
            d_ff,
            layers,
            dtype=dtype,
            links=links,
            topology=topology,
            efficiency=eff,
        )
        return excess_terms(est.phases)

    b = _crossing(excess, max_per_chip)
    bw = {a: axis_bandwidth(hw, mesh, a, links, topology) for a in mesh.axis_names}
    closed, x_opt = _closed_form(scheme, hw, mesh, bw, d_ff, dtype, b)
    where_text = " / ".join(str(placement).splitlines())
    return Critical(scheme, hw.name, b, mesh, closed, bw, x_opt, efficiency=eff.mode, placement=where_text)


def _crossing(terms: Callable[[int], Mapping[Any, float]], limit: int) -> float:
    """Smallest real b >= 0 where every term is <= 0; inf if none up to ``limit``.

    Each term (comm - FLOPs time of one phase on one axis) is linear in b where bandwidth
    binds, so between the two integers that bracket the crossing, the crossing of the max is
    the latest crossing of the terms still positive at the lower one.
    """
    cache: dict[int, Mapping[Any, float]] = {}

    def f(b: int) -> Mapping[Any, float]:
        if b not in cache:
            cache[b] = terms(b)
        return cache[b]

    def worst(b: int) -> float:
        return max(f(b).values(), default=0.0)

    hi = 1
    while worst(hi) > 0:
        hi *= 2
        if hi > limit:
            return math.inf
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if worst(mid) > 0 else (lo, mid)
    if lo == 0:  # compute-bound from one token on: extrapolate the terms below b = 1
        lo, hi = 1, 2
    low, high = f(lo), f(hi)
    falling = [k for k in low if k in high and high[k] < low[k]]

    def zero(k: Any) -> float:  # where term k's line through lo and hi crosses zero
        return lo + low[k] / (low[k] - high[k]) * (hi - lo)

    if worst(lo) > 0:
        return max(zero(k) for k in falling if low[k] > 0)
    return max([0.0, *(zero(k) for k in falling)])


def _closed_form(
    scheme: str, hw: Hardware, mesh: Mesh, bw: Mapping[str, float], d_ff: int, dtype: str, b: float
) -> tuple[float | None, float | None]:
    c = hw.flops(dtype)
    axes = ROLE_AXES.get(scheme)
    if scheme in ("ddp", "fsdp") and axes and axes[0] in bw:
        return c / bw[axes[0]], None  # B/X > C/W (SB training.md; gpus.md with W_collective)
    if scheme == "fsdp_tp" and {"X", "Y"} <= set(bw):
        wx, wy = bw["X"], bw["Y"]
        if math.isinf(wy):  # Y = 1: plain FSDP over X
            return c / wx, None
        closed = c * c / (wx * wy * d_ff)  # B/N > alpha^2/(M_X M_Y F) with M W_ici -> W_X, W_Y
        x_opt = math.sqrt(b * mesh.size / d_ff * wx / wy * mesh.size) if math.isfinite(b) else None
        return closed, x_opt
    return None, None
