"""Kernels on *compact stacked* data: every chip's block in one NumPy array.

A value on a mesh with axes ``(A0, A1, ...)`` is stored as one array of shape
``(m0, m1, ..., *local_shape)`` where ``mi`` is the size of axis ``Ai`` if the value varies
along it (split or partial over it) and 1 if it is replicated along it. NumPy broadcasting
then treats a replicated value as the same block on every chip, the host stores it once,
and a per-chip op is one NumPy call for all chips. Collectives are reshapes, transposes
and sums over the leading mesh dimensions, never loops over chips.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def from_global(x: np.ndarray, dims_axes: Sequence[tuple[int, ...]], mesh_shape: Sequence[int]) -> np.ndarray:
    """Compact stacked view of a global array; ``dims_axes[i]`` = mesh positions splitting dim i."""
    nm = len(mesh_shape)
    shape: list[int] = []
    axis_pos: dict[int, int] = {}
    local_pos: list[int] = []
    for n, axes in zip(x.shape, dims_axes):
        for p in axes:
            axis_pos[p] = len(shape)
            shape.append(mesh_shape[p])
        local_pos.append(len(shape))
        shape.append(n // math.prod(mesh_shape[p] for p in axes))
    used = [p for p in range(nm) if p in axis_pos]
    y = x.reshape(shape).transpose([axis_pos[p] for p in used] + local_pos)
    return y.reshape([mesh_shape[p] if p in axis_pos else 1 for p in range(nm)] + list(y.shape[len(used) :]))


def to_global(c: np.ndarray, dims_axes: Sequence[tuple[int, ...]], nm: int, global_shape: Sequence[int]) -> np.ndarray:
    """The global array of compact data whose mesh dims not in ``dims_axes`` have size 1."""
    used = sorted(p for axes in dims_axes for p in axes)
    y = c.reshape([c.shape[p] for p in used] + list(c.shape[nm:]))
    pos = {p: k for k, p in enumerate(used)}
    perm: list[int] = []
    for i, axes in enumerate(dims_axes):
        perm += [pos[p] for p in axes] + [len(used) + i]
    return y.transpose(perm).reshape(global_shape)


def merge_into_local(c: np.ndarray, nm: int, positions: Sequence[int], dim: int) -> np.ndarray:
    """Concatenate the blocks along mesh dims ``positions`` (major first) into local ``dim``.

    The mesh dims become size 1: the gathered value is the same on every chip of the group.
    """
    local = nm + dim
    rest = [d for d in range(c.ndim) if d not in positions]
    at = rest.index(local)
    y = c.transpose(rest[:at] + list(positions) + rest[at:])
    merged = math.prod(c.shape[p] for p in positions) * c.shape[local]
    y = y.reshape([c.shape[d] for d in rest[:at]] + [merged] + [c.shape[d] for d in rest[at + 1 :]])
    out_shape = [1 if d in positions else c.shape[d] for d in range(nm)] + list(c.shape[nm:])
    out_shape[local] = merged
    return y.reshape(out_shape)


def split_local(c: np.ndarray, nm: int, positions: Sequence[int], sizes: Sequence[int], dim: int) -> np.ndarray:
    """Cut local ``dim`` into ``prod(sizes)`` chunks laid along mesh dims ``positions`` (size 1 now)."""
    k = len(positions)
    keep = [d for d in range(c.ndim) if d not in positions]  # dims that stay, in order
    shape_wo = [c.shape[d] for d in keep]
    at = keep.index(nm + dim)
    chunk = shape_wo[at] // math.prod(sizes)
    y = c.reshape(shape_wo[:at] + list(sizes) + [chunk] + shape_wo[at + 1 :])
    # y's dims: keep[:at] (as 0..at-1), the k split dims (at..at+k-1), chunk (at+k), keep[at+1:]
    index_of = {d: (i if i < at else i + k) for i, d in enumerate(keep)}
    perm = []
    for d in range(nm):
        perm.append(at + positions.index(d) if d in positions else index_of[d])
    perm += [index_of[d] for d in range(nm, c.ndim)]
    return y.transpose(perm)


def sum_mesh(c: np.ndarray, positions: Sequence[int]) -> np.ndarray:
    """Sum the blocks over mesh dims ``positions`` in ascending chip order; those dims become 1."""
    for p in sorted(positions):
        c = np.add.reduce(c, axis=p, keepdims=True, dtype=c.dtype)  # NumPy would widen bool and small ints
    return c


def matmul(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """:func:`_matmul` in the operands' dtype: NumPy multiplies bfloat16 (ml_dtypes) into float32.

    The result is rounded to the operands' type, as an accelerator's 16-bit matmul accumulates
    in float32 and writes 16 bits.
    """
    out = _matmul(lhs, rhs)
    want = np.result_type(lhs.dtype, rhs.dtype)
    return out if out.dtype == want else out.astype(want)


def _matmul(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Every chip's ``lhs @ rhs`` at once, as one large matmul whenever the blocks allow it.

    When no leading (chip) dimension varies on both sides, chip ``(a, b)`` multiplies lhs
    block ``a`` by rhs block ``b``: that is one matmul of all lhs row blocks stacked, times
    all rhs column blocks side by side (``[B_X, D] @ [D, F_Y]`` is the global product). One
    BLAS call instead of one per chip, the same numbers per block; the blocks of the result
    are views into it. Otherwise NumPy's batched matmul pairs the blocks chip by chip.
    """
    lead_l, lead_r = lhs.shape[:-2], rhs.shape[:-2]
    # a leading size other than 1 varies (0 too: a zero-size batch broadcasts as NumPy's does)
    if len(lead_l) != len(lead_r) or any(a != 1 and b != 1 for a, b in zip(lead_l, lead_r)):
        return np.matmul(lhs, rhs)
    (m, k), n = lhs.shape[-2:], rhs.shape[-1]
    on_l = [i for i, size in enumerate(lead_l) if size != 1]
    on_r = [i for i, size in enumerate(lead_r) if size != 1]
    nl, nr = math.prod(lead_l), math.prod(lead_r)
    rows = lhs.reshape(nl * m, k)  # (chips_l * M, K)
    cols = np.moveaxis(rhs.reshape(nr, k, n), 0, 1).reshape(k, nr * n)  # (K, chips_r * N)
    out = (rows @ cols).reshape([lead_l[i] for i in on_l] + [m] + [lead_r[i] for i in on_r] + [n])
    # out's dims: lhs chip dims, M, rhs chip dims, N; put the chip dims back in mesh order
    where = {i: j for j, i in enumerate(on_l)} | {i: len(on_l) + 1 + j for j, i in enumerate(on_r)}
    out = out.transpose([where[i] for i in sorted(where)] + [len(on_l), out.ndim - 1])
    return out.reshape(tuple(a if b == 1 else b for a, b in zip(lead_l, lead_r)) + (m, n))


def fold_contraction(lhs: np.ndarray, rhs: np.ndarray, positions: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Fold mesh dims ``positions`` into the contraction of ``lhs @ rhs`` (sum over those chips).

    ``sum_p lhs[p] @ rhs[p]`` equals ``lhs' @ rhs'`` where the chip dim is concatenated into
    K on both sides in the same order; the result is one matmul instead of N partials.
    Positions are folded minor first, so a ``K_XY`` split is rebuilt in global order.
    """
    for p in sorted(positions, reverse=True):
        lhs = _fold_one(lhs, p, lhs.ndim - 1)
        rhs = _fold_one(rhs, p, rhs.ndim - 2)
    return lhs, rhs


def _fold_one(x: np.ndarray, p: int, k: int) -> np.ndarray:
    # move mesh dim p just before the contraction dim k, merge (p major), leave a 1 at p
    y = np.moveaxis(x, p, k - 1)  # k shifts left by one after removing p (p < k)
    shape = list(y.shape)
    merged = shape[k - 1] * shape[k]
    y = y.reshape(shape[: k - 1] + [merged] + shape[k + 1 :])
    return np.expand_dims(y, p)
