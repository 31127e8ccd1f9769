"""Checkpoints under attack and under faults: nothing read from outside, nothing lost, nothing wrong.

Each test puts something hostile where a checkpoint's file should be (links, FIFOs, devices,
directories, forged headers and indexes), or fails the file system under a save, and holds
the checkpoint to its promise: a ``CheckpointError`` naming the path and the cause, or the
exact values that were saved. The references are the NumPy arrays and plain values the
state was built from.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, seed
from hypothesis import strategies as st

import shardsim
from fuzz_budget import budget
from shardsim import CheckpointError, checkpoint
from shardsim.layout import Dim, Layout

ROOT = Path(__file__).resolve().parents[1] / "src"


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def resign(path: Path, edit: Any = None) -> dict:
    """Rewrite the index with ``edit`` applied and a fresh checksum, as a hostile writer would."""
    index = json.loads((path / "index.json").read_text())
    if edit is not None:
        edit(index)
    index["sha256"] = checkpoint._index_digest(index)
    (path / "index.json").write_text(json.dumps(index))
    return index


def sign_as(path: Path, file: str, data: bytes) -> None:
    """Re-sign the index so that the block ``file`` has the size and checksum of ``data``."""

    def edit(index: dict) -> None:
        for meta in index["arrays"].values():
            for b in meta["blocks"]:
                if b["file"] == file:
                    b.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())

    resign(path, edit)


def entry(path: Path, name: str = "w", k: int = 0) -> dict:
    return checkpoint.read_index(path)["arrays"][name]["blocks"][k]


@pytest.fixture
def mesh() -> shardsim.Mesh:
    return shardsim.Mesh(X=2)


@pytest.fixture
def full() -> np.ndarray:
    return np.arange(32, dtype=np.float32).reshape(8, 4)


@pytest.fixture
def saved(tmp_path: Path, mesh: shardsim.Mesh, full: np.ndarray) -> Path:
    return checkpoint.save(tmp_path / "c", {"w": shardsim.shard(full, mesh, "A_X B").named("w")})


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file outside the checkpoint an attacker wants read: a valid block of the right shape."""
    path = tmp_path / "elsewhere_zq" / "hidden_zq.npy"
    path.parent.mkdir()
    np.save(path, np.full((4, 4), 7.0, np.float32))
    return path


def refused(path: Path, mesh: shardsim.Mesh, *words: str, secret: Path | None = None) -> str:
    """Load raises CheckpointError containing ``words``, leaks nothing of ``secret``, places nothing."""
    with pytest.raises(CheckpointError) as e:
        checkpoint.load(path, mesh)
    message = str(e.value)
    for w in words:
        assert w in message, message
    if secret is not None:
        data = secret.read_bytes()
        assert "_zq" not in message
        assert str(len(data)) not in message and hashlib.sha256(data).hexdigest()[:8] not in message
    assert not mesh.memory.live().any()
    return message


def load_in_thread(path: Path, mesh: shardsim.Mesh, timeout: float = 5.0) -> BaseException | dict | None:
    """Load with a time limit, so a load that blocks on a FIFO fails the test instead of hanging it."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(checkpoint.load(path, mesh))
        except BaseException as e:  # handed back to the test
            box.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return None
    return box[0]


# -- nothing outside the directory is read ---------------------------------------------------------
def test_a_block_replaced_by_a_link_to_an_outside_file_is_refused(
    saved: Path, mesh: shardsim.Mesh, secret: Path
) -> None:
    """Index re-signed to match the outside file: today the outside data loads silently."""
    e = entry(saved)
    block = saved / e["file"]
    block.unlink()
    block.symlink_to(secret)
    sign_as(saved, e["file"], secret.read_bytes())
    refused(saved, mesh, e["file"], "is a symbolic link", secret=secret)


def test_a_link_with_the_original_index_leaks_nothing_of_its_target(
    saved: Path, mesh: shardsim.Mesh, secret: Path
) -> None:
    """Today the message gives the outside file's size or checksum prefix."""
    block = saved / entry(saved)["file"]
    block.unlink()
    block.symlink_to(secret)
    refused(saved, mesh, "is a symbolic link", secret=secret)


def test_the_index_replaced_by_a_link_is_refused(tmp_path: Path, saved: Path, mesh: shardsim.Mesh) -> None:
    other = checkpoint.save(tmp_path / "other", {"w": shardsim.shard(np.zeros((8, 4), np.float32), mesh, "A_X B")})
    (saved / "index.json").unlink()
    (saved / "index.json").symlink_to(other / "index.json")
    refused(saved, mesh, "index.json is a symbolic link")


