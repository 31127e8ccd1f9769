"""Context-parallel attention (ring and all-gather): values, ledger, bytes, FLOPs, cost, bad input.

Every figure is read from the program's trace and ledger and compared with a hand-derived
value; the values are held to the plain single-device attention in ``attention_reference``,
itself held to finite differences here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardsim as ss
from attention_reference import attention, attention_backward
from finite_differences import numeric_grad
from shardsim.dtypes import eps, resolve_dtype, tolerance
from shardsim.strategies.context import balanced_order, context_attention, context_attention_backward
from shardsim.tracing import Trace, phase
from strategies_core import deep

# -- the reference against finite differences ------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_reference_backward_matches_finite_differences(causal: bool) -> None:
    rng = np.random.default_rng(3)
    b, s, n, kv, h = 2, 6, 4, 2, 3  # GQA: two query heads per kv head
    q, k, v = rng.standard_normal((b, s, n, h)), rng.standard_normal((b, s, kv, h)), rng.standard_normal((b, s, kv, h))
    do = rng.standard_normal((b, s, n, h))
    positions = rng.permutation(s) if causal else None  # a permuted order, as a balanced split gives
    scale = 0.7
    grads = attention_backward(q, k, v, positions, scale, do)
    loss: Callable[[], float] = lambda: float((attention(q, k, v, positions, scale) * do).sum())  # noqa: E731
    for name, value, got in zip("qkv", (q, k, v), grads):
        np.testing.assert_allclose(got, numeric_grad(loss, value), rtol=1e-6, atol=1e-8, err_msg=name)


def test_reference_mask_follows_positions() -> None:
    """Row r attends to the keys whose position is at most its own, whatever the order of the rows."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 5, 1, 2)) for _ in range(3))
    order = np.array([3, 0, 4, 1, 2])
    permuted = attention(q[:, order], k[:, order], v[:, order], order, 1.0)
    plain = attention(q, k, v, np.arange(5), 1.0)
    np.testing.assert_allclose(permuted, plain[:, order], rtol=1e-13)
    np.testing.assert_allclose(plain[:, 0], v[:, 0], rtol=1e-13)  # the first token sees itself only


# -- values: ring and all-gather against the reference ---------------------------------------------


def _run(
    method: str,
    causal: bool,
    balanced: bool,
    model: int,
    cp: int,
    dims: tuple[int, int, int, int, int],
    dtype: str,
    seed: int = 0,
) -> tuple[list[np.ndarray], list[np.ndarray], str]:
    """Sharded (o, dq, dk, dv) and the reference's, on the permuted sequence."""
    b, s, n, kv, h = dims
    mesh = ss.Mesh(C=cp, Y=model) if model > 1 else ss.Mesh(C=cp)
    heads = "N_Y" if model > 1 else "N"
    layout = f"B S_C {heads} H"
    order = balanced_order(s, cp) if balanced else np.arange(s)
    rng = np.random.default_rng(seed)
    dt = resolve_dtype(dtype)
    q, do = rng.standard_normal((b, s, n, h)).astype(dt), rng.standard_normal((b, s, n, h)).astype(dt)
    k, v = (rng.standard_normal((b, s, kv, h)).astype(dt) for _ in range(2))
    shard = lambda x: ss.shard(x, mesh, layout)  # noqa: E731
    positions = ss.shard(order, mesh, "[S_C]", label="positions")
    o, saved = context_attention(shard(q), shard(k), shard(v), positions, axis="C", causal=causal, method=method)
    grads = context_attention_backward(saved, shard(do))
    scale = 1 / np.sqrt(h)
    mask = order if causal else None
    want = [attention(q, k, v, mask, scale), *attention_backward(q, k, v, mask, scale, do)]
    return [x.to_global() for x in (o, *grads)], want, dtype


@st.composite
def cases(draw: st.DrawFn) -> tuple:
    method = draw(st.sampled_from(["ring", "all_gather"]))
    causal, balanced = draw(st.booleans()), draw(st.booleans())
    model = draw(st.sampled_from([1, 2]))
    cp = draw(st.sampled_from([1, 2, 3, 4]))
    kv = model * draw(st.sampled_from([1, 2]))  # kv heads split over the model axis too
    n = kv * draw(st.sampled_from([1, 2, 4]))  # GQA groups of 1, 2 or 4 query heads
    rows = 2 * draw(st.integers(1, 2)) if balanced else draw(st.integers(1, 3))
    dims = (draw(st.integers(1, 2)), cp * rows, n, kv, draw(st.sampled_from([2, 4])))
    return method, causal, balanced, model, cp, dims, draw(st.sampled_from(["float32", "float64"]))


