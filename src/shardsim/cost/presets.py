"""Hardware presets: TPU v4p, v5e, v5p, v6e and NVIDIA H100, H200, B200.

Every number is the scaling book's (SB), section by section as ``docs/cost-model.md`` cites:
TPU chips from ``tpus.md`` (table of chip specs) and ``roofline.md``; GPUs from ``gpus.md``
(GPU specs table, NVLink and the DGX SuperPod network). Where the book disagrees with itself
the preset keeps one value and says so in ``notes``.

>>> from shardsim.cost import get_hardware, hardware_names
>>> hardware_names()
['tpu-v4p', 'tpu-v5e', 'tpu-v5p', 'tpu-v6e', 'h100', 'h200', 'b200']
>>> get_hardware("v5e").networks["ici"].bandwidth  # one-way bytes/s per ICI link
45000000000.0
"""

from __future__ import annotations

from ..errors import ShardsimError
from .hardware import Hardware, Switched, Torus

T_MIN = 1e-6  # SB sharding.md: per-hop ICI latency "typically around 1us"


def _tpu(
    name: str,
    bf16: float,
    int8: float,
    hbm_gb: float,
    hbm_bw: float,
    ici_one_way: float,
    dims: int,
    wrap: str,
    dcn: float,
    pcie: float,
    notes: dict[str, str] | None = None,
) -> Hardware:
    return Hardware(
        name=name,
        flops_by_dtype={"bfloat16": bf16, "float16": bf16, "int8": int8},
        hbm_bandwidth=hbm_bw,
        hbm_capacity=hbm_gb * 1e9,
        networks={
            "ici": Torus(bandwidth=ici_one_way, latency=T_MIN, dims=dims, max_ring=16, wrap=wrap),
            "dcn": Switched(bandwidth=dcn, latency=T_MIN),
        },
        host_bandwidth=pcie,
        kind="tpu",
        notes=notes or {},
    )


def _gpu(
    name: str,
    bf16: float,
    fp8: float,
    hbm_gb: float,
    hbm_bw: float,
    nvlink: float,
    node_egress: float,
    notes: dict[str, str] | None = None,
) -> Hardware:
    return Hardware(
        name=name,
        flops_by_dtype={"bfloat16": bf16, "float16": bf16, "float8_e4m3fn": fp8, "float8_e5m2": fp8, "int8": fp8},
        hbm_bandwidth=hbm_bw,
        hbm_capacity=hbm_gb * 1e9,
        networks={
            "nvlink": Switched(bandwidth=nvlink, latency=T_MIN, domain=8),
            "scaleout": Switched(bandwidth=node_egress / 8, latency=T_MIN),
        },
        kind="gpu",
        notes=notes or {},
    )


_PRESETS: dict[str, Hardware] = {
    h.name: h
    for h in (
        # SB tpus.md chip table: bf16, int8, HBM, HBM BW, ICI one-way per link; DCN/PCIe per chip
        _tpu("tpu-v4p", 2.75e14, 2.75e14, 32, 1.2e12, 4.5e10, 3, "cube", 6.25e9, 1.6e10),
        _tpu(
            "tpu-v5e",
            1.97e14,
            3.94e14,
            16,
            8.1e11,
            4.5e10,
            2,
            "full",
            3.125e9,
            1.6e10,
            {"hbm_bandwidth": "tpus.md table 8.1e11; roofline.md uses 8.2e11 (intensity 240)"},
        ),
        _tpu(
            "tpu-v5p",
            4.59e14,
            9.18e14,
            96,
            2.8e12,
            9e10,
            3,
            "cube",
            6.25e9,
            1.6e10,
            {"hbm_bandwidth": "tpus.md table 2.8e12; the prose says 2.5e12"},
        ),
        _tpu(
            "tpu-v6e",
            9.2e14,
            1.84e15,
            32,
            1.6e12,
            9e10,
            2,
            "full",
            12.5e9,
            3.2e10,
            {"flops": "tpus.md table 9.2e14; roofline.md uses 9.1e14"},
        ),
        # SB gpus.md: GPU table, NVLink egress per GPU (one way), DGX node egress 8 x 400 Gbps
        _gpu(
            "h100",
            9.9e14,
            1.98e15,
            80,
            3.35e12,
            4.5e11,
            4e11,
            {"hbm_bandwidth": "gpus.md prose 3.35 TB/s (table 3.4e12); used for the book's intensity 295"},
        ),
        _gpu(
            "h200",
            9.9e14,
            1.98e15,
            141,
            4.8e12,
            4.5e11,
            4e11,
            {"networks": "Hopper NVLink 4.0 as H100; DGX scale-out assumed as H100 (the book lists H100/B200)"},
        ),
        _gpu(
            "b200",
            2.25e15,
            4.5e15,
            192,
            8e12,
            9e11,
            4e11,
            {"flops": "gpus.md prose 2250e12 (table 2.3e15); HBM 8e12 (prose '9TB/s')"},
        ),
    )
}

_ALIASES = {"v4p": "tpu-v4p", "v5e": "tpu-v5e", "v5p": "tpu-v5p", "v6e": "tpu-v6e"}


def hardware_names() -> list[str]:
    """The preset names, TPUs first."""
    return list(_PRESETS)


def get_hardware(name: str | Hardware) -> Hardware:
    """A preset by name (``"tpu-v5p"``, ``"v5p"``, ``"h100"`` ...); a Hardware passes through."""
    if isinstance(name, Hardware):
        return name
    key = str(name).lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    try:
        return _PRESETS[key]
    except KeyError:
        raise ShardsimError(
            f"unknown hardware {name!r}; presets are {hardware_names()} (or build a shardsim.cost.Hardware)"
        ) from None
