"""A pipeline's memory from its steady state: a two-stage probe, not every stage and microbatch.

A pipeline stage's bytes follow from three things, each measured on a small run of the same
training step (:func:`~shardsim.training.traced.trained_step`, shape-only):

- **its own state**: the weights, gradients and optimizer state of its layers, and the
  embedding on the first stage, the LM head and the loss on the last;
- **the steady state**: what a stage holds while it runs a forward beside stashed
  microbatches and the weight gradients it has summed so far (its working set, its
  communication buffers, the accumulators);
- **the stash**: the activations one layer keeps per microbatch, times the layers of every
  microbatch chunk the schedule has in flight on the stage at once
  (:meth:`~shardsim.strategies.pipeline.schedule.Schedule.peak_in_flight`).

So the probe is the plan's own step on **two** stages (each the first or the last stage, with
its embedding or its head) with ``n`` layers each, the plan's data, tensor, sequence, context
and expert parallelism, its ZeRO stage and recomputation, and the fewest microbatches that
reach the real first stage's steady state: three under 1F1B when that stage runs a forward
after its first backward (the probe's third forward runs beside two stashed microbatches and
the first one's gradients), else two (GPipe, whose stash grows with every microbatch, and
1F1B with no more microbatches than stages). The stash per layer is the probe's own: the activations one more layer
adds per microbatch in flight, read at two data ranks at most (ZeRO splits the model state,
never the activations). Each figure is read at ``n`` = 2 and 3 layers per stage and
carried on the line through them to the busiest stage's layers (the layers are identical, so
each adds the same bytes), then the stash of the real schedule's microbatches in flight added:
the first stage holds the most (``p`` under 1F1B, ``m`` under GPipe, more chunks of fewer
layers interleaved), the last stage the head. Middle stages hold neither edge and no more in
flight than the first, so each category's figure is the larger of the first and the last
stage's, as the full trace's busiest chip.

Zero-bubble schedules are probed as themselves on two stages, so what their W passes keep is
in the probe's steady state; each microbatch held until its W then counts as a whole stash,
which bounds from above the microbatches a stage holds only for their W (ZB-H1's later
stages). Interleaved schedules are probed as 1F1B over the stage's ``v`` chunks' layers at once: the same
state, the same accumulators; their stash is counted in chunks of ``layers / (p v)`` layers.
The tests hold every figure to the fully traced step (:func:`~shardsim.training.model_memory`
with ``full=True``).

>>> from shardsim.models import get
>>> from shardsim.plans import Plan
>>> cfg = get("llama-tiny").scaled(layers=8)
>>> peak, state = pipeline_memory(cfg, Plan.parse("dp=2,pp=4,microbatches=8"), batch=16, seq=16)
>>> peak["params"] == state["params"], peak["activations"] > 0
(True, True)
"""

from __future__ import annotations

import functools

from ..errors import DivisibilityError
from ..models import TransformerConfig
from ..plans import ZERO_BUBBLE, Plan
from ..strategies.pipeline.schedule import make
from ..transformer import checks
from ..transformer.roles import Roles
from .precision import Precision
from .traced import trained_step

PROBE_LAYERS = (2, 3)  # layers per stage of the probes a stage's figures are carried on from
_STASHED = ("activations", "total")  # the categories the stash of microbatches in flight adds to

_Figures = tuple[dict[str, int], dict[str, int]]