def test_a_hard_link_to_an_outside_file_is_refused(saved: Path, mesh: shardsim.Mesh, secret: Path) -> None:
    e = entry(saved)
    (saved / e["file"]).unlink()
    os.link(secret, saved / e["file"])
    sign_as(saved, e["file"], secret.read_bytes())
    refused(saved, mesh, "has 2 hard links", secret=secret)


@pytest.mark.parametrize("which", ["block", "index"])
def test_a_fifo_does_not_hang_load(saved: Path, mesh: shardsim.Mesh, which: str) -> None:
    """Today ``load`` blocks forever opening a named pipe."""
    path = saved / (entry(saved)["file"] if which == "block" else "index.json")
    path.unlink()
    os.mkfifo(path)
    got = load_in_thread(saved, mesh)
    if got is None:  # release the stuck reader before failing
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("load hung on a FIFO")
    assert isinstance(got, CheckpointError), got
    assert "is a named pipe (FIFO), not a regular file" in str(got)


def make_device(path: Path) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")


def make_socket(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (make_device, "a character device"),
        (make_socket, "a socket"),
        (lambda p: p.mkdir(), "a directory"),
        (lambda p: p.symlink_to("/dev/zero"), "a symbolic link"),
    ],
)
@pytest.mark.parametrize("which", ["block", "index"])
def test_special_files_are_refused_before_they_are_opened(
    saved: Path, mesh: shardsim.Mesh, make: Any, kind: str, which: str
) -> None:
    name = entry(saved)["file"] if which == "block" else "index.json"
    (saved / name).unlink()
    make(saved / name)
    got = load_in_thread(saved, mesh)
    assert isinstance(got, CheckpointError), got
    assert f"{name} is {kind}, not a regular file" in str(got)


# -- nothing read or allocated before its size is checked ------------------------------------------
def write_npy_header(path: Path, descr: str, shape: tuple[int, ...], body: bytes = b"") -> None:
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(body)


def test_a_forged_header_is_compared_with_the_index_before_numpy_allocates(saved: Path, mesh: shardsim.Mesh) -> None:
    """A header claiming (10**6, 10**6) float64: today NumPy tries to allocate 7.3 TiB."""
    e = entry(saved)
    path = saved / e["file"]
    size = path.stat().st_size
    write_npy_header(path, "<f8", (10**6, 10**6))
    with open(path, "ab") as f:
        f.write(b"\0" * (size - path.stat().st_size))  # same length as the index says
    sign_as(saved, e["file"], path.read_bytes())
    refused(saved, mesh, "holds float64 (1000000, 1000000), index.json says float32 (4, 4)")


def test_a_forged_index_shape_is_checked_against_the_file_sizes_before_allocating(
    saved: Path, mesh: shardsim.Mesh
) -> None:
    """Index says each block is (10**6, 10**6): today np.empty of the whole value raises MemoryError."""

    def huge(index: dict) -> None:
        index["arrays"]["w"].update(global_shape=[2 * 10**6, 10**6], block_shape=[10**6, 10**6])
        index["arrays"]["w"]["dims"][1] = ["B", []]

    resign(saved, huge)
    refused(saved, mesh, "a float32 block of shape (1000000, 1000000) takes 4000000000000 bytes and a header")


def test_a_pickled_block_is_never_unpickled(saved: Path, mesh: shardsim.Mesh) -> None:
    e = entry(saved)
    path = saved / e["file"]
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    sign_as(saved, e["file"], path.read_bytes())
    refused(saved, mesh, e["file"])


def test_an_oversized_index_is_refused_before_it_is_read(saved: Path, mesh: shardsim.Mesh) -> None:
    with open(saved / "index.json", "ab") as f:
        f.truncate(checkpoint.MAX_INDEX_BYTES + 1)
    refused(saved, mesh, f"index.json is larger than {checkpoint.MAX_INDEX_BYTES} bytes")


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000])
def test_a_deeply_nested_index_is_a_checkpoint_error_not_a_recursion_error(
    saved: Path, mesh: shardsim.Mesh, text: str
) -> None:
    (saved / "index.json").write_text(text)
    refused(saved, mesh, "index.json is nested", "more than the 64 an index may be")


def test_a_deep_tree_in_a_signed_index_is_refused(saved: Path, mesh: shardsim.Mesh) -> None:
    node: dict = {"array": "w"}
    for _ in range(40):
        node = {"dict": {"a": node}}
    resign(saved, lambda i: i.update(tree=node))
    refused(saved, mesh, "index.json is nested")


# -- save replaces only a shardsim checkpoint, and only its own files ------------------------------
@pytest.fixture
def x() -> shardsim.ShardedArray:
    return shardsim.shard(np.ones((4, 2)), shardsim.Mesh(X=2), "A_X B")


