"""Sharded checkpoints: round trips across meshes and layouts, corruption, atomic saves.

Every round trip is compared bitwise with the NumPy array the values were built from; the
corruption tests damage files on disk and assert the exact error naming the file and block.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, seed
from hypothesis import strategies as st

import shardsim
from fuzz_budget import budget
from shardsim import CheckpointError, _files, checkpoint
from shardsim.checkpoint import _save
from shardsim.layout import Dim, Layout

NAMES = ("X", "Y", "Z")
DIMS = ("A", "B", "C")


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# -- strategies ------------------------------------------------------------------------------------
@st.composite
def meshes(draw: st.DrawFn) -> shardsim.Mesh:
    n = draw(st.integers(1, 3))
    names = draw(st.permutations(NAMES))[:n]
    return shardsim.Mesh({a: draw(st.integers(1, 4)) for a in names})


@st.composite
def layouts(draw: st.DrawFn, mesh: shardsim.Mesh, rank: int) -> Layout:
    slots: list[list[str]] = [[] for _ in range(rank)]
    for axis in draw(st.permutations(mesh.axis_names)):
        where = draw(st.integers(-1, rank - 1))
        if where >= 0:
            slots[where].append(axis)
    return Layout(tuple(Dim(DIMS[i], tuple(s)) for i, s in enumerate(slots)))


def parts(mesh: shardsim.Mesh, axes: tuple[str, ...]) -> int:
    return math.prod(mesh.axis_size(a) for a in axes)


def values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("int"):
        return rng.integers(-1000, 1000, shape).astype(dtype)
    v = rng.standard_normal(shape).astype(shardsim.dtypes.resolve_dtype(dtype))
    if v.size:
        v.flat[0] = np.nan
    return v


# -- property: save on one mesh and layout, load on another ----------------------------------------
@seed(1234)
@budget(40)
@given(data=st.data())
def test_save_then_load_on_another_mesh_and_layout_is_bitwise_equal(data: st.DataObject) -> None:
    src_mesh, dst_mesh = data.draw(meshes(), "saved on"), data.draw(meshes(), "loaded on")
    rank = data.draw(st.integers(1, 3), "rank")
    src, dst = data.draw(layouts(src_mesh, rank), "saved as"), data.draw(layouts(dst_mesh, rank), "loaded as")
    shape = tuple(
        math.lcm(parts(src_mesh, s.axes), parts(dst_mesh, d.axes)) * data.draw(st.integers(0, 2))
        for s, d in zip(src.dims, dst.dims)
    )
    dtype = data.draw(st.sampled_from(["float32", "bfloat16", "float16", "int32", "bool"]), "dtype")
    full = values(np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))), shape, dtype)
    x = shardsim.shard(full, src_mesh, src, category="params").named("w")
    with tempfile.TemporaryDirectory() as tmp:
        path = checkpoint.save(Path(tmp) / "ckpt", {"layer": {"w": x}})
        same = checkpoint.load(path, src_mesh)["layer"]["w"]
        moved = checkpoint.load(path, dst_mesh, layouts={"layer/w": str(dst)})["layer"]["w"]
    assert same.layout == src and same.mesh is src_mesh and same_bits(same.to_global(), full)
    assert moved.layout == dst and moved.mesh is dst_mesh and same_bits(moved.to_global(), full)
    assert (moved.label, moved.category, moved.dtype) == ("w", "params", full.dtype)


# -- round trips by hand ---------------------------------------------------------------------------
def test_fsdp_weights_onto_a_two_axis_mesh(tmp_path: Path) -> None:
    """Saved as FSDP ``W_in[D_X, F]`` on 8 chips, loaded as ``[D_X, F_Y]`` on a 2x2 mesh."""
    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    x = shardsim.shard(w, shardsim.Mesh(X=8), "D_X F", category="params").named("W_in")
    checkpoint.save(tmp_path / "c", {"W_in": x})
    mesh = shardsim.Mesh(X=2, Y=2)
    with shardsim.trace() as t:
        y = checkpoint.load(tmp_path / "c", mesh, layouts={"W_in": "[D_X, F_Y]"})["W_in"]
    assert str(y.layout) == "[D_X, F_Y]" and y.local_shape == (8, 4)
    np.testing.assert_array_equal(y.local(X=1, Y=0), w[8:16, 0:4])
    assert t.collectives() == []  # a restore reads storage; no collective runs
    assert int(mesh.memory.live("params")[0, 0]) == 8 * 4 * 4


def test_replicated_blocks_are_stored_once(tmp_path: Path) -> None:
    mesh = shardsim.Mesh(X=2, Y=4)
    state = {
        "rep": shardsim.shard(np.ones((4, 4)), mesh, "A B"),
        "half": shardsim.shard(np.ones((4, 4)), mesh, "A_X B"),
        "all": shardsim.shard(np.ones((8, 4)), mesh, "A_XY B"),
    }
    checkpoint.save(tmp_path / "c", state)
    files = sorted(p.name for p in (tmp_path / "c").iterdir())
    assert files == ["all.X0.Y0.npy", "all.X0.Y1.npy", "all.X0.Y2.npy", "all.X0.Y3.npy"] + [
        "all.X1.Y0.npy",
        "all.X1.Y1.npy",
        "all.X1.Y2.npy",
        "all.X1.Y3.npy",
        "half.X0.npy",
        "half.X1.npy",
        "index.json",
        "rep.all.npy",
    ]
    blocks = checkpoint.read_index(tmp_path / "c")["arrays"]["half"]["blocks"]
    assert [b["chip"] for b in blocks] == [{"X": 0, "Y": "*"}, {"X": 1, "Y": "*"}]


def test_nested_state_labels_categories_and_empty_dicts(tmp_path: Path) -> None:
    mesh = shardsim.Mesh(X=2)
    a = shardsim.shard(np.arange(4.0), mesh, "B_X", category="params").named("W")
    b = shardsim.shard(np.arange(6, dtype=np.int64), mesh, "C")
    checkpoint.save(tmp_path / "c", {"layers": {"0": {"w": a}, "1": {}}, "step": b})
    got = checkpoint.load(tmp_path / "c", mesh)
    assert set(got) == {"layers", "step"} and got["layers"]["1"] == {}
    w = got["layers"]["0"]["w"]
    assert (w.label, w.category, str(w.layout)) == ("W", "params", "[B_X]")
    assert (got["step"].label, got["step"].category) == ("step", "activations")
    np.testing.assert_array_equal(got["step"].to_global(), np.arange(6))


def test_partial_sum_round_trips_on_the_same_mesh(tmp_path: Path) -> None:
    mesh = shardsim.Mesh(X=2, Y=2)
    blocks = np.random.default_rng(3).standard_normal((2, 2, 3, 2))
    p = shardsim.from_local(blocks, mesh, "[A, B_X]{U_Y}")
    checkpoint.save(tmp_path / "c", {"p": p})
    q = checkpoint.load(tmp_path / "c", mesh)["p"]
    assert str(q.layout) == "[A, B_X]{U_Y}"
    assert same_bits(np.asarray(q.blocks()), np.asarray(p.blocks()))
    # onto another mesh the host adds the partials: the NumPy sum over Y
    r = checkpoint.load(tmp_path / "c", shardsim.Mesh(Z=3), layouts={"p": "[A_Z, B]"})["p"]
    want = np.concatenate([blocks[0, 0] + blocks[0, 1], blocks[1, 0] + blocks[1, 1]], axis=1)
    np.testing.assert_array_equal(r.to_global(), want)


def test_bfloat16_round_trips_bitwise(tmp_path: Path) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    w = (np.arange(32, dtype=np.float32) / 7).astype(ml_dtypes.bfloat16).reshape(4, 8)
    x = shardsim.shard(w, shardsim.Mesh(X=2), "A B_X")
    checkpoint.save(tmp_path / "c", {"w": x})
    y = checkpoint.load(tmp_path / "c", shardsim.Mesh(Y=4), layouts={"w": "A_Y B"})["w"]
    assert y.dtype == w.dtype and same_bits(y.to_global(), w)


def test_without_ml_dtypes_only_bfloat16_values_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    mesh = shardsim.Mesh(X=2)
    checkpoint.save(tmp_path / "f32", {"w": shardsim.shard(np.ones(4, np.float32), mesh, "A_X")})
    checkpoint.save(tmp_path / "bf16", {"w": shardsim.shard(np.ones(4, ml_dtypes.bfloat16), mesh, "A_X")})
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes now raises ImportError
    assert checkpoint.load(tmp_path / "f32", mesh)["w"].dtype == np.float32
    with pytest.raises(CheckpointError, match=r"array 'w' has dtype bfloat16: bfloat16 needs the package ml_dtypes"):
        checkpoint.load(tmp_path / "bf16", mesh)


def test_zero_size_values_round_trip(tmp_path: Path) -> None:
    x = shardsim.shard(np.zeros((0, 4), np.float32), shardsim.Mesh(X=2), "A_X B")
    checkpoint.save(tmp_path / "c", {"x": x})
    y = checkpoint.load(tmp_path / "c", shardsim.Mesh(Y=4), layouts={"x": "A B_Y"})["x"]
    assert y.to_global().shape == (0, 4) and y.local_shape == (0, 1)


# -- corruption: each names the file and the block, and nothing is loaded ---------------------------
@pytest.fixture
def saved(tmp_path: Path) -> Path:
    mesh = shardsim.Mesh(X=2, Y=2)
    w = np.arange(64, dtype=np.float32).reshape(8, 8)
    checkpoint.save(
        tmp_path / "c",
        {
            "mlp": {"W_in": shardsim.shard(w, mesh, "D_X F_Y").named("W_in")},
            "bias": shardsim.shard(np.ones(8, np.float32), mesh, "F_Y"),
        },
    )
    return tmp_path / "c"


def block(path: Path, name: str, chip: dict[str, object]) -> tuple[Path, int]:
    entry = next(b for b in checkpoint.read_index(path)["arrays"][name]["blocks"] if b["chip"] == chip)
    return path / entry["file"], entry["bytes"]


def rewrite_index(path: Path, index: dict) -> None:
    """Write an edited index with a fresh checksum, as a hostile or buggy writer could."""
    index["sha256"] = checkpoint._index_digest(index)
    (path / "index.json").write_text(json.dumps(index))


def load_fails(path: Path, mesh: shardsim.Mesh, message: str, **kw: object) -> None:
    """The load raises exactly ``message`` and leaves nothing live on ``mesh``."""
    with pytest.raises(CheckpointError) as e:
        checkpoint.load(path, mesh, **kw)  # type: ignore[arg-type]
    assert str(e.value) == message
    assert not mesh.memory.live().any()


def test_truncated_block(saved: Path) -> None:
    file, size = block(saved, "mlp/W_in", {"X": 1, "Y": 0})
    file.write_bytes(file.read_bytes()[:100])
    load_fails(
        saved,
        shardsim.Mesh(X=2, Y=2),
        f"checkpoint {saved}: array 'mlp/W_in', block on chip (X1,Y0): "
        f"file mlp.W_in.X1.Y0.npy is truncated (100 of {size} bytes)",
    )


def test_flipped_byte(saved: Path) -> None:
    file, _ = block(saved, "bias", {"X": "*", "Y": 1})
    data = bytearray(file.read_bytes())
    data[-3] ^= 0x01
    file.write_bytes(bytes(data))
    load_fails(
        saved,
        shardsim.Mesh(X=2, Y=2),
        f"checkpoint {saved}: array 'bias', block on chip (X*,Y1): file bias.Y1.npy is corrupt: "
        "its SHA-256 differs from the one in index.json",
    )


def test_missing_block_file(saved: Path) -> None:
    file, _ = block(saved, "mlp/W_in", {"X": 0, "Y": 1})
    file.unlink()
    load_fails(
        saved,
        shardsim.Mesh(X=2, Y=2),
        f"checkpoint {saved}: array 'mlp/W_in', block on chip (X0,Y1): file mlp.W_in.X0.Y1.npy is missing",
    )


def test_block_missing_from_the_index(saved: Path) -> None:
    index = json.loads((saved / "index.json").read_text())
    index["arrays"]["bias"]["blocks"].pop()
    rewrite_index(saved, index)
    load_fails(
        saved,
        shardsim.Mesh(X=2, Y=2),
        f"checkpoint {saved}: array 'bias', block on chip (X*,Y1): index.json lists no file for it",
    )


def test_wrong_mesh_for_the_saved_layout(saved: Path) -> None:
    load_fails(
        saved,
        shardsim.Mesh(X=4),
        f"checkpoint {saved}: array 'mlp/W_in' (saved as [D_X, F_Y] on Mesh(X=2, Y=2)) does not fit Mesh(X=4) "
        "with its saved layout (pass layouts={name: layout} to choose one): "
        "layout [D_X, F_Y] uses mesh axis 'Y', which the mesh does not have (axes ['X'])",
    )


def test_wrong_mesh_size_for_the_saved_layout(saved: Path) -> None:
    with pytest.raises(
        CheckpointError, match=r"array 'mlp/W_in' .* does not fit Mesh\(X=2, Y=3\) .* dimension F of size 8"
    ):
        checkpoint.load(saved, shardsim.Mesh(X=2, Y=3))


def test_damage_is_found_before_any_value_is_built(saved: Path) -> None:
    """The first array is fine, the second is damaged: the load builds neither."""
    file, _ = block(saved, "bias", {"X": "*", "Y": 0})
    file.write_bytes(b"")
    mesh = shardsim.Mesh(X=2, Y=2)
    with pytest.raises(CheckpointError, match="truncated"):
        checkpoint.load(saved, mesh)
    assert not mesh.memory.live().any() and not mesh.memory.peak().any()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: (p / "index.json").unlink(), "{p} is not a shardsim checkpoint: index.json is missing"),
        (lambda p: (p / "index.json").write_text("{"), "checkpoint {p}: index.json is corrupt: "),
        (lambda p: (p / "index.json").write_text("[]"), "{p} is not a shardsim checkpoint: index.json lacks format"),
    ],
)
def test_damaged_index(saved: Path, damage: object, message: str) -> None:
    damage(saved)  # type: ignore[operator]
    with pytest.raises(CheckpointError) as e:
        checkpoint.load(saved, shardsim.Mesh(X=2, Y=2))
    assert str(e.value).startswith(message.format(p=saved))


def test_flipped_digit_in_the_index(saved: Path) -> None:
    """One bit turns chip X0 into X1: still valid JSON, caught by the index's own checksum."""
    text = (saved / "index.json").read_text()
    (saved / "index.json").write_text(text.replace('"X": 0', '"X": 1', 1))
    load_fails(
        saved,
        shardsim.Mesh(X=2, Y=2),
        f"checkpoint {saved}: index.json is corrupt: its contents do not match its SHA-256",
    )


