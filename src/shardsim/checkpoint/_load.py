"""``load`` and ``read_index``: every file checked for what it is and its size before it is read."""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from numpy.lib import format as npy

from .. import _files
from .._files import BLOCK_NAME, INDEX, Folder
from ..array import ShardedArray, compact_shape, local_shape_of, shard
from ..errors import CheckpointError, ShardsimError
from ..layout import Layout
from ..mesh import Mesh
from ..resharding import global_from_compact
from . import _index

MAX_HEADER = 4096  # bytes of .npy header allowed (np.save writes 128 for any ordinary shape)
MIN_HEADER = 10 + 16  # magic, version, length and the shortest header dict
RETRIES = 20  # a save may swap the directory while we read: read again, up to this many times

T = TypeVar("T")


def _consistent(root: Path, read: Callable[[Folder], T]) -> T:
    """``read(folder)`` on one directory that no save replaced while it was read.

    A save swaps a complete new directory in and then deletes the old one's files; a reader
    that opened the old one then finds files missing. Reading again from the new one gives a
    consistent checkpoint, so a save in flight is never reported as damage.
    """
    for attempt in range(RETRIES):
        try:
            folder = Folder(root)
        except _files.MissingError:
            if attempt < 3 and _aside(root):  # between the two renames of a non-atomic swap
                time.sleep(0.01)
                continue
            raise _not_there(root) from None
        try:
            return read(folder)
        except CheckpointError:
            if not folder.replaced():
                raise
        finally:
            folder.close()
    raise CheckpointError(f"checkpoint {root} kept changing while it was read ({RETRIES} saves in flight)")


def _aside(root: Path) -> list[Path]:
    return [p for p in _files.strays(root.parent, root.name) if ".old-" in p.name]


def _not_there(root: Path) -> CheckpointError:
    hint = ""
    left = _aside(root)
    if left:
        hint = f"; a save was interrupted while swapping directories: the previous checkpoint is at {left[-1]}"
    return CheckpointError(f"no checkpoint at {root}: the directory does not exist{hint}")


def _read_index(folder: Folder) -> dict[str, Any]:
    root = folder.root
    try:
        st = folder.regular(INDEX, f"checkpoint {root}")
    except _files.MissingError:
        raise _files.MissingError(f"{root} is not a shardsim checkpoint: {INDEX} is missing") from None
    if st.st_size > _index.MAX_INDEX_BYTES:
        raise CheckpointError(f"checkpoint {root}: {INDEX} is larger than {_index.MAX_INDEX_BYTES} bytes")
    with folder.open(INDEX, f"checkpoint {root}", st) as fd:
        text = _files.read_exactly(fd, st.st_size, f"checkpoint {root}", INDEX)
    return _index.parse(text, root)


def _root(directory: Any) -> Path:
    if not isinstance(directory, (str, os.PathLike)):
        raise CheckpointError(f"a checkpoint path is a str or os.PathLike, got {type(directory).__name__}")
    root = Path(directory)
    if "\0" in str(root):
        raise CheckpointError(f"cannot read checkpoint {str(root)!r}: the path contains a NUL byte")
    return root


