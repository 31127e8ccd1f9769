"""A training step either happens or it does not.

When ``Trainer.step`` raises (a failed chip, out of memory, bad input), the weights, master
weights, optimizer moments, step count and loss scale are exactly as before the call, and
the ledger holds what it held; once the fault is healed, the retried step equals the same
step of a run that never failed, bit for bit. The reference is a twin trainer on a mesh of
the same shape that never sees a fault.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardsim as ss
from fault_injection import KINDS, fault_after, heal, same_state, trainer_state
from fuzz_budget import budget
from shardsim import mlp
from shardsim.training import SGD, Adam, Trainer
from shardsim.training.scaling import DynamicLossScale

SCHEMES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "tp", "fsdp_tp")
PRECISIONS = {
    "fp64": {"precision": "fp64"},
    "bf16": {"precision": "bf16"},
    "fp16": {"precision": "fp16", "loss_scale": DynamicLossScale(init_scale=2.0**12, growth_interval=2)},
}
B, D, F = 8, 8, 16
FAULTS = (ss.ChipFailureError, ss.OutOfMemoryError)
BAD_INPUTS = (np.full((B, D), "a"), np.ones((B, D), complex), np.ones((B, D + 1)), None)  # as x


def mesh_for(scheme: str) -> ss.Mesh:
    return ss.Mesh(X=2, Y=2) if scheme == "fsdp_tp" else ss.Mesh(X=2)


def trainer(scheme: str, precision: str, optimizer, depth: int | None) -> Trainer:
    dtype = "float64" if precision == "fp64" else "float32"
    params = mlp.init(D, F, seed=1, dtype=dtype) if depth is None else mlp.init_stack(depth, D, F, seed=1, dtype=dtype)
    return Trainer(scheme, mesh_for(scheme), params, optimizer, activation="gelu", **PRECISIONS[precision])


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(step)
    return rng.standard_normal((B, D)), rng.standard_normal((B, D))


def assert_same_results(got: ss.training.StepResult, want: ss.training.StepResult) -> None:
    assert (got.loss, got.step, got.skipped, got.loss_scale) == (want.loss, want.step, want.skipped, want.loss_scale)


def faulty_step(t: Trainer, x: np.ndarray, y: np.ndarray, events: int, kind: str):
    """Run ``t.step`` with a fault after ``events`` trace events; check it changed nothing if it raised.

    Returns the step's result, or None if it raised (the fault is healed either way).
    """
    before, live = trainer_state(t), t.mesh.memory.live().copy()
    failed = False
    with fault_after(t.mesh, events, kind):
        try:
            result = t.step(x, y)
        except FAULTS:
            failed = True
    heal(t.mesh)
    if not failed:
        return result
    assert same_state(trainer_state(t), before), "a step that raised changed the trainer"
    np.testing.assert_array_equal(t.mesh.memory.live(), live)  # and released what it had made
    return None


@given(
    scheme=st.sampled_from(SCHEMES),
    precision=st.sampled_from(sorted(PRECISIONS)),
    adam=st.booleans(),
    depth=st.sampled_from([None, 2]),
    kind=st.sampled_from([*KINDS, "input"]),
    fault_step=st.integers(1, 2),
    data=st.data(),
)
@budget(60)
def test_a_step_that_raises_changes_nothing_and_its_retry_equals_an_uninterrupted_run(
    scheme, precision, adam, depth, kind, fault_step, data
) -> None:
    optimizer = Adam(lr=1e-2) if adam else SGD(lr=0.05, momentum=0.9)
    ref, faulty = trainer(scheme, precision, optimizer, depth), trainer(scheme, precision, optimizer, depth)
    for step in (1, 2, 3):
        x, y = batch(step)
        want = ref.step(x, y)
        got = None
        if step == fault_step and kind == "input":
            bad = data.draw(st.sampled_from(BAD_INPUTS), label="bad input")
            before = trainer_state(faulty)
            with pytest.raises(ss.ShardingError):
                faulty.step(bad, y)
            assert same_state(trainer_state(faulty), before)
        elif step == fault_step:
            # any point of the step; half the time one in its optimizer phase, where the state changes
            late = [e.index + 1 for e in want.trace.events if e.phase == "optimizer"]
            anywhere = st.integers(0, len(want.trace.events))
            events = data.draw(st.sampled_from(late) | anywhere if late else anywhere, label="events")
            got = faulty_step(faulty, x, y, events, kind)
        if got is None:  # healed: the same call again
            got = faulty.step(x, y)
        assert_same_results(got, want)
        assert same_state(trainer_state(faulty), trainer_state(ref)), f"diverged at step {step}"


def optimizer_events(scheme: str, precision: str, op: str | None = None) -> list[int]:
    """The indices of the trace events (of ``op``) in a step's optimizer phase."""
    r = trainer(scheme, precision, Adam(lr=1e-2), 2).step(*batch(1))
    return [e.index for e in r.trace.events if e.phase == "optimizer" and op in (None, e.op)]