def _assert_close(got: list[np.ndarray], want: list[np.ndarray], dtype: str, seq: int, head_dim: int) -> None:
    tol = tolerance(dtype, seq * head_dim) * 4  # scores, softmax and a sum over the sequence
    for name, g, w in zip(["o", "dq", "dk", "dv"], got, want):
        assert g.dtype == np.dtype(dtype), name
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * max(1.0, float(np.abs(w).max())), err_msg=name)


@deep  # three times the profile's examples: the cases are small and the combinations many
@given(cases())
def test_context_attention_matches_reference(case: tuple) -> None:
    got, want, dtype = _run(*case)
    dims = case[5]
    _assert_close(got, want, dtype, dims[1], dims[4])


@pytest.mark.parametrize("method", ["ring", "all_gather"])
@pytest.mark.parametrize("balanced", [True, False])
def test_causal_gqa_with_model_axis(method: str, balanced: bool) -> None:
    """A fixed case of every feature at once: causal, GQA (4 query heads per kv head), heads over Y."""
    got, want, dtype = _run(method, True, balanced, 2, 4, (2, 16, 8, 2, 4), "float32", seed=5)
    _assert_close(got, want, dtype, 16, 4)


@pytest.mark.parametrize("method", ["ring", "all_gather"])
def test_bfloat16_rounds_only_the_results(method: str) -> None:
    """bfloat16 chips compute in float32: the results differ from the exact attention of the same
    inputs by their final rounding (half a bfloat16 ulp) and float32 error only."""
    got, want, _ = _run(method, True, True, 2, 4, (2, 16, 8, 2, 4), "bfloat16", seed=5)
    for name, g, w in zip(["o", "dq", "dk", "dv"], got, want):
        assert g.dtype.name == "bfloat16", name
        bound = (eps("bfloat16") / 2 + tolerance("float32", 16 * 4)) * float(np.abs(w).max())
        np.testing.assert_allclose(g.astype(np.float64), w, rtol=0, atol=bound, err_msg=name)


def test_non_causal_needs_no_positions() -> None:
    mesh = ss.Mesh(C=2)
    x = np.random.default_rng(1).standard_normal((1, 4, 1, 2))
    q = ss.shard(x, mesh, "B S_C N H")
    o, _ = context_attention(q, q, q, None, axis="C", causal=False)
    np.testing.assert_allclose(o.to_global(), attention(x, x, x, None, 1 / np.sqrt(2)), rtol=1e-13)


# -- the ledger on a shape-only run at s = 131,072 ---------------------------------------------------

S, N, KV, H = 131_072, 8, 8, 128  # B = 1, bfloat16


def _shape_only(cp: int, method: str, s: int = S, kv: int = KV) -> dict[str, int]:
    """Peak bytes per chip above what was live before each pass, read from the ledger."""
    mesh = ss.Mesh(C=cp)
    sd = lambda heads: ss.shard(ss.ShapeDtype((1, s, heads, H), "bfloat16"), mesh, "B S_C N H")  # noqa: E731
    q, k, v = sd(N), sd(kv), sd(kv)
    positions = ss.shard(balanced_order(s, cp), mesh, "[S_C]")
    mem = mesh.memory
    base = int(mem.live().max())
    mem.reset_peak()
    _, saved = context_attention(q, k, v, positions, axis="C", method=method)
    out = {"forward": int(mem.peak().max()) - base, "kept": int(mem.live().max()) - base}
    out["forward scores"] = int(mem.peak("scores").max())
    do = sd(N)
    base = int(mem.live().max())
    mem.reset_peak()
    with phase("backward"):
        context_attention_backward(saved, do)
    out["backward"] = int(mem.peak().max()) - base
    out["backward scores"] = int(mem.peak("scores").max())
    return out


def _sizes(cp: int, kv: int = KV) -> dict[str, int]:
    """Bytes per chip of the buffers the scheme names, at S = 131,072 (hand-derived)."""
    rows = S // cp
    return {
        "kv": rows * kv * H * 2,  # one K (or V) block, bfloat16
        "pos": rows * 8,  # one block of int64 positions
        "row": N * rows * 4,  # one float32 statistic per query row and head (m, l, alpha, lse, delta)
        "acc": N * rows * H * 4,  # the float32 running output, or dQ
        "score": N * 128 * 128 * 4,  # one float32 tile of the scores [B, N, 128, 128]: all a fused kernel holds
    }


