"""Published collective measurements beside the model's times, ideal and calibrated.

Each :class:`Measured` row is one figure someone measured on real chips (the scaling book's
TPU AllGather profiles, nccl-tests bus bandwidths on H100 and A100 nodes), with the mesh and
array it was taken on. :func:`collective_comparison` costs the same collective on the same
route (:func:`~shardsim.cost.collective_time`) under both efficiency modes; rows marked
``fit`` are the points the calibrated constants were read from, ``check`` rows are not.
``docs/cost-model.md`` prints :func:`comparison_table`.

>>> rows = collective_comparison()
>>> r = rows[0]
>>> r.hardware, r.role, round(r.measured_s * 1e6), round(r.ideal_s * 1e6)
('tpu-v5e', 'check', 680, 559)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..mesh import Mesh
from .collectives import collective_time
from .efficiency import resolve_efficiency
from .hardware import Hardware
from .placement import place
from .presets import get_hardware


@dataclass(frozen=True)
class Measured:
    """One published measurement: ``op`` over mesh axis ``axis`` of ``mesh`` moving V = ``nbytes``.

    ``busbw`` (bytes/s, nccl-tests' bus bandwidth) or ``seconds`` is what was measured;
    ``node_egress`` (bytes/s per node, one way) replaces the preset's scale-out network when the
    measured cluster had fewer NICs per node than the preset's DGX.
    """

    hardware: str
    what: str
    op: str
    mesh: tuple[tuple[str, int], ...]
    axis: str
    nbytes: float
    role: str
    source: str
    seconds: float | None = None
    busbw: float | None = None
    node_egress: float | None = None

    def chip(self) -> Hardware:
        """The preset, with the measured cluster's scale-out network if it differs."""
        hw = get_hardware(self.hardware)
        if self.node_egress is None:
            return hw
        net = hw.networks["scaleout"]
        domain = getattr(hw.networks.get("nvlink"), "domain", None) or 8
        return hw.with_(networks={**hw.networks, "scaleout": replace(net, bandwidth=self.node_egress / domain)})

    def measured_s(self) -> float:
        """The measured time; from a bus bandwidth by nccl-tests' definition (AllReduce: 2(n-1)/n)."""
        if self.seconds is not None:
            return self.seconds
        assert self.busbw is not None
        n = dict(self.mesh)[self.axis]
        factor = 2 * (n - 1) / n if self.op == "all_reduce" else (n - 1) / n
        return self.nbytes * factor / self.busbw


MEASURED = (
    Measured(
        "tpu-v5e", "AllGather_Y bf16[2048, 8192], 8x4, no wraparound", "all_gather", (("X", 8), ("Y", 4)), "Y",
        2 * 2048 * 8192, "check", "SB sharding.md pop quiz 2: profile shows 680 us", seconds=680e-6,
    ),
    Measured(
        "tpu-v5e", "AllGather_Y bf16[256, 256], 8x4 (latency-bound)", "all_gather", (("X", 8), ("Y", 4)), "Y",
        2 * 256 * 256, "check", "SB sharding.md pop quiz 2: 'closer to 8us'", seconds=8e-6,
    ),
    Measured(
        "h100", "AllReduce 10 GB, 8 GPUs (NVLink)", "all_reduce", (("X", 8),), "X",
        10e9, "fit", "SB gpus.md: busbw about 370 GB/s at about 10 GB", busbw=370e9,
    ),
    Measured(
        "h100", "AllReduce 58 MB, 8 GPUs (NVLink)", "all_reduce", (("X", 8),), "X",
        58e6, "check", "SB gpus.md: 58 MB AllReduce gets about 150 GB/s", busbw=150e9,
    ),
    Measured(
        "h100", "AllReduce 8 KB, 8 GPUs (NVLink)", "all_reduce", (("X", 8),), "X",
        8192, "check", "NVIDIA/dgxc-benchmarking nccl/README.md: DGX H100 all_reduce_perf, 17.40 us",
        seconds=17.40e-6,
    ),
    Measured(
        "h100", "AllReduce 64 MB, 8 GPUs (NVLink)", "all_reduce", (("X", 8),), "X",
        2**26, "check", "NVIDIA/dgxc-benchmarking nccl/README.md: DGX H100 all_reduce_perf, 324.7 us",
        seconds=324.7e-6,
    ),
    Measured(
        "h100", "AllReduce 1 GiB, 8 GPUs (NVLink)", "all_reduce", (("X", 8),), "X",
        2**30, "check", "NVIDIA/dgxc-benchmarking nccl/README.md: DGX H100 all_reduce_perf, 4,029 us (NVLS)",
        seconds=4029.4e-6,
    ),
    Measured(
        "a100", "AllReduce 1 GiB, 8 GPUs (NVLink)", "all_reduce", (("X", 8),), "X",
        2**30, "check", "nccl-tests issue 149: 8x A100-80GB busbw about 200 GB/s up to 1 GiB", busbw=200e9,
    ),
    Measured(
        "a100", "AllReduce 4 GiB, 8 GPUs (NVLink)", "all_reduce", (("X", 8),), "X",
        2**32, "check", "nccl-tests issue 175: one node, all_reduce_perf -e 4G, 232.54 GB/s", busbw=232.54e9,
    ),
    Measured(
        "a100", "AllReduce 8 GiB, 12 nodes x 8 GPUs, 1 HDR NIC per node", "all_reduce", (("X", 96),), "X",
        2**33, "check", "NVIDIA/nccl issue 412 (maintainer): busbw at 8G about 24 GB/s inter-node per HDR NIC",
        busbw=24e9, node_egress=25e9,
    ),
    Measured(
        "a100", "AllReduce 128 MiB, 3 nodes x 8 GPUs, 4 HDR NICs per node", "all_reduce", (("X", 24),), "X",
        2**27, "check", "nccl-tests issue 119: peak busbw about 96 GB/s of 100 (4 x 200 Gb/s)",
        busbw=96e9, node_egress=100e9,
    ),
)  # fmt: skip


@dataclass(frozen=True)
class Comparison:
    """A measured row with the model's ideal and calibrated times for it (seconds)."""

    row: Measured
    measured_s: float
    ideal_s: float
    calibrated_s: float

    @property
    def hardware(self) -> str:
        return self.row.hardware

    @property
    def role(self) -> str:
        return self.row.role

    @property
    def error(self) -> float:
        """Calibrated over measured, minus one (relative error)."""
        return self.calibrated_s / self.measured_s - 1


def collective_comparison(rows: tuple[Measured, ...] = MEASURED) -> list[Comparison]:
    """Every row of ``rows`` costed on its own mesh, ideal and calibrated."""
    out = []
    for r in rows:
        hw = r.chip()
        placement = place(hw, Mesh(dict(r.mesh)))
        route = placement.route(r.axis)
        times = []
        for mode in ("ideal", "calibrated"):
            eff = resolve_efficiency(hw, mode, placement.networks())
            times.append(collective_time(r.op, r.nbytes, route, hw.ring, eff).seconds)
        out.append(Comparison(r, r.measured_s(), times[0], times[1]))
    return out


def comparison_table(rows: tuple[Measured, ...] = MEASURED) -> str:
    """The comparison as a Markdown table (what ``docs/cost-model.md`` shows)."""
    lines = [
        "| chip | collective | measured | ideal model | calibrated model | calibrated error | row | source |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for c in collective_comparison(rows):
        lines.append(
            f"| {c.hardware} | {c.row.what} | {_us(c.measured_s)} | {_us(c.ideal_s)} | {_us(c.calibrated_s)} "
            f"| {c.error:+.0%} | {c.role} | {c.row.source} |"
        )
    return "\n".join(lines)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs" if seconds < 1e-2 else f"{seconds * 1e3:,.2f} ms"
