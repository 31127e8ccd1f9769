"""Collective times: the scaling book's formulas on the route a collective takes.

V is the bytes of the whole array the collective moves (``Event.array_bytes``): the
gathered array of an AllGather, the unreduced array of a ReduceScatter or AllReduce, the
group's whole array of an AllToAll, one chip's block for a ppermute.

On a torus (TPU ICI), SB ``sharding.md``: a bidirectional ring moves an AllGather in
V / W_ici whatever its length; several hardware axes add their bandwidth,
``T = max(T_min * sum|X_i| / 2, V / (W_ici * n_axes))``; a ring without wraparound takes
N-1 hops of V/N at the one-way bandwidth. AllReduce = 2 AllGathers; AllToAll = AllGather / 4
on a bidirectional ring (AllGather / 2 one-way), ``V * max_i |X_i| / (4 N W_ici)`` on several.

On a switched network (GPU NVLink and scale-out, TPU DCN), SB ``gpus.md``: each level of the
tree is a ring over its children, ``T = V * max_i (D_i - 1) / (D_i W_i)`` where a child's
bandwidth W_i is that of all the group's chips inside it; AllToAll ``V (D-1) / (D^2 W)``.

The time is ``max(latency, bandwidth)``: latency sums T_min over the hops of every level,
bandwidth is the slowest level's term (levels work at once).

A sub-ring of a torus axis (:mod:`~shardsim.cost.placement`) is a line of neighbours (the
no-wraparound formula) or a ring of every s-th chip: its links carry s such rings at once,
so its rate is the ring's divided by s, and each of its hops crosses s links.

``efficiency`` (:mod:`~shardsim.cost.efficiency`): calibrated, each level's bandwidth term is
divided by its network's measured fraction at this V, every ring keeps (N-1)/N (measured
rings pay it), and the network's ``launch_s`` is added once. A curve with ``step_s`` charges
a flat ring's latency as NCCL's time model does: ``step_s`` per ring step over that network
(a ring of N chips in nodes of 8 takes N - nodes NVLink steps and nodes - 1 network steps),
added to the bandwidth term.

>>> from shardsim import Mesh
>>> from shardsim.cost import collective_time, get_hardware, place
>>> v5e = get_hardware("tpu-v5e")
>>> route = place(v5e, Mesh(X=8, Y=4)).route("Y")  # a ring of 4: no wraparound on v5e
>>> t = collective_time("all_gather", 2048 * 8192 * 2, route, v5e.ring)  # SB pop quiz: ~560 us
>>> round(t.seconds * 1e6)
559
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ShardsimError
from .efficiency import IDEAL, Efficiency
from .hardware import Torus
from .placement import Level, Route

GATHER_LIKE = ("all_gather", "reduce_scatter")
OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "ppermute")


@dataclass(frozen=True)
class CommTime:
    """A collective's time: ``seconds = max(latency_s, bandwidth_s)``; ``limit`` names the larger."""

    seconds: float
    bandwidth_s: float
    latency_s: float

    @property
    def limit(self) -> str:
        return "latency" if self.latency_s > self.bandwidth_s else "bandwidth"


def collective_time(
    op: str, nbytes: float, route: Route, ring: str = "book", efficiency: Efficiency = IDEAL
) -> CommTime:
    """Time of collective ``op`` moving an array of ``nbytes`` (V) along ``route``.

    ``ring="exact"`` keeps the (N-1)/N factor on bidirectional and switched rings;
    ``"book"`` drops it there, as the book's headline formulas do. ``efficiency`` (a
    resolved :class:`~shardsim.cost.efficiency.Efficiency`) applies measured curves.
    """
    if op not in OPS:
        raise ShardsimError(f"no time formula for {op!r}; known collectives are {list(OPS)}")
    if not route.levels or nbytes == 0:
        return CommTime(0.0, 0.0, 0.0)
    times = 2 if op == "all_reduce" else 1  # AllReduce = ReduceScatter then AllGather
    op = "all_gather" if op == "all_reduce" else op
    exact = ring == "exact" or efficiency.calibrated
    bandwidth, latency, launch, steps = 0.0, 0.0, 0.0, 0.0
    for level in route.levels:
        if isinstance(level.net, Torus):
            b, t = _torus(op, nbytes, level, route.group_size, exact)
        else:
            b, t = _switched(op, nbytes, level, route.group_size, exact)
        measured = efficiency.networks.get(level.name)
        if measured is not None:
            b /= measured.fraction(nbytes)
            launch = max(launch, measured.launch_s)
            if measured.step_s and op in GATHER_LIKE:  # a flat ring's steps over this level's links
                steps += measured.step_s * (level.degree - 1) * route.group_size / (level.degree * level.below)
        bandwidth = max(bandwidth, b)
        latency = t if op == "ppermute" else latency + t
    # calibrated rings pay their steps' latency on top of the bandwidth term (NCCL's own model)
    bandwidth, latency = times * (bandwidth + steps) + (launch if steps else 0.0), times * latency + launch
    return CommTime(max(bandwidth, latency), bandwidth, latency)


def _torus(op: str, v: float, level: Level, group: int, exact: bool) -> tuple[float, float]:
    net = level.net
    assert isinstance(net, Torus)
    w = net.bandwidth  # one way, per link
    # per ring: length, wraparound, hops between its chips, and how many flows share each link
    # (s strided rings of one mesh axis, times the mesh axes on that hardware axis)
    rings = [
        (n, wrap, level.stride(k), level.stride(k) * level.share(k))
        for k, (n, wrap) in enumerate(zip(level.rings, level.wraps))
    ]
    if op == "ppermute":  # one hop to the neighbour, every chip at once
        return v * max((c for *_, c in rings), default=1) / w, net.latency * max((s for _, _, s, _ in rings), default=1)
    hops = sum((n / 2 if wrap else n - 1) * s for n, wrap, s, _ in rings)
    if op in GATHER_LIKE:
        rate = sum(_ring_rate(n, wrap, w, exact) / c for n, wrap, _, c in rings)
        return v / rate, net.latency * hops
    # all_to_all: links of different hardware axes work at once; the busiest sets the time
    per_axis = [(v * n / (8 * group * w) if wrap else v * (n - 1) / (2 * group * w)) * c for n, wrap, _, c in rings]
    return max(per_axis), net.latency * hops


def _ring_rate(n: int, wrap: bool, w: float, exact: bool) -> float:
    """Bytes/s at which one ring of ``n`` chips gathers V: V / rate is the AllGather time."""
    if not wrap:
        return w * n / (n - 1)  # N-1 hops of V/N, one way (SB sharding.md pop quiz)
    return 2 * w * n / (n - 1) if exact else 2 * w  # V / W_ici (SB sharding.md)


def _switched(op: str, v: float, level: Level, group: int, exact: bool) -> tuple[float, float]:
    w, d, s = level.net.bandwidth, level.degree, level.below
    if op == "ppermute":
        return v / w, level.net.latency
    if op in GATHER_LIKE:
        factor = (d - 1) / d if exact else 1.0
        return v * factor / (s * w), level.net.latency * (d - 1)
    # all_to_all: each chip sends V/G^2 to each of the s*(d-1) chips it reaches over this level
    pieces = s * (d - 1) if exact else s * d
    return v * pieces / (group * group * w), level.net.latency
