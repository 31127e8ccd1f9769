"""Layouts in the scaling book's notation: ``[B_X, D_Y]``, ``[D_XY, F]``, ``[B, D]{U_Y}``.

A layout names each dimension and the mesh axes it is split over (major axis first), plus
the axes over which the value is an unreduced partial sum. A bare name is replicated over
every axis it does not mention. One mesh axis may be used once: on one dimension, or as a
partial-sum axis ("once a mesh dimension has been used it is spent").

>>> from shardsim.layout import Layout
>>> lay = Layout.parse("[B_X, D]{U_Y}")
>>> lay, lay.dim_axes("B"), lay.partial
(Layout('[B_X, D]{U_Y}'), ('X',), ('Y',))
>>> Layout.parse("D_XY F").dims[0].axes
('X', 'Y')
"""

from __future__ import annotations

import functools
import numbers
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from .errors import LayoutParseError, MatmulShardingError, MeshAxisError, ShapeError

if TYPE_CHECKING:
    from .mesh import Mesh

# A letter (any script: mesh axes may be named "αβ"), then letters and digits; never "_".
DIM_NAME = re.compile(r"[^\W\d_][^\W_]*")
# How a JAX user gets a layout from a PartitionSpec, named wherever a spec is mistaken for a layout.
SPEC_ROUTE = (
    "a JAX PartitionSpec converts with Layout.from_partition_spec(P('X', None), mesh) "
    "(P is jax.sharding.PartitionSpec or shardsim.specs.P)"
)
# Dimension names a layout suggested in place of a PartitionSpec's entries uses, in order.
_SUGGESTED_NAMES = "BDFGHKLMNRST"
# One dimension or partial-sum token: commas inside a brace subscript (D_{data,model}) do not split it.
_TOKEN = re.compile(r"[^,\s{]*\{[^}]*\}?[^,\s]*|[^,\s]+")


@dataclass(frozen=True)
class Dim:
    """One dimension of a layout: its name and the mesh axes it is split over (major first)."""

    name: str
    axes: tuple[str, ...] = ()

    def __str__(self) -> str:
        # Dims and layouts are immutable and printed for every trace event (shape-only steps
        # print hundreds of thousands): the text is built once per object, on first use.
        text: str | None = self.__dict__.get("_text")
        if text is None:
            text = self.name + _subscript(self.axes)
            object.__setattr__(self, "_text", text)
        return text