@pytest.mark.parametrize("precision", ["fp64", "bf16"])
@pytest.mark.parametrize("scheme", ["zero1", "zero2"])
def test_a_chip_failing_between_the_zero_all_gathers_drops_no_weight(scheme: str, precision: str) -> None:
    # after block 0's AllGathers, before block 1's: the old code had updated block 0, dropped
    # block 1's weights and advanced the step count, so the retry diverged
    block_0_gathered = optimizer_events(scheme, precision, "all_gather")[1]
    ref, faulty = trainer(scheme, precision, Adam(lr=1e-2), 2), trainer(scheme, precision, Adam(lr=1e-2), 2)
    x, y = batch(1)
    assert faulty_step(faulty, x, y, block_0_gathered + 1, "chip") is None
    assert faulty.step_count == 0
    assert_same_results(faulty.step(x, y), ref.step(x, y))
    assert same_state(trainer_state(faulty), trainer_state(ref))


@pytest.mark.parametrize("scheme", ["ddp", "zero2", "fsdp", "fsdp_tp"])
def test_every_fault_point_of_a_mixed_precision_step(scheme: str) -> None:
    n = len(trainer(scheme, "bf16", Adam(lr=1e-2), 2).step(*batch(1)).trace.events)
    x, y = batch(1)
    want = trainer(scheme, "bf16", Adam(lr=1e-2), 2)
    want.step(x, y)
    raised = 0
    for kind in KINDS:
        for events in range(n + 1):
            t = trainer(scheme, "bf16", Adam(lr=1e-2), 2)
            got = faulty_step(t, x, y, events, kind)
            raised += got is None
            if got is None:
                t.step(x, y)
            assert same_state(trainer_state(t), trainer_state(want)), (kind, events)
    assert raised > n  # both kinds fail most points: the test reaches the optimizer phase too


def test_out_of_memory_in_the_optimizer_step_changes_nothing() -> None:
    t = trainer("zero2", "bf16", Adam(lr=1e-2), 2)
    x, y = batch(1)
    first_gather = optimizer_events("zero2", "bf16", "all_gather")[0]  # block 0's W_in is updated and gathered
    before = trainer_state(t)
    with fault_after(t.mesh, first_gather + 1, "oom"), pytest.raises(ss.OutOfMemoryError, match=r"W_out\.0"):
        t.step(x, y)
    heal(t.mesh)
    assert same_state(trainer_state(t), before)


@pytest.mark.parametrize(
    "x, match",
    [
        (np.full((B, D), "a"), "In must hold real numbers"),
        (np.ones((B, D + 1)), "W_in must be"),
        (np.ones((B, D), complex), "In must hold real numbers"),
    ],
)
def test_bad_input_changes_nothing(x, match: str) -> None:
    t = trainer("zero1", "fp64", Adam(lr=1e-2), None)
    t.step(*batch(1))
    before = trainer_state(t)
    with pytest.raises(ss.ShardingError, match=match):
        t.step(x, np.zeros((B, D)))
    assert same_state(trainer_state(t), before)


def test_a_failed_step_keeps_the_step_count_for_the_checkpoint() -> None:
    t = trainer("fsdp", "fp64", Adam(lr=1e-2), 2)
    t.step(*batch(1))
    t.mesh.fail(X=1)
    with pytest.raises(ss.ChipFailureError):
        t.step(*batch(2))
    assert int(t.state()["step"].to_global()[0]) == 1
