"""Sharded checkpoints: every distinct block in its own ``.npy`` file, a JSON index, atomic writes.

``save(directory, state)`` writes each value of ``state`` (a dict of names to ShardedArrays;
nested dicts become names joined with ``/``) as one ``.npy`` file per *distinct* block: a
value replicated over an axis is stored once for that axis, not once per chip, because
every chip along it holds the same bytes. ``index.json`` records, per value, its layout,
the mesh axes and shape it was saved from, the global shape, the dtype and, per block, the
file, the chip that holds it (``*`` for an axis it is replicated over), its size and its
SHA-256.

``load(directory, mesh, layouts=None)`` checks every block (present, full length, checksum,
shape, dtype) before it builds any value, then places the values on ``mesh``: with the
saved layout by default, or with ``layouts[name]``. When the mesh and layout are those it
was saved with, the blocks go back as they were (partial sums too); otherwise the global
array is assembled on the host and split anew, the way a restore onto a new topology reads
what each chip needs from storage.

A save writes into a fresh directory next to the target and renames it into place, so an
interrupted save leaves the previous checkpoint as it was.

>>> import tempfile, numpy as np, shardsim
>>> from shardsim import checkpoint
>>> w = shardsim.shard(np.arange(64.0).reshape(8, 8), shardsim.Mesh(X=8), "D_X F").named("W_in")
>>> path = tempfile.mkdtemp() + "/step1"
>>> _ = checkpoint.save(path, {"mlp": {"W_in": w}})
>>> state = checkpoint.load(path, shardsim.Mesh(X=2, Y=2), layouts={"mlp/W_in": "[D_X, F_Y]"})
>>> state["mlp"]["W_in"]
ShardedArray(W_in[D_X, F_Y] float64 (8, 8) on Mesh(X=2, Y=2), local (4, 4))
>>> bool((state["mlp"]["W_in"].to_global() == w.to_global()).all())
True
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .array import ShardedArray, compact_shape, local_shape_of, shard
from .dtypes import resolve_dtype
from .errors import CheckpointError, ShardsimError
from .layout import Layout
from .mesh import Mesh
from .resharding import global_from_compact

__all__ = ["FORMAT", "INDEX", "load", "read_index", "save"]

INDEX = "index.json"
FORMAT = "shardsim-checkpoint"
VERSION = 1

State = Mapping[str, Any]


# -- save -------------------------------------------------------------------------------------
def save(directory: str | os.PathLike[str], state: State) -> Path:
    """Write ``state`` (names to ShardedArrays, nested dicts allowed) as a checkpoint at ``directory``.

    Replaces a previous checkpoint there atomically; refuses to replace a directory that
    holds anything else. Returns the checkpoint's path.

    >>> import tempfile, numpy as np, shardsim
    >>> from shardsim import checkpoint
    >>> x = shardsim.shard(np.ones((4, 2), np.float32), shardsim.Mesh(X=2, Y=2), "B_X D")
    >>> path = checkpoint.save(tempfile.mkdtemp() + "/ckpt", {"x": x})
    >>> sorted(p.name for p in path.iterdir())  # replicated over Y: one block per X
    ['index.json', 'x.X0.npy', 'x.X1.npy']
    """
    root = Path(os.path.abspath(directory))  # "." or "ckpt/" name a directory that can be renamed
    flat, tree = _flatten(state)
    _check_target(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.tmp-{uuid.uuid4().hex[:12]}"
    os.mkdir(tmp)
    try:
        index = {
            "format": FORMAT,
            "version": VERSION,
            "tree": tree,
            "arrays": {},
        }
        taken: set[str] = set()
        for name, x in flat.items():
            index["arrays"][name] = _save_array(tmp, name, x, taken)
        index["sha256"] = _index_digest(index)
        data = json.dumps(index, indent=1).encode()
        _write_file(tmp / INDEX, data)
        _fsync_dir(tmp)
        _swap_into_place(tmp, root)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"cannot write checkpoint {root}: {e}") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root


def _save_array(tmp: Path, name: str, x: ShardedArray, taken: set[str]) -> dict[str, Any]:
    if x.is_shape_only:
        raise CheckpointError(f"cannot save {name!r} ({x.describe()}): it is shape-only, it has no data")
    compact = x.compact()
    mesh = x.mesh
    dtype_name = x.dtype.name
    stored = compact
    if x.dtype.kind == "V":  # bfloat16 (ml_dtypes): stored as raw unsigned ints of its width
        stored = compact.view(np.dtype(f"u{x.dtype.itemsize}"))
    varying = [a in x.layout.used_axes() for a in mesh.axis_names]
    indices = list(itertools.product(*(range(n) for n in compact.shape[: len(mesh.shape)])))
    tags = [".".join(f"{a}{i}" for a, i, v in zip(mesh.axis_names, index, varying) if v) or "all" for index in indices]
    files = _file_names(name, tags, taken)
    blocks = []
    for index, file in zip(indices, files):
        digest, size = _write_block(tmp / file, stored[index])
        blocks.append(
            {
                "file": file,
                "chip": {a: (i if v else "*") for a, i, v in zip(mesh.axis_names, index, varying)},
                "bytes": size,
                "sha256": digest,
            }
        )
    return {
        "layout": str(x.layout),
        "mesh": {"axes": list(mesh.axis_names), "shape": list(mesh.shape)},
        "global_shape": list(x.global_shape),
        "dtype": dtype_name,
        "stored_dtype": stored.dtype.name,
        "block_shape": list(x.local_shape),
        "label": x.label,
        "category": x.category,
        "blocks": blocks,
    }


def _write_block(path: Path, block: np.ndarray) -> tuple[str, int]:
    """Write one block as ``.npy``; return its SHA-256 and size in bytes."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(block), allow_pickle=False)
    data = buf.getvalue()
    _write_file(path, data)
    return hashlib.sha256(data).hexdigest(), len(data)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _check_target(root: Path) -> None:
    if not root.exists():
        return
    if not root.is_dir():
        raise CheckpointError(f"cannot save a checkpoint at {root}: it is a file, not a directory")
    if any(root.iterdir()) and not (root / INDEX).is_file():
        raise CheckpointError(
            f"cannot save a checkpoint at {root}: the directory holds files but no {INDEX}, so it is "
            "not a shardsim checkpoint; refusing to replace it"
        )


