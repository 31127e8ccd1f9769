"""Out of memory: a per-chip capacity, an accelerator-style report, and a ledger left as it was."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardsim
from shardsim import OutOfMemoryError, checkpoint
from shardsim.resharding import reshard


def snapshot(mesh: shardsim.Mesh) -> tuple[object, ...]:
    """Everything the ledger reports: live and peak by category, and the largest values per chip."""
    snap = mesh.memory.snapshot()
    flat = {(kind, cat): v.tolist() for kind, cats in snap.items() for cat, v in cats.items()}
    largest = [mesh.memory.largest(tuple(c.values()), n=100) for c in mesh.chips()]
    return flat, largest


def fsdp_mesh(capacity: int) -> tuple[shardsim.Mesh, shardsim.ShardedArray, shardsim.ShardedArray]:
    mesh = shardsim.Mesh(X=2, Y=2)
    mesh.memory.capacity = capacity
    w = shardsim.shard(np.zeros((8, 32), np.float32), mesh, "D_X F", category="params").named("W_in")  # 512 B
    act = shardsim.shard(np.zeros((4, 32), np.float32), mesh, "B_Y F").named("act")  # 256 B
    return mesh, w, act


def test_report_names_chip_capacity_request_and_largest_values() -> None:
    _mesh, w, _act = fsdp_mesh(1500)  # _act stays live: it is in the report
    with pytest.raises(OutOfMemoryError) as e:
        shardsim.all_gather(w, "X")  # 1 KiB per chip on top of 768 B
    assert str(e.value) == (
        "out of memory on chip (X0,Y0): cannot allocate 1.0 KiB (1024 bytes) per chip for W_in[D, F] (8, 32) "
        "float32 (params).\n"
        "In use 768 B + requested 1.0 KiB = 1.8 KiB > capacity 1.5 KiB (1500 bytes); short by 292 B; "
        "4 of 4 chips over capacity.\n"
        "In use on that chip by category: params 512 B, activations 256 B.\n"
        "Largest live values on that chip:\n"
        "       512 B  params       W_in[D_X, F]\n"
        "       256 B  activations  act[B_Y, F]"
    )


def test_report_shows_labels_given_after_creation() -> None:
    mesh = shardsim.Mesh(X=2)
    mesh.memory.capacity = 90
    x = shardsim.shard(np.zeros(16, np.float32), mesh, "A_X")  # 32 B per chip, 64 B gathered
    x.named("late_label")
    with pytest.raises(OutOfMemoryError, match=r"\n        32 B  activations  late_label\[A_X\]$"):
        shardsim.all_gather(x, "X")


def test_failed_allocation_leaves_the_ledger_unchanged() -> None:
    mesh, w, act = fsdp_mesh(1500)
    before = snapshot(mesh)
    with shardsim.trace() as t, pytest.raises(OutOfMemoryError):
        shardsim.all_gather(w, "X")
    assert snapshot(mesh) == before
    assert len(t) == 0  # nothing ran, nothing is recorded
    # and the values that were there still work, within capacity
    assert shardsim.all_gather(act, "Y").local_nbytes == 512


def test_fitting_exactly_is_allowed_and_one_byte_more_is_not() -> None:
    mesh = shardsim.Mesh(X=2)
    mesh.memory.capacity = 64
    a = shardsim.shard(np.zeros(16, np.float32), mesh, "A")  # 64 B per chip: exactly full
    assert int(mesh.memory.live()[0]) == 64
    with pytest.raises(OutOfMemoryError, match=r"In use 64 B \+ requested 1 B = 65 B > capacity 64 B \(64 bytes\)"):
        shardsim.shard(np.zeros(1, np.int8), mesh, "A")
    del a
    shardsim.shard(np.zeros(1, np.int8), mesh, "A")  # freed bytes are free again


def test_no_capacity_means_unlimited() -> None:
    mesh = shardsim.Mesh(X=2)
    assert mesh.memory.capacity is None
    shardsim.shard(np.zeros(1 << 16, np.float32), mesh, "A")


def test_out_of_memory_is_a_memory_error_and_a_shardsim_error() -> None:
    assert issubclass(OutOfMemoryError, MemoryError) and issubclass(OutOfMemoryError, shardsim.ShardsimError)


def test_reshard_that_runs_out_of_memory_keeps_nothing() -> None:
    """[B_X, D] -> [B_Y, D]: AllToAll (256 B more), slice (64 B more) fails, nothing is left behind."""
    mesh = shardsim.Mesh(X=2, Y=4)
    x = shardsim.shard(np.zeros((8, 16), np.float32), mesh, "B_X D").named("x")  # 256 B per chip
    mesh.memory.capacity = 520
    before = snapshot(mesh)[0][("live", "total")]
    with (
        shardsim.trace() as t,
        pytest.raises(OutOfMemoryError, match=r"cannot allocate 64 B .* for x\[B_Y, D_X\]") as e,
    ):
        reshard(x, "[B_Y, D]")
    assert [ev.op for ev in t.events] == ["all_to_all"]  # the first step ran
    assert e.tb is not None  # the traceback (and its frames) is still held here...
    assert snapshot(mesh)[0][("live", "total")] == before  # ...yet the step's output is gone


def test_checkpoint_load_that_runs_out_of_memory_loads_nothing(tmp_path: Path) -> None:
    mesh = shardsim.Mesh(X=2)
    state = {"a": shardsim.shard(np.zeros(32, np.float32), mesh, "A_X"), "b": shardsim.shard(np.zeros(32), mesh, "A")}
    checkpoint.save(tmp_path / "c", state)
    target = shardsim.Mesh(X=2)
    target.memory.capacity = 100  # a (64 B per chip) fits, b (256 B) does not
    with pytest.raises(OutOfMemoryError, match="cannot allocate 256 B") as e:
        checkpoint.load(tmp_path / "c", target)
    assert e.tb is not None  # frames held by the traceback do not keep "a" alive
    assert not target.memory.live().any()
