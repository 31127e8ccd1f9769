"""A virtual device mesh: ordered, named axes of chips.

>>> from shardsim import Mesh
>>> mesh = Mesh(X=2, Y=4)
>>> mesh.shape, mesh.size, mesh.axis_names
((2, 4), 8, ('X', 'Y'))
>>> mesh.coords(5)
{'X': 1, 'Y': 1}
>>> mesh.groups("Y")[0]
[{'X': 0, 'Y': 0}, {'X': 0, 'Y': 1}, {'X': 0, 'Y': 2}, {'X': 0, 'Y': 3}]
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .errors import ArgumentTypeError, MeshAxisError, ShardingError
from .memory import MemoryLedger

MAX_AXES = 4
# The ledger and the slowdowns hold one number per chip: past 2**24 chips (16.8 million, a
# hundred times the largest clusters built) those arrays alone would fill the host's memory.
MAX_CHIPS = 2**24


# Names a keyword argument of Mesh(...) could be mistaken for: instance attributes, and the
# ledger's capacity (Mesh(X=2, capacity=100) would otherwise be a 200-chip mesh).
_RESERVED = {
    "axis_names": "the attribute Mesh.axis_names",
    "shape": "the attribute Mesh.shape",
    "size": "the attribute Mesh.size",
    "failed": "the attribute Mesh.failed",
    "capacity": "the ledger's capacity: set mesh.memory.capacity = bytes per chip",
    # JAX's Mesh(devices, axis_names) and make_mesh(..., devices=): Mesh(X=2, devices=4) would
    # otherwise be an 8-chip mesh with an axis called "devices" (JAX's other keywords have a '_')
    "devices": "JAX's Mesh(devices, ...): a shardsim mesh's chips are virtual, as many as its axis sizes multiply to",
}


class Mesh:
    """Chips laid out on one to four named axes, e.g. ``Mesh(X=2, Y=2)``.

    Axis order matters: it is the order of the leading dimensions of every stacked value
    and the traversal order of a dimension split over several axes (``D_XY``: X major).
    Each mesh owns a :class:`~shardsim.memory.MemoryLedger` (``mesh.memory``) that tracks
    every chip's live bytes. Two meshes are never the same mesh, even with equal shapes.

    >>> Mesh({"data": 4, "model": 2}).shape
    (4, 2)
    """

    def __init__(self, axes: Mapping[str, int] | None = None, /, *positional: Any, **sizes: int) -> None:
        if positional or (axes is not None and not isinstance(axes, Mapping)):
            raise ArgumentTypeError(_positional_message(axes, positional))
        spec: dict[str, int] = dict(axes or {})
        for name, size in sizes.items():
            if name in spec:
                raise MeshAxisError(f"mesh axis {name!r} given twice")
            spec[name] = size
        if not 1 <= len(spec) <= MAX_AXES:
            raise MeshAxisError(f"a mesh has 1 to {MAX_AXES} axes, got {len(spec)}: {spec}; e.g. Mesh(X=2, Y=2)")
        for name, size in spec.items():
            if not isinstance(name, str) or not name.isidentifier() or "_" in name:
                raise MeshAxisError(
                    f"mesh axis name {name!r} must be letters and digits without '_' "
                    "(the underscore separates a dimension from its axes in 'D_X')"
                )
            if name in _RESERVED or hasattr(Mesh, name):
                where = _RESERVED.get(name) or f"the method Mesh.{name}"
                raise MeshAxisError(
                    f"mesh axis name {name!r} collides with {where}. Mesh(...) takes only axis sizes, so "
                    f"{name}= would make an axis called {name!r}; give the axis another name, e.g. Mesh(X=2)"
                )
            if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
                raise MeshAxisError(f"mesh axis {name!r} needs a positive integer size, got {size!r}")
        if math.prod(int(n) for n in spec.values()) > MAX_CHIPS:
            raise MeshAxisError(
                f"Mesh({', '.join(f'{a}={n}' for a, n in spec.items())}) has "
                f"{math.prod(int(n) for n in spec.values())} chips, more than the {MAX_CHIPS} a mesh can "
                "index; estimate very large systems with shardsim.cost on a smaller mesh"
            )
        spec = {name: int(size) for name, size in spec.items()}
        self._axes: dict[str, int] = spec
        self.axis_names: tuple[str, ...] = tuple(spec)
        self.shape: tuple[int, ...] = tuple(spec.values())
        self.size: int = 1
        for s in self.shape:
            self.size *= s
        self._ledger: MemoryLedger | None = None
        self.failed: set[tuple[int, ...]] = set()
        self._slow: dict[tuple[int, ...], float] = {}
        self._sizes: dict[str | tuple[str, ...], int] = {}  # axis_size's answers, asked once per op

    # -- axes ---------------------------------------------------------------------------
    def axis_size(self, axis: str | Iterable[str]) -> int:
        """Number of chips along one axis, or along several axes together.

        >>> Mesh(X=2, Y=4).axis_size(("X", "Y"))
        8
        """
        known = self._sizes.get(axis) if type(axis) is str else None
        if type(axis) is tuple and all(type(a) is str for a in axis):
            known = self._sizes.get(axis)
        if known is not None:
            return known
        n = 1
        for a in normalize_axes(axis):
            n *= self._axes[self.check_axis(a)]
        if type(axis) in (str, tuple):  # checked names: the same answer next time
            self._sizes[axis] = n  # type: ignore[index]
        return n

    def axis_index(self, axis: str) -> int:
        """Position of ``axis`` among the mesh axes (its leading dimension in stacked data)."""
        return self.axis_names.index(self.check_axis(axis))

    def check_axis(self, axis: str) -> str:
        """Return ``axis`` if the mesh has it, else raise :class:`MeshAxisError` naming the axes it has."""
        if not isinstance(axis, str):
            raise ArgumentTypeError(f"axis={axis!r}: a mesh axis is named by a string, one of {list(self.axis_names)}")
        if axis not in self._axes:
            raise MeshAxisError(f"unknown mesh axis {axis!r}; this mesh has axes {list(self.axis_names)} ({self})")
        return axis

    # -- chips --------------------------------------------------------------------------
    def coords(self, chip: int) -> dict[str, int]:
        """Coordinates of the chip with flat index ``chip`` (row-major over the axes)."""
        if isinstance(chip, bool) or not isinstance(chip, numbers.Integral):
            raise ArgumentTypeError(
                f"coords(chip={chip!r}): a chip is named by its integer index, 0 to {self.size - 1}"
            )
        chip = int(chip)
        if not 0 <= chip < self.size:
            raise MeshAxisError(f"chip index {chip} out of range for {self} ({self.size} chips)")
        out: dict[str, int] = {}
        for name, size in reversed(self._axes.items()):
            chip, out[name] = divmod(chip, size)
        return dict(reversed(out.items()))

    def chips(self) -> list[dict[str, int]]:
        """All chips' coordinates, row-major."""
        return [dict(zip(self.axis_names, c)) for c in itertools.product(*map(range, self.shape))]

    def groups(self, axis: str | Iterable[str]) -> list[list[dict[str, int]]]:
        """The groups of chips that talk in a collective over ``axis``.

        Each group fixes the coordinates of the other axes and runs along ``axis`` (for a
        tuple of axes, along all of them, first axis major).
        """
        along = normalize_axes(axis)
        for a in along:
            self.check_axis(a)
        others = [a for a in self.axis_names if a not in along]
        groups = []
        for fixed in itertools.product(*(range(self._axes[a]) for a in others)):
            base = dict(zip(others, fixed))
            group = []
            for moving in itertools.product(*(range(self._axes[a]) for a in along)):
                c = {**base, **dict(zip(along, moving))}
                group.append({a: c[a] for a in self.axis_names})
            groups.append(group)
        return groups

    def chip_name(self, coords: Mapping[str, int]) -> str:
        """``(X0,Y1)``: the name the pictures and errors use for a chip."""
        return "(" + ",".join(f"{a}{coords[a]}" for a in self.axis_names) + ")"

    # -- memory -------------------------------------------------------------------------
    @property
    def memory(self) -> MemoryLedger:
        """This mesh's per-chip memory ledger (live and peak bytes by category)."""
        if self._ledger is None:
            self._ledger = MemoryLedger(self)
        return self._ledger

    # -- faults -------------------------------------------------------------------------
    def fail(self, **coords: int) -> None:
        """Mark the chip(s) at ``coords`` as failed; collectives that involve them raise.

        Axes left out mean every index along them: ``mesh.fail(X=1)`` fails a whole row.
        """
        for c in self._select(coords):
            self.failed.add(c)

    def heal(self) -> None:
        """Clear every failure mark and every slowdown."""
        self.failed.clear()
        self._slow.clear()

    def slow(self, factor: float, **coords: int) -> None:
        """Make the chip(s) at ``coords`` ``factor`` times slower (1.0: full speed again).

        Axes left out mean every index along them, as for :meth:`fail`. A cost model reads
        :attr:`slowdown`; values and collectives are unaffected.

        >>> mesh = Mesh(X=2, Y=2)
        >>> mesh.slow(3.0, X=1, Y=0)
        >>> mesh.slowdown
        array([[1., 1.],
               [3., 1.]])
        """
        if isinstance(factor, bool) or not isinstance(factor, numbers.Real) or not math.isfinite(factor) or factor <= 0:
            raise ShardingError(f"a slowdown factor is a positive finite number (2.0: half speed), got {factor!r}")
        for c in self._select(coords):
            if factor == 1:
                self._slow.pop(c, None)
            else:
                self._slow[c] = float(factor)

    @property
    def slowdown(self) -> np.ndarray:
        """Each chip's slowdown factor, shape ``mesh.shape`` (1.0 = full speed; a copy)."""
        out = np.ones(self.shape)
        for c, f in self._slow.items():
            out[c] = f
        return out

    def _select(self, coords: Mapping[str, int]) -> list[tuple[int, ...]]:
        for a, i in coords.items():
            self.check_axis(a)
            if isinstance(i, bool) or not isinstance(i, numbers.Integral):
                raise MeshAxisError(f"{a}={i!r}: a chip coordinate is an integer index along axis {a!r}")
            if not 0 <= i < self._axes[a]:
                raise MeshAxisError(f"{a}={i} is out of range: axis {a!r} has size {self._axes[a]}")
        ranges = [[coords[a]] if a in coords else range(s) for a, s in self._axes.items()]
        return list(itertools.product(*ranges))

    # -- display ------------------------------------------------------------------------
    def __repr__(self) -> str:
        return "Mesh(" + ", ".join(f"{a}={s}" for a, s in self._axes.items()) + ")"

    # _repr_html_ is the pictures' (shardsim.pictures puts it on the class)


