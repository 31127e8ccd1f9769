"""The checks run before a step: the plan fits the mesh, the model fits the plan, the inputs fit the model.

Each failure names the culprit and the fix:

>>> from shardsim.models import TransformerConfig
>>> from shardsim.plan import Plan
>>> cfg = TransformerConfig(layers=1, d_model=8, heads=2, d_ff=16, vocab=10, seq=4)
>>> try:
...     check_model(cfg, Plan(tp=4), 4)
... except DivisibilityError as e:
...     print(str(e)[:56])
heads=2 does not divide by tp=4 (the model axis 'model')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..array import ShapeDtype
from ..errors import DivisibilityError, ModelInputError, PlanError, ShapeError
from ..mesh import Mesh
from ..models import TransformerConfig
from ..plan import Plan


def check_plan(plan: Plan, mesh: Mesh) -> None:
    plan.check(mesh)
    for role, key in (("expert", "ep"), ("context", "cp")):
        if plan.degree(role) > 1:
            raise PlanError(
                f"run_model runs data, ZeRO/FSDP, tensor, sequence and pipeline parallelism; "
                f"{key}={plan.degree(role)} is not part of it yet: set {key}=1"
            )


def check_model(cfg: TransformerConfig, plan: Plan, seq: int) -> None:
    """Every dimension the plan splits divides by its axis' size."""
    t = plan.tp
    ax = f"tp={t} (the model axis {plan.model_axis!r})"
    for what, n in (("heads", cfg.heads), ("d_ff", cfg.d_ff), ("vocab", cfg.vocab)):
        if n % t:
            fix = " (Megatron pads the vocabulary to a multiple of 128*tp)" if what == "vocab" else ""
            raise DivisibilityError(f"{what}={n} does not divide by {ax}; choose tp dividing {n}{fix}")
    if cfg.n_kv % t and t % cfg.n_kv:
        raise DivisibilityError(
            f"kv_heads={cfg.n_kv} and {ax} do not divide one another. Megatron splits the KV heads over the "
            f"model axis when tp divides kv_heads, and replicates each KV head on tp/kv_heads chips when "
            f"kv_heads divides tp; use tp in {_kv_degrees(cfg)}"
        )
    if plan.sp and seq % t:
        raise DivisibilityError(f"sequence length {seq} does not divide by {ax} for sequence parallelism (sp)")
    if plan.zero == 3 and plan.dp > 1 and cfg.d_model % plan.dp:
        raise DivisibilityError(
            f"d_model={cfg.d_model} does not divide by dp={plan.dp}: ZeRO-3 / FSDP splits every weight's D "
            "over the data axis"
        )


def _kv_degrees(cfg: TransformerConfig) -> list[int]:
    """The tensor-parallel degrees that split or replicate the KV heads evenly."""
    k = cfg.n_kv
    return [d for d in range(1, cfg.heads + 1) if cfg.heads % d == 0 and (k % d == 0 or d % k == 0)]


def check_pipeline(cfg: TransformerConfig, plan: Plan, batch: int) -> None:
    """Layers over stages x chunks, the batch over data x microbatches; no tied embeddings across stages."""
    parts = plan.pp * plan.virtual_stages
    if cfg.layers % parts:
        raise DivisibilityError(
            f"layers={cfg.layers} do not divide over pp={plan.pp} stages x virtual_stages={plan.virtual_stages}"
        )
    if batch % (plan.dp * plan.microbatches):
        raise DivisibilityError(
            f"batch B={batch} does not divide into dp={plan.dp} x microbatches={plan.microbatches} pieces"
        )
    if cfg.tie_embeddings:
        raise PlanError(
            "tie_embeddings with pp > 1: the embedding lives on the first stage and the LM head on the last; "
            "Megatron keeps a copy on each and AllReduces their gradients, which run_model does not yet do. "
            "Untie them or set pp=1"
        )


def shape_of(v: Any) -> tuple[int, ...]:
    return tuple(v.shape) if isinstance(v, ShapeDtype) else np.shape(v)


def check_params(cfg: TransformerConfig, params: Mapping[str, Any]) -> None:
    want = cfg.param_shapes()
    missing = [k for k in want if k not in params]
    extra = [k for k in params if k not in want]
    if missing or extra:
        raise ShapeError(
            f"params do not match the model {cfg.name or 'config'}: "
            + (f"missing {missing[:4]}{'...' if len(missing) > 4 else ''} " if missing else "")
            + (f"unknown {extra[:4]}" if extra else "")
            + "; build them with shardsim.models.reference.init(cfg)"
        )
    for k, shape in want.items():
        if shape_of(params[k]) != shape:
            raise ShapeError(f"param {k} must have shape {shape} for this config, got {shape_of(params[k])}")


def check_tokens(cfg: TransformerConfig, plan: Plan, tokens: Any, targets: Any) -> tuple[int, int]:
    """``(B, S)``; tokens and targets integers in ``[0, vocab)``, ``S <= cfg.seq``, B divisible by dp."""
    for name, v in (("tokens", tokens), ("targets", targets)):
        shape = shape_of(v)
        if len(shape) != 2:
            raise ModelInputError(f"{name} must be [B, S] token ids, got shape {shape}")
        if shape != shape_of(tokens):
            raise ModelInputError(f"targets must have the tokens' shape {shape_of(tokens)}, got {shape}")
        dt = v.dtype if isinstance(v, ShapeDtype) else np.asarray(v).dtype
        if dt.kind not in "iu":
            raise ModelInputError(f"{name} must be integer token ids, got dtype {dt}")
        if not isinstance(v, ShapeDtype):
            a = np.asarray(v)
            bad = (a < 0) | (a >= cfg.vocab)
            if bad.any():
                at = tuple(int(i) for i in np.argwhere(bad)[0])
                raise ModelInputError(
                    f"{name}{list(at)} = {int(a[at])} is outside the vocabulary [0, {cfg.vocab}); "
                    "map it to a valid id or grow cfg.vocab"
                )
    b, s = shape_of(tokens)
    if s > cfg.seq:
        raise ModelInputError(
            f"sequence length {s} is longer than the model's cfg.seq={cfg.seq}; cut the tokens to {cfg.seq} "
            "or use cfg.scaled(seq=...)"
        )
    if b % plan.dp:
        raise DivisibilityError(f"batch B={b} does not divide by dp={plan.dp} (the data axis {plan.data_axis!r})")
    return b, s
