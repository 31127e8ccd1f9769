"""``save``: every value checked first, then written to a fresh directory and swapped in."""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy

from .. import _files
from .._files import INDEX, cause
from ..array import ShardedArray
from ..errors import CheckpointError, ChipFailureError
from . import _index

State = Mapping[str, Any]


def save(directory: str | os.PathLike[str], state: State) -> Path:
    """Write ``state`` as a checkpoint at ``directory``; returns the checkpoint's path.

    ``state`` is a dict of names to ShardedArrays and plain values (``int``, ``float``,
    ``bool``, ``str``, ``None``), in nested dicts, lists and tuples. Everything is checked
    before anything is written. Replaces a previous checkpoint there atomically; refuses to
    replace a directory that is not a shardsim checkpoint, or one that holds files a
    checkpoint did not write.

    >>> import tempfile, numpy as np, shardsim
    >>> from shardsim import checkpoint
    >>> x = shardsim.shard(np.ones((4, 2), np.float32), shardsim.Mesh(X=2, Y=2), "B_X D")
    >>> path = checkpoint.save(tempfile.mkdtemp() + "/ckpt", {"x": x, "step": 7})
    >>> sorted(p.name for p in path.iterdir())  # replicated over Y: one block per X
    ['index.json', 'x.X0.npy', 'x.X1.npy']
    >>> checkpoint.load(path, x.mesh)["step"]
    7
    """
    root = _target(directory)
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"a checkpoint state is a dict of names to ShardedArrays and plain values, got {type(state).__name__}"
        )
    tree, arrays = _index.encode_tree(state, {})
    taken: set[str] = set()
    plans = [_plan(name, x, taken) for name, x in arrays.items()]
    index: dict[str, Any] = {
        "format": _index.FORMAT,
        "version": _index.VERSION,
        "tree": tree,
        "arrays": {p.name: p.meta for p in plans},
    }
    _check_size(root, index)
    try:
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # exist_ok covers directories only
            raise CheckpointError(f"cannot write checkpoint {root}: {root.parent} is a file, not a directory") from None
        with _files.locked(root.parent) as held:
            old = _existing(root)
            _write_and_swap(root, index, plans, old)
            for stray in _files.strays(root.parent, root.name):
                if held or ".old-" in stray.name:  # unlocked, a .tmp- may be another save's
                    _files.remove(stray, _files.own_files(stray))
    except CheckpointError:
        raise
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot write checkpoint {root}: {cause(e)}") from e
    return root


def _target(directory: Any) -> Path:
    if not isinstance(directory, (str, os.PathLike)):
        raise CheckpointError(f"a checkpoint path is a str or os.PathLike, got {type(directory).__name__}")
    try:
        root = Path(os.path.abspath(directory))  # "." or "ckpt/" name a directory that can be renamed
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"cannot write checkpoint {directory!r}: {cause(e)}") from None
    if "\0" in str(root):
        raise CheckpointError(f"cannot write checkpoint {str(root)!r}: the path contains a NUL byte")
    if not root.name:
        raise CheckpointError(f"cannot write checkpoint {root}: name a directory below the file-system root")
    return root


class _Plan:
    """One value, checked: its index entry (digests to come) and the blocks to write."""

    def __init__(self, name: str, meta: dict[str, Any], blocks: list[tuple[str, np.ndarray]]) -> None:
        self.name, self.meta, self.blocks = name, meta, blocks


def _plan(name: str, x: ShardedArray, taken: set[str]) -> _Plan:
    if x.is_shape_only:
        raise CheckpointError(f"cannot save {name!r} ({x.describe()}): it is shape-only, it has no data")
    dtype = x.dtype
    stored_dtype = _index.stored_dtype(dtype)
    try:
        same = _index.resolve_dtype(dtype.name) == dtype
    except Exception:  # any refusal means load could not read it back
        same = False
    if not same or dtype.kind not in "biufcV":
        raise CheckpointError(
            f"cannot save {name!r} ({x.describe()}): dtype {dtype.str} ({dtype.name}) would not read back "
            "as itself; cast it to a native numeric dtype first"
        )
    mesh = x.mesh
    compact = x.compact()
    stored = compact if stored_dtype == dtype else compact.view(stored_dtype)
    varying = [a in x.layout.used_axes() for a in mesh.axis_names]
    nm = len(mesh.shape)
    indices = list(itertools.product(*(range(n) for n in compact.shape[:nm])))
    _check_alive(name, x, varying, indices)
    tags = [".".join(f"{a}{i}" for a, i, v in zip(mesh.axis_names, index, varying) if v) or "all" for index in indices]
    files = _file_names(name, tags, taken)
    meta = {
        **_index.encode_layout(x.layout),
        "mesh": {"axes": list(mesh.axis_names), "shape": list(mesh.shape)},
        "global_shape": list(x.global_shape),
        "dtype": dtype.name,
        "stored_dtype": stored_dtype.name,
        "block_shape": list(x.local_shape),
        "label": x.label,
        "category": x.category,
        "blocks": [
            {"file": f, "chip": {a: (i if v else "*") for a, i, v in zip(mesh.axis_names, index, varying)}}
            for f, index in zip(files, indices)
        ],
    }
    return _Plan(name, meta, [(f, stored[index + (Ellipsis,)]) for f, index in zip(files, indices)])


