"""Placement: which network each mesh axis runs over, and the route of a collective.

Say it per axis, as a network name or an :class:`AxisLink`::

    place(get_hardware("h100"), Mesh(X=32, Y=8), {"Y": "nvlink", "X": "scaleout"})
    place(get_hardware("tpu-v5p"), Mesh(X=256, Y=16), {"X": AxisLink("ici", rings=(16, 16))})

Without a mapping: on a TPU every axis takes its own ICI rings (an axis longer than 16
chips spans several hardware axes, like the book's M_X); on a GPU the mesh is laid out
row-major (last axis fastest) over nodes of 8, so inner axes ride NVLink, outer axes the
scale-out network, and an axis that straddles a node boundary uses both.

Several mesh axes may share one hardware axis of a torus: give the slice's shape as
``topology`` (``"16x16x16"``), or let the placement pick the most cubic slice the pod holds
when the mesh needs more rings than the torus has axes. The mesh's ICI axes are then laid
out row-major over it (last mesh axis on the last hardware axis, fastest). A mesh axis that
takes only part of a hardware axis runs on a **sub-ring**: the innermost part is a run of
neighbouring chips, a line without wraparound (half the bidirectional ring's rate: SB
sharding.md's N-1 hops of V/N one way); an outer part takes every s-th chip, a ring of
chips s hops apart whose links it shares with s - 1 others (written ``4:4``), with
wraparound only if it closes the hardware axis. Mesh axes that share a hardware axis split
its links evenly (the book's FSDP+TP runs their collectives at once). A layout the pod cannot hold (an axis longer
than the pod's, more chips than it has) is a :class:`~shardsim.CostModelError`.

>>> from shardsim import Mesh
>>> from shardsim.cost import get_hardware, place
>>> print(place(get_hardware("h100"), Mesh(X=4, Y=16)))
X=4: scaleout 4
Y=16: nvlink 8 x scaleout 2
>>> place(get_hardware("tpu-v5p"), Mesh(X=256, Y=16)).route("X").describe()
'ici rings 16x16 (wraparound)'
>>> print(place(get_hardware("tpu-v5p"), Mesh(X=1024, Y=4)))  # on a 16x16x16 slice
X=1024: ici 4:4x16x16
Y=4: ici 4
>>> place(get_hardware("tpu-v5p"), Mesh(X=1024, Y=4)).route("Y").describe()
'ici rings 4 (no wraparound)'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import CostModelError, ShardsimError
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


class _Rings:
    """Per-ring ``strides`` and ``shares``, 1 where a ring has none given."""

    strides: tuple[int, ...]
    shares: tuple[int, ...]

    def stride(self, k: int) -> int:
        """Hops between neighbouring chips of ring ``k`` (the rings sharing each of its links)."""
        return self.strides[k] if k < len(self.strides) else 1

    def share(self, k: int) -> int:
        """Mesh axes whose rings share the hardware axis of ring ``k`` (its links split among them)."""
        return self.shares[k] if k < len(self.shares) else 1


@dataclass(frozen=True)
class Part(_Rings):
    """A mesh axis's share of one network: ``size`` chips (torus: as ``rings``, ``wraps``).

    ``strides`` (torus) is, per ring, how many hops apart its chips sit on the hardware axis
    (1: neighbours; s: every s-th chip, sharing each link with s - 1 other rings);
    ``shares`` how many mesh axes lay rings on that hardware axis (they share its links).
    """

    network: str
    size: int
    rings: tuple[int, ...] = ()
    wraps: tuple[bool, ...] = ()
    strides: tuple[int, ...] = ()
    shares: tuple[int, ...] = ()

    def ring_text(self) -> str:
        return "x".join(f"{r}:{self.stride(k)}" if self.stride(k) > 1 else str(r) for k, r in enumerate(self.rings))


@dataclass(frozen=True)
class Level(_Rings):
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
    strides: tuple[int, ...] = ()
    shares: tuple[int, ...] = ()


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
                text = Part(lv.name, lv.degree, lv.rings, lv.wraps, lv.strides).ring_text()
                out.append(f"{lv.name} rings {text} ({wrap})")
            else:
                out.append(f"{lv.name} {lv.degree}")
        return " + ".join(out)


class Placement:
    """Every mesh axis of ``mesh`` mapped onto the networks of ``hardware``."""

    def __init__(
        self,
        hardware: Hardware,
        mesh: Mesh,
        parts: Mapping[str, tuple[Part, ...]],
        topology: Mapping[str, tuple[int, ...]] | None = None,
    ) -> None:
        self.hardware = hardware
        self.axis_sizes = dict(zip(mesh.axis_names, mesh.shape))
        self.parts = dict(parts)
        self.topology = dict(topology or {})  # torus network -> slice shape, when axes share one
        self._routes: dict[tuple[str, ...], Route] = {}

    def networks(self) -> list[str]:
        """The networks some mesh axis runs over, innermost first."""
        used = {p.network for ps in self.parts.values() for p in ps if p.size > 1}
        return [n for n in self.hardware.networks if n in used]

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
            kept = [
                (r, w, p.stride(k), p.share(k)) for p in mine for k, (r, w) in enumerate(zip(p.rings, p.wraps)) if r > 1
            ]
            rings = tuple(r for r, _, _, _ in kept)
            wraps = tuple(w for _, w, _, _ in kept)
            strides = tuple(k[2] for k in kept) if any(k[2] > 1 for k in kept) else ()
            shares = tuple(k[3] for k in kept) if any(k[3] > 1 for k in kept) else ()
            levels.append(Level(name, net, degree, below, rings, wraps, strides, shares))
            below *= degree
        return Route(axes, tuple(levels), math.prod(self.axis_sizes[a] for a in axes))

    def __str__(self) -> str:
        lines = []
        for axis, parts in self.parts.items():
            desc = " x ".join(f"{p.network} {p.ring_text()}" if p.rings else f"{p.network} {p.size}" for p in parts)
            lines.append(f"{axis}={self.axis_sizes[axis]}: {desc}")
        return "\n".join(lines)


def place(
    hardware: Hardware,
    mesh: Mesh,
    links: Mapping[str, str | AxisLink] | None = None,
    *,
    topology: str | Sequence[int] | None = None,
    inner: Sequence[str] | None = None,
) -> Placement:
    """Map every axis of ``mesh`` onto ``hardware``'s networks; ``links`` overrides some axes.

    ``topology`` (a torus only) is the slice shape, e.g. ``"16x16x16"``: the mesh axes on the
    torus are laid out row-major over it, several sharing one hardware axis where needed.
    ``inner`` (GPUs) orders the axes innermost first (the first fills the NVLink domain);
    by default the mesh's last axis is innermost. :func:`hungry_first` gives the order by the
    axes' parallelisms.

    >>> from shardsim.cost import get_hardware
    >>> print(place(get_hardware("h100"), Mesh(X=4, Y=8, Z=2), inner=["Y", "Z", "X"]))
    X=4: scaleout 4
    Y=8: nvlink 8
    Z=2: scaleout 2
    """
    if links is not None and not isinstance(links, Mapping):
        raise CostModelError(
            f"links={links!r:.60} ({type(links).__name__}): map mesh axes to networks, e.g. links={{'X': 'dcn'}}"
        )
    parts = _default_parts(hardware, mesh, inner)
    specs: dict[str, AxisLink] = {}
    for axis, link in (links or {}).items():
        mesh.check_axis(axis)
        if not isinstance(link, (str, AxisLink)):
            raise CostModelError(
                f"links[{axis!r}]={link!r:.60}: an axis's link is a network name or an AxisLink, "
                f"e.g. links={{{axis!r}: 'dcn'}}"
            )
        spec = AxisLink(link) if isinstance(link, str) else link
        specs[axis] = spec
        parts[axis] = (_explicit_part(hardware, axis, mesh.axis_size(axis), spec),)
    slices: dict[str, tuple[int, ...]] = {}
    first, net = next(iter(hardware.networks.items()))
    if isinstance(net, Torus):
        on_torus = [a for a in mesh.axis_names if parts[a][0].network == first]
        shape = parse_topology(topology) if topology is not None else None
        if shape is None and _torus_axes(parts, first) > net.dims:
            shape = default_topology(net, math.prod(mesh.axis_size(a) for a in on_torus))
        if shape is not None:
            for a in on_torus:
                if specs.get(a) is not None and specs[a].rings is not None:
                    raise CostModelError(
                        f"axis {a!r}: give its rings or a topology, not both "
                        f"(topology {_x(shape)} lays out every ICI axis)"
                    )
            laid = _lay_out(hardware, first, net, shape, {a: mesh.axis_size(a) for a in on_torus}, specs)
            parts.update(laid)
            slices[first] = shape
    elif topology is not None:
        raise CostModelError(f"topology {topology!r}: {hardware.name}'s {first} is not a torus; place axes with links")
    _check(hardware, mesh, parts, slices)
    return Placement(hardware, mesh, parts, slices)


def parse_topology(topology: str | Sequence[int]) -> tuple[int, ...]:
    """``"16x20x28"`` or ``(16, 20, 28)`` → ``(16, 20, 28)``.

    >>> parse_topology("16x16x16")
    (16, 16, 16)
    """
    try:
        shape = tuple(int(n) for n in (topology.lower().split("x") if isinstance(topology, str) else topology))
    except (TypeError, ValueError):
        raise CostModelError(f"topology {topology!r}: write it as axis lengths, e.g. '16x16x16'") from None
    if not shape or any(n < 1 for n in shape):
        raise CostModelError(f"topology {topology!r}: every axis length must be at least 1, e.g. '16x16x16'")
    return shape


def default_topology(net: Torus, chips: int) -> tuple[int, ...]:
    """The most cubic slice of ``chips`` the torus holds (axes with wraparound preferred).

    Each axis at most the pod's (or ``max_ring`` without a pod); ascending order.

    >>> from shardsim.cost import get_hardware
    >>> default_topology(get_hardware("tpu-v5p").networks["ici"], 4096)
    (16, 16, 16)
    >>> default_topology(get_hardware("tpu-v5p").networks["ici"], 8960)
    (16, 20, 28)
    """
    bounds = sorted(net.pod) if net.pod is not None else [net.max_ring] * net.dims

    def rank(shape: tuple[int, ...]) -> tuple[bool, int, tuple[int, ...]]:  # wraparound first, then cubic
        return (not all(net.has_wraparound(n) for n in shape if n > 1), shape[-1] - shape[0], shape)

    fits = [s for s in _factorizations(chips, net.dims) if all(n <= b for n, b in zip(s, bounds))]
    best = min(fits, key=rank, default=None)
    if best is None:
        pod = f"pod {_x(net.pod)}" if net.pod is not None else f"{net.dims} axes of at most {net.max_ring}"
        raise CostModelError(
            f"no slice of {chips} chips fits the torus ({pod}); "
            "map an axis to another network, e.g. links={'X': 'dcn'}"
        )
    return best


def _factorizations(n: int, k: int) -> list[tuple[int, ...]]:
    """Ascending k-tuples of integers >= 1 whose product is n."""
    if k == 1:
        return [(n,)]
    out = []
    for d in range(1, n + 1):
        if n % d == 0 and d**k <= n:
            out += [(d, *rest) for rest in _factorizations(n // d, k - 1) if rest[0] >= d]
    return out


def _torus_axes(parts: Mapping[str, tuple[Part, ...]], network: str) -> int:
    return sum(1 for ps in parts.values() for p in ps if p.network == network for r in p.rings if r > 1)


def _lay_out(
    hardware: Hardware,
    name: str,
    net: Torus,
    shape: tuple[int, ...],
    sizes: Mapping[str, int],
    specs: Mapping[str, AxisLink],
) -> dict[str, tuple[Part, ...]]:
    """Mesh axes row-major over the slice ``shape``: last mesh axis on the last hardware axis.

    A mesh smaller than the slice takes its first chips (the rest is idle).
    """
    if math.prod(sizes.values()) > math.prod(shape):
        raise CostModelError(
            f"the mesh puts {math.prod(sizes.values())} chips on {hardware.name}'s {name} but topology {_x(shape)} "
            f"has {math.prod(shape)}; give a topology of at least as many chips"
        )
    segments: dict[str, list[tuple[int, bool, int, int]]] = {}  # ring, wrap, stride, hardware axis
    k, room, stride = len(shape) - 1, shape[-1], 1
    for axis in reversed(list(sizes)):
        n, segs = sizes[axis], segments.setdefault(axis, [])
        while n > 1:
            while room == 1:
                k -= 1
                room, stride = shape[k], 1
            take = math.gcd(n, room)
            if take == 1:
                raise CostModelError(
                    f"mesh axis {axis!r} ({sizes[axis]} chips) does not lay out row-major over topology {_x(shape)}: "
                    f"{n} chips left against {room} on hardware axis {k}; reorder the mesh or pick another topology"
                )
            length = shape[k]
            if take == length:  # a whole hardware axis
                wrap = net.has_wraparound(length)
            elif stride == 1:  # neighbours on a longer axis: a line
                wrap = False
            else:  # every stride-th chip: closes into a ring only if it spans the whole axis
                wrap = take * stride == length and net.has_wraparound(length)
            spec = specs.get(axis)
            if spec is not None and spec.wraparound is not None:
                wrap = spec.wraparound
            segs.append((take, wrap, stride, k))
            n //= take
            room //= take
            stride *= take
    users = {k: sum(1 for segs in segments.values() if any(seg[3] == k for seg in segs)) for k in range(len(shape))}
    out: dict[str, tuple[Part, ...]] = {}
    for axis in sizes:
        segs = segments[axis] or [(1, False, 1, 0)]
        rings = tuple(seg[0] for seg in segs)
        wraps = tuple(seg[1] for seg in segs)
        strides = tuple(seg[2] for seg in segs)
        shares = tuple(users[seg[3]] for seg in segs)
        out[axis] = (Part(name, sizes[axis], rings, wraps, strides, shares),)
    return out


def _x(shape: Sequence[int] | None) -> str:
    return "x".join(map(str, shape or ()))


HUNGER = {"model": 0, "context": 1, "expert": 1, "pipe": 2, "data": 3}  # who talks most, per step and byte


def hungry_first(roles: Mapping[str, str], mesh: Mesh) -> list[str]:
    """The mesh axes innermost first by how much their parallelism communicates: tensor
    parallelism (an AllReduce or two per layer, on the critical path), then context and
    expert parallelism, then the pipeline (one activation per microbatch), data last (one
    gradient reduction per step, hidden under the backward pass). ``roles`` maps a role
    (``data``, ``model``, ``pipe``, ``context``, ``expert``) to its mesh axis; axes with no
    role keep their place, innermost after the others.

    >>> hungry_first({"data": "X", "model": "Y", "pipe": "Z"}, Mesh(X=4, Y=8, Z=2))
    ['Y', 'Z', 'X']
    """
    role_of = {axis: role for role, axis in roles.items()}
    order = list(reversed(mesh.axis_names))
    return sorted(order, key=lambda a: (HUNGER.get(role_of.get(a, ""), len(HUNGER)), order.index(a)))


def _default_parts(hardware: Hardware, mesh: Mesh, inner: Sequence[str] | None = None) -> dict[str, tuple[Part, ...]]:
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
    order = list(inner) if inner is not None else list(reversed(mesh.axis_names))
    if sorted(order) != sorted(mesh.axis_names):
        raise CostModelError(f"inner={list(order)} must name each axis of {mesh} once, innermost first")
    for a in order:
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
        raise CostModelError(
            f"axis {axis!r}: {spec.network} is a switched network; rings and wraparound are torus-only"
        )
    return Part(spec.network, size)


def _torus_part(name: str, net: Torus, size: int, rings: tuple[int, ...] | None, wrap: bool | None) -> Part:
    if rings is None:
        rings = split_rings(size, net.max_ring)
    elif math.prod(rings) != size:
        raise CostModelError(f"rings {rings} multiply to {math.prod(rings)}, not the axis size {size}")
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


def _check(
    hardware: Hardware,
    mesh: Mesh,
    parts: Mapping[str, tuple[Part, ...]],
    slices: Mapping[str, tuple[int, ...]],
) -> None:
    used: dict[str, int] = {}
    for ps in parts.values():
        for p in ps:
            net = hardware.network(p.network)
            if isinstance(net, Switched) and net.domain is not None:
                used[p.network] = used.get(p.network, 1) * p.size
    for name, net in hardware.networks.items():
        if isinstance(net, Torus):
            # each ring its own hardware axis, unless a topology lays the axes out
            shape = slices.get(name) or tuple(
                r for ps in parts.values() for p in ps if p.network == name for r in p.rings if r > 1
            )
            _check_slice(hardware, mesh, name, net, shape, name in slices)
    for name, n in used.items():
        net = hardware.networks[name]
        if isinstance(net, Switched) and net.domain is not None and n > net.domain:
            raise CostModelError(
                f"{mesh} puts {n} chips on {hardware.name}'s {name}, whose domain holds {net.domain}; "
                f"map an outer axis to another network"
            )


def _check_slice(hardware: Hardware, mesh: Mesh, name: str, net: Torus, shape: tuple[int, ...], given: bool) -> None:
    """A slice of ``shape`` must have at most ``dims`` axes, each no longer than the pod's."""
    if len([n for n in shape if n > 1]) > net.dims:
        what = f"topology {_x(shape)}" if given else f"{mesh} needs {len(shape)} hardware axes ({_x(shape)})"
        raise CostModelError(
            f"{what} on {hardware.name}'s {name} (rings of at most {net.max_ring} chips) but it has {net.dims}; "
            f"map an axis to another network, e.g. links={{'X': 'dcn'}}"
        )
    if net.pod is None:
        return
    longest = sorted(shape, reverse=True)
    for n, limit in zip(longest, sorted(net.pod, reverse=True)):
        if n > limit:
            raise CostModelError(
                f"{mesh} puts {n} chips on one hardware axis of {hardware.name}'s {name}, but its pod is "
                f"{_x(net.pod)} (longest axis {max(net.pod)}); use shorter rings or another network, e.g. 'dcn'"
            )
    if math.prod(shape) > math.prod(net.pod):
        raise CostModelError(
            f"{mesh} puts {math.prod(shape)} chips on {hardware.name}'s {name}, more than its pod "
            f"{_x(net.pod)} holds ({math.prod(net.pod)}); map an outer axis to 'dcn'"
        )