def test_save_refuses_a_directory_whose_index_json_is_not_a_checkpoint(tmp_path: Path, x: Any) -> None:
    """Today any directory holding an ``index.json`` is replaced and the user's files deleted."""
    mine = tmp_path / "site"
    mine.mkdir()
    (mine / "index.json").write_text('{"title": "my web site"}')
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError) as e:
        checkpoint.save(mine, {"x": x})
    assert str(e.value) == (
        f"cannot save a checkpoint at {mine}: its index.json is not a shardsim checkpoint's "
        "(no format 'shardsim-checkpoint' and version); refusing to replace it"
    )
    assert (mine / "notes.txt").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["site"]


def test_save_refuses_a_checkpoint_that_also_holds_the_users_files(tmp_path: Path, x: Any) -> None:
    path = checkpoint.save(tmp_path / "c", {"x": x})
    (path / "notes.txt").write_text("mine")
    (path / "results").mkdir()
    with pytest.raises(CheckpointError) as e:
        checkpoint.save(path, {"x": x})
    assert str(e.value) == (
        f"cannot save a checkpoint at {path}: the checkpoint's directory also holds notes.txt, results, "
        "which the checkpoint did not write; refusing to replace it (move them elsewhere first)"
    )
    assert (path / "notes.txt").read_text() == "mine" and (path / "results").is_dir()
    assert same_bits(checkpoint.load(path, x.mesh)["x"].to_global(), np.ones((4, 2)))


def test_save_refuses_a_symbolic_link(tmp_path: Path, x: Any) -> None:
    real = checkpoint.save(tmp_path / "real", {"x": x})
    (tmp_path / "latest").symlink_to(real)
    with pytest.raises(CheckpointError, match=r"latest: it is a symbolic link; save to the directory it points to"):
        checkpoint.save(tmp_path / "latest", {"x": x})
    assert checkpoint.load(tmp_path / "latest", x.mesh)["x"].global_shape == (4, 2)  # loading through it is fine


def test_strays_of_interrupted_saves_are_cleaned_by_the_next_save(tmp_path: Path, x: Any) -> None:
    """Today every interrupted save leaves a full copy behind, forever."""
    path = checkpoint.save(tmp_path / "c", {"x": x})
    for stray in (".c.tmp-0123456789ab", ".c.old-ba9876543210"):
        (tmp_path / stray).mkdir()
        for f in path.iterdir():
            (tmp_path / stray / f.name).write_bytes(f.read_bytes())
    (tmp_path / ".c.tmp-00000000000f").mkdir()
    (tmp_path / ".c.tmp-00000000000f" / "mine.txt").write_text("not a checkpoint's file")
    (tmp_path / ".d.tmp-0123456789ab").mkdir()  # another checkpoint's: not this save's business
    checkpoint.save(path, {"x": x})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".c.tmp-00000000000f", ".d.tmp-0123456789ab", "c"]
    assert [p.name for p in (tmp_path / ".c.tmp-00000000000f").iterdir()] == ["mine.txt"]


# -- a load running beside saves never sees damage -------------------------------------------------
def states(mesh: shardsim.Mesh, n: int) -> list[tuple[np.ndarray, dict]]:
    """``n`` states told apart by their step, a ShardedArray (so that this runs on any version)."""
    out = []
    for k in range(n):
        w = np.random.default_rng(k).standard_normal((16, 8)).astype(np.float32)
        step = shardsim.shard(np.array([k]), mesh, "N")
        out.append((w, {"w": shardsim.shard(w, mesh, "A_X B"), "b": shardsim.shard(w[0], mesh, "B_X"), "step": step}))
    return out


def step_of(state: dict) -> int:
    return int(state["step"].to_global()[0])


