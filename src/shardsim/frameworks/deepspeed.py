"""DeepSpeed's JSON configuration in and out: its ZeRO stage and batch as a :class:`Launch`, and back.

A DeepSpeed run is data parallel over the world size (``dp = N``); its configuration gives:

- ``zero_optimization.stage`` (0 to 3) → ``zero``;
- ``train_micro_batch_size_per_gpu`` and ``gradient_accumulation_steps`` → the micro-batch and
  ``microbatches``; ``train_batch_size``, when given, must equal their product with ``dp``;
- ``bf16.enabled``, ``fp16.enabled`` → ``precision``.

The sequence is not DeepSpeed's to give: pass ``seq``. What changes the step in a way shardsim
does not model is refused by name (offloading the optimizer or the weights to the host,
ZeRO++'s quantised or hierarchical collectives, a pipeline or tensor-parallel engine configured
elsewhere, an optimizer other than Adam or AdamW); the communication tuning knobs
(bucket sizes, ``overlap_comm``, ``contiguous_gradients``, prefetch sizes), the scheduler,
logging and gradient clipping are read past. ``activation_checkpointing`` is refused: the
model's code decides what it recomputes, so set the plan's ``recompute`` yourself.

>>> launch = from_deepspeed({"zero_optimization": {"stage": 3}, "bf16": {"enabled": True},
...     "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}, world_size=64, seq=4096)
>>> str(launch.plan), launch.global_batch
('dp=64,zero=3,microbatches=4,precision=bf16', 512)
>>> from_deepspeed(to_deepspeed(launch), world_size=64, seq=4096) == launch
True
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import PlanError
from ..plans import Plan
from .launch import Launch

#: Top-level sections and ZeRO keys that leave one step's program as it is (read past).
INERT = frozenset({
    "steps_per_print", "wall_clock_breakdown", "gradient_clipping", "scheduler", "tensorboard", "wandb",
    "csv_monitor", "comms_logger", "flops_profiler", "prescale_gradients", "gradient_predivide_factor",
    "zero_allow_untested_optimizer", "dump_state", "checkpoint", "data_efficiency", "communication_data_type",
    "seq_parallel_communication_data_type", "memory_breakdown", "timers", "elasticity_enabled",
})  # fmt: skip
_ZERO_INERT = frozenset({
    "stage", "overlap_comm", "contiguous_gradients", "reduce_bucket_size", "allgather_bucket_size",
    "reduce_scatter", "allgather_partitions", "round_robin_gradients", "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save", "sub_group_size", "load_from_fp32_weights",
    "elastic_checkpoint", "ignore_unused_parameters", "use_multi_rank_bucket_allreduce",
})  # fmt: skip
_ZERO_REFUSED = {
    "offload_optimizer": "the optimizer state offloaded to the host is not modelled",
    "offload_param": "the weights offloaded to the host are not modelled",
    "zero_quantized_weights": "ZeRO++'s quantised weight gathers are not modelled",
    "zero_quantized_gradients": "ZeRO++'s quantised gradient reductions are not modelled",
    "zero_hpz_partition_size": "ZeRO++'s hierarchical partitioning is not modelled",
    "mics_shard_size": "MiCS sharding is not modelled",
}
_KNOWN = {"zero_optimization", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
          "bf16", "fp16", "optimizer"}  # fmt: skip


def from_deepspeed(source: str | os.PathLike[str] | Mapping[str, Any], *, world_size: int, seq: int) -> Launch:
    """The :class:`Launch` of a DeepSpeed configuration (a JSON path or its parsed dict) on
    ``world_size`` GPUs at ``seq`` tokens a sequence (module doc); what it cannot honour is
    refused with a :class:`~shardsim.errors.PlanError` naming the key."""
    config, where = _read(source)
    for key, value in (("world_size", world_size), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{key}={value!r}: a whole number >= 1")
    if config.get("activation_checkpointing"):
        raise PlanError(
            f"{where}: activation_checkpointing: the model's code decides what it recomputes; read the launch "
            "without it and set the plan's recompute= (launch.plan.replace(recompute='full'))"
        )
    unknown = sorted(set(config) - _KNOWN - INERT - {"activation_checkpointing"})
    if unknown:
        raise PlanError(
            f"{where}: {', '.join(unknown)}: not DeepSpeed keys shardsim reads; it refuses rather than ignores "
            "what may change the step (remove them if they do not)"
        )
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, Mapping):
        raise PlanError(f"{where}: zero_optimization={zero!r}: a JSON object")
    for key in zero:
        if key in _ZERO_REFUSED and zero[key] not in (None, False, {}, {"device": "none"}):
            raise PlanError(f"{where}: zero_optimization.{key}: {_ZERO_REFUSED[key]}")
        if key not in _ZERO_INERT and key not in _ZERO_REFUSED:
            raise PlanError(f"{where}: zero_optimization.{key}: not a ZeRO key shardsim reads")
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        raise PlanError(f"{where}: zero_optimization.stage={stage!r}: 0, 1, 2 or 3")
    section = config.get("optimizer", {})
    if not isinstance(section, Mapping):
        raise PlanError(f"{where}: optimizer={section!r}: a JSON object with its type")
    optimizer = section.get("type", "Adam")
    if str(optimizer).lower() not in ("adam", "adamw", "fusedadam"):
        raise PlanError(f"{where}: optimizer.type={optimizer!r}: the byte policies here keep Adam's state")
    micro = _count(config, "train_micro_batch_size_per_gpu", where, 1)
    steps = _count(config, "gradient_accumulation_steps", where, 1)
    if "train_batch_size" in config and _count(config, "train_batch_size", where, 1) != micro * steps * world_size:
        raise PlanError(
            f"{where}: train_batch_size={config['train_batch_size']} is not train_micro_batch_size_per_gpu x "
            f"gradient_accumulation_steps x world size = {micro} x {steps} x {world_size}"
        )
    precision = [p for p in ("bf16", "fp16") if isinstance(config.get(p), Mapping) and config[p].get("enabled")]
    if len(precision) > 1:
        raise PlanError(f"{where}: bf16 and fp16 both enabled: choose one")
    plan = Plan(dp=world_size, zero=stage if world_size > 1 else 0, microbatches=steps,
                precision=precision[0] if precision else None)  # fmt: skip
    return Launch(plan, micro, micro * steps * world_size, seq)


def to_deepspeed(launch: Launch) -> dict[str, Any]:
    """DeepSpeed's configuration of ``launch``; a plan with another parallelism than data (which
    DeepSpeed's JSON does not configure) is refused by name.

    >>> to_deepspeed(Launch(Plan(dp=8, zero=2, microbatches=2), 1, 16, 2048))["zero_optimization"]
    {'stage': 2}
    """
    p = launch.plan
    for name, degree in (("tp", p.tp), ("pp", p.pp), ("cp", p.cp), ("ep", p.ep)):
        if degree > 1:
            raise PlanError(f"{name}={degree}: a DeepSpeed configuration sets data parallelism and ZeRO only")
    out: dict[str, Any] = {
        "train_batch_size": launch.global_batch,
        "train_micro_batch_size_per_gpu": launch.micro_batch,
        "gradient_accumulation_steps": p.microbatches,
        "zero_optimization": {"stage": p.zero},
    }
    if p.precision in ("bf16", "fp16"):
        out[p.precision] = {"enabled": True}
    elif p.precision is not None:
        raise PlanError(f"precision={p.precision!r}: DeepSpeed's are bf16 or fp16")
    return out


def _read(source: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    if isinstance(source, Mapping):
        return dict(source), "ds_config"
    path = Path(source)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise PlanError(f"{path}: cannot read it ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise PlanError(f"{path}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(config, dict):
        raise PlanError(f"{path}: a DeepSpeed configuration is one JSON object")
    return config, str(path)


def _count(config: Mapping[str, Any], key: str, where: str, default: int) -> int:
    value = config.get(key, default)
    if value == "auto":
        raise PlanError(f"{where}: {key}='auto': give the number (the launch's own value)")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{where}: {key}={value!r}: a whole number >= 1")
    return value


__all__ = ["INERT", "from_deepspeed", "to_deepspeed"]
