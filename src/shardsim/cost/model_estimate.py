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
(64, 'compute', 0.5)
>>> round(est.model_flops / est.six_nt, 2)  # attention's matmuls at 8192 tokens on top of 6·N·T
1.2
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..dtypes import resolve_dtype
from ..errors import ArgumentTypeError, CostModelError, PlanError
from ..models import TransformerConfig
from ..models import get as get_model
from ..plans import DEGREE, ROLES, Plan
from .efficiency import Efficiency, resolve_efficiency
from .estimator import Estimate, _gb, _memory_source, _ms
from .hardware import Hardware, Switched
from .model_steps import ModelProgram, check_batch, check_sizes, check_work, model_memory_ledger, model_program
from .placement import AxisLink, Placement, hungry_first, place
from .presets import get_hardware
from .program import chips_running
from .timeline import build_timeline
from .units import tokens_argument


@dataclass
class ModelEstimate(Estimate):
    """An :class:`~shardsim.cost.Estimate` of a transformer under a plan; ``batch`` is the
    global batch in tokens, ``seq`` the sequence length; see the module doc."""

    cfg: TransformerConfig | None = None
    plan: Plan = field(default_factory=Plan)
    seq: int = 0
    program: ModelProgram | None = None
    placement: Placement | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        """Tokens trained per second: the global batch over the step time."""
        return self.batch / self.step_s if self.step_s > 0 else 0.0

    def days(self, tokens: float) -> float:
        """Days to train on ``tokens`` tokens at this step time (steps of ``batch`` tokens).

        >>> e = estimate_model("llama3-8b", "dp=8,tp=8", "h100", batch_tokens=8 * 8192)
        >>> round(e.days(15e12) / (15e12 / e.tokens_per_s / 86400), 6)
        1.0
        """
        return tokens / self.tokens_per_s / 86400.0 if self.tokens_per_s > 0 else math.inf

    @property
    def model_flops(self) -> float:
        """Model FLOPs per step over all chips: the trace's matmul FLOPs in the forward and
        backward passes, each event's per-chip FLOPs times the chips that run it (a pipeline
        stage's events run on its chips only); recomputation is not model work."""
        assert self.program is not None
        mesh = self.program.mesh
        total = 0.0
        for st in self.program.steps:
            e = st.event
            if e.flops and e.phase in ("forward", "backward"):
                total += e.flops * chips_running(mesh, e.where)
        return total

    @property
    def hardware_flops(self) -> float:
        """Every matmul FLOP the chips run, recomputation included (HFU's numerator)."""
        assert self.program is not None
        return sum(st.event.flops * chips_running(self.program.mesh, st.event.where) for st in self.program.steps)

    @property
    def six_nt(self) -> float:
        """``6·N·T``: six FLOPs per parameter per token (Kaplan et al. 2020), no attention."""
        assert self.cfg is not None
        return 6.0 * self.cfg.param_count() * self.batch

    @property
    def bubble(self) -> float:
        """The pipeline bubble: the stages' mean fraction of the step their compute is idle
        (0 without a pipeline). Compare (p-1)/(m+p-1), or (p-1)/(v·m+p-1) interleaved."""
        if self.plan.pp == 1 or self.step_s <= 0:
            return 0.0
        busy: dict[str, float] = {}
        for b in self.timeline.bars:
            if b.is_compute and b.where:
                busy[b.where] = busy.get(b.where, 0.0) + b.seconds
        if not busy:
            return 0.0
        return 1.0 - sum(busy.values()) / (len(busy) * self.step_s)

    @property
    def bubble_closed_form(self) -> float:
        """(p-1)/(v·m+p-1): the bubble of equal stages with no communication (Narayanan et al. 2021)."""
        p, m, v = self.plan.pp, self.plan.microbatches, self.plan.virtual_stages
        return (p - 1) / (v * m + p - 1) if p > 1 else 0.0

    def memory_line(self) -> str:
        """The memory lines of :class:`~shardsim.cost.Estimate`, or that it was not measured."""
        if not self.memory:
            return "memory not measured (memory=False): fits and shortfall say nothing"
        return super().memory_line()

    def summary(self) -> str:
        """Plan, model, step, tokens/s, MFU and FLOPs, bound, bubble, memory, warnings."""
        assert self.cfg is not None
        parts = self.timeline.comm_parts()
        comm = ", ".join(f"{k} {_ms(v)}" for k, v in parts.items() if v or k != "behind other comm")
        n = self.cfg.param_count()
        lines = [
            f"{self.cfg.name or 'model'} ({n / 1e9:.4g}B parameters) under {self.plan} on {self.chips} "
            f"{self.hardware.name}, B={self.batch:,} tokens (seq {self.seq}, {self.per_chip_batch:g}/chip)",
            f"step {_ms(self.step_s)} ms: compute {_ms(self.compute_s)} ms, comm {_ms(self.comm_s)} ms ({comm})",
            f"{self.tokens_per_s:,.0f} tokens/s; model FLOPs {self.model_flops:.4g} per step "
            f"(6·N·T {self.six_nt:.4g}); MFU {self.mfu:.1%}",
            f"{self.bound}-bound: {self.bound_reason()}",
        ]
        if self.plan.pp > 1:
            lines.append(
                f"pipeline {self.plan.schedule}, {self.plan.pp} stages x {self.plan.microbatches} microbatches"
                + (f" x {self.plan.virtual_stages} chunks" if self.plan.virtual_stages > 1 else "")
                + f": bubble {self.bubble:.1%} of the step (closed form {self.bubble_closed_form:.1%})"
            )
        lines += [self.memory_line(), self.efficiency.describe(), *(f"warning: {w}" for w in self.warnings)]
        return "\n".join(lines)

    def figures(self) -> list[tuple[str, str]]:
        """The summary's headline figures as (quantity, value) pairs.

        >>> e = estimate_model("llama3-8b", "dp=8,tp=8", "h100", batch_tokens=8 * 8192)
        >>> [q for q, _ in e.figures()][:4]
        ['step', 'tokens/s', 'MFU', 'model FLOPs']
        """
        rows = [
            ("step", f"{_ms(self.step_s)} ms"),
            ("tokens/s", f"{self.tokens_per_s:,.0f}"),
            ("MFU", f"{self.mfu:.1%}"),
            ("model FLOPs", f"{self.model_flops:.4g}"),
            ("6·N·T", f"{self.six_nt:.4g}"),
            ("bound", f"{self.bound}-bound"),
        ]
        if self.plan.pp > 1:
            rows.append(("bubble", f"{self.bubble:.1%}"))
        return rows + [
            ("memory per chip", f"{_gb(self.memory.get('total', 0))} GB"),
            ("HBM per chip", f"{_gb(self.hardware.hbm_capacity)} GB"),
        ]


