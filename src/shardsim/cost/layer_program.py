"""The traced layer program: one shape-only training step per distinct layer sharding, costed once.

A plan's step is its layers' step repeated, plus the embedding and the LM head. So the
planner runs the training step (:class:`~shardsim.training.model_trainer.ModelTrainer`:
``run_model``, then the optimizer update) shape-only at one, two and three layers under
the plan's layer sharding (data, ZeRO stage, tensor, sequence and context parallelism,
recomputation, the microbatch). Times come from the time line of the forward and backward
passes (:mod:`shardsim.cost.timeline`, on the plan's own placement): one layer's is the
difference of the runs at one and two layers, the embedding and head's the remainder. Bytes
come from the mesh's ledger, the optimizer state (master weights and moments, as the byte
policy keeps them) among them: as traced up to three layers, beyond on the line through two
and three (at one layer a peak may be the embedding's or the head's rather than a layer's,
as a ZeRO-2 step's gradient buffers are). Plans that share a layer sharding
(the same layer at a different pipeline depth, schedule or placement) share the trace;
:class:`LayerCache` holds them. The steps themselves are the cost model's shape-only training
steps (:func:`~shardsim.training.traced.trained_step`), which
:func:`~shardsim.training.model_memory` reads too: a step either has traced is not traced
again, and a layer sharding at a third microbatch size is read off the line through two.

The gradient reductions over the data and context axes are kept apart (``sync``): they run
once per step (after the last microbatch; with a pipeline, after the flush), the rest once
per microbatch.

>>> from shardsim.models import get
>>> from shardsim.plans import Plan
>>> cache = LayerCache(get("gpt-tiny"), "h100", seq=16)
>>> lay = cache.layer(Plan(dp=2, tp=2), micro=2)
>>> lay.per_layer.fwd > 0 and lay.per_layer.bwd > 0, lay.stored > 0
(True, True)
>>> _ = cache.layer(Plan(dp=4, tp=2, pp=2), micro=2)  # another depth and degree, the same layer program
>>> cache.traced
1
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..array import ShapeDtype, shard
from ..collectives import ppermute
from ..mesh import Mesh
from ..models import TransformerConfig
from ..plans import ZERO_BUBBLE, Plan
from ..tracing import Event, trace
from ..training import policies
from ..training.policies import BytePolicy
from ..training.precision import Precision
from ..training.traced import trained_step
from .efficiency import Efficiency, resolve_efficiency
from .hardware import Hardware
from .model_steps import is_sync, recorded_steps
from .placement import AxisLink, Placement, place
from .presets import get_hardware
from .program import chips_running, trace_steps
from .timeline import COLLECTIVES, Timeline, build_timeline, compute_seconds


@dataclass(frozen=True)
class Times:
    """Seconds of one microbatch's forward and backward (recomputation included), and of the
    step's gradient reduction over the data axis (``sync``) when it runs alone, and when it
    overlaps the backward pass of the last microbatch (``fused``: that backward with it).
    ``wgt`` is the part of the backward a split backward runs as its W pass (its weight-gradient
    matmuls and what they wait for; 0 unless the plan's schedule splits it)."""

    fwd: float
    bwd: float
    sync: float
    fused: float
    wgt: float = 0.0

    def __sub__(self, other: Times) -> Times:
        return Times(self.fwd - other.fwd, self.bwd - other.bwd, self.sync - other.sync, self.fused - other.fused,
                     self.wgt - other.wgt)  # fmt: skip


@dataclass(frozen=True, eq=False)
class Layer:
    """What the planner reads off a layer sharding's traces (see the module doc).

    ``per_layer``/``edge``: :class:`Times` of one layer and of the embedding with the head
    (from the runs at one and two layers); ``stored``: bytes one layer keeps for the backward
    pass per microbatch; ``flops``: one microbatch's model FLOPs per chip at one and two
    layers (the forward and backward matmuls, recomputation left out, as MFU counts them);
    ``timeline``: the two-layer program's time line (the picture of the layer's step);
    ``work``: the :func:`pass_work` of one layer and of the embedding with the head;
    ``hardware_flops``: as ``flops``, recomputation included. ``memory(k)`` gives the bytes
    of the training step at ``k`` (one, two or three) layers, traced when first read: each
    category's per-chip peak (and ``"total"``) over the step, and the model state
    (``params``, ``grads``, ``optimizer``) live between the backward pass and the update. A
    candidate its clock rules out never needs them; a deep model's, only those at two and three.
    """

    per_layer: Times
    edge: Times
    stored: int
    flops: tuple[int, int]
    timeline: Timeline
    memory: Callable[[int], tuple[dict[str, int], dict[str, int]]]
    work: tuple[dict[str, float], dict[str, float]] = ({}, {})
    hardware_flops: tuple[int, int] = (0, 0)

    @functools.cached_property
    def _depths(self) -> dict[int, tuple[dict[str, int], dict[str, int]]]:
        return {}

    def _at(self, depth: int) -> tuple[dict[str, int], dict[str, int]]:
        if depth not in self._depths:
            self._depths[depth] = self.memory(depth)
        return self._depths[depth]

    def bytes_at(self, category: str, layers: int) -> int:
        """The category's per-chip peak over the step with ``layers`` layers, extended from the traces."""
        return _extend(lambda k: self._at(k)[0].get(category, 0), layers)

    def state_at(self, category: str, layers: int) -> int:
        """The category's model state between the backward pass and the update with ``layers`` layers."""
        return _extend(lambda k: self._at(k)[1].get(category, 0), layers)


def _extend(value: Callable[[int], int], layers: int) -> int:
    """A figure at ``layers`` layers from its ``value`` at one, two and three layers: as traced
    up to three, beyond on the line through two and three (from two layers on each layer adds
    the same; at one layer a peak may be the embedding's or the head's instead of a layer's).

    >>> traced = {1: 10, 2: 14, 3: 17}
    >>> _extend(traced.get, 2), _extend(traced.get, 5)
    (14, 23)
    """
    if layers <= 3:
        return int(value(layers))
    return int(value(3) + (layers - 3) * (value(3) - value(2)))


@dataclass(frozen=True)
class _Run:
    events: list[Event]  # the forward and backward passes (the update's are not timed: as estimate)
    peak: dict[str, int]
    state: dict[str, int]
    stored: int
    flops: int
    hardware_flops: int

    @functools.cached_property
    def axes(self) -> tuple[tuple[str, ...], ...]:
        """The mesh axes of each kind of collective the run issues (what its time lines depend on
        of a placement)."""
        return tuple(sorted({e.axes for e in self.events if e.op in COLLECTIVES and e.axes}))


def _flops(events: Sequence[Event], mesh: Mesh) -> tuple[int, int]:
    """One microbatch's FLOPs per chip, averaged, recomputation left out and counted in:
    an event held on some chips only (a context-parallel chip's share of causal attention)
    runs on those chips."""
    model = sum(e.flops * chips_running(mesh, e.where) for e in events if e.phase != "recompute") // mesh.size
    return model, sum(e.flops * chips_running(mesh, e.where) for e in events) // mesh.size


def pass_work(tl: Timeline) -> dict[str, float]:
    """Seconds of a microbatch's forward (``F ...``), backward (``B ...``, recomputation in
    it) and, when the backward is split, its W pass (``W ...``) on the compute stream
    (``compute``), in its matmuls' FLOPs, HBM traffic and untimed kernels alone (``flops``,
    ``memory``, ``untimed``: the bound's figures) and on each mesh axis's links (``comm
    <axis>``; a collective over two axes is split between them), summed over the bars of its
    time line.

    >>> from shardsim import Mesh
    >>> from .presets import get_hardware
    >>> from .program import scheme_program
    >>> hw, mesh = get_hardware("h100"), Mesh(X=8)
    >>> prog = scheme_program("fsdp", mesh, batch=8 * 4096, d_model=4096, d_ff=16384, layers=1)
    >>> w = pass_work(build_timeline(prog.steps, hw, place(hw, mesh)))
    >>> sorted(k for k in w if k.startswith("F"))
    ['F comm X', 'F compute', 'F flops', 'F memory', 'F untimed']
    """
    out: dict[str, float] = {}

    def add(key: str, seconds: float) -> None:
        out[key] = out.get(key, 0.0) + seconds

    for b in tl.bars:
        side = "F" if b.phase == "forward" else "W" if b.phase == "weight" else "B"
        if b.is_compute:
            add(f"{side} compute", b.seconds)
            add(f"{side} flops", b.flops_s)
            add(f"{side} memory", b.memory_s)
            add(f"{side} untimed", b.untimed_s)
        else:
            for a in b.axes:
                add(f"{side} comm {a}", b.seconds / len(b.axes))
    return out


def _minus(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) - b.get(k, 0.0) for k in {*a, *b}}


