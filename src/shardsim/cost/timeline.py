"""The time line of one chip: a compute stream and a communication stream per mesh axis.

Every chip runs the same program on same-shaped blocks (SPMD), so one chip's time line is
every chip's. Matmuls take their roofline time, collectives the book's formulas, and
:mod:`shardsim.cost.schedule` places them: matmuls in program order, each collective once
its input exists and the matmul ``prefetch`` ops before its reader has started, on the links
of its mesh axes (collectives over different axes use different links and may run at once,
as the book assumes for FSDP+TP). ``overlap=False`` runs everything one after the other.
``efficiency`` (:mod:`~shardsim.cost.efficiency`) times matmuls and collectives at the
book's ideal rates or at the chip's measured ones.

``comm_exposed_s`` is the time the compute stream waits with a collective of its chips
running; ``comm_hidden_s = comm_s - comm_exposed_s`` is the communication the step does not pay
for, so turning overlap off lengthens the step by exactly ``comm_hidden_s``. When chips run
different steps (pipeline stages, :class:`ChipsTime`), the figures are one set of chips' (the
busiest), and the time their compute sits idle with none of their collectives running is the
pipeline's ``bubble_s``: ``step_s = compute_s + comm_exposed_s + bubble_s``.

>>> from shardsim import Mesh
>>> from shardsim.cost import build_timeline, get_hardware, place, scheme_program
>>> v5p, mesh = get_hardware("tpu-v5p"), Mesh(X=16)
>>> prog = scheme_program("fsdp", mesh, batch=16 * 4096, d_model=8192, d_ff=32768, layers=2)
>>> tl = build_timeline(prog.steps, v5p, place(v5p, mesh))
>>> tl.streams()
['compute', 'comm X']
>>> round(tl.comm_exposed_s * 1e3, 3)  # only the first weight AllGather waits
2.983
"""

from __future__ import annotations

import bisect
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..dtypes import resolve_dtype
from ..mesh import Mesh
from ..trace_events import TraceSlice, slice_name, write_chrome_trace
from ..tracing import COLLECTIVES, Event, Trace
from .collectives import collective_time
from .efficiency import IDEAL, Efficiency, resolve_efficiency
from .hardware import Hardware
from .placement import AxisLink, Placement, place
from .presets import get_hardware
from .program import Step, trace_steps
from .roofline import matmul_time
from .schedule import Slot, schedule
from .split import ChipsTime, busiest, chips_time

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Bar:
    """One event on the time line. ``hidden`` is the part of a collective under compute;
    ``untimed_s`` the part of a matmul's bar spent in the element-wise kernels after it."""

    index: int
    stream: str
    op: str
    axes: tuple[str, ...]
    label: str
    phase: str
    layer: int
    start: float
    end: float
    nbytes: int
    flops: int
    limit: str
    intensity: float | None = None
    flops_s: float = 0.0
    memory_s: float = 0.0
    hidden: float = 0.0
    where: str = ""
    untimed_s: float = 0.0

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def is_compute(self) -> bool:
        return self.stream.startswith("compute")

    @property
    def exposed(self) -> float:
        """Seconds of this collective with the compute stream idle (0 for compute)."""
        return 0.0 if self.is_compute else self.seconds - self.hidden