@dataclass(frozen=True)
class Layout:
    """The dimensions of a sharded value and the axes over which it is a partial sum."""

    dims: tuple[Dim, ...]
    partial: tuple[str, ...] = ()

    # -- construction -------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str | Layout, axis_names: Sequence[str] | None = None) -> Layout:
        """Parse ``"[B_X, D_Y]{U_Z}"``, ``"B_X D_Y"`` or ``"D_{data,model} F"``.

        With ``axis_names`` (a mesh's axes), a subscript like ``XY`` is split into known axis
        names (into single letters when each letter is an axis, else longest names first);
        without, each letter is one axis. ``"[]"`` is a rank-0 value. ``str(layout)`` parses
        back to ``layout`` on its mesh: axes with names longer than a letter print in braces.
        A ``PartitionSpec`` (JAX's or :data:`shardsim.specs.P`) is read as JAX reads it, its
        dimensions called ``d0``, ``d1``, ...; text that reads like one (``"X, None"``: a dimension
        called ``None``, or an unsplit one named as a mesh axis) is refused with the layout it means.

        >>> Layout.parse("[]"), Layout.parse("D_{data,αβ}").dims[0].axes
        (Layout('[]'), ('data', 'αβ'))
        """
        if isinstance(text, Layout):
            return text
        if is_partition_spec(text):
            if axis_names is None:
                return Layout._spec_layout(text)
            names = _axis_names(repr(text), axis_names)
            return Layout._spec_layout(text, names).validate(names)  # as a run-together subscript is checked
        if not isinstance(text, str):
            raise LayoutParseError(
                f"a layout is a string such as '[B_X, D_Y]', got {type(text).__name__} {text!r}"
                + (f"; {SPEC_ROUTE}" if isinstance(text, (tuple, list)) else "")
            )
        if type(text) is str and (axis_names is None or type(axis_names) is tuple):
            try:
                return _parsed(text, axis_names)  # type: ignore[arg-type]
            except TypeError:  # an unhashable axis name: the parser refuses it, as below
                pass
        return _Parser(text, axis_names).parse()

    # -- JAX PartitionSpec and DTensor placements: the mapping lives in shardsim.specs (a
    # layer above, as it reads meshes), which puts these four methods on the class. Declared
    # here for type checkers only.
    if TYPE_CHECKING:

        @classmethod
        def from_partition_spec(cls, spec: Iterable[Any], mesh: Mesh, **kwargs: Any) -> Layout: ...
        def to_partition_spec(self) -> Any: ...
        @staticmethod
        def _spec_layout(spec: Iterable[Any], axis_names: Sequence[str] | None = None) -> Layout: ...
        @classmethod
        def from_placements(cls, placements: Sequence[Any], mesh: Mesh, ndim: int, **kwargs: Any) -> Layout: ...
        def to_placements(self, mesh: Mesh) -> tuple[Any, ...]: ...

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims)

    def used_axes(self) -> tuple[str, ...]:
        """Every mesh axis the layout spends: on a dimension or as a partial sum."""
        return tuple(a for d in self.dims for a in d.axes) + self.partial

    def dim_index(self, dim: str | int) -> int:
        """Index of a dimension named ``dim`` (or checked index ``dim``)."""
        if isinstance(dim, numbers.Integral) and not isinstance(dim, bool):
            if not -self.rank <= dim < self.rank:
                raise ShapeError(f"dimension index {dim} out of range for layout {self} (rank {self.rank})")
            return int(dim) % self.rank
        if not isinstance(dim, str):
            raise ShapeError(
                f"dimension {dim!r}: name a dimension of layout {self} ({list(self.names)}) or give its index"
            )
        hits = [i for i, d in enumerate(self.dims) if d.name == dim]
        if len(hits) != 1:
            what = "no" if not hits else "more than one"
            raise ShapeError(
                f"layout {self} has {what} dimension named {dim!r}; name one of {list(self.names)} or give its index"
            )
        return hits[0]

    def dim_axes(self, dim: str | int) -> tuple[str, ...]:
        return self.dims[self.dim_index(dim)].axes

    def axis_dim(self, axis: str) -> int | None:
        """Index of the dimension split over ``axis``, or None."""
        for i, d in enumerate(self.dims):
            if axis in d.axes:
                return i
        return None

    def with_dim(self, i: int, axes: Iterable[str]) -> Layout:
        dims = list(self.dims)
        dims[i] = Dim(dims[i].name, tuple(axes))
        return Layout(tuple(dims), self.partial)

    def with_partial(self, partial: Iterable[str]) -> Layout:
        return Layout(self.dims, tuple(partial))

    def renamed(self, names: Sequence[str]) -> Layout:
        return Layout(tuple(Dim(n, d.axes) for n, d in zip(names, self.dims)), self.partial)

    def transposed(self, order: Sequence[int]) -> Layout:
        return Layout(tuple(self.dims[i] for i in order), self.partial)

    def validate(self, axis_names: Sequence[str]) -> Layout:
        """Check every axis exists in ``axis_names`` and none is used twice."""
        used = self.used_axes()
        if len(set(used)) == len(used) and all(a in axis_names for a in used):
            return self  # the usual case, checked without naming where each axis is used
        seen: dict[str, str] = {}
        for where, axes in [(str(d), d.axes) for d in self.dims] + [("{U}", self.partial)]:
            for a in axes:
                if a not in axis_names:
                    raise MeshAxisError(
                        f"layout {self} uses mesh axis {a!r}, which the mesh does not have (axes {list(axis_names)})"
                    )
                if a in seen:
                    raise MeshAxisError(
                        f"layout {self} uses mesh axis {a!r} twice ({seen[a]} and {where}); "
                        "a mesh axis can split only one dimension or be one partial sum"
                    )
                seen[a] = where
        return self

    # -- display ------------------------------------------------------------------------
    def __str__(self) -> str:
        text: str | None = self.__dict__.get("_text")  # built once per layout, as Dim's (see there)
        if text is None:
            text = "[" + ", ".join([str(d) for d in self.dims]) + "]"
            if self.partial:
                text += "{U" + _subscript(self.partial) + "}"
            object.__setattr__(self, "_text", text)
        return text

    def __repr__(self) -> str:
        return f"Layout('{self}')"


