"""Every scheme against the single-device MLP: values, exact collective sequences, memory."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardsim as ss
from shardsim import mlp
from shardsim.dtypes import tolerance
from strategies_core import MLP_SCHEMES, scheme_meshes


def inputs(b: int, d: int, f: int, dtype: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    params = mlp.init(d, f, seed=seed + 1, dtype=dtype)
    x = rng.standard_normal((b, d)).astype(dtype)
    dout = rng.standard_normal((b, d)).astype(dtype)
    return params, x, dout


def assert_matches_reference(result, params, x, dout, activation: str, dtype: str) -> None:
    b, d = x.shape
    f = params["w_in"].shape[1]
    tol = tolerance(dtype, max(b, d, f)) * 4  # two chained matmuls
    want = {"out": mlp.forward(params, x, activation), **mlp.backward(params, x, dout, activation)}
    got = {"out": result.out, **result.grads}
    for name, expected in want.items():
        assert got[name].shape == expected.shape and got[name].dtype == expected.dtype, name
        scale = float(np.abs(expected).max()) or 1.0
        err = float(np.abs(got[name] - expected).max())
        assert err <= tol * scale, f"{result.scheme} {name}: max error {err:.3g} > {tol * scale:.3g}"


@st.composite
def scheme_cases(draw):
    name, sizes, shape = draw(scheme_meshes())
    activation = draw(st.sampled_from(["identity", "relu", "gelu"]))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    return name, sizes, shape, activation, dtype, draw(st.integers(0, 2**16))


@settings(max_examples=60)
@given(scheme_cases())
def test_every_scheme_equals_the_single_device_mlp(case) -> None:
    name, sizes, (b, d, f), activation, dtype, seed = case
    params, x, dout = inputs(b, d, f, dtype, seed)
    result = ss.run_strategy(name, ss.Mesh(sizes), params, x, dout, activation=activation)
    assert_matches_reference(result, params, x, dout, activation, dtype)


def test_other_axis_names_through_roles() -> None:
    params, x, dout = inputs(4, 8, 8, "float64")
    mesh = ss.Mesh(data=2, model=2)
    r = ss.run_strategy("fsdp_tp", mesh, params, x, dout, axes={"data": "data", "model": "model"})
    assert r.layouts["x"] == "[B_{data}, D_{model}]"
    assert r.trace.collectives("forward")[0] == ("all_gather", ("model",))
    assert_matches_reference(r, params, x, dout, "identity", "float64")


def test_a_scheme_runs_on_a_bigger_mesh_replicated_over_the_other_axis() -> None:
    params, x, dout = inputs(4, 8, 8, "float64")
    r = ss.run_strategy("ddp", ss.Mesh(X=2, Y=2), params, x, dout)
    assert r.layouts["x"] == "[B_X, D]"
    assert_matches_reference(r, params, x, dout, "identity", "float64")


# -- exact collective sequences (op, axis, array) --------------------------------------------
SEQUENCES = {
    "ddp": (
        [],
        [("all_reduce", "X", "dW_out"), ("all_reduce", "X", "dW_in")],
    ),
    "fsdp": (
        [("all_gather", "X", "W_in"), ("all_gather", "X", "W_out")],
        [
            ("all_gather", "X", "W_out"),
            ("reduce_scatter", "X", "dW_out"),
            ("all_gather", "X", "W_in"),
            ("reduce_scatter", "X", "dW_in"),
        ],
    ),
    "tp": (
        [("all_gather", "Y", "In"), ("reduce_scatter", "Y", "Out")],
        [("all_gather", "Y", "dOut"), ("reduce_scatter", "Y", "dIn")],
    ),
    "fsdp_tp": (  # the seed's forward; the scaling book's backward
        [
            ("all_gather", "Y", "In"),
            ("all_gather", "X", "W_in"),
            ("all_gather", "X", "W_out"),
            ("reduce_scatter", "Y", "Out"),
        ],
        [
            ("all_gather", "Y", "dOut"),
            ("reduce_scatter", "X", "dW_out"),
            ("all_gather", "X", "W_out"),
            ("all_gather", "Y", "In"),
            ("reduce_scatter", "X", "dW_in"),
            ("all_gather", "X", "W_in"),
            ("reduce_scatter", "Y", "dIn"),
        ],
    ),
}


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_exact_collective_sequence(name: str) -> None:
    mesh = ss.Mesh(X=2, Y=2) if name == "fsdp_tp" else ss.Mesh(**{MLP_SCHEMES[name][0]: 2})
    params, x, dout = inputs(4, 8, 8, "float32")
    t = ss.run_strategy(name, mesh, params, x, dout).trace
    forward, backward = SEQUENCES[name]
    for phase, want in (("forward", forward), ("backward", backward)):
        got = [(op, ax, label) for op, ax, label in t.steps(phase) if op != "matmul"]
        assert got == want, f"{name} {phase}"
    assert t == [(op, ax) for op, ax, _ in forward + backward]


def test_seed_matmuls_between_the_collectives() -> None:
    """fsdp_tp forward: the seed's six steps, matmuls included, in order."""
    params, x, dout = inputs(2, 4, 8, "float32")
    t = ss.run_strategy("fsdp_tp", ss.Mesh(X=2, Y=2), params, x, dout).trace
    steps = [(e.op, "".join(e.axes), e.after) for e in t if e.phase == "forward"]
    assert steps == [
        ("all_gather", "Y", "[B_X, D]"),
        ("all_gather", "X", "[D, F_Y]"),
        ("matmul", "", "[B_X, F_Y]"),
        ("all_gather", "X", "[F_Y, D]"),
        ("matmul", "", "[B_X, D]{U_Y}"),
        ("reduce_scatter", "Y", "[B_X, D_Y]"),
    ]


