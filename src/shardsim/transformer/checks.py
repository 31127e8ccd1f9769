"""The checks run before a step: the plan fits the mesh, the model fits the plan, the inputs fit the model.

Each failure names the culprit and the fix:

>>> from shardsim.models import TransformerConfig
>>> from shardsim.plans import Plan
>>> cfg = TransformerConfig(layers=1, d_model=8, heads=2, d_ff=16, vocab=10, seq=4)
>>> try:
...     check_model(cfg, Plan(tp=4), 4)
... except DivisibilityError as e:
...     print(str(e)[:56])
heads=2 does not divide by tp=4 (the model axis 'model')
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._divisors import divisors
from ..array import ShapeDtype
from ..errors import ArgumentTypeError, DivisibilityError, ModelInputError, PlanError
from ..layout import Layout
from ..mesh import Mesh
from ..models import TransformerConfig
from ..plans import DEGREE, ROLES, Plan


def check_plan(plan: Plan, mesh: Mesh) -> None:
    plan.check(mesh)


def check_model(cfg: TransformerConfig, plan: Plan, seq: int, *, dropout_on: bool = False) -> None:
    """Every dimension the plan splits divides by its axis' size (``dropout_on``: the step drops)."""
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
    if plan.cp > 1:
        _check_context(cfg, plan, seq, dropout_on)
    elif plan.attention == "flash" and dropout_on:
        raise PlanError(
            f"cfg.dropout={cfg.dropout} with attention=flash: attention dropout draws its masks on the whole "
            "[B, N, S, S] probabilities, which FlashAttention never forms; run without a dropout_seed, with "
            "cfg.scaled(dropout=0.0) or with attention=standard"
        )
    if cfg.experts or plan.ep > 1:
        _check_experts(cfg, plan)
    if plan.zero and plan.dp > 1:
        _check_zero_splits(cfg, plan)


#: What each ZeRO stage splits over the data axis.
_ZERO_SPLITS = {
    1: "ZeRO-1 splits every weight's optimizer state",
    2: "ZeRO-2 splits every weight's gradient and optimizer state",
    3: "ZeRO-3 / FSDP splits every weight, its gradient and optimizer state",
}


def _check_zero_splits(cfg: TransformerConfig, plan: Plan) -> None:
    """Every weight's dimension ZeRO splits over the data axis (its D, or a bias's only one) divides by the
    chips splitting it, checked on one block's weights and the others' (every block has the same shapes)."""
    from .roles import Roles

    what = f"{_ZERO_SPLITS[plan.zero]} over the data axis {plan.data_axis!r}"
    if cfg.d_model % plan.dp:
        raise DivisibilityError(
            f"d_model={cfg.d_model} does not divide by dp={plan.dp}: {what}, along D; "
            f"choose dp among {divisors(cfg.d_model, at_most=8)} (dividing {cfg.d_model}) or zero=0"
        )
    roles = Roles.of(plan, cfg.n_kv)
    degrees = {plan.axes()[r]: plan.degree(r) for r in ROLES if plan.degree(r) > 1}
    for key, shape in {**cfg.outer_shapes(), **cfg.layer_shapes(0)}.items():
        layout = Layout.parse("[" + ", ".join(roles.weight_dims(key, sharded=True)) + "]", tuple(degrees))
        for i, n in enumerate(shape):
            axes = layout.dim_axes(i)
            chips = math.prod(degrees[a] for a in axes)
            if plan.data_axis in axes and n % chips:
                over = " x ".join(f"{DEGREE[_role(plan, a)]}={degrees[a]}" for a in axes)
                per_dp = n // (chips // plan.dp)  # what the data axis splits, after the other axes' split
                raise DivisibilityError(
                    f"weight {key} [{', '.join(layout.names)}] of shape {shape}: {layout.names[i]}={n} does not "
                    f"divide by {over}: {what}, along its {'D' if 'D' in layout.names else 'only dimension'}; "
                    f"choose dp among {divisors(per_dp, at_most=8)} (dividing {per_dp}) or zero=0"
                )


