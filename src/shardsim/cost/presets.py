"""Hardware presets: TPU v4p, v5e, v5p, v6e and NVIDIA A100, H100, H200, B200.

Every peak number is the scaling book's (SB), section by section as ``docs/cost-model.md``
cites: TPU chips from ``tpus.md`` (table of chip specs, pod shapes) and ``roofline.md``;
GPUs from ``gpus.md`` (GPU specs table, NVLink and the DGX SuperPod network); the A100 as
PTD-P ran it (312 TFLOP/s, NVLink 3, 8 x 200 Gb/s HDR InfiniBand per node). Where the book
disagrees with itself the preset keeps one value and says so in ``notes``.

The measured efficiencies (``calibration``, :mod:`~shardsim.cost.efficiency`) come from the
sources ``docs/cost-model.md`` lists: the maximum achievable matmul FLOP/s table, the book's
NCCL and ICI measurements, nccl-tests results.

>>> from shardsim.cost import get_hardware, hardware_names
>>> hardware_names()
['tpu-v4p', 'tpu-v5e', 'tpu-v5p', 'tpu-v6e', 'a100', 'h100', 'h200', 'b200']
>>> get_hardware("v5e").networks["ici"].bandwidth  # one-way bytes/s per ICI link
45000000000.0
>>> get_hardware("v5p").networks["ici"].pod  # SB tpus.md: the largest v5p slice
(16, 20, 28)
"""

from __future__ import annotations

from ..errors import CostModelError
from .efficiency import AttentionEfficiency, Calibration, CollectiveEfficiency, MatmulEfficiency
from .hardware import Hardware, Switched, Torus

T_MIN = 1e-6  # SB sharding.md: per-hop ICI latency "typically around 1us"