def is_partition_spec(value: Any) -> TypeGuard[Iterable[Any]]:
    """Whether ``value`` is JAX's ``PartitionSpec`` or :class:`shardsim.specs.PartitionSpec`.

    JAX is never imported to ask: a JAX spec exists only once ``jax.sharding`` is imported.
    """
    jax_sharding = sys.modules.get("jax.sharding")
    if jax_sharding is not None and isinstance(value, getattr(jax_sharding, "PartitionSpec", ())):
        return True
    cls = type(value)
    return cls.__name__ == "PartitionSpec" and cls.__module__ == "shardsim.specs"


def _spec_entry(axes: tuple[str, ...]) -> str:
    """A dimension's PartitionSpec entry as text: ``None``, ``'X'`` or ``('X', 'Y')``."""
    return "None" if not axes else repr(axes[0]) if len(axes) == 1 else repr(axes)


def _subscript(axes: tuple[str, ...]) -> str:
    if not axes:
        return ""
    if all(len(a) == 1 for a in axes):
        return "_" + "".join(axes)
    return "_{" + ",".join(axes) + "}"


def _axis_names(text: str, axis_names: Any) -> tuple[str, ...]:
    """``axis_names`` as a tuple of names, or LayoutParseError saying what it must be."""
    names: Any = None
    if not isinstance(axis_names, (str, bytes)):
        try:
            names = tuple(axis_names)
        except TypeError:
            names = None
    if names is None or not all(isinstance(n, str) for n in names):
        raise LayoutParseError(
            f"Layout.parse({text!r}, axis_names={axis_names!r}): axis_names is a mesh's axis names, "
            "a tuple of strings such as mesh.axis_names"
        )
    return names


@functools.lru_cache(maxsize=4096)
def _parsed(text: str, axis_names: tuple[str, ...] | None) -> Layout:
    """A layout's text parsed once per mesh's axes: ops name their outputs' layouts in text,
    over and over (layouts are immutable, so one object serves every caller)."""
    return _Parser(text, axis_names).parse()


