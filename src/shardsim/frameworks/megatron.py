"""Megatron-LM's parallelism flags in and out: a launch command line as a :class:`Launch`, and back.

Megatron names the degrees ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
``--context-parallel-size`` and ``--expert-model-parallel-size``; the data-parallel degree is
what the world size leaves. Its expert parallelism is carved out of the data-parallel group,
so its data-parallel size is shardsim's ``dp x ep`` (:class:`~shardsim.plans.Plan`'s expert axis
splits the batch too). The rest of the plan:

- ``--sequence-parallel`` → ``sp``; ``--use-distributed-optimizer`` → ``zero=1``;
- ``--virtual-pipeline-model-parallel-size V`` or ``--num-layers-per-virtual-pipeline-stage L``
  (with ``--num-layers``) → the interleaved schedule with ``V`` chunks per stage, else 1F1B;
- ``--recompute-granularity selective`` or ``full`` (with ``--recompute-method uniform
  --recompute-num-layers 1``: every layer's input kept) → ``recompute``;
- ``--cp-comm-type p2p`` or ``all_gather`` → ``cp_method`` ring or all-gather;
- ``--attention-backend`` (``flash``, ``fused``, ``auto``: FlashAttention; ``unfused``: the
  standard softmax) or ``--use-flash-attn`` → ``attention`` (default flash, as Megatron-core's
  ``auto``); ``--bf16``, ``--fp16`` → ``precision``;
- ``--micro-batch-size``, ``--global-batch-size`` and ``--seq-length`` travel with the plan
  (its microbatches are ``global / (micro x dp x ep)``).

A flag that changes the computation in a way shardsim cannot express (``--fp8-format``,
``--cp-comm-type a2a``, partial recomputation, Megatron-FSDP) is refused by name, and so is any
flag this module does not know, except those that leave the step's program alone (learning
rates, data, logging, checkpoints, overlap switches: :data:`INERT`). Model flags
(``--num-layers``, ``--hidden-size``...) are the model's: checked against it when one is given.

>>> launch = from_megatron("--tensor-model-parallel-size 8 --pipeline-model-parallel-size 2 "
...                        "--sequence-parallel --use-distributed-optimizer --micro-batch-size 1 "
...                        "--global-batch-size 512 --seq-length 8192 --bf16", world_size=256)
>>> str(launch.plan), launch.batch_tokens
('dp=16,zero=1,tp=8,sp,pp=2,microbatches=32,precision=bf16', 4194304)
>>> from_megatron(to_megatron(launch), world_size=256) == launch
True
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from ..errors import PlanError
from ..models import TransformerConfig
from ..plans import Plan
from .launch import Launch

#: Flag prefixes that leave one training step's program as it is (read past).
INERT = (
    "--lr", "--min-lr", "--weight-decay", "--adam-", "--clip-grad", "--log", "--save", "--load", "--data-",
    "--tokenizer-", "--vocab-file", "--merge-file", "--train-", "--eval-", "--seed", "--init-method-std",
    "--distributed-backend", "--overlap-", "--tensorboard", "--wandb-", "--exit-", "--split", "--timing-",
    "--ckpt-", "--use-mcore-models", "--transformer-impl", "--distributed-timeout-minutes", "--manual-gc",
    "--tp-comm-overlap", "--accumulate-allreduce-grads-in-fp32", "--use-dist-ckpt", "--async-save",
)  # fmt: skip
_SWITCHES = {"--sequence-parallel", "--use-distributed-optimizer", "--use-flash-attn", "--bf16", "--fp16"}
_VALUED = {
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--virtual-pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--micro-batch-size", "--global-batch-size", "--seq-length", "--recompute-granularity", "--recompute-method",
    "--recompute-num-layers", "--cp-comm-type", "--attention-backend",
}  # fmt: skip
#: Model flags and the :class:`TransformerConfig` field each must equal.
MODEL = {
    "--num-layers": "layers", "--hidden-size": "d_model", "--ffn-hidden-size": "d_ff",
    "--num-attention-heads": "heads", "--num-query-groups": "n_kv", "--max-position-embeddings": "seq",
    "--kv-channels": "hd",
}  # fmt: skip
_REFUSED = {
    "--fp8-format": "FP8 training is not modelled here",
    "--use-megatron-fsdp": "Megatron-FSDP's sharding strategies are not read yet; use --use-distributed-optimizer",
    "--use-custom-fsdp": "Megatron-FSDP's sharding strategies are not read yet; use --use-distributed-optimizer",
    "--decoder-first-pipeline-num-layers": "uneven first and last stages are placed by shardsim itself",
    "--decoder-last-pipeline-num-layers": "uneven first and last stages are placed by shardsim itself",
    "--expert-tensor-parallel-size": "experts split over their own tensor-parallel group are not modelled",
    "--hierarchical-context-parallel-sizes": "hierarchical context parallelism is not modelled",
}


def from_megatron(args: str | Sequence[str], *, world_size: int, model: TransformerConfig | None = None) -> Launch:
    """The :class:`Launch` of Megatron-LM flags (a command line or its words) on ``world_size``
    GPUs (module doc); ``model``, when given, must agree with the model flags among them.
    Any flag it cannot honour is refused with a :class:`~shardsim.errors.PlanError` naming it."""
    words = shlex.split(args) if isinstance(args, str) else list(args)
    flags = _parse(words)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise PlanError(f"world_size={world_size!r}: the number of GPUs the launch runs on, a whole number >= 1")

    def size(flag: str, default: int = 1) -> int:
        value = str(flags.get(flag, default))
        try:
            n = int(value)
        except (TypeError, ValueError):
            n = 0
        if n < 1 or value != str(n):
            raise PlanError(f"{flag} {value}: a whole number >= 1")
        return n

    if model is not None:
        for flag, attr in MODEL.items():
            if flag in flags and size(flag) != getattr(model, attr):
                raise PlanError(f"{flag} {flags[flag]}: the model has {attr}={getattr(model, attr)}")
    tp, pp, cp, ep = (
        size(f"--{k}-parallel-size") for k in ("tensor-model", "pipeline-model", "context", "expert-model")
    )
    if world_size % (tp * pp * cp):
        raise PlanError(
            f"world size {world_size} does not divide by tensor x pipeline x context = {tp} x {pp} x {cp}; "
            "the data-parallel size is what it leaves"
        )
    data = world_size // (tp * pp * cp)
    if data % ep:
        raise PlanError(f"--expert-model-parallel-size {ep}: the data-parallel size {data} does not divide by it")
    if "--sequence-parallel" in flags and tp == 1:
        raise PlanError(
            "--sequence-parallel splits the tensor-parallel group's tokens: give --tensor-model-parallel-size > 1"
        )
    for flag in ("--global-batch-size", "--seq-length"):
        if flag not in flags:
            raise PlanError(f"{flag}: give it (the batch and the sequence travel with the plan)")
    micro, global_batch, seq = size("--micro-batch-size"), size("--global-batch-size"), size("--seq-length")
    if global_batch % (micro * data):
        raise PlanError(
            f"--global-batch-size {global_batch} does not divide into microbatches of {micro} over {data} data ranks"
        )
    fields: dict[str, Any] = {"dp": data // ep, "ep": ep, "tp": tp, "pp": pp, "cp": cp}
    fields["microbatches"] = global_batch // (micro * data)
    fields["sp"] = "--sequence-parallel" in flags
    fields["zero"] = 1 if "--use-distributed-optimizer" in flags and data > 1 else 0
    fields.update(_schedule(flags, pp, size))
    fields["recompute"] = _recompute(flags)
    fields.update(_attention(flags, cp))
    if "--bf16" in flags and "--fp16" in flags:
        raise PlanError("--bf16 and --fp16: choose one")
    fields["precision"] = "bf16" if "--bf16" in flags else "fp16" if "--fp16" in flags else None
    return Launch(Plan(**fields), micro, global_batch, seq)


def to_megatron(launch: Launch) -> list[str]:
    """Megatron-LM's flags for ``launch`` (the words of a command line; module doc). A plan field
    Megatron has no flag for (ZeRO-2 and 3, GPipe, unbalanced context chunks) is refused by name.

    >>> " ".join(to_megatron(Launch(Plan(dp=4, tp=2, sp=True), 1, 8, 4096)))
    '--tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 1 --global-batch-size 8 --seq-length 4096'
    """
    p = launch.plan
    if p.zero > 1:
        raise PlanError(f"zero={p.zero}: Megatron-LM's flags here express ZeRO-1 (--use-distributed-optimizer) at most")
    if p.pp > 1 and p.schedule not in ("1f1b", "interleaved"):
        raise PlanError(f"schedule={p.schedule}: Megatron-LM's flags here run 1F1B or the interleaved schedule")
    if p.cp > 1 and not p.cp_balanced:
        raise PlanError("cp_balanced=False: Megatron-LM's context parallelism balances the causal chunks")
    out: list[str] = []
    for flag, degree in (("tensor-model", p.tp), ("pipeline-model", p.pp), ("context", p.cp), ("expert-model", p.ep)):
        if degree > 1:
            out += [f"--{flag}-parallel-size", str(degree)]
    if p.sp:
        out.append("--sequence-parallel")
    if p.zero == 1:
        out.append("--use-distributed-optimizer")
    if p.virtual_stages > 1:
        out += ["--virtual-pipeline-model-parallel-size", str(p.virtual_stages)]
    if p.cp > 1:
        out += ["--cp-comm-type", "p2p" if p.cp_method == "ring" else "all_gather"]
    if p.recompute == "selective":
        out += ["--recompute-granularity", "selective"]
    elif p.recompute == "full":
        out += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if p.attention == "standard":
        out += ["--attention-backend", "unfused"]
    if p.precision in ("bf16", "fp16"):
        out.append(f"--{p.precision}")
    elif p.precision is not None:
        raise PlanError(f"precision={p.precision!r}: Megatron-LM's flags are --bf16 or --fp16")
    out += ["--micro-batch-size", str(launch.micro_batch), "--global-batch-size", str(launch.global_batch)]
    return [*out, "--seq-length", str(launch.seq)]


def _parse(words: list[str]) -> dict[str, str | None]:
    """``{flag: value or None}``: every flag known, inert or refused by name."""
    flags: dict[str, str | None] = {}
    i = 0
    while i < len(words):
        flag = words[i]
        if not flag.startswith("--"):
            raise PlanError(f"{flag!r}: expected a flag (--tensor-model-parallel-size 8 ...)")
        if flag in _REFUSED:
            raise PlanError(f"{flag}: {_REFUSED[flag]}")
        takes_value = i + 1 < len(words) and not words[i + 1].startswith("--")
        if flag in _VALUED or flag in MODEL:
            if not takes_value:
                raise PlanError(f"{flag}: give its value")
            flags[flag] = words[i + 1]
        elif flag in _SWITCHES:
            flags[flag] = None
        elif not flag.startswith(INERT):
            raise PlanError(
                f"{flag}: not a Megatron-LM flag shardsim reads; it refuses rather than ignores what may change "
                "the step (remove it if it does not)"
            )
        i += 2 if takes_value else 1
    return flags


def _schedule(flags: dict[str, str | None], pp: int, size: Any) -> dict[str, Any]:
    if "--virtual-pipeline-model-parallel-size" in flags:
        v = size("--virtual-pipeline-model-parallel-size")
    elif "--num-layers-per-virtual-pipeline-stage" in flags:
        if "--num-layers" not in flags:
            raise PlanError(
                "--num-layers-per-virtual-pipeline-stage: give --num-layers too (the chunks per stage follow)"
            )
        layers, per = size("--num-layers"), size("--num-layers-per-virtual-pipeline-stage")
        if layers % (pp * per):
            raise PlanError(f"--num-layers {layers} does not divide into {pp} stages of chunks of {per} layers")
        v = layers // (pp * per)
    else:
        v = 1
    if v > 1 and pp == 1:
        raise PlanError("a virtual pipeline needs --pipeline-model-parallel-size > 1")
    return {"schedule": "interleaved", "virtual_stages": v} if v > 1 else {}


def _recompute(flags: dict[str, str | None]) -> str:
    granularity = flags.get("--recompute-granularity")
    if granularity is None:
        for flag in ("--recompute-method", "--recompute-num-layers"):
            if flag in flags:
                raise PlanError(f"{flag}: give --recompute-granularity full too")
        return "none"
    if granularity == "selective":
        return "selective"
    if granularity != "full":
        raise PlanError(f"--recompute-granularity {granularity}: choose selective or full")
    method, layers = flags.get("--recompute-method", "uniform"), flags.get("--recompute-num-layers", "1")
    if method != "uniform" or layers != "1":
        raise PlanError(
            f"--recompute-method {method} --recompute-num-layers {layers}: only every layer recomputed from its "
            "own input (uniform, 1) is modelled"
        )
    return "full"


def _attention(flags: dict[str, str | None], cp: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    backend = flags.get("--attention-backend")
    if backend is not None and backend not in ("flash", "fused", "auto", "unfused"):
        raise PlanError(f"--attention-backend {backend}: choose flash, fused, auto or unfused")
    if backend == "unfused":
        if "--use-flash-attn" in flags:
            raise PlanError("--attention-backend unfused and --use-flash-attn: choose one")
        out["attention"] = "standard"
    comm = flags.get("--cp-comm-type")
    if comm is not None:
        if comm not in ("p2p", "all_gather"):
            raise PlanError(f"--cp-comm-type {comm}: shardsim models p2p (ring) and all_gather context parallelism")
        if cp == 1:
            raise PlanError("--cp-comm-type: give --context-parallel-size > 1")
        out["cp_method"] = "ring" if comm == "p2p" else "all_gather"
    return out


__all__ = ["INERT", "MODEL", "from_megatron", "to_megatron"]