def read_index(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint's parsed ``index.json`` (layouts, meshes, shapes, dtypes, blocks).

    >>> import tempfile, numpy as np, shardsim
    >>> from shardsim import checkpoint
    >>> x = shardsim.shard(np.ones(4), shardsim.Mesh(X=2), "B_X")
    >>> info = checkpoint.read_index(checkpoint.save(tempfile.mkdtemp() + "/c", {"x": x}))
    >>> info["arrays"]["x"]["layout"], [b["chip"] for b in info["arrays"]["x"]["blocks"]]
    ('[B_X]', [{'X': 0}, {'X': 1}])
    """
    return _consistent(_root(directory), _read_index)


def load(directory: str | os.PathLike[str], mesh: Mesh, layouts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Read the checkpoint at ``directory`` onto ``mesh``; the same nested dicts as were saved.

    ``layouts`` maps names (``"mlp/W_in"``, or nested dicts like the state) to target
    layouts; the others keep their saved layout, which must then fit ``mesh``. A missing,
    truncated or corrupt block, a file that is not a regular file, or a layout that does not
    fit, raises :class:`~shardsim.CheckpointError` naming the file and the block, before any
    value is built.

    >>> import tempfile, numpy as np, shardsim
    >>> from shardsim import checkpoint
    >>> x = shardsim.shard(np.arange(8.0), shardsim.Mesh(X=4), "B_X").named("x")
    >>> path = checkpoint.save(tempfile.mkdtemp() + "/c", {"x": x})
    >>> checkpoint.load(path, shardsim.Mesh(X=2))["x"].local(X=1)
    array([4., 5., 6., 7.])
    """
    root = _root(directory)
    if not isinstance(mesh, Mesh):
        raise CheckpointError(f"load needs a shardsim.Mesh to place the values on, got {type(mesh).__name__}")
    wanted = _flat_layouts(layouts)
    tree, ready = _consistent(root, lambda folder: _read_all(folder, mesh, wanted))
    # Everything is read and checked: only now build the values.
    built: dict[str, ShardedArray] = {}
    try:
        for r in ready:
            built[r.name] = _place(r, mesh)
    except BaseException:
        built.clear()  # e.g. OutOfMemoryError on the third value: release the first two
        raise
    return _index.decode_tree(tree, built, root)  # type: ignore[no-any-return]


def _read_all(folder: Folder, mesh: Mesh, wanted: dict[str, Any]) -> tuple[Any, list[_Ready]]:
    root = folder.root
    index = _read_index(folder)
    arrays: dict[str, Any] = index["arrays"]
    unknown = [n for n in wanted if n not in arrays]
    if unknown:
        raise CheckpointError(
            f"checkpoint {root}: layouts name {unknown}, which the checkpoint does not hold; it holds {sorted(arrays)}"
        )
    tree = index["tree"]
    if set(tree) != {"dict"}:
        raise CheckpointError(f"checkpoint {root}: {INDEX} tree is malformed (its root is not a dict)")
    _index.decode_tree(tree, dict.fromkeys(arrays), root)  # every node well formed, every array known
    named = _index.tree_arrays(tree)
    if sorted(named) != sorted(arrays):
        raise CheckpointError(f"checkpoint {root}: {INDEX} tree and arrays do not name the same values")
    plans = [_plan(root, name, meta, mesh, wanted.get(name)) for name, meta in arrays.items()]
    files = [b.file for p in plans for b in p.blocks]
    if len(set(files)) != len(files):
        raise CheckpointError(f"checkpoint {root}: {INDEX} lists one file for two blocks")
    # Every file is there, a regular file of the size the index implies, before any is read.
    stats = [[_stat_block(folder, p, b) for b in p.blocks] for p in plans]
    return tree, [_read_array(folder, p, s) for p, s in zip(plans, stats)]


@dataclass
class _Block:
    file: str
    index: tuple[int, ...]
    chip: str
    size: int
    sha256: str


@dataclass
class _Plan:
    """One value's index entry, checked; its blocks not yet read."""

    where: str
    name: str
    axes: tuple[str, ...]
    sizes: tuple[int, ...]
    saved: Layout
    target: Layout
    global_shape: tuple[int, ...]
    block_shape: tuple[int, ...]
    dtype: np.dtype
    stored: np.dtype
    label: str
    category: str
    cshape: tuple[int, ...]
    blocks: list[_Block]
    same_placement: bool

    @property
    def block_bytes(self) -> int:
        return math.prod(self.block_shape) * self.stored.itemsize


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


def _flat_layouts(layouts: Mapping[str, Any] | None, prefix: str = "", level: int = 0) -> dict[str, Any]:
    if layouts is None:
        return {}
    if not isinstance(layouts, Mapping) or level > _index.MAX_NESTING:
        raise CheckpointError(
            f"layouts maps names to layouts (nested at most {_index.MAX_NESTING} levels), got {type(layouts).__name__}"
        )
    out: dict[str, Any] = {}
    for key, value in layouts.items():
        name = prefix + str(key)
        if isinstance(value, Mapping):
            out.update(_flat_layouts(value, name + "/", level + 1))
        else:
            out[name] = value
    return out


def _plan(root: Path, name: str, meta: Any, mesh: Mesh, wanted: Any) -> _Plan:
    where = f"checkpoint {root}: array {name!r}"
    try:
        if not isinstance(meta, dict):
            raise _index.MalformedError(f"the entry is {type(meta).__name__}, not an object")
        m = meta["mesh"]
        axes = _index.texts(m["axes"], "mesh axes")
        sizes = _index.integers(m["shape"], "mesh shape", len(axes))
        try:
            saved_mesh = Mesh(dict(zip(axes, sizes)))
        except ShardsimError as e:
            raise _index.MalformedError(str(e)) from None
        if saved_mesh.axis_names != axes:
            raise _index.MalformedError(f"mesh axes {list(axes)} repeat a name")
        saved = _index.decode_layout(meta, axes)
        global_shape = _index.integers(meta["global_shape"], "global_shape", saved.rank)
        block_shape = _index.integers(meta["block_shape"], "block_shape", saved.rank)
        dtype_name = _index.text(meta["dtype"], "dtype")
        stored_name = _index.text(meta["stored_dtype"], "stored_dtype")
        blocks = meta["blocks"]
        if not isinstance(blocks, list):
            raise _index.MalformedError(f"blocks is {type(blocks).__name__}, not a list")
        label = meta.get("label")
        label = name.rsplit("/", 1)[-1] if label is None else _index.text(label, "label")
        category = _index.text(meta.get("category", "activations"), "category")
    except (KeyError, TypeError, _index.MalformedError) as e:
        raise CheckpointError(f"{where}: its entry in {INDEX} is malformed ({type(e).__name__}: {e})") from None
    dtype = _index.checked_dtype(dtype_name, where)
    stored = _index.stored_dtype(dtype)
    if stored.name != stored_name:
        raise CheckpointError(f"{where}: {INDEX} stores dtype {dtype} as {stored_name}; it is stored as {stored}")
    try:
        fits = local_shape_of(saved_mesh, saved, global_shape) == block_shape
    except ShardsimError:
        fits = False
    if not fits:
        raise CheckpointError(f"{where}: block shape {block_shape} does not match {saved} of {global_shape}")
    target = _target_layout(where, saved, saved_mesh, mesh, wanted, global_shape)
    varying = tuple(a in saved.used_axes() for a in axes)
    cshape = compact_shape(saved_mesh, saved, block_shape)
    expected = math.prod(cshape[: len(axes)])
    if len(blocks) > expected:
        raise CheckpointError(f"{where}: {INDEX} lists {len(blocks)} blocks; its layout {saved} has {expected}")
    parsed = [_block(where, entry, axes, sizes, varying) for entry in blocks]
    seen: set[tuple[int, ...]] = set()
    for b in parsed:
        if b.index in seen:
            raise CheckpointError(f"{where}, block on chip {b.chip}: unexpected or repeated block in {INDEX}")
        seen.add(b.index)
    if len(seen) < expected:  # the first index missing: at most len(seen) + 1 steps
        first = next(i for i in itertools.product(*(range(n) for n in cshape[: len(axes)])) if i not in seen)
        chip = _chip_text(axes, first, varying)
        raise CheckpointError(f"{where}, block on chip {chip}: {INDEX} lists no file for it")
    parsed.sort(key=lambda b: b.index)
    same = axes == mesh.axis_names and sizes == mesh.shape and target == saved
    return _Plan(
        where,
        name,
        axes,
        sizes,
        saved,
        target,
        global_shape,
        block_shape,
        dtype,
        stored,
        label,
        category,
        cshape,
        parsed,
        same,
    )


def _target_layout(
    where: str, saved: Layout, saved_mesh: Mesh, mesh: Mesh, wanted: Any, global_shape: tuple[int, ...]
) -> Layout:
    try:
        target = saved if wanted is None else Layout.parse(wanted, mesh.axis_names)
        target.validate(mesh.axis_names)
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


def _block(where: str, entry: Any, axes: tuple[str, ...], sizes: tuple[int, ...], varying: tuple[bool, ...]) -> _Block:
    try:
        if not isinstance(entry, dict) or not isinstance(entry.get("chip"), dict):
            raise _index.MalformedError(f"{_index._short(entry)} is not a block entry")
        chip = entry["chip"]
        if set(chip) != set(axes):
            raise _index.MalformedError(f"chip {_index._short(chip)} does not name the axes {list(axes)}")
        idx = []
        for a, n, v in zip(axes, sizes, varying):
            if v:
                idx.append(_index.integer(chip[a], f"chip coordinate {a}", 0, n - 1))
            elif chip[a] != "*":
                raise _index.MalformedError(f"chip coordinate {a} is {chip[a]!r}; replicated over {a}, it is '*'")
            else:
                idx.append(0)
        index = tuple(idx)
        text = _chip_text(axes, index, varying)
        file = _index.text(entry["file"], "file")
        size = _index.integer(entry["bytes"], "bytes")
        digest = _index.text(entry["sha256"], "sha256")
    except (KeyError, TypeError, _index.MalformedError) as e:
        raise CheckpointError(f"{where}: a block entry in {INDEX} is malformed ({type(e).__name__}: {e})") from None
    if not BLOCK_NAME.fullmatch(file):
        raise CheckpointError(f"{where}, block on chip {text}: file name {file!r} in {INDEX} is not a plain file name")
    return _Block(file, index, text, size, digest)


def _chip_text(axes: tuple[str, ...], idx: tuple[int, ...], varying: tuple[bool, ...]) -> str:
    return "(" + ",".join(f"{a}{i}" if v else f"{a}*" for a, i, v in zip(axes, idx, varying)) + ")"


def _stat_block(folder: Folder, plan: _Plan, b: _Block) -> os.stat_result:
    """The block's file is a regular file of exactly the size the index gives and the shape implies."""
    what = f"{plan.where}, block on chip {b.chip}"
    st = folder.regular(b.file, what)
    if st.st_size != b.size:
        if st.st_size < b.size:
            raise CheckpointError(f"{what}: file {b.file} is truncated ({st.st_size} of {b.size} bytes)")
        raise CheckpointError(f"{what}: file {b.file} has {st.st_size} bytes, {INDEX} says {b.size}")
    data = plan.block_bytes
    if not data + MIN_HEADER <= b.size <= data + MAX_HEADER:
        raise CheckpointError(
            f"{what}: {INDEX} gives file {b.file} {b.size} bytes; a {plan.stored} block of shape "
            f"{plan.block_shape} takes {data} bytes and a header"
        )
    return st


def _read_array(folder: Folder, plan: _Plan, stats: list[os.stat_result]) -> _Ready:
    data = plan.block_bytes
    raw = np.empty(len(plan.blocks) * data, np.uint8)  # bounded: the files' sizes were checked
    view = raw.data
    for k, (b, st) in enumerate(zip(plan.blocks, stats)):
        swapped = _read_block(folder, plan, b, st, view[k * data : (k + 1) * data])
        if swapped:
            raw[k * data : (k + 1) * data].view(plan.stored).byteswap(inplace=True)
    compact = raw.view(plan.stored).reshape(plan.cshape)
    if plan.stored != plan.dtype:
        compact = compact.view(plan.dtype)
    return _Ready(
        plan.name,
        plan.axes,
        compact,
        plan.saved,
        plan.target,
        plan.global_shape,
        plan.dtype,
        plan.label,
        plan.category,
        plan.same_placement,
    )


def _read_block(folder: Folder, plan: _Plan, b: _Block, st: os.stat_result, out: memoryview) -> bool:
    """Read one block into ``out``: header parsed and compared with the index first, then the data.

    Returns whether the file's byte order is the opposite of this machine's.
    """
    what = f"{plan.where}, block on chip {b.chip}"
    with folder.open(b.file, what, st) as fd:
        f = os.fdopen(fd, "rb", buffering=0, closefd=False)
        try:
            version = npy.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = npy.read_array_header_1_0(f, max_header_size=MAX_HEADER)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = npy.read_array_header_2_0(f, max_header_size=MAX_HEADER)
            else:
                raise ValueError(f"unknown .npy version {version}")
            start = f.tell()
        except OSError as e:
            raise CheckpointError(f"{what}: cannot read file {b.file}: {_files.cause(e)}") from None
        except Exception as e:  # the header is parsed from damaged text: tokenize, ast, ValueError...
            raise CheckpointError(f"{what}: file {b.file} is not a valid .npy file: {e}") from None
        same_order = dtype == plan.stored
        if (
            tuple(shape) != plan.block_shape
            or fortran
            or not (same_order or dtype == plan.stored.newbyteorder())
            or start + len(out) != b.size
        ):
            raise CheckpointError(
                f"{what}: file {b.file} holds {dtype} {tuple(shape)}{' (Fortran order)' if fortran else ''}, "
                f"{INDEX} says {plan.stored} {plan.block_shape}"
            )
        sha = hashlib.sha256(os.pread(fd, start, 0))
        os.lseek(fd, start, os.SEEK_SET)
        _files.read_into(fd, out, what, b.file)
        sha.update(out)
    if sha.hexdigest() != b.sha256:
        raise CheckpointError(f"{what}: file {b.file} is corrupt: its SHA-256 differs from the one in {INDEX}")
    return not same_order and plan.stored.itemsize > 1


def _place(r: _Ready, mesh: Mesh) -> ShardedArray:
    if r.same_placement:
        data = r.compact
        data.flags.writeable = False
        return ShardedArray(mesh, r.target, r.global_shape, r.dtype, data, label=r.label, category=r.category)
    full = global_from_compact(r.compact, r.saved, r.axes, r.global_shape)
    return shard(full, mesh, r.target, label=r.label, category=r.category)