def test_swapped_blocks_in_a_resigned_index_are_caught(saved: Path) -> None:
    index = json.loads((saved / "index.json").read_text())
    index["arrays"]["mlp/W_in"]["blocks"][0]["chip"] = {"X": 1, "Y": 1}  # now two blocks claim (X1,Y1)
    rewrite_index(saved, index)
    with pytest.raises(CheckpointError, match=r"block on chip \(X1,Y1\): unexpected or repeated block in index\.json"):
        checkpoint.load(saved, shardsim.Mesh(X=2, Y=2))


def test_index_cannot_point_outside_the_checkpoint(saved: Path) -> None:
    index = json.loads((saved / "index.json").read_text())
    index["arrays"]["bias"]["blocks"][0]["file"] = "../secret.npy"
    rewrite_index(saved, index)
    with pytest.raises(CheckpointError, match=r"file name '../secret.npy' in index.json is not a plain file name"):
        checkpoint.load(saved, shardsim.Mesh(X=2, Y=2))


def test_no_checkpoint_at_all(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no checkpoint at .*nowhere: the directory does not exist$"):
        checkpoint.load(tmp_path / "nowhere", shardsim.Mesh(X=2))


# -- bad requests ----------------------------------------------------------------------------------
def test_unknown_name_in_layouts(saved: Path) -> None:
    with pytest.raises(CheckpointError, match=r"layouts name \['W_out'\], which the checkpoint does not hold"):
        checkpoint.load(saved, shardsim.Mesh(X=2, Y=2), layouts={"W_out": "[D, F]"})


def test_nested_layouts_and_a_bad_target_layout(saved: Path) -> None:
    mesh = shardsim.Mesh(X=2, Y=2)
    got = checkpoint.load(saved, mesh, layouts={"mlp": {"W_in": "D F_XY"}})
    assert str(got["mlp"]["W_in"].layout) == "[D, F_XY]"
    with pytest.raises(CheckpointError, match=r"with the requested layout 'D_Q F': cannot parse layout"):
        checkpoint.load(saved, mesh, layouts={"mlp/W_in": "D_Q F"})


def test_partial_target_on_another_mesh_is_refused(tmp_path: Path) -> None:
    p = shardsim.from_local(np.ones((2, 2)), shardsim.Mesh(X=2), "[A]{U_X}")
    checkpoint.save(tmp_path / "c", {"p": p})
    with pytest.raises(CheckpointError, match=r"a partial sum loads only with its saved layout"):
        checkpoint.load(tmp_path / "c", shardsim.Mesh(X=4))


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({"a/b": None}, r"checkpoint key 'a/b': keys are non-empty strings without '/'"),
        ({"": None}, "checkpoint key '': keys are non-empty strings"),
        ({"w": np.ones(2)}, "checkpoint value 'w' is a ndarray: a checkpoint holds ShardedArrays and plain"),
        ({"a": {"b": np.float32(1)}}, r"checkpoint value 'a/b' is a float32: .*convert NumPy scalars with int\(\)"),
        ([1, 2], "a checkpoint state is a dict of names to ShardedArrays and plain values, got list"),
    ],
)
def test_bad_states_are_refused(tmp_path: Path, state: object, match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        checkpoint.save(tmp_path / "c", state)  # type: ignore[arg-type]
    assert not (tmp_path / "c").exists()


def test_shape_only_values_cannot_be_saved(tmp_path: Path) -> None:
    x = shardsim.shard(shardsim.ShapeDtype((4,), "float32"), shardsim.Mesh(X=2), "A_X")
    with pytest.raises(CheckpointError, match=r"cannot save 'x' \(array\[A_X\] \(4,\)\): it is shape-only"):
        checkpoint.save(tmp_path / "c", {"x": x})
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_replace_a_directory_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    x = shardsim.shard(np.ones(2), shardsim.Mesh(X=2), "A")
    with pytest.raises(CheckpointError, match=r"holds files but no index\.json"):
        checkpoint.save(tmp_path / "c", {"x": x})
    assert (tmp_path / "c" / "notes.txt").read_text() == "mine"


# -- atomic saves ----------------------------------------------------------------------------------
def test_interrupted_save_leaves_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mesh = shardsim.Mesh(X=4)
    old = np.arange(16.0).reshape(4, 4)
    checkpoint.save(tmp_path / "c", {"w": shardsim.shard(old, mesh, "A_X B"), "b": shardsim.shard(old[0], mesh, "B")})
    before = {p.name: p.read_bytes() for p in (tmp_path / "c").iterdir()}

    real = _save._write_block
    calls = []

    def crash_after_first_block(dir_fd: int, file: str, data: np.ndarray) -> tuple[str, int]:
        if calls:
            raise KeyboardInterrupt("power cut")
        calls.append(file)
        return real(dir_fd, file, data)

    monkeypatch.setattr(_save, "_write_block", crash_after_first_block)
    new = {"w": shardsim.shard(-old, mesh, "A_X B"), "b": shardsim.shard(-old[0], mesh, "B")}
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(tmp_path / "c", new)
    assert len(calls) == 1
    assert {p.name: p.read_bytes() for p in (tmp_path / "c").iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["c"]  # the partial write was cleaned up
    got = checkpoint.load(tmp_path / "c", mesh)
    np.testing.assert_array_equal(got["w"].to_global(), old)
    np.testing.assert_array_equal(got["b"].to_global(), old[0])


def test_interrupted_first_save_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(fd: int, data: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_files, "write_all", disk_full)
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*c: \[Errno 28\] No space left on device$"):
        checkpoint.save(tmp_path / "c", {"x": shardsim.shard(np.ones(2), shardsim.Mesh(X=2), "A")})
    assert list(tmp_path.iterdir()) == []


def test_a_second_save_replaces_the_first(tmp_path: Path) -> None:
    mesh = shardsim.Mesh(X=2)
    checkpoint.save(tmp_path / "c", {"a": shardsim.shard(np.ones(2), mesh, "A_X")})
    checkpoint.save(tmp_path / "c", {"b": shardsim.shard(np.zeros(2), mesh, "A")})
    assert list(checkpoint.load(tmp_path / "c", mesh)) == ["b"]
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["b.all.npy", "index.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def test_crash_between_the_two_renames_is_reported_with_the_previous_path(tmp_path: Path) -> None:
    mesh = shardsim.Mesh(X=2)
    checkpoint.save(tmp_path / "c", {"a": shardsim.shard(np.ones(2), mesh, "A_X")})
    aside = tmp_path / ".c.old-0123456789ab"
    os.rename(tmp_path / "c", aside)  # as a crash right after moving the old checkpoint aside leaves it
    with pytest.raises(CheckpointError, match=r"the previous checkpoint is at .*\.c\.old-0123456789ab$"):
        checkpoint.load(tmp_path / "c", mesh)
    np.testing.assert_array_equal(checkpoint.load(aside, mesh)["a"].to_global(), np.ones(2))