def test_a_save_between_reading_the_index_and_the_blocks_is_not_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deterministic: a whole save runs after the loader has read the index of the previous one."""
    from shardsim.checkpoint import _load

    mesh = shardsim.Mesh(X=4)
    (_, s0), (w1, s1) = states(mesh, 2)
    path = checkpoint.save(tmp_path / "c", s0)
    real, saves = _load._stat_block, []

    def save_in_between(*args: Any) -> Any:
        if not saves:
            saves.append(checkpoint.save(path, s1))
        return real(*args)

    monkeypatch.setattr(_load, "_stat_block", save_in_between)
    got = checkpoint.load(path, mesh)
    assert saves and step_of(got) == 1 and same_bits(got["w"].to_global(), w1)


def test_loads_beside_a_thread_that_keeps_saving_see_whole_checkpoints(tmp_path: Path) -> None:
    """Today loads raced with saves report missing blocks or no checkpoint at all."""
    mesh = shardsim.Mesh(X=4)
    pool = states(mesh, 3)
    path = checkpoint.save(tmp_path / "c", pool[0][1])
    stop, errors, saves = threading.Event(), [], [0]

    def keep_saving() -> None:
        while not stop.is_set():
            saves[0] += 1
            try:
                checkpoint.save(path, pool[saves[0] % 3][1])
            except BaseException as e:  # reported by the test
                errors.append(e)
                return

    saver = threading.Thread(target=keep_saving, daemon=True)
    saver.start()
    seen, loads, deadline = set(), 0, time.monotonic() + 60
    try:
        while (saves[0] < 10 or loads < 50) and time.monotonic() < deadline and not errors:
            loads += 1
            got = checkpoint.load(path, mesh)
            w, _ = pool[step_of(got)]
            assert same_bits(got["w"].to_global(), w) and same_bits(got["b"].to_global(), w[0])
            seen.add(step_of(got))
    finally:
        stop.set()
        saver.join()
    assert errors == [] and saves[0] >= 10 and len(seen) > 1  # the loads did run beside many saves


# -- every value that saves, loads -----------------------------------------------------------------
DTYPES = ["bool", "int8", "uint8", "int16", "uint64", "float16", "bfloat16", "float32", "float64"]
DTYPES += ["complex64", "complex128"]


def some(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(5)
    dt = shardsim.dtypes.resolve_dtype(dtype)
    return rng.integers(0, 256, (*shape, dt.itemsize), dtype=np.uint8).view(dt).reshape(shape)  # any bits


@pytest.mark.parametrize("dtype", DTYPES)
def test_unusual_dtypes_round_trip_bit_for_bit(tmp_path: Path, dtype: str) -> None:
    full = some(dtype, (4, 6))
    x = shardsim.shard(full, shardsim.Mesh(X=2), "A_X B")
    path = checkpoint.save(tmp_path / "c", {"x": x})
    assert same_bits(checkpoint.load(path, x.mesh)["x"].to_global(), full)
    moved = checkpoint.load(path, shardsim.Mesh(Y=3), layouts={"x": "A B_Y"})["x"]
    assert same_bits(moved.to_global(), full)


def test_a_dtype_that_would_not_read_back_is_refused_at_save(tmp_path: Path) -> None:
    full = np.arange(4, dtype=">f4")  # big-endian: its name reads back as the native float32
    x = shardsim.ShardedArray(shardsim.Mesh(X=2), Layout.parse("A_X"), (4,), full.dtype, full.reshape(2, 2))
    with pytest.raises(CheckpointError, match=r"dtype >f4 \(float32\) would not read back as itself"):
        checkpoint.save(tmp_path / "c", {"x": x})
    assert list(tmp_path.iterdir()) == []


def layout(*dims: tuple[str, tuple[str, ...]], partial: tuple[str, ...] = ()) -> Layout:
    return Layout(tuple(Dim(n, a) for n, a in dims), partial)


@pytest.mark.parametrize(
    ("axes", "lay", "shape"),
    [
        ({"X": 2}, layout(), ()),  # rank 0
        ({"data": 2, "model": 2}, layout(("B", ("data",)), ("D", ("model",))), (4, 4)),
        ({"αβ": 2}, layout(("B", ("αβ",))), (4,)),
        ({"X": 2, "Y": 2, "XY": 2}, layout(("A", ("X", "Y")), ("B", ("XY",))), (4, 4)),
        ({"X": 2, "Y": 2, "XY": 2}, layout(("A", ("XY",)), ("B", ("Y",))), (4, 4)),
        ({"X": 2, "Y": 3, "XY": 2}, layout(("A", ("Y", "X")), ("B", ())), (6, 2)),
    ],
)
def test_layouts_that_do_not_spell_apart_round_trip(
    tmp_path: Path, axes: dict, lay: Layout, shape: tuple[int, ...]
) -> None:
    """Rank 0, words and non-ASCII axis names, X and Y beside XY: today these load wrongly or not at all."""
    mesh = shardsim.Mesh(axes)
    full = np.arange(math.prod(shape), dtype=np.float64).reshape(shape)
    x = shardsim.shard(full, mesh, lay)
    path = checkpoint.save(tmp_path / "c", {"x": x})
    y = checkpoint.load(path, mesh)["x"]
    assert y.layout == lay and same_bits(np.asarray(y.blocks()), np.asarray(x.blocks()))
    z = checkpoint.load(path, shardsim.Mesh(Z=2), layouts={"x": Layout(tuple(Dim(d.name) for d in lay.dims))})["x"]
    assert same_bits(z.to_global(), full)


def test_a_partial_sum_over_words_round_trips(tmp_path: Path) -> None:
    mesh = shardsim.Mesh(data=2, model=2)
    blocks = np.random.default_rng(1).standard_normal((2, 2, 3))
    p = shardsim.from_local(blocks, mesh, layout(("A", ("data",)), partial=("model",)))
    q = checkpoint.load(checkpoint.save(tmp_path / "c", {"p": p}), mesh)["p"]
    assert q.layout == p.layout and same_bits(np.asarray(q.blocks()), np.asarray(p.blocks()))


def test_values_held_only_by_failed_chips_are_refused_at_save(tmp_path: Path) -> None:
    mesh = shardsim.Mesh(X=2, Y=2)
    x = shardsim.shard(np.arange(8.0), mesh, "A_X")  # the X1 half lives on (X1,Y0) and (X1,Y1)
    mesh.fail(X=1, Y=0)
    path = checkpoint.save(tmp_path / "one", {"x": x})  # (X1,Y1) still holds it
    mesh.fail(X=1, Y=1)
    with pytest.raises(shardsim.ChipFailureError) as e:
        checkpoint.save(tmp_path / "two", {"x": x})
    assert str(e.value).startswith(
        "cannot save 'x' (array[A_X] (8,)): its block (X1,Y*) is held only by failed chips "
        "(failed: (X1,Y0) (X1,Y1)); its data is lost."
    )
    assert not (tmp_path / "two").exists()
    assert same_bits(checkpoint.load(path, shardsim.Mesh(X=2))["x"].to_global(), np.arange(8.0))


# -- every I/O failure is a CheckpointError naming the path and the cause --------------------------
def test_save_into_a_path_below_a_file(tmp_path: Path, x: Any) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(CheckpointError, match=rf"^cannot write checkpoint {tmp_path}/f/c: {tmp_path}/f is a file, not"):
        checkpoint.save(tmp_path / "f" / "c", {"x": x})
    with pytest.raises(CheckpointError, match=rf"^cannot write checkpoint {tmp_path}/f/c/d: \[Errno 20\] Not a dir"):
        checkpoint.save(tmp_path / "f" / "c" / "d", {"x": x})
    with pytest.raises(CheckpointError, match=rf"^cannot save a checkpoint at {tmp_path}/f: it is a file"):
        checkpoint.save(tmp_path / "f", {"x": x})
    with pytest.raises(CheckpointError, match=rf"^no checkpoint at {tmp_path}/f: it is not a directory$"):
        checkpoint.load(tmp_path / "f", x.mesh)


def test_names_too_long_and_nul_bytes(tmp_path: Path, x: Any) -> None:
    """Today these escape as a bare OSError (ENAMETOOLONG) and ValueError (embedded null byte)."""
    long = tmp_path / ("n" * 300)
    with pytest.raises(CheckpointError, match=rf"^cannot write checkpoint {long}: \[Errno 36\] File name too long$"):
        checkpoint.save(long, {"x": x})
    with pytest.raises(CheckpointError, match=r"\[Errno 36\] File name too long$"):
        checkpoint.load(long, x.mesh)
    with pytest.raises(CheckpointError, match=r"^cannot write checkpoint '.*/a\\x00b': the path contains a NUL byte$"):
        checkpoint.save(str(tmp_path / "a\0b"), {"x": x})
    with pytest.raises(CheckpointError, match=r"^cannot read checkpoint '.*/a\\x00b': the path contains a NUL byte$"):
        checkpoint.load(str(tmp_path / "a\0b"), x.mesh)
    with pytest.raises(CheckpointError, match=r"^a checkpoint path is a str or os.PathLike, got int$"):
        checkpoint.save(3, {"x": x})  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_permission_denied(tmp_path: Path, x: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated (the tests may run as root, whom file modes do not stop)."""
    real_mkdir = os.mkdir

    def denied(path: Any, *args: Any, **kw: Any) -> None:
        if "locked" in str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        real_mkdir(path, *args, **kw)

    monkeypatch.setattr(os, "mkdir", denied)
    with pytest.raises(CheckpointError, match=r"^cannot write checkpoint .*/locked/c: \[Errno 13\] Permission denied$"):
        checkpoint.save(tmp_path / "locked" / "c", {"x": x})
    monkeypatch.undo()
    path = checkpoint.save(tmp_path / "c", {"x": x})
    file = entry(path, "x")["file"]
    real_open = os.open

    def unreadable(name: Any, flags: int, *args: Any, **kw: Any) -> int:
        if str(name) == file:
            raise PermissionError(errno.EACCES, "Permission denied", str(name))
        return real_open(name, flags, *args, **kw)

    monkeypatch.setattr(os, "open", unreadable)
    with pytest.raises(CheckpointError) as e:
        checkpoint.load(path, x.mesh)
    assert str(e.value) == (
        f"checkpoint {path}: array 'x', block on chip (X0): cannot read file {file}: [Errno 13] Permission denied"
    )


