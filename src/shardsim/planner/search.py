"""``plan(model, hardware, chips, batch_tokens, seq, **constraints)``: the search itself.

1. Enumerate the plan space the constraints allow (:mod:`.space`).
2. Reject, untraced, every candidate whose memory *lower bound* exceeds the chip's usable
   memory (:mod:`.bounds`), and order the rest by their lower bound of time per token.
3. Walk them in that order: trace each distinct layer sharding once (:mod:`shardsim.cost.layer_program`),
   assemble the candidate's step from it (:mod:`.evaluate`), keep it if its measured memory
   fits. Stop when the next lower bound is slower than the best kept plan by more than
   ``window``: no candidate left can come within it, so the table holds every plan that
   does.

Bounds only prune; every figure in the table comes from a traced program.

>>> from shardsim.models import get
>>> table = plan(get("gpt-tiny"), "h100", chips=4, batch_tokens=8 * 16, seq=16, zero=0, recompute="none")
>>> table.best.plan.chips, table.considered >= len(table.rows) > 0
(4, True)
"""

from __future__ import annotations

import math
import numbers
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..cost.defaults import applied
from ..cost.efficiency import Efficiency, resolve_efficiency
from ..cost.hardware import Hardware, Switched, Torus
from ..cost.layer_program import LayerCache
from ..cost.model_steps import check_sizes
from ..cost.placement import AxisLink, place
from ..cost.presets import get_hardware
from ..cost.units import MAX_TOKENS, tokens_argument
from ..errors import CostModelError, PlanError, PlannerError, ShardsimError
from ..mesh import MAX_CHIPS, Mesh
from ..models import TransformerConfig
from ..models.presets import get as get_model
from ..plans import ZERO_BUBBLE, Plan
from ..training import policies
from ..training.policies import BytePolicy
from .bounds import memory_bound, stage_bound, stage_memory_bound, state_bytes, time_bound
from .evaluate import PlanEstimate, evaluate, step_clock
from .progress import Progress
from .reasons import either, nearest_batches, nearest_chips, tokens_text
from .space import PARALLELISMS, Candidate, Constraints, candidates
from .table import PlanTable, Rejection
from .twins import simplest_of_twins


def plan(
    model: TransformerConfig | str,
    hardware: Hardware | str,
    chips: int,
    batch_tokens: int,
    seq: int | None = None,
    *,
    efficiency: str | Efficiency = "calibrated",
    links: Mapping[str, str | AxisLink] | None = None,
    topology: str | Sequence[int] | None = None,
    window: float = 0.15,
    progress: bool | None = None,
    policy: str | BytePolicy | None = None,
    cache: LayerCache | None = None,
    nearest: bool = True,
    **constraints: Any,
) -> PlanTable:
    """The plans of ``model`` on ``chips`` chips of ``hardware`` that fit, fastest first.

    ``batch_tokens`` is the global batch in tokens, ``seq`` the sequence length (default the
    model's). ``constraints`` fix plan fields (``tp=8``, ``pp=16``, ``zero=1``,
    ``recompute="full"``, ``schedule="interleaved"``...) or limit the space (``allow``,
    ``headroom``, ``batch_range``, ``micro_range``, ``tp_max``; :class:`~.space.Constraints`).
    ``window``: the table keeps every plan within this fraction of the best's time per token.
    ``progress``: a counter on stderr (default: once the search has run a second, when stderr is a
    terminal; :mod:`.progress`). ``policy``: the
    training step's byte policy (:mod:`shardsim.training.policies`; default bf16 weights with
    float32 master weights and Adam moments), whose ledger gives every plan's memory; a policy
    that names a ZeRO stage (``megatron``: 0, ``megatron-distributed``: 1) holds the search to it.
    ``cache``: a :class:`~shardsim.cost.layer_program.LayerCache` whose traced layer programs this search reuses
    and adds to (searches of one model on one hardware at one sequence and byte policy, e.g.
    at several chip counts, share their traces); by default a fresh one. ``nearest``: when
    nothing fits, search larger chip counts for the nearest on which the request has a plan and
    name it (:mod:`.reasons`); off for callers that walk the chip counts themselves.
    """
    t0, asked_seq = time.perf_counter(), seq
    cfg, hw, batch_tokens, seq, chosen, cons = check_arguments(
        model, hardware, batch_tokens, seq, window=window, progress=progress, policy=policy, cache=cache,
        constraints=constraints,
    )  # fmt: skip
    if not isinstance(nearest, bool):
        raise PlannerError(f"nearest={nearest!r}: searching larger chip counts when nothing fits is on (True) or off")
    _check_inputs(cfg, hw, chips, batch_tokens, seq, cons, links, topology, efficiency)
    if cache is None:
        cache = LayerCache(cfg, hw, seq=seq, efficiency=efficiency, links=links, topology=topology, policy=chosen)
    else:
        _check_cache(cache, cfg, hw, seq, efficiency, links, topology, chosen)
    req = _Request(cfg, hw, batch_tokens, seq, cons, links, topology, window, cache)
    table = _search(req, chips, progress, t0)
    table.defaults = applied(
        plan=Plan(), efficiency=efficiency, policy=policy, seq=asked_seq, model_seq=cfg.seq,
        fixed_attention="attention" in cons.fixed,
    )  # fmt: skip
    if not table.rows:
        raise PlannerError(table.no_plan_reason(_fits_on(req, chips, table) if nearest else None))
    return table


