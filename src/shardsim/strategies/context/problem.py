"""What context-parallel attention is asked to do, checked once: shapes, layouts, tiles, work per chip.

:func:`geometry` validates ``q [B, S_C, N, H]``, ``k``/``v [B, S_C, K, H]`` and the positions
``[S_C]`` (heads may also be split over a model axis, ``[B, S_C, N_Y, H]``) and returns a
:class:`Geometry`: the sizes, the layouts of the running statistics and score tiles, and how
a block step's matmuls enter the trace. Each chip's block is cut into ``tiles`` query tiles
and ``tiles`` key tiles (two, the two chunks of the balanced split, when the block has an
even number of rows; without a context axis the kernel's 128-row tiles); a kernel skips a
tile pair only when every one of its keys comes after every one of its queries, so a
diagonal tile counts in full. :meth:`Geometry.work_on` reads
each chip's visible tile pairs from the positions of the blocks it holds.

>>> import numpy as np, shardsim
>>> from shardsim.strategies.context import balanced_order
>>> mesh = shardsim.Mesh(C=2)
>>> q = shardsim.shard(shardsim.ShapeDtype((1, 8, 2, 4)), mesh, "B S_C N H")
>>> pos = shardsim.shard(balanced_order(8, 2), mesh, "[S_C]")
>>> g = geometry(q, q, q, pos, axis="C", causal=True, scale=None)
>>> g.tiles, g.work_on(pos, pos).tolist()     # each chip's queries against its own keys
(2, [3, 3])
>>> g.work_on(pos, shardsim.ppermute(pos, "C", 1)).tolist()   # ... against the other chip's
[2, 2]
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import engines, tracing
from ...array import ShardedArray, check_same_kind, check_same_mesh, compact_shape, local_shape_of, new_uid
from ...errors import DivisibilityError, PartialSumError, ShapeError, ShardingError
from ...holders import held_where
from ...layout import Dim, Layout
from ...mesh import Mesh
from . import kernels
from .checks import check_layouts, check_positions

METHODS = ("ring", "all_gather")
KERNEL_TILE = 128  # FlashAttention's block of query and of key rows (Dao 2023): its mask's granularity


@dataclass(frozen=True)
class Geometry:
    """Sizes and layouts of one context-parallel attention (see the module doc)."""

    mesh: Mesh
    axis: str | None  # None: no context axis, the whole sequence on every chip (one block)
    cp: int
    causal: bool
    scale: float
    batch: int
    seq: int
    heads: int
    kv_heads: int
    kv_local: int  # kv heads on one chip (K, or K / the model axis splitting the heads)
    head_dim: int
    q_layout: Layout
    kv_layout: Layout
    has_data: bool
    compute: np.dtype
    holders: np.ndarray | None
    tiles: int
    tile_flops: int  # per chip, one matmul of one tile pair: 2 * b * n * (rows/tiles)^2 * H

    @property
    def context_axis(self) -> str:
        """The context axis the K/V blocks travel or are gathered over (ring and all-gather only)."""
        if self.axis is None:
            raise ShardingError("attention without a context axis moves no K/V blocks")
        return self.axis

    @property
    def rows(self) -> int:
        """Query (and key) rows per chip: S / cp."""
        return self.seq // self.cp

    @property
    def rows_layout(self) -> Layout:
        """``[B, N, S_C]``: per query row and head (running max, sum, log-sum-exp)."""
        b, s, n, _ = self.q_layout.dims
        return Layout((b, n, s))

    @property
    def acc_layout(self) -> Layout:
        """``[B, N, S_C, H]``: heads first, as the block kernels keep the running output and dQ."""
        b, s, n, h = self.q_layout.dims
        return Layout((b, n, s, h))

    def scores(self, label: str) -> ShardedArray:
        """A block step's scores (or their gradient), float32, for the trace and the ledger only:
        the kernels compute them in NumPy and nothing reads this value. A fused kernel holds one
        tile of them at a time, ``KERNEL_TILE`` rows of queries by as many keys (fewer when a
        chip's tile of the step is smaller): ``[B, N, Tq, Tk]``, never the ``S/cp`` square."""
        b, _, n, _ = self.q_layout.dims
        tile = min(KERNEL_TILE, self.rows // self.tiles)
        layout = Layout((b, n, Dim("Tq"), Dim("Tk")))
        return self.value(layout, None, label, "scores", shape=(self.batch, self.heads, tile, tile))

    def shape(self, layout: Layout) -> tuple[int, ...]:
        """The global shape of a value of :attr:`rows_layout`, :attr:`acc_layout` or the kv layout."""
        rows = (self.batch, self.heads, self.seq)
        shapes = {
            self.rows_layout: rows,
            self.acc_layout: (*rows, self.head_dim),
            self.kv_layout: (self.batch, self.seq, self.kv_heads, self.head_dim),
        }
        return shapes[layout]

    def value(
        self,
        layout: Layout,
        data: np.ndarray | None,
        label: str,
        category: str = "temporaries",
        *,
        shape: tuple[int, ...] | None = None,
        dtype: Any = None,
    ) -> ShardedArray:
        """A new value on the attention's chips (``data`` stacked, or None when shape-only)."""
        dt = np.dtype(dtype) if dtype is not None else self.compute
        if data is not None:
            data = data.astype(dt, copy=False)
        return ShardedArray(
            self.mesh,
            layout,
            shape or self.shape(layout),
            dt,
            data,
            label=label,
            category=category,
            holders=self.holders,
        )

    def filled(self, layout: Layout, fill: float, label: str, category: str = "temporaries") -> ShardedArray:
        """A value of ``layout`` with every entry ``fill`` (no data when shape-only)."""
        data = None
        if self.has_data:
            local = local_shape_of(self.mesh, layout, self.shape(layout))
            shape = compact_shape(self.mesh, layout, local)
            if engines.active().per_device:  # one chip's block: every mesh dim is 1
                shape = (1,) * len(self.mesh.shape) + tuple(local)
            data = np.full(shape, fill, self.compute)
        return self.value(layout, data, label, category)

    def record(self, inputs: list[ShardedArray], out: ShardedArray, work: np.ndarray) -> None:
        """Trace one matmul of a block step: per chip, ``work[c]`` tile pairs' FLOPs.

        When every chip does the same work one event stands for all; otherwise each chip
        that works gets its own event (``Event.where``, e.g. ``"C2"``), as pipeline stages do.
        """
        total = self.tiles * self.tiles
        io = sum(x.local_nbytes for x in inputs) + out.local_nbytes
        # one block of fused attention: the scores stay on chip, the kernel's own rate times it
        numbers: dict[str, Any] = {"local_shapes": tuple(x.local_shape for x in inputs), "kernel": "attention"}
        if (work == work[0]).all():
            if work[0]:
                tracing.record(
                    "matmul",
                    (),
                    inputs,
                    out,
                    flops=int(work[0]) * self.tile_flops,
                    hbm_bytes=io * int(work[0]) // total,
                    **numbers,
                )
            return
        for c in np.flatnonzero(work):  # each chip's share: a value of its own, run where it is held
            tracing.record(
                "matmul",
                (),
                inputs,
                out,
                held=self._chip(int(c)),
                output_id=new_uid(),
                flops=int(work[c]) * self.tile_flops,
                hbm_bytes=io * int(work[c]) // total,
                **numbers,
            )

    def work_on(self, pos_q: ShardedArray | None, pos_k: ShardedArray | None) -> np.ndarray:
        """Per chip of the context axis, the visible tile pairs of the query and key blocks it holds
        now, read from their positions (every tile pair when not causal)."""
        if not self.causal or pos_q is None or pos_k is None:
            return np.full(self.cp, self.tiles * self.tiles, np.int64)
        replay = _WORK.get()
        if replay is not None and replay.replaying:  # positions the engine traces: the counts read before
            return replay.works.pop(0)
        counts = visible_tiles(pos_q.compact(), pos_k.compact(), self.tiles)  # mesh dims, C the only one > 1
        along = [self.cp if a == self.axis else 1 for a in self.mesh.axis_names]
        work = np.broadcast_to(counts, along).reshape(self.cp).astype(np.int64)
        if replay is not None:
            replay.works.append(work)
        return work

    def _chip(self, c: int) -> np.ndarray:
        """The chips at position ``c`` of the context axis (and holding the attention's values)."""
        along = np.arange(self.cp) == c
        shape = [1] * len(self.mesh.shape)
        shape[self.mesh.axis_index(self.context_axis)] = self.cp
        mask = np.broadcast_to(along.reshape(shape), self.mesh.shape)
        return mask & (True if self.holders is None else self.holders)


@dataclass
class WorkLog:
    """The per-chip work counts of a program's attention blocks, in program order: recorded by a
    run that reads its positions (the stacked engine, shape-only too: positions keep their data),
    replayed by the same program on an engine whose positions are traced values (JAX's)."""

    works: list[np.ndarray]
    replaying: bool = False


_WORK: contextvars.ContextVar[WorkLog | None] = contextvars.ContextVar("shardsim_attention_work", default=None)


@contextlib.contextmanager
def work_log(log: WorkLog) -> Iterator[WorkLog]:
    """Record the attention blocks' work counts into ``log`` (or, with ``log.replaying``, read them from it).

    >>> with work_log(WorkLog([])) as log:
    ...     pass
    >>> log.works
    []
    """
    token = _WORK.set(log)
    try:
        yield log
    finally:
        _WORK.reset(token)


def geometry(
    q: Any, k: Any, v: Any, positions: Any, *, axis: Any, causal: bool, scale: float | None, method: str = "ring"
) -> Geometry:
    """Check the operands of :func:`~shardsim.strategies.context.context_attention` and describe the work."""
    if method not in METHODS:
        raise ShardingError(f"context attention method {method!r} is not one of {list(METHODS)}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, ShardedArray):
            raise ShardingError(f"context attention: {name} must be a ShardedArray, got {type(x).__name__}")
    mesh = check_same_mesh(q, k, v)
    has_data = check_same_kind(q, k, v)
    if axis is not None:
        if not isinstance(axis, str):
            raise ShardingError(
                f"context attention: axis is one mesh axis name such as 'C' (None: the whole sequence on "
                f"every chip), got {axis!r}"
            )
        mesh.check_axis(axis)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise ShapeError(f"context attention: {name} {x.describe()} must be [B, S, heads, H] (4 dimensions)")
        if x.is_partial:
            raise PartialSumError(f"context attention: {name} {x.describe()} is a partial sum; reduce it first")
    batch, seq, heads, head_dim = q.global_shape
    kv_heads = k.global_shape[2]
    if k.global_shape != (batch, seq, kv_heads, head_dim) or v.global_shape != k.global_shape:
        raise ShapeError(
            f"context attention: k {k.describe()} and v {v.describe()} must both be [B, S, K, H] = "
            f"({batch}, {seq}, K, {head_dim}) to fit q {q.describe()}"
        )
    if heads % kv_heads:
        fits = [d for d in range(1, heads + 1) if heads % d == 0]
        raise DivisibilityError(
            f"context attention: the {heads} query heads of q {q.describe()} do not divide into groups "
            f"of the {kv_heads} kv heads of k {k.describe()}; use kv heads that divide {heads}: {fits}"
        )
    check_layouts(q, k, v, axis)
    cp = 1 if axis is None else mesh.axis_size(axis)
    rows = seq // cp
    tiles = 2 if rows % 2 == 0 else 1  # the balanced split's two chunks per chip
    if axis is None and rows % KERNEL_TILE == 0:  # one block: the kernel's own tiles
        tiles = rows // KERNEL_TILE
    check_positions(positions, q, axis, causal, seq)
    b_loc, _, n_loc, _ = q.local_shape
    return Geometry(
        mesh=mesh,
        axis=axis,
        cp=cp,
        causal=causal,
        scale=float(scale) if scale is not None else 1.0 / math.sqrt(head_dim),
        batch=batch,
        seq=seq,
        heads=heads,
        kv_heads=kv_heads,
        kv_local=k.local_shape[2],
        head_dim=head_dim,
        q_layout=q.layout,
        kv_layout=k.layout,
        has_data=has_data,
        compute=kernels.compute_dtype(np.result_type(q.dtype, k.dtype, v.dtype)),
        holders=held_where(q, k, v),
        tiles=tiles,
        tile_flops=2 * b_loc * n_loc * (rows // tiles) ** 2 * head_dim,
    )


def visible_tiles(pos_q: np.ndarray, pos_k: np.ndarray, tiles: int) -> np.ndarray:
    """Tile pairs of a query block and a key block (positions ``[..., S]``, ``[..., T]``) that the
    causal mask leaves partly visible: some key at or before some query. Shape ``[...]``.

    >>> int(visible_tiles(np.array([0, 1, 6, 7]), np.array([2, 3, 4, 5]), 2))   # chunks (0, 3) vs (1, 2)
    2
    """
    last_query = pos_q.reshape(*pos_q.shape[:-1], tiles, -1).max(axis=-1)  # [..., tiles]
    first_key = pos_k.reshape(*pos_k.shape[:-1], tiles, -1).min(axis=-1)
    return (first_key[..., None, :] <= last_query[..., :, None]).sum(axis=(-1, -2))
