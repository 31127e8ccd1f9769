"""Values held on some chips only, and the ops that cut values into pieces and glue them back."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardsim as ss
from shardsim.ops import sum_dim
from shardsim.pieces import blockwise, concat, held_text, place, split, stack, take


def arange(*shape: int) -> np.ndarray:
    return np.arange(np.prod(shape), dtype=np.float64).reshape(shape)


# -- split / concat -----------------------------------------------------------------------------
@settings(max_examples=25)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.booleans())
def test_split_then_concat_is_the_identity_and_pieces_are_each_chips_rows(n, per, parts, split_b) -> None:
    mesh = ss.Mesh(X=n)
    rows = n * per * parts
    g = arange(rows, 3)
    x = ss.shard(g, mesh, "B_X D" if split_b else "B D")
    pieces = split(x, "B", parts)
    if split_b:  # piece j: the j-th part of every chip's block, chip by chip
        blocks = g.reshape(n, parts, per, 3)
        for j, p in enumerate(pieces):
            np.testing.assert_array_equal(p.to_global(), blocks[:, j].reshape(-1, 3))
    else:
        for p, want in zip(pieces, np.split(g, parts)):
            np.testing.assert_array_equal(p.to_global(), want)
    np.testing.assert_array_equal(concat(pieces, "B").to_global(), g)


def test_split_pieces_are_views_and_concat_is_a_new_buffer() -> None:
    mesh = ss.Mesh(X=2)
    x = ss.shard(np.zeros((8, 4), np.float32), mesh, "B_X D")
    before = mesh.memory.live().copy()
    pieces = split(x, "B", 2)
    np.testing.assert_array_equal(mesh.memory.live(), before)
    whole = concat(pieces, "B")
    np.testing.assert_array_equal(mesh.memory.live() - before, [whole.local_nbytes] * 2)


def test_split_that_does_not_divide_names_the_rows() -> None:
    x = ss.shard(np.zeros((6, 2)), ss.Mesh(X=2), "B_X D")
    with pytest.raises(ss.DivisibilityError, match="has 3 rows there, which do not divide by 2"):
        split(x, "B", 2)


# -- take / stack -------------------------------------------------------------------------------
@settings(max_examples=25)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3))
def test_take_of_a_split_dimension_is_held_by_its_owner_and_stack_undoes_it(z, per, x_size) -> None:
    mesh = ss.Mesh(X=x_size, Z=z)
    g = arange(z * per, 2, 3 * x_size)
    w = ss.shard(g, mesh, "L_Z D F_X")
    before = mesh.memory.live().copy()
    layers = [take(w, "L", i) for i in range(z * per)]
    np.testing.assert_array_equal(mesh.memory.live(), before)  # views: no new bytes
    for i, layer in enumerate(layers):
        np.testing.assert_array_equal(layer.to_global(), g[i])
        assert layer.layout == ss.Layout.parse("D F_X")
        owner = i // per
        want = np.zeros(mesh.shape, bool)
        want[:, owner] = True
        if z > 1:
            np.testing.assert_array_equal(layer.holders, want)
        else:
            assert layer.holders is None  # every chip holds it: spelled None
    again = stack(layers, "L", "Z")
    assert again.layout == w.layout and again.holders is None
    np.testing.assert_array_equal(again.to_global(), g)


def test_take_of_an_unsplit_dimension_keeps_every_chip() -> None:
    w = ss.shard(arange(3, 4), ss.Mesh(Y=2), "C D_Y")
    row = take(w, "C", -1)
    assert row.holders is None and row.layout == ss.Layout.parse("D_Y")
    np.testing.assert_array_equal(row.to_global(), arange(3, 4)[-1])


def test_stack_refuses_a_value_held_on_the_wrong_chips() -> None:
    mesh = ss.Mesh(Z=2)
    w = ss.shard(arange(2, 3), mesh, "L_Z D")
    with pytest.raises(ss.ShardingError, match=r"index 0 belongs on \(Z0\).*held on \(Z1\)"):
        stack([take(w, "L", 1), take(w, "L", 0)], "L", "Z")


# -- holders: place, ops, collectives, ppermute ------------------------------------------------
def test_place_counts_the_copy_only_where_it_lives_and_ops_stay_there() -> None:
    mesh = ss.Mesh(X=2, Z=2)
    x = ss.shard(np.ones((4, 4), np.float32), mesh, "B_X D")
    w = ss.shard(np.ones((4, 8), np.float32), mesh, "D F")
    base = mesh.memory.live().copy()
    mine = place(x, Z=1)
    assert held_text(mine) == "(X0,Z1) (X1,Z1)"
    np.testing.assert_array_equal(mesh.memory.live() - base, [[0, 32], [0, 32]])
    h = mine @ w  # a stage's activations meet replicated weights on the stage's chips
    assert held_text(h) == held_text(mine)
    np.testing.assert_array_equal(mesh.memory.live() - base, [[0, 32 + 64], [0, 32 + 64]])
    np.testing.assert_array_equal(h.to_global(), np.full((4, 8), 4.0))


def test_values_on_different_chips_do_not_meet() -> None:
    mesh = ss.Mesh(Z=2)
    x = ss.shard(np.ones((2, 2)), mesh, "A B")
    with pytest.raises(ss.ShardingError, match="no chip holds all of the operands"):
        place(x, Z=0) + place(x, Z=1)


def test_ppermute_moves_the_holders_with_the_block() -> None:
    mesh = ss.Mesh(Y=2, Z=3)
    x = place(ss.shard(arange(4, 2), mesh, "B_Y D"), Z=0)
    with ss.trace() as t:
        moved = ss.ppermute(x, "Z", 1)
    assert held_text(moved) == "(Y0,Z1) (Y1,Z1)"
    np.testing.assert_array_equal(moved.to_global(), arange(4, 2))
    assert t.events[0].sent_bytes == x.local_nbytes and t.events[0].where == "Z0"


def test_collectives_run_within_the_chips_that_hold_the_value() -> None:
    mesh = ss.Mesh(Y=2, Z=2)
    x = place(ss.shard(arange(4, 2), mesh, "B_Y D"), Z=1)
    with ss.trace() as t:
        full = ss.all_gather(x, "Y")
    assert held_text(full) == held_text(x) and t.events[0].where == "Z1"
    np.testing.assert_array_equal(full.to_global(), arange(4, 2))
    split_z = place(ss.shard(arange(4, 2), mesh, "B_Z D"), Y=0)
    with pytest.raises(ss.CollectiveError, match="some groups over axis 'Z' miss chips"):
        ss.all_gather(place(split_z, Z=0), "Z")


# -- sum with keepdims, blockwise ----------------------------------------------------------------
def test_sum_keepdims_broadcasts_back_and_is_partial_over_a_split_dim() -> None:
    mesh = ss.Mesh(Y=2)
    g = arange(4, 6)
    x = ss.shard(g, mesh, "S D_Y")
    s = sum_dim(x, "D", keepdims=True)
    assert s.layout == ss.Layout.parse("[S, D]{U_Y}") and s.shape == (4, 1)
    np.testing.assert_array_equal(ss.all_reduce(s, "Y").to_global(), g.sum(axis=1, keepdims=True))


def test_blockwise_runs_on_every_chip_and_checks_the_block_shape() -> None:
    mesh = ss.Mesh(X=2)
    x = ss.shard(arange(4, 3), mesh, "T_X E")
    top = blockwise(lambda b: np.argmax(b, axis=-1), [x], ("[T_X]", (4,), "int64"))
    np.testing.assert_array_equal(top.to_global(), [2, 2, 2, 2])
    with pytest.raises(ss.ShapeError, match="needs stacked blocks of shape"):
        blockwise(lambda b: b[..., :1, :], [x], ("[T_X, E]", (4, 3), "float64"))
    p = ss.from_local(np.ones((2, 1, 1)), mesh, "[A, B]{U_X}")
    with pytest.raises(ss.PartialSumError):
        blockwise(lambda b: b, [p], ("[A, B]", (1, 1), "float64"))


def test_stack_with_move_counts_the_bytes_once() -> None:
    mesh = ss.Mesh(Z=2)
    x = ss.shard(np.ones(4), mesh, "[D]")
    values = [place(x, Z=i // 2) for i in range(4)]  # two per stage, 32 bytes each
    base = mesh.memory.live().copy()
    mesh.memory.reset_peak()
    whole = stack(values, "L", "Z", move=True)
    assert values == [] and whole.layout == ss.Layout.parse("L_Z D")
    np.testing.assert_array_equal(mesh.memory.live(), base)  # the same bytes, now one value's
    np.testing.assert_array_equal(mesh.memory.peak(), base)
    np.testing.assert_array_equal(whole.to_global(), np.ones((4, 4)))
