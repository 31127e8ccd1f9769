"""The JAX engine computes what the stacked NumPy engine computes, and traces the same program.

For every scheme the JAX engine supports, on random 1-D and 2-D meshes of 8 fake CPU
devices, shapes, activations and float32/float64: output and gradients equal the NumPy
engine's within the dtype's tolerance, and the trace, the layouts, the stored activations
and the per-chip memory ledger are the same.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from engine_cases import Case, cases  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import shardsim  # noqa: E402
from fuzz_budget import budget  # noqa: E402
from shardsim.dtypes import tolerance  # noqa: E402
from shardsim.engines import jax as engine  # noqa: E402


def run_both(case: Case, jax_mesh: bool) -> tuple[shardsim.strategies.StrategyResult, ...]:
    mesh = case.mesh()
    where = jax.make_mesh(mesh.shape, mesh.axis_names, devices=jax.devices()[: mesh.size]) if jax_mesh else mesh
    got = engine.run_strategy(
        case.scheme, where, case.params, case.x, case.dout, activation=case.activation, axes=case.axes
    )
    want = shardsim.run_strategy(
        case.scheme, case.mesh(), case.params, case.x, case.dout, activation=case.activation, axes=case.axes
    )
    return got, want


@budget(16)
@given(case=cases(), jax_mesh=st.booleans())
def test_jax_engine_equals_numpy_engine(case: Case, jax_mesh: bool) -> None:
    got, want = run_both(case, jax_mesh)
    tol = tolerance(case.dtype, max(case.x.shape + case.params["w_in"].shape)) * 8
    pairs = [("out", got.out, want.out), *((k, got.grads[k], want.grads[k]) for k in want.grads)]
    assert sorted(got.grads) == sorted(want.grads)
    for key, a, b in pairs:
        assert a.dtype == b.dtype and a.shape == b.shape, key
        scale = float(np.abs(b).max()) or 1.0
        assert float(np.abs(a - b).max()) <= tol * scale, f"{case.scheme} {key}"
    assert got.trace.collectives() == want.trace.collectives()
    assert [(e.op, e.axes, e.phase, e.sent_bytes, e.flops) for e in got.trace.events] == [
        (e.op, e.axes, e.phase, e.sent_bytes, e.flops) for e in want.trace.events
    ]
    assert got.layouts == want.layouts and got.activations == want.activations
    assert sorted(got.memory) == sorted(want.memory)
    for c in want.memory:
        np.testing.assert_array_equal(got.memory[c], want.memory[c], err_msg=c)


def test_result_is_the_reference_mlp() -> None:
    """Independently of the NumPy engine: the single-device MLP's output and gradients."""
    p = shardsim.models.reference_mlp.init(8, 16, seed=3, dtype="float64")
    rng = np.random.default_rng(3)
    x, dout = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    r = engine.run_strategy("fsdp_tp", shardsim.Mesh(X=4, Y=2), p, x, dout, activation="gelu")
    np.testing.assert_allclose(r.out, shardsim.models.reference_mlp.forward(p, x, "gelu"), rtol=1e-12, atol=1e-12)
    for k, v in shardsim.models.reference_mlp.backward(p, x, dout, "gelu").items():
        np.testing.assert_allclose(r.grads[k], v, rtol=1e-12, atol=1e-12, err_msg=k)
