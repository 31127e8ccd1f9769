"""torchtitan's TOML job configuration in and out: its parallelism as a :class:`Launch`, and back.

torchtitan reads its degrees from ``[parallelism]``: ``data_parallel_shard_degree`` (FSDP2,
``-1`` for what the world size leaves), ``data_parallel_replicate_degree`` (DDP),
``tensor_parallel_degree`` (always with sequence parallelism on the norms), ``pipeline_parallel_degree``
with its ``pipeline_parallel_schedule`` and ``pipeline_parallel_microbatch_size``,
``context_parallel_degree`` with ``context_parallel_rotate_method``; ``[activation_checkpoint]``
``mode`` (``none`` or ``full``; its per-op ``selective`` is not the selective recomputation
modelled here, so it is refused unless ``recompute=`` overrides it); ``[training]``
``local_batch_size`` (per data rank), ``global_batch_size`` (gradient accumulation when larger)
and ``seq_len``, ``mixed_precision_param``.

FSDP is ``zero=3`` and DDP ``zero=0``; both at once (HSDP), ``fsdp_reshard_after_forward =
"never"``, expert parallelism, the zero-bubble and looped schedules, every-N-layers
checkpointing, Float8 and a non-Adam optimizer are refused by name, as is any key not known.
Sections that do not change the step (``[job]``, ``[metrics]``, ``[checkpoint]``, ``[compile]``,
``[lr_scheduler]``, ``[profiling]``, ``[comm]``, ``[validation]``) are read past; ``[model]``
names the model, which is the caller's to give.

>>> text = '''
... [training]
... local_batch_size = 2
... seq_len = 8192
... [parallelism]
... data_parallel_shard_degree = -1
... tensor_parallel_degree = 8
... [activation_checkpoint]
... mode = "full"
... '''
>>> launch = from_torchtitan(text, world_size=64)
>>> str(launch.plan), launch.global_batch
('dp=8,zero=3,tp=8,sp,recompute=full,precision=bf16', 16)
>>> from_torchtitan(to_torchtitan(launch), world_size=64) == launch
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomllib

from ..errors import PlanError
from ..plans import Plan
from .launch import Launch

#: Sections read past: they change no step's program.
INERT = frozenset({"job", "metrics", "checkpoint", "compile", "lr_scheduler", "profiling", "comm", "validation",
                   "model", "experimental", "fault_tolerance", "memory_estimation"})  # fmt: skip
_KEYS = {
    "training": {"local_batch_size", "batch_size", "global_batch_size", "seq_len", "mixed_precision_param",
                 "mixed_precision_reduce", "steps", "max_norm", "warmup_steps", "dataset", "dataset_path",
                 "gc_freq", "seed", "deterministic", "enable_cpu_offload", "compile"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "enable_async_tensor_parallel", "disable_loss_parallel",
                    "pipeline_parallel_degree", "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_layers_per_stage", "context_parallel_degree", "context_parallel_rotate_method",
                    "expert_parallel_degree", "expert_tensor_parallel_degree"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
    "optimizer": {"name", "lr", "eps", "beta1", "beta2", "weight_decay", "implementation", "early_step_in_backward"},
    "float8": {"enable_fsdp_float8_all_gather", "recipe_name"},
}  # fmt: skip
_SCHEDULES = {"GPipe": "gpipe", "1F1B": "1f1b", "Interleaved1F1B": "interleaved"}


def from_torchtitan(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    world_size: int,
    layers: int | None = None,
    recompute: str | None = None,
) -> Launch:
    """The :class:`Launch` of a torchtitan job configuration (TOML text, a path, or its parsed
    dict) on ``world_size`` GPUs (module doc). ``layers``, the model's, is needed only with
    ``pipeline_parallel_layers_per_stage`` (the chunks per stage follow from it).
    ``recompute`` (``none``, ``selective``, ``full``) overrides ``[activation_checkpoint]``:
    torchtitan's per-op selective checkpointing (``selective_ac_option = "op"``: keep the
    matmuls' outputs, recompute the rest) is not the selective recomputation modelled here
    (Korthikanti et al.: recompute the attention core), so it is refused unless overridden."""
    config, where = _read(source)
    _refuse(config, where)
    train, par, ac = config.get("training", {}), config.get("parallelism", {}), config.get("activation_checkpoint", {})

    def degree(key: str, table: Mapping[str, Any] = par, default: int = 1) -> int:
        value = table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{where}: {key}={value!r}: a whole number >= 1")
        return value

    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise PlanError(f"world_size={world_size!r}: the number of GPUs the job runs on, a whole number >= 1")
    tp, pp, cp = degree("tensor_parallel_degree"), degree("pipeline_parallel_degree"), degree("context_parallel_degree")
    for key in ("expert_parallel_degree", "expert_tensor_parallel_degree"):
        if degree(key) > 1:
            raise PlanError(f"{where}: {key}={par[key]}: torchtitan's expert parallelism is not read yet")
    replicate = degree("data_parallel_replicate_degree")
    shard = par.get("data_parallel_shard_degree", -1)
    rest, left = divmod(world_size, replicate * tp * pp * cp)
    if left:
        raise PlanError(
            f"world size {world_size} does not divide by replicate x tensor x pipeline x context = "
            f"{replicate} x {tp} x {pp} x {cp}"
        )
    shard = rest if shard == -1 else degree("data_parallel_shard_degree")
    if shard != rest:
        raise PlanError(
            f"{where}: data_parallel_shard_degree={shard}: the degrees' product is not the world size {world_size} "
            f"(the shard degree would be {rest}; -1 takes it)"
        )
    if replicate > 1 and shard > 1:
        raise PlanError(
            f"{where}: data_parallel_replicate_degree={replicate} with shard degree {shard}: HSDP is not modelled"
        )
    reshard = par.get("fsdp_reshard_after_forward", "default")
    if reshard not in ("default", "always"):
        raise PlanError(
            f"{where}: fsdp_reshard_after_forward={reshard!r}: only resharding after the forward is modelled"
        )
    dp = replicate * shard
    local = degree("local_batch_size", train, degree("batch_size", train, 8))
    global_batch = train.get("global_batch_size", -1)
    global_batch = local * dp if global_batch == -1 else degree("global_batch_size", train)
    if global_batch % (local * dp):
        raise PlanError(
            f"{where}: global_batch_size={global_batch} is not a multiple of local_batch_size x dp = {local} x {dp}"
        )
    accumulation = global_batch // (local * dp)
    seq = degree("seq_len", train, 2048)
    fields: dict[str, Any] = {"dp": dp, "zero": 3 if shard > 1 else 0, "tp": tp, "sp": tp > 1, "pp": pp, "cp": cp}
    micro, m = local, accumulation
    if pp > 1:
        schedule = par.get("pipeline_parallel_schedule", "1F1B")
        if schedule not in _SCHEDULES:
            raise PlanError(f"{where}: pipeline_parallel_schedule={schedule!r}: shardsim runs {sorted(_SCHEDULES)}")
        micro = degree("pipeline_parallel_microbatch_size")
        if local % micro:
            raise PlanError(f"{where}: local_batch_size={local} does not split into microbatches of {micro}")
        m = accumulation * local // micro
        fields["schedule"] = _SCHEDULES[schedule]
        if schedule == "Interleaved1F1B":
            per = par.get("pipeline_parallel_layers_per_stage")
            if per is None or layers is None:
                raise PlanError(f"{where}: Interleaved1F1B: give pipeline_parallel_layers_per_stage and layers=")
            fields["virtual_stages"] = layers // (pp * degree("pipeline_parallel_layers_per_stage"))
    fields["microbatches"] = m
    fields["recompute"] = _recompute(ac, where) if recompute is None else recompute
    if cp > 1:
        rotate = par.get("context_parallel_rotate_method", "allgather")
        if rotate not in ("allgather", "alltoall"):
            raise PlanError(f"{where}: context_parallel_rotate_method={rotate!r}: allgather or alltoall")
        fields["cp_method"] = "all_gather" if rotate == "allgather" else "ring"
    precision = train.get("mixed_precision_param", "bfloat16")
    if precision not in ("bfloat16", "float32"):
        raise PlanError(f"{where}: mixed_precision_param={precision!r}: bfloat16 or float32")
    fields["precision"] = "bf16" if precision == "bfloat16" else "fp32"
    return Launch(Plan(**fields), micro, global_batch, seq)


def to_torchtitan(launch: Launch) -> str:
    """The TOML of ``launch``'s ``[training]``, ``[parallelism]`` and ``[activation_checkpoint]``
    (module doc); a plan torchtitan cannot express (ZeRO-1 and 2, TP without SP, expert
    parallelism, interleaving without the model's layers) is refused by name.

    >>> print(to_torchtitan(Launch(Plan(dp=4), 2, 8, 1024)).splitlines()[1])
    local_batch_size = 2
    """
    p = launch.plan
    if p.zero in (1, 2):
        raise PlanError(f"zero={p.zero}: torchtitan runs FSDP (zero=3) or DDP (zero=0)")
    if p.tp > 1 and not p.sp:
        raise PlanError("sp=False: torchtitan's tensor parallelism always splits the norms' tokens (sp)")
    if p.ep > 1:
        raise PlanError(f"ep={p.ep}: torchtitan's expert parallelism is not written yet")
    if p.virtual_stages > 1:
        raise PlanError("virtual_stages: torchtitan counts chunks by layers per stage; write it by hand")
    if p.recompute == "selective":
        raise PlanError(
            "recompute=selective: torchtitan's selective checkpointing is per op, not the attention core's; "
            "write none or full"
        )
    if p.precision not in (None, "bf16", "fp32"):
        raise PlanError(f"precision={p.precision!r}: torchtitan's are bfloat16 or float32")
    per_rank = launch.micro_batch * (p.microbatches if p.pp > 1 else 1)
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": p.dp if p.zero == 0 else 1,
        "data_parallel_shard_degree": p.dp if p.zero == 3 else 1,
        "tensor_parallel_degree": p.tp, "pipeline_parallel_degree": p.pp, "context_parallel_degree": p.cp,
    }  # fmt: skip
    if p.pp > 1:
        names = {v: k for k, v in _SCHEDULES.items()}
        if p.schedule not in names:  # its zero-bubble schedules are ZB-V and interleaved: not these
            raise PlanError(f"schedule={p.schedule}: torchtitan's schedules here are {sorted(names)}")
        schedule = names[p.schedule]
        parallelism |= {"pipeline_parallel_schedule": schedule, "pipeline_parallel_microbatch_size": launch.micro_batch}
    if p.cp > 1:
        parallelism["context_parallel_rotate_method"] = "allgather" if p.cp_method == "all_gather" else "alltoall"
    sections = {
        "training": {
            "local_batch_size": per_rank, "global_batch_size": launch.global_batch, "seq_len": launch.seq,
            "mixed_precision_param": "float32" if p.precision == "fp32" else "bfloat16",
        },
        "parallelism": parallelism,
        "activation_checkpoint": {"mode": p.recompute},
    }  # fmt: skip
    lines: list[str] = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {v!r}".replace("'", '"') for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _refuse(config: Mapping[str, Any], where: str) -> None:
    """Refuse, by name, a section or key not known and what changes the step unmodelled."""
    for section, table in config.items():
        if section in INERT:
            continue
        if section not in _KEYS or not isinstance(table, Mapping):
            raise PlanError(f"{where}: [{section}]: not a torchtitan section shardsim reads")
        unknown = sorted(set(table) - _KEYS[section])
        if unknown:
            raise PlanError(f"{where}: [{section}] {', '.join(unknown)}: not keys shardsim reads")
    opt, fp8 = config.get("optimizer", {}), config.get("float8", {})
    converters = str(config.get("model", {}).get("converters", ""))
    if fp8.get("enable_fsdp_float8_all_gather") or fp8.get("recipe_name") or "float8" in converters:
        raise PlanError(f"{where}: [float8]: FP8 training is not modelled here")
    if str(opt.get("name", "AdamW")).lower() not in ("adam", "adamw"):
        raise PlanError(f"{where}: [optimizer] name={opt['name']!r}: the byte policies here keep Adam's state")
    if config.get("training", {}).get("enable_cpu_offload"):
        raise PlanError(f"{where}: [training] enable_cpu_offload: offloading to the host is not modelled")


def _recompute(ac: Mapping[str, Any], where: str) -> str:
    mode = ac.get("mode", "selective")
    if mode == "selective":
        option = ac.get("selective_ac_option", "op")
        if option != "op":
            raise PlanError(f"{where}: selective_ac_option={option!r}: checkpointing every N layers is not modelled")
        raise PlanError(
            f'{where}: [activation_checkpoint] mode="selective": torchtitan\'s per-op checkpointing (keep the '
            "matmuls' outputs, recompute the rest) is not the selective recomputation modelled here; set mode "
            '"none" or "full", or pass recompute= to from_torchtitan'
        )
    if mode not in ("none", "full"):
        raise PlanError(f"{where}: [activation_checkpoint] mode={mode!r}: none, selective or full")
    return str(mode)


def _read(source: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    if isinstance(source, Mapping):
        return dict(source), "job config"
    if isinstance(source, str) and "\n" in source:
        text, where = source, "job config"
    else:
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise PlanError(f"{path}: cannot read it ({e.strerror or e})") from None
        where = str(path)
    try:
        return tomllib.loads(text), where
    except tomllib.TOMLDecodeError as e:
        raise PlanError(f"{where}: not TOML ({e})") from None


__all__ = ["INERT", "from_torchtitan", "to_torchtitan"]