def test_a_full_disk_leaves_the_previous_checkpoint(tmp_path: Path, x: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardsim import _files

    path = checkpoint.save(tmp_path / "c", {"x": x})
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    written = []
    real = _files.write_all

    def fills_up(fd: int, data: Any) -> None:
        written.append(len(memoryview(data)))
        if len(written) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(_files, "write_all", fills_up)
    with pytest.raises(CheckpointError) as e:
        checkpoint.save(path, {"x": x, "y": x})
    assert str(e.value) == f"cannot write checkpoint {path}: [Errno 28] No space left on device"
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def test_save_refuses_to_replace_a_read_only_checkpoint_up_front(
    tmp_path: Path, x: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulated through ``os.access`` (root, whom file modes do not stop, may run the tests)."""
    path = checkpoint.save(tmp_path / "c", {"x": x})
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == path else real(p, mode, **kw))
    made = []
    real_mkdir = os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda p, *a, **kw: (made.append(p), real_mkdir(p, *a, **kw))[1])
    with pytest.raises(CheckpointError) as e:
        checkpoint.save(path, {"x": 2 * x})
    assert str(e.value) == (
        f"cannot save a checkpoint at {path}: the directory is read-only, so the checkpoint there cannot be "
        f"replaced; make it writable (chmod u+w {path}) or save elsewhere"
    )
    assert not [p for p in made if ".tmp-" in str(p)]  # refused before anything was written
    assert [p.name for p in tmp_path.iterdir()] == ["c"]
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before


@pytest.mark.skipif(os.geteuid() == 0, reason="file modes do not stop root")
def test_save_over_a_checkpoint_made_read_only_leaves_no_temporary_directory(tmp_path: Path, x: Any) -> None:
    path = checkpoint.save(tmp_path / "c", {"x": x})
    path.chmod(0o555)
    try:
        with pytest.raises(CheckpointError, match="read-only"):
            checkpoint.save(path, {"x": 2 * x})
    finally:
        path.chmod(0o755)
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def _denied_on_tmp(real: Any) -> Any:
    """``real``, failing with EACCES when its first argument names a save's temporary directory."""

    def call(name: Any, *args: Any, **kw: Any) -> Any:
        if ".tmp-" in str(name):
            raise PermissionError(errno.EACCES, "Permission denied", str(name))
        return real(name, *args, **kw)

    return call


def _enospc(*args: Any, **kw: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


# (module, attribute, replacement) triples failed together: each is a way a save can fail once its
# temporary directory exists, with the cleanup's own calls failing where the fault would fail them
SAVE_FAULTS = {
    "the temporary directory cannot be opened": [(os, "open", _denied_on_tmp)],
    "the disk fills and the directory cannot be listed": [("_files", "write_all", lambda real: _enospc),
                                                          (os, "listdir", _denied_on_tmp)],
    "the parent turns read-only before the swap": [(os, "rename", _denied_on_tmp),
                                                   ("_files", "exchange", _denied_on_tmp)],
    "the disk fills": [("_files", "write_all", lambda real: _enospc)],
    "fsync fails": [(os, "fsync", lambda real: _enospc)],
}  # fmt: skip


@pytest.mark.parametrize("over", [False, True], ids=["first save", "over a checkpoint"])
@pytest.mark.parametrize("fault", sorted(SAVE_FAULTS))
def test_a_failed_save_leaves_no_temporary_directory(
    tmp_path: Path, x: Any, monkeypatch: pytest.MonkeyPatch, fault: str, over: bool
) -> None:
    from shardsim import _files

    path = tmp_path / "c"
    if over:
        checkpoint.save(path, {"x": x})
    before = {p.name: p.read_bytes() for p in path.iterdir()} if over else None
    for module, name, fail in SAVE_FAULTS[fault]:
        target = _files if module == "_files" else module
        monkeypatch.setattr(target, name, fail(getattr(target, name)))
    with pytest.raises(CheckpointError, match=rf"^cannot write checkpoint {path}: "):
        checkpoint.save(path, {"x": 2 * x, "y": x})
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == (["c"] if over else [])
    if over:
        assert {p.name: p.read_bytes() for p in path.iterdir()} == before
        assert same_bits(checkpoint.load(path, x.mesh)["x"].to_global(), x.to_global())


# -- plain values beside sharded ones --------------------------------------------------------------
def test_plain_scalars_and_metadata_round_trip_with_their_types(tmp_path: Path, x: Any) -> None:
    meta = {
        "step": 1,
        "lr": 0.1,
        "neg_zero": -0.0,
        "nan": float("nan"),
        "inf": float("-inf"),
        "done": False,
        "name": "run αβ \x00 \udcff",
        "none": None,
        "big": 2**100,
        "schedule": [1, 2.5, "cosine", None, [True, {"warmup": 10}]],
        "shape": (4, 2),
        "empty": {"list": [], "tuple": (), "dict": {}},
    }
    path = checkpoint.save(tmp_path / "c", {**meta, "weights": {"x": x, "layers": [x, {"b": x}]}})
    got = checkpoint.load(path, x.mesh)

    def same(a: Any, b: Any) -> bool:
        if type(a) is not type(b):
            return False
        if isinstance(a, dict):
            return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(u, v) for u, v in zip(a, b))
        if isinstance(a, float):
            return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
        return bool(a == b)

    assert same({k: got[k] for k in meta}, meta)
    layers = got["weights"]["layers"]
    assert type(layers) is list and same_bits(layers[1]["b"].to_global(), np.ones((4, 2)))
    assert checkpoint.load(path, x.mesh, layouts={"weights/layers/0": "A B_X"})["weights"]["layers"][0].local_shape == (
        4,
        1,
    )


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (np.float32(1), "is a float32"),
        (np.int64(3), "is a int64"),
        ({1, 2}, "is a set"),
        (b"raw", "is a bytes"),
        (10**1001, "is an int of more than 1000 digits"),
    ],
    ids=["float32", "int64", "set", "bytes", "huge-int"],
)
def test_values_that_would_not_read_back_as_themselves_are_refused(
    tmp_path: Path, x: Any, value: Any, words: str
) -> None:
    with pytest.raises(CheckpointError, match=rf"^checkpoint value 'meta/v' {words}"):
        checkpoint.save(tmp_path / "c", {"x": x, "meta": {"v": value}})
    assert list(tmp_path.iterdir()) == []


