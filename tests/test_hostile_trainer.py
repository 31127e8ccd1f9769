"""The transformer trainer under dropout, checkpoints and faults.

Dropout draws fresh masks every step, each step's from a documented function of the seed and
the step (held to the single-device reference's loss with that seed); a trainer restored from
a checkpoint continues bit for bit (losses and weights) under every plan; a step that fails in
its optimizer phase leaves the ledger as it was, even while the caller holds the exception.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardsim
from fault_injection import fault_after, heal
from shardsim import checkpoint
from shardsim.errors import PlanError
from shardsim.models import TransformerConfig, get, reference
from shardsim.plans import Plan
from shardsim.training import SGD, Trainer
from shardsim.training.model_trainer import ModelTrainer

LLAMA = get("llama-tiny")  # 2 layers, D=32, 4 heads (2 kv), F=96, V=64, S=16
DROPOUT = LLAMA.scaled(dropout=0.1)
TOK = np.arange(32).reshape(2, 16) % 64
PLANS = [
    Plan(tp=2),
    Plan(tp=2, pp=2, microbatches=2),
    Plan(dp=2),
    Plan(dp=2, zero=1, tp=2),
    Plan(dp=2, zero=2),
    Plan(dp=2, zero=3),
    Plan(dp=2, zero=3, tp=2, sp=True),
    Plan(dp=2, zero=1, pp=2, microbatches=2),
]


def batches(cfg: TransformerConfig, steps: int, seed: int = 7) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, cfg.vocab, (4, cfg.seq)), rng.integers(0, cfg.vocab, (4, cfg.seq))) for _ in range(steps)]


def trainer(cfg: TransformerConfig, plan: Plan, dtype: str = "float64", **options: object) -> ModelTrainer:
    return Trainer.for_model(cfg, plan, plan.mesh(), reference.init(cfg, seed=0, dtype=dtype), "adam", **options)


def state_blocks(t: ModelTrainer) -> dict[tuple[str, ...], np.ndarray]:
    return {path: holder[key].compact() for path, holder, key in t._state_slots()}


# -- dropout: fresh masks every step, reproducible from (seed, step) ------------------------------
@pytest.mark.parametrize("plan", [Plan(dp=2, tp=2), Plan(tp=2, pp=2, microbatches=2), Plan(dp=2, zero=3)], ids=str)
def test_each_step_draws_the_masks_of_its_own_seed(plan: Plan) -> None:
    from shardsim.training.model_trainer import step_dropout_seed

    plan = plan.replace(attention="standard")  # attention dropout needs the scores in memory
    t = Trainer.for_model(DROPOUT, plan, plan.mesh(), reference.init(DROPOUT, seed=0, dtype="float64"),
                          SGD(lr=0.1), dropout_seed=5)  # fmt: skip
    tok, tgt = batches(DROPOUT, 1)[0]
    for n in (1, 2, 3):
        w = t.params_global()
        loss = t.step(tok, tgt).loss
        want = reference.loss(DROPOUT, w, tok, tgt, dropout_seed=step_dropout_seed(5, n))
        assert loss == pytest.approx(want, rel=1e-12), n
        # the masks of another step give another loss: the comparison can tell them apart
        other = reference.loss(DROPOUT, w, tok, tgt, dropout_seed=step_dropout_seed(5, n + 1))
        assert abs(other - want) > 1e-6


def test_the_step_seed_is_a_documented_function_of_the_seed_and_the_step() -> None:
    from shardsim.training import step_dropout_seed

    for seed, step in [(0, 1), (5, 2), (2**40, 7)]:
        assert step_dropout_seed(seed, step) == int(np.random.SeedSequence([seed, step]).generate_state(1)[0])
    assert len({step_dropout_seed(3, n) for n in range(1, 50)}) == 49
    assert step_dropout_seed(np.int64(3), np.int32(2)) == step_dropout_seed(3, 2)


@pytest.mark.parametrize("bad", [-1, 1.5, "0", True, [1], 2**64], ids=repr)
def test_a_bad_dropout_seed_is_refused_up_front(bad: object) -> None:
    from shardsim.training import step_dropout_seed

    with pytest.raises(
        PlanError, match=r"dropout_seed must be a non-negative integer below 2\*\*64, got .*dropout_seed=0"
    ):
        trainer(DROPOUT, Plan(dp=2), dropout_seed=bad)
    with pytest.raises(PlanError, match=r"dropout_seed must be a non-negative integer"):  # run_model's own check
        shardsim.run_model(DROPOUT, Plan(dp=2), Plan(dp=2).mesh(), reference.init(DROPOUT), TOK, TOK, dropout_seed=bad)
    with pytest.raises(PlanError, match=r"dropout_seed must be a non-negative integer"):
        step_dropout_seed(bad, 1)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"step must be a non-negative integer \(1 for the first step\), got -1"):
        step_dropout_seed(0, -1)


# -- a restored trainer continues bit for bit -----------------------------------------------------
def resumes_bit_for_bit(cfg: TransformerConfig, plan: Plan, k: int, n: int, tmp: Path, **options: object) -> None:
    """Train ``k`` steps, save, restore a fresh trainer, train ``n`` more on both: the same bits."""
    data = batches(cfg, k + n)
    a = trainer(cfg, plan, **options)
    for tok, tgt in data[:k]:
        a.step(tok, tgt)
    b = trainer(cfg, plan, **options)
    b.restore(checkpoint.load(checkpoint.save(tmp / f"step_{k}", a.state()), b.mesh))
    for tok, tgt in data[k:]:
        la, lb = a.step(tok, tgt).loss, b.step(tok, tgt).loss
        assert la == lb, (plan, la, lb)
    for path, block in state_blocks(a).items():
        assert block.tobytes() == state_blocks(b)[path].tobytes(), (plan, path)


def test_a_restored_tensor_parallel_trainer_continues_bit_for_bit(tmp_path: Path) -> None:
    resumes_bit_for_bit(LLAMA, Plan(tp=2, pp=2, microbatches=2), 1, 2, tmp_path)


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    plan=st.sampled_from(PLANS),
    k=st.integers(1, 2),
    n=st.integers(1, 2),
    dtype=st.sampled_from(["float32", "float64"]),
    dropout=st.booleans(),
)
def test_a_restored_trainer_continues_bit_for_bit_under_every_plan(
    tmp_path_factory: pytest.TempPathFactory, plan: Plan, k: int, n: int, dtype: str, dropout: bool
) -> None:
    tmp = tmp_path_factory.mktemp("ckpt")
    if dropout:
        resumes_bit_for_bit(DROPOUT, plan.replace(attention="standard"), k, n, tmp, dtype=dtype, dropout_seed=3)
    else:
        resumes_bit_for_bit(LLAMA, plan, k, n, tmp, dtype=dtype)


@pytest.mark.parametrize("plan", [Plan(tp=2), Plan(dp=2, zero=1, tp=2), Plan(dp=2, zero=3, tp=2)], ids=str)
def test_a_trainer_holds_its_state_in_c_order(plan: Plan) -> None:
    """Placed, updated (ZeRO-1/2: gathered) and restored alike, so the next matmul rounds alike."""
    t = trainer(LLAMA, plan)
    assert all(b.flags.c_contiguous for b in state_blocks(t).values())
    t.step(*batches(LLAMA, 1)[0])
    assert all(b.flags.c_contiguous for b in state_blocks(t).values())
    again = trainer(LLAMA, plan)
    again.restore(t.state())
    assert all(b.flags.c_contiguous for b in state_blocks(again).values())


# -- a failed step releases what it made ----------------------------------------------------------
def first_event(t: ModelTrainer, data: tuple[np.ndarray, np.ndarray], phase: str) -> int:
    """The index of the first trace event of ``phase`` in a step like the next (run on a twin)."""
    twin = trainer(LLAMA, t.plan)
    events = twin.step(*data).trace.events
    return next(i for i, e in enumerate(events) if e.phase == phase)


@pytest.mark.parametrize("plan", [Plan(dp=2, zero=1), Plan(dp=2, zero=2, tp=2)], ids=str)
@pytest.mark.parametrize("after", [0, 1, 4])
def test_a_step_failed_in_its_optimizer_phase_leaves_the_ledger_as_it_was(plan: Plan, after: int) -> None:
    mesh = plan.mesh()
    t = Trainer.for_model(LLAMA, plan, mesh, reference.init(LLAMA, seed=0, dtype="float64"), "adam")
    data = batches(LLAMA, 2)
    t.step(*data[0])
    live = mesh.memory.live().copy()
    before = {k: v.copy() for k, v in t.params_global().items()}
    at = first_event(t, data[1], "optimizer") + after
    with pytest.raises(shardsim.ChipFailureError) as caught, fault_after(mesh, at, "chip"):
        t.step(*data[1])
    heal(mesh)
    assert caught.value.__traceback__ is not None  # the caller still holds the traceback
    np.testing.assert_array_equal(mesh.memory.live(), live)
    assert t.step_count == 1
    assert all(np.array_equal(v, before[k]) for k, v in t.params_global().items())