def _swap_into_place(tmp: Path, root: Path) -> None:
    """Rename ``tmp`` to ``root``; an existing ``root`` is moved aside first, then deleted."""
    if not root.exists():
        os.replace(tmp, root)
        _fsync_dir(root.parent)
        return
    old = root.parent / f".{root.name}.old-{uuid.uuid4().hex[:12]}"
    os.rename(root, old)
    try:
        os.rename(tmp, root)
    except BaseException:
        os.rename(old, root)
        raise
    _fsync_dir(root.parent)
    shutil.rmtree(old, ignore_errors=True)


def _flatten(state: Any, prefix: str = "") -> tuple[dict[str, ShardedArray], dict[str, Any]]:
    if not isinstance(state, Mapping):
        raise CheckpointError(f"a checkpoint state is a dict of names to ShardedArrays, got {type(state).__name__}")
    flat: dict[str, ShardedArray] = {}
    tree: dict[str, Any] = {}
    for key, value in state.items():
        if not isinstance(key, str) or not key or "/" in key:
            raise CheckpointError(
                f"checkpoint key {prefix + str(key)!r}: keys are non-empty strings without '/' "
                "(nested dicts are joined with '/')"
            )
        name = prefix + key
        if isinstance(value, Mapping):
            sub_flat, tree[key] = _flatten(value, name + "/")
            flat.update(sub_flat)
        elif isinstance(value, ShardedArray):
            flat[name] = value
            tree[key] = name
        else:
            raise CheckpointError(f"checkpoint value {name!r} is a {type(value).__name__}, not a ShardedArray")
    return flat, tree