def test_a_state_that_contains_itself_is_refused(tmp_path: Path, x: Any) -> None:
    """Today this is a RecursionError."""
    state: dict = {"x": x}
    state["self"] = state
    with pytest.raises(CheckpointError, match=r"is nested more than 24 levels deep \(or contains itself\)"):
        checkpoint.save(tmp_path / "c", state)


# -- property: damage of every kind -----------------------------------------------------------------
DAMAGE = ["truncate", "flip", "substitute", "link_out", "link_in", "hardlink_out", "fifo", "directory", "empty"]


@seed(2026)
@budget(60)
@given(
    kind=st.sampled_from(DAMAGE),
    which=st.integers(0, 10**6),
    where=st.floats(0, 1, exclude_max=True),
    bit=st.integers(0, 7),
    resigned=st.booleans(),
)
def test_damaged_checkpoints_load_exactly_or_raise_a_checkpoint_error(
    tmp_path_factory: pytest.TempPathFactory, kind: str, which: int, where: float, bit: int, resigned: bool
) -> None:
    """Truncations, bit flips, files swapped, links, FIFOs: the original bits or a CheckpointError.

    With ``resigned`` the attacker also rewrites the index to match a truncated or linked
    file's size and checksum. An outside file must never be read: its contents never come back and nothing
    of it appears in the message.
    """
    tmp = tmp_path_factory.mktemp("damage")
    mesh = shardsim.Mesh(X=2, Y=2)
    full = np.arange(64, dtype=np.float32).reshape(8, 8)
    state = {"w": shardsim.shard(full, mesh, "A_X B_Y"), "b": shardsim.shard(full[0], mesh, "B_Y"), "step": 3}
    path = checkpoint.save(tmp / "c", state)
    outside = tmp / "elsewhere_zq"
    outside.mkdir()
    secret = outside / "hidden_zq.npy"
    np.save(secret, np.full((4, 4), 7.0, np.float32))
    before_outside = secret.read_bytes()
    files = sorted(p.name for p in path.iterdir())
    name = files[which % len(files)]
    target = path / name
    data = target.read_bytes()
    if kind == "truncate":
        target.write_bytes(data[: int(where * len(data))])
    elif kind == "flip":
        k = int(where * len(data))
        target.write_bytes(data[:k] + bytes([data[k] ^ (1 << bit)]) + data[k + 1 :])
    elif kind == "substitute":
        other = files[(which + 1) % len(files)]
        target.write_bytes((path / other).read_bytes())
    elif kind == "empty":
        target.write_bytes(b"")
    else:
        target.unlink()
        if kind == "link_out":
            target.symlink_to(secret)
        elif kind == "link_in":
            target.symlink_to(files[(which + 1) % len(files)])
        elif kind == "hardlink_out":
            os.link(secret, target)
        elif kind == "fifo":
            os.mkfifo(target)
        else:
            target.mkdir()
    # Re-signing a flipped or substituted block would make it a valid checkpoint of other data;
    # re-signed truncations and outside links must still be refused.
    if resigned and name != "index.json" and kind in ("truncate", "link_out", "hardlink_out"):
        sign_as(path, name, secret.read_bytes() if kind in ("link_out", "hardlink_out") else target.read_bytes())
    target_mesh = shardsim.Mesh(X=2, Y=2)
    got = load_in_thread(path, target_mesh)
    assert got is not None, "load hung"
    if isinstance(got, CheckpointError):
        message = str(got)
        assert "_zq" not in message and hashlib.sha256(before_outside).hexdigest()[:8] not in message
        assert not target_mesh.memory.live().any()
    else:
        assert isinstance(got, dict), got
        assert got["step"] == 3
        assert same_bits(got["w"].to_global(), full) and same_bits(got["b"].to_global(), full[0])
    assert secret.read_bytes() == before_outside and sorted(os.listdir(outside)) == ["hidden_zq.npy"]


