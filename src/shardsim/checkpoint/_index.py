"""The checkpoint index: its format, its limits, and the tree of values it describes.

``index.json`` is strict JSON (no NaN), at most :data:`MAX_INDEX_BYTES` long and nested at
most :data:`MAX_DEPTH` levels; both are checked before it is parsed, so a hostile index can
neither exhaust memory nor the parser's recursion. Layouts are stored as data (dimension
names and their axes), not as text, so every layout reads back as itself whatever its axis
names are (``data``, ``αβ``, ``X`` beside ``XY``).

The tree records the saved state's nesting. Each node is one of ``{"dict": {key: node}}``,
``{"list": [node]}``, ``{"tuple": [node]}``, ``{"array": name}`` (a ShardedArray, stored as
blocks) and ``{"value": v}`` for a plain ``int``, ``float``, ``bool``, ``str`` or ``None``
(non-finite floats as ``{"float": "nan"}``, ``"inf"``, ``"-inf"``).

>>> node, arrays = encode_tree({"step": 3, "lr": 0.5, "tags": ("a", None)}, {})
>>> node["dict"]["tags"]
{'tuple': [{'value': 'a'}, {'value': None}]}
>>> decode_tree(node, {}, "checkpoint c")
{'step': 3, 'lr': 0.5, 'tags': ('a', None)}
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._files import INDEX
from ..array import ShardedArray
from ..dtypes import resolve_dtype
from ..errors import CheckpointError, ShardsimError
from ..layout import Dim, Layout

FORMAT = "shardsim-checkpoint"
VERSION = 2
MAX_INDEX_BYTES = 64 * 2**20
MAX_DEPTH = 64  # JSON levels; the index's own structure takes 6, each level of the state 2
MAX_NESTING = 24  # levels of dicts and lists in a saved state
MAX_INT_DIGITS = 1000  # plain ints beyond this are refused at save (JSON readers cap them)
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


class MalformedError(ValueError):
    """An index entry of the wrong type or out of range (turned into a CheckpointError)."""


# -- reading the index ------------------------------------------------------------------------
def depth(text: bytes) -> int:
    """How deeply the JSON ``text`` nests (strings skipped), without parsing it.

    >>> depth(b'{"a": [1, {"b": "]]]"}]}')
    3
    """
    flat = np.frombuffer(_STRING.sub(b'""', text), np.uint8)
    step = np.zeros(flat.shape, np.int64)
    step[(flat == ord("[")) | (flat == ord("{"))] = 1
    step[(flat == ord("]")) | (flat == ord("}"))] = -1
    return int(np.cumsum(step).max(initial=0))


def _no_constants(name: str) -> float:
    raise MalformedError(f"{name} is not JSON")


def parse(text: bytes, root: object) -> dict[str, Any]:
    """Parse and check an index: size, depth, JSON, format marker, version, checksum, sections."""
    if len(text) > MAX_INDEX_BYTES:
        raise CheckpointError(f"checkpoint {root}: {INDEX} is larger than {MAX_INDEX_BYTES} bytes")
    levels = depth(text)
    if levels > MAX_DEPTH:
        raise CheckpointError(
            f"checkpoint {root}: {INDEX} is nested {levels} levels deep, more than the {MAX_DEPTH} an index may be"
        )
    try:
        index = json.loads(text, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"checkpoint {root}: {INDEX} is corrupt: {e}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise CheckpointError(f"{root} is not a shardsim checkpoint: {INDEX} lacks format {FORMAT!r}")
    if index.get("version") != VERSION:
        raise CheckpointError(
            f"checkpoint {root} has format version {index.get('version')!r}; this shardsim reads version {VERSION}"
        )
    if index.get("sha256") != digest(index):
        raise CheckpointError(f"checkpoint {root}: {INDEX} is corrupt: its contents do not match its SHA-256")
    if not isinstance(index.get("arrays"), dict) or not isinstance(index.get("tree"), dict):
        raise CheckpointError(f"checkpoint {root}: {INDEX} is malformed (no 'arrays' or 'tree')")
    return index


def digest(index: Mapping[str, Any]) -> str:
    """SHA-256 of the index without its own checksum, in a canonical JSON form."""
    body = {k: v for k, v in index.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def dumps(index: Mapping[str, Any]) -> bytes:
    return json.dumps(index, indent=1, allow_nan=False).encode()


def block_names(index: Any) -> set[str]:
    """Every block file an index (of any version) lists, as far as it can be read."""
    names: set[str] = set()
    arrays = index.get("arrays") if isinstance(index, dict) else None
    for meta in arrays.values() if isinstance(arrays, dict) else ():
        blocks = meta.get("blocks") if isinstance(meta, dict) else None
        for entry in blocks if isinstance(blocks, list) else ():
            if isinstance(entry, dict) and isinstance(entry.get("file"), str):
                names.add(entry["file"])
    return names


# -- typed fields -----------------------------------------------------------------------------
def integer(value: Any, what: str, low: int = 0, high: int = 2**62) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise MalformedError(f"{what} is {value!r}, not an integer in [{low}, {high}]")
    return value


def integers(value: Any, what: str, length: int | None = None) -> tuple[int, ...]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        raise MalformedError(f"{what} is {value!r}, not a list of {length if length is not None else 'some'} integers")
    return tuple(integer(v, what) for v in value)


def text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise MalformedError(f"{what} is {value!r}, not a string")
    return value


def texts(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise MalformedError(f"{what} is {value!r}, not a list of strings")
    return tuple(text(v, what) for v in value)


# -- layouts and dtypes -----------------------------------------------------------------------
def encode_layout(layout: Layout) -> dict[str, Any]:
    return {
        "layout": str(layout),  # for people; the fields below are what load reads
        "dims": [[d.name, list(d.axes)] for d in layout.dims],
        "partial": list(layout.partial),
    }


def decode_layout(meta: Mapping[str, Any], axes: tuple[str, ...]) -> Layout:
    dims = meta["dims"]
    if not isinstance(dims, list):
        raise MalformedError(f"dims is {dims!r}, not a list")
    out = []
    for d in dims:
        if not isinstance(d, list) or len(d) != 2:
            raise MalformedError(f"a dimension is {d!r}, not [name, axes]")
        name = text(d[0], "a dimension name")
        if not name or len(name) > 64:
            raise MalformedError(f"dimension name {name!r} is empty or too long")
        out.append(Dim(name, texts(d[1], f"the axes of dimension {name}")))
    layout = Layout(tuple(out), texts(meta["partial"], "partial"))
    try:
        return layout.validate(axes)
    except ShardsimError as e:
        raise MalformedError(str(e)) from None


def stored_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a block is written in: its own, or raw unsigned ints for ml_dtypes' (bfloat16)."""
    return dtype if dtype.kind in "biufc" else np.dtype(f"u{dtype.itemsize}")