@pytest.mark.parametrize("cp", [8, 16])
def test_ring_ledger_scales_as_sequence_over_cp(cp: int) -> None:
    got, z = _shape_only(cp, "ring"), _sizes(cp)
    # forward, step 1: the block in use and the one arriving (K, V, positions); m, l, acc;
    # the new m, l, alpha and acc; one tile of the scores
    assert got["forward"] == 4 * z["kv"] + 2 * z["pos"] + 5 * z["row"] + 2 * z["acc"] + z["score"]
    assert got["kept"] == z["kv"] * N // KV + z["row"]  # stored for backward: O (bfloat16) and lse
    # backward, a step at its new dQ: K/V blocks in use and arriving; delta; the old and the new dQ;
    # the old and the new dK and dV (float32); the tile of dS (P's is gone after dV)
    assert got["backward"] == 4 * z["kv"] + 2 * z["pos"] + z["row"] + 2 * z["acc"] + 4 * 2 * z["kv"] + z["score"]
    assert got["forward scores"] == z["score"] and got["backward scores"] == 2 * z["score"]  # P and dS, any cp


def test_doubling_cp_halves_the_ring_buffers() -> None:
    """Everything but the score tiles halves with cp doubled; the tiles stay one kernel's."""
    at8, at16 = _shape_only(8, "ring"), _shape_only(16, "ring")
    tile = _sizes(8)["score"]  # one tile is live at each peak, at any cp
    for p in ("forward", "backward"):
        assert at8[p] - tile == 2 * (at16[p] - tile)
        assert at8[f"{p} scores"] == at16[f"{p} scores"] > 0
    assert at8["kept"] == 2 * at16["kept"]


def test_all_gather_holds_the_full_kv() -> None:
    """All-gather attention's forward holds the gathered K, V and positions: cp blocks each."""
    cp = 8
    got, z = _shape_only(cp, "all_gather"), _sizes(cp)
    assert got["forward"] == cp * (2 * z["kv"] + z["pos"]) + 5 * z["row"] + 2 * z["acc"] + z["score"]
    ring = _shape_only(cp, "ring")
    assert got["forward"] - ring["forward"] == (2 * cp - 4) * z["kv"] + (cp - 2) * z["pos"]


@pytest.mark.parametrize("method", ["ring", "all_gather"])
def test_a_chip_sized_for_the_ring_cannot_gather(method: str) -> None:
    """Capacity set to exactly the ring's forward peak: the ring fits; all-gather's full K and V
    do not (the gathered V is the buffer that overflows)."""
    cp = 8
    z = _sizes(cp)
    mesh = ss.Mesh(C=cp)
    sd = lambda heads: ss.shard(ss.ShapeDtype((1, S, heads, H), "bfloat16"), mesh, "B S_C N H")  # noqa: E731
    q, k, v = sd(N), sd(KV), sd(KV)
    positions = ss.shard(balanced_order(S, cp), mesh, "[S_C]")
    ring_peak = 4 * z["kv"] + 2 * z["pos"] + 5 * z["row"] + 2 * z["acc"] + z["score"]
    mesh.memory.capacity = int(mesh.memory.live().max()) + ring_peak
    if method == "ring":
        context_attention(q, k, v, positions, axis="C", method=method)
    else:
        full_v = cp * z["kv"]  # K gathered fits; V gathered does not
        with pytest.raises(ss.OutOfMemoryError, match=rf"\({full_v} bytes\) per chip for a value\[B, S, N, H\]"):
            context_attention(q, k, v, positions, axis="C", method=method)


# -- bytes: read from the trace -----------------------------------------------------------------------


def _traced(method: str, cp: int, *, balanced: bool = True, kv: int = KV, s: int = S) -> tuple[Trace, ss.Mesh]:
    mesh = ss.Mesh(C=cp)
    sd = lambda heads, name: ss.shard(ss.ShapeDtype((1, s, heads, H), "bfloat16"), mesh, "B S_C N H", label=name)  # noqa: E731
    q, k, v = sd(N, "Q"), sd(kv, "K"), sd(kv, "V")
    order = balanced_order(s, cp) if balanced else np.arange(s)
    positions = ss.shard(order, mesh, "[S_C]", label="positions")
    with ss.trace() as t:
        _, saved = context_attention(q, k, v, positions, axis="C", method=method)
        with phase("backward"):
            context_attention_backward(saved, sd(N, "dO"))
    return t, mesh