def _file_names(name: str, tags: list[str], taken: set[str]) -> list[str]:
    """``mlp.W_in.X3.npy``: readable, and unique even on case-insensitive file systems."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", name.replace("/", ".")).strip("._") or "array"
    candidate, n = stem, 1
    while any(f"{candidate}.{t}.npy".lower() in taken for t in tags):
        n += 1
        candidate = f"{stem}~{n}"
    files = [f"{candidate}.{t}.npy" for t in tags]
    taken.update(f.lower() for f in files)
    return files


# -- load -------------------------------------------------------------------------------------
@dataclass
class _Ready:
    """A value whose blocks are all read and checked, waiting to be placed on the mesh."""

    name: str
    axes: tuple[str, ...]
    compact: np.ndarray
    saved: Layout
    target: Layout
    global_shape: tuple[int, ...]
    dtype: np.dtype
    label: str
    category: str
    same_placement: bool


def read_index(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint's parsed ``index.json`` (layouts, meshes, shapes, dtypes, blocks).

    >>> import tempfile, numpy as np, shardsim
    >>> from shardsim import checkpoint
    >>> x = shardsim.shard(np.ones(4), shardsim.Mesh(X=2), "B_X")
    >>> info = checkpoint.read_index(checkpoint.save(tempfile.mkdtemp() + "/c", {"x": x}))
    >>> info["arrays"]["x"]["layout"], [b["chip"] for b in info["arrays"]["x"]["blocks"]]
    ('[B_X]', [{'X': 0}, {'X': 1}])
    """
    root = Path(directory)
    path = root / INDEX
    if not root.is_dir():
        hint = ""
        left = sorted(root.parent.glob(f".{root.name}.old-*")) if root.parent.is_dir() else []
        if left:
            hint = f"; a save was interrupted while swapping directories: the previous checkpoint is at {left[-1]}"
        raise CheckpointError(f"no checkpoint at {root}: the directory does not exist{hint}")
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{root} is not a shardsim checkpoint: {INDEX} is missing") from None
    try:
        index = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint {root}: {INDEX} is corrupt: {e}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise CheckpointError(f"{root} is not a shardsim checkpoint: {INDEX} lacks format {FORMAT!r}")
    if index.get("version") != VERSION:
        raise CheckpointError(
            f"checkpoint {root} has format version {index.get('version')!r}; this shardsim reads version {VERSION}"
        )
    if index.get("sha256") != _index_digest(index):
        raise CheckpointError(f"checkpoint {root}: {INDEX} is corrupt: its contents do not match its SHA-256")
    if not isinstance(index.get("arrays"), dict) or not isinstance(index.get("tree"), dict):
        raise CheckpointError(f"checkpoint {root}: {INDEX} is malformed (no 'arrays' or 'tree')")
    return index


