"""Bad input to the JAX engine: a documented error naming the culprit and the fix, before any tracing."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import shardsim  # noqa: E402
from shardsim import EngineError  # noqa: E402
from shardsim.engines import jax as engine  # noqa: E402
from shardsim.engines.jax import program  # noqa: E402

P = shardsim.models.reference_mlp.init(8, 16)
X = np.ones((8, 8), np.float32)


@pytest.fixture(autouse=True)
def no_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case here must fail before JAX traces anything."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("shard_map was reached: the input was not checked first")

    monkeypatch.setattr(program.jax, "shard_map", refuse)


def test_jax_mesh_axes_not_matching_the_roles() -> None:
    jmesh = jax.make_mesh((2, 4), ("data", "model"), devices=jax.devices()[:8])
    want = r"unknown mesh axis 'X'.*axes=\{'data': 'data', 'model': 'model'\}"
    with pytest.raises(shardsim.MeshAxisError, match=want):
        engine.run_strategy("fsdp_tp", jmesh, P, X, X, axes={"data": "X", "model": "Y"})


def test_jax_mesh_without_an_axis_for_a_role() -> None:
    jmesh = jax.make_mesh((2, 4), ("a", "b"), devices=jax.devices()[:8])
    with pytest.raises(shardsim.MeshAxisError, match="ddp needs a mesh axis for each of its roles"):
        engine.compile("ddp", jmesh, P, X, X)


def test_jax_axis_names_layouts_cannot_spell() -> None:
    jmesh = jax.make_mesh((2,), ("dp_axis",), devices=jax.devices()[:2])
    with pytest.raises(shardsim.MeshAxisError, match=r"JAX mesh's axes \('dp_axis',\).*such as \('X', 'Y'\)"):
        engine.run_strategy("ddp", jmesh, P, X, X)


def test_shapes_that_do_not_divide() -> None:
    x = np.ones((6, 8), np.float32)
    with pytest.raises(shardsim.DivisibilityError, match="dimension B of size 6 does not divide by mesh axes"):
        engine.run_strategy("ddp", shardsim.Mesh(X=4), P, x, x)


def test_unsupported_scheme() -> None:
    with pytest.raises(EngineError, match=r"does not run 'pp' yet \(docs/engines.md.*runs \['ddp'"):
        engine.run_strategy("pp", shardsim.Mesh(Z=2), P, X, X)


def test_unknown_scheme() -> None:
    with pytest.raises(shardsim.ShardingError, match="unknown scheme 'fdsp'"):
        engine.compile("fdsp", shardsim.Mesh(X=2), P, X, X)


def test_too_few_devices() -> None:
    with pytest.raises(EngineError, match=r"needs 16 devices and JAX has 8.*device_count=16"):
        engine.run_strategy("ddp", shardsim.Mesh(X=16), P, np.ones((16, 8), np.float32), np.ones((16, 8), np.float32))


def test_not_a_mesh() -> None:
    with pytest.raises(EngineError, match=r"mesh must be a shardsim Mesh or a jax\.sharding\.Mesh, got dict"):
        engine.run_strategy("ddp", {"X": 2}, P, X, X)  # type: ignore[arg-type]


def test_float64_without_x64() -> None:
    was = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    try:
        with pytest.raises(shardsim.DtypeError, match=r"x is float64.*jax_enable_x64"):
            engine.run_strategy("ddp", shardsim.Mesh(X=2), P, X.astype(np.float64), X)
    finally:
        jax.config.update("jax_enable_x64", was)


def test_a_jax_mesh_with_one_device_twice() -> None:
    d = jax.devices()
    jmesh = jax.sharding.Mesh(np.array([[d[0], d[1]], [d[2], d[0]]]), ("X", "Y"))
    want = r"holds device .* twice \(at \(0, 0\) and \(1, 1\)\).*jax\.make_mesh\(\(2, 2\)"
    with pytest.raises(EngineError, match=want):
        engine.run_strategy("ddp", jmesh, P, X, X, axes={"data": "X"})


def test_a_jax_partition_spec_is_a_layout() -> None:
    from jax.sharding import PartitionSpec

    mesh = shardsim.Mesh(X=2, Y=4)
    a = np.arange(32.0).reshape(8, 4)
    x = shardsim.shard(a, mesh, PartitionSpec("X"))  # short, as JAX reads it: D unsplit
    assert str(x.layout) == "[d0_X, d1]" and np.array_equal(x.local(X=1, Y=3), a[4:])
    y = shardsim.reshard(shardsim.shard(a, mesh, "[B, D]"), PartitionSpec(None, "Y"))
    assert str(y.layout) == "[B, D_Y]" and np.array_equal(y.local(X=0, Y=2), a[:, 2:3])
    assert shardsim.Layout.parse(PartitionSpec(("X", "Y"), None), mesh.axis_names) == shardsim.Layout.parse("d0_XY d1")