def checked_dtype(name: str, where: str) -> np.dtype:
    try:
        return resolve_dtype(name)
    except ShardsimError as e:
        raise CheckpointError(f"{where} has dtype {name}: {e}") from None


# -- the tree of values -----------------------------------------------------------------------
def _key(key: Any, prefix: str) -> str:
    if not isinstance(key, str) or not key or "/" in key:
        raise CheckpointError(
            f"checkpoint key {prefix + str(key)!r}: keys are non-empty strings without '/' "
            "(nested dicts are joined with '/')"
        )
    return key


def encode_tree(
    state: Any, arrays: dict[str, ShardedArray], prefix: str = "", level: int = 0
) -> tuple[dict[str, Any], dict[str, ShardedArray]]:
    """The tree node for ``state``; ShardedArrays found are added to ``arrays`` by name."""
    if level > MAX_NESTING:
        raise CheckpointError(
            f"checkpoint value {prefix.rstrip('/')!r} is nested more than {MAX_NESTING} levels deep "
            "(or contains itself); a checkpoint holds a tree of at most that depth"
        )
    if isinstance(state, ShardedArray):
        name = prefix.rstrip("/")
        arrays[name] = state
        return {"array": name}, arrays
    if isinstance(state, Mapping):
        return {
            "dict": {_key(k, prefix): encode_tree(v, arrays, prefix + k + "/", level + 1)[0] for k, v in state.items()}
        }, arrays
    if type(state) in (list, tuple):
        nodes = [encode_tree(v, arrays, f"{prefix}{i}/", level + 1)[0] for i, v in enumerate(state)]
        return {type(state).__name__: nodes}, arrays
    return _encode_value(state, prefix.rstrip("/")), arrays


def _encode_value(value: Any, name: str) -> dict[str, Any]:
    kind = type(value)
    if kind is float and not math.isfinite(value):
        return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if kind is int and len(str(abs(value))) > MAX_INT_DIGITS:
        raise CheckpointError(
            f"checkpoint value {name!r} is an int of more than {MAX_INT_DIGITS} digits; store it as a str"
        )
    if value is None or kind in (bool, int, float, str):
        return {"value": value}
    raise CheckpointError(
        f"checkpoint value {name!r} is a {kind.__name__}: a checkpoint holds ShardedArrays and plain "
        "int, float, bool, str and None values in dicts, lists and tuples (convert NumPy scalars with "
        "int() or float(), or shard NumPy arrays)"
    )


def decode_tree(node: Any, built: Mapping[str, Any], root: object, level: int = 0) -> Any:
    """The saved state from its tree node, with ``built`` values for its arrays."""
    if not isinstance(node, dict) or len(node) != 1 or level > MAX_NESTING:
        raise CheckpointError(f"checkpoint {root}: {INDEX} tree node {_short(node)} is malformed")
    ((tag, body),) = node.items()
    if tag == "dict" and isinstance(body, dict):
        return {k: decode_tree(v, built, root, level + 1) for k, v in body.items()}
    if tag in ("list", "tuple") and isinstance(body, list):
        items = [decode_tree(v, built, root, level + 1) for v in body]
        return items if tag == "list" else tuple(items)
    if tag == "array" and isinstance(body, str) and body in built:
        return built[body]
    if tag == "value" and (body is None or type(body) in (bool, int, float, str)):
        return body
    if tag == "float" and body in ("nan", "inf", "-inf"):
        return float(body)
    raise CheckpointError(f"checkpoint {root}: {INDEX} tree node {_short(node)} is malformed")


def tree_arrays(node: Any) -> list[str]:
    """The array names a (checked) tree refers to, in order."""
    ((tag, body),) = node.items()
    if tag == "array":
        return [body]
    if tag == "dict":
        return [n for v in body.values() for n in tree_arrays(v)]
    if tag in ("list", "tuple"):
        return [n for v in body for n in tree_arrays(v)]
    return []


def _short(node: Any) -> str:
    text = repr(node)
    return text if len(text) <= 60 else text[:57] + "..."