@dataclass(frozen=True)
class _Request:
    """What a search asks, but the chip count: the same request is searched again at others."""

    cfg: TransformerConfig
    hw: Hardware
    batch_tokens: int
    seq: int
    cons: Constraints
    links: Mapping[str, str | AxisLink] | None
    topology: str | Sequence[int] | None
    window: float
    cache: LayerCache


def _search(req: _Request, chips: int, progress: bool | None, t0: float) -> PlanTable:
    """Steps 1 to 3 on ``chips`` chips: the table, with no rows when no plan fits."""
    cfg, hw, cache, seq, cons, window = req.cfg, req.hw, req.cache, req.seq, req.cons, req.window
    traced = cache.traced
    space = _plan_space(cfg, hw, chips, req.batch_tokens, seq, cons, mesh=(req.links, req.topology))
    usable = hw.hbm_capacity * (1 - cons.headroom)
    ranked, rejected = _rank_by_bounds(cfg, hw, space, cache, seq, state_bytes(cache.policy), usable=usable)
    bar = Progress(len(space), enabled=progress)
    kept, best = _walk(cfg, cache, ranked, rejected, bar, seq=seq, window=window, headroom=cons.headroom,
                       usable=usable, traced=traced)  # fmt: skip
    kept = _fastest_rows(kept, rejected, best, window)
    bar.update(considered=len(space), traced=cache.traced - traced, kept=len(kept), force=True)  # the table's counts
    bar.close()
    return PlanTable(cfg, hw, chips, req.batch_tokens, seq, kept, rejected, len(space), cache.traced - traced,
                     time.perf_counter() - t0, cons, window)  # fmt: skip


def _fits_on(req: _Request, chips: int, table: PlanTable) -> int | None:
    """Where every plan is out of memory: the nearest larger chip count on which the same request
    has a plan (searched again, its traces reused), else None. Tried: every whole number of nodes
    up to twice the chips (at most 32), then doublings; past a doubling that fits, the whole
    numbers of nodes between it and the one before (at most 16)."""
    if not any(r.kind in ("memory", "oom") for r in table.rejected):
        return None
    step = _granule(req.hw, chips)

    def fits(n: int) -> bool:
        return _mesh_problem(req.hw, n, req.cons, req.links, req.topology) is None and _fits_at(req, n)

    near = next((n for n in list(range(chips + step, 2 * chips + 1, step))[:32] if fits(n)), None)
    if near is not None:
        return near
    for k in range(2, 12):
        if chips * 2**k > MAX_CHIPS:
            break
        if fits(chips * 2**k):
            between = range(chips * 2 ** (k - 1) + step, chips * 2**k, step)
            return next((n for n in between if fits(n)), chips * 2**k) if len(between) <= 16 else chips * 2**k
    return None