class _Parser:
    def __init__(self, text: str, axis_names: Sequence[str] | None) -> None:
        self.text = text
        self.axis_names = None if axis_names is None else _axis_names(text, axis_names)

    def fail(self, pos: int, why: str) -> LayoutParseError:
        looks_like_a_spec = re.search(r"['\"()]|\bNone\b", self.text) is not None
        return LayoutParseError(
            f"cannot parse layout {self.text!r}: {why}\n    {self.text}\n    {' ' * pos}^\n"
            "expected e.g. '[B_X, D_Y]', 'B_X D_Y', '[D_XY, F]' or '[B, D]{U_Y}'"
            + (f"; {SPEC_ROUTE}" if looks_like_a_spec else "")
        )

    def refuse_spec_entries(self, dims: list[Dim], bracketed: bool) -> None:
        """Refuse a PartitionSpec written as text: a dimension called ``None``, or nothing but bare axis names.

        ``"X, None"`` and ``"[X, Y]"`` are JAX's ``P("X", None)`` and ``P("X", "Y")`` written as
        text; read as layouts they would be replicated dimensions called ``X`` and ``None``. One
        unsplit dimension named like an axis among others is a layout (DDP's ``[D, F]`` on a mesh
        with an axis ``D``), and so is ``[D]``: a one-entry spec is refused only without brackets.
        """
        axes = self.axis_names or ()
        bare = [d.name for d in dims if not d.axes and d.name in axes]
        spec_like = bool(dims) and all(d.name == "None" or d.name in bare for d in dims)
        spec_like = spec_like and (len(dims) > 1 or not bracketed)
        bad = [d.name for d in dims if d.name == "None" or (spec_like and d.name in bare)]
        if not bad:
            return
        taken = set(axes) | {d.name for d in dims}
        free = iter([n for n in _SUGGESTED_NAMES if n not in taken] + [f"d{i}" for i in range(len(dims))])
        book = []
        for d in dims:
            if d.name == "None":
                book.append(Dim(next(free)))
            elif d.name in bad:
                book.append(Dim(next(free), (d.name,)))
            else:
                book.append(d)
        spec = ", ".join(_spec_entry(d.axes) for d in book)
        raise LayoutParseError(
            f"layout {self.text!r} reads like a JAX PartitionSpec: it would make unsplit dimensions called "
            f"{bad}. A layout names every dimension and writes the mesh axes that split it after '_', "
            f"as in {str(Layout(tuple(book)))!r}; a dimension may not be called None, nor may every dimension "
            f"be an unsplit mesh axis's name. Or convert the spec: Layout.from_partition_spec(P({spec}), mesh)"
        )

    def parse(self) -> Layout:
        text = self.text
        body, partial = text, ""
        brace = self._partial_start()
        if brace is not None:
            body, partial = text[:brace], text[brace:]
        stripped = body.strip()
        offset = len(body) - len(body.lstrip())
        if stripped.startswith("["):
            if not stripped.endswith("]"):
                raise self.fail(offset + len(stripped), "missing closing ']'")
            inner, offset = stripped[1:-1], offset + 1
        else:
            inner = stripped
        dims = []
        for match in _TOKEN.finditer(inner):
            dims.append(self._dim(match.group(), offset + match.start()))
        if not dims and not stripped.startswith("["):
            raise self.fail(offset, "no dimensions (a rank-0 value is written '[]')")
        self.refuse_spec_entries(dims, stripped.startswith("["))
        part = self._partial(partial, brace) if brace is not None else ()
        return Layout(tuple(dims), part)

    def _partial_start(self) -> int | None:
        # A '{' that is not a dimension's brace subscript (those follow '_': D_{data,model}).
        m = re.search(r"(?<!_)\{", self.text)
        return m.start() if m else None

    def _dim(self, token: str, pos: int) -> Dim:
        name, sep, sub = token.partition("_")
        if not DIM_NAME.fullmatch(name):
            raise self.fail(pos, f"dimension name {name!r} must be letters and digits, starting with a letter")
        if not sep:
            return Dim(name)
        if not sub:
            raise self.fail(pos + len(token), f"'{name}_' needs mesh axes after the underscore, e.g. '{name}_X'")
        return Dim(name, self._axes(sub, pos + len(name) + 1))

    def _axes(self, sub: str, pos: int) -> tuple[str, ...]:
        if sub.startswith("{"):
            if not sub.endswith("}"):
                raise self.fail(pos + len(sub), "missing closing '}'")
            parts = [p.strip() for p in sub[1:-1].split(",")]
            for p in parts:
                if not DIM_NAME.fullmatch(p):
                    raise self.fail(pos, f"axis name {p!r} must be letters and digits")
            axes = tuple(parts)
        elif self.axis_names is None:
            if not sub.isalnum():
                raise self.fail(pos, f"axes {sub!r} must be letters, e.g. 'XY'")
            axes = tuple(sub)
        else:
            axes = self._split_known(sub, pos)
        if len(set(axes)) != len(axes):
            raise self.fail(pos, f"mesh axis repeated in subscript {sub!r}")
        return axes

    def _split_known(self, sub: str, pos: int) -> tuple[str, ...]:
        assert self.axis_names is not None
        if all(c in self.axis_names for c in sub):
            # one letter per axis, as str() prints single-letter axes ("D_XY" on a mesh with
            # axes X, Y and XY is X then Y; the axis XY prints as "D_{XY}")
            return tuple(sub)
        names = sorted((n for n in self.axis_names if n), key=len, reverse=True)  # "" would never advance
        out: list[str] = []
        i = 0
        while i < len(sub):
            hit = next((n for n in names if sub.startswith(n, i)), None)
            if hit is None:
                raise self.fail(
                    pos + i,
                    f"{sub[i:]!r} is not a mesh axis; this mesh has axes {list(self.axis_names)}",
                )
            out.append(hit)
            i += len(hit)
        return tuple(out)

    def _partial(self, text: str, pos: int) -> tuple[str, ...]:
        stripped = text.strip()
        if not (stripped.startswith("{") and stripped.endswith("}")):
            raise self.fail(pos, "a partial sum is written '{U_X}' or '{U_XY}'")
        axes: list[str] = []
        for m in _TOKEN.finditer(stripped[1:-1]):
            tok = m.group()
            if not tok.startswith("U_") or len(tok) < 3:
                raise self.fail(pos + 1 + m.start(), f"{tok!r}: a partial sum is written U_X")
            axes.extend(self._axes(tok[2:], pos + 3 + m.start()))
        if not axes:
            raise self.fail(pos, "empty partial sum")
        return tuple(axes)


