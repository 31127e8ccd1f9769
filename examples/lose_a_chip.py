"""Lose a chip mid-run, restore the last checkpoint onto the chips left, and lose nothing.

A 2-block MLP learns to imitate a random "teacher" under FSDP (ZeRO-3) with Adam, in float64,
on 4 chips. Every 3 steps the run checkpoints its weights, Adam's moments and the step count
(``Trainer.state()`` through ``shardsim.checkpoint.save``). Before step 8 chip X2 fails: the
step's first collective raises ``ChipFailureError``. The run reloads the checkpoint of step 6
onto the 2 chips it still has, in the layouts a trainer on them uses, puts it back
(``Trainer.restore``) and trains on to step 10, redoing steps 7 and 8 with the same batches.

Then the check: a second, uninterrupted run on 2 chips from the same checkpoint ends with
exactly the same weights, and a run that never failed (4 chips all along) with the same
weights up to float64 rounding (the gradients are summed over 4 chips there, over 2 here):

    python examples/lose_a_chip.py
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import shardsim as ss
from shardsim import ChipFailureError, checkpoint, mlp
from shardsim.training import Adam, Trainer

SCHEME, LAYERS, BATCH, D_MODEL, D_FF = "fsdp", 2, 8, 8, 16
CHIPS, CHIPS_LEFT, STEPS, EVERY, FAIL_BEFORE = 4, 2, 10, 3, 8
FAILED_CHIP = 2  # X=2
OPTIMIZER = Adam(lr=1e-2)
ACTIVATION = "gelu"
TEACHER = mlp.init_stack(LAYERS, D_MODEL, D_FF, seed=1, dtype="float64")
STUDENT = mlp.init_stack(LAYERS, D_MODEL, D_FF, seed=0, dtype="float64")


@dataclass
class Outcome:
    """What the scenario shows: losses by step, the failure, and the weights compared."""

    losses: dict[int, float] = field(default_factory=dict)  # step -> loss, the run that lost a chip
    losses_restored: dict[int, float] = field(default_factory=dict)  # steps run again after the restore
    error: ChipFailureError | None = None
    checkpoint_step: int = 0
    saved: dict[str, np.ndarray] = field(default_factory=dict)  # "params/0/w_in" etc. as saved, global
    restored: dict[str, np.ndarray] = field(default_factory=dict)  # the same, read back from the trainer
    restored_step: int = 0
    final: dict[str, np.ndarray] = field(default_factory=dict)  # after the last step, restored run
    reference: dict[str, np.ndarray] = field(default_factory=dict)  # uninterrupted from the same checkpoint
    never_failed: dict[str, np.ndarray] = field(default_factory=dict)  # 4 chips all along
    losses_never_failed: dict[int, float] = field(default_factory=dict)


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """The inputs and targets of ``step`` (counting from 1): the same on any mesh, at any time."""
    x = np.random.default_rng(step).standard_normal((BATCH, D_MODEL))
    return x, mlp.stack_forward(TEACHER, x, ACTIVATION)


def new_trainer(mesh: ss.Mesh) -> Trainer:
    """The model and optimizer on ``mesh``, from the initial weights (a restore overwrites them)."""
    return Trainer(SCHEME, mesh, STUDENT, OPTIMIZER, activation=ACTIVATION)


def layouts_of(state: Mapping[str, Any]) -> dict[str, Any]:
    """The layouts of a trainer's state, nested like it: the ``layouts`` for ``checkpoint.load``."""
    return {k: layouts_of(v) if isinstance(v, Mapping) else str(v.layout) for k, v in state.items()}


def flat_globals(state: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """Every value of a state as a global array, by its checkpoint name (``params/0/w_in``)."""
    out: dict[str, np.ndarray] = {}
    for k, v in state.items():
        if isinstance(v, Mapping):
            out.update(flat_globals(v, f"{prefix}{k}/"))
        else:
            out[prefix + k] = np.array(v.to_global())
    return out


def restore(directory: Path, mesh: ss.Mesh) -> Trainer:
    """A trainer on ``mesh`` that continues from the checkpoint at ``directory``."""
    trainer = new_trainer(mesh)
    trainer.restore(checkpoint.load(directory, mesh, layouts=layouts_of(trainer.state())))
    return trainer


def lose_a_chip(workdir: str | Path, log: Callable[[str], None] = print) -> Outcome:
    """Train, checkpoint, lose a chip, restore onto fewer chips, finish; then the two reference runs."""
    workdir = Path(workdir)
    out = Outcome()
    mesh = ss.Mesh(X=CHIPS)
    trainer = new_trainer(mesh)
    last: Path | None = None
    for step in range(1, STEPS + 1):
        if step == FAIL_BEFORE:
            mesh.fail(X=FAILED_CHIP)
            log(f"-- chip (X{FAILED_CHIP}) fails")
        try:
            r = trainer.step(*batch(step))
        except ChipFailureError as e:
            out.error = e
            log(f"step {step:2}  ChipFailureError: {e}")
            break
        out.losses[step] = r.loss
        note = ""
        if step % EVERY == 0:
            last = checkpoint.save(workdir / f"step_{step}", trainer.state())
            out.checkpoint_step = step
            out.saved = flat_globals(trainer.state())
            note = f"  checkpoint -> {last.name}/ ({len(list(last.iterdir()))} files)"
        log(f"step {step:2}  loss {r.loss:.6f}{note}")
    assert last is not None and out.error is not None
    del trainer  # its mesh has a failed chip: nothing more runs there

    smaller = ss.Mesh(X=CHIPS_LEFT)
    trainer = restore(last, smaller)
    out.restored_step = trainer.step_count
    out.restored = flat_globals(trainer.state())
    same = all(np.array_equal(out.saved[k], out.restored[k]) for k in out.saved)
    log(
        f"-- restore {last.name}/ onto {smaller}: step {trainer.step_count}, weights and Adam moments "
        + ("bit for bit as saved" if same else "DIFFERENT from what was saved")
    )
    for step in range(trainer.step_count + 1, STEPS + 1):
        r = trainer.step(*batch(step))
        out.losses_restored[step] = r.loss
        before = f"  (on {CHIPS} chips: {out.losses[step]:.6f})" if step in out.losses else ""
        log(f"step {step:2}  loss {r.loss:.6f}{before}")
    out.final = trainer.params_global()

    reference = restore(last, ss.Mesh(X=CHIPS_LEFT))
    for step in range(reference.step_count + 1, STEPS + 1):
        reference.step(*batch(step))
    out.reference = reference.params_global()

    never = new_trainer(ss.Mesh(X=CHIPS))
    for step in range(1, STEPS + 1):
        out.losses_never_failed[step] = never.step(*batch(step)).loss
    out.never_failed = never.params_global()

    diff_ref = max(float(np.abs(out.final[k] - out.reference[k]).max()) for k in out.final)
    diff_never = max(float(np.abs(out.final[k] - out.never_failed[k]).max()) for k in out.final)
    log(f"final weights vs an uninterrupted run on {CHIPS_LEFT} chips from {last.name}/: max |diff| {diff_ref:.1e}")
    log(f"final weights vs a run that never failed ({CHIPS} chips all along):   max |diff| {diff_never:.1e}")
    return out


def main() -> None:
    print(
        f"{SCHEME}: {LAYERS} MLP blocks (B={BATCH}, D={D_MODEL}, F={D_FF}), Adam, float64, on {ss.Mesh(X=CHIPS)}; "
        f"checkpoint every {EVERY} steps"
    )
    with tempfile.TemporaryDirectory() as tmp:
        lose_a_chip(tmp)


if __name__ == "__main__":
    main()