# --- measured efficiencies (docs/cost-model.md, "Efficiency", lists each source) ---
# Maximum achievable matmul FLOP/s (stas00/ml-engineering, compute/accelerator "MAMF"
# table): best bf16 / fp8 matmul over many shapes against the dense peak.
MAMF = "ml-engineering MAMF table (bf16 / fp8 matmul, best over shapes)"
# The bend of the curve: H100 bf16 square matmuls, 2048^3 at 676.59 TFLOP/s (intensity
# 2048/3) against the plateau 794.5 (torch-performance-test-data issue #79), so
# I_half = (2048/3) (794.5 / 676.59 - 1) = 119 FLOPs per byte; other GPUs borrow it.
HALF_INTENSITY = 119.0
# NCCL's own time model (src/graph/tuning.cc as of NCCL 2.8, the release of 2021's runs,
# commit 01afd20a; Ring / Simple protocol, the one large messages use): a fixed base latency
# of 8.4 us per collective plus 3.4 us per ring step over NVLink and 9.6 us per ring step
# over the network, on top of size / bandwidth. A ring of N GPUs in nodes of 8 pays N - nodes
# NVLink steps and nodes - 1 network steps (x 2 for AllReduce).
NCCL_BASE_S, NCCL_NVLINK_STEP_S, NCCL_NET_STEP_S = 8.4e-6, 3.4e-6, 9.6e-6
NCCL = "NCCL 2.8 tuning.cc: Ring/Simple latency 8.4 us + 3.4 us per NVLink step, 9.6 us per network step"
# 8 x H100 AllReduce bus bandwidth in a node with NVLink SHARP off: about 370 GB/s at about
# 10 GB (SB gpus.md; NCCL's ring reaches 365-370 GB/s on 2 to 8 H100s, NVIDIA/nccl issue 1455),
# with NCCL's ring latency below it. The book's 150 GB/s at 58 MB is left as a check: NCCL's
# own benchmark on a DGX H100 takes 325 us at 64 MB (NVIDIA/dgxc-benchmarking nccl/README.md),
# where 150 GB/s would be 680 us.
NVLINK_H100 = CollectiveEfficiency(
    370e9 / 450e9,
    launch_s=NCCL_BASE_S,
    step_s=NCCL_NVLINK_STEP_S,
    source="SB gpus.md: 8xH100 AllReduce busbw about 370 GB/s at ~10 GB (SHARP off); " + NCCL,
)
HOPPER = {"nvlink": NVLINK_H100}
# 8 x A100 nccl-tests all_reduce: 235 GB/s busbw of 300 GB/s one way (ml-engineering,
# network/README). At 8 GPUs NCCL's latency is half the plateau's time at V = 11.8 MB.
NVLINK_A100 = CollectiveEfficiency(
    235e9 / 300e9,
    launch_s=NCCL_BASE_S,
    step_s=NCCL_NVLINK_STEP_S,
    source="ml-engineering network/README: nccl-tests all_reduce 235 GB/s on A100; " + NCCL,
)
# Scale-out: NCCL busbw per NIC at 8 GB, from NCCL's maintainers: "24GB/s inter-node" per
# 200 Gb/s HDR NIC (NVIDIA/nccl issue 412), "46-48GB/s per NIC" for 400 Gb/s NDR (nccl-tests
# issue 290); the latency per ring step is NCCL's.
SCALEOUT_HDR = CollectiveEfficiency(
    24 / 25,
    launch_s=NCCL_BASE_S,
    step_s=NCCL_NET_STEP_S,
    source="NVIDIA/nccl issue 412: busbw about 24 GB/s per HDR NIC at 8 GB; " + NCCL,
)
SCALEOUT_NDR = CollectiveEfficiency(
    47 / 50,
    launch_s=NCCL_BASE_S,
    step_s=NCCL_NET_STEP_S,
    source="nccl-tests issue 290: 46-48 GB/s per NDR NIC; " + NCCL,
)
# TPU v5e ICI AllGather: about 95% of the bandwidth at about 10 MB (SB sharding.md, 2025-10
# text), so V / (V + h) = 0.95 at 10 MB: h = 526 kB. The book's two pop-quiz profiles are
# left as checks (cost.measured).
ICI = CollectiveEfficiency(1.0, half_bytes=10e6 * (1 / 0.95 - 1), source="SB sharding.md: v5e AllGather at ~10 MB")
# The kernels a trace does not time (norms, softmax, GeLU, dropout, bias and residual adds,
# gradient accumulation) read and write the matmuls' outputs: k HBM passes over each matmul's
# output bytes. No source measures k per chip, so it is fitted to the end-to-end runs of
# docs/calibration.md (cost.calibration.fit_elementwise_passes over the rows marked "fit";
# every other row is a check). A100: PTD-P Table 1 rows 1-4 (8.766). H100: Llama 3 Table 4
# row 1 (1.358), its attention FlashAttention at the fused kernel's rate.
ELEMENTWISE_PASSES_A100 = 8.76
ELEMENTWISE_PASSES_H100 = 1.36
# Fused attention on Hopper, the best published kernel as MAMF is the best GEMM: FlashAttention-3
# at head dim 128, sequence 16k, bf16 on an H100 SXM5, 648 TFLOP/s forward and 561 backward
# (Shah et al. 2024, the attention speed figures; FlashAttention-2 on the same figures: 370
# and 322, cuDNN 595 and 516). No A100 figure is here (PTD-P's Megatron of 2021 ran attention
# as separate matmuls around a fused softmax, attention=standard): its fused blocks run on the
# matmul curve.
FLASH_H100 = AttentionEfficiency(
    648 / 989,
    561 / 989,
    "Shah et al. 2024 (FlashAttention-3): H100 SXM5, head dim 128, seq 16k, 648 / 561 TFLOP/s forward / backward",
)


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
    pod: tuple[int, ...],
    notes: dict[str, str] | None = None,
) -> Hardware:
    return Hardware(
        name=name,
        flops_by_dtype={"bfloat16": bf16, "float16": bf16, "int8": int8},
        hbm_bandwidth=hbm_bw,
        hbm_capacity=hbm_gb * 1e9,
        networks={
            "ici": Torus(bandwidth=ici_one_way, latency=T_MIN, dims=dims, max_ring=16, wrap=wrap, pod=pod),
            "dcn": Switched(bandwidth=dcn, latency=T_MIN),
        },
        host_bandwidth=pcie,
        kind="tpu",
        notes={"calibration": "ICI curve measured on v5e (SB); no measured matmul or DCN curve", **(notes or {})},
        calibration=Calibration(networks={"ici": ICI}),
    )


