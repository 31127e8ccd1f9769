"""float16 never silently produces NaN weights: overflow checks, skipped steps, dynamic loss scaling.

The reference for a run that overflowed is a run that never did: the same batches, minus the
skipped ones, under a static scale equal to the one the dynamic run settled on. Scales are
powers of two, so a step that does not overflow computes the same update at either scale,
bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import shardsim as ss
from fault_injection import same_state, trainer_state
from shardsim import mlp
from shardsim.training import Adam, Precision, Trainer
from shardsim.training.scaling import DynamicLossScale

SCHEMES = ("ddp", "zero1", "zero2", "fsdp", "tp", "fsdp_tp")


def mesh_for(scheme: str) -> ss.Mesh:
    return ss.Mesh(X=2, Y=2) if scheme == "fsdp_tp" else ss.Mesh(X=2)


def overflowing_problem(steps: int):
    """Two small GELU blocks on which a loss scale of 2**16 overflows float16 (found by search)."""
    rng = np.random.default_rng(2)
    params = mlp.init_stack(2, 4, 8, seed=2)
    x, y = rng.standard_normal((4, 4)).astype(np.float32), rng.standard_normal((4, 4)).astype(np.float32)
    more = [(x + 0.01 * i, y) for i in range(steps)]
    return params, more


def fp16_trainer(scheme: str, params, loss_scale) -> Trainer:
    return Trainer(
        scheme, mesh_for(scheme), params, Adam(lr=1e-3), precision="fp16", loss_scale=loss_scale, activation="gelu"
    )


def test_a_static_scale_that_overflows_skips_the_step_instead_of_writing_nan() -> None:
    # fp16 with a static loss scale of 65536 turned the float32 master weights into NaN
    params, data = overflowing_problem(1)
    t = Trainer(
        "ddp",
        ss.Mesh(X=2),
        params,
        Adam(lr=1e-3),
        precision=Precision.of("fp16", loss_scale=65536.0),
        activation="gelu",
    )
    before = trainer_state(t)
    r = t.step(*data[0])
    assert r.skipped and r.loss_scale == 65536.0 and np.isfinite(r.loss)
    assert same_state(trainer_state(t), {**before, "skipped": 1})
    assert np.isfinite(t.params_global()["w_in"]).all()
    (event,) = [e for e in r.trace.events if e.phase == "optimizer"]
    assert (event.op, event.axes) == ("all_reduce", ("X",))
    assert event.label == "found_inf (loss scale 65536): inf/NaN found, step skipped"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_an_overflowing_run_recovers_and_its_kept_steps_equal_a_run_that_never_overflowed(scheme: str) -> None:
    params, data = overflowing_problem(8)
    dynamic = fp16_trainer(scheme, params, DynamicLossScale(init_scale=2.0**16, growth_interval=100))
    results = [dynamic.step(x, y) for x, y in data]
    skipped = [r.skipped for r in results]
    scales = [r.loss_scale for r in results]
    first_kept = skipped.index(False)
    assert first_kept >= 1 and not any(skipped[first_kept:])  # it overflowed, then recovered for good
    assert scales == [2.0**16 / 2**i for i in range(first_kept)] + [2.0**16 / 2**first_kept] * (8 - first_kept)
    assert dynamic.skipped_steps == first_kept and dynamic.step_count == 8 - first_kept
    assert [r.step for r in results] == [0] * first_kept + list(range(1, 9 - first_kept))

    never = fp16_trainer(scheme, params, scales[-1])  # a static scale that never overflows here
    kept = [never.step(x, y) for (x, y), s in zip(data, skipped) if not s]
    assert [r.loss for r in kept] == [r.loss for r in results[first_kept:]]
    assert not any(r.skipped for r in kept)
    mine, theirs = trainer_state(dynamic), trainer_state(never)
    assert same_state({**mine, "skipped": 0, "scale": None}, {**theirs, "scale": None})
    assert np.isfinite(dynamic.params_global()["w_in"]).all()


def test_the_scale_grows_after_growth_interval_good_steps() -> None:
    params = mlp.init(4, 8, seed=0)
    x = np.full((4, 4), 0.1, np.float32)
    t = fp16_trainer("zero2", params, DynamicLossScale(init_scale=4.0, growth_interval=2))
    scales = [t.step(x, 0 * x).loss_scale for _ in range(6)]
    assert scales == [4.0, 4.0, 8.0, 8.0, 16.0, 16.0]
    assert t.scale.scale == 32.0 and t.skipped_steps == 0


def test_every_float16_step_checks_its_gradients_and_a_skipped_step_gathers_nothing() -> None:
    params, data = overflowing_problem(2)
    t = fp16_trainer("zero2", params, DynamicLossScale(init_scale=2.0**16))
    skipped, kept = t.step(*data[0]), None
    while kept is None or kept.skipped:
        kept = t.step(*data[1])
    assert skipped.skipped and skipped.trace.collectives("optimizer") == [("all_reduce", ("X",))]
    assert kept.trace.collectives("optimizer") == [("all_reduce", ("X",))] + [("all_gather", ("X",))] * 4
    assert kept.trace.events[-5].label.endswith(": finite")
    bf16 = Trainer("zero2", ss.Mesh(X=2), params, Adam(lr=1e-3), precision="bf16").step(*data[0])
    assert ("all_reduce", ("X",)) not in bf16.trace.collectives("optimizer")  # bfloat16 has float32's range


def test_the_running_scale_is_part_of_the_trainer_state(tmp_path) -> None:
    params, data = overflowing_problem(6)
    policy = DynamicLossScale(init_scale=2.0**16, growth_interval=3)
    a, b = fp16_trainer("fsdp", params, policy), fp16_trainer("fsdp", params, policy)
    for x, y in data[:3]:
        a.step(x, y)
    path = ss.checkpoint.save(tmp_path / "ckpt", a.state())
    b.restore(ss.checkpoint.load(path, b.mesh))
    assert b.scale == a.scale and b.step_count == a.step_count
    for x, y in data[3:]:
        assert a.step(x, y).loss == b.step(x, y).loss
    assert same_state({**trainer_state(a), "skipped": 0}, {**trainer_state(b), "skipped": 0})


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: DynamicLossScale(init_scale=0.0), "init_scale must be a finite number above 0"),
        (lambda: DynamicLossScale(init_scale=float("inf")), "init_scale must be a finite number above 0"),
        (lambda: DynamicLossScale(growth_factor=0.5), "growth_factor must be a finite number above 1"),
        (lambda: DynamicLossScale(backoff_factor=1.0), "backoff_factor must be between 0 and 1"),
        (lambda: DynamicLossScale(growth_interval=0), "growth_interval must be a whole number >= 1"),
        (lambda: DynamicLossScale(growth_interval=2.5), "growth_interval must be a whole number >= 1"),
        (lambda: Precision.of("fp16", loss_scale=-1.0), "loss_scale must be a finite number above 0"),
        (lambda: Precision.of("fp16", loss_scale=float("nan")), "loss_scale must be a finite number above 0"),
        (lambda: Precision.of("fp16", loss_scale="big"), "loss_scale must be a number, 'dynamic'"),
        (lambda: Precision.of("fp16", loss_scale=True), "loss_scale must be a number"),
    ],
)
def test_loss_scale_options_that_make_no_sense(make, match: str) -> None:
    with pytest.raises(ss.ShardingError, match=match):
        make()


@pytest.mark.parametrize("scheme", ["zero1", "zero2", "fsdp_tp"])
def test_a_shape_only_float16_step_traces_the_same_program(scheme: str) -> None:
    params = mlp.init(16, 32)
    x = np.full((8, 16), 0.01, np.float32)
    shapes = {k: ss.ShapeDtype(v.shape, v.dtype) for k, v in params.items()}
    spec = ss.ShapeDtype(x.shape, x.dtype)
    data = fp16_trainer(scheme, params, "dynamic").step(x, 0 * x)
    shape_only = fp16_trainer(scheme, shapes, "dynamic").step(spec, spec)
    assert not data.skipped and "all_reduce" in [op for op, _ in data.trace.collectives("optimizer")]  # found_inf
    assert data.trace.collectives() == shape_only.trace.collectives()
    assert data.trace.total("sent_bytes") == shape_only.trace.total("sent_bytes")