# -- property: a save killed at any moment leaves a whole checkpoint --------------------------------
CHILD = """
import sys, numpy as np, shardsim
from shardsim import checkpoint
mesh = shardsim.Mesh(X=8)
states = [{"w": shardsim.shard(np.full((64, 256), float(k)), mesh, "A_X B"), "k": k} for k in (1, 2)]
print("ready", flush=True)
k = 0
while True:
    checkpoint.save(sys.argv[1], states[k % 2])
    k += 1
"""


@seed(7)
@budget(4)
@given(delay=st.floats(0.0, 0.25))
def test_a_save_killed_at_any_moment_leaves_a_whole_checkpoint(
    tmp_path_factory: pytest.TempPathFactory, delay: float
) -> None:
    """SIGKILL a process that keeps saving: the checkpoint is always the old or the new one, whole."""
    tmp = tmp_path_factory.mktemp("kill")
    mesh = shardsim.Mesh(X=8)
    path = checkpoint.save(tmp / "c", {"w": shardsim.shard(np.zeros((64, 256)), mesh, "A_X B"), "k": 0})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        time.sleep(delay)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    got = checkpoint.load(path, mesh)
    assert got["k"] in (0, 1, 2)
    assert same_bits(got["w"].to_global(), np.full((64, 256), float(got["k"])))
    checkpoint.save(path, {"k": 9})  # the next save sweeps what the killed one left
    assert os.listdir(tmp) == ["c"] and checkpoint.load(path, mesh) == {"k": 9}