def _check_alive(name: str, x: ShardedArray, varying: list[bool], indices: list[tuple[int, ...]]) -> None:
    """Refuse a block every chip holding it has failed: its data is gone, as a host transfer says."""
    mesh = x.mesh
    if not mesh.failed:
        return
    holders = math.prod(n for n, v in zip(mesh.shape, varying) if not v)
    dead: dict[tuple[int, ...], int] = {}
    for chip in mesh.failed:
        key = tuple(i if v else 0 for i, v in zip(chip, varying))
        dead[key] = dead.get(key, 0) + 1
    for index in indices:
        if dead.get(index, 0) == holders:
            chips = [mesh.chip_name(dict(zip(mesh.axis_names, c))) for c in sorted(mesh.failed)]
            where = ",".join(f"{a}{i}" if v else f"{a}*" for a, i, v in zip(mesh.axis_names, index, varying))
            raise ChipFailureError(
                f"cannot save {name!r} ({x.describe()}): its block ({where}) is held only by failed chips "
                f"(failed: {' '.join(chips)}); its data is lost. Save before the failure, or restore an "
                "earlier checkpoint (shardsim.checkpoint.load) onto a mesh without them"
            )


def _file_names(name: str, tags: list[str], taken: set[str]) -> list[str]:
    """``mlp.W_in.X3.npy``: readable, short, ASCII, and unique even on case-insensitive file systems."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", name.replace("/", ".")).strip("._")[:100] or "array"
    tags = [re.sub(r"[^A-Za-z0-9_.-]+", "_", t) for t in tags]
    if len({t.lower() for t in tags}) < len(tags) or max(map(len, tags)) > 80:
        tags = [f"c{i}" for i in range(len(tags))]  # axis names that do not spell apart in ASCII
    candidate, n = stem, 1
    while any(f"{candidate}.{t}.npy".lower() in taken for t in tags):
        n += 1
        candidate = f"{stem}~{n}"
    files = [f"{candidate}.{t}.npy" for t in tags]
    taken.update(f.lower() for f in files)
    return files


def _check_size(root: Path, index: dict[str, Any]) -> None:
    """Refuse, before writing, a state whose index load would refuse as too large or too deep."""
    sized = {
        **index,
        "arrays": {
            n: {**m, "blocks": [{**b, "bytes": 2**62, "sha256": "0" * 64} for b in m["blocks"]]}
            for n, m in index["arrays"].items()
        },
        "sha256": "0" * 64,
    }
    text = _index.dumps(sized)
    if len(text) > _index.MAX_INDEX_BYTES or _index.depth(text) > _index.MAX_DEPTH:
        raise CheckpointError(
            f"cannot save a checkpoint at {root}: its index would be larger than {_index.MAX_INDEX_BYTES} bytes "
            f"or nested deeper than {_index.MAX_DEPTH} levels; keep metadata small"
        )


def _existing(root: Path) -> list[str] | None:
    """The files of the checkpoint at ``root`` (None: nothing there); refuses anything else."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return None
    what = f"cannot save a checkpoint at {root}"
    if _files.stat.S_ISLNK(st.st_mode):
        raise CheckpointError(f"{what}: it is a symbolic link; save to the directory it points to")
    if not _files.stat.S_ISDIR(st.st_mode):
        raise CheckpointError(f"{what}: it is a file, not a directory")
    entries = os.listdir(root)
    if not entries:
        return []
    if not os.access(root, os.W_OK):  # its old files could not be deleted once the new one is in
        raise CheckpointError(
            f"{what}: the directory is read-only, so the checkpoint there cannot be replaced; "
            f"make it writable (chmod u+w {root}) or save elsewhere"
        )
    if INDEX not in entries:
        raise CheckpointError(
            f"{what}: the directory holds files but no {INDEX}, so it is not a shardsim checkpoint; "
            "refusing to replace it"
        )
    own = _index_files(root, what)
    foreign = sorted(set(entries) - own - {INDEX})
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise CheckpointError(
            f"{what}: the checkpoint's directory also holds {shown}, which the checkpoint did not write; "
            "refusing to replace it (move them elsewhere first)"
        )
    return entries


