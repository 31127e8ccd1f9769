"""Lose a chip, restore the last checkpoint onto fewer chips, and lose nothing (examples/lose_a_chip.py).

Also ``Trainer.state()`` / ``Trainer.restore()``, which the example is built on.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import shardsim as ss
from shardsim import ChipFailureError, ShardingError, checkpoint, mlp
from shardsim.dtypes import tolerance
from shardsim.training import SGD, Adam, Trainer

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lose_a_chip.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lose_a_chip", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


@pytest.fixture(scope="module")
def outcome(example: ModuleType, tmp_path_factory: pytest.TempPathFactory):
    return example.lose_a_chip(tmp_path_factory.mktemp("ckpt"), log=lambda line: None)


def test_the_failure_names_the_chip(example: ModuleType, outcome) -> None:
    assert isinstance(outcome.error, ChipFailureError)
    message = str(outcome.error)
    assert f"chip (X{example.FAILED_CHIP}) has failed" in message
    assert message.startswith("all_gather over axis 'X' of W_in.0[D_X, F]")
    assert "(step: forward phase, trace event 0)" in message
    assert sorted(outcome.losses) == list(range(1, example.FAIL_BEFORE))  # no loss for the failed step


def test_the_restored_state_is_what_was_saved_bit_for_bit(example: ModuleType, outcome) -> None:
    assert outcome.checkpoint_step == 6 and outcome.restored_step == 6
    names = {f"params/{i}/{w}" for i in "01" for w in ("w_in", "w_out")}
    names |= {f"moments/{s}/{i}/{w}" for s in "mv" for i in "01" for w in ("w_in", "w_out")}
    assert set(outcome.saved) == set(outcome.restored) == names | {"step"}
    for name in names:
        assert outcome.saved[name].dtype == outcome.restored[name].dtype == np.float64
        np.testing.assert_array_equal(outcome.restored[name], outcome.saved[name], err_msg=name)
        assert outcome.saved[name].tobytes() == outcome.restored[name].tobytes(), name  # -0.0 and all
    assert np.abs(outcome.saved["moments/v/0/w_in"]).max() > 0  # Adam has state worth restoring


def test_losses_continue_from_the_checkpointed_step(example: ModuleType, outcome) -> None:
    assert sorted(outcome.losses_restored) == list(range(outcome.checkpoint_step + 1, example.STEPS + 1))
    tol = tolerance("float64", example.BATCH * example.D_MODEL)
    for step, loss in outcome.losses_restored.items():  # redone (7) and new (8-10): as if nothing failed
        assert loss == pytest.approx(outcome.losses_never_failed[step], rel=tol, abs=0), step
    assert outcome.losses_restored[7] == pytest.approx(outcome.losses[7], rel=tol, abs=0)


def test_restoring_loses_nothing(example: ModuleType, outcome) -> None:
    assert set(outcome.final) == {"w_in", "w_out"}
    for k in outcome.final:  # the same program on the same mesh from the same checkpoint: bit for bit
        np.testing.assert_array_equal(outcome.final[k], outcome.reference[k])
    # against the run on 4 chips all along: float64 rounding at most (gradients summed over 4 or 2 chips)
    tol = tolerance("float64", example.BATCH * example.D_FF * (example.STEPS - outcome.checkpoint_step))
    for k in outcome.final:
        scale = np.abs(outcome.never_failed[k]).max()
        assert np.abs(outcome.final[k] - outcome.never_failed[k]).max() <= tol * scale, k


def test_the_example_prints_the_story(example: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    example.main()
    out = capsys.readouterr().out
    assert "step  6  loss" in out and "checkpoint -> step_6/ (50 files)" in out
    assert "step  8  ChipFailureError: all_gather over axis 'X'" in out and "chip (X2) has failed" in out
    assert "restore step_6/ onto Mesh(X=2): step 6, weights and Adam moments bit for bit as saved" in out
    assert "from step_6/: max |diff| 0.0e+00" in out


# -- Trainer.state() and Trainer.restore() ------------------------------------------------------------
def _x() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).standard_normal((4, 4))
    return x, np.zeros_like(x)


@pytest.mark.parametrize("scheme", ["ddp", "zero1", "zero2", "zero3"])
def test_state_round_trips_through_a_checkpoint_onto_fewer_chips(scheme: str, tmp_path: Path) -> None:
    params = mlp.init(4, 8, dtype="float64")
    a = Trainer(scheme, ss.Mesh(X=4), params, Adam(lr=0.1))
    for _ in range(2):
        a.step(*_x())
    path = checkpoint.save(tmp_path / "c", a.state())
    b = Trainer(scheme, ss.Mesh(X=2), params, Adam(lr=0.1))
    b.restore(checkpoint.load(path, b.mesh))  # the saved layouts: copied or re-split as b holds them
    assert b.step_count == 2
    for k in ("w_in", "w_out"):
        np.testing.assert_array_equal(b.params_global()[k], a.params_global()[k])
        for slot in ("m", "v"):
            np.testing.assert_array_equal(b.moments_global()[slot][k], a.moments_global()[slot][k])
    assert str(b.state()["moments"]["m"]["w_in"].layout) == str(a.state()["moments"]["m"]["w_in"].layout)
    la, lb = a.step(*_x()).loss, b.step(*_x()).loss
    assert lb == pytest.approx(la, rel=tolerance("float64", 32), abs=0)


def test_state_holds_masters_in_mixed_precision_and_step_counts() -> None:
    pytest.importorskip("ml_dtypes")
    params = mlp.init_stack(2, 4, 8)
    t = Trainer("zero2", ss.Mesh(X=2), params, SGD(lr=0.1, momentum=0.9), precision="bf16")
    s = t.state()
    assert sorted(s) == ["master", "moments", "params", "step"]
    assert s["params"]["1"]["w_out"].dtype.name == "bfloat16" and s["master"]["1"]["w_out"].dtype == np.float32
    assert sorted(s["moments"]) == ["momentum"] and int(s["step"].to_global()[0]) == 0
    x, y = _x()
    t.step(x.astype(np.float32), y.astype(np.float32))
    u = Trainer("zero2", ss.Mesh(X=2), params, SGD(lr=0.1, momentum=0.9), precision="bf16")
    u.restore(t.state())
    assert u.step_count == 1
    np.testing.assert_array_equal(u.params_global()["w_in"], t.params_global()["w_in"])
    np.testing.assert_array_equal(u.weights()["w_in"], t.weights()["w_in"])


def test_restore_copies_so_the_source_is_left_alone() -> None:
    params = mlp.init(4, 8, dtype="float64")
    a = Trainer("fsdp", ss.Mesh(X=2), params, Adam(lr=0.1))
    b = Trainer("fsdp", ss.Mesh(X=2), params, Adam(lr=0.1))
    state = a.state()
    before = state["params"]["w_in"].to_global().copy()
    b.restore(state)
    b.step(*_x())
    np.testing.assert_array_equal(a.params_global()["w_in"], before)


def test_restore_refuses_a_state_that_does_not_fit_before_changing_anything() -> None:
    mesh = ss.Mesh(X=2)
    t = Trainer("fsdp", mesh, mlp.init(4, 8, dtype="float64"), Adam(lr=0.1))
    before = t.params_global()["w_in"].copy()
    other = Trainer("fsdp", mesh, mlp.init(4, 16, dtype="float64"), Adam(lr=0.1)).state()
    with pytest.raises(ShardingError, match=r"cannot restore params/w_in: this trainer holds \(4, 8\) float64"):
        t.restore(other)
    sgd = Trainer("fsdp", mesh, mlp.init(4, 8, dtype="float64"), SGD(lr=0.1)).state()
    with pytest.raises(ShardingError, match=r"missing \['moments/m/w_in', .*\], unexpected \[\]"):
        t.restore(sgd)
    stack = Trainer("fsdp", mesh, mlp.init_stack(1, 4, 8, dtype="float64"), Adam(lr=0.1)).state()
    with pytest.raises(ShardingError, match=r"unexpected \['moments/m/0/w_in'"):
        t.restore(stack)
    with pytest.raises(ShardingError, match="is a ndarray, not a ShardedArray"):
        t.restore({**t.state(), "step": np.array([3])})
    with pytest.raises(ShardingError, match="a trainer state is a dict"):
        t.restore([])  # type: ignore[arg-type]
    np.testing.assert_array_equal(t.params_global()["w_in"], before)
    assert t.step_count == 0
