"""shardsim.testing: check_scheme holds schemes to their references; the strategies draw what they say."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardsim as ss
from shardsim import strategies
from shardsim.strategies import ddp
from shardsim.testing import check_scheme, layouts, meshes, sharded_arrays
from strategies_core import all_chips, assert_blocks

# pp_interleaved's 4 layers in 2 chunks give each chunk 2 layers: at most 2 stages
NARROW = {"pp_interleaved": {"axis_sizes": (1, 2)}}


@pytest.mark.parametrize("name", strategies.names())
def test_every_registered_scheme_passes(name: str) -> None:
    runs = check_scheme(name, examples=3, **NARROW.get(name, {}))
    assert len(runs) == 3 and all(r.ok for r in runs)
    for r in runs:  # each run was held to every gradient the reference gives
        assert {c[0] for c in r.checks} >= {"Out", "dIn"}


def test_the_cases_vary_meshes_shapes_activations_and_dtypes() -> None:
    runs = check_scheme("fsdp_tp", examples=10)
    assert len({str(r.result.mesh) for r in runs}) > 2
    assert len({r.inputs["x"].shape for r in runs}) > 2
    assert len({r.inputs["w_in"].shape[1] for r in runs}) > 1  # d_ff
    assert {r.inputs["x"].dtype.name for r in runs} == {"float32", "float64"}
    for r in runs:
        mesh = r.result.mesh
        assert mesh.size <= 8
        b, d = r.inputs["x"].shape
        assert b % (2 * mesh.size) == 0 and d % mesh.size == 0


def _backward_off_by_a_little(ctx, saved, dout, params):
    """DDP's backward with dW_in off by 0.1 %: too small to see by eye, far above any tolerance."""
    dx, grads = ddp.backward(ctx, saved, dout, params)
    return dx, {**grads, "w_in": grads["w_in"] * 1.001}


BROKEN = dataclasses.replace(ddp.SCHEME, name="ddp_broken", backward=_backward_off_by_a_little)


def test_a_broken_scheme_is_caught_with_its_inputs() -> None:
    with pytest.raises(AssertionError) as info:
        check_scheme(BROKEN, examples=5)
    message = str(info.value)
    assert "check_scheme('ddp_broken'): case 0: dW_in differs from the reference" in message
    for words in ("mesh={'X':", "batch=", "d_model=", "d_ff=", "activation=", "dtype=", "seed="):
        assert words in message
    assert "ddp_broken" not in strategies.names()  # a user's scheme need not be registered
    repeat = message.split("repeat it: ", 1)[1]
    again = eval(repeat, {"shardsim": __import__("shardsim.cli"), "scheme": BROKEN})  # the case, alone
    assert not again.ok and [c[0] for c in again.checks if not c[3]] == ["dW_in"]
    check_scheme("ddp", examples=5)  # the same cases pass with the real backward


def test_a_scheme_that_raises_is_reported_with_its_inputs() -> None:
    def forward(ctx, x, params):
        raise ss.DivisibilityError("cannot split F over X")

    with pytest.raises(AssertionError, match=r"raised DivisibilityError: cannot split F.*\n.*narrow the cases") as info:
        check_scheme(dataclasses.replace(ddp.SCHEME, name="ddp_raises", forward=forward), examples=1)
    assert isinstance(info.value.__cause__, ss.DivisibilityError)
    assert "inputs: batch=" in str(info.value)


def test_cases_are_repeatable_and_the_seed_changes_them() -> None:
    meshes_of = lambda seed: [str(r.result.mesh) for r in check_scheme("fsdp_tp", examples=6, seed=seed)]  # noqa: E731
    assert meshes_of(0) == meshes_of(0) != meshes_of(1)


def test_check_scheme_takes_the_schemes_options() -> None:
    runs = check_scheme("pp", examples=2, options={"schedule": "gpipe", "microbatches": 2})
    assert all(r.ok for r in runs)
    with pytest.raises(AssertionError, match="microbatches"):
        check_scheme("pp", examples=1, options={"microbatches": 7})


# -- strategies ------------------------------------------------------------------------------------------
@given(meshes(min_axes=2, max_axes=4, max_size=4, max_chips=32))
def test_meshes_keep_to_their_bounds(mesh: ss.Mesh) -> None:
    assert 2 <= len(mesh.axis_names) <= 4 and max(mesh.shape) <= 4 and mesh.size <= 32
    n = len(mesh.shape)
    assert mesh.axis_names in {("X", "Y", "Z", "W")[:n], ("data", "model", "pipe", "expert")[:n]}


@given(st.data())
def test_layouts_are_legal_and_use_each_axis_once(data) -> None:
    mesh = data.draw(meshes())
    ndim = data.draw(st.integers(1, 5))
    lay = data.draw(layouts(mesh, ndim, partial=True))
    assert lay.rank == ndim and lay.names[:4] == ("B", "D", "F", "L")[:ndim]
    lay.validate(mesh.axis_names)  # no unknown axis, none used twice
    assert set(lay.used_axes()) <= set(mesh.axis_names)


@given(sharded_arrays(ss.Mesh(X=2, Y=3), "[B_YX, D]", dtype=np.float32))
def test_sharded_arrays_on_a_given_mesh_and_layout(x: ss.ShardedArray) -> None:
    assert str(x.layout) == "[B_YX, D]" and x.dtype == np.float32 and x.global_shape[0] % 6 == 0
    assert np.isfinite(x.to_global()).all() and np.abs(x.to_global()).max(initial=0) <= 1000
    assert_blocks(x, x.to_global())  # every chip holds the slice its layout names


@given(sharded_arrays(partial=True, dtype=np.int64))
def test_sharded_arrays_with_partial_sums(x: ss.ShardedArray) -> None:
    """A partial value's blocks differ along its partial axes; the value is their sum."""
    if not x.layout.partial:
        assert_blocks(x, x.to_global())
        return
    reduced = ss.all_reduce(x, x.layout.partial)
    group = [c for c in all_chips(x.mesh) if all(c[a] == 0 for a in x.mesh.axis_names if a not in x.layout.partial)]
    want = sum(x.local(**c) for c in group)  # chip 0's partial-sum group, summed by hand
    np.testing.assert_array_equal(reduced.local(**{a: 0 for a in x.mesh.axis_names}), want)


@given(sharded_arrays(meshes(max_axes=1), ndim=2, elements=st.just(7.0)))
def test_sharded_arrays_take_a_mesh_strategy_and_elements(x: ss.ShardedArray) -> None:
    assert len(x.mesh.axis_names) == 1 and x.layout.rank == 2 and (x.to_global() == 7.0).all()


def test_hypothesis_is_imported_only_when_a_strategy_is_used() -> None:
    code = (
        "import sys, shardsim.testing as t; assert 'hypothesis' not in sys.modules; "
        "t.check_scheme('tp', examples=1); assert 'hypothesis' not in sys.modules; "
        "t.meshes(); assert 'hypothesis' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_registered_scheme_is_repeated_by_its_name(monkeypatch) -> None:
    monkeypatch.setattr(strategies.registry, "_REGISTRY", dict(strategies.registry._REGISTRY))
    strategies.register(BROKEN)
    with pytest.raises(AssertionError, match=r"repeat it: shardsim\.cli\.run_demo\('ddp_broken', batch="):
        check_scheme("ddp_broken", examples=1)
