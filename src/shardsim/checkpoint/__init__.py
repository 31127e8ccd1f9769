"""Sharded checkpoints: every distinct block in its own ``.npy`` file, a JSON index, atomic writes.

``save(directory, state)`` writes each ShardedArray of ``state`` (a dict; nested dicts,
lists and tuples allowed, names joined with ``/``) as one ``.npy`` file per *distinct*
block: a value replicated over an axis is stored once for that axis, not once per chip,
because every chip along it holds the same bytes. Plain values (``int``, ``float``,
``bool``, ``str``, ``None``) are kept in the index and come back as they were, types
included. ``index.json`` records, per array, its layout, the mesh axes and shape it was
saved from, the global shape, the dtype and, per block, the file, the chip that holds it
(``*`` for an axis it is replicated over), its size and its SHA-256.

``load(directory, mesh, layouts=None)`` checks every file (a regular file inside the
directory, of the size the index implies, its ``.npy`` header as the index says, its
checksum) before it builds any value, then places the values on ``mesh``: with the saved
layout by default, or with ``layouts[name]``. When the mesh and layout are those it was
saved with, the blocks go back as they were (partial sums too); otherwise the global array
is assembled on the host and split anew, the way a restore onto a new topology reads what
each chip needs from storage.

A save writes into a fresh directory next to the target and swaps it into place, so an
interrupted save leaves the previous checkpoint as it was, and a load running meanwhile
reads the old checkpoint or the new one, whole.

>>> import tempfile, numpy as np, shardsim
>>> from shardsim import checkpoint
>>> w = shardsim.shard(np.arange(64.0).reshape(8, 8), shardsim.Mesh(X=8), "D_X F").named("W_in")
>>> path = tempfile.mkdtemp() + "/step1"
>>> _ = checkpoint.save(path, {"mlp": {"W_in": w}, "step": 1})
>>> state = checkpoint.load(path, shardsim.Mesh(X=2, Y=2), layouts={"mlp/W_in": "[D_X, F_Y]"})
>>> state["mlp"]["W_in"], state["step"]
(ShardedArray(W_in[D_X, F_Y] float64 (8, 8) on Mesh(X=2, Y=2), local (4, 4)), 1)
>>> bool((state["mlp"]["W_in"].to_global() == w.to_global()).all())
True
"""

from __future__ import annotations

from .._files import INDEX
from ._index import FORMAT, MAX_DEPTH, MAX_INDEX_BYTES, VERSION
from ._index import digest as _index_digest  # noqa: F401 - tests forge indexes with it
from ._load import load, read_index
from ._save import save

__all__ = ["FORMAT", "INDEX", "MAX_DEPTH", "MAX_INDEX_BYTES", "VERSION", "load", "read_index", "save"]
