"""The per-chip ledger: real lifetimes, logical bytes per chip, peaks and categories."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import given

import shardsim
from shardsim import Mesh
from shardsim.memory import fmt_bytes
from strategies_core import cases, parts


@given(cases())
def test_every_chip_counts_its_block_and_frees_it(case) -> None:  # type: ignore[no-untyped-def]
    mesh = case.mesh
    x = shardsim.shard(case.array, mesh, case.layout)
    block = case.array.nbytes // np.prod([parts(mesh, d.axes) for d in case.layout.dims])
    assert (mesh.memory.live() == block).all()
    assert mesh.memory.live().shape == mesh.shape
    del x
    gc.collect()
    assert (mesh.memory.live() == 0).all()
    assert (mesh.memory.peak() == block).all()  # the peak remembers


def test_freed_value_leaves_every_chip() -> None:
    mesh = Mesh(X=2, Y=4)
    keep = shardsim.shard(np.zeros((8, 8), np.float32), mesh, "B_X D_Y")  # 4*2*4 = 32 bytes/chip
    tmp = shardsim.all_gather(keep, "Y")  # [B_X, D]: 4*8*4 = 128 bytes/chip
    assert mesh.memory.live().tolist() == [[160] * 4] * 2
    del tmp
    gc.collect()
    assert mesh.memory.live().tolist() == [[32] * 4] * 2
    assert mesh.memory.peak().tolist() == [[160] * 4] * 2
    del keep


def test_replicated_weight_counts_on_every_chip_but_is_stored_once() -> None:
    mesh = Mesh(X=8)
    host = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)  # 16 KiB
    w = shardsim.shard(host, mesh, "D F", category="params")
    assert mesh.memory.live("params").tolist() == [16384] * 8  # once per chip, full size
    assert mesh.memory.live("params").sum() == 8 * host.nbytes
    assert w.compact().shape == (1, 64, 64)
    assert w.compact().nbytes == host.nbytes  # the host holds one copy ...
    assert np.shares_memory(w.compact(), host)  # ... and it is the caller's array, not a copy
    assert w.blocks().shape == (8, 64, 64) and w.blocks().strides[0] == 0  # the per-chip view is stride 0


def test_gathered_weight_is_one_host_copy() -> None:
    mesh = Mesh(X=8)
    host = np.ones((64, 64), np.float32)
    w = shardsim.shard(host, mesh, "D_X F", category="params")
    assert mesh.memory.live("params").tolist() == [2048] * 8
    full = shardsim.all_gather(w, "X")
    assert full.category == "params"
    assert mesh.memory.live("params").tolist() == [2048 + 16384] * 8
    assert full.compact().nbytes == host.nbytes  # not 8 copies


def test_partial_sum_counts_a_full_block_per_chip() -> None:
    # a lazy {U_X} matmul result is not materialised on the host, but each chip would hold one
    mesh = Mesh(X=4)
    x = shardsim.shard(np.ones((8, 16)), mesh, "B D_X")
    w = shardsim.shard(np.ones((16, 32)), mesh, "D_X F")
    before = mesh.memory.live().copy()
    p = x @ w
    assert (mesh.memory.live() - before).tolist() == [8 * 32 * 8] * 4
    del p


def test_peak_and_reset_peak() -> None:
    mesh = Mesh(X=2)
    a = shardsim.shard(np.zeros(16), mesh, "D")  # 128 bytes per chip
    b = shardsim.shard(np.zeros(16), mesh, "D_X")  # 64 bytes per chip
    del b
    gc.collect()
    assert mesh.memory.live().tolist() == [128, 128]
    assert mesh.memory.peak().tolist() == [192, 192]
    mesh.memory.reset_peak()
    assert mesh.memory.peak().tolist() == [128, 128]
    assert mesh.memory.peak("activations").tolist() == [128, 128]
    c = shardsim.shard(np.zeros(4), mesh, "D")
    assert mesh.memory.peak().tolist() == [160, 160]
    del a, c


def test_categories() -> None:
    mesh = Mesh(X=2)
    w = shardsim.shard(np.zeros(8), mesh, "D_X", category="params")  # 32 bytes per chip
    g = shardsim.shard(np.zeros(8), mesh, "D_X")  # activations by default
    assert mesh.memory.live("activations").tolist() == [32, 32]
    assert g.as_category("grads") is g
    assert g.category == "grads"
    assert mesh.memory.live("activations").tolist() == [0, 0]
    assert mesh.memory.live("grads").tolist() == [32, 32]
    assert mesh.memory.peak("activations").tolist() == [32, 32]  # each category keeps its own peak
    m = shardsim.shard(np.zeros(8), mesh, "D_X", category="moments")  # any name a program likes
    assert mesh.memory.categories() == ["params", "grads", "activations", "moments"]  # standard ones first
    assert mesh.memory.live().tolist() == [96, 96]
    assert mesh.memory.live("optimizer").tolist() == [0, 0]  # never used: zeros
    h = shardsim.activation(w, "relu")
    assert h.category == "activations"  # a local op makes an activation
    snap = mesh.memory.snapshot()
    assert snap["live"]["total"].tolist() == [128, 128]
    assert snap["live"]["params"].tolist() == [32, 32]
    del w, g, m, h


def test_largest_and_table() -> None:
    mesh = Mesh(X=2, Y=2)
    w = shardsim.shard(np.zeros((8, 8), np.float32), mesh, "D_X F", label="W_in", category="params")
    x = shardsim.shard(np.zeros((2, 8), np.float32), mesh, "B D", label="In")
    rows = mesh.memory.largest((0, 1))
    assert rows == [("W_in", "[D_X, F]", "params", 128), ("In", "[B, D]", "activations", 64)]
    table = str(mesh.memory)
    assert "(X0,Y1)" in table and "params (peak)" in table and "total live" in table
    assert "192 B" in table
    del w, x


@pytest.mark.parametrize(("n", "text"), [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (3 * 2**30, "3.0 GiB")])
def test_fmt_bytes(n: int, text: str) -> None:
    assert fmt_bytes(n) == text


def test_closed_form_for_an_fsdp_step() -> None:
    # FSDP weight [D_X, F] on N chips: D*F/N per chip at rest, + D*F while gathered (ZeRO-3)
    n, d, f = 4, 16, 32
    mesh = Mesh(X=n)
    w = shardsim.shard(np.zeros((d, f), np.float32), mesh, "D_X F", category="params")
    mesh.memory.reset_peak()
    full = shardsim.all_gather(w, "X")
    del full
    gc.collect()
    assert mesh.memory.live("params").tolist() == [4 * d * f // n] * n
    assert mesh.memory.peak("params").tolist() == [4 * d * f // n + 4 * d * f] * n
    del w
