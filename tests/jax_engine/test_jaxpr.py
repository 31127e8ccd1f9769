"""The simulated trace is the executed program.

For every scheme the JAX engine supports, the collectives in the jaxpr of ``compile``'s
function (primitive, mesh axes, program order) are ``trace.collectives()`` of the NumPy
engine's run, forward and backward; the local shapes in the jaxpr give every event's bytes
per chip (the ring formulas of ``docs/collectives.md``) and every matmul's FLOPs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import shardsim  # noqa: E402
from shardsim.engines import jax as engine  # noqa: E402

LAX_TO_SHARDSIM = {
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",  # lax.psum_scatter
    "psum": "all_reduce",
    "all_to_all": "all_to_all",
    "ppermute": "ppermute",
}

CASES = [
    ("ddp", {"X": 8}, None),
    ("fsdp", {"X": 8}, None),
    ("tp", {"Y": 4}, None),
    ("fsdp_tp", {"X": 4, "Y": 2}, None),
    ("fsdp_tp", {"X": 2, "Y": 4}, None),
    ("fsdp_tp", {"X": 2, "Y": 4}, {"data": "Y", "model": "X"}),
    ("zero1", {"X": 4}, None),
    ("zero2", {"X": 2, "Y": 4}, {"data": "Y"}),
    ("zero3", {"X": 4}, None),
]


def equations(jaxpr: Any) -> Iterator[Any]:
    """Every equation of ``jaxpr`` and of the jaxprs inside it (jit, shard_map), in program order."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                inner = sub.jaxpr if hasattr(sub, "jaxpr") and not hasattr(sub, "eqns") else sub
                if hasattr(inner, "eqns"):
                    yield from equations(inner)


def nbytes(var: Any) -> int:
    return math.prod(var.aval.shape) * np.dtype(var.aval.dtype).itemsize


def sent_per_chip(op: str, eqn: Any, n: int) -> int:
    """Bytes one chip sends, from the local shapes in the jaxpr (ring algorithms)."""
    if op == "all_gather":
        return (n - 1) * nbytes(eqn.invars[0])
    if op == "reduce_scatter":
        return (n - 1) * nbytes(eqn.outvars[0])
    if op == "all_reduce":
        return 2 * (n - 1) * nbytes(eqn.invars[0]) // n
    if op == "all_to_all":
        return (n - 1) * nbytes(eqn.invars[0]) // n
    return nbytes(eqn.invars[0])  # ppermute


def dot_flops(eqn: Any) -> int:
    (lc, rc), (lb, _) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    k = math.prod(lhs[i] for i in lc)
    batch = math.prod(lhs[i] for i in lb)
    m = math.prod(s for i, s in enumerate(lhs) if i not in (*lc, *lb))
    n = math.prod(s for i, s in enumerate(rhs) if i not in (*rc, *eqn.params["dimension_numbers"][1][1]))
    return 2 * batch * m * k * n


@pytest.mark.parametrize(("name", "shape", "axes"), CASES)
def test_jaxpr_collectives_are_the_trace(name: str, shape: dict[str, int], axes: dict[str, str] | None) -> None:
    mesh = shardsim.Mesh(shape)
    n_all = mesh.size
    p = shardsim.models.reference_mlp.init(2 * n_all, 4 * n_all, seed=1)
    if name == "tp_sp":  # its LayerNorm's weights
        p |= {"gamma": np.ones(2 * n_all, np.float32), "beta": np.zeros(2 * n_all, np.float32)}
    x = np.random.default_rng(1).standard_normal((2 * n_all, 2 * n_all)).astype(np.float32)
    want = shardsim.run_strategy(name, shardsim.Mesh(shape), p, x, x, activation="relu", axes=axes).trace
    fn, args = engine.compile(name, mesh, p, x, x, activation="relu", axes=axes)
    eqns = list(equations(jax.make_jaxpr(fn)(*args).jaxpr))

    got = []
    for eqn in eqns:
        if eqn.primitive.name in LAX_TO_SHARDSIM:
            names = eqn.params.get("axis_name", eqn.params.get("axes"))
            got.append((LAX_TO_SHARDSIM[eqn.primitive.name], tuple(names), eqn))
    assert [(op, a) for op, a, _ in got] == want.collectives()
    events = [e for e in want.events if e.op in LAX_TO_SHARDSIM.values()]
    for (op, a, eqn), event in zip(got, events):
        assert sent_per_chip(op, eqn, mesh.axis_size(a)) == event.sent_bytes, (op, a, event.label)

    dots = [dot_flops(e) for e in eqns if e.primitive.name == "dot_general"]
    assert dots == [e.flops for e in want.events if e.op == "matmul"]
    phases = {e.phase for e in want.events}
    assert phases == {"forward", "backward"}  # both passes are in the one program


def test_jaxpr_of_a_jax_mesh_names_its_axes() -> None:
    jmesh = jax.make_mesh((2, 4), ("data", "model"), devices=jax.devices()[:8])
    p = shardsim.models.reference_mlp.init(8, 16)
    x = np.ones((8, 8), np.float32)
    fn, args = engine.compile("fsdp_tp", jmesh, p, x, x)
    assert args[1].sharding.spec == jax.sharding.PartitionSpec("data", "model")
    got = [
        (LAX_TO_SHARDSIM[e.primitive.name], tuple(e.params.get("axis_name", e.params.get("axes"))))
        for e in equations(jax.make_jaxpr(fn)(*args).jaxpr)
        if e.primitive.name in LAX_TO_SHARDSIM
    ]
    assert got[:4] == [
        ("all_gather", ("model",)),
        ("all_gather", ("data",)),
        ("all_gather", ("data",)),
        ("reduce_scatter", ("model",)),
    ]


def test_compiled_program_is_the_hand_written_one() -> None:
    """Once jitted the seam costs nothing: XLA's program of each scheme has the same operations, in
    the same order, as a hand-written ``shard_map`` of the same collectives (``benchmarks/engines.py``'s).

    The order matters as much as the operations: elementwise kernels run on blocks carrying the
    size-1 mesh dims made XLA schedule fsdp's independent dots differently (the same work, in
    another order, and a measured 1.12x in a benchmark)."""
    import importlib.util
    import re
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        spec = importlib.util.spec_from_file_location("bench_engines", bench / "engines.py")
        assert spec is not None and spec.loader is not None
        hand = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(hand)
    finally:
        sys.path.remove(str(bench))
    p = shardsim.models.reference_mlp.init(32, 64, seed=0)
    x = np.ones((16, 32), np.float32)
    for name, mesh in hand.MESHES.items():
        fn, args = engine.compile(name, shardsim.Mesh(mesh), p, x, x, activation="relu")
        specs = [jax.tree.map(lambda a: a.sharding.spec, a) for a in args]
        out_specs = jax.tree.map(lambda a: a.sharding.spec, jax.eval_shape(fn, *args))
        theirs = jax.jit(
            jax.shard_map(hand.HAND[name], mesh=args[1].sharding.mesh, in_specs=tuple(specs), out_specs=out_specs)
        )
        ops = []
        for f in (fn, theirs):
            text = f.lower(*args).compile().as_text()
            entry = text[text.index("\nENTRY") :]  # the program's own schedule, not its fused subcomputations
            found = re.findall(r"= \S+ (\w[\w-]*)\(", entry[: entry.index("\n}")])
            ops.append([op for op in found if op not in ("parameter", "bitcast", "get-tuple-element", "constant")])
        assert ops[0] == ops[1], name
