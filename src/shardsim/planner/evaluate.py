"""One candidate's step: time, memory by category and what binds, from its traced layer program.

The step is assembled from the layer program's measured pieces (:class:`~shardsim.cost.layer_program.Layer`):

- without a pipeline: ``m`` microbatches one after another (gradient accumulation), the
  last one's backward overlapping the gradient reduction over the data axis as DDP's
  buckets do, so ``step = (m - 1)(t_f + t_b) + t_f + t_b,fused``;
- with a pipeline: the plan's own schedule (:mod:`shardsim.strategies.pipeline.schedule`) run on a
  clock (:func:`clock`) whose items last what the traced layers take (each stage's layers,
  the head on the last virtual stage), as the whole-model estimate's time line runs them:
  each stage-to-stage send (traced) on the stage's link while the stage computes its next
  item, only its reader waiting; each chunk's last backward reducing its gradients over the
  data axis as it runs (the traced ``fused`` time), the reduction's tail past the flush
  the exposed ``sync``.

Memory per chip by category is the training step's ledger: without a pipeline each
category's peak at one, two and three layers, extended to the model's layers; with one, the
steady state of the pipeline's two-stage probe (:mod:`shardsim.training.stage_memory`, which
``model_memory`` and the estimate read too), the busiest stage's layers on every stage and
the stash of the microbatches the schedule holds in flight; ``optimizer`` is the state the update keeps (under
the default byte policy float32 master weights and Adam moments, split over the data axis
from ZeRO-1 on: the ZeRO paper's ``K = 12``).

>>> from shardsim.models import get
>>> from shardsim.plans import Plan
>>> from shardsim.cost.layer_program import LayerCache
>>> from .space import Candidate
>>> cache = LayerCache(get("gpt-tiny"), "h100", seq=16)
>>> est = evaluate(cache, Candidate(Plan(dp=2, tp=2), micro=2, batch=4))
>>> est.step_s > 0, sorted(est.memory)
(True, ['activations', 'grads', 'optimizer', 'params', 'total'])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..cost.layer_program import Layer, LayerCache
from ..cost.pipeline_clock import clock, passes
from ..cost.timeline import Timeline
from ..plans import Plan
from ..strategies.pipeline.schedule import make
from ..training.stage_memory import pipeline_memory
from .bounds import busiest_stage_layers
from .space import Candidate


@dataclass
class PlanEstimate:
    """A candidate's estimated step. Seconds; bytes per chip (the busiest chip).

    ``parts`` splits the step: ``compute`` (the busiest stage's work: matmuls and the
    communication they wait on), ``bubble`` (pipeline idle time), ``sync`` (the exposed
    gradient reduction); ``comm_exposed`` the part of ``compute`` spent waiting on each mesh
    axis's collectives. ``capacity`` is the usable HBM (after the headroom).
    """

    candidate: Candidate
    step_s: float
    tokens: int
    memory: dict[str, int]
    capacity: float
    hbm: float
    parts: dict[str, float]
    comm_exposed: dict[str, float]
    model_flops: float
    peak_flops: float
    chips: int
    timeline: Timeline
    networks: dict[str, str] = field(default_factory=dict)

    @property
    def plan(self) -> Plan:
        return self.candidate.plan

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s

    @property
    def mfu(self) -> float:
        """Model FLOPs (6 N T plus attention, from the trace's own matmuls) over chips x peak x step."""
        return self.model_flops / (self.chips * self.peak_flops * self.step_s)

    @property
    def fits(self) -> bool:
        return self.memory["total"] <= self.capacity

    @property
    def shortfall(self) -> float:
        """Bytes per chip beyond the usable memory (0 when it fits)."""
        return max(0.0, self.memory["total"] - self.capacity)

    @property
    def headroom(self) -> float:
        """Bytes per chip left free of the whole HBM."""
        return self.hbm - self.memory["total"]

    @property
    def bound(self) -> str:
        """What binds the step: ``compute``, ``bubble``, ``sync`` (the data axis's gradient
        reduction) or ``comm <axis> (<network>)``: the largest of the step's parts, the
        communication compute waits on counted apart from compute."""
        terms = {"compute": self.parts["compute"] - sum(self.comm_exposed.values())}
        terms["bubble"] = self.parts["bubble"]
        terms[f"sync data ({self.networks.get('data', '?')})"] = self.parts["sync"]
        for axis, s in self.comm_exposed.items():
            terms[f"comm {axis} ({self.networks.get(axis, '?')})"] = s
        name = max(terms, key=lambda k: terms[k])
        return name if self.headroom > 0.05 * self.hbm else f"{name}, memory nearly full"

    def row(self) -> dict[str, Any]:
        """The figures as plain values (the JSON and the table read these)."""
        return {
            "plan": str(self.plan),
            "micro": self.candidate.micro,
            "order": list(self.candidate.order),
            "step_s": self.step_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "memory": dict(self.memory),
            "headroom": self.headroom,
            "fits": self.fits,
            "bound": self.bound,
            "parts": dict(self.parts),
            "comm_exposed": dict(self.comm_exposed),
        }


def evaluate(
    cache: LayerCache, c: Candidate, *, headroom: float = 0.0, clock: tuple[float, dict[str, float]] | None = None
) -> PlanEstimate:
    """The candidate's :class:`PlanEstimate` (module doc); ``clock`` its :func:`step_clock`
    when the caller has run it already."""
    model, plan = cache.model, c.plan
    lay = cache.layer(plan, c.micro, c.order)
    n = busiest_stage_layers(model, c)
    m = plan.microbatches
    step, parts = clock if clock is not None else step_clock(cache, c)
    exposed = _exposed(lay, parts["compute"], n, m, plan)
    mem = _memory(cache, lay, c, n)
    pl, _ = cache.placement(plan, c.order)
    nets = {a: pl.route(a).describe() for a in pl.axis_sizes if pl.axis_sizes[a] > 1}
    hbm = float(cache.hw.hbm_capacity)
    layer_flops = lay.flops[1] - lay.flops[0]
    model_flops = (model.layers * layer_flops + (lay.flops[0] - layer_flops)) * m * plan.chips / plan.pp
    return PlanEstimate(
        c, step, c.tokens(cache.seq), mem, hbm * (1 - headroom), hbm, parts, exposed, model_flops,
        cache.hw.flops("bfloat16"), plan.chips, lay.timeline, nets,
    )  # fmt: skip


def _memory(cache: LayerCache, lay: Layer, c: Candidate, n: int) -> dict[str, int]:
    if c.plan.pp > 1:  # the steady state of the pipeline's two-stage probe, as model_memory reads it
        peak, _ = _pipelined(cache, c, n)
        return {k: peak.get(k, 0) for k in (*MEMORY, "total")}
    mem = {k: lay.bytes_at(k, n) for k in MEMORY}
    mem["total"] = lay.bytes_at("total", n)
    return mem


MEMORY = ("params", "grads", "optimizer", "activations")  # the categories a row lists, and the total


def _pipelined(cache: LayerCache, c: Candidate, n: int) -> tuple[dict[str, int], dict[str, int]]:
    """The pipelined step's figures (:func:`~shardsim.training.stage_memory.pipeline_memory`), every
    stage counted at the busiest stage's ``n`` layers."""
    return pipeline_memory(
        cache.model, c.plan, batch=c.batch, seq=cache.seq, optimizer=cache.optimizer, precision=cache.precision,
        stage_layers=n,
    )  # fmt: skip


def model_state(cache: LayerCache, c: Candidate) -> dict[str, int]:
    """Bytes per chip of the model state between the backward pass and the update: the weights
    as stored, the gradients as reduced, the optimizer state (the ZeRO paper's per-device
    figures, which leave out activations and the transient gathered weights).

    >>> from shardsim.models import get
    >>> cache = LayerCache(get("gpt-tiny"), "h100", seq=16)
    >>> s = model_state(cache, Candidate(Plan(dp=2, zero=3), micro=1, batch=2))
    >>> s["optimizer"] == 6 * s["params"]  # 12 bytes of Adam state per 2-byte weight
    True
    """
    n = busiest_stage_layers(cache.model, c)
    if c.plan.pp > 1:
        _, pipelined = _pipelined(cache, c, n)
        state = {k: pipelined[k] for k in ("params", "grads", "optimizer")}
    else:
        lay = cache.layer(c.plan, c.micro, c.order)
        state = {k: lay.state_at(k, n) for k in ("params", "grads", "optimizer")}
    state["total"] = sum(state.values())
    return state


def _exposed(lay: Layer, compute: float, n: int, m: int, plan: Plan) -> dict[str, float]:
    """Seconds of the busiest stage's work spent waiting on each mesh axis (the layer time
    line's exposed share of each stream, scaled to the stage's work)."""
    tl = lay.timeline
    out: dict[str, float] = {}
    for b in tl.bars:
        if b.is_compute or b.op == "ppermute":
            continue
        if b.phase == "backward" and "data" in b.axes and b.label.startswith("d") and b.op != "all_gather":
            continue  # the gradient reduction: counted as sync
        for a in b.axes:
            out[a] = out.get(a, 0.0) + b.exposed / len(b.axes)
    busy = sum(b.seconds for b in tl.bars if b.is_compute) + sum(out.values())
    scale = compute / busy if busy > 0 else 0.0
    return {a: s * scale for a, s in out.items() if s > 0}


def step_clock(cache: LayerCache, c: Candidate) -> tuple[float, dict[str, float]]:
    """The candidate's step seconds alone (its clock, without its memory), as :func:`evaluate`
    gives them, and their parts: the busiest stage's compute, the pipeline's bubble, and the
    gradient reduction's exposed tail (``sync``)."""
    lay = cache.layer(c.plan, c.micro, c.order)
    n, m = busiest_stage_layers(cache.model, c), c.plan.microbatches
    if c.plan.pp == 1:
        per, edge = lay.per_layer, lay.edge
        work = n * (per.fwd + per.bwd) + edge.fwd + edge.bwd
        last = n * (per.fwd + per.fused) + edge.fwd + edge.fused
        return (m - 1) * work + last, {"compute": m * work, "bubble": 0.0, "sync": last - work}
    span, step, busy = _pipeline(cache, lay, c)
    return step, {"compute": busy, "bubble": span - busy, "sync": step - span}


def _pipeline(cache: LayerCache, lay: Layer, c: Candidate) -> tuple[float, float, float]:
    """The schedule's span on the traced durations without the gradient reductions and with
    them, and the busiest stage's busy time (:mod:`shardsim.cost.pipeline_clock`)."""
    plan = c.plan
    p, m, v = plan.pp, plan.microbatches, plan.virtual_stages
    ps = passes(lay, cache.model.layers, p, v)
    return clock(make(plan.schedule, p, m, v), ps.fwd, ps.bwd, cache.p2p(plan, c.micro, c.order), ps.fused,
                 wgt=ps.wgt)  # fmt: skip