# -- the sharded matmul rules -------------------------------------------------------------
def matmul_layout(a: Layout, b: Layout) -> Layout:
    """The layout of ``a @ b`` by the scaling book's four cases, or the error that names the case.

    ``a`` is ``[..., M, K]`` and ``b`` is ``[K, N]`` or ``[..., K, N]`` with the same batch
    dimensions. Contracting dimensions split over the same axes on both sides give a partial
    sum over those axes (case 3); one side split (case 2) or an axis used by both outputs
    (case 4) is refused with the collective that fixes it.

    >>> str(matmul_layout(Layout.parse("B_X D_Y"), Layout.parse("D_Y F")))
    '[B_X, F]{U_Y}'
    """
    if a.rank < 2 or b.rank < 2:
        raise ShapeError(f"matmul needs operands of rank >= 2, got {a} @ {b}")
    batch = a.dims[:-2]
    if b.rank > 2 and b.dims[:-2] != batch:
        raise ShapeError(
            f"matmul {a} @ {b}: batch dimensions must match in name and sharding "
            f"({_fmt(batch)} vs {_fmt(b.dims[:-2])}), or give a 2-D right operand"
        )
    m, ka = a.dims[-2], a.dims[-1]
    kb, n = b.dims[-2], b.dims[-1]
    both_partial = set(a.partial) & set(b.partial)
    if both_partial:
        raise MatmulShardingError(
            f"{a} @ {b}: both operands are partial sums over {sorted(both_partial)}; the product of "
            f"two sums is not the sum of products. AllReduce one operand over {sorted(both_partial)} first."
        )
    if ka.axes != kb.axes:
        if ka.axes and kb.axes:
            raise MatmulShardingError(
                f"{a} @ {b}: the contracting dimension is split differently on the two sides "
                f"({ka} vs {kb}). AllGather one side (or both) so the splits match, e.g. "
                f"all_gather(a, {ka.axes!r}) or all_gather(b, {kb.axes!r})."
            )
        side, dim = ("left", ka) if ka.axes else ("right", kb)
        raise MatmulShardingError(
            f"{a} @ {b}: case 2 of the sharded matmul: the contracting dimension is split on the "
            f"{side} operand only ({dim}). AllGather it first: all_gather({side} operand, {dim.axes!r}); "
            "or split the other operand's contracting dimension alike to get a partial sum."
        )
    out_partial = tuple(ka.axes) + a.partial + b.partial
    out_dims = batch + (m, n)
    used: dict[str, str] = {}
    for d in out_dims:
        for ax in d.axes:
            if ax in used:
                raise MatmulShardingError(
                    f"{a} @ {b}: case 4 of the sharded matmul: mesh axis {ax!r} splits both {used[ax]} "
                    f"and {d}, so each chip would hold only a diagonal block. AllGather one of them "
                    f"over {ax!r} first."
                )
            used[ax] = str(d)
    for ax in out_partial:
        if ax in used:
            raise MatmulShardingError(
                f"{a} @ {b}: mesh axis {ax!r} would both split {used[ax]} and carry a partial sum. "
                f"AllGather {used[ax]} over {ax!r} or reduce the partial over {ax!r} first."
            )
        used[ax] = "{U}"
    if b.rank == 2:
        b_axes = set(kb.axes) | set(n.axes) | set(b.partial)
        clash = b_axes & {ax for d in batch for ax in d.axes}
        if clash:
            raise MatmulShardingError(
                f"{a} @ {b}: mesh axis {sorted(clash)} splits a batch dimension of the left operand "
                "and the right operand too. AllGather the right operand first."
            )
    return Layout(out_dims, out_partial)


def _fmt(dims: tuple[Dim, ...]) -> str:
    return "[" + ", ".join(map(str, dims)) + "]"
