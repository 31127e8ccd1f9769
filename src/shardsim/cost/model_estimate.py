"""Estimate one training step of a transformer under a plan: time, tokens/s, MFU, memory, days.

:func:`estimate_model` (also reached as ``estimate(model, plan, hardware, ...)``) reads
everything from one program: ``run_model``'s shape-only trace at the real sizes
(:func:`~shardsim.cost.model_steps.model_program`), costed event by event and scheduled
on the time line as the MLP estimate is (:mod:`~shardsim.cost.timeline`). Model FLOPs are
the trace's own matmul FLOPs in the forward and backward passes (attention's ``QK^T`` and
``PV`` included, recomputation left out), summed over the chips that run them; ``6·N·T`` is
shown beside them. Pipelines: the plan's ``schedule``, ``microbatches`` and
``virtual_stages`` drive the program, each stage has its own compute track on the time line,
and ``bubble`` is the stages' mean idle fraction of the step.

On GPUs the default placement puts the most communication-hungry parallelism on NVLink
(:func:`~shardsim.cost.placement.hungry_first`: TP, then CP/EP, then PP, DP last); ``links``
overrides it; a tensor-parallel group larger than the NVLink domain is said in ``warnings``.

>>> est = estimate_model("llama3-8b", "dp=8,tp=8,zero=1", "h100", batch_tokens=64 * 8192, efficiency="ideal")
>>> est.chips, est.bound, round(est.mfu, 2)
(64, 'communication', 0.57)
>>> round(est.model_flops / est.six_nt, 2)  # FlashAttention's visible key tiles at 8192 tokens on top of 6·N·T
1.09
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..dtypes import resolve_dtype
from ..errors import ArgumentTypeError, CostModelError, PlanError, ShardsimError
from ..mesh import Mesh
from ..models import TransformerConfig
from ..models import get as get_model
from ..models.mlp import MLP
from ..plans import DEGREE, ROLES, Plan
from ..training.stage_memory import check_stages
from .builder import memory_of, mlp_axes, mlp_scheme, program_of
from .efficiency import Efficiency, resolve_efficiency
from .hardware import Hardware, Switched, Torus
from .memory_source import memory_source
from .model_steps import ModelProgram, check_batch, check_sizes, check_work
from .pipeline_estimate import estimate_pipeline
from .placement import AxisLink, hungry_first, place
from .presets import get_hardware
from .program_estimate import estimate_program
from .step_estimate import Estimate, ModelEstimate
from .timeline import build_timeline
from .units import tokens_argument

Links = Mapping[str, str | AxisLink] | None
Topology = str | Sequence[int] | None


def resolve_model(model: TransformerConfig | MLP | str) -> TransformerConfig | MLP:
    """A preset name or a config as a config, an :class:`~shardsim.models.MLP` as itself
    (unknown names: the presets' own error).

    >>> resolve_model("llama3-8b").layers, resolve_model(MLP(8, 16)).d_ff
    (32, 16)
    """
    if isinstance(model, (TransformerConfig, MLP)):
        return model
    if isinstance(model, str):
        return get_model(model)
    raise PlanError(f"model must be a TransformerConfig or a preset name, got {type(model).__name__}")


def resolve_plan(plan: Plan | str) -> Plan:
    """A plan or its string (``"dp=16,tp=8,pp=4,zero=1"``) as a :class:`~shardsim.plans.Plan`.

    >>> resolve_plan("dp=2,tp=4").tp
    4
    """
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, str):
        return Plan.parse(plan)
    raise PlanError(f"plan must be a Plan or its string such as 'dp=8,tp=8', got {type(plan).__name__}")


def _check_options(*, chips: object, overlap: object, memory: object, prefetch: object) -> None:
    """The estimate's switches and counts of the right kind, before any work."""
    if chips is not None and (isinstance(chips, bool) or not isinstance(chips, int) or chips < 1):
        raise CostModelError(f"chips={chips!r}: the chip count is a whole number >= 1 (the plan's product), or None")
    for name, flag in (("overlap", overlap), ("memory", memory)):
        if not isinstance(flag, bool):
            raise ArgumentTypeError(f"{name}={flag!r}: a switch, True or False")
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
        raise CostModelError(
            f"prefetch={prefetch!r}: the compute ops a collective may run ahead is a whole number >= 1, e.g. 1"
        )


def model_links(hw: Hardware, plan: Plan) -> tuple[list[str] | None, list[str]]:
    """The GPU axis order innermost first (None on a torus) and the warnings it raises.

    >>> from shardsim.cost import get_hardware
    >>> model_links(get_hardware("h100"), Plan(dp=2, tp=16))[1][0][:40]
    "tp=16 is larger than h100's nvlink domai"
    """
    first = next(iter(hw.networks.values()))
    mesh = plan.mesh()
    if not isinstance(first, Switched) or first.domain is None or len(hw.networks) == 1:
        return None, []
    roles = {role: plan.axes()[role] for role in ROLES if plan.degree(role) > 1}
    warnings = []
    if plan.tp > first.domain:
        name = next(iter(hw.networks))
        warnings.append(
            f"tp={plan.tp} is larger than {hw.name}'s {name} domain of {first.domain} chips: the tensor-parallel "
            f"collectives cross the slower network; use tp <= {first.domain}"
        )
    return hungry_first(roles, mesh), warnings


def scheme_order(hw: Hardware, scheme: str, mesh: Mesh, axes: Mapping[str, str] | None) -> list[str] | None:
    """On GPUs, the scheme's axes innermost first by their parallelism's hunger (TP on NVLink);
    None on a torus, or when the scheme's axes do not resolve (its own run says why).

    >>> from shardsim.cost import get_hardware
    >>> scheme_order(get_hardware("h100"), "fsdp_tp", Mesh(X=2, Y=4), None)
    ['Y', 'X']
    """
    from ..strategies import get as get_scheme
    from ..strategies.runner import resolve_axes

    if isinstance(next(iter(hw.networks.values())), Torus):
        return None
    try:
        roles = resolve_axes(get_scheme(scheme), mesh, axes)
    except ShardsimError:
        return None  # the scheme's own run says what is wrong with its axes
    return hungry_first(roles, mesh)


def estimate_model(
    model: TransformerConfig | MLP | str,
    plan: Plan | str,
    hardware: Hardware | str,
    *,
    batch_tokens: int | str,
    seq: int | None = None,
    chips: int | None = None,
    links: Links = None,
    topology: Topology = None,
    efficiency: str | Efficiency = "calibrated",
    optimizer: str = "adam",
    precision: str | None = None,
    policy: str | None = None,
    overlap: bool = True,
    prefetch: int = 1,
    dtype: str = "bfloat16",
    memory: bool = True,
    scheme: str | None = None,
    mesh: Mesh | Mapping[str, int] | None = None,
) -> Estimate:
    """Estimate one training step of ``model`` under ``plan`` on ``hardware`` (module doc):
    the one estimate, which :func:`~shardsim.cost.estimate` spells for a scheme too.

    ``model`` is a :class:`~shardsim.models.TransformerConfig`, a preset name or an
    :class:`~shardsim.models.MLP`. ``batch_tokens`` is the global batch in tokens (a whole number
    or a string such as ``"16M"``, 16 x 2**20, read as ``shardsim plan --batch-tokens`` reads it),
    in sequences of ``seq`` (default the model's context); ``chips``, when given, must equal the
    plan's product of degrees; ``links``/``topology``/``efficiency`` as
    :func:`~shardsim.cost.estimate` takes them; ``optimizer`` and ``precision`` (default: the
    plan's, else ``dtype``'s), or a byte ``policy`` (:mod:`shardsim.training.policies`, naming
    both), are the training step's whose ledger gives ``memory``
    (:func:`shardsim.training.model_memory`); ``memory=False`` skips that step (time only, for a
    search that measures the memory of its best plans afterwards: a deep pipeline's step with
    every microbatch takes seconds), and the summary says so. An MLP runs the scheme
    :func:`~shardsim.strategies.scheme_of` names for the plan (``scheme`` names another that runs
    it, as ``zero3`` does ``fsdp``'s) on ``mesh`` (default the plan's own), and has no ``seq``.

    >>> e = estimate_model("llama3-70b", "dp=16,tp=8,pp=4,zero=1,microbatches=8", "h100",
    ...                    chips=512, batch_tokens=128 * 8192)
    >>> e.chips, e.plan.pp, round(e.bubble_closed_form, 3), e.bubble > e.bubble_closed_form  # unequal stages
    (512, 4, 0.273, True)
    >>> estimate_model(MLP(8192, 32768), "dp=8,zero=3", "h100", batch_tokens=8 * 4096).scheme
    'fsdp'
    """
    cfg, p = resolve_model(model), resolve_plan(plan)
    hw = get_hardware(hardware)
    opts: dict[str, Any] = dict(
        links=links, topology=topology, efficiency=efficiency, optimizer=optimizer, precision=precision,
        policy=policy, overlap=overlap, prefetch=prefetch, dtype=dtype, memory=memory,
    )  # fmt: skip
    if isinstance(cfg, MLP):
        if seq is not None:
            raise CostModelError(f"seq={seq!r}: an MLP's batch is tokens, not sequences; give batch_tokens= only")
        return _estimate_mlp(cfg, p, hw, batch_tokens, chips=chips, scheme=scheme, mesh=mesh, **opts)
    if scheme is not None or mesh is not None:
        raise CostModelError("scheme= and mesh= belong to an MLP; a transformer runs on its plan's mesh")
    return _estimate_transformer(cfg, p, hw, batch_tokens, seq=seq, chips=chips, **opts)


def _check_chips(p: Plan, chips: int | None, size: int) -> None:
    """``chips``, when given, is the plan's product of degrees."""
    if chips is not None and chips != size:
        degrees = " x ".join(f"{DEGREE[r]}={p.degree(r)}" for r in ROLES if p.degree(r) > 1) or "dp=1"
        raise PlanError(
            f"plan {p} multiplies to {size} chips ({degrees}), not chips={chips}; "
            f"change a degree so their product is {chips}"
        )


def _estimate_mlp(
    model: MLP,
    p: Plan,
    hw: Hardware,
    batch_tokens: int | str,
    *,
    chips: int | None,
    scheme: str | None,
    mesh: Mesh | Mapping[str, int] | None,
    links: Links,
    topology: Topology,
    efficiency: str | Efficiency,
    optimizer: str,
    precision: str | None,
    policy: str | None,
    overlap: bool,
    prefetch: int,
    dtype: str,
    memory: bool,
) -> Estimate:
    """An MLP's step: its scheme's program shape-only, timed, and its training step's memory."""
    if policy is not None:
        raise CostModelError(
            f"policy={policy!r}: a byte policy is the transformer's; an MLP takes optimizer and precision"
        )
    batch = tokens_argument(batch_tokens, "batch_tokens") if isinstance(batch_tokens, str) else batch_tokens
    name = mlp_scheme(model, p, scheme)
    on = p.mesh() if mesh is None else mesh if isinstance(mesh, Mesh) else Mesh(dict(mesh))
    _check_chips(p, chips, on.size)
    axes = mlp_axes(p, name)
    inner = scheme_order(hw, name, on, axes) if links is None else None
    place(hw, on, links, topology=topology, inner=inner)  # fail early, before tracing, on a layout it cannot hold
    precision = precision if precision is not None else p.precision
    source = memory_source(optimizer, precision, dtype)
    program = program_of(model, p, batch, dtype=dtype, scheme=name, mesh=on)
    est = estimate_program(
        program, hw, placement_links=links, inner=inner, overlap=overlap, prefetch=prefetch, batch=batch,
        d_model=model.d_model, d_ff=model.d_ff, dtype=dtype, topology=topology, efficiency=efficiency,
    )  # fmt: skip
    est.model, est.plan = model, p
    if not memory:
        est.memory, est.memory_source = {}, "nothing: memory=False (time only)"
        return est
    try:  # the memory of the same shapes' training step, as the Trainer's ledger measures it
        est.memory, est.model_state = memory_of(
            model, p, batch, dtype=dtype, optimizer=optimizer, precision=precision, policy=policy, scheme=name,
            mesh=on,
        )  # fmt: skip
    except ShardsimError as err:  # a scheme the Trainer cannot step yet: the passes' own ledger, said so
        est.memory_source = f"the forward and backward passes only, no optimizer state ({name}: {err})"
    else:
        est.memory_source = source
    return est


def _estimate_transformer(
    cfg: TransformerConfig,
    p: Plan,
    hw: Hardware,
    batch_tokens: int | str,
    *,
    seq: int | None,
    chips: int | None,
    links: Links,
    topology: Topology,
    efficiency: str | Efficiency,
    optimizer: str,
    precision: str | None,
    policy: str | None,
    overlap: bool,
    prefetch: int,
    dtype: str,
    memory: bool,
) -> Estimate:
    """A transformer's step: its whole-model program, timed, and its training step's memory."""
    batch_tokens = tokens_argument(batch_tokens, "batch_tokens")
    _check_options(chips=chips, overlap=overlap, memory=memory, prefetch=prefetch)
    resolve_dtype(dtype)
    _check_chips(p, chips, p.chips)
    if policy is None:
        precision = precision if precision is not None else p.precision
        source = memory_source(optimizer, precision, dtype)
    else:
        from ..training import policies

        chosen = policies.get(policy)
        source = f"one training step, byte policy {chosen.name} ({chosen.optimizer}, {chosen.precision})"
    b, s = check_batch(cfg, p, batch_tokens, seq)
    check_sizes(cfg, b, s)
    check_work(cfg, p)
    inner, warnings = (None, []) if links else model_links(hw, p)
    # the layout and the efficiency mode fail here, before the trace, if the hardware cannot take them
    resolve_efficiency(hw, efficiency, place(hw, p.mesh(), links, topology=topology, inner=inner).networks())
    if (
        p.pp > 1
        and overlap
        and prefetch == 1
        and resolve_dtype(dtype).name == "bfloat16"
        and precision in (None, "bf16")
    ):
        # the planner's clock on the layer program (its module doc); other options: the whole program
        check_stages(cfg, p, b)  # uneven stages are estimated as placed, their memory at the deepest
        measured = None
        if memory:
            peak, state = memory_of(cfg, p, batch_tokens, s, optimizer=optimizer, precision=precision, policy=policy)
            measured = (peak, state, source)
        return estimate_pipeline(
            cfg, p, hw, batch=b, seq=s, efficiency=efficiency, policy=policy, links=links, topology=topology,
            inner=inner, memory=measured, warnings=[*warnings, *_pipeline_warnings(p)],
        )  # fmt: skip
    program = program_of(cfg, p, batch_tokens, s, dtype)
    assert isinstance(program, ModelProgram)
    warnings += _pipeline_warnings(p)
    placement = place(hw, program.mesh, links, topology=topology, inner=inner)
    eff = resolve_efficiency(hw, efficiency, placement.networks())
    title = f"{cfg.name or 'model'} under {p} on {program.mesh}, {hw.name}"
    tl = build_timeline(
        program.steps, hw, placement, overlap=overlap, prefetch=prefetch, title=title, efficiency=eff,
        mesh=program.mesh,
    )  # fmt: skip
    if policy is None and precision is None:
        precision = resolve_dtype(dtype).name  # the weights' dtype's policy, as the MLP estimate's
    if memory:
        peak, state = memory_of(cfg, p, batch_tokens, s, optimizer=optimizer, precision=precision, policy=policy)
    else:
        peak, state, source = {}, {}, "nothing: memory=False (time only)"
    return Estimate(
        scheme=str(p), hardware=hw, mesh=program.mesh, batch=batch_tokens, d_model=cfg.d_model, d_ff=cfg.d_ff,
        layers=cfg.layers, dtype=dtype, timeline=tl, memory=peak, phases=tl.phase_totals(), efficiency=eff,
        memory_source=source, model_state=state, model=cfg, plan=p, seq=s, program=program,
        placement=placement, warnings=warnings,
    )  # fmt: skip


def _pipeline_warnings(p: Plan) -> list[str]:
    """A pipeline with fewer microbatches than stages, said with its least bubble."""
    if p.pp > 1 and p.microbatches < p.pp:
        least = (p.pp - 1) / (p.microbatches + p.pp - 1)
        return [
            f"pp={p.pp} with microbatches={p.microbatches}: the bubble is {least:.0%} of the step at best; "
            f"use microbatches >= {4 * p.pp} (the batch divides into dp x microbatches)"
        ]
    return []


__all__ = [
    "ModelEstimate",
    "estimate_model",
    "model_links",
    "resolve_model",
    "resolve_plan",
    "scheme_order",
]
