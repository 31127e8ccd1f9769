"""Per-chip memory: a ledger of live bytes, measured from the program's real lifetimes.

Every sharded value enters its mesh's ledger when it is created and leaves it when its
Python object dies, so the ledger sees what a chip would hold: a weight replicated on 8
chips counts its full size on each of them, whatever the host stores. Bytes are kept per
chip and per category (``params``, ``grads``, ``optimizer``, ``activations``,
``temporaries`` or any name a program sets).

>>> import shardsim, numpy as np
>>> mesh = shardsim.Mesh(X=8)
>>> w = shardsim.shard(np.zeros((64, 64), np.float32), mesh, "D F", category="params")
>>> int(mesh.memory.live("params")[3])
16384
>>> del w
>>> int(mesh.memory.live("params")[3])
0
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ._format import fmt_bytes
from .errors import OutOfMemoryError, ShardingError
from .journal import Journal


class Chips(Protocol):
    """What the ledger reads of a mesh (a :class:`~shardsim.mesh.Mesh` is one): it sits below meshes.

    >>> import shardsim
    >>> shardsim.Mesh(X=2, Y=4).memory.mesh.shape
    (2, 4)
    """

    @property
    def axis_names(self) -> tuple[str, ...]: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def size(self) -> int: ...
    def chip_name(self, coords: Mapping[str, int]) -> str: ...
    def chips(self) -> list[dict[str, int]]: ...


class Allocation(Protocol):
    """What the ledger reads of a value it counts (a :class:`~shardsim.array.ShardedArray` is one).

    >>> import numpy as np, shardsim
    >>> mesh = shardsim.Mesh(X=2)
    >>> a = shardsim.shard(np.ones((4, 2), np.float32), mesh, "B_X D")
    >>> a.local_nbytes, int(mesh.memory.live()[0])
    (16, 16)
    """

    @property
    def storage(self) -> int: ...
    @property
    def local_nbytes(self) -> int: ...
    @property
    def label(self) -> str | None: ...
    @property
    def category(self) -> str: ...
    @property
    def holders(self) -> np.ndarray | None: ...
    @property
    def layout(self) -> object: ...
    @property
    def global_shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> np.dtype: ...
    def describe(self) -> str: ...


CATEGORIES = ("params", "grads", "optimizer", "activations", "temporaries")
_MOST = 2**63 - 1  # the ledger's counts are int64: refuse what would wrap them


@dataclass(slots=True)
class _Entry:
    label: str
    layout: object  # printed only when a report asks (str of an immutable layout)
    category: str
    nbytes: int  # on each chip that holds it
    holders: np.ndarray | None  # the chips that hold it (None: every chip)
    mask: bytes | None  # the holders as the ledger's chip classes know them
    users: int = 1  # values sharing this buffer (a value and its transposes)
    ref: Any = None  # weak reference to the value, for the label it has now (named() comes later)
    views: list[Any] = field(default_factory=list)  # weak references to the others, while it lives

    def name(self) -> str:
        value = self.ref() if self.ref is not None else None
        return (value.label if value is not None else None) or self.label

    def on(self, chip: tuple[int, ...]) -> int:
        """The bytes chip ``chip`` holds."""
        return self.nbytes if self.holders is None or self.holders[chip] else 0


# Past this many classes of chips (see _Classes), every chip is its own, counted in NumPy arrays.
_MOST_CLASSES = 64


class _Classes:
    """The chips of a mesh in classes that each holders mask seen so far covers whole or misses
    whole, so that every chip of a class holds the same bytes: the ledger counts per class.

    A pipeline's values are held by one stage's chips: 512 chips in 2 stages are 2 classes,
    and a value adds its bytes to one or two Python ints, not to NumPy arrays of 512 (on small
    arrays NumPy's call costs more than the sums, and shape-only steps count tens of thousands
    of values). Masks that would make more than ``_MOST_CLASSES`` classes make every chip its
    own class, counted in NumPy arrays (``vector``).

    >>> c = _Classes((4,))
    >>> c.covered(None), c.covered(np.array([True, True, False, False])), c.of.tolist()
    ((0,), (1,), [1, 1, 0, 0])
    """

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self.of = np.zeros(shape, np.intp)  # each chip's class
        self.every: tuple[int, ...] | slice = (0,)  # every class
        self.count = 1  # classes (chips, once vector)
        self.vector = False
        self.counters: list[_Bytes] = []  # the counts to split with the classes
        self._covers: dict[bytes, Any] = {}  # a mask's classes (a tuple; chip indices when vector)

    def key(self, holders: np.ndarray | None) -> bytes | None:
        return None if holders is None else holders.astype(bool, copy=False).tobytes()

    def covered(self, mask: bytes | np.ndarray | None) -> Any:
        """The classes a holders mask (or its :meth:`key`) covers, splitting classes it cuts."""
        if mask is None:
            return self.every
        key = mask if isinstance(mask, bytes) else mask.astype(bool, copy=False).tobytes()
        hit = self._covers.get(key)
        if hit is None:
            hit = self._covers[key] = self._split(np.frombuffer(key, np.bool_).reshape(self.shape))
        return hit

    def _split(self, mask: np.ndarray) -> Any:
        if self.vector:
            return np.flatnonzero(mask)
        halves, of = np.unique(self.of * 2 + mask, return_inverse=True)
        if len(halves) > _MOST_CLASSES:
            self._vectorize()
            return np.flatnonzero(mask)
        if len(halves) > self.count:  # some class is cut in two: renumber, copying its counts
            parent = (halves // 2).tolist()
            self.of = of.reshape(self.shape)
            for k, classes in self._covers.items():
                self._covers[k] = tuple(j for j, p in enumerate(parent) if p in classes)
            for counts in self.counters:
                counts.split(parent)
            self.count, self.every = len(halves), tuple(range(len(halves)))
        return tuple(j for j, h in enumerate(halves.tolist()) if h & 1)

    def _vectorize(self) -> None:
        for counts in self.counters:
            counts.vectorize(self.of)
        self.of = np.arange(self.of.size).reshape(self.shape)
        self.vector, self.every, self.count = True, slice(None), self.of.size
        self._covers = {k: np.flatnonzero(np.frombuffer(k, np.bool_)) for k in self._covers}

    def counts(self) -> _Bytes:
        """New counts (all zero) that follow these classes."""
        counts = _Bytes(self)
        self.counters.append(counts)
        return counts


class _Bytes:
    """Live and peak bytes of one category (or of all), per class of chips (see :class:`_Classes`).

    >>> chips = _Classes((2,)); b = chips.counts()
    >>> b.add(chips.covered(None), 3); b.add(chips.covered(np.array([True, False])), 4)
    >>> b.add(chips.covered(None), -3, grows=False); b.add(chips.covered(None), 2)
    >>> b.live().tolist(), b.peak().tolist()
    ([6, 2], [7, 3])
    """

    def __init__(self, chips: _Classes) -> None:
        self.chips = chips
        n = chips.count
        self._live: Any = np.zeros(n, np.int64) if chips.vector else [0] * n
        self._peak: Any = np.zeros(n, np.int64) if chips.vector else [0] * n

    def add(self, classes: Any, nbytes: int, grows: bool = True) -> None:
        """Add ``nbytes`` to each of ``classes``; a release (``grows`` False) cannot raise a peak."""
        live, peak = self._live, self._peak
        if self.chips.vector:
            live[classes] += nbytes
            if grows:
                np.maximum(peak, live, out=peak)
            return
        for k in classes:
            live[k] += nbytes
            if grows and live[k] > peak[k]:
                peak[k] = live[k]

    def split(self, parent: list[int]) -> None:
        """Class ``j`` is now part of what was class ``parent[j]``."""
        self._live = [self._live[p] for p in parent]
        self._peak = [self._peak[p] for p in parent]

    def vectorize(self, of: np.ndarray) -> None:
        """Every chip its own class (``of``: each chip's class until now)."""
        self._live = np.array(self._live, np.int64)[of].ravel()
        self._peak = np.array(self._peak, np.int64)[of].ravel()

    def _chips(self, counts: Any) -> np.ndarray:
        return np.array(counts, np.int64)[self.chips.of]  # a new array, indexed by chip

    def live(self) -> np.ndarray:
        return self._chips(self._live)

    def peak(self) -> np.ndarray:
        return self._chips(self._peak)

    def most(self) -> int:
        """The busiest chip's live bytes."""
        return int(self._live.max() if self.chips.vector else max(self._live))

    def reset_peak(self) -> None:
        self._peak = self._live.copy()


def per_chip(memory: Mapping[str, np.ndarray]) -> dict[str, int]:
    """The busiest chip's bytes in each category.

    >>> per_chip({"params": np.array([3, 5]), "total": np.array([4, 9])})
    {'params': 5, 'total': 9}
    """
    return {c: int(np.max(v)) for c, v in memory.items()}


class MemoryLedger:
    """Live and peak bytes of every chip of a mesh, by category.

    ``live()`` / ``peak()`` return arrays of shape ``mesh.shape``; with a category, that
    category's bytes (its own peak for ``peak``). ``capacity`` (bytes per chip, None for
    unlimited) turns an allocation that does not fit into :class:`OutOfMemoryError`.
    """

    def __init__(self, mesh: Chips) -> None:
        self.mesh = mesh
        self._capacity: int | None = None
        self._entries: dict[int, _Entry] = {}
        self._chips = _Classes(mesh.shape)
        self._bytes: dict[str, _Bytes] = {}  # by category, in the order first seen
        self._total = self._chips.counts()
        # At least the busiest chip's bytes (every allocation adds its size, releases take
        # nothing off): while it stays far from the int64 limit, no allocation reads the
        # chips' totals to check it. Only a bound past the limit is recomputed exactly.
        self._bound = 0
        # every change of the live bytes, when set (:mod:`shardsim.journal`: the same program's
        # peaks at another size, from two journals)
        self.journal: Journal | None = None

    @property
    def capacity(self) -> int | None:
        """Bytes each chip holds at most (None: unlimited); set it to a whole number of bytes."""
        return self._capacity

    @capacity.setter
    def capacity(self, nbytes: int | None) -> None:
        if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes < 0):
            raise ShardingError(
                f"mesh.memory.capacity = {nbytes!r}: a capacity is a whole number of bytes per chip "
                "(e.g. 16 * 2**30 for 16 GiB), or None for unlimited"
            )
        self._capacity = None if nbytes is None else int(nbytes)

    # -- bookkeeping (called by ShardedArray) -------------------------------------------
    def allocate(self, value: Allocation) -> None:
        """Count ``value``'s bytes until it dies (a view of a live buffer adds none)."""
        storage = value.storage
        # released when the value dies, as weakref.finalize would do, for less; the
        # reference lives in the buffer's entry
        ref = weakref.ref(value, lambda _: self.release(storage))
        shared = self._entries.get(storage)
        if shared is not None:  # a view of a live buffer: no new bytes
            shared.users += 1
            shared.views.append(ref)
            return
        nbytes = value.local_nbytes
        if self._bound > _MOST - nbytes:
            self._bound = self._total.most()
            if self._bound > _MOST - nbytes:  # int64 counts must not wrap
                raise OutOfMemoryError(
                    f"{value.describe()} ({fmt_bytes(nbytes)} per chip) would take a chip past "
                    f"{fmt_bytes(_MOST)}, the most the ledger counts and far more than any chip holds; "
                    "release values or use smaller sizes"
                )
        holders = value.holders
        if self._capacity is not None:
            self._check_capacity(value, nbytes if holders is None else holders * np.int64(nbytes))
        category, mask = value.category, self._chips.key(holders)
        self._entries[storage] = _Entry(value.label or "", value.layout, category, nbytes, holders, mask, ref=ref)
        self._add(category, mask, nbytes)
        self._bound += nbytes

    def release(self, storage: int) -> None:
        entry = self._entries.get(storage)
        if entry is None:
            return
        entry.users -= 1
        if entry.users == 0:
            del self._entries[storage]
            self._add(entry.category, entry.mask, -entry.nbytes, grows=False)

    def recategorize(self, value: Allocation, category: str) -> None:
        entry = self._entries.get(value.storage)
        if entry is None or entry.category == category:
            return
        self._add(entry.category, entry.mask, -entry.nbytes, grows=False)
        entry.category = category
        self._add(category, entry.mask, entry.nbytes)

    def _add(self, category: str, mask: bytes | None, nbytes: int, grows: bool = True) -> None:
        """Add ``nbytes`` to ``category`` on the chips of ``mask`` (a release, ``grows`` False,
        cannot raise a peak)."""
        if self.journal is not None:
            self.journal.changes.append((category, mask, nbytes))
            if len(self.journal.changes) > self.journal.most:  # a long program: keep no journal of it
                self.journal.changes, self.journal = [], None
        counts = self._bytes.get(category)
        if counts is None:
            counts = self._bytes[category] = self._chips.counts()
        classes = self._chips.covered(mask)
        counts.add(classes, nbytes, grows)
        self._total.add(classes, nbytes, grows)

    def _check_capacity(self, value: Allocation, per_chip: int | np.ndarray) -> None:
        if self.capacity is None:
            return
        total = self._total.live()
        after = total + per_chip
        if (after <= self.capacity).all():
            return
        chip = tuple(int(i) for i in np.unravel_index(int(np.argmax(after)), self.mesh.shape))
        coords = dict(zip(self.mesh.axis_names, chip))
        live, want, cap = int(total[chip]), int(np.broadcast_to(per_chip, total.shape)[chip]), int(self.capacity)
        over = int((after > self.capacity).sum())
        on_chip = ((int(b.live()[chip]), c) for c, b in self._bytes.items())
        by_cat = sorted(((n, c) for n, c in on_chip if n > 0), reverse=True)
        cats = ", ".join(f"{c} {fmt_bytes(n)}" for n, c in by_cat) or "nothing"
        raise OutOfMemoryError(
            f"out of memory on chip {self.mesh.chip_name(coords)}: cannot allocate {fmt_bytes(want)} "
            f"({want} bytes) per chip for {value.label or 'a value'}{value.layout} {value.global_shape} "
            f"{value.dtype} ({value.category}).\n"
            f"In use {fmt_bytes(live)} + requested {fmt_bytes(want)} = {fmt_bytes(live + want)} > capacity "
            f"{fmt_bytes(cap)} ({cap} bytes); short by {fmt_bytes(live + want - cap)}; "
            f"{over} of {self.mesh.size} chips over capacity.\n"
            f"In use on that chip by category: {cats}.\n"
            "Largest live values on that chip:\n" + self.largest_text(chip)
        )

    # -- queries ------------------------------------------------------------------------
    def live(self, category: str | None = None) -> np.ndarray:
        """Bytes live now on each chip (all categories, or one)."""
        counts = self._total if category is None else self._bytes.get(category)
        return np.zeros(self.mesh.shape, np.int64) if counts is None else counts.live()

    def peak(self, category: str | None = None) -> np.ndarray:
        """Peak bytes on each chip since the last :meth:`reset_peak` (all categories, or one's own)."""
        counts = self._total if category is None else self._bytes.get(category)
        return np.zeros(self.mesh.shape, np.int64) if counts is None else counts.peak()

    def categories(self) -> list[str]:
        """Categories seen so far, the standard ones first."""
        seen = list(self._bytes)
        return [c for c in CATEGORIES if c in seen] + [c for c in seen if c not in CATEGORIES]

    def reset_peak(self) -> None:
        """Start measuring peaks from the bytes live now."""
        for counts in (self._total, *self._bytes.values()):
            counts.reset_peak()
        if self.journal is not None:
            self.journal.reset = len(self.journal.changes)

    def largest(self, chip: tuple[int, ...], n: int = 5) -> list[tuple[str, str, str, int]]:
        """The ``n`` largest live values on ``chip``: (label, layout, category, bytes)."""
        rows = [(e.name(), str(e.layout), e.category, e.on(chip)) for e in self._entries.values()]
        rows = [r for r in rows if r[3] > 0]
        return sorted(rows, key=lambda r: -r[3])[:n]

    def largest_text(self, chip: tuple[int, ...], n: int = 5) -> str:
        rows = self.largest(chip, n)
        if not rows:
            return "  (nothing live)"
        return "\n".join(f"  {fmt_bytes(b):>10}  {c:<12} {lbl or '?'}{lay}" for lbl, lay, c, b in rows)

    def snapshot(self) -> dict[str, dict[str, np.ndarray]]:
        """``{"live": {category: per-chip}, "peak": {...}}`` plus ``"total"`` entries."""
        cats = self.categories()
        return {
            "live": {**{c: self.live(c) for c in cats}, "total": self.live()},
            "peak": {**{c: self.peak(c) for c in cats}, "total": self.peak()},
        }

    def __repr__(self) -> str:
        """``MemoryLedger(Mesh(X=2))``: the same text every run (an executed notebook stays stable).

        >>> from shardsim import Mesh
        >>> Mesh(X=2).memory
        MemoryLedger(Mesh(X=2))
        """
        return f"MemoryLedger({self.mesh!r})"

    # __str__ and _repr_html_ are the pictures' (shardsim.pictures puts them on the class)


# The closed forms the ledger is held to (ZeRO model state, communication, activations).
from . import formulas as _formulas  # noqa: E402

bytes_per_param = _formulas.bytes_per_param
model_state_breakdown = _formulas.model_state_breakdown
model_state_bytes = _formulas.model_state_bytes
scheme_model_state = _formulas.scheme_model_state
zero_comm_bytes = _formulas.zero_comm_bytes
zero_comm_elements = _formulas.zero_comm_elements
mlp_activation_bytes = _formulas.mlp_activation_bytes
