"""The whole-model program built from a shallow trace equals the deep trace, event for event."""

from __future__ import annotations

import pytest

from shardsim.cost import get_hardware, model_program, place
from shardsim.cost.model_steps import check_batch, trace_model
from shardsim.cost.timeline import build_timeline
from shardsim.errors import DivisibilityError
from shardsim.models import get
from shardsim.plans import Plan

SEQ = 16


def key(e):  # everything an event says but its index and value ids
    return (
        e.op, e.axes, e.label, e.phase, e.flops, e.hbm_bytes, e.sent_bytes, e.received_bytes, e.array_bytes,
        e.group_size, e.local_shapes, e.dtype, e.where, e.layer, e.item, e.before, e.after,
    )  # fmt: skip


CASES = [  # plan, layers, sequences
    ("dp=2,tp=2", 7, 8),
    ("dp=2,zero=3", 6, 4),
    ("tp=2,sp,recompute=selective", 5, 2),
    ("dp=2,zero=1,tp=2,recompute=full", 6, 4),
    ("cp=2", 5, 2),
    ("pp=2,microbatches=4", 8, 8),
    ("dp=2,pp=2,tp=2,microbatches=2,zero=1", 10, 8),
    ("pp=2,microbatches=4,schedule=interleaved,virtual_stages=2", 16, 8),
    ("pp=2,microbatches=3,schedule=gpipe", 8, 6),
    ("pp=2,microbatches=4,dp=2", 4, 8),  # two layers per stage: only the microbatches are repeated
]


@pytest.mark.parametrize(("plan", "layers", "batch"), CASES)
def test_the_repeated_program_is_the_full_trace(plan: str, layers: int, batch: int) -> None:
    cfg, p = get("llama-tiny").scaled(layers=layers), Plan.parse(plan)
    fast = model_program(cfg, p, batch * SEQ, SEQ)
    full = trace_model(cfg, p, batch, SEQ)
    assert fast is not full and len(fast.steps) == len(full.steps)  # built, not traced whole
    assert [key(s.event) for s in fast.steps] == [key(s.event) for s in full.steps]
    assert [s.layer for s in fast.steps] == [s.event.layer for s in full.steps]
    assert len({s.output for s in fast.steps}) == len(fast.steps)  # fresh ids
    # and it schedules to the same time line: every bar starts and ends where the full trace's does
    hw = get_hardware("h100")
    bars = [
        [(b.index, b.start, b.end) for b in build_timeline(q.steps, hw, place(hw, q.mesh), mesh=q.mesh).bars]
        for q in (fast, full)
    ]
    assert bars[0] == bars[1]


def test_the_layer_renaming_breaks_when_the_labels_are_not_renamed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The equality test above can fail: without renaming, the copies keep the template's labels."""
    from shardsim.cost import model_steps as mp

    cfg, p = get("llama-tiny").scaled(layers=6), Plan(dp=2, tp=2)
    monkeypatch.setattr(mp, "_renamer", lambda t, r: lambda label: label)
    mp._program.cache_clear()
    mp.model_program.cache_clear()
    try:
        fast = mp.model_program(cfg, p, 4 * SEQ, SEQ)
        assert [key(s.event) for s in fast.steps] != [key(s.event) for s in trace_model(cfg, p, 4, SEQ).steps]
    finally:
        mp._program.cache_clear()
        mp.model_program.cache_clear()


def test_the_program_is_cached() -> None:
    cfg = get("llama-tiny").scaled(layers=9)
    a = model_program(cfg, Plan(tp=2), 2 * SEQ, SEQ)
    hits = model_program.cache_info().hits
    assert model_program(cfg, Plan(tp=2), 2 * SEQ, SEQ) is a and model_program.cache_info().hits == hits + 1
    # the traced layer is shared by every depth of the same model and plan
    deeper = model_program(cfg.scaled(layers=12), Plan(tp=2), 2 * SEQ, SEQ)
    assert deeper.traced_layers == a.traced_layers == 3 and len(deeper.steps) > len(a.steps)


@pytest.mark.parametrize(
    ("plan", "tokens", "seq", "needle"),
    [
        ("dp=4", 2 * SEQ, SEQ, "fewer than dp=4"),
        ("dp=2", 3 * SEQ, SEQ, "does not split into dp=2"),
        ("dp=2", 33, SEQ, "not a whole number of sequences"),
        ("dp=2,pp=2,microbatches=4", 4 * SEQ, SEQ, "dp=2 x microbatches=4"),
        ("dp=1", 2 * SEQ, 99, "longer than the model's context"),
    ],
)
def test_batches_that_do_not_split_are_refused(plan: str, tokens: int, seq: int, needle: str) -> None:
    with pytest.raises(DivisibilityError, match=needle):
        check_batch(get("llama-tiny"), Plan.parse(plan), tokens, seq)


def test_layers_that_do_not_divide_over_the_stages_are_refused() -> None:
    with pytest.raises(DivisibilityError, match="do not divide over pp=4"):
        model_program(get("llama-tiny").scaled(layers=6), Plan(pp=4, microbatches=4), 4 * SEQ, SEQ)