def _positional_message(axes: Any, positional: tuple[Any, ...]) -> str:
    """Why ``Mesh(axes, *positional)`` is refused: the one positional argument is a mapping of sizes.

    JAX's ``Mesh(devices, axis_names)`` and ``make_mesh((2, 2), ("X", "Y"))`` put the sizes and the
    names in two sequences; the message spells the same mesh the shardsim way when it can.
    """
    given = ", ".join(
        f"<{type(a).__name__} of shape {a.shape}>" if hasattr(a, "shape") else repr(a) for a in (axes, *positional)
    )
    return (
        f"Mesh({given}): axes is a mapping of axis names to sizes, and the only positional argument; "
        f"name each axis with its size: {_same_mesh(axes, positional)} (or Mesh({{'data': 4, 'model': 2}})), "
        "not JAX's positional Mesh(devices, axis_names) or make_mesh(shape, names)"
    )


def _same_mesh(axes: Any, positional: tuple[Any, ...]) -> str:
    """``Mesh(X=2, Y=2)`` for JAX's ``((2, 2), ("X", "Y"))`` or a device array and names; an example otherwise."""
    try:
        sizes = tuple(np.shape(axes)) if hasattr(axes, "shape") else tuple(int(n) for n in axes)
        names = tuple(positional[0]) if positional else ("X", "Y", "Z", "W")[: len(sizes)]
        if len(names) != len(sizes) or not all(isinstance(n, str) for n in names):
            raise ValueError(names)
        return "Mesh(" + ", ".join(f"{a}={n}" for a, n in zip(names, sizes)) + ")"
    except Exception:  # neither a shape nor a device array with names: no translation to offer
        return "Mesh(X=2, Y=2)"