def _role(plan: Plan, axis: str) -> str:
    return next(r for r in ROLES if plan.axes()[r] == axis)


def _check_context(cfg: TransformerConfig, plan: Plan, seq: int, dropout_on: bool) -> None:
    """The sequence splits evenly over the context axis (in 2·cp chunks when balanced, times tp under SP)."""
    c = plan.cp
    ax = f"cp={c} (the context axis {plan.context_axis!r})"
    chunks = 2 * c if plan.cp_balanced else c
    if seq % chunks:
        how = f"2*cp = {chunks} chunks for the balanced (zigzag) split" if plan.cp_balanced else f"{c} blocks"
        fits = [chunks * m for m in range(max(1, seq // chunks), max(1, seq // chunks) + 3)]
        raise DivisibilityError(
            f"sequence length {seq} does not divide into {how} of {ax}; use a length in {fits}"
            + (" or cp_balanced=false (contiguous blocks)" if plan.cp_balanced and seq % c == 0 else "")
        )
    if plan.sp and seq % (c * plan.tp):
        raise DivisibilityError(
            f"sequence length {seq} does not divide by cp x tp = {c * plan.tp}: sequence parallelism splits "
            f"each context block over the model axis too"
        )
    if dropout_on:
        raise PlanError(
            f"cfg.dropout={cfg.dropout} with {ax}: attention dropout draws its masks on the whole "
            "[B, N, S, S] probabilities, which context parallelism never forms (at long sequences they "
            "cannot be drawn); run without a dropout_seed or with cfg.scaled(dropout=0.0)"
        )


def _check_experts(cfg: TransformerConfig, plan: Plan) -> None:
    """Expert parallelism needs experts, as many per chip; what the MoE block does not combine with yet."""
    if not cfg.experts:
        raise PlanError(
            f"ep={plan.ep} splits a mixture of experts, and this model has none: set cfg.scaled(experts=E) "
            "(a multiple of ep) or ep=1"
        )
    if cfg.experts % plan.ep:
        raise DivisibilityError(
            f"experts={cfg.experts} do not divide by ep={plan.ep} (the expert axis {plan.expert_axis!r}): "
            f"each chip holds experts/ep of them; choose ep dividing {cfg.experts}"
        )
    if plan.zero >= 2 and plan.dp > 1:
        raise PlanError(
            f"zero={plan.zero} with a mixture of experts: the experts' gradients are reduced inside the MoE block, "
            "not sharded over the data axis; use zero=0 or zero=1"
        )
    if plan.cp > 1:
        raise PlanError(
            f"cp={plan.cp} with a mixture of experts: the router's tokens are the batch's, whole sequences; "
            "set cp=1 for a model with experts"
        )


def _kv_degrees(cfg: TransformerConfig) -> list[int]:
    """The smallest eight tensor-parallel degrees that split or replicate the KV heads evenly."""
    k = cfg.n_kv
    return [d for d in divisors(cfg.heads) if k % d == 0 or d % k == 0][:8]


def check_pipeline(cfg: TransformerConfig, plan: Plan, batch: int) -> None:
    """Interleaved microbatches in groups of pp, layers over stages x chunks, the batch over data x
    microbatches; no tied embeddings across stages."""
    if plan.schedule == "interleaved" and plan.microbatches % plan.pp:
        fits = [plan.pp * k for k in range(max(1, plan.microbatches // plan.pp), plan.microbatches // plan.pp + 2)]
        raise PlanError(
            f"schedule=interleaved runs microbatches in groups of pp={plan.pp} (Megatron-LM's rule), but "
            f"microbatches={plan.microbatches} is not a multiple of {plan.pp}; use microbatches in {fits} "
            "or schedule=1f1b"
        )
    parts = plan.pp * plan.virtual_stages
    if cfg.layers % parts:
        raise DivisibilityError(
            f"layers={cfg.layers} do not divide over pp={plan.pp} stages x virtual_stages={plan.virtual_stages}; "
            f"choose pp x virtual_stages dividing {cfg.layers}"
        )
    if batch % (plan.dp * plan.ep * plan.microbatches):
        raise DivisibilityError(
            f"batch B={batch} does not divide into dp={plan.dp} x ep={plan.ep} x microbatches={plan.microbatches} "
            "pieces"
        )
    if cfg.tie_embeddings:
        raise PlanError(
            "tie_embeddings with pp > 1: the embedding lives on the first stage and the LM head on the last; "
            "Megatron keeps a copy on each and AllReduces their gradients, which run_model does not yet do. "
            "Untie them or set pp=1"
        )


def check_arguments(cfg: Any, plan: Any, mesh: Any, who: str = "run_model") -> Plan:
    """The plan (a :class:`Plan`, or a plan string given to :meth:`Plan.parse`), after checking that
    ``cfg`` is a :class:`TransformerConfig` and ``mesh`` a :class:`Mesh`; each refusal names the argument."""
    if not isinstance(cfg, TransformerConfig):
        raise ArgumentTypeError(
            f"{who}: cfg must be a shardsim.models.TransformerConfig (e.g. shardsim.models.get('gpt-tiny')), "
            f"got {type(cfg).__name__}"
        )
    if isinstance(plan, str):
        plan = Plan.parse(plan)  # "dp=2,tp=2" reads as the CLI's --plan does
    if not isinstance(plan, Plan):
        raise ArgumentTypeError(
            f"{who}: plan must be a shardsim.plans.Plan or a plan string such as 'dp=2,tp=2', got {type(plan).__name__}"
        )
    if not isinstance(mesh, Mesh):
        hint = f"Mesh({mesh!r})" if isinstance(mesh, dict) else "plan.mesh()"
        raise ArgumentTypeError(f"{who}: mesh must be a shardsim.Mesh, got {type(mesh).__name__}; pass {hint}")
    return plan


def check_dropout_seed(seed: Any) -> int | None:
    """A dropout seed: None (dropout off) or a non-negative integer below 2**64, as NumPy's generators take."""
    if seed is None:
        return None
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise PlanError(
            f"dropout_seed must be a non-negative integer below 2**64, got {seed!r}; pass e.g. dropout_seed=0 "
            "(dropout_seed=None turns dropout off)"
        )
    return int(seed)


def shape_of(v: Any, name: str = "token ids") -> tuple[int, ...]:
    if isinstance(v, ShapeDtype) or (hasattr(v, "shape") and hasattr(v, "dtype")):
        return tuple(v.shape)
    try:
        return np.shape(v)
    except ValueError:  # NumPy refuses a ragged list
        raise ModelInputError(
            f"{name} must be a rectangular [B, S] array of token ids, got a ragged {type(v).__name__}; "
            "pad or cut every row to one length"
        ) from None


def check_tokens(cfg: TransformerConfig, plan: Plan, tokens: Any, targets: Any) -> tuple[int, int]:
    """``(B, S)``; tokens and targets integers in ``[0, vocab)``, ``S <= cfg.seq``, B divisible by dp."""
    for name, v in (("tokens", tokens), ("targets", targets)):
        shape = shape_of(v, name)
        if len(shape) != 2:
            raise ModelInputError(f"{name} must be [B, S] token ids, got shape {shape}")
        if shape != shape_of(tokens, "tokens"):
            raise ModelInputError(f"targets must have the tokens' shape {shape_of(tokens)}, got {shape}")
        dt = v.dtype if isinstance(v, ShapeDtype) else np.asarray(v).dtype
        if dt.kind not in "iu":
            raise ModelInputError(f"{name} must be integer token ids, got dtype {dt}")
        if dt == np.uint64:  # NumPy promotes uint64 with a signed offset to float64, which cannot index
            raise ModelInputError(f"{name} of dtype uint64 cannot index the embedding; pass {name}.astype(np.int64)")
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
    if b % (plan.dp * plan.ep):
        raise DivisibilityError(
            f"batch B={b} does not divide by dp x ep = {plan.dp * plan.ep}: outside the experts the expert axis "
            f"{plan.expert_axis!r} splits the batch too"
        )
    return b, s
