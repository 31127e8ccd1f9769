"""A pipelined transformer's step, estimated from its layer program: the planner's own figures.

A pipeline of ``p`` stages and ``m`` microbatches runs ``p·m`` times the items of one stage;
tracing and timing every event of every item takes minutes at published sizes (PTD-P's
310B row: 16 stages, 144 microbatches). So the estimate reads what the planner reads: the
layer program (:class:`~shardsim.cost.layer_program.LayerCache`: the training step shape-only
at one, two and three layers, timed on the plan's placement), the schedule on its clock
(:mod:`~shardsim.cost.pipeline_clock`), and the memory of the pipeline's two-stage probe
(:func:`~shardsim.training.model_memory`). A plan the planner returns estimates to the
planner's step and memory, and a plan whose 126 layers leave the first and last stage a layer
short (as the planner and Llama 3 place them) is estimated as placed.

Layer caches are kept per model, hardware, sequence, efficiency and byte policy, so asking
the same model again with another plan or batch reuses every trace.

>>> from shardsim.models import get
>>> cfg = get("llama-tiny").scaled(layers=8, tie_embeddings=False)
>>> plan = Plan.parse("dp=2,pp=4,microbatches=8")
>>> e = estimate_pipeline(cfg, plan, get_hardware("h100"), batch=16, seq=16)
>>> e.program is None, e.bubble > 0, round(e.compute_s + e.comm_exposed_s + e.bubble_s - e.step_s, 12)
(True, True, 0.0)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from ..errors import ShardsimError
from ..mesh import Mesh
from ..models import TransformerConfig
from ..plans import Plan
from .efficiency import Efficiency
from .hardware import Hardware
from .layer_program import LayerCache
from .pipeline_clock import item_timeline
from .placement import AxisLink
from .presets import get_hardware
from .step_estimate import Estimate


@functools.lru_cache(maxsize=32)
def layer_cache(
    cfg: TransformerConfig,
    hardware: str,
    seq: int,
    efficiency: str,
    policy: str | None,
    inner: tuple[str, ...] | None,
) -> LayerCache:
    """The layer program cache of ``cfg`` on the preset ``hardware``, kept for later asks."""
    return LayerCache(cfg, hardware, seq=seq, efficiency=efficiency, policy=policy, inner=inner)


def estimate_pipeline(
    cfg: TransformerConfig,
    plan: Plan,
    hw: Hardware,
    *,
    batch: int,
    seq: int,
    efficiency: str | Efficiency = "calibrated",
    policy: str | None = None,
    links: Mapping[str, str | AxisLink] | None = None,
    topology: str | Sequence[int] | None = None,
    inner: Sequence[str] | None = None,
    memory: tuple[dict[str, int], dict[str, int], str] | None = None,
    warnings: Sequence[str] = (),
) -> Estimate:
    """The :class:`~shardsim.cost.Estimate` of ``cfg`` under the pipelined ``plan`` on ``batch``
    sequences of ``seq`` (module doc), the plan already checked
    (:func:`~shardsim.training.stage_memory.check_stages`);
    ``links``/``topology`` as :func:`~shardsim.cost.estimate` takes them, ``inner`` the mesh's
    axes innermost first on a GPU (the estimate's placement), ``memory`` the step's
    ``(peak, state, source)`` when measured."""
    order = tuple(inner) if inner is not None else None
    if isinstance(efficiency, str) and links is None and topology is None and _is_preset(hw):
        cache = layer_cache(cfg, hw.name, seq, efficiency, policy, order)
    else:
        cache = LayerCache(cfg, hw, seq=seq, efficiency=efficiency, links=links, topology=topology, policy=policy,
                           inner=order)  # fmt: skip
    micro = batch // (plan.dp * plan.ep * plan.microbatches)
    lay = cache.layer(plan, micro)
    placement, eff = cache.placement(plan)
    send = cache.p2p(plan, micro)
    mesh = Mesh(dict(placement.axis_sizes))
    title = f"{cfg.name or 'model'} under {plan} on {mesh}, {hw.name}"
    tl = item_timeline(plan, lay, cfg.layers, send, title)
    per_flops = (lay.flops[1] - lay.flops[0], lay.hardware_flops[1] - lay.hardware_flops[0])
    edge = (lay.flops[0] - per_flops[0], lay.hardware_flops[0] - per_flops[1])
    scale = plan.microbatches * plan.chips / plan.pp  # per chip of a stage's microbatch, over every chip
    flops = tuple(float((cfg.layers * f + e) * scale) for f, e in zip(per_flops, edge))
    peak, state, source = memory if memory is not None else ({}, {}, "nothing: memory=False (time only)")
    return Estimate(
        scheme=str(plan), hardware=hw, mesh=mesh, batch=batch * seq, d_model=cfg.d_model, d_ff=cfg.d_ff,
        layers=cfg.layers, dtype="bfloat16", timeline=tl, memory=peak, phases=tl.phase_totals(), efficiency=eff,
        memory_source=source, model_state=state, model=cfg, plan=plan, seq=seq, program=None, placement=placement,
        warnings=list(warnings), flops=(flops[0], flops[1]),
    )  # fmt: skip


def _is_preset(hw: Hardware) -> bool:
    """Whether ``hw`` is a preset as shipped (a cache keyed by its name holds its figures)."""
    try:
        return get_hardware(hw.name) == hw
    except ShardsimError:
        return False


__all__ = ["estimate_pipeline", "layer_cache"]
