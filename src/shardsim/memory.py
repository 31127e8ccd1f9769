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
    # bytes on each chip: an int when every chip holds the same (most values: no array to
    # build, and NumPy adds an int to the ledger's arrays faster), else an array of mesh.shape
    per_chip: int | np.ndarray
    users: int = 1  # values sharing this buffer (a value and its transposes)
    ref: Any = None  # weak reference to the value, for the label it has now (named() comes later)
    views: list[Any] = field(default_factory=list)  # weak references to the others, while it lives

    def name(self) -> str:
        value = self.ref() if self.ref is not None else None
        return (value.label if value is not None else None) or self.label

    def on(self, chip: tuple[int, ...]) -> int:
        """The bytes chip ``chip`` holds."""
        return _on(self.per_chip, chip)


def _on(per_chip: int | np.ndarray, chip: tuple[int, ...]) -> int:
    return per_chip if isinstance(per_chip, int) else int(per_chip[chip])


class _Bytes:
    """Live and peak bytes of one category (or of all) on every chip.

    Most values are held by every chip: while only such values are live, every chip holds
    the same bytes and the counts are Python ints (``flat``), with no NumPy call per value
    (shape-only steps count tens of thousands). Once a value held on some chips only is
    live, the live bytes are an array of ``mesh.shape`` (``shaped``) until the last such
    value dies. The peak on each chip is ``max(peak_shaped, peak_flat)``.

    >>> b = _Bytes((2,)); b.add(3); b.add(np.array([4, 0])); b.add(-3, grows=False); b.add(2)
    >>> b.live().tolist(), b.peak().tolist()
    ([6, 2], [7, 3])
    """

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.flat = self.peak_flat = 0  # while `shaped` is None: every chip's live and peak bytes
        self.shaped: np.ndarray | None = None
        self.peak_shaped = np.zeros(shape, np.int64)
        self.masked = 0  # live values held on some chips only

    def add(self, per_chip: int | np.ndarray, grows: bool = True) -> None:
        """Add ``per_chip`` bytes; a release (``grows`` False) cannot raise a peak."""
        shaped = self.shaped
        if per_chip.__class__ is int:
            if shaped is None:
                self.flat += per_chip  # type: ignore[operator]
                if self.flat > self.peak_flat:
                    self.peak_flat = self.flat
                return
        else:
            self.masked += 1 if grows else -1
            if shaped is None:
                shaped = self.shaped = np.full(self.peak_shaped.shape, self.flat, np.int64)
        shaped += per_chip
        if grows:
            np.maximum(self.peak_shaped, shaped, out=self.peak_shaped)
        elif not self.masked:  # every chip holds the same again
            self.flat, self.shaped = int(shaped.flat[0]), None

    def live(self) -> np.ndarray:
        shape = self.peak_shaped.shape
        return np.full(shape, self.flat, np.int64) if self.shaped is None else self.shaped.copy()

    def peak(self) -> np.ndarray:
        return np.maximum(self.peak_shaped, self.peak_flat)

    def reset_peak(self) -> None:
        self.peak_shaped, self.peak_flat = self.live(), 0


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
        self._bytes: dict[str, _Bytes] = {}  # by category, in the order first seen
        self._total = _Bytes(mesh.shape)
        # At least the busiest chip's bytes (every allocation adds its size, releases take
        # nothing off): while it stays far from the int64 limit, no allocation reads the
        # chips' totals to check it. Only a bound past the limit is recomputed exactly.
        self._bound = 0

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
            self._bound = int(self._total.live().max(initial=0))
            if self._bound > _MOST - nbytes:  # int64 counts must not wrap
                raise OutOfMemoryError(
                    f"{value.describe()} ({fmt_bytes(nbytes)} per chip) would take a chip past "
                    f"{fmt_bytes(_MOST)}, the most the ledger counts and far more than any chip holds; "
                    "release values or use smaller sizes"
                )
        per_chip: int | np.ndarray = nbytes  # the same bytes on every chip
        if value.holders is not None:
            per_chip = value.holders * np.int64(nbytes)
        if self._capacity is not None:
            self._check_capacity(value, per_chip)
        category = value.category
        self._entries[storage] = _Entry(value.label or "", value.layout, category, per_chip, ref=ref)
        self._add(category, per_chip)
        self._bound += nbytes

    def release(self, storage: int) -> None:
        entry = self._entries.get(storage)
        if entry is None:
            return
        entry.users -= 1
        if entry.users == 0:
            del self._entries[storage]
            self._add(entry.category, -entry.per_chip, grows=False)

    def recategorize(self, value: Allocation, category: str) -> None:
        entry = self._entries.get(value.storage)
        if entry is None or entry.category == category:
            return
        self._add(entry.category, -entry.per_chip, grows=False)
        entry.category = category
        self._add(category, entry.per_chip)

    def _add(self, category: str, per_chip: int | np.ndarray, grows: bool = True) -> None:
        """Add ``per_chip`` bytes to ``category``; a release (``grows`` False) cannot raise a peak."""
        counts = self._bytes.get(category)
        if counts is None:
            counts = self._bytes[category] = _Bytes(self.mesh.shape)
        counts.add(per_chip, grows)
        self._total.add(per_chip, grows)

    def _check_capacity(self, value: Allocation, per_chip: int | np.ndarray) -> None:
        if self.capacity is None:
            return
        total = self._total.live()
        after = total + per_chip
        if (after <= self.capacity).all():
            return
        chip = tuple(int(i) for i in np.unravel_index(int(np.argmax(after)), self.mesh.shape))
        coords = dict(zip(self.mesh.axis_names, chip))
        live, want, cap = int(total[chip]), _on(per_chip, chip), int(self.capacity)
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
