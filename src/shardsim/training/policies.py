"""Byte policies: the literature's ways of counting a training step's bytes, as named presets.

Each preset is a :class:`~shardsim.training.precision.Precision` (the dtypes of the weights,
gradient reductions, master weights and moments) and the optimizer its source counts,
with the bytes per parameter the source writes and where it writes them. The ledger then
measures what the preset implies on the chips; the tests reproduce each source's example.

==========================  ===============================  =====================================
preset                      bytes per parameter (Adam)       source
==========================  ===============================  =====================================
``zero-mixed``              2 + 2 + 12 (K = 12)              ZeRO (Rajbhandari et al. 2020) §3.1
``deepspeed-fp32-reduce``   2 + 4 + 12 = 18                  DeepSpeed's ZeRO-3 memory estimator
``megatron``                18                               Megatron-LM theoretical memory
``megatron-distributed``    6 + 12/d (ZeRO-1)                Megatron-LM theoretical memory
``scaling-book``            2 + 8 = 10 (no gradients)        How to Scale Your Model, Part 5
``bf16``                    2 + 2 + 4 = 8                    pure bf16 (no float32 copy)
==========================  ===============================  =====================================

>>> p = get("megatron-distributed")
>>> p.precision.compute.name, p.precision.reduce.name, p.zero
('bfloat16', 'float32', 1)
>>> names()[:2]
['zero-mixed', 'deepspeed-fp32-reduce']
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import resolve_dtype
from ..errors import PlanError
from .precision import Precision

_BF16, _FP32 = resolve_dtype("bfloat16"), resolve_dtype("float32")


@dataclass(frozen=True)
class BytePolicy:
    """A named way of counting bytes: ``precision``, the ``optimizer`` its source assumes, the
    ZeRO stage its figure needs (``zero``; None: any), its bytes per parameter as the source
    writes them, and the ``source``."""

    name: str
    precision: Precision
    bytes_per_param: str
    source: str
    optimizer: str = "adam"
    zero: int | None = None


_POLICIES = {
    p.name: p
    for p in (
        BytePolicy(
            "zero-mixed",
            Precision(_BF16, _FP32),
            "2 + 2 + 12: 16-bit weights and gradients; float32 master weights, momentum and variance",
            "Rajbhandari et al. 2020, ZeRO, §3.1 and Figure 1 (fp16 there: the same bytes)",
        ),
        BytePolicy(
            "deepspeed-fp32-reduce",
            Precision(_BF16, _FP32, _FP32),
            "2 + 4 + 12 = 18: gradients reduced and kept in float32; plus 4 bytes per parameter of "
            "the largest layer (its gathered weights and gradients)",
            "DeepSpeed, deepspeed/runtime/zero/stage3.py, estimate_zero3_model_states_mem_needs "
            "(18 * total_params / total_gpus + 4 * largest_layer_params)",
        ),
        BytePolicy(
            "megatron",
            Precision(_BF16, _FP32, _FP32),
            "18: bf16 weights, float32 gradients (main_grad), float32 master weights and Adam moments",
            "Megatron-LM, megatron/training/theoretical_memory_usage.py, compute_weight_and_optimizer_memory",
            zero=0,
        ),
        BytePolicy(
            "megatron-distributed",
            Precision(_BF16, _FP32, _FP32),
            "6 + 12/d: as megatron, with the float32 master weights and moments split over the d "
            "data-parallel chips (--use-distributed-optimizer)",
            "Megatron-LM, megatron/training/theoretical_memory_usage.py, compute_weight_and_optimizer_memory",
            zero=1,
        ),
        BytePolicy(
            "scaling-book",
            Precision(_BF16, moments=_FP32),
            "2 + 8 = 10: bf16 weights (updated in place, no master copy) and float32 Adam moments; "
            "the book leaves the bf16 gradients out",
            'Austin et al., "How to Scale Your Model", Part 5 (Training), Data Parallelism',
        ),
        BytePolicy(
            "bf16",
            Precision(_BF16),
            "2 + 2 + 4 = 8: weights, gradients and Adam moments all bf16",
            "pure bf16 training: no float32 copy of anything",
        ),
    )
}


def names() -> list[str]:
    """The presets' names, in the order of the module's table."""
    return list(_POLICIES)


def get(name: str | BytePolicy) -> BytePolicy:
    """The preset called ``name`` (a :class:`BytePolicy` is returned as it is).

    >>> get("fp8")
    Traceback (most recent call last):
    ...
    shardsim.errors.PlanError: unknown byte policy 'fp8'; the presets are ['zero-mixed', ...
    """
    if isinstance(name, BytePolicy):
        return name
    try:
        return _POLICIES[name]
    except (KeyError, TypeError):
        raise PlanError(
            f"unknown byte policy {name!r}; the presets are {names()} (or pass precision= for your own)"
        ) from None
