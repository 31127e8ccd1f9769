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
    ("tp_ln", {"Y": 2}, Adam(lr=0.01)),
    ("tp_sp", {"Y": 4}, SGD(lr=0.1, momentum=0.9)),
    ("ep", {"Y": 4}, Adam(lr=0.01)),
    ("dp_ep", {"X": 2, "Y": 2}, AdamW(lr=0.01)),
]


def params_of(name: str, dtype: str) -> dict[str, np.ndarray]:
    """Two blocks of the MLP; one block with its LayerNorm, or a mixture of 4 experts, for those schemes."""
    if name in ("ep", "dp_ep"):
        return shardsim.models.reference_moe.init(8, 16, seed=2, dtype=dtype, experts=4)
    if name in ("tp_ln", "tp_sp"):
        norm = {"gamma": np.linspace(0.5, 1.5, 8).astype(dtype), "beta": np.linspace(-0.1, 0.1, 8).astype(dtype)}
        return shardsim.models.reference_mlp.init(8, 16, seed=2, dtype=dtype) | norm
    return shardsim.models.reference_mlp.init_stack(2, 8, 16, seed=2, dtype=dtype)


@pytest.mark.parametrize(("name", "shape", "opt"), CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_jax_trainer_equals_numpy_trainer(name: str, shape: dict[str, int], opt: object, dtype: str) -> None:
    params = params_of(name, dtype)
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
    t = Trainer("zero1", shardsim.Mesh(X=4), shardsim.models.reference_mlp.init(8, 16), Adam(lr=0.01), engine="jax")
    x = np.ones((4, 8), np.float32)
    t.step(x, 0 * x)
    step = t._engine_step
    weights, _, moments, *_ = step._arguments(x, 0 * x)
    assert moments[0]["w_in"]["m"].sharding.spec == jax.sharding.PartitionSpec("X", None)  # ZeRO: state in slices
    assert weights[0]["w_in"].sharding.spec == jax.sharding.PartitionSpec(None, None)  # the weights whole
    text = step._fn.as_text()
    assert "all-gather" in text and "reduce-scatter" in text  # one XLA program holds the optimizer's collectives


MIXED = [
    ("ddp", {"X": 4}, SGD(lr=0.1)),
    ("fsdp", {"X": 4}, SGD(lr=0.1, momentum=0.9)),
    ("tp", {"Y": 2}, SGD(lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("fsdp_tp", {"X": 2, "Y": 2}, Adam(lr=0.01)),
    ("zero1", {"X": 4}, SGD(lr=0.1, momentum=0.9)),  # the update casts the masters' slices, then gathers
    ("zero2", {"X": 2}, AdamW(lr=0.01)),
    ("zero3", {"X": 4}, SGD(lr=0.1)),
]
STEPS = 3


@pytest.mark.parametrize(("name", "shape", "opt"), MIXED)
def test_mixed_precision_jax_trainer_equals_numpy_trainer(name: str, shape: dict[str, int], opt: object) -> None:
    """bfloat16 compute, float32 masters and moments: the same steps, trace and ledger on both engines.

    On both, the 16-bit weights are exactly the masters rounded to bfloat16. The engines may
    sum a matmul's bfloat16 products in another order (the first losses differ by ~1e-3),
    so the losses agree to two bfloat16 ulps and SGD's masters (``w - lr g``) to two ulps of
    the gradients' scale. Adam divides by ``sqrt(v)``, so a gradient near zero may flip its
    step's sign: its masters agree to the steps' size, ``2 lr`` per step.
    """
    params = shardsim.models.reference_mlp.init_stack(2, 8, 16, seed=3, dtype="float32")
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((8, 8)).astype("float32"), rng.standard_normal((8, 8)).astype("float32")
    got = Trainer(name, shardsim.Mesh(shape), params, opt, activation="gelu", precision="bf16", engine="jax")
    want = Trainer(name, shardsim.Mesh(shape), params, opt, activation="gelu", precision="bf16")
    ulp = float(shardsim.dtypes.eps("bfloat16"))
    for _ in range(STEPS):
        a, b = got.step(x, y), want.step(x, y)
        assert a.loss == pytest.approx(b.loss, rel=2 * ulp)
    masters, weights = got.params_global(), got.weights()
    for k, v in want.params_global().items():
        assert masters[k].dtype == np.float32 and weights[k].dtype == want.weights()[k].dtype
        assert weights[k].dtype.name == "bfloat16"
        np.testing.assert_array_equal(weights[k], masters[k].astype(weights[k].dtype), err_msg=k)
        atol = 2 * opt.lr * STEPS if isinstance(opt, Adam) else 2 * ulp * float(np.abs(v).max())
        np.testing.assert_allclose(masters[k], v, rtol=0, atol=atol, err_msg=k)
    for slot, ws in want.moments_global().items():
        for k, v in ws.items():
            m = got.moments_global()[slot][k]
            assert m.dtype == np.float32
            if not isinstance(opt, Adam):
                np.testing.assert_allclose(m, v, rtol=0, atol=2 * ulp * float(np.abs(v).max()), err_msg=k)
    assert [(e.op, e.axes, e.phase, e.sent_bytes, e.dtype) for e in a.trace.events] == [
        (e.op, e.axes, e.phase, e.sent_bytes, e.dtype) for e in b.trace.events
    ]
    assert a.layouts == b.layouts
    for c in ("params", "grads", "optimizer"):
        np.testing.assert_array_equal(a.model_state[c], b.model_state[c], err_msg=c)
    for c in set(b.memory) - {"params"}:
        np.testing.assert_array_equal(a.memory[c], b.memory[c], err_msg=c)


@pytest.mark.parametrize(("name", "shape"), [("ddp", {"X": 4}), ("zero1", {"X": 4}), ("fsdp_tp", {"X": 2, "Y": 2})])
def test_a_reduce_dtype_reduces_the_gradients_in_it_as_on_numpy(name: str, shape: dict[str, int]) -> None:
    """bf16 compute, float32 masters, gradients reduced over the data axis in float32
    (FSDP's ``MixedPrecision(reduce_dtype=float32)``): the same trace, dtypes and bytes as the
    NumPy trainer's, the masters equal to a float32 ulp."""
    params = shardsim.models.reference_mlp.init_stack(2, 8, 16, seed=3, dtype="float32")
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((8, 8)).astype("float32"), rng.standard_normal((8, 8)).astype("float32")
    opts = {"activation": "gelu", "precision": "bf16", "reduce_dtype": "float32"}
    got = Trainer(name, shardsim.Mesh(shape), params, SGD(lr=0.1), engine="jax", **opts)
    want = Trainer(name, shardsim.Mesh(shape), params, SGD(lr=0.1), **opts)
    for _ in range(3):
        a, b = got.step(x, y), want.step(x, y)
        assert a.loss == pytest.approx(b.loss, rel=1e-6)
    events = [(e.op, e.axes, e.phase, e.sent_bytes, str(e.dtype)) for e in a.trace.events]
    assert events == [(e.op, e.axes, e.phase, e.sent_bytes, str(e.dtype)) for e in b.trace.events]
    assert {d for op, axes, phase, _, d in events if op != "all_gather" and axes == ("X",) and phase != "forward"} == {
        "float32"
    }
    for k, v in want.params_global().items():
        np.testing.assert_allclose(got.params_global()[k], v, rtol=0, atol=4 * float(np.spacing(np.float32(1))))


def test_refused_before_tracing() -> None:
    p = shardsim.models.reference_mlp.init(8, 16)
    for kwargs in ({"precision": "fp16"}, {"precision": "bf16", "loss_scale": 8.0}, {"loss_scale": 8.0}):
        with pytest.raises(EngineError, match="no loss scaling or float16 overflow checks yet"):
            Trainer("ddp", shardsim.Mesh(X=2), p, engine="jax", **kwargs)
    own = dataclasses.replace(shardsim.strategies.get("ddp"), name="my_ddp")  # a scheme of one's own
    with pytest.raises(EngineError, match=r"runs \['ddp'.*not 'my_ddp'"):
        Trainer(own, shardsim.Mesh(X=2), p, engine="jax")
    with pytest.raises(shardsim.ShardingError, match="engine must be 'numpy' or 'jax', got 'torch'"):
        Trainer("ddp", shardsim.Mesh(X=2), p, engine="torch")


@pytest.mark.parametrize(("name", "shape", "chip"), [("ddp", {"X": 4}, {"X": 3}), ("zero2", {"X": 2}, {"X": 1}),
                                                     ("fsdp_tp", {"X": 2, "Y": 2}, {"X": 0, "Y": 1})])  # fmt: skip
def test_a_failed_chip_fails_the_step_as_on_numpy_before_any_work(
    name: str, shape: dict[str, int], chip: dict[str, int]
) -> None:
    params = shardsim.models.reference_mlp.init_stack(2, 8, 16, seed=2)
    x = np.random.default_rng(2).standard_normal((8, 8)).astype(np.float32)
    mesh = shardsim.Mesh(shape)
    got = Trainer(name, mesh, params, Adam(lr=0.01), engine="jax")
    numpy = Trainer(name, shardsim.Mesh(shape), params, Adam(lr=0.01))
    for first in (True, False):  # before the program is compiled, and after
        mesh.fail(**chip)
        numpy.mesh.fail(**chip)
        with pytest.raises(shardsim.ChipFailureError):
            numpy.step(x, 0 * x)
        with pytest.raises(shardsim.ChipFailureError, match=r"step \d .*chip \(.*\) has failed.*checkpoint\.load"):
            got.step(x, 0 * x)
        assert got._engine_step._fn is None or not first  # refused before tracing
        mesh.heal()
        numpy.mesh.heal()
        assert got.step_count == numpy.step_count
        a, b = got.step(x, 0 * x), numpy.step(x, 0 * x)  # the fault gone, the step runs as on NumPy
        assert a.step == b.step and a.loss == pytest.approx(b.loss, rel=1e-5)


@dataclasses.dataclass(frozen=True)
class _Signed(SGD):
    """SGD on the gradient's sign: an update of one's own, written once, for both engines."""

    def apply(self, w, g, state, factors):  # type: ignore[no-untyped-def]
        xp = shardsim.activations.namespace(w)
        return w - self.lr * xp.sign(g.astype(w.dtype)), state


def test_both_engines_run_the_optimizers_own_update() -> None:
    """The JAX step has no optimizer arithmetic of its own: an optimizer's ``apply`` is what runs."""
    params = shardsim.models.reference_mlp.init(8, 16, seed=4, dtype="float32")
    x = np.random.default_rng(4).standard_normal((8, 8)).astype(np.float32)
    runs = {}
    for engine in ("jax", "numpy"):
        for opt in (_Signed(lr=0.01), SGD(lr=0.01)):
            t = Trainer("fsdp", shardsim.Mesh(X=4), params, opt, engine=engine)
            t.step(x, 0 * x)
            runs[engine, type(opt).__name__] = t.params_global()
    for k, w in params.items():
        np.testing.assert_allclose(np.abs(runs["jax", "_Signed"][k] - w), 0.01, rtol=1e-5, err_msg=k)  # +-lr each
        np.testing.assert_allclose(runs["jax", "_Signed"][k], runs["numpy", "_Signed"][k], rtol=1e-6, err_msg=k)
        assert not np.allclose(runs["jax", "_Signed"][k], runs["jax", "SGD"][k])


@pytest.mark.parametrize("opt", [SGD(lr=0.1, momentum=0.9, weight_decay=0.01), Adam(lr=0.01), AdamW(lr=0.01)])
def test_apply_on_jax_arrays_is_update_on_numpy_blocks(opt) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(5)
    w, g = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    state = {s: np.abs(rng.standard_normal(64)).astype(np.float32) for s in opt.slots}
    new_w, new_state = opt.apply(
        jax.numpy.asarray(w),
        jax.numpy.asarray(g),
        {s: jax.numpy.asarray(v) for s, v in state.items()},
        jax.numpy.asarray(opt.factors(3), np.float32),
    )
    opt.update(w, g, state, 3)  # in place
    tol = 4 * float(np.finfo(np.float32).eps)
    np.testing.assert_allclose(np.asarray(new_w), w, rtol=tol)
    for s, v in state.items():
        np.testing.assert_allclose(np.asarray(new_state[s]), v, rtol=tol, err_msg=s)