def normalize_axes(axis: str | Iterable[str], argument: str = "axis", op: str = "") -> tuple[str, ...]:
    """``"X"`` → ``("X",)``; a tuple or list stays in its order; a repeated axis is an error.

    Anything but a name or an iterable of names raises :class:`ArgumentTypeError` naming
    ``argument`` (the parameter the caller was given) of ``op``.

    >>> normalize_axes(["X", "Y"])
    ('X', 'Y')
    """
    if isinstance(axis, str):
        axes: tuple[str, ...] = (axis,)
    else:
        try:
            axes = tuple(axis)
        except TypeError:
            axes = (axis,)  # type: ignore[assignment]  # reported just below
    bad = [a for a in axes if not isinstance(a, str)]
    if bad or isinstance(axis, (bytes, Mapping)):
        raise ArgumentTypeError(
            f"{op + ': ' if op else ''}{argument}={axis!r} is not a mesh axis name or a tuple of names; "
            "pass e.g. 'X' or ('X', 'Y')"
        )
    if not axes:
        raise MeshAxisError(
            f"{op + ': ' if op else ''}{argument}=(): no mesh axis given; name one, e.g. 'X', or a tuple ('X', 'Y')"
        )
    if len(set(axes)) != len(axes):
        raise MeshAxisError(f"mesh axis repeated in {axes}")
    return axes