def _sent(t: Trace, op: str, label: str, ph: str) -> list[int]:
    return [e.sent_bytes for e in t.events if e.op == op and e.label == label and e.phase == ph]


@pytest.mark.parametrize("cp", [4, 8])
def test_ring_moves_cp_minus_one_blocks_per_pass(cp: int) -> None:
    t, _ = _traced("ring", cp)
    block = S // cp * KV * H * 2
    for ph in ("forward", "backward"):
        for name in ("K", "V"):
            assert _sent(t, "ppermute", name, ph) == [block] * (cp - 1)
    for name in ("dK", "dV"):  # float32, with their blocks, plus one hop home
        assert _sent(t, "ppermute", name, "backward") == [2 * block] * cp
    assert _sent(t, "ppermute", "positions", "forward") == [S // cp * 8] * (cp - 1)
    assert {e.op for e in t.events if e.is_collective} == {"ppermute"}


@pytest.mark.parametrize("cp", [4, 8])
def test_all_gather_moves_cp_minus_one_over_cp_of_the_kv(cp: int) -> None:
    kv = 2  # GQA: K/V a quarter of Q, where all-gather is used
    t, _ = _traced("all_gather", cp, kv=kv)
    full = S * kv * H * 2  # the whole K (or V), bfloat16
    for ph in ("forward", "backward"):
        for name in ("K", "V"):
            assert _sent(t, "all_gather", name, ph) == [full * (cp - 1) // cp]
    for name in ("dK", "dV"):  # float32 partial sums
        assert _sent(t, "reduce_scatter", name, "backward") == [2 * full * (cp - 1) // cp]
    assert not [e for e in t.events if e.op == "ppermute"]


def test_ring_and_all_gather_move_the_same_kv_bytes() -> None:
    """Both move the same K/V bytes per pass, (cp - 1) blocks; all-gather in one collective."""
    cp = 8
    ring, _ = _traced("ring", cp, kv=2)
    gathered, _ = _traced("all_gather", cp, kv=2)
    for name in ("K", "V"):
        assert sum(_sent(ring, "ppermute", name, "forward")) == sum(_sent(gathered, "all_gather", name, "forward"))


# -- FLOPs per chip: balanced and contiguous ----------------------------------------------------------


def _flops_per_chip(t: Trace, cp: int, ph: str) -> list[int]:
    """Each chip's matmul FLOPs: events every chip runs plus those naming it (``where="C2"``)."""
    return [
        sum(e.flops for e in t.events if e.op == "matmul" and e.phase == ph and e.where in ("", f"C{c}"))
        for c in range(cp)
    ]


@pytest.mark.parametrize("method", ["ring", "all_gather"])
def test_balanced_split_gives_every_chip_the_same_flops(method: str) -> None:
    cp, s = 4, 4096
    t, _ = _traced(method, cp, s=s)
    tile = 2 * N * (s // cp // 2) ** 2 * H  # one matmul of one (S/2cp x S/2cp) tile pair, all heads
    # chip c holds chunks c and 2cp-1-c: 3 visible tile pairs with itself, 2 with every other chip
    visible = 2 * cp + 1
    assert _flops_per_chip(t, cp, "forward") == [2 * visible * tile] * cp  # Q @ K^T and P @ V
    assert _flops_per_chip(t, cp, "backward") == [5 * visible * tile] * cp  # five matmuls


@pytest.mark.parametrize("method", ["ring", "all_gather"])
def test_contiguous_split_is_unbalanced(method: str) -> None:
    cp, s = 4, 4096
    t, _ = _traced(method, cp, s=s, balanced=False)
    tile = 2 * N * (s // cp // 2) ** 2 * H
    # chip c sees c earlier blocks in full (4 tile pairs) and its own causal block (3)
    want = [2 * (4 * c + 3) * tile for c in range(cp)]
    assert _flops_per_chip(t, cp, "forward") == want
    assert want[-1] == 5 * want[0]
    # the same total as the balanced split: causal attention's visible tiles, shared out differently
    balanced, _ = _traced(method, cp, s=s)
    assert sum(_flops_per_chip(balanced, cp, "forward")) == sum(want)


def test_contiguous_ring_idles_the_early_chips() -> None:
    """At ring step t chip c holds block c - t: on the contiguous split, chips c < t have only later keys."""
    cp = 4
    t, _ = _traced("ring", cp, s=64, balanced=False)
    where = [e.where for e in t.events if e.label == "scores" and e.phase == "forward"]
    assert where == [""] + [f"C{c}" for step in range(1, cp) for c in range(step, cp)]


def test_non_causal_counts_every_tile() -> None:
    cp, s = 4, 64
    mesh = ss.Mesh(C=cp)
    q = ss.shard(ss.ShapeDtype((1, s, N, H), "bfloat16"), mesh, "B S_C N H")
    with ss.trace() as t:
        context_attention(q, q, q, None, axis="C", causal=False)
    assert _flops_per_chip(t, cp, "forward") == [2 * 2 * N * (s // cp) * s * H] * cp  # QK^T and PV over all keys


# -- the cost model times the ring, ppermute under the block's compute ----------------------------------


def test_cost_model_overlaps_the_ring_transfers() -> None:
    from shardsim.cost import timeline_of

    cp = 8
    t, mesh = _traced("ring", cp)
    tl = timeline_of(t, "tpu-v5p", mesh)
    sends = [b for b in tl.bars if b.op == "ppermute"]
    assert len(sends) == 3 * (cp - 1) + 3 * (cp - 1) + 2 * cp  # K, V, positions each pass; dK, dV
    # the forward's sends all run under the block steps; the backward's dK/dV hops wait on their
    # step, so a little of each shows, under a tenth of the step in all
    assert all(b.hidden == pytest.approx(b.seconds) for b in sends if b.phase == "forward")
    assert 0 < tl.comm_exposed_s < 0.1 * tl.step_s
    no_overlap = timeline_of(t, "tpu-v5p", mesh, overlap=False)
    assert no_overlap.step_s == pytest.approx(tl.step_s + tl.comm_hidden_s)


def test_cost_model_pays_for_the_contiguous_imbalance() -> None:
    """Compute-bound, the step lasts as long as the busiest chip: 4(cp-1)+3 tile pairs against 2cp+1
    (one kv head: the ring's hops hide whole under the block steps)."""
    from shardsim.cost import timeline_of

    cp = 8
    steps = {}
    for balanced in (True, False):
        t, mesh = _traced("ring", cp, balanced=balanced, kv=1)
        tl = timeline_of(t, "tpu-v5p", mesh)
        assert tl.comm_exposed_s == 0
        steps[balanced] = tl.step_s
    assert steps[False] / steps[True] == pytest.approx((4 * (cp - 1) + 3) / (2 * cp + 1), rel=1e-3)


# -- bad input -----------------------------------------------------------------------------------------


def test_balanced_order_needs_two_chunks_per_chip() -> None:
    with pytest.raises(ss.DivisibilityError, match=r"12 tokens .* 2\*cp = 8 .*multiple of 8"):
        balanced_order(12, 4)
    with pytest.raises(ss.ShardingError, match="cp is the number of chips"):
        balanced_order(16, 0)


def _qkv(mesh: ss.Mesh, layout: str, n: int = 4, kv: int = 2, s: int = 8) -> tuple[ss.ShardedArray, ...]:
    rng = np.random.default_rng(0)
    q = ss.shard(rng.standard_normal((1, s, n, 2)), mesh, layout, label="Q")
    k = ss.shard(rng.standard_normal((1, s, kv, 2)), mesh, layout, label="K")
    v = ss.shard(rng.standard_normal((1, s, kv, 2)), mesh, layout, label="V")
    return q, k, v


def test_kv_heads_that_do_not_divide() -> None:
    mesh = ss.Mesh(C=2)
    q, k, v = _qkv(mesh, "B S_C N H", n=6, kv=4)
    pos = ss.shard(np.arange(8), mesh, "[S_C]")
    with pytest.raises(ss.DivisibilityError, match=r"6 query heads .* 4 kv heads .*\[1, 2, 3, 6\]"):
        context_attention(q, k, v, pos, axis="C")


def test_context_axis_shared_with_another_split_of_the_sequence() -> None:
    mesh = ss.Mesh(C=2, Y=2)
    q, k, v = _qkv(mesh, "B S_CY N H")
    pos = ss.shard(np.arange(8), mesh, "[S_CY]")
    with pytest.raises(ss.ShardingError, match=r"shares its sequence dimension S_CY .* \['Y'\]"):
        context_attention(q, k, v, pos, axis="C")


def test_context_axis_on_another_dimension() -> None:
    mesh = ss.Mesh(C=2)
    q, k, v = _qkv(mesh, "B S N_C H")
    with pytest.raises(ss.ShardingError, match=r"splits N_C over the context axis"):
        context_attention(q, k, v, None, axis="C", causal=False)
    q, k, v = _qkv(mesh, "B S N H")
    with pytest.raises(ss.ShardingError, match=r"does not split its sequence over 'C'"):
        context_attention(q, k, v, None, axis="C", causal=False)


def test_kv_split_unlike_the_queries() -> None:
    mesh = ss.Mesh(C=2, Y=2)
    q, _, _ = _qkv(mesh, "B S_C N_Y H")
    _, k, v = _qkv(mesh, "B S_C N H")
    pos = ss.shard(np.arange(8), mesh, "[S_C]")
    with pytest.raises(ss.ShardingError, match=r"k .* must be split like q .*whole GQA groups"):
        context_attention(q, k, v, pos, axis="C")


def test_bad_positions_and_method() -> None:
    mesh = ss.Mesh(C=2)
    q, k, v = _qkv(mesh, "B S_C N H")
    with pytest.raises(ss.ShardingError, match="positions must be an int ShardedArray"):
        context_attention(q, k, v, None, axis="C")
    shape_only = ss.shard(ss.ShapeDtype((8,), "int64"), mesh, "[S_C]")
    with pytest.raises(ss.ShapeOnlyError, match=r"positions .* is shape-only"):
        context_attention(q, k, v, shape_only, axis="C")
    with pytest.raises(ss.ShapeError, match=r"must be \[S_C\] of shape \(8,\)"):
        context_attention(q, k, v, ss.shard(np.arange(8), mesh, "[S]"), axis="C")
    with pytest.raises(ss.ShardingError, match="method 'tree'"):
        context_attention(q, k, v, ss.shard(np.arange(8), mesh, "[S_C]"), axis="C", method="tree")


def test_backward_checks_the_output_gradient() -> None:
    mesh = ss.Mesh(C=2)
    q, k, v = _qkv(mesh, "B S_C N H")
    o, saved = context_attention(q, k, v, ss.shard(np.arange(8), mesh, "[S_C]"), axis="C")
    with pytest.raises(ss.ShapeError, match="must have the layout and shape of the output"):
        context_attention_backward(saved, ss.shard(np.zeros((1, 8, 4, 2)), mesh, "B S N H"))
    with pytest.raises(ss.ShardingError, match="needs the saved value"):
        context_attention_backward(o, o)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["ring", "all_gather"])
def test_with_data_and_model_axes(method: str) -> None:
    """Batch over a data axis X, sequence over C, heads over Y: each chip a third of the work's split."""
    b, s, n, kv, h = 2, 8, 4, 2, 2
    mesh = ss.Mesh(X=2, C=2, Y=2)
    rng = np.random.default_rng(7)
    q, do = rng.standard_normal((b, s, n, h)), rng.standard_normal((b, s, n, h))
    k, v = rng.standard_normal((b, s, kv, h)), rng.standard_normal((b, s, kv, h))
    order = balanced_order(s, 2)
    shard = lambda x: ss.shard(x, mesh, "B_X S_C N_Y H")  # noqa: E731
    o, saved = context_attention(shard(q), shard(k), shard(v), ss.shard(order, mesh, "[S_C]"), axis="C", method=method)
    got = [x.to_global() for x in (o, *context_attention_backward(saved, shard(do)))]
    want = [attention(q, k, v, order, 1 / np.sqrt(h)), *attention_backward(q, k, v, order, 1 / np.sqrt(h), do)]
    _assert_close(got, want, "float64", s, h)
    assert o.layout == ss.Layout.parse("B_X S_C N_Y H", mesh.axis_names)


def test_the_docs_example_runs() -> None:
    """The code block of docs/context-parallel.md runs as printed."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "context-parallel.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, object] = {}
    exec(compile(code, "context-parallel.md", "exec"), scope)
    assert str(scope["o"].layout) == "[B, S_C, N_Y, H]"  # type: ignore[attr-defined]