def _index_digest(index: Mapping[str, Any]) -> str:
    """SHA-256 of the index without its own checksum, in a canonical JSON form."""
    body = {k: v for k, v in index.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def load(directory: str | os.PathLike[str], mesh: Mesh, layouts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Read the checkpoint at ``directory`` onto ``mesh``; the same nested dicts as were saved.

    ``layouts`` maps names (``"mlp/W_in"``, or nested dicts like the state) to target
    layouts; the others keep their saved layout, which must then fit ``mesh``. A missing,
    truncated or corrupt block, or a layout that does not fit, raises
    :class:`~shardsim.CheckpointError` naming the file and the block, before any value is built.

    >>> import tempfile, numpy as np, shardsim
    >>> from shardsim import checkpoint
    >>> x = shardsim.shard(np.arange(8.0), shardsim.Mesh(X=4), "B_X").named("x")
    >>> path = checkpoint.save(tempfile.mkdtemp() + "/c", {"x": x})
    >>> checkpoint.load(path, shardsim.Mesh(X=2))["x"].local(X=1)
    array([4., 5., 6., 7.])
    """
    root = Path(directory)
    if not isinstance(mesh, Mesh):
        raise CheckpointError(f"load needs a shardsim.Mesh to place the values on, got {type(mesh).__name__}")
    index = read_index(root)
    arrays: dict[str, Any] = index["arrays"]
    wanted = _flat_layouts(layouts)
    unknown = [n for n in wanted if n not in arrays]
    if unknown:
        raise CheckpointError(
            f"checkpoint {root}: layouts name {unknown}, which the checkpoint does not hold; it holds {sorted(arrays)}"
        )
    _check_tree(root, index["tree"], arrays)
    ready = [_read_array(root, name, meta, mesh, wanted.get(name)) for name, meta in arrays.items()]
    # Everything is read and checked: only now build the values.
    built: dict[str, ShardedArray] = {}
    try:
        for r in ready:
            built[r.name] = _place(r, mesh)
    except BaseException:
        built.clear()  # e.g. OutOfMemoryError on the third value: release the first two
        raise
    return _unflatten(index["tree"], built)


def _flat_layouts(layouts: Mapping[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    if layouts is None:
        return {}
    if not isinstance(layouts, Mapping):
        raise CheckpointError(f"layouts maps names to layouts, got {type(layouts).__name__}")
    out: dict[str, Any] = {}
    for key, value in layouts.items():
        name = prefix + str(key)
        if isinstance(value, Mapping):
            out.update(_flat_layouts(value, name + "/"))
        else:
            out[name] = value
    return out


def _read_array(root: Path, name: str, meta: Any, mesh: Mesh, wanted: Any) -> _Ready:
    where = f"checkpoint {root}: array {name!r}"
    try:
        axes = tuple(str(a) for a in meta["mesh"]["axes"])
        sizes = tuple(int(n) for n in meta["mesh"]["shape"])
        saved_mesh = Mesh(dict(zip(axes, sizes)))
        if (saved_mesh.axis_names, saved_mesh.shape) != (axes, sizes):
            raise ValueError(f"mesh axes {list(axes)} and shape {list(sizes)} do not pair up")
        saved = Layout.parse(meta["layout"], axes).validate(axes)
        global_shape = tuple(int(n) for n in meta["global_shape"])
        dtype_name = str(meta["dtype"])
        stored_dtype = np.dtype(str(meta["stored_dtype"]))
        block_shape = tuple(int(n) for n in meta["block_shape"])
        blocks = list(meta["blocks"])
        label = meta.get("label") or name.rsplit("/", 1)[-1]
        category = str(meta.get("category") or "activations")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{where}: its entry in {INDEX} is malformed ({type(e).__name__}: {e})") from None
    try:
        dtype = resolve_dtype(dtype_name)
    except ShardsimError as e:
        raise CheckpointError(f"{where} has dtype {dtype_name}: {e}") from None
    if stored_dtype.itemsize != dtype.itemsize or stored_dtype.kind == "O":
        raise CheckpointError(f"{where}: {INDEX} stores dtype {dtype} as {stored_dtype}, which cannot hold it")
    target = _target_layout(where, saved, saved_mesh, mesh, wanted, global_shape)
    # Expected blocks: one per index over the axes the saved value varies along.
    cshape = compact_shape(saved_mesh, saved, block_shape)
    nm = len(axes)
    varying = tuple(a in saved.used_axes() for a in axes)
    try:
        fits = local_shape_of(saved_mesh, saved, global_shape) == block_shape
    except ShardsimError:
        fits = False
    if not fits:
        raise CheckpointError(f"{where}: block shape {block_shape} does not match {saved} of {global_shape}")
    expected = set(itertools.product(*(range(n) for n in cshape[:nm])))
    compact = np.empty(cshape, stored_dtype)
    seen: set[tuple[int, ...]] = set()
    for entry in blocks:
        chip, idx = _block_index(where, entry, axes, varying)
        what = f"{where}, block on chip {chip}"
        if idx not in expected or idx in seen:
            raise CheckpointError(f"{what}: unexpected or repeated block in {INDEX}")
        seen.add(idx)
        compact[idx] = _read_block(root, what, entry, stored_dtype, block_shape)
    missing = sorted(expected - seen)
    if missing:
        chip = _chip_text(axes, missing[0], varying)
        raise CheckpointError(f"{where}, block on chip {chip}: {INDEX} lists no file for it")
    if stored_dtype != dtype:
        compact = compact.view(dtype)
    same = axes == mesh.axis_names and sizes == mesh.shape and target == saved
    return _Ready(name, axes, compact, saved, target, global_shape, dtype, label, category, same)


def _target_layout(
    where: str, saved: Layout, saved_mesh: Mesh, mesh: Mesh, wanted: Any, global_shape: tuple[int, ...]
) -> Layout:
    text = saved if wanted is None else wanted
    try:
        target = Layout.parse(text, mesh.axis_names).validate(mesh.axis_names)
        local_shape_of(mesh, target, global_shape)
    except ShardsimError as e:
        how = f"the requested layout {wanted!r}"
        if wanted is None:
            how = "its saved layout (pass layouts={name: layout} to choose one)"
        raise CheckpointError(
            f"{where} (saved as {saved} on {saved_mesh}) does not fit {mesh} with {how}: {e}"
        ) from None
    if target.rank != saved.rank:
        raise CheckpointError(f"{where}: layout {target} has {target.rank} dimensions, the saved value {saved.rank}")
    same_mesh = saved_mesh.axis_names == mesh.axis_names and saved_mesh.shape == mesh.shape
    if target.partial and not (same_mesh and target == saved):
        raise CheckpointError(
            f"{where} would load as the partial sum {target}: a partial sum loads only with its saved "
            f"layout onto a mesh of the saved shape ({saved} on {saved_mesh}); choose a layout without {{U...}}"
        )
    return target


def _block_index(
    where: str, entry: Any, axes: tuple[str, ...], varying: tuple[bool, ...]
) -> tuple[str, tuple[int, ...]]:
    try:
        chip = entry["chip"]
        idx = tuple(0 if chip[a] == "*" else int(chip[a]) for a in axes)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: a block entry in {INDEX} is malformed ({type(e).__name__}: {e})") from None
    return _chip_text(axes, idx, varying), idx


def _chip_text(axes: tuple[str, ...], idx: tuple[int, ...], varying: tuple[bool, ...]) -> str:
    return "(" + ",".join(f"{a}{i}" if v else f"{a}*" for a, i, v in zip(axes, idx, varying)) + ")"


def _read_block(root: Path, what: str, entry: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    try:
        file, size, digest = str(entry["file"]), int(entry["bytes"]), str(entry["sha256"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{what}: its entry in {INDEX} is malformed ({type(e).__name__}: {e})") from None
    if Path(file).name != file or file in ("", ".", ".."):
        raise CheckpointError(f"{what}: file name {file!r} in {INDEX} is not a plain file name")
    path = root / file
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{what}: file {file} is missing") from None
    except OSError as e:
        raise CheckpointError(f"{what}: cannot read file {file}: {e}") from None
    if len(data) < size:
        raise CheckpointError(f"{what}: file {file} is truncated ({len(data)} of {size} bytes)")
    if len(data) > size:
        raise CheckpointError(f"{what}: file {file} has {len(data)} bytes, {INDEX} says {size}")
    got = hashlib.sha256(data).hexdigest()
    if got != digest:
        raise CheckpointError(
            f"{what}: file {file} is corrupt: its SHA-256 {got[:16]}... differs from the index's {digest[:16]}..."
        )
    try:
        block = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:  # pragma: no cover - the checksum catches damage first
        raise CheckpointError(f"{what}: file {file} is not a valid .npy file: {e}") from None
    if block.shape != shape or block.dtype.newbyteorder("=") != dtype.newbyteorder("="):
        raise CheckpointError(f"{what}: file {file} holds {block.dtype} {block.shape}, {INDEX} says {dtype} {shape}")
    return block


def _place(r: _Ready, mesh: Mesh) -> ShardedArray:
    if r.same_placement:
        data = r.compact
        data.flags.writeable = False
        return ShardedArray(mesh, r.target, r.global_shape, r.dtype, data, label=r.label, category=r.category)
    full = global_from_compact(r.compact, r.saved, r.axes, r.global_shape)
    return shard(full, mesh, r.target, label=r.label, category=r.category)


def _check_tree(root: Path, tree: Mapping[str, Any], arrays: Mapping[str, Any]) -> None:
    for value in tree.values():
        if isinstance(value, Mapping):
            _check_tree(root, value, arrays)
        elif not (isinstance(value, str) and value in arrays):
            raise CheckpointError(f"checkpoint {root}: {INDEX} tree names {value!r}, which it holds no array for")


def _unflatten(tree: Mapping[str, Any], built: dict[str, ShardedArray]) -> dict[str, Any]:
    return {k: _unflatten(v, built) if isinstance(v, Mapping) else built[v] for k, v in tree.items()}
