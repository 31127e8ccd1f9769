"""A shape-only training step at a third batch, read off the line through two traced ones, is the traced step.

:func:`shardsim.training.traced.trained_step` traces a program at two batches and reads it at
any other (its events off the line through theirs, its peaks replayed from the ledgers'
journals, :mod:`shardsim.journal`). Each test traces the third batch too, on an emptied cache,
and holds every figure to it: each category's peak, the model state, the stored activations,
each pipeline stage's figures and the events, over the programs the planner and the pipeline
probes run.
"""

from __future__ import annotations

import numpy as np
import pytest

from shardsim import Mesh, ShapeDtype, shard
from shardsim.array import ShardedArray, parse_layout
from shardsim.journal import Journal, peaks_on_line
from shardsim.models import get
from shardsim.plans import Plan
from shardsim.training.precision import Precision
from shardsim.training.traced import clear_steps, trained_step

CASES = [
    ("llama-tiny", "dp=2", 2),
    ("llama-tiny", "dp=2,zero=3,tp=2,sp", 3),
    ("llama-tiny", "dp=4,zero=2,tp=2", 3),
    ("llama-tiny", "tp=2,recompute=full", 3),
    ("llama-tiny", "dp=2,tp=2,attention=standard,recompute=selective", 2),
    ("llama-tiny", "cp=2,tp=2,sp", 2),
    ("llama-tiny", "dp=2,cp=2,cp_method=all_gather", 2),
    ("moe-tiny", "dp=2,ep=2", 2),
    ("gpt-tiny", "dp=2,zero=1,tp=2", 1),
    # the two-stage probes of the pipeline's memory (training/stage_memory.py)
    ("llama-tiny", "dp=2,pp=2,microbatches=3", 4),
    ("llama-tiny", "dp=4,zero=3,pp=2,microbatches=3", 6),
    ("llama-tiny", "dp=2,pp=2,microbatches=2,schedule=gpipe,zero=1", 6),
    ("llama-tiny", "tp=2,sp,recompute=full,pp=2,microbatches=3", 4),
]
BF16 = Precision.of("bf16")


def _step(model: str, plan: Plan, layers: int, micro: int, events: bool):  # type: ignore[no-untyped-def]
    cfg = get(model).scaled(layers=layers, name="")
    tokens = (plan.dp * plan.ep * plan.microbatches * micro, cfg.seq)
    return trained_step(cfg, plan, plan.mesh(), tokens, "adam", BF16, events=events)


@pytest.mark.parametrize(("model", "text", "layers"), CASES)
@pytest.mark.parametrize("events", [True, False])
def test_a_step_on_the_line_is_the_traced_step(model: str, text: str, layers: int, events: bool) -> None:
    plan = Plan.parse(text)
    clear_steps()
    for b in (1, 2):
        assert not _step(model, plan, layers, b, events).from_line
    read = [_step(model, plan, layers, b, events) for b in (3, 5)]
    assert all(s.from_line for s in read)
    for b, got in zip((3, 5), read):
        clear_steps()
        ref = _step(model, plan, layers, b, events)
        assert not ref.from_line
        assert got.memory == ref.memory
        assert got.model_state == ref.model_state
        assert got.stored == ref.stored
        assert got.by_stage == ref.by_stage
        assert [(e.op, e.label, e.sent_bytes, e.flops, e.hbm_bytes, e.local_shapes) for e in got.events] == [
            (e.op, e.label, e.sent_bytes, e.flops, e.hbm_bytes, e.local_shapes) for e in ref.events
        ]


def test_another_program_is_traced() -> None:
    """A step of another program (more microbatches in the pipeline) is traced, not read off a line."""
    clear_steps()
    plan = Plan.parse("dp=2,pp=2,microbatches=2")
    for b in (1, 2):
        _step("llama-tiny", plan, 4, b, False)
    assert not _step("llama-tiny", plan.replace(microbatches=3), 4, 1, False).from_line


def _journaled(b: int) -> tuple:  # type: ignore[type-arg]
    """A ledger's journal and peaks: weights, an activation freed before the reset, a peak of
    ``b``-sized values on one chip after it (held by chip 0 only)."""
    mesh = Mesh(X=2)
    mesh.memory.journal = Journal()
    w = shard(ShapeDtype((8, 8), "float32"), mesh, "D F", category="params")
    x = shard(ShapeDtype((4 * b, 8), "float32"), mesh, "B_X D")
    del x
    mesh.memory.reset_peak()
    only = np.array([True, False])
    lay = parse_layout("B D", mesh)
    ys = [ShardedArray(mesh, lay, (b, 8), np.dtype("float32"), holders=only) for _ in range(3)]
    del ys
    z = shard(ShapeDtype((2 * b + 64, 8), "float32"), mesh, "B D")
    del z, w
    return mesh.memory.journal.freeze(), mesh.memory.snapshot()["peak"]


@pytest.mark.parametrize("b", [3, 4, 40])
def test_peaks_replayed_from_two_journals(b: int) -> None:
    """Which value makes the peak moves with the batch (three small ones on chip 0, or one
    large one with a constant part): the replay finds it at each batch, chip by chip."""
    (j1, _), (j2, _), (_, peak) = _journaled(1), _journaled(2), _journaled(b)
    replayed = peaks_on_line((1, j1), (2, j2), b, (2,))
    assert replayed is not None
    assert {c: v.tolist() for c, v in replayed.items()} == {c: v.tolist() for c, v in peak.items()}


def test_a_program_too_long_to_journal_is_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ledger drops a journal past ``Journal.most`` changes: its step is traced and gives no
    line, so the step at a third batch is traced too."""
    monkeypatch.setattr(Journal, "most", 50)
    clear_steps()
    plan = Plan.parse("dp=2")
    traced = [_step("llama-tiny", plan, 2, b, True) for b in (1, 2, 3)]
    assert all(s.line is None and not s.from_line for s in traced)