# -- property: every value that saves, loads as itself ----------------------------------------------
AXIS_NAMES = ["X", "Y", "XY", "data", "model", "αβ", "pipe"]
plain = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=8),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(min_size=1, max_size=4).filter(lambda k: "/" not in k), inner, max_size=3),
    ),
    max_leaves=10,
)


def identical(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down; NaN equals NaN, -0.0 is not 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(identical(u, v) for u, v in zip(a, b))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return bool(a == b)


@seed(11)
@budget(40)
@given(data=st.data(), meta=plain)
def test_any_value_and_any_axis_names_round_trip_exactly(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, meta: Any
) -> None:
    names = data.draw(st.lists(st.sampled_from(AXIS_NAMES), min_size=1, max_size=3, unique=True), "axes")
    mesh = shardsim.Mesh({a: data.draw(st.integers(1, 3)) for a in names})
    rank = data.draw(st.integers(0, 2), "rank")
    slots: list[list[str]] = [[] for _ in range(rank)]
    for a in data.draw(st.permutations(names)):
        where = data.draw(st.integers(-1, rank - 1))
        if where >= 0:
            slots[where].append(a)
    lay = Layout(tuple(Dim("ABC"[i], tuple(s)) for i, s in enumerate(slots)))
    shape = tuple(math.prod(mesh.axis_size(a) for a in s) * data.draw(st.integers(0, 2)) for s in slots)
    full = some(data.draw(st.sampled_from(DTYPES), "dtype"), shape)
    x = shardsim.shard(full, mesh, lay)
    path = checkpoint.save(tmp_path_factory.mktemp("any") / "c", {"x": x, "meta": meta})
    got = checkpoint.load(path, mesh)
    assert got["x"].layout == lay and same_bits(np.asarray(got["x"].blocks()), np.asarray(x.blocks()))
    assert identical(got["meta"], meta)
    other = checkpoint.load(path, shardsim.Mesh(Q=2), layouts={"x": Layout(tuple(Dim(d.name) for d in lay.dims))})
    assert same_bits(other["x"].to_global(), full)
