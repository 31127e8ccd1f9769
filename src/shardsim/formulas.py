"""Closed forms for training memory and communication, per chip: the numbers the ledger is held to.

Model state (ZeRO, Rajbhandari et al. 2019, §3.1 and §5). With Ψ parameters, N data-parallel
chips and mixed-precision Adam, each parameter costs 2 bytes of 16-bit weights, 2 bytes of
16-bit gradients and K = 12 bytes of optimizer state (a float32 master copy, momentum and
variance, 4 bytes each): the "16 bytes per parameter" rule. ZeRO shards the redundant parts:

===========  ==========================  ==========================
stage        what is sharded             bytes per chip
===========  ==========================  ==========================
0 (DDP)      nothing                     (2 + 2 + K)Ψ
1 (P_os)     optimizer state             2Ψ + 2Ψ + KΨ/N
2 (P_os+g)   + gradients                 2Ψ + (2 + K)Ψ/N
3 (P_os+g+p) + parameters (FSDP)         (2 + 2 + K)Ψ/N
===========  ==========================  ==========================

>>> GB = 1e9
>>> [model_state_bytes(7.5e9, 64, stage) / GB for stage in range(4)]  # ZeRO Figure 1
[120.0, 31.40625, 16.640625, 1.875]
>>> bytes_per_param()  # the 16 bytes per parameter rule
{'params': 2, 'grads': 2, 'optimizer': 12}

Communication (ZeRO §7): stages 0–2 move 2Ψ elements per chip per step (ReduceScatter +
AllGather, which is one AllReduce); stage 3 moves 3Ψ (an extra AllGather of the weights in
the backward pass). The ring algorithm sends (N-1)/N of each.

>>> zero_comm_elements(1000, 2), zero_comm_elements(1000, 3)
(2000, 3000)

Activations of one MLP block (``act(In @ W_in) @ W_out``) as the schemes store them for the
backward pass: :func:`mlp_activation_bytes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .dtypes import resolve_dtype

PRECISIONS = ("mixed", "fp32")
OPTIMIZERS = ("adam", "adamw", "momentum", "sgd")
STAGES = (0, 1, 2, 3)

#: float32 moments each optimizer keeps per parameter (Adam: momentum and variance).
MOMENTS = {"adam": 2, "adamw": 2, "momentum": 1, "sgd": 0}


def _check(precision: str, optimizer: str, stage: int | None = None) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {optimizer!r}")
    if stage is not None and stage not in STAGES:
        raise ValueError(f"ZeRO stage must be one of {list(STAGES)}, got {stage!r}")


def bytes_per_param(precision: str = "mixed", optimizer: str = "adam") -> dict[str, int]:
    """Bytes one parameter costs unsharded: ``{"params", "grads", "optimizer"}``.

    ``mixed``: 16-bit weights and gradients, float32 master weights and moments (K = 4 + 4
    per moment). ``fp32``: everything float32, the weights are their own master (K = 4 per
    moment).

    >>> bytes_per_param("fp32", "adam"), sum(bytes_per_param("mixed", "momentum").values())
    ({'params': 4, 'grads': 4, 'optimizer': 8}, 12)
    """
    _check(precision, optimizer)
    weight = 2 if precision == "mixed" else 4
    master = 4 if precision == "mixed" else 0
    return {"params": weight, "grads": weight, "optimizer": master + 4 * MOMENTS[optimizer]}


def model_state_breakdown(
    num_params: float, num_chips: int, stage: int, precision: str = "mixed", optimizer: str = "adam"
) -> dict[str, float]:
    """Per-chip bytes of parameters, gradients and optimizer state under ZeRO ``stage``.

    ``num_chips`` is the data-parallel degree N over which ZeRO shards.

    >>> model_state_breakdown(1000, 4, 2)
    {'params': 2000.0, 'grads': 500.0, 'optimizer': 3000.0}
    """
    _check(precision, optimizer, stage)
    if num_chips < 1:
        raise ValueError(f"num_chips must be at least 1, got {num_chips}")
    per = bytes_per_param(precision, optimizer)
    sharded = {"params": stage >= 3, "grads": stage >= 2, "optimizer": stage >= 1}
    return {k: float(num_params) * b / (num_chips if sharded[k] else 1) for k, b in per.items()}


def model_state_bytes(
    num_params: float, num_chips: int, stage: int, precision: str = "mixed", optimizer: str = "adam"
) -> float:
    """Per-chip bytes of the model state (parameters + gradients + optimizer) under ZeRO ``stage``.

    Mixed-precision Adam (K = 12): stage 0 ``16Ψ``, 1 ``4Ψ + 12Ψ/N``, 2 ``2Ψ + 14Ψ/N``,
    3 ``16Ψ/N``.

    >>> model_state_bytes(1.5e9, 1, 0) / 1e9  # GPT-2 1.5B needs 24 GB before activations
    24.0
    """
    return sum(model_state_breakdown(num_params, num_chips, stage, precision, optimizer).values())


def zero_comm_elements(num_params: int, stage: int) -> int:
    """Elements each chip moves per step (ZeRO §7): ``2Ψ`` for stages 0–2, ``3Ψ`` for stage 3.

    >>> zero_comm_elements(10, 0)
    20
    """
    _check("mixed", "adam", stage)
    return (3 if stage == 3 else 2) * num_params


def zero_comm_bytes(num_params: int, num_chips: int, stage: int, dtype: Any = "bfloat16") -> float:
    """Bytes each chip sends per step under the ring algorithm: ``(N-1)/N`` of the elements moved.

    Counts the weight and gradient collectives only (ZeRO §7), in ``dtype``.

    >>> zero_comm_bytes(1024, 8, 1, "float32")  # 2Ψ elements x 4 bytes x 7/8
    7168.0
    """
    return zero_comm_elements(num_params, stage) * resolve_dtype(dtype).itemsize * (num_chips - 1) / num_chips


#: The ZeRO stage each scheme's model state follows: tp and fsdp_tp shard everything as stage 3
#: does, over the model axis (tp) or over both axes (fsdp_tp).
SCHEME_STAGES = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3, "tp": 3, "fsdp_tp": 3}


def scheme_model_state(
    scheme: str,
    num_params: float,
    axes: Mapping[str, int],
    precision: str = "mixed",
    optimizer: str = "adam",
) -> dict[str, float]:
    """Per-chip model-state bytes of a scheme, with ``axes`` the chips per role.

    Data-parallel schemes shard over ``axes["data"]`` by their ZeRO stage; tp shards all
    state over ``axes["model"]``; fsdp_tp over both.

    >>> scheme_model_state("fsdp_tp", 4000, {"data": 2, "model": 2}, "fp32")
    {'params': 4000.0, 'grads': 4000.0, 'optimizer': 8000.0}
    """
    if scheme not in SCHEME_STAGES:
        raise ValueError(f"no model-state formula for scheme {scheme!r}; one of {list(SCHEME_STAGES)}")
    sizes = {"data": 1, "model": 1, **axes}
    chips = {"tp": sizes["model"], "fsdp_tp": sizes["data"] * sizes["model"]}.get(scheme, sizes["data"])
    return model_state_breakdown(num_params, chips, SCHEME_STAGES[scheme], precision, optimizer)


# -- activations ------------------------------------------------------------------------------
def mlp_activation_bytes(
    scheme: str,
    batch: int,
    d_model: int,
    d_ff: int,
    axes: Mapping[str, int] | None = None,
    dtype: Any = "float32",
    activation: str = "gelu",
    recompute: bool = False,
) -> dict[str, int]:
    """Per-chip bytes one MLP block stores for its backward pass, by activation name.

    ``axes`` gives the chips per role: ``{"data": X}`` for ddp / zero1-3 / fsdp,
    ``{"model": Y}`` for tp, both for fsdp_tp. Without recomputation a block keeps its input
    ``In`` (tp keeps the input gathered over Y, since dW_in needs it whole), ``H_pre`` and
    ``H = act(H_pre)`` (one tensor for the identity). With ``recompute`` it keeps its input
    only, as it arrives (``[B_X, D]``, tp ``[B, D_Y]``, fsdp_tp ``[B_X, D_Y]``).

    >>> mlp_activation_bytes("ddp", 8, 16, 32, {"data": 2})
    {'In': 256, 'H_pre': 512, 'H': 512}
    >>> mlp_activation_bytes("tp", 8, 16, 32, {"model": 4}, recompute=True)
    {'In': 128}
    """
    sizes = {"data": 1, "model": 1, **(axes or {})}
    x, y = sizes["data"], sizes["model"]
    item = resolve_dtype(dtype).itemsize
    data_parallel = ("ddp", "fsdp", "zero1", "zero2", "zero3")
    if scheme in data_parallel:
        b, d, f = batch // x, d_model, d_ff
        gathered_in = b * d
    elif scheme == "tp":
        b, d, f = batch, d_model // y, d_ff // y
        gathered_in = batch * d_model
    elif scheme == "fsdp_tp":
        b, d, f = batch // x, d_model // y, d_ff // y
        gathered_in = b * d  # re-gathered in the backward pass, stored split
    else:
        raise ValueError(f"no activation formula for scheme {scheme!r}; one of {[*data_parallel, 'tp', 'fsdp_tp']}")
    if recompute:
        return {"In": b * d * item}
    out = {"In": gathered_in * item, "H_pre": b * f * item}
    if activation != "identity":
        out["H"] = b * f * item
    return out


def mlp_flops(batch: int, d_model: int, d_ff: int, chips: int = 1, recompute: bool = False) -> dict[str, int]:
    """FLOPs per chip of one MLP block: forward ``4BDF``, backward ``8BDF``, recompute ``+4BDF``.

    Each matmul of ``[M, K] @ [K, N]`` costs ``2MKN``; the forward has two, the backward four
    (dW_out, dH, dW_in, dIn). Recomputation runs the forward again in the backward pass.
    ``chips`` divides the work (every scheme here splits the FLOPs evenly).

    >>> mlp_flops(8, 16, 32, chips=2, recompute=True)
    {'forward': 8192, 'backward': 24576}
    """
    fwd = 4 * batch * d_model * d_ff // chips
    bwd = 8 * batch * d_model * d_ff // chips
    return {"forward": fwd, "backward": bwd + (fwd if recompute else 0)}


__all__ = [
    "MOMENTS",
    "OPTIMIZERS",
    "PRECISIONS",
    "SCHEME_STAGES",
    "bytes_per_param",
    "mlp_activation_bytes",
    "mlp_flops",
    "model_state_breakdown",
    "model_state_bytes",
    "scheme_model_state",
    "zero_comm_bytes",
    "zero_comm_elements",
]