def resolve_model(model: TransformerConfig | str) -> TransformerConfig:
    """A preset name or a config as a config (unknown names: the presets' own error)."""
    if isinstance(model, TransformerConfig):
        return model
    if isinstance(model, str):
        return get_model(model)
    raise PlanError(f"model must be a TransformerConfig or a preset name, got {type(model).__name__}")


def resolve_plan(plan: Plan | str) -> Plan:
    """A plan or its string (``"dp=16,tp=8,pp=4,zero=1"``) as a :class:`~shardsim.plans.Plan`."""
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
    """The GPU axis order innermost first (None on a torus) and the warnings it raises."""
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


def estimate_model(
    model: TransformerConfig | str,
    plan: Plan | str,
    hardware: Hardware | str,
    *,
    batch_tokens: int | str,
    seq: int | None = None,
    chips: int | None = None,
    links: Mapping[str, str | AxisLink] | None = None,
    topology: str | Sequence[int] | None = None,
    efficiency: str | Efficiency = "calibrated",
    optimizer: str = "adam",
    precision: str | None = None,
    policy: str | None = None,
    overlap: bool = True,
    prefetch: int = 1,
    dtype: str = "bfloat16",
    memory: bool = True,
) -> ModelEstimate:
    """Estimate one training step of ``model`` under ``plan`` on ``hardware`` (module doc).

    ``batch_tokens`` is the global batch in tokens (a whole number or a string such as ``"16M"``,
    16 x 2**20, read as ``shardsim plan --batch-tokens`` reads it), in sequences of ``seq`` (default the
    model's context); ``chips``, when given, must equal the plan's product of degrees;
    ``links``/``topology``/``efficiency`` as :func:`~shardsim.cost.estimate` takes them;
    ``optimizer`` and ``precision`` (default: the plan's, else ``dtype``'s), or a byte
    ``policy`` (:mod:`shardsim.training.policies`, naming both), are the training step's whose
    ledger gives ``memory`` (:func:`shardsim.training.model_memory`); ``memory=False`` skips
    that step (time only, for a search that measures the memory of its best plans afterwards:
    a deep pipeline's step with every microbatch takes seconds), and the summary says so.

    >>> e = estimate_model("llama3-70b", "dp=16,tp=8,pp=4,zero=1,microbatches=8", "h100",
    ...                    chips=512, batch_tokens=128 * 8192)
    >>> e.chips, e.plan.pp, round(e.bubble_closed_form, 3), e.bubble > e.bubble_closed_form  # unequal stages
    (512, 4, 0.273, True)
    """
    cfg, p = resolve_model(model), resolve_plan(plan)
    hw = get_hardware(hardware)
    batch_tokens = tokens_argument(batch_tokens, "batch_tokens")
    _check_options(chips=chips, overlap=overlap, memory=memory, prefetch=prefetch)
    resolve_dtype(dtype)
    if chips is not None and chips != p.chips:
        degrees = " x ".join(f"{DEGREE[r]}={p.degree(r)}" for r in ROLES if p.degree(r) > 1) or "dp=1"
        raise PlanError(
            f"plan {p} multiplies to {p.chips} chips ({degrees}), not chips={chips}; "
            f"change a degree so their product is {chips}"
        )
    if policy is None:
        precision = precision if precision is not None else p.precision
        source = _memory_source(optimizer, precision, dtype)
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
    program = model_program(cfg, p, batch_tokens, s, dtype)
    if p.pp > 1 and p.microbatches < p.pp:
        least = (p.pp - 1) / (p.microbatches + p.pp - 1)
        warnings.append(
            f"pp={p.pp} with microbatches={p.microbatches}: the bubble is {least:.0%} of the step at best; "
            f"use microbatches >= {4 * p.pp} (the batch divides into dp x microbatches)"
        )
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
        peak, state = model_memory_ledger(cfg, p, b, s, optimizer, precision, policy)
    else:
        peak, state, source = {}, {}, "nothing: memory=False (time only)"
    return ModelEstimate(
        scheme=str(p), hardware=hw, mesh=program.mesh, batch=batch_tokens, d_model=cfg.d_model, d_ff=cfg.d_ff,
        layers=cfg.layers, dtype=dtype, timeline=tl, memory=peak, phases=tl.phase_totals(), efficiency=eff,
        memory_source=source, model_state=state, cfg=cfg, plan=p, seq=s, program=program,
        placement=placement, warnings=warnings,
    )  # fmt: skip


__all__ = ["ModelEstimate", "estimate_model", "model_links", "resolve_model", "resolve_plan"]
