"""Layouts as JAX ``PartitionSpec``\\ s and as PyTorch DTensor placements: the one place for the mapping.

A layout says, per array dimension, which mesh axes split it (major first), and which axes
the value is a partial sum over. JAX's ``PartitionSpec`` says the same per dimension: ``None``
for unsplit, ``"X"`` for one axis, ``("X", "Y")`` for several (``X`` major), and names the
partial-sum axes ``unreduced``. DTensor turns it around: one placement per *mesh* axis, in mesh
order: ``Shard(d)`` (the axis splits dimension ``d``), ``Replicate()`` or ``Partial()``.

===========================  ===============================  =====================================
shardsim layout              ``PartitionSpec``                DTensor placements on ``Mesh(X, Y)``
===========================  ===============================  =====================================
``[B_X, D_Y]``               ``P("X", "Y")``                  ``(Shard(0), Shard(1))``
``[B, D_XY]``                ``P(None, ("X", "Y"))``          ``(Shard(1), Shard(1))``
``[B_X, D]{U_Y}``            ``P("X", None, unreduced={"Y"})``  ``(Shard(0), Partial())``
``[B, D_YX]``                ``P(None, ("Y", "X"))``          refused: placements split in mesh order
===========================  ===============================  =====================================

Without JAX installed, :func:`to_partition_spec` returns this module's :class:`PartitionSpec`:
a tuple of JAX's entries, one per dimension, with JAX's ``unreduced`` set. torch is never
imported: :class:`Shard`, :class:`Replicate` and :class:`Partial` are small classes named as
DTensor names them, and :func:`from_placements` also reads DTensor's own by their names.

>>> from shardsim import Mesh
>>> from shardsim.layout import Layout
>>> mesh = Mesh(X=2, Y=4)
>>> lay = Layout.parse("[B_X, D]{U_Y}")
>>> to_placements(lay, mesh)
(Shard(dim=0), Partial(reduce_op='sum'))
>>> from_placements((Shard(1), Shard(1)), mesh, ndim=2, names="BD")
Layout('[B, D_XY]')
>>> from_partition_spec(("X", None), mesh, names=["B", "D"])
Layout('[B_X, D]')
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import LayoutParseError, MeshAxisError, PartialSumError, ShapeError, ShardingError
from .layout import DIM_NAME, Dim, Layout
from .mesh import Mesh


# -- DTensor's placements, named as DTensor names them ------------------------------------------
@dataclass(frozen=True)
class Shard:
    """The mesh axis splits array dimension ``dim`` (DTensor's ``Shard(dim)``)."""

    dim: int


@dataclass(frozen=True)
class Replicate:
    """Every chip along the mesh axis holds the same block (DTensor's ``Replicate()``)."""


@dataclass(frozen=True)
class Partial:
    """The value is the sum of the blocks along the mesh axis (DTensor's ``Partial()``, ``{U_X}``).

    shardsim's partial sums are sums: any other ``reduce_op`` is refused by :func:`from_placements`.
    """

    reduce_op: str = "sum"


Placement = Shard | Replicate | Partial


# -- a PartitionSpec when JAX is not installed ----------------------------------------------------
SpecEntry = str | tuple[str, ...] | None


class PartitionSpec(tuple):  # type: ignore[type-arg]  # entries are None, str or tuples of str
    """One entry per dimension (``None``, an axis name, a tuple of axis names), and ``unreduced``.

    What ``jax.sharding.PartitionSpec`` holds (its entries, and an ``unreduced`` set of
    partial-sum axes), for when JAX is not installed: a tuple of the entries, equal to a plain
    tuple when it has no unreduced axes.

    >>> PartitionSpec("X", None, ("Y", "Z"), unreduced={"W"})
    PartitionSpec('X', None, ('Y', 'Z'), unreduced={'W'})
    >>> PartitionSpec("X", None) == ("X", None)
    True
    """

    unreduced: frozenset[str]

    def __new__(cls, *entries: SpecEntry, unreduced: Iterable[str] = ()) -> PartitionSpec:
        spec = super().__new__(cls, entries)
        spec.unreduced = frozenset(unreduced)
        return spec

    def __eq__(self, other: object) -> bool:
        mine: frozenset[str] = getattr(self, "unreduced", frozenset())
        theirs = frozenset(getattr(other, "unreduced", ()) or ())
        entries = getattr(other, "partitions", other)  # JAX's PartitionSpec is no tuple: read its entries
        return isinstance(entries, tuple) and tuple(self) == tuple(entries) and mine == theirs

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((tuple(self), self.unreduced))

    def __repr__(self) -> str:
        inner = ", ".join(repr(e) for e in self)
        if self.unreduced:
            inner += (", " if inner else "") + "unreduced={" + ", ".join(repr(a) for a in sorted(self.unreduced)) + "}"
        return f"PartitionSpec({inner})"


P = PartitionSpec


# -- layouts <-> PartitionSpec -----------------------------------------------------------------
def to_partition_spec(layout: Layout | str) -> Any:
    """The ``PartitionSpec`` of ``layout``: ``jax.sharding.PartitionSpec`` if JAX is importable,
    else this module's :class:`PartitionSpec` (a tuple of the same shape).

    A partial sum ``{U_Y}`` becomes ``unreduced={"Y"}``; a JAX whose ``PartitionSpec`` has no
    ``unreduced`` cannot say it, and :class:`~shardsim.PartialSumError` asks to reduce first.

    >>> tuple(to_partition_spec("[B_X, D, F_YZ]"))
    ('X', None, ('Y', 'Z'))
    """
    lay = Layout.parse(layout)
    entries = tuple(_entry(d.axes) for d in lay.dims)
    if importlib.util.find_spec("jax") is None:
        return PartitionSpec(*entries, unreduced=lay.partial)
    from jax.sharding import PartitionSpec as JaxSpec

    if not lay.partial:
        return JaxSpec(*entries)
    try:
        return JaxSpec(*entries, unreduced=frozenset(lay.partial))
    except TypeError:
        raise PartialSumError(
            f"layout {lay} is a partial sum over {list(lay.partial)}, and this JAX's PartitionSpec has no "
            "unreduced= to say so; reduce it first (all_reduce or reduce_scatter) or use to_placements, "
            "whose Partial() names it"
        ) from None


def from_partition_spec(
    spec: Iterable[Any], mesh: Mesh, *, names: Sequence[str] | str | None = None, ndim: int | None = None
) -> Layout:
    """The layout a ``PartitionSpec`` (JAX's, this module's, or a plain tuple) gives on ``mesh``.

    A spec shorter than ``ndim`` leaves the last dimensions unsplit, as JAX does. The dimensions
    are called ``names`` (default ``d0``, ``d1``, ...); ``unreduced`` axes become ``{U_...}``,
    in mesh order.

    >>> from shardsim import Mesh
    >>> from_partition_spec(P(("Y", "X"), unreduced={"Z"}), Mesh(X=2, Y=2, Z=2), ndim=2)
    Layout('[d0_YX, d1]{U_Z}')
    """
    layout = spec_layout(spec, mesh.axis_names, names=names, ndim=ndim)
    unreduced = {str(a) for a in getattr(spec, "unreduced", ()) or ()}
    for a in sorted(unreduced - set(mesh.axis_names)):
        mesh.check_axis(a)  # names the axes the mesh has
    return layout.validate(mesh.axis_names)


def spec_layout(
    spec: Iterable[Any],
    axis_names: Sequence[str] | None = None,
    *,
    names: Sequence[str] | str | None = None,
    ndim: int | None = None,
) -> Layout:
    """The layout a ``PartitionSpec`` spells, not yet checked against a mesh (:func:`from_partition_spec` checks).

    ``unreduced`` axes come in the order of ``axis_names`` (a mesh's), else sorted.

    >>> spec_layout(P("X", None, unreduced={"Y"}))
    Layout('[d0_X, d1]{U_Y}')
    """
    if isinstance(spec, str) or not hasattr(spec, "__iter__"):  # JAX's own PartitionSpec is no Sequence
        raise LayoutParseError(
            f"a PartitionSpec is a sequence with one entry per dimension, e.g. P('X', None); got {spec!r}"
        )
    # JAX's PartitionSpec refuses plain iteration when it carries unreduced axes: read .partitions
    entries = list(getattr(spec, "partitions", spec))
    rank = len(entries) if ndim is None else ndim
    if len(entries) > rank:
        raise ShapeError(f"PartitionSpec {spec!r} has {len(entries)} entries for an array of {rank} dimensions")
    entries += [None] * (rank - len(entries))
    axes = [_spec_axes(e, spec) for e in entries]
    unreduced = {str(a) for a in getattr(spec, "unreduced", ()) or ()}
    order = list(axis_names or ()) + sorted(unreduced - set(axis_names or ()))
    return Layout(
        tuple(Dim(n, a) for n, a in zip(_names(names, rank), axes)),
        tuple(a for a in order if a in unreduced),
    )


# -- layouts <-> DTensor placements -----------------------------------------------------------
def to_placements(layout: Layout | str, mesh: Mesh) -> tuple[Placement, ...]:
    """DTensor's placements of ``layout`` on ``mesh``: one per mesh axis, in mesh order.

    DTensor splits a dimension over several mesh axes in mesh order (the first mesh axis major),
    so a dimension whose axes run against the mesh's order (``D_YX`` on ``Mesh(X, Y)``) has no
    placements; :class:`~shardsim.ShardingError` names it and the fix.

    >>> from shardsim import Mesh
    >>> to_placements("[B, D_XY]", Mesh(X=2, Y=2, Z=2))
    (Shard(dim=1), Shard(dim=1), Replicate())
    """
    lay = Layout.parse(layout, mesh.axis_names).validate(mesh.axis_names)
    for d in lay.dims:
        order = [mesh.axis_index(a) for a in d.axes]
        if order != sorted(order):
            in_mesh_order = tuple(sorted(d.axes, key=mesh.axis_index))
            raise ShardingError(
                f"layout {lay}: {d} splits {d.name} over {list(d.axes)} with {d.axes[0]} major, but DTensor's "
                f"placements split a dimension in mesh order ({mesh}: {' before '.join(in_mesh_order)}), so "
                f"(Shard, Shard) would mean {Dim(d.name, in_mesh_order)}, other blocks on other chips. Use "
                f"{Dim(d.name, in_mesh_order)}, or a mesh whose axes come in the order {list(d.axes)}"
            )
    out: list[Placement] = []
    for a in mesh.axis_names:
        i = lay.axis_dim(a)
        out.append(Shard(i) if i is not None else Partial() if a in lay.partial else Replicate())
    return tuple(out)


def from_placements(
    placements: Sequence[Any], mesh: Mesh, ndim: int, *, names: Sequence[str] | str | None = None
) -> Layout:
    """The layout DTensor ``placements`` (one per mesh axis) give an ``ndim``-dimensional array.

    Takes this module's :class:`Shard`, :class:`Replicate`, :class:`Partial` or DTensor's own
    (read by their class names, ``dim`` and ``reduce_op``). A dimension sharded over several
    mesh axes is split in mesh order; ``Shard(-1)`` counts from the end, as in DTensor.

    >>> from shardsim import Mesh
    >>> from_placements([Partial(), Shard(-1)], Mesh(X=2, Y=2), ndim=2, names="BD")
    Layout('[B, D_Y]{U_X}')
    """
    if isinstance(placements, str) or not isinstance(placements, Sequence):
        raise LayoutParseError(
            f"placements are a sequence, one per mesh axis, e.g. (Shard(0), Replicate()); got {placements!r}"
        )
    if len(placements) != len(mesh.axis_names):
        raise MeshAxisError(
            f"{len(placements)} placements for {mesh}, which has {len(mesh.axis_names)} axes "
            f"{list(mesh.axis_names)}: give one placement per mesh axis, in mesh order"
        )
    slots: list[list[str]] = [[] for _ in range(ndim)]
    partial: list[str] = []
    for axis, p in zip(mesh.axis_names, placements):
        kind = type(p).__name__
        if kind == "Shard":
            dim = getattr(p, "dim", None)
            if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
                raise ShapeError(f"placement {p!r} on mesh axis {axis!r}: dim must be an integer in [{-ndim}, {ndim})")
            slots[dim % ndim].append(axis)
        elif kind == "Partial":
            op = getattr(p, "reduce_op", "sum")
            if op != "sum":
                raise PartialSumError(
                    f"placement {p!r} on mesh axis {axis!r}: shardsim's partial sums are sums; "
                    f"reduce_op {op!r} has no layout (reduce it in DTensor first)"
                )
            partial.append(axis)
        elif kind != "Replicate":
            strided = "; a _StridedShard splits against the mesh order, which layouts from placements cannot"
            raise LayoutParseError(
                f"placement {p!r} on mesh axis {axis!r} is none of Shard(dim), Replicate(), Partial()"
                + (strided if "Shard" in kind else "")
            )
    return Layout(tuple(Dim(n, tuple(s)) for n, s in zip(_names(names, ndim), slots)), tuple(partial))


# -- helpers -----------------------------------------------------------------------------------
def _entry(axes: tuple[str, ...]) -> SpecEntry:
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


def _spec_axes(entry: Any, spec: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, (tuple, list)) and all(isinstance(a, str) for a in entry):
        return tuple(entry)
    raise LayoutParseError(
        f"PartitionSpec {spec!r}: entry {entry!r} is none of None, an axis name, a tuple of axis names "
        "(P.UNCONSTRAINED has no layout: name the axes)"
    )


def _names(names: Sequence[str] | str | None, rank: int) -> tuple[str, ...]:
    """The dimension names: given (a string is one letter each) or ``d0``, ``d1``, ..."""
    if names is None:
        return tuple(f"d{i}" for i in range(rank))
    out = tuple(names)
    if len(out) != rank:
        raise ShapeError(f"{len(out)} dimension names {list(out)} for an array of {rank} dimensions")
    for n in out:
        if not isinstance(n, str) or not DIM_NAME.fullmatch(n):
            raise LayoutParseError(f"dimension name {n!r} must be letters and digits, starting with a letter")
    return out


__all__ = [
    "P",
    "Partial",
    "PartitionSpec",
    "Placement",
    "Replicate",
    "Shard",
    "from_partition_spec",
    "from_placements",
    "to_partition_spec",
    "to_placements",
]


# The same mappings as Layout's methods (``Layout.from_partition_spec(spec, mesh)``,
# ``layout.to_placements(mesh)``): Layout sits below meshes, so the methods are put on it
# from here. ``import shardsim`` imports this module.
def _layout_from_partition_spec(cls: type[Layout], spec: Iterable[Any], mesh: Mesh, **kwargs: Any) -> Layout:
    """The layout of a ``PartitionSpec`` on ``mesh`` (see :func:`shardsim.specs.from_partition_spec`)."""
    return from_partition_spec(spec, mesh, **kwargs)


def _layout_from_placements(
    cls: type[Layout], placements: Sequence[Any], mesh: Mesh, ndim: int, **kwargs: Any
) -> Layout:
    """The layout of DTensor placements on ``mesh`` (see :func:`shardsim.specs.from_placements`)."""
    return from_placements(placements, mesh, ndim, **kwargs)


setattr(Layout, "from_partition_spec", classmethod(_layout_from_partition_spec))  # noqa: B010 - see above
setattr(Layout, "to_partition_spec", to_partition_spec)  # noqa: B010
setattr(Layout, "from_placements", classmethod(_layout_from_placements))  # noqa: B010
setattr(Layout, "_spec_layout", staticmethod(spec_layout))  # noqa: B010 - Layout.parse reads a spec with it
setattr(Layout, "to_placements", to_placements)  # noqa: B010