def _index_files(root: Path, what: str) -> set[str]:
    """The block files the index at ``root`` lists, if it is recognisably a shardsim checkpoint's."""
    refuse = CheckpointError(
        f"{what}: its {INDEX} is not a shardsim checkpoint's (no format {_index.FORMAT!r} and version); "
        "refusing to replace it"
    )
    try:
        with _files.Folder(root) as folder:
            st = folder.regular(INDEX, f"checkpoint {root}")
            if st.st_size > _index.MAX_INDEX_BYTES:
                raise refuse
            with folder.open(INDEX, f"checkpoint {root}", st) as fd:
                text = _files.read_exactly(fd, st.st_size, f"checkpoint {root}", INDEX)
        if _index.depth(text) > _index.MAX_DEPTH:
            raise refuse
        index = _index.json.loads(text)
    except (CheckpointError, ValueError, RecursionError):
        raise refuse from None
    if not isinstance(index, dict) or index.get("format") != _index.FORMAT:
        raise refuse
    version = index.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise refuse
    entries = set(os.listdir(root))
    own = {n for n in _index.block_names(index) if _files.BLOCK_NAME.fullmatch(n)}
    # A listed name in use by a directory is not the checkpoint's block: leave it to the user.
    return {n for n in own & entries if not _files.stat.S_ISDIR(os.lstat(root / n).st_mode)}


def _write_and_swap(root: Path, index: dict[str, Any], plans: list[_Plan], old: list[str] | None) -> None:
    tmp = root.parent / f".{root.name}.tmp-{uuid.uuid4().hex[:12]}"
    os.mkdir(tmp)
    try:
        dir_fd = os.open(tmp, _files.DIRECTORY)
        try:
            for plan in plans:
                for entry, (file, block) in zip(plan.meta["blocks"], plan.blocks):
                    entry["sha256"], entry["bytes"] = _write_block(dir_fd, file, block)
            index["sha256"] = _index.digest(index)
            data = _index.dumps(index)
            _index.parse(data, tmp)  # what load will read: refuse now rather than write it
            fd = _files.create(dir_fd, INDEX)
            try:
                _files.write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        _swap(tmp, root, old)
    except BaseException as e:
        written = [INDEX] + [b["file"] for plan in plans for b in plan.meta["blocks"]]
        _files.remove(tmp, {*written, *_files.own_files(tmp)})  # the names written, even if tmp cannot be listed
        if isinstance(e, (OSError, ValueError)) and not isinstance(e, CheckpointError):
            raise CheckpointError(f"cannot write checkpoint {root}: {cause(e)}") from e
        raise


def _write_block(dir_fd: int, file: str, block: np.ndarray) -> tuple[str, int]:
    """Write one block as ``.npy`` (no pickle), synced; return its SHA-256 and size in bytes."""
    fd = _files.create(dir_fd, file)
    try:
        out = _files.BlockWriter(fd, hashlib.sha256())
        npy.write_array(out, np.ascontiguousarray(block) if block.ndim else block, allow_pickle=False)
        os.fsync(fd)
    finally:
        os.close(fd)
    return out.digest.hexdigest(), out.size  # type: ignore[attr-defined]


def _swap(tmp: Path, root: Path, old: list[str] | None) -> None:
    """Put ``tmp`` at ``root``; a previous checkpoint there is swapped out and its own files deleted."""
    if old is None:
        os.rename(tmp, root)  # never replaces a directory that is not empty
        _files.fsync_dir(root.parent)
        return
    if _files.exchange(tmp, root):  # one atomic step: root is the old or the new checkpoint, always
        _files.fsync_dir(root.parent)
        _files.remove(tmp, old)
        return
    aside = root.parent / f".{root.name}.old-{uuid.uuid4().hex[:12]}"  # pragma: no cover - not Linux
    os.rename(root, aside)
    try:
        os.rename(tmp, root)
    except BaseException:
        os.rename(aside, root)
        raise
    _files.fsync_dir(root.parent)
    _files.remove(aside, old)
