"""The ledger's counts of values held on some chips only, against a plain per-chip count.

The ledger counts bytes per class of chips that every holders mask covers whole or misses
whole (a pipeline's stages), and per chip once masks cut the mesh into too many classes;
either way each chip's live and peak bytes, by category, must be what adding and removing
every value's bytes chip by chip gives.
"""

from __future__ import annotations

import numpy as np
import pytest

import shardsim
from shardsim.array import ShardedArray
from shardsim.layout import Layout

CATEGORIES = ("params", "activations", "grads")


class Reference:
    """Every chip's live and peak bytes by category, as NumPy arrays of the mesh's shape."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self.live: dict[str, np.ndarray] = {}
        self.peak: dict[str, np.ndarray] = {}
        self.total = np.zeros(shape, np.int64)
        self.total_peak = np.zeros(shape, np.int64)

    def add(self, category: str, per_chip: np.ndarray) -> None:
        live = self.live.setdefault(category, np.zeros(self.shape, np.int64))
        peak = self.peak.setdefault(category, np.zeros(self.shape, np.int64))
        live += per_chip
        self.total += per_chip
        np.maximum(peak, live, out=peak)
        np.maximum(self.total_peak, self.total, out=self.total_peak)

    def reset_peak(self) -> None:
        self.total_peak = self.total.copy()
        self.peak = {c: v.copy() for c, v in self.live.items()}


def _masks(rng: np.random.Generator, shape: tuple[int, ...], many: bool) -> list[np.ndarray | None]:
    if many:  # random sets of chips: far more classes than the ledger keeps as Python ints
        return [None] + [rng.random(shape) < 0.5 for _ in range(40)]
    stages = []  # a pipeline's stages over the last axis, and pairs of them
    for s in range(shape[-1]):
        m = np.zeros(shape, bool)
        m[..., s] = True
        stages.append(m)
    return [None, *stages, stages[0] | stages[-1]]


@pytest.mark.parametrize(("sizes", "many"), [({"X": 2, "Z": 4}, False), ({"X": 16, "Z": 16}, True)])
@pytest.mark.parametrize("seed", range(3))
def test_held_values_count_on_their_chips(sizes: dict[str, int], many: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    mesh = shardsim.Mesh(sizes)
    ref = Reference(mesh.shape)
    masks = _masks(rng, mesh.shape, many)
    live: list[tuple[ShardedArray, np.ndarray]] = []
    orphans: dict[int, tuple[str, np.ndarray]] = {}  # buffers whose owner died before its views
    layout = Layout.parse("[B]")
    for step in range(400):
        r = rng.random()
        if r < 0.55 or not live:
            holders = masks[rng.integers(len(masks))]
            category = CATEGORIES[rng.integers(len(CATEGORIES))]
            n = int(rng.integers(0, 50))
            x = ShardedArray(mesh, layout, (n,), np.dtype(np.int8), None, category=category, holders=holders)
            per_chip = np.full(mesh.shape, n, np.int64) * (True if holders is None else holders)
            ref.add(category, per_chip)
            live.append((x, per_chip))
        elif r < 0.65:  # a view shares the buffer: no bytes until the last user dies
            x, per_chip = live[rng.integers(len(live))]
            live.append((ShardedArray(mesh, x.layout, x.global_shape, x.dtype, None, view_of=x), per_chip * 0))
        elif r < 0.72:
            x, per_chip = live[rng.integers(len(live))]
            category = CATEGORIES[rng.integers(len(CATEGORIES))]
            if x.storage == x.uid and category != x.category:  # the buffer's owner moves it
                ref.add(x.category, -per_chip)
                x.as_category(category)
                ref.add(category, per_chip)
        elif r < 0.74:
            mesh.memory.reset_peak()
            ref.reset_peak()
        else:
            x, per_chip = live.pop(rng.integers(len(live)))
            views = [v for v, _ in live if v.storage == x.storage]
            if not views and x.storage == x.uid:
                ref.add(x.category, -per_chip)
            elif not views:  # the last view of a buffer whose owner died: the buffer goes
                owner = orphans.pop(x.storage)
                ref.add(owner[0], -owner[1])
            elif x.storage == x.uid:
                orphans[x.storage] = (x.category, per_chip)
            del x
        if step % 20 == 0:
            for c in ref.live:
                assert mesh.memory.live(c).tolist() == ref.live[c].tolist(), (step, c)
                assert mesh.memory.peak(c).tolist() == ref.peak[c].tolist(), (step, c)
            assert mesh.memory.live().tolist() == ref.total.tolist(), step
            assert mesh.memory.peak().tolist() == ref.total_peak.tolist(), step