# -- memory ----------------------------------------------------------------------------------
B, D, F = 8, 16, 32
ITEM = 4  # float32
WEIGHT = D * F * ITEM  # one full weight matrix, bytes


def run(name: str, mesh: ss.Mesh, activation: str = "relu"):
    params, x, dout = inputs(B, D, F, "float32")
    return ss.run_strategy(name, mesh, params, x, dout, activation=activation)


def test_ddp_holds_the_full_model_on_every_chip() -> None:
    r = run("ddp", ss.Mesh(X=4))
    assert (r.memory["params"] == 2 * WEIGHT).all()
    assert (r.memory["grads"] == 2 * WEIGHT).all()


def test_fsdp_weight_peak_is_one_full_weight_plus_the_slices() -> None:
    n = 4
    r = run("fsdp", ss.Mesh(X=n))
    slices = 2 * WEIGHT // n
    assert (r.memory["params"] == slices + WEIGHT).all()
    assert (r.memory["params"] < run("ddp", ss.Mesh(X=n)).memory["params"]).all()
    assert (r.memory["grads"] <= 2 * WEIGHT // n + WEIGHT).all()


def test_tp_activation_memory_per_stored_activation() -> None:
    """TP keeps 1/Y of the activations split along D or F; the gathered input is full size."""
    y = 4
    r = run("tp", ss.Mesh(Y=y))
    single = {"In": B * D * ITEM, "H_pre": B * F * ITEM, "H": B * F * ITEM, "Out": B * D * ITEM}
    for name, full in single.items():
        assert r.activations[name] == full // y, name
    assert r.activations["In (gathered)"] == B * D * ITEM


def test_fsdp_tp_stores_activations_split_over_both_axes() -> None:
    r = run("fsdp_tp", ss.Mesh(X=2, Y=2))
    assert r.activations["In"] == B * D * ITEM // 4
    assert r.activations["H"] == B * F * ITEM // 4
    assert "In (gathered)" not in r.activations  # re-gathered in backward instead


def test_identity_activation_stores_h_once() -> None:
    r = run("ddp", ss.Mesh(X=2), activation="identity")
    assert r.activations["H"] == r.activations["H_pre"]
    assert (r.memory["activations"] < run("ddp", ss.Mesh(X=2)).memory["activations"]).all()


def test_memory_is_measured_above_what_was_live_before() -> None:
    mesh = ss.Mesh(X=2)
    keep = ss.shard(np.zeros((64, 64), np.float32), mesh, "A B", category="params")
    params, x, dout = inputs(B, D, F, "float32")
    r = ss.run_strategy("ddp", mesh, params, x, dout)
    assert (r.memory["params"] == 2 * WEIGHT).all()
    del keep


# -- shape-only: the same program at real sizes ----------------------------------------------
def test_shape_only_run_traces_the_same_program() -> None:
    sizes = dict(b=16, d=32, f=64)
    params, x, dout = inputs(sizes["b"], sizes["d"], sizes["f"], "float32")
    data = ss.run_strategy("fsdp_tp", ss.Mesh(X=2, Y=4), params, x, dout)
    shape = {k: ss.ShapeDtype(v.shape, "float32") for k, v in params.items()}
    spec = ss.ShapeDtype(x.shape, "float32")
    only = ss.run_strategy("fsdp_tp", ss.Mesh(X=2, Y=4), shape, spec, spec)
    assert only.out is None and only.grads is None

    def program(t):
        return [(e.op, e.axes, e.label, e.after, e.phase, e.sent_bytes, e.flops) for e in t]

    assert program(only.trace) == program(data.trace)
    for c in data.memory:
        np.testing.assert_array_equal(only.memory[c], data.memory[c])


# -- errors ----------------------------------------------------------------------------------
def test_scheme_needs_its_axes() -> None:
    params, x, dout = inputs(4, 8, 8, "float32")
    with pytest.raises(ss.MeshAxisError, match=r"fsdp_tp needs a mesh axis .* \['data', 'model'\].*Mesh\(X=2, Y=2\)"):
        ss.run_strategy("fsdp_tp", ss.Mesh(A=4), params, x, dout)


def test_shapes_that_do_not_divide_name_the_dimension() -> None:
    params, x, dout = inputs(3, 8, 8, "float32")
    with pytest.raises(ss.DivisibilityError, match=r"ddp: cannot lay out In as \[B_X, D\].*dimension B of size 3"):
        ss.run_strategy("ddp", ss.Mesh(X=2), params, x, dout)


def test_unknown_scheme_and_bad_params() -> None:
    params, x, dout = inputs(4, 8, 16, "float32")
    with pytest.raises(ss.ShardingError, match="unknown scheme 'zero9'"):
        ss.run_strategy("zero9", ss.Mesh(X=2), params, x, dout)
    with pytest.raises(ss.ShardingError, match=r"needs params \['w_in', 'w_out'\]"):
        ss.run_strategy("ddp", ss.Mesh(X=2), {"w_in": params["w_in"]}, x, dout)
    with pytest.raises(ss.ShardingError, match=r"W_out must be \[F, D\]"):
        ss.run_strategy("ddp", ss.Mesh(X=2), {"w_in": params["w_in"], "w_out": params["w_in"]}, x, dout)
    with pytest.raises(ss.ShardingError, match="unknown activation 'tanh'"):
        ss.run_strategy("ddp", ss.Mesh(X=2), params, x, dout, activation="tanh")


@pytest.mark.parametrize("name,sizes", [("ddp", {"X": 32}), ("tp", {"Y": 16}), ("fsdp_tp", {"X": 16, "Y": 2})])
def test_many_chips_stack_their_blocks_into_one_matmul(name: str, sizes: dict[str, int]) -> None:
    """Past a few chips, replicated operands fold the chips into one matmul; same numbers."""
    params, x, dout = inputs(32, 32, 64, "float64", seed=9)
    r = ss.run_strategy(name, ss.Mesh(sizes), params, x, dout, activation="gelu")
    assert_matches_reference(r, params, x, dout, "gelu", "float64")