@dataclass
class Timeline:
    """Bars of one chip's step, with totals; ``text()`` and ``plot()`` draw it."""

    bars: list[Bar]
    step_s: float
    overlap: bool
    title: str = ""
    _chips: tuple[list[Bar], list[ChipsTime]] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def chips(self) -> ChipsTime:
        """The set of chips whose step the totals describe: the busiest compute (then the most
        communication, when stages tie); every chip's when all run the same steps."""
        return busiest(self.per_chips())

    def per_chips(self) -> list[ChipsTime]:
        """Each set of chips' step (one per pipeline stage; one for all chips without one)."""
        if self._chips is None or self._chips[0] is not self.bars:  # the bars are set once; computed once
            self._chips = (self.bars, [chips_time(g, bars, self.step_s) for g, bars in _by_chips(self.bars).items()])
        return list(self._chips[1])

    @property
    def compute_s(self) -> float:
        """Busy time of the compute stream (of the busiest chips when chips run different steps)."""
        return self.chips.compute_s

    @property
    def comm_s(self) -> float:
        """Sum of the chips' collectives' times (what the step pays with no overlap)."""
        return self.chips.comm_s

    @property
    def comm_exposed_s(self) -> float:
        """Time the step spends with compute idle, waiting for one of its chips' collectives."""
        return self.chips.exposed_s

    @property
    def comm_hidden_s(self) -> float:
        """Communication the step does not pay for: ``comm_s - comm_exposed_s``."""
        return max(0.0, self.comm_s - self.comm_exposed_s)

    @property
    def comm_under_compute_s(self) -> float:
        """Communication that runs while its chips compute. Unlike ``comm_hidden_s`` it leaves
        out a collective that only overlaps another collective (FSDP+TP's X and Y rings at
        once, with compute idle)."""
        return self.chips.under_compute_s

    @property
    def bubble_s(self) -> float:
        """Time the chips' compute is idle with none of their collectives running: a pipeline
        stage waiting for another stage's work (0 when every chip runs every step)."""
        return self.chips.bubble_s

    def comm_parts(self) -> dict[str, float]:
        """``comm_s`` split in seconds: ``"under compute"``, ``"behind other comm"`` (running
        while compute waits for another collective) and ``"exposed"`` (compute waits). Rounding
        residue below a billionth of the step is 0, so no ``1e-14`` is printed."""
        under, exposed = self.comm_under_compute_s, self.comm_exposed_s
        parts = {"under compute": under, "behind other comm": self.comm_s - under - exposed, "exposed": exposed}
        return {k: v if v > 1e-9 * self.step_s else 0.0 for k, v in parts.items()}

    def streams(self) -> list[str]:
        """The compute streams, then the communication streams, in order of first use."""
        compute = dict.fromkeys(b.stream for b in self.bars if b.is_compute) or {"compute": None}
        return [*compute, *dict.fromkeys(b.stream for b in self.bars if not b.is_compute)]

    def phase_totals(self) -> dict[str, dict[str, float]]:
        """Per phase, seconds of: ``compute`` (roofline), ``flops`` (FLOPs at the achieved rate
        alone, plus the untimed kernels after the matmuls when calibrated: the compute a
        collective can hide behind), ``memory`` (the matmuls' HBM traffic alone), ``comm``
        (sum of collective times) and, per mesh axis, ``comm X`` ... (the collectives using
        that axis's links). When chips run different steps (pipeline stages), every figure is
        the busiest chips' (each set of chips' own compute and collectives, then the largest),
        so a pipeline's communication is not summed over stages against one stage's FLOPs."""
        out: dict[str, dict[str, float]] = {}
        for bars in _by_chips(self.bars).values():
            mine: dict[str, dict[str, float]] = {}
            for b in bars:
                row = mine.setdefault(b.phase, {"compute": 0.0, "flops": 0.0, "memory": 0.0, "comm": 0.0})
                if b.is_compute:
                    row["compute"] += b.seconds
                    row["flops"] += b.flops_s + b.untimed_s
                    row["memory"] += b.memory_s
                    continue
                row["comm"] += b.seconds
                for link in [f"comm {a}" for a in b.axes] or [b.stream]:
                    row[link] = row.get(link, 0.0) + b.seconds
            for phase, row in mine.items():
                total = out.setdefault(phase, dict.fromkeys(row, 0.0))
                for key, seconds in row.items():
                    total[key] = max(total.get(key, 0.0), seconds)
        return out

    if TYPE_CHECKING:  # the charts' (shardsim.cost.gantt puts them on the class: charts sit above time lines)

        def text(self, width: int = 100) -> str:
            """The Gantt chart as text (see :func:`shardsim.cost.gantt.gantt_text`)."""
            ...

        def plot(self, path: str | None = None, **kwargs: Any) -> Figure:
            """The Gantt chart as a matplotlib figure, saved to ``path`` if given (PNG)."""
            ...

    def to_chrome_trace(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """Write the time line as Trace Event Format JSON (Perfetto, ``chrome://tracing``).

        One track per stream (``compute``, ``compute Z1``, ``comm X``...: each set of chips'
        compute and each network), each phase a slice holding its bars, times in µs; every
        bar's fields (bytes, FLOPs, bound, hidden seconds) are its slice's ``args``. Where a
        bar's ``hidden`` part overlaps compute, Perfetto shows the two tracks side by side.
        Returns the JSON document; ``path`` None writes no file.

        >>> import shardsim
        >>> from shardsim.cost import timeline_of
        >>> mesh = shardsim.Mesh(X=4)
        >>> w = shardsim.shard(shardsim.ShapeDtype((8192, 8192), "bfloat16"), mesh, "D_X F")
        >>> with shardsim.trace() as t:
        ...     full = shardsim.all_gather(w, "X")
        >>> doc = timeline_of(t, "tpu-v5p", mesh).to_chrome_trace()
        >>> [(e["name"], e["dur"]) for e in doc["traceEvents"] if e["ph"] == "X"]
        [('forward', 745.654), ('all_gather X', 745.654)]
        """
        return write_chrome_trace(self.chrome_slices(), path, self.title or "shardsim time line")

    def chrome_slices(self) -> list[TraceSlice]:
        """The slices :meth:`to_chrome_trace` exports: one per bar, on its stream."""
        return [
            TraceSlice(
                b.stream,
                slice_name(b.op, b.axes, b.label, not b.is_compute),
                b.phase,
                b.start * 1e6,
                b.end * 1e6,
                {**dataclasses.asdict(b), "seconds": b.seconds, "exposed": b.exposed},
                not b.is_compute,
            )
            for b in self.bars
        ]

    def __str__(self) -> str:
        return self.text()

    def table(self) -> str:
        """Per phase and stream: busy time, and per collective its time and the part exposed
        (compute idle), as a text table; the notebook shows the same cells as HTML.

        >>> import shardsim
        >>> from shardsim.cost import timeline_of
        >>> mesh = shardsim.Mesh(X=4)
        >>> w = shardsim.shard(shardsim.ShapeDtype((8192, 8192), "bfloat16"), mesh, "D_X F")
        >>> with shardsim.trace() as t:
        ...     full = shardsim.all_gather(w, "X")
        >>> print(timeline_of(t, "tpu-v5p", mesh).table())
        phase    stream  bars      time   exposed
        forward  comm X     1  745.7 µs  745.7 µs
        """
        from .._format import table_text

        return table_text(*self._rows())

    def _repr_html_(self) -> str:
        from .._format import table_html

        return table_html(*self._rows(), caption=self.title)

    def _rows(self) -> tuple[list[tuple[str, ...]], set[int]]:
        from .._format import fmt_time

        rows: dict[tuple[str, str], list[Any]] = {}
        for b in self.bars:
            row = rows.setdefault((b.phase, b.stream), [0, 0.0, None if b.is_compute else 0.0])
            row[0] += 1
            row[1] += b.seconds
            if not b.is_compute:  # exposed: the seconds compute sat idle waiting on it
                row[2] += b.exposed
        header = ("phase", "stream", "bars", "time", "exposed")
        body = [(p, s, str(n), fmt_time(t), "-" if x is None else fmt_time(x)) for (p, s), (n, t, x) in rows.items()]
        return [header, *body], {2, 3, 4}


def build_timeline(
    steps: Sequence[Step],
    hardware: Hardware,
    placement: Placement,
    *,
    overlap: bool = True,
    prefetch: int = 1,
    title: str = "",
    efficiency: Efficiency = IDEAL,
    mesh: Mesh | None = None,
) -> Timeline:
    """Cost every step on ``hardware`` and schedule them (:func:`~shardsim.cost.schedule.schedule`).

    With ``mesh``, its slow chips (:meth:`~shardsim.Mesh.slow`) stretch every step they take
    part in: a step runs on all its chips in lock step (SPMD), so it lasts as long as on its
    slowest chip, a collective as long as its slowest group.
    """
    groups = sorted({st.event.where for st in steps if st.event.where})
    slowest = _slowest(mesh)
    costs: dict[tuple[Any, ...], _Cost | None] = {}
    per_step: list[_Cost | None] = []
    slots: list[Slot] = []
    for st in steps:
        e = st.event
        sizes = (e.flops, e.hbm_bytes, e.array_bytes, e.received_bytes)
        key = (e.op, e.axes, e.phase, e.kernel, *sizes, e.dtype, e.where, e.local_shapes)
        if key not in costs:
            costs[key] = _slowed(_cost(e, hardware, placement, groups, efficiency), slowest(e.where))
        cost = costs[key]
        per_step.append(cost)
        slots.append(Slot(None, (), 0.0) if cost is None else Slot(cost.stream, cost.links, cost.seconds))
    bars = []
    for p in sorted(schedule(steps, slots, overlap=overlap, prefetch=prefetch), key=lambda p: p.index):
        st, cost = steps[p.index], per_step[p.index]
        assert cost is not None
        e = st.event
        nbytes = e.hbm_bytes if cost.stream.startswith("compute") else e.array_bytes or e.received_bytes
        bars.append(
            Bar(
                p.index, cost.stream, e.op, e.axes, e.label, e.phase, st.layer, p.start, p.end, nbytes, e.flops,
                cost.limit, cost.intensity, cost.flops_s, cost.memory_s, where=e.where, untimed_s=cost.untimed_s,
            )
        )  # fmt: skip
    step = max((b.end for b in bars), default=0.0)
    return Timeline(_with_hidden(bars), step, overlap, title)


def timeline_of(
    trace: Trace,
    hardware: Hardware | str,
    mesh: Mesh,
    *,
    overlap: bool = True,
    links: Mapping[str, str | AxisLink] | None = None,
    topology: str | Sequence[int] | None = None,
    efficiency: str | Efficiency = "ideal",
) -> Timeline:
    """The time line of a trace you recorded yourself (``with shardsim.trace() as t: ...``).

    ``links`` and ``topology`` place the mesh (:func:`~shardsim.cost.place`); ``efficiency``
    is ``"ideal"`` (the book's rates, the default here) or ``"calibrated"``.

    >>> import shardsim
    >>> mesh = shardsim.Mesh(X=4)
    >>> w = shardsim.shard(shardsim.ShapeDtype((8192, 8192), "bfloat16"), mesh, "D_X F")
    >>> with shardsim.trace() as t:
    ...     full = shardsim.all_gather(w, "X")
    >>> round(timeline_of(t, "tpu-v5p", mesh).step_s * 1e6)  # V / W_ici = 2**27 B / 1.8e11 B/s
    746
    """
    hw = get_hardware(hardware)
    placement = place(hw, mesh, links, topology=topology)
    eff = resolve_efficiency(hw, efficiency, placement.networks())
    return build_timeline(trace_steps(trace), hw, placement, overlap=overlap, efficiency=eff, mesh=mesh)


@dataclass(frozen=True)
class _Cost:
    stream: str
    links: tuple[str, ...]
    seconds: float
    limit: str
    intensity: float | None = None
    flops_s: float = 0.0
    memory_s: float = 0.0
    untimed_s: float = 0.0


def output_bytes(e: Event) -> float:
    """Bytes a matmul event writes on its chip: FLOPs over twice the contracted dimension
    (the last of the first operand) elements, at the event's dtype (0 without shapes).

    >>> import shardsim
    >>> mesh = shardsim.Mesh(X=2)
    >>> x = shardsim.shard(shardsim.ShapeDtype((64, 32), "bfloat16"), mesh, "B_X D")
    >>> w = shardsim.shard(shardsim.ShapeDtype((32, 128), "bfloat16"), mesh, "D F")
    >>> with shardsim.trace() as t:
    ...     y = shardsim.matmul(x, w)
    >>> output_bytes(t.events[0]) == 32 * 128 * 2  # y's [32, 128] bf16 block on one chip
    True
    """
    if not e.local_shapes or not e.local_shapes[0] or not e.flops:
        return 0.0
    return e.flops / (2 * e.local_shapes[0][-1]) * resolve_dtype(e.dtype or "bfloat16").itemsize


def _cost(
    e: Event, hardware: Hardware, placement: Placement, groups: Sequence[str] = (), efficiency: Efficiency = IDEAL
) -> _Cost | None:
    """Where event ``e`` runs and for how long; None for a local op that costs nothing.

    ``groups`` are the sets of chips some events run on alone (``Event.where``, e.g. the
    stages of a pipeline): each has its own compute stream and links; an event every chip
    runs occupies all of them.
    """
    on = [e.where, *_inside(e.where, groups)] if e.where else list(groups)
    suffix = f" {e.where}" if e.where else ""

    def links(name: str) -> tuple[str, ...]:
        return tuple(f"{name} {g}" for g in on) or (name,)

    kernel = _kernel(e, hardware, efficiency)
    if kernel is not None:
        return _Cost("compute" + suffix, links("compute"), *kernel)
    if e.op in COLLECTIVES and e.axes:
        t = collective_time(e.op, _volume(e), placement.route(e.axes), hardware.ring, efficiency)
        axes_links = tuple(link for a in e.axes for link in links(f"comm {a}"))
        return _Cost("comm " + ",".join(e.axes) + suffix, axes_links, t.seconds, t.limit)
    if e.op == "host_transfer" and hardware.host_bandwidth:
        return _Cost("host" + suffix, links("host"), e.received_bytes / hardware.host_bandwidth, "bandwidth")
    return None


def _kernel(e: Event, hardware: Hardware, efficiency: Efficiency) -> tuple[Any, ...] | None:
    """A compute event's seconds, what bounds it, its intensity and its seconds in FLOPs, HBM
    traffic and untimed kernels (the fields of :class:`_Cost` after its stream and links);
    None for an event that does not compute. The same on every placement."""
    if e.kernel == "attention" and efficiency.attention is not None:
        # a fused kernel: its scores never reach HBM and its softmax is inside it, so it runs
        # at the kernel's measured rate with no untimed passes after it
        seconds = e.flops / (hardware.flops(e.dtype or "bfloat16") * efficiency.attention.fraction(e.phase))
        return seconds, "compute", None, seconds
    if e.kernel == "attention":
        # a fused kernel without a measured rate: its matmuls run on the matmul curve at the
        # traffic the trace counts (Q, K, V and O once per block, the scores a 128 x 128 tile on
        # chip), and its softmax is inside it, so no untimed passes over the scores follow
        r = matmul_time(e.flops, e.hbm_bytes, hardware, e.dtype or "bfloat16", efficiency)
        return r.seconds, r.bound, r.intensity, r.flops_s, r.memory_s
    if e.op == "matmul" or e.flops:
        r = matmul_time(e.flops, e.hbm_bytes, hardware, e.dtype or "bfloat16", efficiency)
        # the untimed kernels that read and write the matmul's output run right after it on
        # the same stream, so its reader waits for them too (0 when ideal)
        untimed = efficiency.untimed_s(output_bytes(e), hardware.hbm_bandwidth)
        return r.seconds + untimed, r.bound, r.intensity, r.flops_s, r.memory_s, untimed
    return None


def compute_seconds(events: Sequence[Event], hardware: Hardware, efficiency: Efficiency = IDEAL) -> float:
    """Seconds the busiest chips' compute stream runs ``events``' kernels: a lower bound of
    their time line's step on any placement (the collectives are left out; they only add
    waits). An event held on some chips only (``Event.where``) runs on those chips' stream,
    one every chip runs on all of them.

    >>> import shardsim
    >>> from .presets import get_hardware
    >>> mesh = shardsim.Mesh(X=2)
    >>> x = shardsim.shard(shardsim.ShapeDtype((4096, 4096), "bfloat16"), mesh, "B_X D")
    >>> w = shardsim.shard(shardsim.ShapeDtype((4096, 4096), "bfloat16"), mesh, "D F")
    >>> with shardsim.trace() as t:
    ...     y = shardsim.all_gather(shardsim.matmul(x, w), "X")
    >>> hw = get_hardware("h100")
    >>> compute_seconds(t.events, hw) == timeline_of(t, hw, mesh).bars[0].seconds  # the matmul alone
    True
    """
    busy: dict[str, float] = {}
    seconds: dict[tuple[Any, ...], float] = {}
    for e in events:
        key = (e.op, e.kernel, e.phase, e.flops, e.hbm_bytes, e.dtype, e.local_shapes)
        if key not in seconds:
            kernel = _kernel(e, hardware, efficiency)
            seconds[key] = 0.0 if kernel is None else kernel[0]
        busy[e.where] = busy.get(e.where, 0.0) + seconds[key]
    everyone = busy.pop("", 0.0)
    return everyone + max(busy.values(), default=0.0)


def _inside(where: str, groups: Sequence[str]) -> list[str]:
    """The sets of chips among ``groups`` that lie within the chips ``where`` names: those that
    fix every coordinate ``where`` fixes and more (``"pipe1,C3"`` within ``"pipe1"``). A step
    on a pipeline stage's chips occupies the stream of each of its context-parallel chips too,
    or that chip would run its own attention and its stage's other work at once."""
    mine = set(where.split(","))
    return [g for g in groups if g != where and mine < set(g.split(","))]


def _slowest(mesh: Mesh | None) -> Callable[[str], float]:
    """``where`` (an event's chips, ``""`` for all) -> the largest slowdown among those chips."""
    if mesh is None:
        return lambda where: 1.0
    slow = mesh.slowdown
    if (slow == 1.0).all():
        return lambda where: 1.0

    def factor(where: str) -> float:
        index: list[int | slice] = [slice(None)] * len(mesh.shape)
        for token in where.split(",") if where else []:
            # "Z1": axis Z, index 1 (the longest axis name that leaves a valid index wins)
            hits = [
                (a, int(token[len(a) :]))
                for a in mesh.axis_names
                if token.startswith(a) and token[len(a) :].isdigit() and int(token[len(a) :]) < mesh.axis_size(a)
            ]
            if not hits:
                return float(slow.max())  # "5 chips": not a coordinate, assume the slowest
            a, i = max(hits, key=lambda h: len(h[0]))
            index[mesh.axis_index(a)] = i
        return float(slow[tuple(index)].max())

    return factor


def _slowed(cost: _Cost | None, factor: float) -> _Cost | None:
    if cost is None or factor == 1.0:
        return cost
    return replace(
        cost,
        seconds=cost.seconds * factor,
        flops_s=cost.flops_s * factor,
        memory_s=cost.memory_s * factor,
        untimed_s=cost.untimed_s * factor,
    )


def _volume(e: Event) -> float:
    """V of the book's formulas; from the bytes sent when a trace did not record it."""
    if e.array_bytes:
        return e.array_bytes
    n = max(e.group_size, 2)
    if e.op == "all_reduce":
        return e.sent_bytes * n / (2 * (n - 1))
    if e.op == "all_to_all":
        return e.sent_bytes * n * n / (n - 1)
    if e.op == "ppermute":
        return e.sent_bytes
    return e.sent_bytes * n / (n - 1)


def _by_chips(bars: Sequence[Bar]) -> dict[str, list[Bar]]:
    """Bars per set of chips (``Event.where``); a bar every chip runs goes to every set."""
    groups = sorted({b.where for b in bars if b.where})
    if not groups:
        return {"": list(bars)}
    out: dict[str, list[Bar]] = {g: [] for g in groups}
    every = list(out.values())
    for b in bars:  # one pass, each set's bars in their order (a pipeline's time line has many)
        if b.where:
            out[b.where].append(b)
        else:
            for mine in every:
                mine.append(b)
    return out


def _with_hidden(bars: list[Bar]) -> list[Bar]:
    """Fill ``hidden``: the seconds each collective overlaps the compute of its chips."""
    compute = {g: [b for b in group if b.is_compute] for g, group in _by_chips(bars).items()}
    fallback = compute.get("") or max(compute.values(), key=len)
    starts_of = {g: [c.start for c in mine] for g, mine in compute.items()}
    out = []
    for b in bars:
        if b.is_compute or b.seconds == 0:
            out.append(b)
            continue
        group = b.where if compute.get(b.where) else "" if compute.get("") else None
        mine = compute[group] if group is not None else fallback
        starts = starts_of[group] if group is not None else [c.start for c in fallback]
        hidden = 0.0
        k = max(0, bisect.bisect_right(starts, b.start) - 1)
        while k < len(mine) and mine[k].start < b.end:
            c = mine[k]
            hidden += max(0.0, min(b.end, c.end) - max(b.start, c.start))
            k += 1
        out.append(replace(b, hidden=min(hidden, b.seconds)))
    return out
