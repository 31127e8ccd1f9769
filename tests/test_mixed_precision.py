"""Mixed precision: 16-bit weights, activations and gradients; float32 master weights and moments.

Documented tolerance: each block rounds its weights, inputs and matmul outputs to 16 bits, a
relative perturbation of about one machine epsilon per block. So a 16-bit run's loss stays
within ``L * eps(dtype)`` (relative) of the float32 run's, and with SGD its total weight update
within ``2 L * eps(dtype)`` of the float32 update (relative to the largest update).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardsim as ss
from shardsim import mlp
from shardsim.dtypes import eps, resolve_dtype
from shardsim.training import SGD, Adam, Precision, Trainer
from training_reference import Opt, train

L, B, D, F = 2, 16, 32, 64
CASES = [
    ("ddp", {"X": 4}),
    ("zero1", {"X": 4}),
    ("zero2", {"X": 4}),
    ("zero3", {"X": 4}),
    ("tp", {"Y": 4}),
    ("fsdp_tp", {"X": 2, "Y": 2}),
]


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    params = mlp.init_stack(L, D, F, seed=seed)
    return params, rng.standard_normal((B, D)).astype(np.float32), rng.standard_normal((B, D)).astype(np.float32)


def run(name, sizes, precision, optimizer, steps=5, **kw):
    params, x, y = data()
    t = Trainer(name, ss.Mesh(sizes), params, optimizer, activation="gelu", precision=precision, **kw)
    return t, [t.step(x, y) for _ in range(steps)]


@pytest.mark.parametrize("precision,dtype", [("bf16", "bfloat16"), (Precision.of("fp16", loss_scale=256.0), "float16")])
@pytest.mark.parametrize("optimizer", [SGD(lr=0.1, momentum=0.9), Adam(lr=1e-3)], ids=["momentum", "adam"])
@pytest.mark.parametrize("name,sizes", CASES)
def test_16_bit_training_tracks_float32(name, sizes, optimizer, precision, dtype) -> None:
    _, full = run(name, sizes, "fp32", optimizer)
    _, half = run(name, sizes, precision, optimizer)
    losses = np.array([r.loss for r in full])
    np.testing.assert_allclose([r.loss for r in half], losses, rtol=L * eps(dtype), atol=0)


@pytest.mark.parametrize("name,sizes", CASES)
def test_sgd_weight_updates_track_float32(name, sizes) -> None:
    w0, _, _ = data()
    opt = SGD(lr=0.1, momentum=0.9)
    full, _ = run(name, sizes, "fp32", opt)
    half, _ = run(name, sizes, "bf16", opt)
    for k, w in full.params_global().items():
        update = w - w0[k]
        err = np.abs(half.params_global()[k] - w)
        assert err.max() <= 2 * L * eps("bfloat16") * np.abs(update).max(), k


@pytest.mark.parametrize("name,sizes", CASES)
def test_the_optimizer_updates_float32_masters(name, sizes) -> None:
    t, _ = run(name, sizes, "bf16", Adam(lr=1e-3), steps=2)
    for i in range(L):
        for k in ("w_in", "w_out"):
            master, weights = t.master[i][k], t.params[i][k]
            assert master.dtype == np.float32 and master.category == "optimizer"
            assert weights.dtype == resolve_dtype("bfloat16") and weights.category == "params"
            for m in t.moments[i][k].values():
                assert m.dtype == np.float32
    masters, weights = t.params_global(), t.weights()
    for k in masters:  # the 16-bit weights are the masters rounded, bit for bit
        assert masters[k].dtype == np.float32
        np.testing.assert_array_equal(weights[k], masters[k].astype(weights[k].dtype))


def test_small_updates_accumulate_in_the_masters() -> None:
    """Each update is below half a bfloat16 ulp of its weight: 16-bit weights alone would never
    move, the float32 masters take every step (and follow the float32 run)."""
    w0, x, y = data()
    lr, steps = 1e-4, 4
    t = Trainer("zero2", ss.Mesh(X=4), w0, SGD(lr=lr), activation="gelu", precision="bf16")
    for _ in range(steps):
        t.step(x, y)
    ref, _ = train(w0, x, y, Opt("sgd", lr=lr), steps, activation="gelu")
    first, _ = train(w0, x, y, Opt("sgd", lr=lr), 1, activation="gelu")
    bf16 = resolve_dtype("bfloat16")
    masters = t.params_global()
    for k in w0:
        start = w0[k].astype(bf16)
        lost = (start.astype(np.float64) + (first[k] - w0[k])).astype(bf16) == start
        assert lost.mean() > 0.95, "most single updates are below half a bfloat16 ulp"
        moved, want = masters[k] - w0[k], ref[k] - w0[k]
        assert (moved != 0).mean() > 0.99
        assert np.abs(moved - want).max() <= 2 * L * eps("bfloat16") * np.abs(want).max()


def test_reduce_in_float32() -> None:
    """reduce_dtype=float32: the gradients cross the wire in 4 bytes and stay float32."""
    psi, n = L * 2 * D * F, 4
    _, (half,) = run("ddp", {"X": n}, "bf16", Adam(), steps=1)
    _, (wide,) = run("ddp", {"X": n}, "bf16", Adam(), steps=1, reduce_dtype="float32")
    assert half.trace.total("sent_bytes", phase="backward") == 2 * psi * 2 * (n - 1) // n
    assert wide.trace.total("sent_bytes", phase="backward") == 2 * psi * 4 * (n - 1) // n
    assert (half.model_state["grads"] == 2 * psi).all() and (wide.model_state["grads"] == 4 * psi).all()
    assert all(e.dtype == "float32" for e in wide.trace if e.is_collective)
    assert wide.loss == half.loss  # the forward pass is the same
    _, full = run("zero2", {"X": n}, "fp32", Adam(), steps=3)
    _, z2 = run("zero2", {"X": n}, "bf16", Adam(), steps=3, reduce_dtype="float32")
    np.testing.assert_allclose([r.loss for r in z2], [r.loss for r in full], rtol=L * eps("bfloat16"))


def test_reduce_dtype_needs_a_data_parallel_axis() -> None:
    params, _, _ = data()
    with pytest.raises(ss.ShardingError, match="tp reduces no gradients over a data-parallel axis"):
        Trainer("tp", ss.Mesh(Y=2), params, precision="bf16", reduce_dtype="float32")


# -- dtypes a precision refuses ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "field", "dtype"),
    [
        (lambda: Precision("int8"), "compute", "int8"),
        (lambda: Precision("complex64"), "compute", "complex64"),
        (lambda: Precision("float32", reduce="complex64"), "reduce", "complex64"),
        (lambda: Precision("bfloat16", "int32"), "master", "int32"),
        (lambda: Precision("float32", moments="bool"), "moments", "bool"),
        (lambda: Precision.of("fp32", reduce="int8"), "reduce", "int8"),
    ],
)
def test_a_non_float_precision_dtype_is_a_dtype_error_naming_its_field(make, field, dtype) -> None:
    with pytest.raises(ss.DtypeError) as e:
        make()
    message = str(e.value)
    assert f"Precision {field}={dtype!r} is not a floating-point dtype" in message
    assert "['float16', 'bfloat16', 'float32', 'float64']" in message and f"{field}='float32'" in message


@given(st.sampled_from(sorted({np.dtype(c).name for c in np.typecodes["All"] if c not in "OSUVMm"} | {"bfloat16"})))
@settings(max_examples=40, deadline=None, derandomize=True)
def test_a_precision_takes_exactly_the_float_dtypes(name: str) -> None:
    floats = {"float16", "bfloat16", "float32", "float64"}
    if name in floats:
        assert Precision("float32", reduce=name).reduce.name == name
    else:
        with pytest.raises(ss.DtypeError, match="is not a floating-point dtype"):
            Precision("float32", reduce=name)