@functools.lru_cache(maxsize=4096)  # asked for every candidate of a search, several times
def trace_plan(plan: Plan) -> Plan:
    """The plan a layer is traced under: without its pipeline (one stage, one microbatch) and
    over two data ranks. The program is the same at every data-parallel degree (each rank
    runs the same layer on its microbatch); the time line then times its collectives over
    the data axis on the plan's real placement, as a collective's bytes do not depend on how
    many chips share it. Without ZeRO every chip's bytes are the same at any degree; under
    ZeRO-1, 2 and 3 the planner traces four ranks too and reads the shards' bytes at the
    plan's degree off the two (a replicated part plus a part split ``1/dp``).

    >>> str(trace_plan(Plan.parse("dp=64,zero=1,tp=2,pp=4,microbatches=8")))
    'dp=2,zero=1,tp=2'
    >>> str(trace_plan(Plan.parse("dp=64,zero=3,tp=2")))
    'dp=2,zero=3,tp=2'

    The program's own roles name the recomputation it runs: under FlashAttention selective
    recomputation has nothing to drop, so it is traced as none (:class:`~shardsim.transformer.roles.Roles`).

    >>> [str(trace_plan(Plan.parse(f"tp=2,recompute=selective,attention={a}"))) for a in ("flash", "standard")]
    ['tp=2', 'tp=2,attention=standard,recompute=selective']

    A zero-bubble schedule keeps its name: the layer's backward is split into B and W.

    >>> str(trace_plan(Plan.parse("dp=8,pp=4,microbatches=8,schedule=zb-h1")))
    'dp=2,schedule=zb-h1'

    """
    from ..transformer.roles import Roles

    split = plan.schedule in ZERO_BUBBLE  # the layer's backward as the schedule runs it: B, then its W
    lp = plan.replace(pp=1, microbatches=1, virtual_stages=1, schedule=plan.schedule if split else "1f1b",
                      precision=None)  # fmt: skip
    return lp.replace(dp=min(lp.dp, 2), recompute=Roles.of(plan).recompute)