def stage_layers(layers: int, parts: int) -> int | None:
    """Layers on each of ``parts`` virtual stages (the most any holds), or None when they do not
    balance: equal, or the first and last one layer short (Llama 3's 126 layers on 16 stages).

    >>> stage_layers(126, 16), stage_layers(96, 16), stage_layers(100, 16)
    (8, 6, None)
    """
    per = -(-layers // parts)
    short = per * parts - layers
    return per if short == 0 or (short <= 2 and parts >= 2 and per >= 2) else None


def check_stages(cfg: TransformerConfig, plan: Plan, batch: int) -> int:
    """The layers of the busiest pipeline stage, after the pipeline's checks: the layers over
    ``pp x virtual_stages`` evenly or with the first and last one short, the batch over the data
    axis and the microbatches, interleaving in groups of ``pp``, untied embeddings."""
    parts = plan.pp * plan.virtual_stages
    per = stage_layers(cfg.layers, parts)
    if per is None:
        raise DivisibilityError(
            f"layers={cfg.layers} do not divide over pp={plan.pp} stages x virtual_stages={plan.virtual_stages}, "
            f"nor leave only the first and last one layer short; choose pp x virtual_stages dividing {cfg.layers} "
            f"(or {cfg.layers + 1}, {cfg.layers + 2})"
        )
    checks.check_pipeline(cfg.scaled(layers=per * parts), plan, batch)  # the rest of run_model's rules
    return per * plan.virtual_stages


def pipeline_memory(
    cfg: TransformerConfig,
    plan: Plan,
    *,
    batch: int,
    seq: int,
    optimizer: str = "adam",
    precision: Precision | None = None,
    stage_layers: int | None = None,
) -> _Figures:
    """The busiest chip's peak bytes by category (and ``"total"``) over one training step of
    ``cfg`` under the pipelined ``plan`` on ``batch`` sequences of ``seq``, and the model
    state between the backward pass and the update (module doc). ``stage_layers`` (default
    ``layers / pp``) counts every stage at that many layers, as the planner does for stages of
    unequal depth (the figures of its deepest). The plan's checks
    (:func:`~shardsim.training.model_memory`'s) are the caller's.

    The probes run over at most four data ranks: without ZeRO every chip's bytes are the same
    at any data-parallel degree past two; under ZeRO each figure is a replicated part plus a
    part split ``1/dp``, read off the probes at two and four ranks.
    """
    prec = precision if precision is not None else Precision.of(plan.precision or "bf16")
    micro = batch // (plan.dp * plan.ep * plan.microbatches)
    n = stage_layers if stage_layers is not None else cfg.layers // plan.pp
    if plan.dp <= 2 or (plan.zero == 0 and plan.dp > 2):
        return _memory(cfg, plan.replace(dp=min(plan.dp, 2)), n, micro, seq, optimizer, prec)
    two, four = (_memory(cfg, plan.replace(dp=d), n, micro, seq, optimizer, prec) for d in (2, 4))

    def at(q2: dict[str, int], q4: dict[str, int]) -> dict[str, int]:
        return {c: round(2 * q4[c] - q2[c] + 4 * (q2[c] - q4[c]) / plan.dp) for c in q2}

    return at(two[0], four[0]), at(two[1], four[1])


@functools.lru_cache(maxsize=1024)
def _memory(
    cfg: TransformerConfig, plan: Plan, n: int, micro: int, seq: int, optimizer: str, prec: Precision
) -> _Figures:
    p, m, v = plan.pp, plan.microbatches, plan.virtual_stages
    chunk = n // v
    real = make(plan.schedule, p, m, v).peak_in_flight()
    probe_plan = _probe_plan(plan)
    probe_in_flight = make(probe_plan.schedule, 2, probe_plan.microbatches, 1).peak_in_flight()
    ks = PROBE_LAYERS if n >= PROBE_LAYERS[0] else (1, 2)
    runs = [_probe(cfg, probe_plan, k, micro, seq, optimizer, prec) for k in ks]
    # the stash holds activations, which ZeRO does not split: it is read at two data ranks at most
    stash_plan = probe_plan.replace(dp=min(plan.dp, 2))
    stashed = [_probe(cfg, stash_plan, k, micro, seq, optimizer, prec) for k in ks]
    ones = [_probe(cfg, stash_plan.replace(microbatches=1), k, micro, seq, optimizer, prec) for k in ks]
    more = m - probe_plan.microbatches  # microbatches past the probe's, each leaving its tokens behind
    if more and plan.schedule != "gpipe":  # (under GPipe they are in the stash per microbatch)
        after = _probe(cfg, stash_plan.replace(microbatches=probe_plan.microbatches + 1), ks[0], micro, seq,
                       optimizer, prec)  # fmt: skip
    # what a microbatch leaves held: its stash, and under a split backward the gradients its W
    # reads too (read off the probes' totals; the held microbatches each counted whole)
    held_as = "total" if plan.schedule in ZERO_BUBBLE else "activations"
    peak: dict[str, int] = {}
    state: dict[str, int] = {}
    for stage, held in ((0, real[0]), (1, real[-1])):
        figures = [r[stage] for r in runs]
        acts = [r[stage][0][held_as] for r in stashed]
        probed = probe_in_flight[stage]
        stage_peak = _on_the_line(ks, [f[0] for f in figures], n)
        kept = after[stage][0][held_as] - acts[0] if more and plan.schedule != "gpipe" else 0
        added = more * kept
        if probed > 1:
            # one microbatch's stash of the stage's layers: what one more in flight adds to the
            # activations (the head's logits among them on the last stage), a part per layer
            # and a part per microbatch chunk (its input)
            one = [r[stage][0][held_as] for r in ones]
            stashes = [(a - a1) // (probed - 1) - kept for a, a1 in zip(acts, one)]
            per_layer = stashes[-1] - stashes[-2]
            per_chunk = _on_the_line(ks, [{"s": s} for s in stashes], n)["s"] - n * per_layer
            added += held * (chunk * per_layer + per_chunk) - probed * (n * per_layer + per_chunk)
        elif held > probed:  # the probe's stage holds one microbatch: count the stash by layers
            per_layer = acts[1] - acts[0]
            added += (held * chunk - n) * per_layer
        for c in _STASHED:
            stage_peak[c] += added
        stage_state = _on_the_line(ks, [f[1] for f in figures], n)
        for c, b in stage_peak.items():
            peak[c] = max(peak.get(c, 0), b)
        for c, b in stage_state.items():
            state[c] = max(state.get(c, 0), b)
    return peak, state


def _probe_plan(plan: Plan) -> Plan:
    """The plan of the two-stage probe: the same sharding, the fewest microbatches that reach the
    real first stage's steady state. Three under 1F1B when the real first stage runs a forward
    after its first backward (its summed gradients live beside a full stash), two when every
    backward comes after the last forward (``m <= p``, and GPipe always).

    >>> str(_probe_plan(Plan.parse("dp=8,tp=2,pp=16,schedule=interleaved,virtual_stages=2,microbatches=32")))
    'dp=8,tp=2,pp=2,microbatches=3'
    >>> [str(_probe_plan(Plan.parse(p))) for p in ("pp=4,microbatches=4", "pp=4,schedule=gpipe,microbatches=8")]
    ['pp=2,microbatches=2', 'pp=2,schedule=gpipe,microbatches=2']
    >>> str(_probe_plan(Plan.parse("pp=4,microbatches=8,recompute=selective")))  # under flash: none to drop
    'pp=2,microbatches=3'
    """
    gpipe = plan.schedule == "gpipe"
    first = [it.kind for it in sorted(make(plan.schedule, plan.pp, plan.microbatches, plan.virtual_stages).items)
             if it.stage == 0]  # fmt: skip
    steady = "F" in first[first.index("B") :]
    m = min(plan.microbatches, 3 if steady and not gpipe else 2)
    # a split backward is probed split: what its W passes keep is the probe's own
    schedule = plan.schedule if plan.schedule in ZERO_BUBBLE else "gpipe" if gpipe else "1f1b"
    # the recomputation the program runs: selective has nothing to drop under FlashAttention
    probe = plan.replace(pp=2, microbatches=m, virtual_stages=1, schedule=schedule)
    return probe.replace(recompute=Roles.of(plan).recompute)


@functools.lru_cache(maxsize=4096)  # plans of another pipeline depth or microbatch count share probes
def _probe(
    cfg: TransformerConfig, plan: Plan, layers: int, micro: int, seq: int, optimizer: str, prec: Precision
) -> tuple[_Figures, _Figures]:
    """The first and the last stage's figures of the probe with ``layers`` layers per stage."""
    model = cfg.scaled(layers=2 * layers)
    tokens = (plan.dp * plan.ep * plan.microbatches * micro, seq)
    step = trained_step(model, plan, plan.mesh(), tokens, optimizer, prec, events=False)
    first, last = step.by_stage[0], step.by_stage[-1]
    return first, last


def _on_the_line(ks: tuple[int, ...], values: list[dict[str, int]], n: int) -> dict[str, int]:
    """Each figure at ``n`` layers per stage: as probed at ``ks`` layers, beyond on the line
    through the last two probes (the layers are identical, so from two layers on each adds the
    same bytes; with fewer, a peak may be the embedding's or the head's rather than a layer's).

    >>> _on_the_line((2, 3, 4), [{"a": 10}, {"a": 14}, {"a": 18}], 9)
    {'a': 38}
    """
    out = {}
    for c in values[0]:
        ys = [v.get(c, 0) for v in values]
        out[c] = ys[ks.index(n)] if n in ks else ys[-1] + (n - ks[-1]) * (ys[-1] - ys[-2])
    return out


__all__ = ["PROBE_LAYERS", "check_stages", "pipeline_memory", "stage_layers"]
