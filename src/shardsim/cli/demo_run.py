"""A scheme's demo: the toy MLP case run forward and backward and held to the scheme's reference.

What ``shardsim demo`` shows, :func:`shardsim.testing.check_scheme` draws cases of, and the
support matrix runs: :func:`run_demo` gives the scheme its own ``init`` weights and normal
inputs on a small mesh (one axis of 2 chips per role, :func:`default_mesh`), runs it on the
NumPy (or JAX) engine, and compares the output and every gradient with the scheme's
``reference`` within a few ulps times the square root of the longest contraction. With
``check_memory`` it first refuses a run the host cannot hold (:func:`demo_need`, read from a
shape-only run's ledger). :func:`mesh_for` lays a number of chips out over a scheme's roles.

>>> run = run_demo("ddp")
>>> run.ok, str(run.result.mesh), [name for name, *_ in run.checks]
(True, 'Mesh(X=2)', ['Out', 'dIn', 'dW_in', 'dW_out'])
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..array import ShapeDtype
from ..dtypes import resolve_dtype, tolerance
from ..errors import ShardsimError
from ..host import check_host_memory
from ..mesh import Mesh
from ..strategies.base import ROLE_DEFAULTS, Scheme
from ..strategies.registry import get
from ..strategies.runner import StrategyResult
from ..strategies.runner import run as run_scheme

#: The seed's toy sizes: X is 2×4 (B = 2 tokens, d_model = 4) and d_ff = 8.
SEED_SIZES = {"batch": 2, "d_model": 4, "d_ff": 8}


@dataclass
class DemoRun:
    """One scheme's demo: the run, the inputs it was given and the check against the reference.

    ``checks`` holds ``(value, max abs error, tolerance, ok)`` for the output and each gradient;
    ``ok`` is whether every one is within its tolerance.

    >>> run = run_demo("fsdp")
    >>> run.ok, sorted(run.inputs)
    (True, ['dout', 'w_in', 'w_out', 'x'])
    """

    scheme: Scheme
    result: StrategyResult
    inputs: dict[str, np.ndarray]  # x, dout and every parameter, global
    checks: list[tuple[str, float, float, bool]]  # (name, max abs error, tolerance, ok)

    @property
    def ok(self) -> bool:
        return all(ok for *_, ok in self.checks)


def default_mesh(scheme: Scheme, chips: int = 2) -> tuple[Mesh, dict[str, str]]:
    """The demo's mesh for ``scheme``: one axis of ``chips`` chips per role.

    A role's axis is the scaling book's letter (``data`` → X, ``model`` → Y) or, for other
    roles, the role's first letter in capitals.

    >>> default_mesh(get("fsdp_tp"))
    (Mesh(X=2, Y=2), {'data': 'X', 'model': 'Y'})
    """
    axes: dict[str, str] = {}
    for role in scheme.roles:
        name = ROLE_DEFAULTS.get(role, "".join(c for c in role if c.isalnum())[:1].upper() or "A")
        base, i = name, 2
        while name in axes.values():
            name, i = f"{base}{i}", i + 1
        axes[role] = name
    return Mesh({a: chips for a in axes.values()}), axes


def demo_mesh(
    scheme: Scheme, mesh: Mapping[str, int] | None, axes: Mapping[str, str] | None
) -> tuple[Mesh, dict[str, str] | None]:
    """The mesh a demo runs on and the axes of its roles: ``mesh`` as given, or one axis of 2
    chips per role, named as ``axes`` asks.

    >>> demo_mesh(get("ddp"), None, {"data": "D"})
    (Mesh(D=2), {'data': 'D'})
    """
    if axes is not None:  # the roles this scheme has (one --axes may serve several schemes)
        axes = {role: axis for role, axis in axes.items() if role in scheme.roles} or None
    if mesh is not None:
        return Mesh(dict(mesh)), axes
    the_mesh, chosen = default_mesh(scheme)
    if axes is not None:  # name the default mesh's axes as asked
        chosen.update(axes)
        the_mesh = Mesh({axis: 2 for axis in chosen.values()})
    return the_mesh, chosen


def shape_only_run(
    name: str | Scheme,
    mesh: Mesh,
    params: Mapping[str, Any],
    batch: int,
    d_model: int,
    dtype: Any,
    *,
    axes: Mapping[str, str] | None = None,
    activation: str = "identity",
    options: Mapping[str, Any] | None = None,
) -> StrategyResult:
    """The demo's run without data (:class:`~shardsim.ShapeDtype` values) on a fresh copy of
    ``mesh``: its trace and each chip's ledger, in milliseconds and no bytes.

    >>> r = shape_only_run("ddp", Mesh(X=2), {"w_in": ShapeDtype((4, 8)), "w_out": ShapeDtype((8, 4))}, 2, 4, "float32")
    >>> r.out is None, int(r.memory["total"].max()) > 0
    (True, True)
    """
    fresh = Mesh(dict(zip(mesh.axis_names, mesh.shape)))
    shapes = {k: ShapeDtype(np.shape(v), getattr(v, "dtype", dtype)) for k, v in params.items()}
    x = ShapeDtype((batch, d_model), dtype)
    scheme = name if isinstance(name, Scheme) else get(name)  # a user's scheme too
    return run_scheme(scheme, fresh, shapes, x, x, activation=activation, axes=axes, **dict(options or {}))


def default_batch(
    name: str | Scheme, mesh: Mesh, params: Mapping[str, Any], d_model: int, dtype: Any, **kw: Any
) -> int:
    """The seed's 2 tokens, or the smallest power of two above it the scheme can lay out on
    ``mesh`` (``dp_ep`` splits its tokens over X and Y: 4 on the default 2×2 mesh).

    >>> default_batch("ddp", Mesh(X=2), {"w_in": np.zeros((4, 8)), "w_out": np.zeros((8, 4))}, 4, "float32")
    2
    >>> default_batch("ddp", Mesh(X=8), {"w_in": np.zeros((4, 8)), "w_out": np.zeros((8, 4))}, 4, "float32")
    8
    """
    batch = SEED_SIZES["batch"]
    for _ in range(12):
        try:
            shape_only_run(name, mesh, params, batch, d_model, dtype, **kw)
            return batch
        except ShardsimError:
            batch *= 2
    return SEED_SIZES["batch"]  # none lays out: the real run says why


def demo_need(result: StrategyResult, params: Mapping[str, Any], batch: int, d_model: int) -> int:
    """Host bytes a demo needs: every chip's peak from the shape-only run's ledger, plus one
    float64 copy of the global values (In, dOut, H and the weights) for the single-device
    reference and the check: a bound from above (for ddp at B = 4M tokens it says 1.0 GiB; the
    process's peak resident memory was 0.79 GiB).

    >>> params = {"w_in": np.zeros((4, 8)), "w_out": np.zeros((8, 4))}
    >>> r = shape_only_run("ddp", Mesh(X=2), params, 2, 4, "float32")
    >>> demo_need(r, params, 2, 4) > (2 * 2 * 4 + 2 * 8 + 64) * 8
    True
    """
    chips = int(result.memory["total"].sum())
    d_ff = max((np.shape(v)[-1] for v in params.values()), default=0)
    weights = sum(int(np.prod(np.shape(v))) for v in params.values())
    host = (2 * batch * d_model + batch * d_ff + weights) * 8
    return chips + host


def run_demo(
    name: str | Scheme,
    *,
    batch: int | None = None,
    d_model: int = SEED_SIZES["d_model"],
    d_ff: int = SEED_SIZES["d_ff"],
    mesh: Mapping[str, int] | None = None,
    axes: Mapping[str, str] | None = None,
    activation: str = "identity",
    dtype: str = "float32",
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
    check_memory: bool = False,
    engine: str = "numpy",
) -> DemoRun:
    """Run scheme ``name`` forward and backward on the toy case and check it against its reference.

    The parameters come from the scheme's own ``init``, the expected values from its own
    ``reference``; ``x`` and ``dout`` are ``[batch, d_model]`` normal draws (``batch``
    defaults to :func:`default_batch`). Without ``mesh``, each of the scheme's roles gets its
    own axis of 2 chips. With ``check_memory``, a run the host has no memory for is refused
    (:class:`~shardsim.CommandLineError`) before anything big is allocated. ``engine="jax"``
    runs it on JAX devices (:mod:`shardsim.engines.jax`).

    >>> r = run_demo("tp")
    >>> r.ok, r.result.layouts["x"], str(r.result.mesh)
    (True, '[B, D_Y]', 'Mesh(Y=2)')
    """
    scheme = name if isinstance(name, Scheme) else get(name)  # a user's scheme too
    dt = resolve_dtype(dtype)
    the_mesh, axes = demo_mesh(scheme, mesh, axes)
    opts = dict(options or {})
    kw: dict[str, Any] = dict(axes=axes, activation=activation, options=opts)
    sizes = ",".join(f"{a}={n}" for a, n in zip(the_mesh.axis_names, the_mesh.shape))
    too_big = (
        f"use smaller --batch/--d-model/--d-ff, or see its bytes and time shape-only: shardsim estimate "
        f"--scheme {name} --mesh {sizes} --batch {batch or SEED_SIZES['batch']} --d-model {d_model} --d-ff {d_ff}"
    )
    if check_memory:  # the host holds at least In, dOut, W_in and W_out: check them before init allocates
        least = (2 * d_model * d_ff + 2 * (batch or 0) * d_model) * np.dtype(dt).itemsize
        check_host_memory(least, f"{name} on {the_mesh}", too_big)
    params = scheme.init(d_model, d_ff, seed=seed, dtype=dtype)
    if batch is None:
        batch = default_batch(scheme, the_mesh, params, d_model, dt, **kw)
    if check_memory:
        need = demo_need(shape_only_run(scheme, the_mesh, params, batch, d_model, dt, **kw), params, batch, d_model)
        check_host_memory(need, f"{name} on {the_mesh} with B={batch}", too_big)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((batch, d_model)).astype(dt)
    dout = rng.standard_normal((batch, d_model)).astype(dt)
    if engine == "jax":
        result = _jax_engine(the_mesh).run_strategy(
            scheme.name, the_mesh, params, x, dout, activation=activation, axes=axes, options=opts
        )
    else:
        result = run_scheme(scheme, the_mesh, params, x, dout, activation=activation, axes=axes, **opts)
    want_out, want_grads = scheme.reference(params, x, dout, activation, **opts)
    contraction = max(batch, d_model, d_ff)
    checks = [_check("Out", result.out, want_out, dtype, contraction)]
    for k, expected in want_grads.items():
        got = None if result.grads is None else result.grads.get(k)
        checks.append(_check(grad_name(k), got, expected, dtype, contraction))
    return DemoRun(scheme, result, {"x": x, "dout": dout, **params}, checks)


def _jax_engine(mesh: Mesh) -> Any:
    """The JAX engine; on CPU, first asks XLA for as many (fake) devices as the mesh has chips."""
    if "jax" not in sys.modules:  # XLA reads the flag when JAX is first imported
        os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={max(mesh.size, 8)}")
    from ..engines import jax as engine

    return engine


def grad_name(key: str) -> str:
    """The seed's name of a gradient: ``x`` → ``dIn``, ``w_in`` → ``dW_in``.

    >>> grad_name("x"), grad_name("w_out")
    ('dIn', 'dW_out')
    """
    return "dIn" if key == "x" else "d" + key[:1].upper() + key[1:]


def _check(
    name: str, got: np.ndarray | None, want: np.ndarray, dtype: str, contraction: int
) -> tuple[str, float, float, bool]:
    """Max abs error of ``got`` against ``want``, its tolerance (a few ulps × √contraction, × 4
    for two chained matmuls, relative to the largest expected value) and whether it is within."""
    want = np.asarray(want, np.float64)
    scale = float(np.abs(want).max()) if want.size else 1.0
    tol = 4 * tolerance(dtype, contraction) * (scale or 1.0)
    if got is None or np.shape(got) != want.shape:
        return name, float("inf"), tol, False
    err = float(np.abs(np.asarray(got, np.float64) - want).max()) if want.size else 0.0
    return name, err, tol, bool(err <= tol)


def mesh_for(name: str, chips: int) -> Mesh:
    """The mesh a scheme trains on: one axis per role (X data, Y model or expert, Z pipe), the chips
    split over them as evenly as they go.

    >>> mesh_for("fsdp_tp", 8), mesh_for("tp", 4), mesh_for("pp", 2), mesh_for("dp_pp_tp", 8)
    (Mesh(X=2, Y=4), Mesh(Y=4), Mesh(Z=2), Mesh(X=2, Y=2, Z=2))
    """
    roles = get(name).roles
    axes = [ROLE_DEFAULTS[r] for r in roles]
    if len(roles) == 1:
        return Mesh({axes[0]: chips})
    if len(roles) == 2:
        x = max(d for d in range(1, math.isqrt(chips) + 1) if chips % d == 0)
        return Mesh({axes[0]: x, axes[1]: chips // x})
    sizes = [1] * len(roles)  # the prime factors dealt out, the largest to the smallest axis
    n, p = chips, 2
    factors = []
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    for f in sorted(factors, reverse=True):
        sizes[sizes.index(min(sizes))] *= f
    return Mesh(dict(zip(axes, sizes)))


__all__ = [
    "SEED_SIZES",
    "DemoRun",
    "default_batch",
    "default_mesh",
    "demo_mesh",
    "demo_need",
    "grad_name",
    "mesh_for",
    "run_demo",
    "shape_only_run",
]
