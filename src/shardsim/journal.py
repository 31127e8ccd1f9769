"""A ledger's journal: every change of its live bytes in order, and the peaks of the same
program at another size replayed from the journals of two.

A shape-only training step at ``b`` sequences allocates and frees the same values in the same
order at every ``b``; only their sizes change, each an affine function of ``b`` (an activation
grows with it, a weight does not). So the live bytes of a category on a chip after each change
are affine in ``b`` too, and its peak, the largest of them, is the largest of those affine
values: two journals of the same program at ``b1`` and ``b2`` give every size, hence every
peak, at a third ``b`` exactly (:func:`peaks_on_line`), where a peak alone could not be carried
on a line (which change holds the peak may move with ``b``).

>>> import numpy as np
>>> from shardsim import Mesh, ShapeDtype, shard
>>> def step(b):
...     mesh = Mesh(X=2)
...     mesh.memory.journal = Journal()
...     w = shard(ShapeDtype((8, 8), "float32"), mesh, "D F", category="params")
...     x = shard(ShapeDtype((b, 8), "float32"), mesh, "B_X D")
...     mesh.memory.reset_peak()
...     y = shard(ShapeDtype((b, 8), "float32"), mesh, "B_X D")
...     del x, y
...     return mesh.memory.journal.freeze(), mesh.memory.snapshot()["peak"]
>>> (one, _), (two, _), (four, peak4) = step(2), step(4), step(8)
>>> replayed = peaks_on_line((2, one), (4, two), 8, (2,))
>>> {c: v.tolist() for c, v in replayed.items()} == {c: v.tolist() for c, v in peak4.items()}
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class Journal:
    """The changes of a ledger's live bytes as it makes them: ``(category, holders mask,
    bytes)`` each (a release negative), and where its peaks were last reset. Set one on a
    ledger (``mesh.memory.journal = Journal()``) before its first value; :meth:`freeze` it after."""

    #: The most changes a journal keeps (some 100 MB); a ledger drops a longer one.
    most = 1 << 20

    def __init__(self) -> None:
        self.changes: list[tuple[str, bytes | None, int]] = []
        self.reset = 0  # changes before the last reset_peak count only through the bytes live then

    def freeze(self) -> FrozenJournal:
        """The journal as arrays (a step's cache keeps many)."""
        cats, masks, sizes = zip(*self.changes) if self.changes else ((), (), ())
        categories = {c: i for i, c in enumerate(dict.fromkeys(cats))}
        held = {m: i for i, m in enumerate(dict.fromkeys(masks))}
        return FrozenJournal(
            tuple(categories),
            np.array([categories[c] for c in cats], np.int16),
            tuple(held),
            np.array([held[m] for m in masks], np.int32),
            np.array(sizes, np.int64),
            self.reset,
        )


@dataclass(frozen=True, eq=False)
class FrozenJournal:
    """A :class:`Journal` as arrays: each change's category and mask (indices into
    ``categories`` and ``masks``) and bytes, and the position of the last peak reset."""

    categories: tuple[str, ...]
    category: np.ndarray
    masks: tuple[bytes | None, ...]
    mask: np.ndarray
    nbytes: np.ndarray
    reset: int

    def same_changes(self, other: FrozenJournal) -> bool:
        """Whether both made the same changes (categories, chips, order; sizes aside)."""
        return (
            self.categories == other.categories
            and self.masks == other.masks
            and self.reset == other.reset
            and np.array_equal(self.category, other.category)
            and np.array_equal(self.mask, other.mask)
        )


def sizes_on_line(first: tuple[int, np.ndarray], second: tuple[int, np.ndarray], b: int) -> np.ndarray | None:
    """Each whole number at ``b`` on the line through ``(b1, x1)`` and ``(b2, x2)``, elementwise;
    None where any falls between whole numbers (not an affine program).

    >>> sizes_on_line((1, np.array([4, 7])), (2, np.array([8, 7])), 4).tolist()
    [16, 7]
    >>> sizes_on_line((1, np.array([4])), (3, np.array([9])), 2) is None
    True
    """
    (b1, x1), (b2, x2) = first, second
    rise = (x2 - x1) * (b - b1)
    if np.any(rise % (b2 - b1)):
        return None
    return x1 + rise // (b2 - b1)


def peaks_on_line(
    first: tuple[int, FrozenJournal], second: tuple[int, FrozenJournal], b: int, shape: tuple[int, ...]
) -> dict[str, np.ndarray] | None:
    """Each category's per-chip peak (and ``"total"``) since the last reset, of the program
    journaled at ``b1`` and ``b2``, at ``b`` (module doc); None where the journals differ or a
    size would not be a whole number. ``shape`` is the mesh's."""
    (b1, one), (b2, two) = first, second
    if b1 == b2 or not one.same_changes(two):
        return None
    nbytes = sizes_on_line((b1, one.nbytes), (b2, two.nbytes), b)
    if nbytes is None:
        return None
    chips = int(np.prod(shape))
    masks = one.masks or (None,)  # (a journal of no changes: one class, nothing live)
    member = np.array([np.ones(chips, bool) if m is None else np.frombuffer(m, np.bool_) for m in masks])
    # chips in classes that every mask holds whole or misses whole: counted per class, not per chip
    classes, of = np.unique(member.reshape(len(masks), chips).T, axis=0, return_inverse=True)
    held = classes.T  # mask x class

    def peak(rows: np.ndarray) -> np.ndarray:
        split = int(np.searchsorted(rows, one.reset))
        live = np.zeros(len(classes), np.int64)
        for part in _chunks(rows[:split]):  # before the reset: only what is live at it counts
            live += (nbytes[part, None] * held[one.mask[part]]).sum(axis=0)
        top = live.copy()
        for part in _chunks(rows[split:]):
            running = np.cumsum(nbytes[part, None] * held[one.mask[part]], axis=0) + live
            top, live = np.maximum(top, running.max(axis=0)), running[-1]
        return top[of.ravel()].reshape(shape)

    out = {c: peak(np.flatnonzero(one.category == k)) for k, c in enumerate(one.categories)}
    out["total"] = peak(np.arange(len(nbytes)))
    return out


def _chunks(rows: np.ndarray, size: int = 1 << 15) -> list[np.ndarray]:
    """``rows`` in runs of at most ``size``: a run's changes x classes stay a few MB."""
    return [rows[i : i + size] for i in range(0, len(rows), size)]


__all__ = ["FrozenJournal", "Journal", "peaks_on_line", "sizes_on_line"]
