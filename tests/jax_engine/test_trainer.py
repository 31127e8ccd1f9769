"""``Trainer(..., engine="jax")``: the whole step jitted, the same steps as the NumPy trainer.

Against the NumPy engine's trainer from the same weights: the losses and the weights after
three steps within the dtype's tolerance, the same trace (every phase, optimizer included),
layouts and ledger.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import shardsim  # noqa: E402
from shardsim import EngineError  # noqa: E402
from shardsim.dtypes import tolerance  # noqa: E402
from shardsim.training import SGD, Adam, AdamW, Trainer  # noqa: E402

CASES = [
    ("ddp", {"X": 4}, SGD(lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("fsdp", {"X": 8}, Adam(lr=0.01)),
    ("tp", {"Y": 2}, AdamW(lr=0.01)),
    ("fsdp_tp", {"X": 4, "Y": 2}, Adam(lr=0.01, weight_decay=0.01)),
    ("fsdp_tp", {"X": 2, "Y": 4}, SGD(lr=0.1)),
    ("zero1", {"X": 4}, Adam(lr=0.01)),
    ("zero2", {"X": 2}, SGD(lr=0.1, momentum=0.9)),
    ("zero3", {"X": 4}, AdamW(lr=0.01)),
]


@pytest.mark.parametrize(("name", "shape", "opt"), CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_jax_trainer_equals_numpy_trainer(name: str, shape: dict[str, int], opt: object, dtype: str) -> None:
    params = shardsim.mlp.init_stack(2, 8, 16, seed=2, dtype=dtype)
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((8, 8)).astype(dtype), rng.standard_normal((8, 8)).astype(dtype)
    got = Trainer(name, shardsim.Mesh(shape), params, opt, activation="gelu", engine="jax")
    want = Trainer(name, shardsim.Mesh(shape), params, opt, activation="gelu")
    tol = tolerance(dtype, 16) * 16
    for _ in range(3):
        a, b = got.step(x, y), want.step(x, y)
        assert a.loss == pytest.approx(b.loss, rel=tol)
        assert a.step == b.step
    for k, v in want.params_global().items():
        np.testing.assert_allclose(got.params_global()[k], v, rtol=tol, atol=tol * float(np.abs(v).max()), err_msg=k)
    for slot, ws in want.moments_global().items():
        for k, v in ws.items():
            np.testing.assert_allclose(got.moments_global()[slot][k], v, rtol=tol, atol=tol * float(np.abs(v).max()))
    assert a.trace.collectives() == b.trace.collectives()
    assert [(e.op, e.axes, e.phase, e.sent_bytes) for e in a.trace.events] == [
        (e.op, e.axes, e.phase, e.sent_bytes) for e in b.trace.events
    ]
    assert a.layouts == b.layouts
    np.testing.assert_array_equal(a.stored_activations, b.stored_activations)
    assert sorted(a.memory) == sorted(b.memory)
    for c in set(b.memory) - {"params"}:
        np.testing.assert_array_equal(a.memory[c], b.memory[c], err_msg=c)
    for c in ("params", "grads", "optimizer"):
        np.testing.assert_array_equal(a.model_state[c], b.model_state[c], err_msg=c)
    # under ZeRO-1/2 the NumPy trainer briefly holds a copy of the slice it updates in place
    assert (a.memory["params"] <= b.memory["params"]).all()
    if name not in ("zero1", "zero2"):
        np.testing.assert_array_equal(a.memory["params"], b.memory["params"])


def test_the_step_is_one_jitted_program_with_sharded_state() -> None:
    t = Trainer("zero1", shardsim.Mesh(X=4), shardsim.mlp.init(8, 16), Adam(lr=0.01), engine="jax")
    x = np.ones((4, 8), np.float32)
    t.step(x, 0 * x)
    step = t._engine_step
    weights, moments, *_ = step._arguments(x, 0 * x)
    assert moments[0]["w_in"]["m"].sharding.spec == jax.sharding.PartitionSpec("X", None)  # ZeRO: state in slices
    assert weights[0]["w_in"].sharding.spec == jax.sharding.PartitionSpec(None, None)  # the weights whole
    text = step._fn.as_text()
    assert "all-gather" in text and "reduce-scatter" in text  # one XLA program holds the optimizer's collectives


def test_refused_before_tracing() -> None:
    p = shardsim.mlp.init(8, 16)
    with pytest.raises(EngineError, match="no master weights, reduce_dtype or loss scaling yet"):
        Trainer("ddp", shardsim.Mesh(X=2), p, precision="bf16", engine="jax")
    own = dataclasses.replace(shardsim.strategies.get("ddp"), name="my_ddp")  # a scheme of one's own
    with pytest.raises(EngineError, match=r"runs \['ddp'.*not 'my_ddp'"):
        Trainer(own, shardsim.Mesh(X=2), p, engine="jax")
    with pytest.raises(shardsim.ShardingError, match="engine must be 'numpy' or 'jax', got 'torch'"):
        Trainer("ddp", shardsim.Mesh(X=2), p, engine="torch")