def _gpu(
    name: str,
    bf16: float,
    fp8: float | None,
    hbm_gb: float,
    hbm_bw: float,
    nvlink: float,
    node_egress: float,
    notes: dict[str, str] | None = None,
    *,
    int8: float | None = None,
    calibration: Calibration | None = None,
) -> Hardware:
    flops = {"bfloat16": bf16, "float16": bf16, "int8": int8 or fp8 or bf16}
    if fp8 is not None:
        flops.update({"float8_e4m3fn": fp8, "float8_e5m2": fp8})
    return Hardware(
        name=name,
        flops_by_dtype=flops,
        hbm_bandwidth=hbm_bw,
        hbm_capacity=hbm_gb * 1e9,
        networks={
            "nvlink": Switched(bandwidth=nvlink, latency=T_MIN, domain=8),
            "scaleout": Switched(bandwidth=node_egress / 8, latency=T_MIN),
        },
        kind="gpu",
        notes=notes or {},
        calibration=calibration,
    )


def _mamf(bf16: float, fp8: float | None = None) -> MatmulEfficiency:
    """A matmul curve from the MAMF fractions (bf16, fp8) and the borrowed bend."""
    by_dtype = {} if fp8 is None else {"float8_e4m3fn": fp8, "float8_e5m2": fp8}
    return MatmulEfficiency(bf16, HALF_INTENSITY, by_dtype, MAMF)


_PRESETS: dict[str, Hardware] = {
    h.name: h
    for h in (
        # SB tpus.md chip table: bf16, int8, HBM, HBM BW, ICI one-way per link; DCN/PCIe per chip
        _tpu("tpu-v4p", 2.75e14, 2.75e14, 32, 1.2e12, 4.5e10, 3, "cube", 6.25e9, 1.6e10, (16, 16, 16)),
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
            (16, 16),
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
            (16, 20, 28),
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
            (16, 16),
            {"flops": "tpus.md table 9.2e14; roofline.md uses 9.1e14"},
        ),
        # A100 80GB as PTD-P ran it: 312 TFLOP/s bf16, NVLink 3 "600 GB/s" = 300 GB/s one way
        # (SB gpus.md: Ampere 12 links, 300 GB/s), DGX A100 node 8 x 200 Gb/s HDR = 200 GB/s
        _gpu(
            "a100",
            3.12e14,
            None,
            80,
            2.0e12,
            3e11,
            2e11,
            {"hbm_bandwidth": "SB gpus.md table 2.0e12", "flops": "312 TFLOP/s (PTD-P; SB table rounds to 3.1e14)"},
            int8=6.24e14,
            calibration=Calibration(
                _mamf(271.2 / 312),
                {"nvlink": NVLINK_A100, "scaleout": SCALEOUT_HDR},
                ELEMENTWISE_PASSES_A100,
                "elementwise_passes fitted to PTD-P Table 1 rows 1-4 (docs/calibration.md)",
            ),
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
            calibration=Calibration(
                _mamf(794.5 / 989, 1402.6 / 1979),
                {**HOPPER, "scaleout": SCALEOUT_NDR},
                ELEMENTWISE_PASSES_H100,
                "elementwise_passes fitted to Llama 3 Table 4 row 1 (docs/calibration.md)",
                FLASH_H100,
            ),
        ),
        _gpu(
            "h200",
            9.9e14,
            1.98e15,
            141,
            4.8e12,
            4.5e11,
            4e11,
            {
                "networks": "Hopper NVLink 4.0 as H100; DGX scale-out assumed as H100 (the book lists H100/B200)",
                "calibration": "bf16 matmul as H100 (MAMF: 'H200 is the same'); "
                "NVLink, NDR and fused attention of the H100",
            },
            calibration=Calibration(
                _mamf(794.5 / 989, 1453.4 / 1979), {**HOPPER, "scaleout": SCALEOUT_NDR}, attention=FLASH_H100
            ),
        ),
        _gpu(
            "b200",
            2.25e15,
            4.5e15,
            192,
            8e12,
            9e11,
            4e11,
            {
                "flops": "gpus.md prose 2250e12 (table 2.3e15); HBM 8e12 (prose '9TB/s')",
                "calibration": "MAMF matmul only; no measured NVLink 5 or scale-out curve",
            },
            calibration=Calibration(_mamf(1745.0 / 2250, 3432.5 / 4500)),
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
    if not isinstance(name, str):
        raise CostModelError(
            f"hardware={name!r:.60} ({type(name).__name__}) is neither a preset name nor a shardsim.cost.Hardware; "
            f"use one of {hardware_names()}"
        )
    key = name.lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    try:
        return _PRESETS[key]
    except KeyError:
        raise CostModelError(
            f"unknown hardware {name!r}; presets are {hardware_names()} (or build a shardsim.cost.Hardware)"
        ) from None
