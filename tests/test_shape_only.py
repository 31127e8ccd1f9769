"""Shape-only values: the same program gives the same layouts, trace and ledger as on data.

Each program here is written once against a ``make(shape, layout)`` function and run twice:
with random data and with :class:`shardsim.ShapeDtype`. Everything but the numbers must match.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardsim
from shardsim import Mesh, ShapeDtype, ShapeOnlyError
from strategies_core import MatmulCase, legal_matmuls

Make = Callable[..., shardsim.ShardedArray]
Program = Callable[[Make, Mesh], list[shardsim.ShardedArray]]


def _maker(mesh: Mesh, with_data: bool, dtype: str = "float32") -> Make:
    rng = np.random.default_rng(0)
    dt = shardsim.dtypes.resolve_dtype(dtype)

    def make(shape: tuple[int, ...], layout: str, **kw: object) -> shardsim.ShardedArray:
        value = rng.standard_normal(shape).astype(dt) if with_data else ShapeDtype(shape, dt)
        return shardsim.shard(value, mesh, layout, **kw)  # type: ignore[arg-type]

    return make


def _run(program: Program, mesh_axes: dict[str, int], **kw: object) -> list[tuple]:
    """Run ``program`` on data and shape-only; return (outputs, events, ledger) for each."""
    out = []
    for with_data in (True, False):
        mesh = Mesh(mesh_axes)
        with shardsim.trace() as t:
            values = program(_maker(mesh, with_data, **kw), mesh)  # type: ignore[arg-type]
        events = [dataclasses.replace(e, inputs=(), output=0) for e in t.events]  # value ids differ
        described = [(v.layout, v.global_shape, v.local_shape, v.dtype, v.category, v.label) for v in values]
        assert all(v.is_shape_only is not with_data for v in values)
        ledger = {k: {c: a.tolist() for c, a in v.items()} for k, v in mesh.memory.snapshot().items()}
        del values
        gc.collect()
        out.append((described, events, ledger, mesh.memory.live().tolist()))
    return out


def _assert_same(program: Program, mesh_axes: dict[str, int], **kw: object) -> None:
    data, shape_only = _run(program, mesh_axes, **kw)
    assert data[0] == shape_only[0]  # layouts, shapes, dtypes, categories, labels
    assert data[1] == shape_only[1]  # every trace event: op, axes, bytes, flops, phase, layouts
    assert data[2] == shape_only[2]  # ledger: live and peak per chip and category
    assert data[3] == shape_only[3]  # and what is left after the values die


def fsdp_tp_step(make: Make, mesh: Mesh, b: int = 8, d: int = 16, f: int = 32) -> list[shardsim.ShardedArray]:
    """One MLP layer, 2-D FSDP (X) + TP (Y), forward and backward, as the scaling book lists it."""
    x = make((b, d), "B_X D_Y", label="In")
    w_in = make((d, f), "D_X F_Y", label="W_in", category="params")
    w_out = make((f, d), "F_Y D_X", label="W_out", category="params")
    with shardsim.phase("forward"):
        xf = shardsim.all_gather(x, "Y")  # [B_X, D]
        h = xf @ shardsim.all_gather(w_in, "X")  # [B_X, F_Y]
        out = shardsim.reduce_scatter(h @ shardsim.all_gather(w_out, "X"), "Y", "D")  # [B_X, D_Y]
    with shardsim.phase("backward"):
        dout = shardsim.all_gather(make((b, d), "B_X D_Y", label="dOut"), "Y")  # [B_X, D]
        dw_out = shardsim.reduce_scatter(h.T @ dout, "X", "D").as_category("grads")  # [F_Y, D_X]
        dh = dout @ shardsim.all_gather(w_out, "X").T  # [B_X, F_Y]
        dw_in = shardsim.reduce_scatter(xf.T @ dh, "X", "D").as_category("grads")  # [D_X, F_Y]
        dx = shardsim.reduce_scatter(dh @ shardsim.all_gather(w_in, "X").T, "Y", "D")  # [B_X, D_Y]
    return [out, dw_out, dw_in, dx, w_in, w_out]


def test_fsdp_tp_step_same_on_data_and_shape_only() -> None:
    _assert_same(fsdp_tp_step, {"X": 2, "Y": 2})
    _assert_same(fsdp_tp_step, {"X": 2, "Y": 4}, dtype="bfloat16")


def every_op(make: Make, mesh: Mesh) -> list[shardsim.ShardedArray]:
    """Every op and collective at least once, on Mesh(X, Y, Z)."""
    x = make((8, 16), "B_X D_Y", label="x")
    w = make((16, 8), "D_Y F_Z", label="w", category="params")
    p = x @ w  # [B_X, F_Z]{U_Y}
    ar = shardsim.all_reduce(p, "Y")
    rs = shardsim.reduce_scatter(x @ w, "Y", "B")  # [B_XY, F_Z]
    ag = shardsim.all_gather(rs, ("X", "Y"))  # [B, F_Z]
    a2a = shardsim.all_to_all(ag, "Z", "F", "B")  # [B_Z, F]
    pp = shardsim.ppermute(a2a, "Z", 1)
    pp2 = shardsim.ppermute(rs, "Y", perm=[(0, 1), (1, 0)])
    act = shardsim.activation(ar, "gelu")
    grad = shardsim.activation_grad(ar, "relu")
    ew = ((act * grad + act - 1.0) / 2.0) * 3.0
    pt = p.T  # a partial, transposed
    s = shardsim.all_reduce(x.sum("D"), "Y")  # [B_X]
    c = shardsim.cast(ar, "float16", category="temporaries")
    q = shardsim.all_reduce(p * make((8, 8), "B_X F_Z"), "Y")  # a partial scaled by a non-partial
    return [p, ar, rs, ag, a2a, pp, pp2, act, grad, ew, pt, s, c, q]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_op_same_on_data_and_shape_only(dtype: str) -> None:
    _assert_same(every_op, {"X": 2, "Y": 2, "Z": 2}, dtype=dtype)


@given(legal_matmuls(batch=True), st.booleans())
def test_random_matmuls_same_on_data_and_shape_only(c: MatmulCase, scatter: bool) -> None:
    def program(make: Make, mesh: Mesh) -> list[shardsim.ShardedArray]:
        p = make(c.a.shape, str(c.la)) @ make(c.b.shape, str(c.lb))
        if not c.k_axes:
            return [p]
        axes = c.k_axes if len(c.k_axes) > 1 else c.k_axes[0]
        return [p, shardsim.reduce_scatter(p, axes, "N") if scatter else shardsim.all_reduce(p, axes)]

    _assert_same(program, dict(zip(c.mesh.axis_names, c.mesh.shape)), dtype=str(c.a.dtype))


@pytest.mark.parametrize("with_data", [True, False])
def test_same_errors_on_data_and_shape_only(with_data: bool) -> None:
    mesh = Mesh(X=2, Y=2)
    make = _maker(mesh, with_data)
    x = make((4, 8), "B_X D")
    with pytest.raises(shardsim.CollectiveError, match=r"differ along \['Y'\]"):
        shardsim.ppermute(x, ("X", "Y"), 1)
    with pytest.raises(shardsim.MatmulShardingError, match="case 4"):
        x @ make((8, 4), "D F_X")
    with pytest.raises(shardsim.DivisibilityError, match="dimension D of size 6"):
        make((4, 6), "B D_XY")
    with pytest.raises(shardsim.DivisibilityError, match="dimension D of size 6"):
        shardsim.all_to_all(make((4, 6), "B_XY D"), ("X", "Y"), "B", "D")
    with pytest.raises(shardsim.PartialSumError):
        shardsim.activation(make((4, 8), "B D_X").sum("D"), "relu")


def test_reading_data_raises() -> None:
    mesh = Mesh(X=2)
    x = shardsim.shard(ShapeDtype((4, 8), "bfloat16"), mesh, "B_X D")
    assert x.is_shape_only and "shape-only" in repr(x)
    assert x.dtype == shardsim.dtypes.resolve_dtype("bfloat16") and x.local_shape == (2, 8)
    for read in (x.compact, x.to_global, x.blocks, lambda: x.local(X=0)):
        with pytest.raises(ShapeOnlyError, match="shape-only"):
            read()
    with pytest.raises(ShapeOnlyError, match="shape-only"):
        shardsim.all_gather(x, "X").to_global()


def test_mixing_data_and_shape_only_raises() -> None:
    mesh = Mesh(X=2)
    data = shardsim.shard(np.ones((4, 8)), mesh, "B D")
    meta = shardsim.shard(ShapeDtype((4, 8), "float64"), mesh, "B D")
    meta_w = shardsim.shard(ShapeDtype((8, 4), "float64"), mesh, "D F")
    for mix in (lambda: data + meta, lambda: meta * data, lambda: data @ meta_w):
        with pytest.raises(ShapeOnlyError, match="cannot mix shape-only values and values with data"):
            mix()


def test_shape_dtype() -> None:
    s = ShapeDtype([1024, 8192], "bfloat16")
    assert s.shape == (1024, 8192) and s.nbytes == 1024 * 8192 * 2


def test_1024_chips_at_d_model_8192_is_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    # a per-chip Python loop would have to enumerate the chips: forbid it outright
    for name in ("chips", "groups", "coords"):
        monkeypatch.setattr(Mesh, name, lambda *a, **k: pytest.fail("per-chip loop in a shape-only trace"))
    b, d, f, x, y = 1 << 20, 8192, 32768, 32, 32
    mesh = Mesh(X=x, Y=y)
    make = _maker(mesh, with_data=False, dtype="bfloat16")
    start = time.perf_counter()
    with shardsim.trace() as t:
        values = fsdp_tp_step(make, mesh, b=b, d=d, f=f)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"1,024-chip shape-only step took {elapsed:.3f} s"
    assert len(t.collectives()) == 10  # 4 forward, 6 backward (the book's 7, reusing the gathered In)
    # closed forms per chip (bf16): the W_in AllGather moves (X-1)/X of a D x F/Y block
    first = next(e for e in t if e.label == "W_in" and e.op == "all_gather")
    assert first.sent_bytes == (x - 1) * (d * f // y * 2) // x
    mm = next(e for e in t if e.op == "matmul")
    assert mm.flops == 2 * (b // x) * d * (f // y)
    assert mesh.memory.live("params").tolist() == [[2 * (d * f * 2 // (x * y))] * y] * x  # W_in, W_out in bf16
    del values