def _fits_at(req: _Request, chips: int) -> bool:
    """Whether the request has a plan on ``chips`` chips: the memory bound first, untraced, then the search."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the first search warned of any missing calibration already
        domain = _fast_domain(req.hw, chips)
        space = candidates(req.cfg, chips=chips, batch_tokens=req.batch_tokens, seq=req.seq, domain=domain,
                           constraints=req.cons)  # fmt: skip
        usable = req.hw.hbm_capacity * (1 - req.cons.headroom)
        state = state_bytes(req.cache.policy)
        if all(memory_bound(req.cfg, c, seq=req.seq, state=state) > usable for c in space):
            return False
        return bool(_search(req, chips, False, time.perf_counter()).rows)


def _plan_space(
    cfg: TransformerConfig,
    hw: Hardware,
    chips: int,
    batch_tokens: int,
    seq: int,
    cons: Constraints,
    mesh: tuple[Mapping[str, str | AxisLink] | None, str | Sequence[int] | None] | None = None,
) -> list[Candidate]:
    """Step 1: every candidate the constraints allow; none at all is a :class:`PlannerError` naming them
    and the nearest request that has candidates: the nearest batches if the batch is what divides
    over no degree, else (given ``mesh``, the links and topology) the nearest chip counts."""
    domain = _fast_domain(hw, chips)
    space = list(candidates(cfg, chips=chips, batch_tokens=batch_tokens, seq=seq, domain=domain, constraints=cons))
    if space:
        return space
    name, want = cfg.name or "the model", batch_tokens // seq
    below, above, ranks = nearest_batches(cfg, chips=chips, batch_tokens=batch_tokens, seq=seq, domain=domain,
                                          constraints=cons)  # fmt: skip
    if below or above:
        shown = ", ".join(f"{r:,}" for r in ranks[:8]) + (", ..." if len(ranks) > 8 else "")
        asked = f"{want:,} sequences" if cons.batch_range is None else f"batch_range={cons.batch_range}"
        options = " or ".join(f"{b:,} sequences (batch_tokens={tokens_text(b * seq)})" for b in (below, above) if b)
        raise PlannerError(
            f"no plan of {name} on {chips:,} chips takes a batch of {asked} of {seq} tokens "
            f"{_constraint_text(cons, batch_tokens, seq, batch=False)}: it divides over none of the data-parallel "
            f"degrees the other degrees leave ({shown}); the nearest batches that do: {options}, or give "
            "batch_range=(lo, hi) to let the search choose"
        )
    near = _nearest_meshes(cfg, hw, chips, batch_tokens, seq, cons, *mesh) if mesh else ""
    raise PlannerError(
        f"no plan of {name} on {chips} chips satisfies the constraints "
        f"{_constraint_text(cons, batch_tokens, seq)}; relax a fixed degree, the batch or the microbatch range{near}"
    )


def _mesh_problem(
    hw: Hardware,
    chips: int,
    cons: Constraints,
    links: Mapping[str, str | AxisLink] | None,
    topology: str | Sequence[int] | None,
) -> str | None:
    """Why ``chips`` chips of ``hw`` cannot form a plan's mesh, or None: not whole nodes of the
    NVLink domain, no slice of the torus, or not a multiple of the fixed degrees."""
    net = next(iter(hw.networks.values()))
    if isinstance(net, Switched) and net.domain and chips > net.domain and chips % net.domain:
        return f"{chips} chips of {hw.name} do not form whole nodes of {net.domain}; use a multiple of {net.domain}"
    try:
        place(hw, Mesh(data=chips), links, topology=topology)
    except CostModelError as err:
        what = f"a {net.pod} pod" if isinstance(net, Torus) and net.pod else hw.name
        return f"{chips} chips of {hw.name} cannot be laid out on {what}: {err}"
    return cons.degrees_problem(chips)


def _nearest_meshes(
    cfg: TransformerConfig,
    hw: Hardware,
    chips: int,
    batch_tokens: int,
    seq: int,
    cons: Constraints,
    links: Mapping[str, str | AxisLink] | None,
    topology: str | Sequence[int] | None,
) -> str:
    """The nearest chip counts either side whose meshes the hardware forms and whose space holds
    candidates for this batch (the search's own tests), as the end of a message; or nothing."""

    def works(n: int) -> bool:
        if _mesh_problem(hw, n, cons, links, topology) is not None:
            return False
        space = candidates(
            cfg, chips=n, batch_tokens=batch_tokens, seq=seq, domain=_fast_domain(hw, n), constraints=cons
        )
        return next(iter(space), None) is not None

    counts = either(nearest_chips(works, chips, step=_granule(hw, chips)))
    return f"; the nearest chip counts that form this request's meshes: {counts}" if counts else ""


def _granule(hw: Hardware, chips: int) -> int:
    """The step between chip counts worth trying: whole nodes past one NVLink domain, else one chip."""
    net = next(iter(hw.networks.values()))
    return net.domain if isinstance(net, Switched) and net.domain and chips > net.domain else 1


def _rank_by_bounds(
    cfg: TransformerConfig,
    hw: Hardware,
    space: list[Candidate],
    cache: LayerCache,
    seq: int,
    state: tuple[int, int, int],
    *,
    usable: float,
) -> tuple[list[tuple[float, Candidate]], list[Rejection]]:
    """Step 2, untraced: the candidates whose memory lower bound fits in ``usable`` bytes, by
    their lower bound of time per token, and the rejections of those that do not."""
    rejected: list[Rejection] = []
    ranked: list[tuple[float, Candidate]] = []
    _, eff = cache.placement(space[0].plan)
    for c in space:
        need = memory_bound(cfg, c, seq=seq, state=state)
        if need > usable:
            rejected.append(Rejection(c, "memory", need - usable, None))
            continue
        ranked.append((time_bound(cfg, c, hw, eff, seq=seq, dtype=cache.precision.compute) / c.tokens(seq), c))
    ranked.sort(key=lambda lc: lc[0])
    return ranked, rejected


def _walk(
    cfg: TransformerConfig,
    cache: LayerCache,
    ranked: list[tuple[float, Candidate]],
    rejected: list[Rejection],
    bar: Progress,
    *,
    seq: int,
    window: float,
    headroom: float,
    usable: float,
    traced: int,
) -> tuple[list[PlanEstimate], float]:
    """Step 3: trace and assemble the ranked candidates in order until the next lower bound is
    slower than the best kept plan by more than ``window``; the plans that fit and the best
    time per token. Every candidate left out is added to ``rejected`` with its reason; the
    counter counts the layers traced since the cache held ``traced``."""
    kept: list[PlanEstimate] = []
    best = float("inf")
    done = len(rejected)
    seen: set[tuple[str, int, tuple[str, ...]]] = set()
    for i, (bound, c) in enumerate(ranked):
        pl, _ = cache.placement(c.plan, c.order)
        where = (str(c.plan), c.micro, tuple(pl.route(a).describe() for a in pl.axis_sizes))
        if where in seen:  # another mesh order that puts every axis on the same networks: the same plan
            continue
        seen.add(where)
        if bound >= best * (1 + window):
            rejected.extend(Rejection(c2, "bound", b2 / best - 1, b2 * c2.tokens(seq)) for b2, c2 in ranked[i:])
            break
        try:
            # the traced layer bounds the step before it is timed on the candidate's placement (its
            # compute alone) and, in a pipeline, again once it is (its time) before the schedule's clock runs
            split = c.plan.pp > 1 and c.plan.schedule in ZERO_BUBBLE  # its bound is the ramp of forwards
            fwd = cache.compute_per_layer(c.plan, c.micro, "forward") if split else 0.0
            lb = stage_bound(cfg, c, cache.compute_per_layer(c.plan, c.micro), fwd) / c.tokens(seq)
            if c.plan.pp > 1 and lb < best * (1 + window):
                per = cache.layer(c.plan, c.micro, c.order).per_layer
                lb = stage_bound(cfg, c, per.fwd + per.bwd, per.fwd) / c.tokens(seq)
            if lb >= best * (1 + window):
                rejected.append(Rejection(c, "bound", lb / best - 1, lb * c.tokens(seq)))
                continue
            clock = step_clock(cache, c)  # the clock before the memory: its bytes cost more to trace
            step = clock[0]
            if step / c.tokens(seq) > best * (1 + window):
                rejected.append(Rejection(c, "bound", step / c.tokens(seq) / best - 1, step))
                continue
            lay = cache.layer(c.plan, c.micro, c.order)
            if c.plan.pp > 1 and (need := stage_memory_bound(cfg, c, lay)) > usable:  # before the probe
                rejected.append(Rejection(c, "memory", need - usable, None))
                continue
            est = evaluate(cache, c, headroom=headroom, clock=clock)
        except ShardsimError as err:  # a combination the program refuses: say so, never hide it
            rejected.append(Rejection(c, "refused", 0.0, None, str(err)))
            continue
        done += 1
        if not est.fits:
            rejected.append(Rejection(c, "oom", est.shortfall, est.step_s))
        else:
            kept.append(est)
            best = min(best, est.step_s / est.tokens)
        bar.update(considered=done + i, traced=cache.traced - traced, kept=len(kept))
    return kept, best


def _fastest_rows(
    kept: list[PlanEstimate], rejected: list[Rejection], best: float, window: float
) -> list[PlanEstimate]:
    """One row per plan and microbatch, its fastest mesh order, fastest first; a plan slower than
    the best by more than ``window`` goes to ``rejected`` instead, and so does a plan whose
    program is its simpler twin's (:mod:`.twins`)."""
    kept = sorted(kept, key=lambda e: (e.step_s / e.tokens, e.memory["total"]))
    unique: dict[tuple[str, int], PlanEstimate] = {}
    for e in kept:
        if e.step_s / e.tokens <= best * (1 + window):
            unique.setdefault((str(e.plan), e.candidate.micro), e)
        else:
            rejected.append(Rejection(e.candidate, "slower", e.step_s / e.tokens / best - 1, e.step_s, e.bound))
    rows, twins = simplest_of_twins(list(unique.values()))
    rejected.extend(Rejection(e.candidate, "twin", 0.0, e.step_s, str(kept_for.plan)) for e, kept_for in twins)
    return rows


def check_arguments(
    model: Any,
    hardware: Any,
    batch_tokens: Any,
    seq: Any,
    *,
    window: Any = 0.15,
    progress: Any = None,
    policy: Any = None,
    cache: Any = None,
    constraints: dict[str, Any],
) -> tuple[TransformerConfig, Hardware, int, int, BytePolicy | None, Constraints]:
    """The arguments of a search that do not depend on the chip count, each checked before any
    work (a :class:`PlannerError` naming it): the model, its hardware, the batch in tokens (a
    whole number or ``"16M"``), the sequence, the window, the counter, the byte policy (which
    may fix ``zero`` in ``constraints``), the cache and the constraints' own values."""
    if isinstance(model, str):
        cfg = get_model(model)
    elif isinstance(model, TransformerConfig):
        cfg = model
    else:
        raise PlannerError(
            f"model={model!r:.60} ({type(model).__name__}): pass a TransformerConfig or a preset name such as "
            "'llama3-8b'"
        )
    hw = get_hardware(hardware)
    tokens = tokens_argument(batch_tokens, "batch_tokens", PlannerError)
    s = cfg.seq if seq is None else seq
    if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= MAX_TOKENS:
        raise PlannerError(f"seq={seq!r}: the sequence is a whole number of tokens from 1 to 2**40, or None for the "
                           f"model's ({cfg.seq})")  # fmt: skip
    check_sizes(cfg, 1, s)  # one sequence's tensors must be indexable: else every trace would be refused
    if isinstance(window, bool) or not isinstance(window, numbers.Real) or not 0 <= float(window) < math.inf:
        raise PlannerError(f"window={window!r}: the fraction of the best plan's time the table keeps, a number >= 0 "
                           "(e.g. 0.15)")  # fmt: skip
    if progress is not None and not isinstance(progress, bool):
        raise PlannerError(f"progress={progress!r}: the counter is on (True), off (False) or automatic (None)")
    if cache is not None and not isinstance(cache, LayerCache):
        raise PlannerError(
            f"cache={cache!r:.60}: pass a shardsim.cost.layer_program.LayerCache, or None for a fresh one"
        )
    chosen = _policy(policy, constraints)
    cons = Constraints.of(**constraints)
    cons.check_values()
    return cfg, hw, tokens, s, chosen, cons


def _policy(policy: str | BytePolicy | None, constraints: dict[str, Any]) -> BytePolicy | None:
    """The byte policy, checked; one that names a ZeRO stage fixes ``zero`` in ``constraints``."""
    if policy is None:
        return None
    try:
        chosen = policies.get(policy)
    except PlanError as err:
        raise PlannerError(f"policy={policy!r}: {err}") from None
    if chosen.zero is not None and constraints.setdefault("zero", chosen.zero) != chosen.zero:
        raise PlannerError(
            f"policy={chosen.name!r} counts ZeRO stage {chosen.zero} but zero={constraints['zero']} is fixed; "
            "drop one of the two"
        )
    return chosen


def _check_cache(
    cache: LayerCache,
    cfg: TransformerConfig,
    hw: Hardware,
    seq: int,
    efficiency: str | Efficiency,
    links: Mapping[str, str | AxisLink] | None,
    topology: str | Sequence[int] | None,
    policy: BytePolicy | None,
) -> None:
    """A shared cache must hold this search's programs: the same model, hardware, sequence,
    efficiency, links, topology and byte policy."""
    mine = (cfg, hw.name, seq, efficiency, links, topology, policy)
    theirs = (cache.model, cache.hw.name, cache.seq, cache.efficiency, cache.links, cache.topology, cache.policy)
    names = ("model", "hardware", "seq", "efficiency", "links", "topology", "policy")
    for name, a, b in zip(names, mine, theirs):
        if a != b:
            raise PlannerError(
                f"cache= holds the layer programs of another search ({name} {b!r:.60}, not {a!r:.60}); "
                "pass a LayerCache built for this one, or none"
            )


def _fast_domain(hw: Hardware, chips: int) -> int:
    """Chips joined by the fastest network (an NVLink domain; a torus: all of them)."""
    net = next(iter(hw.networks.values()))
    if isinstance(net, Switched) and net.domain:
        return min(net.domain, chips)
    return chips


def _check_inputs(
    cfg: TransformerConfig,
    hw: Hardware,
    chips: int,
    batch_tokens: int,
    seq: int,
    cons: Constraints,
    links: Mapping[str, str | AxisLink] | None,
    topology: str | Sequence[int] | None,
    efficiency: str | Efficiency,
) -> None:
    if isinstance(chips, bool) or not isinstance(chips, int) or not 1 <= chips <= MAX_CHIPS:
        raise PlannerError(f"chips={chips!r}: the cluster is a whole number of chips from 1 to {MAX_CHIPS:,} (2**24)")
    if seq > cfg.seq and cfg.position == "learned":
        raise PlannerError(f"seq={seq} is longer than the learned positions of {cfg.name or 'the model'} ({cfg.seq})")
    if cons.batch_range is not None and cons.batch_range[1] // seq < -(-cons.batch_range[0] // seq):
        raise PlannerError(
            f"batch_range={cons.batch_range} holds no whole number of {seq}-token sequences; "
            f"widen it to span a multiple of {seq}"
        )
    if batch_tokens % seq and cons.batch_range is None:
        raise PlannerError(
            f"batch_tokens={batch_tokens} is not a whole number of {seq}-token sequences; use a multiple of {seq} "
            f"(e.g. {batch_tokens // seq * seq or seq}) or give batch_range"
        )
    cons.check_values()
    problem = _mesh_problem(hw, chips, cons, links, topology)
    if problem:
        raise PlannerError(problem + _nearest_meshes(cfg, hw, chips, batch_tokens, seq, cons, links, topology))
    pl = place(hw, Mesh(data=chips), links, topology=topology)
    resolve_efficiency(hw, efficiency, pl.networks())  # an unknown mode: the cost model's own error, now
    cons.check(cfg, chips)


def _constraint_text(cons: Constraints, batch_tokens: int, seq: int, *, batch: bool = True) -> str:
    parts = [f"{k}={v}" for k, v in cons.fixed.items()]
    if tuple(cons.allow) != PARALLELISMS:
        parts.append(f"allow={list(cons.allow)}")
    if batch:
        parts.append(f"batch {batch_tokens // seq} sequences of {seq}")
    parts.append(f"microbatch {cons.micro_range[0]}..{cons.micro_range[1]}")
    return "(" + ", ".join(parts) + ")"
