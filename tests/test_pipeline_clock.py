"""A pipelined estimate is timed on the layer program's clock, held to the whole program's events.

``cost.estimate`` of a pipelined plan runs the schedule on the clock the planner runs
(``shardsim.cost.pipeline_clock``): each item lasts its virtual stage's layers' traced time, the
sends and the gradient reductions on their links. The reference is the time line of every
event of the whole program (``model_program``: every stage, microbatch and layer, scheduled
one event at a time). The clock leaves out what happens at a chunk's edges inside the event
time line (the first layer of each chunk waiting for its collectives without the previous
layer's compute to hide them, the embedding's place on the first stage), so the two agree to
within 6% here; interleaved schedules, with the most chunk edges, differ most.
"""

from __future__ import annotations

import math

import pytest

from shardsim import DivisibilityError, cost
from shardsim.cost.model_steps import model_program
from shardsim.cost.timeline import build_timeline
from shardsim.models import get
from shardsim.plans import Plan

TINY = get("llama-tiny").scaled(layers=8, tie_embeddings=False)
WIDE = get("llama3-8b").scaled(layers=8)


@pytest.mark.parametrize(
    ("cfg", "seq", "plan", "hardware"),
    [
        (TINY, 16, "dp=2,tp=2,pp=2,microbatches=4", "h100"),
        (TINY, 16, "dp=2,pp=4,microbatches=8", "h100"),
        (TINY, 16, "pp=2,microbatches=4,schedule=gpipe", "h100"),
        (TINY, 16, "pp=2,microbatches=4,schedule=interleaved,virtual_stages=2", "h100"),
        (TINY, 16, "dp=2,tp=2,pp=2,microbatches=4,schedule=zb-h1", "h100"),
        (TINY, 16, "dp=2,pp=4,microbatches=8,schedule=zb-h2", "h100"),
        (WIDE, 2048, "dp=2,tp=4,pp=2,microbatches=8", "h100"),
        (WIDE, 2048, "dp=4,tp=2,pp=4,microbatches=8,recompute=full", "a100"),
        (WIDE, 4096, "tp=8,pp=2,microbatches=4,schedule=interleaved,virtual_stages=2,attention=flash", "h100"),
    ],
)
def test_the_clock_keeps_to_the_whole_programs_time_line(cfg, seq, plan, hardware) -> None:
    p = Plan.parse(plan)
    tokens = 2 * p.dp * p.microbatches * seq
    e = cost.estimate(cfg, plan, hardware, batch_tokens=tokens, seq=seq)
    assert e.program is None  # no whole program was built
    prog = model_program(cfg, p, tokens, seq)
    events = build_timeline(prog.steps, e.hardware, e.placement, efficiency=e.efficiency, mesh=prog.mesh)
    assert math.isclose(e.step_s, events.step_s, rel_tol=0.06), (e.step_s, events.step_s)
    assert math.isclose(e.model_flops, _model_flops(prog), rel_tol=1e-9)
    assert math.isclose(e.bubble, _bubble(events), abs_tol=0.03)


def test_the_item_time_line_adds_up() -> None:
    """Each stage's compute, exposed communication and bubble add up to the step; the bars are
    the schedule's items, every microbatch's forward and backward on every stage."""
    e = cost.estimate(TINY, "dp=2,tp=2,pp=4,microbatches=8", "h100", batch_tokens=16 * 16, seq=16)
    for t in e.timeline.per_chips():
        assert math.isclose(t.compute_s + t.exposed_s + t.bubble_s, e.step_s, rel_tol=1e-9)
    compute = [b for b in e.timeline.bars if b.is_compute]
    assert len(compute) == 2 * 4 * 8
    assert {b.where for b in compute} == {f"pipe{s}" for s in range(4)}
    assert e.comm_exposed_s <= e.comm_s


def test_uneven_stages_are_estimated_as_the_planner_places_them() -> None:
    """Ten layers on four stages: the first and the last one layer short, as Llama 3's 126 on 16."""
    cfg = TINY.scaled(layers=10)
    e = cost.estimate(cfg, "pp=4,microbatches=8", "h100", batch_tokens=8 * 16, seq=16)
    even = cost.estimate(TINY.scaled(layers=12), "pp=4,microbatches=8", "h100", batch_tokens=8 * 16, seq=16)
    assert e.step_s < even.step_s and e.memory["params"] == even.memory["params"]  # counted at the deepest
    with pytest.raises(DivisibilityError, match=r"layers=9 do not divide over pp=4"):
        cost.estimate(TINY.scaled(layers=9), "pp=4,microbatches=8", "h100", batch_tokens=8 * 16, seq=16)


def _model_flops(prog) -> float:
    from shardsim.cost.program import chips_running

    return sum(
        s.event.flops * chips_running(prog.mesh, s.event.where)
        for s in prog.steps
        if s.event.flops and s.event.phase in ("forward", "backward", "weight")
    )


def _bubble(tl) -> float:
    stages = [t for t in tl.per_chips() if t.chips]
    return sum(t.bubble_s for t in stages) / (len(stages) * tl.step_s)
