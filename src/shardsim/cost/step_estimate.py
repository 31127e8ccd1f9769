"""One training step's estimate, of an MLP scheme or of a transformer under a plan: one type.

:class:`Estimate` holds the step's time line, its phases' totals, the memory of its training
step and what it was estimated from (the model, the plan, the program). What bounds the step
follows the book's test (:mod:`~shardsim.cost.bound`). An MLP's model FLOPs are the book's
``12 B D F`` per layer; a transformer's are its trace's own matmul FLOPs (see
:mod:`~shardsim.cost.model_estimate`), and its summary adds tokens per second, ``6·N·T`` and
the pipeline's bubble.

>>> from shardsim import Mesh
>>> from shardsim.cost import estimate
>>> est = estimate("fsdp", Mesh(X=16), "tpu-v5p", batch=16 * 4096, d_model=8192, d_ff=32768, efficiency="ideal")
>>> est.bound, round(est.mfu, 2), est.per_chip_batch
('compute', 0.91, 4096.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..mesh import Mesh
from ..models import TransformerConfig
from ..models.mlp import MLP
from ..plans import ZERO_BUBBLE, Plan
from .bound import comm_excess, excess_terms
from .changes import Advice, Fix, advice_line
from .efficiency import IDEAL, Efficiency
from .hardware import Hardware
from .numbers import gb, ms
from .placement import Placement
from .program import Program, chips_running
from .timeline import Timeline


@dataclass
class Estimate:
    """One step's estimate. Times in seconds, memory in bytes per chip.

    ``comm_s`` sums every collective of the chips' step; ``comm_exposed_s`` is the part the
    step waits for, ``comm_hidden_s`` the part hidden under compute (or under other
    collectives); ``bubble_s`` the rest of the step the compute is idle, a pipeline's bubble,
    so ``step_s = compute_s + comm_exposed_s + bubble_s`` (a pipeline's figures are its busiest
    stage's, :attr:`~shardsim.cost.Timeline.chips`).
    ``phases`` gives compute and comm seconds per phase; ``breakdown()`` the per-collective
    or per-layer rows; ``timeline`` the bars (``.text()``, ``.plot()``). ``efficiency`` is
    the mode it was timed in; ``padding`` maps a padded size to (given, padded). ``model``
    is what was estimated (an :class:`~shardsim.models.MLP` or a
    :class:`~shardsim.models.TransformerConfig`), ``plan`` its plan, ``seq`` a transformer's
    sequence length, ``program`` the program timed, ``placement`` its mesh on the hardware.
    A pipeline's step is timed on the layer program's clock (:mod:`~shardsim.cost.pipeline_clock`,
    as the planner times it): no whole program is built (``program`` is None), the time line
    has one bar per schedule item and stream, and ``flops`` holds the step's model and
    hardware FLOPs over all chips, read off the layer program.
    ``defaults`` names the defaults the estimate applied (:mod:`~shardsim.cost.defaults`);
    ``fixes`` the single changes of a transformer's plan that fit when its step does not
    (:mod:`~shardsim.cost.fixes`; None when not asked), found when first read (``advice``).
    """

    scheme: str
    hardware: Hardware
    mesh: Mesh
    batch: int
    d_model: int
    d_ff: int
    layers: int
    dtype: str
    timeline: Timeline
    memory: dict[str, int]
    phases: dict[str, dict[str, float]]
    efficiency: Efficiency = IDEAL
    padding: dict[str, tuple[int, int]] = field(default_factory=dict)
    memory_source: str = "the forward and backward passes only, no optimizer state"
    model_state: dict[str, int] = field(default_factory=dict)
    model: TransformerConfig | MLP | None = None
    plan: Plan = field(default_factory=Plan)
    seq: int = 0
    program: Program | None = None
    placement: Placement | None = None
    warnings: list[str] = field(default_factory=list)
    flops: tuple[float, float] | None = None
    defaults: dict[str, str] = field(default_factory=dict)
    advice: Advice | None = field(default=None, repr=False)

    @property
    def fixes(self) -> list[Fix] | None:
        """The single changes of the plan that fit, fastest first (None when not asked)."""
        return None if self.advice is None else self.advice.found()

    @property
    def cfg(self) -> TransformerConfig | None:
        """The transformer estimated (None for an MLP)."""
        return self.model if isinstance(self.model, TransformerConfig) else None

    @property
    def chips(self) -> int:
        return self.mesh.size

    @property
    def per_chip_batch(self) -> float:
        """Tokens per chip, B / N (the x-axis of the book's rooflines)."""
        return self.batch / self.chips

    @property
    def step_s(self) -> float:
        return self.timeline.step_s

    @property
    def compute_s(self) -> float:
        return self.timeline.compute_s

    @property
    def comm_s(self) -> float:
        return self.timeline.comm_s

    @property
    def comm_exposed_s(self) -> float:
        return self.timeline.comm_exposed_s

    @property
    def comm_hidden_s(self) -> float:
        return self.timeline.comm_hidden_s

    @property
    def bubble_s(self) -> float:
        """Seconds the chips' compute is idle with none of their collectives running: the
        pipeline's bubble on its busiest stage (0 without a pipeline).

        >>> from shardsim import Mesh
        >>> from shardsim.cost import estimate
        >>> e = estimate("pp", Mesh(Z=4), "h100", 32768, 4096, 16384, layers=8)
        >>> round(e.compute_s + e.comm_exposed_s + e.bubble_s - e.step_s, 12), e.comm_exposed_s <= e.comm_s
        (0.0, True)
        """
        return self.timeline.bubble_s

    @property
    def model_flops(self) -> float:
        """Model FLOPs per step over all chips. An MLP's: 12 B D F per layer (forward 4,
        backward 8). A transformer's: the trace's matmul FLOPs in the forward and backward
        passes, each event's per-chip FLOPs times the chips that run it (a pipeline stage's
        events run on its chips only); recomputation is not model work."""
        if self.cfg is None:
            return 12.0 * self.batch * self.d_model * self.d_ff * self.layers
        if self.flops is not None:
            return self.flops[0]
        assert self.program is not None
        mesh = self.program.mesh
        total = 0.0
        for st in self.program.steps:
            e = st.event
            if e.flops and e.phase in ("forward", "backward", "weight"):
                total += e.flops * chips_running(mesh, e.where)
        return total

    @property
    def hardware_flops(self) -> float:
        """Every matmul FLOP the chips run, recomputation included (HFU's numerator)."""
        if self.flops is not None:
            return self.flops[1]
        assert self.program is not None
        return sum(st.event.flops * chips_running(self.program.mesh, st.event.where) for st in self.program.steps)

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOPs / (chips x step time x peak FLOP/s)."""
        if self.step_s <= 0:
            return 0.0
        return self.model_flops / (self.chips * self.step_s * self.hardware.flops(self.dtype))

    @property
    def tokens_per_s(self) -> float:
        """Tokens trained per second: the global batch over the step time."""
        return self.batch / self.step_s if self.step_s > 0 else 0.0

    def days(self, tokens: float) -> float:
        """Days to train on ``tokens`` tokens at this step time (steps of ``batch`` tokens).

        >>> from shardsim.cost import estimate
        >>> e = estimate("llama3-8b", "dp=8,tp=8", "h100", batch_tokens=8 * 8192)
        >>> round(e.days(15e12) / (15e12 / e.tokens_per_s / 86400), 6)
        1.0
        """
        return tokens / self.tokens_per_s / 86400.0 if self.tokens_per_s > 0 else math.inf

    @property
    def six_nt(self) -> float:
        """``6·N·T``: six FLOPs per parameter per token (Kaplan et al. 2020), no attention."""
        assert self.model is not None
        return 6.0 * self.model.param_count() * self.batch

    @property
    def bubble(self) -> float:
        """The pipeline bubble: the stages' mean fraction of the step their compute is idle with
        none of their collectives running (0 without a pipeline); a stage's wait for its own
        collectives is its exposed communication instead. Compare (p-1)/(m+p-1), or
        (p-1)/(v·m+p-1) interleaved."""
        if self.plan.pp == 1 or self.step_s <= 0:
            return 0.0
        stages = [t for t in self.timeline.per_chips() if t.chips]
        if not stages:
            return 0.0
        return sum(t.bubble_s for t in stages) / (len(stages) * self.step_s)

    @property
    def bubble_closed_form(self) -> float:
        """(p-1)/(v·m+p-1): the bubble of equal stages with no communication (Narayanan et al.
        2021). Zero bubble (Qi et al. 2024): ``(p-1)(t_F+t_B-t_W)`` idle beside ``m(t_F+t_B+t_W)``
        of work (ZB-H1), ``(p-1)·max(t_F, t_F+t_B-2t_W)`` (ZB-H2 within one step), the passes'
        times in the step's compute per phase."""
        p, m, v = self.plan.pp, self.plan.microbatches, self.plan.virtual_stages
        if p == 1:
            return 0.0
        if self.plan.schedule in ZERO_BUBBLE:
            tf, tb, tw = (self.phases.get(k, {}).get("compute", 0.0) / m for k in ("forward", "backward", "weight"))
            ramp = tf + tb - tw if self.plan.schedule == "zb-h1" else max(tf, tf + tb - 2 * tw)
            idle = (p - 1) * ramp
            return idle / (idle + m * (tf + tb + tw))
        return (p - 1) / (v * m + p - 1)

    @property
    def bound(self) -> str:
        """``"communication"``, ``"memory"`` or ``"compute"``: what limits the step (module doc)."""
        if comm_excess(self.phases) > 0:
            return "communication"
        memory = sum(p["memory"] for p in self.phases.values())
        flops = sum(p["flops"] for p in self.phases.values())
        return "memory" if memory > flops else "compute"

    @property
    def fits(self) -> bool:
        """Whether the per-chip peak memory fits the chip's HBM."""
        return self.memory.get("total", 0) <= self.hardware.hbm_capacity

    @property
    def shortfall(self) -> int:
        """Bytes per chip beyond the chip's HBM (0 when it fits)."""
        return max(0, int(self.memory.get("total", 0) - self.hardware.hbm_capacity))

    def largest(self, n: int = 3) -> list[tuple[str, int]]:
        """The ``n`` categories holding the most bytes at their peak, largest first.

        >>> from shardsim import Mesh
        >>> from shardsim.cost import estimate
        >>> estimate("ddp", Mesh(X=8), "h100", 8 * 1024, 1024, 4096).largest(1)
        [('optimizer', 100663296)]
        """
        rows = [(c, b) for c, b in self.memory.items() if c != "total"]
        return sorted(rows, key=lambda cb: -cb[1])[:n]

    def memory_line(self) -> str:
        """Whether the step fits the chip and by how much it does not; then, on a second line,
        the bytes by category and the training step they were measured over (or that the
        memory was not measured); a transformer's that does not fit ends with how to fit
        (:func:`~shardsim.cost.changes.advice_line`)."""
        if not self.memory:
            return "memory not measured (memory=False): fits and shortfall say nothing"
        mem, cap = gb(self.memory.get("total", 0)), gb(self.hardware.hbm_capacity)
        if self.fits:
            head = f"memory {mem} GB per chip of {cap} GB"
            rows = self.largest(len(self.memory))
        else:
            head = f"memory does not fit: needs {mem} GB of {cap} GB ({gb(self.shortfall)} GB short)"
            rows = self.largest()
        parts = ", ".join(f"{c} {gb(b)} GB" for c, b in rows)
        text = f"{head}\n{'largest' if not self.fits else 'by category'}: {parts}; over {self.memory_source}"
        if self.fixes is not None:
            text += "\n" + advice_line(self.fixes, self.plan, self.batch // max(self.seq, 1))
        return text

    def breakdown(self, by: str = "collective") -> list[dict[str, Any]]:
        """Rows of seconds: ``by="collective"`` per (phase, op, axes, label) summed over layers,
        ``by="layer"`` per (layer, phase), ``by="event"`` every bar (:mod:`~shardsim.cost.breakdown`),
        of :meth:`event_timeline`."""
        from . import breakdown

        tables = {"collective": breakdown.by_collective, "layer": breakdown.by_layer, "event": breakdown.by_event}
        if by not in tables:
            raise ValueError(f"breakdown by {by!r}: use 'collective', 'layer' or 'event'")
        return tables[by](self.event_timeline())

    def event_timeline(self) -> Timeline:
        """The time line of every event of the step: :attr:`timeline` itself, except for a
        pipeline timed on the layer program's clock, whose whole program (every stage,
        microbatch and layer) is built and timed now, on the same placement (seconds to
        minutes at published sizes; the breakdowns read it)."""
        if self.program is not None or self.cfg is None:
            return self.timeline
        from .model_steps import model_program
        from .timeline import build_timeline

        assert self.placement is not None
        prog = model_program(self.cfg, self.plan, self.batch, self.seq, self.dtype)
        return build_timeline(prog.steps, self.hardware, self.placement, efficiency=self.efficiency, mesh=prog.mesh)

    def bound_reason(self) -> str:
        """The numbers :attr:`bound` decides on, in words: the phase and mesh axis whose
        collectives come closest to (or past) its matmuls' FLOPs time, or the HBM time.

        >>> from shardsim import Mesh
        >>> from shardsim.cost import estimate
        >>> estimate("fsdp", Mesh(X=8), "h100", 8 * 4096, 8192, 32768).bound_reason()  # doctest: +ELLIPSIS
        'forward comm X ... ms <= FLOPs ... ms in the worst phase and axis'
        """
        terms = excess_terms(self.phases)
        if self.bound == "memory" or not terms:
            memory = sum(p["memory"] for p in self.phases.values())
            flops = sum(p["flops"] for p in self.phases.values())
            sign = ">" if memory > flops else "<="
            return f"matmul HBM traffic {ms(memory)} ms {sign} FLOPs {ms(flops)} ms"
        (phase, link), excess = max(terms.items(), key=lambda kv: kv[1])
        flops = self.phases[phase]["flops"]
        sign = ">" if excess > 0 else "<="
        return f"{phase} {link} {ms(excess + flops)} ms {sign} FLOPs {ms(flops)} ms in the worst phase and axis"

    def comm_words(self) -> str:
        """The step's line of times: step, compute, comm and how the comm splits, and the
        pipeline's bubble when there is one (the three add up to the step)."""
        parts = self.timeline.comm_parts()
        comm = ", ".join(f"{k} {ms(v)}" for k, v in parts.items() if v or k != "behind other comm")
        line = f"step {ms(self.step_s)} ms: compute {ms(self.compute_s)} ms, comm {ms(self.comm_s)} ms ({comm})"
        return line + (f", bubble {ms(self.bubble_s)} ms" if self.has_bubble else "")

    @property
    def has_bubble(self) -> bool:
        """Whether the step has a bubble worth printing (above a billionth of the step)."""
        return self.bubble_s > 1e-9 * self.step_s

    def summary(self) -> str:
        """A few lines: step, compute, comm (under compute / behind other comm / exposed), MFU,
        what bounds the step and the numbers that say so, memory; a transformer's adds its
        plan, tokens per second, FLOPs, bubble and warnings."""
        if self.cfg is not None:
            return self.model_summary(self.cfg)
        return "\n".join(
            [
                f"{self.scheme} on {self.mesh} ({self.hardware.name}), B={self.batch} tokens "
                f"({self.per_chip_batch:g}/chip), D={self.d_model}, F={self.d_ff}, {self.layers} layer(s)",
                self.comm_words(),
                f"MFU {self.mfu:.1%}, {self.bound}-bound: {self.bound_reason()}",
                self.memory_line(),
                self.efficiency.describe(),
                *(
                    f"padded {k} {a} -> {b} (a multiple of the {self.chips} chips, as FSDP pads its parameters)"
                    for k, (a, b) in self.padding.items()
                ),
                *self._defaults_line(),
            ]
        )

    def _defaults_line(self) -> list[str]:
        """The defaults line (:func:`~shardsim.cost.defaults.line`), when any was applied."""
        from .defaults import line

        return [line(self.defaults)] if self.defaults else []

    def model_summary(self, cfg: TransformerConfig) -> str:
        """Plan, model, step, tokens/s, MFU and FLOPs, bound, bubble, memory, warnings."""
        n = cfg.param_count()
        lines = [
            f"{cfg.name or 'model'} ({n / 1e9:.4g}B parameters) under {self.plan} on {self.chips} "
            f"{self.hardware.name}, B={self.batch:,} tokens (seq {self.seq}, {self.per_chip_batch:g}/chip)",
            self.comm_words(),
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
        lines += self._defaults_line()
        return "\n".join(lines)

    def figures(self) -> list[tuple[str, str]]:
        """The summary's headline figures as (quantity, value) pairs, worded as :meth:`summary`
        prints them: the rows of the notebook table.

        >>> from shardsim import Mesh
        >>> from shardsim.cost import estimate
        >>> e = estimate("ddp", Mesh(X=8), "h100", 8 * 4096, 8192, 32768)
        >>> [q for q, _ in e.figures()][:3], all(v.split()[0] in e.summary() for _, v in e.figures())
        (['step', 'compute', 'comm'], True)
        >>> e = estimate("llama3-8b", "dp=8,tp=8", "h100", batch_tokens=8 * 8192)
        >>> [q for q, _ in e.figures()][:4]
        ['step', 'tokens/s', 'MFU', 'model FLOPs']
        """
        memory = [
            ("memory per chip", f"{gb(self.memory.get('total', 0))} GB"),
            ("HBM per chip", f"{gb(self.hardware.hbm_capacity)} GB"),
        ]
        if self.cfg is not None:
            rows = [
                ("step", f"{ms(self.step_s)} ms"),
                ("tokens/s", f"{self.tokens_per_s:,.0f}"),
                ("MFU", f"{self.mfu:.1%}"),
                ("model FLOPs", f"{self.model_flops:.4g}"),
                ("6·N·T", f"{self.six_nt:.4g}"),
                ("bound", f"{self.bound}-bound"),
            ]
            if self.plan.pp > 1:
                rows.append(("bubble", f"{self.bubble:.1%}"))
            return rows + memory
        parts = self.timeline.comm_parts()
        return [
            ("step", f"{ms(self.step_s)} ms"),
            ("compute", f"{ms(self.compute_s)} ms"),
            ("comm", f"{ms(self.comm_s)} ms"),
            *((f"comm {k}", f"{ms(v)} ms") for k, v in parts.items() if v or k != "behind other comm"),
            *([("bubble", f"{ms(self.bubble_s)} ms")] if self.has_bubble else []),
            ("MFU", f"{self.mfu:.1%}"),
            ("bound", f"{self.bound}-bound"),
            *memory,
        ]

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        from .._format import table_html

        caption = self.summary().splitlines()[0]
        return table_html([("quantity", "value"), *self.figures()], right={1}, caption=caption)


#: The estimate of a transformer under a plan is the one :class:`Estimate` type.
ModelEstimate = Estimate

__all__ = ["Estimate", "ModelEstimate"]
