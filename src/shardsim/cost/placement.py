"""Placement: which network each mesh axis runs over, and the route of a collective.

Say it per axis, as a network name or an :class:`AxisLink`::

    place(get_hardware("h100"), Mesh(X=32, Y=8), {"Y": "nvlink", "X": "scaleout"})
    place(get_hardware("tpu-v5p"), Mesh(X=256, Y=16), {"X": AxisLink("ici", rings=(16, 16))})

Without a mapping: on a TPU every axis takes its own ICI rings (an axis longer than 16
chips spans several hardware axes, like the book's M_X); on a GPU the mesh is laid out
row-major (last axis fastest) over nodes of 8, so inner axes ride NVLink, outer axes the
scale-out network, and an axis that straddles a node boundary uses both.

>>> from shardsim import Mesh
>>> from shardsim.cost import get_hardware, place
>>> print(place(get_hardware("h100"), Mesh(X=4, Y=16)))
X=4: scaleout 4
Y=16: nvlink 8 x scaleout 2
>>> place(get_hardware("tpu-v5p"), Mesh(X=256, Y=16)).route("X").describe()
'ici rings 16x16 (wraparound)'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ShardsimError
from ..mesh import Mesh, normalize_axes
from .hardware import Hardware, Network, Switched, Torus


@dataclass(frozen=True)
class AxisLink:
    """Where a mesh axis runs: ``network`` (a name of the hardware's networks).

    On a torus, ``rings`` are the hardware-axis ring lengths the mesh axis spans (their
    product is the axis size; default: as few rings of at most ``max_ring`` as possible) and
    ``wraparound`` overrides the chip's wraparound rule.

    >>> AxisLink("ici", rings=(16, 16)).rings
    (16, 16)
    """

    network: str
    rings: tuple[int, ...] | None = None
    wraparound: bool | None = None


@dataclass(frozen=True)
class Part:
    """A mesh axis's share of one network: ``size`` chips (torus: as ``rings``, ``wraps``)."""

    network: str
    size: int
    rings: tuple[int, ...] = ()
    wraps: tuple[bool, ...] = ()


@dataclass(frozen=True)
class Level:
    """One network a collective's group crosses.

    ``degree`` is how many children of this level the group spans (on a torus, the product
    of its ``rings``); ``below`` how many of the group's chips each child holds (the chips
    whose links into this network work in parallel).
    """

    name: str
    net: Network
    degree: int
    below: int = 1
    rings: tuple[int, ...] = ()
    wraps: tuple[bool, ...] = ()


@dataclass(frozen=True)
class Route:
    """The networks a collective over some mesh axes crosses, innermost first."""

    axes: tuple[str, ...]
    levels: tuple[Level, ...]
    group_size: int

    def describe(self) -> str:
        """``ici rings 16x16 (wraparound)`` or ``nvlink 8 + scaleout 4``."""
        if not self.levels:
            return "no network (a group of one chip)"
        out = []
        for lv in self.levels:
            if lv.rings:
                wrap = "wraparound" if all(lv.wraps) else "no wraparound" if not any(lv.wraps) else "mixed wraparound"
                out.append(f"{lv.name} rings {'x'.join(map(str, lv.rings))} ({wrap})")
            else:
                out.append(f"{lv.name} {lv.degree}")
        return " + ".join(out)


class Placement:
    """Every mesh axis of ``mesh`` mapped onto the networks of ``hardware``."""

    def __init__(self, hardware: Hardware, mesh: Mesh, parts: Mapping[str, tuple[Part, ...]]) -> None:
        self.hardware = hardware
        self.axis_sizes = dict(zip(mesh.axis_names, mesh.shape))
        self.parts = dict(parts)
        self._routes: dict[tuple[str, ...], Route] = {}

    def route(self, axes: str | tuple[str, ...]) -> Route:
        """The networks a collective over ``axes`` crosses (cached)."""
        key = normalize_axes(axes)
        if key not in self._routes:
            self._routes[key] = self._build(key)
        return self._routes[key]

    def _build(self, axes: tuple[str, ...]) -> Route:
        for a in axes:
            if a not in self.parts:
                raise ShardsimError(f"mesh axis {a!r} is not placed; the mesh has axes {list(self.parts)}")
        levels = []
        below = 1
        for name, net in self.hardware.networks.items():
            mine = [p for a in axes for p in self.parts[a] if p.network == name]
            degree = math.prod(p.size for p in mine)
            if degree == 1:
                continue
            rings = tuple(r for p in mine for r in p.rings if r > 1)
            wraps = tuple(w for p in mine for r, w in zip(p.rings, p.wraps) if r > 1)
            levels.append(Level(name, net, degree, below, rings, wraps))
            below *= degree
        return Route(axes, tuple(levels), math.prod(self.axis_sizes[a] for a in axes))

    def __str__(self) -> str:
        lines = []
        for axis, parts in self.parts.items():
            desc = " x ".join(
                f"{p.network} {'x'.join(map(str, p.rings))}" if p.rings else f"{p.network} {p.size}" for p in parts
            )
            lines.append(f"{axis}={self.axis_sizes[axis]}: {desc}")
        return "\n".join(lines)


def place(hardware: Hardware, mesh: Mesh, links: Mapping[str, str | AxisLink] | None = None) -> Placement:
    """Map every axis of ``mesh`` onto ``hardware``'s networks; ``links`` overrides some axes."""
    parts = _default_parts(hardware, mesh)
    for axis, link in (links or {}).items():
        mesh.check_axis(axis)
        spec = AxisLink(link) if isinstance(link, str) else link
        parts[axis] = (_explicit_part(hardware, axis, mesh.axis_size(axis), spec),)
    _check(hardware, mesh, parts)
    return Placement(hardware, mesh, parts)


def _default_parts(hardware: Hardware, mesh: Mesh) -> dict[str, tuple[Part, ...]]:
    names = list(hardware.networks)
    first = hardware.networks[names[0]]
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    if isinstance(first, Torus):
        return {a: (_torus_part(names[0], first, n, None, None),) for a, n in sizes.items()}
    if first.domain is None or len(names) == 1:
        return {a: (Part(names[0], n),) for a, n in sizes.items()}
    # row-major over domains (nodes): the last axis varies fastest, so inner axes share a node
    outer = names[1]
    room = first.domain
    parts: dict[str, tuple[Part, ...]] = {}
    for a in reversed(mesh.axis_names):
        n = sizes[a]
        if n <= room and room % n == 0:
            parts[a] = (Part(names[0], n),)
            room //= n
        elif room > 1 and n % room == 0:
            parts[a] = (Part(names[0], room), Part(outer, n // room))
            room = 1
        else:
            parts[a] = (Part(outer, n),)
            room = 1
    return {a: parts[a] for a in mesh.axis_names}


def _explicit_part(hardware: Hardware, axis: str, size: int, spec: AxisLink) -> Part:
    net = hardware.network(spec.network)
    if isinstance(net, Torus):
        return _torus_part(spec.network, net, size, spec.rings, spec.wraparound)
    if spec.rings is not None or spec.wraparound is not None:
        raise ShardsimError(f"axis {axis!r}: {spec.network} is a switched network; rings and wraparound are torus-only")
    return Part(spec.network, size)


def _torus_part(name: str, net: Torus, size: int, rings: tuple[int, ...] | None, wrap: bool | None) -> Part:
    if rings is None:
        rings = split_rings(size, net.max_ring)
    elif math.prod(rings) != size:
        raise ShardsimError(f"rings {rings} multiply to {math.prod(rings)}, not the axis size {size}")
    wraps = tuple(net.has_wraparound(r) if wrap is None else wrap for r in rings)
    return Part(name, size, tuple(rings), wraps)


def split_rings(size: int, max_ring: int) -> tuple[int, ...]:
    """Cut an axis of ``size`` chips into as few rings of at most ``max_ring`` as possible.

    >>> split_rings(1024, 16)
    (16, 16, 4)
    """
    rings = []
    while size > 1:
        ring = max(d for d in range(1, min(size, max_ring) + 1) if size % d == 0)
        if ring == 1:  # a prime factor above max_ring: one long ring
            ring = size
        rings.append(ring)
        size //= ring
    return tuple(rings) or (1,)


def _check(hardware: Hardware, mesh: Mesh, parts: Mapping[str, tuple[Part, ...]]) -> None:
    used: dict[str, int] = {}
    for ps in parts.values():
        for p in ps:
            net = hardware.network(p.network)
            if isinstance(net, Torus):
                used[p.network] = used.get(p.network, 0) + sum(1 for r in p.rings if r > 1)
            elif isinstance(net, Switched) and net.domain is not None:
                used[p.network] = used.get(p.network, 1) * p.size
    for name, n in used.items():
        net = hardware.networks[name]
        if isinstance(net, Torus) and n > net.dims:
            raise ShardsimError(
                f"{mesh} needs {n} hardware axes of {hardware.name}'s {name} (rings of at most {net.max_ring} "
                f"chips) but it has {net.dims}; map an axis to another network, e.g. links={{'X': 'dcn'}}"
            )
        if isinstance(net, Switched) and net.domain is not None and n > net.domain:
            raise ShardsimError(
                f"{mesh} puts {n} chips on {hardware.name}'s {name}, whose domain holds {net.domain}; "
                f"map an outer axis to another network"
            )