def _at_dp(two: _Run, four: _Run, dp: int) -> _Run:
    """Bytes at ``dp`` data ranks from the runs at 2 and 4: ``q(d) = a + b/d`` through both."""

    def at(q2: int, q4: int) -> int:
        return round(2 * q4 - q2 + 4 * (q2 - q4) / dp)

    peak = {k: at(two.peak.get(k, 0), four.peak.get(k, 0)) for k in two.peak}
    state = {k: at(two.state.get(k, 0), four.state.get(k, 0)) for k in two.state}
    return replace(two, peak=peak, state=state)


class LayerCache:
    """Traced layer programs by layer sharding, and placements by mesh order, for one model on one hardware.

    ``efficiency`` and ``links`` are :func:`shardsim.cost.estimate`'s; ``seq`` the training
    sequence length; ``inner`` the axes innermost first on a GPU when no order is asked (the
    estimate's placement, :func:`~shardsim.cost.placement.place`); ``policy`` the training
    step's byte policy (:mod:`shardsim.training.policies`;
    default :func:`~shardsim.training.model_memory`'s: bf16 weights, float32 master weights
    and Adam moments). :attr:`traced` counts the distinct layer shardings read so far (each traced,
    or read off the line through two microbatch sizes of its program).
    """

    def __init__(
        self,
        model: TransformerConfig,
        hardware: Hardware | str,
        *,
        seq: int,
        efficiency: str | Efficiency = "calibrated",
        links: Mapping[str, str | AxisLink] | None = None,
        topology: str | Sequence[int] | None = None,
        policy: str | BytePolicy | None = None,
        inner: Sequence[str] | None = None,
    ) -> None:
        self.model, self.hw, self.seq = model, get_hardware(hardware), seq
        chosen = None if policy is None else policies.get(policy)
        self.policy = chosen
        self.precision = Precision.of("bf16") if chosen is None else chosen.precision
        self.optimizer = "adam" if chosen is None else chosen.optimizer
        self.efficiency, self.links, self.topology, self.inner = efficiency, links, topology, inner
        self._params = frozenset(model.scaled(layers=2).param_shapes())  # the traced programs' weights
        self._layers: dict[tuple[Any, ...], Layer] = {}
        self._programs: dict[tuple[str, int, int], _Run] = {}
        self._placements: dict[tuple[Any, ...], tuple[Placement, Efficiency]] = {}
        self._p2p: dict[tuple[Any, ...], float] = {}
        self._compute: dict[tuple[str, int, str | None], float] = {}
        self._timelines: dict[tuple[Any, ...], tuple[Times, Timeline, Timeline]] = {}
        self.traced = 0

    def with_layers(self, layers: int) -> LayerCache:
        """The same model with ``layers`` layers, sharing this cache's traces: a layer program
        does not depend on how many layers follow it.

        >>> from shardsim.models import get
        >>> cache = LayerCache(get("gpt-tiny"), "h100", seq=16)
        >>> deep = cache.with_layers(64)
        >>> deep.model.layers, deep._programs is cache._programs
        (64, True)
        """
        other = copy.copy(self)
        other.model = self.model.scaled(layers=layers)
        return other

    # -- placement ---------------------------------------------------------------------------
    def placement(self, plan: Plan, order: Sequence[str] | None = None) -> tuple[Placement, Efficiency]:
        """The plan's mesh placed on the hardware, its axes outermost-first in ``order`` (the
        roles, e.g. ``("data", "pipe", "model")``; default the plan's own mesh order)."""
        mesh = mesh_in_order(plan, order)
        inner = self.inner if order is None else None
        key = (tuple(mesh.axis_names), mesh.shape, inner)
        if key not in self._placements:
            pl = place(self.hw, mesh, self.links, topology=self.topology, inner=inner)
            self._placements[key] = (pl, resolve_efficiency(self.hw, self.efficiency, pl.networks()))
        return self._placements[key]

    # -- the layer program -------------------------------------------------------------------
    def layer(self, plan: Plan, micro: int, order: Sequence[str] | None = None) -> Layer:
        """The layer program of ``plan`` with ``micro`` sequences per microbatch per data rank,
        timed on the plan's placement (the trace is shared by every plan with the same program)."""
        lp = trace_plan(plan)
        pl, eff = self.placement(plan, order)
        key = (str(lp), micro, plan.dp, tuple(pl.axis_sizes.items()))
        if key not in self._layers:
            self._layers[key] = self._cost(lp, micro, plan.dp, pl, eff)
        return self._layers[key]

    def compute_per_layer(self, plan: Plan, micro: int, phase: str | None = None) -> float:
        """Seconds of one layer's forward and backward (recomputation in it; ``phase="forward"``:
        its forward alone) on the busiest
        chips' compute stream, from the traces at one and two layers: the same on every
        placement (:func:`~shardsim.cost.timeline.compute_seconds`). The layer's time on a
        placement adds the waits for its collectives, so the planner bounds a step by this
        before it times the layer there (the bound tests hold it under every traced step). A
        candidate it rules out needs no time line of its own placement. A split backward runs
        the same kernels in another order: its bound is the whole backward's, traced once.

        >>> from shardsim.models import get
        >>> cache = LayerCache(get("gpt-tiny"), "h100", seq=16)
        >>> per = cache.layer(Plan(dp=2, tp=2), micro=2).per_layer
        >>> 0 < cache.compute_per_layer(Plan(dp=2, tp=2), micro=2) <= per.fwd + per.bwd
        True
        """
        lp = trace_plan(plan.replace(schedule="1f1b") if plan.schedule in ZERO_BUBBLE else plan)  # the same kernels
        key = (str(lp), micro, phase)
        if key not in self._compute:
            _, eff = self.placement(plan)  # the kernels' rates are the chip's, whatever the placement
            runs = (self._run(lp, micro, k).events for k in (1, 2))
            one, two = (compute_seconds([e for e in r if phase in (None, e.phase)], self.hw, eff) for r in runs)
            self._compute[key] = two - one
        return self._compute[key]

    def _run(self, lp: Plan, micro: int, layers: int) -> _Run:
        """The shape-only training step of the layer program at ``layers`` layers, read from the
        cost model's shared steps (:func:`~shardsim.training.traced.trained_step`)."""
        key = (str(lp), micro, layers)
        if key not in self._programs:
            cfg = self.model.scaled(layers=layers, seq=max(self.seq, self.model.seq), name="")
            tok = (lp.dp * lp.ep * micro, self.seq)
            step = trained_step(cfg, lp, lp.mesh(), tok, self.optimizer, self.precision)
            self.traced += layers == 1  # a layer sharding counts once, at its first step (traced or read off a line)
            events = [e for e in step.events if e.phase != "optimizer"]
            flops, every = _flops(events, step.mesh)
            self._programs[key] = _Run(events, dict(step.memory), dict(step.model_state), step.stored, flops, every)
        return self._programs[key]

    def _memory(self, lp: Plan, micro: int, dp: int, layers: int) -> tuple[dict[str, int], dict[str, int]]:
        """The peaks and the model state of the step at ``layers`` layers; under ZeRO at ``dp``
        data ranks from the steps at two and four (:func:`_at_dp`)."""
        run = self._run(lp, micro, layers)
        if lp.zero >= 1 and dp > 2:  # the shards' bytes at the plan's own data-parallel degree
            run = _at_dp(run, self._run(lp.replace(dp=4), micro, layers), dp)
        return run.peak, run.state

    def _cost(self, lp: Plan, micro: int, dp: int, pl: Placement, eff: Efficiency) -> Layer:
        r1, r2 = self._run(lp, micro, 1), self._run(lp, micro, 2)
        (t1, _, w1), (t2, tl, w2) = (self._times(r, pl, eff) for r in (r1, r2))
        per, work = t2 - t1, _minus(pass_work(w2), pass_work(w1))
        flops, every = (r1.flops, r2.flops), (r1.hardware_flops, r2.hardware_flops)
        edge_work = _minus(pass_work(w1), work)
        memory = functools.partial(self._memory, lp, micro, dp)
        return Layer(per, t1 - per, r1.stored, flops, tl, memory, (work, edge_work), every)

    def _times(self, run: _Run, pl: Placement, eff: Efficiency) -> tuple[Times, Timeline, Timeline]:
        """The times of two time lines, the microbatch's work alone and with the gradient
        reductions (the last microbatch's backward, overlapping them), and both time lines,
        the whole first; the forward ends where its last bar does. Placements that route
        every axis the run's collectives use alike share them (an axis's other size or
        network changes nothing the run does)."""
        key = (id(run), tuple(pl.route(axes) for axes in run.axes))
        if key not in self._timelines:
            self._timelines[key] = self._timed(run.events, pl, eff)
        return self._timelines[key]

    def _timed(self, events: Sequence[Event], pl: Placement, eff: Efficiency) -> tuple[Times, Timeline, Timeline]:
        alone = [e for e in events if not is_sync(e, self._params)]
        work = build_timeline(recorded_steps(alone), self.hw, pl, efficiency=eff)
        synced = len(alone) < len(events)  # no gradient reduction (one data and context rank): one time line
        whole = build_timeline(recorded_steps(events), self.hw, pl, efficiency=eff) if synced else work
        fwd = max((b.end for b in work.bars if b.phase == "forward"), default=0.0)
        fwd_whole = max((b.end for b in whole.bars if b.phase == "forward"), default=0.0)
        sync = sum(b.seconds for b in whole.bars if is_sync(events[b.index], self._params))
        # a split backward's W: its matmuls, and the collectives they wait for (SP's re-gathers)
        wgt = sum(b.seconds if b.is_compute else b.seconds - b.hidden for b in work.bars if b.phase == "weight")
        return Times(fwd, work.step_s - fwd, sync, whole.step_s - fwd_whole, wgt), whole, work

    # -- the pipeline's sends ----------------------------------------------------------------
    def p2p(self, plan: Plan, micro: int, order: Sequence[str] | None = None) -> float:
        """Seconds of one stage-to-stage send of a microbatch's activation (a ppermute over
        the pipe axis of the plan's placed mesh, traced and timed as every collective is)."""
        if plan.pp == 1:
            return 0.0
        pl, eff = self.placement(plan, order)
        key = (plan.dp, plan.tp, plan.sp, plan.cp, plan.ep, plan.pp, micro, tuple(pl.axis_sizes))
        if key not in self._p2p:
            from ..transformer.roles import Roles

            mesh = Mesh(dict(pl.axis_sizes))
            shape = (plan.dp * plan.ep * micro, self.seq, self.model.d_model)
            x = shard(ShapeDtype(shape, self.precision.compute), mesh, Roles.of(plan, self.model.n_kv).act())
            with trace() as t:
                ppermute(x, plan.axes()["pipe"], 1, label="x")
            self._p2p[key] = build_timeline(trace_steps(t), self.hw, pl, efficiency=eff).step_s
        return self._p2p[key]


def mesh_in_order(plan: Plan, order: Sequence[str] | None = None) -> Mesh:
    """The plan's mesh with its axes outermost-first in ``order`` (roles; the rest keep their place).

    >>> mesh_in_order(Plan(dp=2, pp=4, tp=2), ("pipe", "data", "model"))
    Mesh(pipe=4, data=2, model=2)
    """
    mesh = plan.mesh()
    if order is None:
        return mesh
    axes = plan.axes()
    named = [axes[r] for r in order if plan.degree(r) > 1]
    rest = [a for a in mesh.axis_names if a not in named]
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    return Mesh({a: sizes[a] for a in [*named, *rest]})
