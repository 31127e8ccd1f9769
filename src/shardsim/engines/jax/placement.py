"""Where a program's values live on JAX devices: the meshes and the shardings.

A shardsim :class:`~shardsim.Mesh` is placed on the first ``mesh.size`` devices with
``jax.make_mesh``; a ``jax.sharding.Mesh`` is read as the shardsim mesh of the same axis
names and sizes. Shardings are ``NamedSharding(mesh, spec)`` with ``spec`` from
:func:`shardsim.specs.to_partition_spec`, the one Layout ↔ PartitionSpec mapping.

>>> import shardsim
>>> jmesh, smesh = meshes(shardsim.Mesh(X=2))
>>> dict(jmesh.shape), smesh
({'X': 2}, Mesh(X=2))
>>> tuple(sharding(jmesh, "[B_X, D]").spec)
('X', None)
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from ...errors import DtypeError, EngineError, MeshAxisError
from ...layout import Layout
from ...mesh import Mesh
from ...specs import to_partition_spec

DEVICES_HINT = (
    "set XLA_FLAGS=--xla_force_host_platform_device_count={n} before JAX is imported to get {n} CPU devices, "
    "run on more accelerators, or use a smaller mesh"
)


def meshes(mesh: Mesh | jax.sharding.Mesh) -> tuple[jax.sharding.Mesh, Mesh]:
    """The JAX mesh a program runs on and the shardsim mesh its front end reasons about.

    Raises :class:`~shardsim.EngineError` when there are too few devices, and
    :class:`~shardsim.MeshAxisError` for JAX axis names shardsim's layouts cannot spell.
    """
    if isinstance(mesh, Mesh):
        devices = jax.devices()
        if mesh.size > len(devices):
            raise EngineError(
                f"{mesh} needs {mesh.size} devices and JAX has {len(devices)} ({devices[0].platform}); "
                + DEVICES_HINT.format(n=mesh.size)
            )
        return jax.make_mesh(mesh.shape, mesh.axis_names, devices=devices[: mesh.size]), mesh
    if isinstance(mesh, jax.sharding.Mesh):
        check_distinct_devices(mesh)
        sizes = dict(zip(mesh.axis_names, mesh.devices.shape))
        try:
            return mesh, Mesh({str(a): int(n) for a, n in sizes.items()})
        except MeshAxisError as e:
            raise MeshAxisError(
                f"the JAX mesh's axes {tuple(mesh.axis_names)} cannot name layout splits: {e}. "
                "Build it with axis names such as ('X', 'Y')"
            ) from None
    raise EngineError(
        f"mesh must be a shardsim Mesh or a jax.sharding.Mesh, got {type(mesh).__name__}; "
        "e.g. shardsim.Mesh(X=2, Y=4) or jax.make_mesh((2, 4), ('X', 'Y'))"
    )


def check_distinct_devices(mesh: jax.sharding.Mesh) -> None:
    """Refuse a JAX mesh that names one device at two places: XLA would fail mid-run counting its shards."""
    seen: dict[Any, tuple[int, ...]] = {}
    for where, device in np.ndenumerate(mesh.devices):
        if device in seen:
            raise EngineError(
                f"the JAX mesh {dict(mesh.shape)} holds device {device} twice (at {seen[device]} and {where}); "
                "each place of a mesh is its own device: build it from distinct devices, e.g. "
                f"jax.make_mesh({tuple(mesh.devices.shape)}, {tuple(mesh.axis_names)}), or pass a shardsim Mesh"
            )
        seen[device] = where


def sharding(mesh: jax.sharding.Mesh, layout: Layout | str) -> NamedSharding:
    """The ``NamedSharding`` of a layout on a JAX mesh."""
    return NamedSharding(mesh, to_partition_spec(layout))


def put(value: Any, where: NamedSharding) -> Any:
    """A global ``jax.Array`` of ``value`` laid out as ``where`` says; each process places its own devices' blocks,
    so it works across hosts (``jax.distributed``) as on one."""
    a = np.asarray(value)
    return jax.make_array_from_callback(a.shape, where, lambda index: a[index])


def fetch(array: Any) -> np.ndarray:
    """A global ``jax.Array`` as one NumPy array on this host (gathered from the other processes if need be)."""
    if array.is_fully_addressable:
        return np.asarray(array)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def check_dtype(what: str, value: Any) -> np.dtype:
    """The dtype of an input, refused when JAX would silently narrow it (float64 without x64)."""
    dtype = np.dtype(getattr(value, "dtype", np.asarray(value).dtype))
    if dtype.itemsize == 8 and not jax.config.jax_enable_x64:  # type: ignore[attr-defined]
        raise DtypeError(
            f"{what} is {dtype} and JAX runs 64-bit types as 32-bit unless told otherwise; call "
            "jax.config.update('jax_enable_x64', True) before building arrays, or pass float32 data"
        )
    return dtype


def id_dtype(dtype: Any) -> np.dtype:
    """Token ids' dtype on JAX: their own, int32 for 64-bit ids when JAX runs without 64-bit types
    (ids below the vocabulary, which the front end checks, fit).

    >>> id_dtype(np.dtype("int32"))
    dtype('int32')
    """
    dtype = np.dtype(dtype)
    wide = dtype.itemsize == 8 and not jax.config.jax_enable_x64  # type: ignore[attr-defined]
    return np.dtype(np.int32) if wide else dtype
