"""The trace: one event per collective and per local matmul, with bytes, FLOPs and phase.

>>> import numpy as np, shardsim
>>> mesh = shardsim.Mesh(X=4)
>>> w = shardsim.shard(np.ones((8, 8), np.float32), mesh, "D_X F").named("W")
>>> with shardsim.trace() as t:
...     full = shardsim.all_gather(w, "X")
>>> t.collectives()
[('all_gather', ('X',))]
>>> t.events[0].sent_bytes  # (N-1)/N of the gathered 256-byte array
192
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import math
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ShardingError

if TYPE_CHECKING:
    from .array import ShardedArray
    from .cost.timeline import Timeline

_phase: contextvars.ContextVar[str] = contextvars.ContextVar("shardsim_phase", default="forward")
_active: contextvars.ContextVar[tuple[Trace, ...]] = contextvars.ContextVar("shardsim_traces", default=())

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "ppermute")


@dataclass(frozen=True)
class Event:
    """One step of a program: a collective or a local matmul, as one chip sees it.

    ``sent_bytes`` / ``received_bytes`` are per chip (ring algorithms); ``flops`` per chip;
    ``hbm_bytes`` the bytes a chip reads and writes for a matmul (for the roofline).
    ``inputs`` and ``output`` are value ids, so a cost model can follow data dependencies:
    ``inputs`` names the traced values (earlier events' outputs, or the program's inputs) the
    operands derive from, seen through untraced local ops such as a transpose or an activation.
    ``where`` names the chips that run the step when only some do (their operands are held
    there only): ``"Z1"`` for the second stage of a pipeline over Z; ``""`` for every chip.
    A ppermute runs where it sends from.
    """

    index: int
    op: str
    axes: tuple[str, ...]
    label: str
    before: tuple[str, ...]
    after: str
    phase: str
    sent_bytes: int = 0
    received_bytes: int = 0
    flops: int = 0
    hbm_bytes: int = 0
    group_size: int = 1
    array_bytes: int = 0
    local_shapes: tuple[tuple[int, ...], ...] = ()
    dtype: str = ""
    inputs: tuple[int, ...] = ()
    output: int = 0
    where: str = ""

    @property
    def is_collective(self) -> bool:
        return self.op in COLLECTIVES


@dataclass
class Trace:
    """Events recorded inside a ``with shardsim.trace() as t:`` block.

    ``t.collectives()`` gives ``[(op, axes), ...]``; ``print(t)`` a table; ``t.summary()``
    totals per op and axis. A trace compares equal to a list of ``(op, axes)`` pairs, with
    axes as a string or tuple.
    """

    events: list[Event] = field(default_factory=list)

    def collectives(self, phase: str | None = None) -> list[tuple[str, tuple[str, ...]]]:
        """``[(op, axes), ...]`` of the collectives, optionally of one phase."""
        return [(e.op, e.axes) for e in self.events if e.is_collective and (phase is None or e.phase == phase)]

    def steps(self, phase: str | None = None) -> list[tuple[str, str, str]]:
        """``[(op, axes as 'XY', label), ...]`` of every event: the program as the seeds list it."""
        return [(e.op, "".join(e.axes), e.label) for e in self.events if phase is None or e.phase == phase]

    def summary(self) -> dict[tuple[str, tuple[str, ...]], dict[str, int]]:
        """Per (op, axes): ``count``, ``sent_bytes``, ``received_bytes``, ``flops`` per chip."""
        out: dict[tuple[str, tuple[str, ...]], dict[str, int]] = defaultdict(
            lambda: {"count": 0, "sent_bytes": 0, "received_bytes": 0, "flops": 0}
        )
        for e in self.events:
            row = out[(e.op, e.axes)]
            row["count"] += 1
            row["sent_bytes"] += e.sent_bytes
            row["received_bytes"] += e.received_bytes
            row["flops"] += e.flops
        return dict(out)

    def total(self, what: str = "sent_bytes", phase: str | None = None) -> int:
        """Sum of one field (``sent_bytes``, ``received_bytes``, ``flops``) over the events."""
        return sum(getattr(e, what) for e in self.events if phase is None or e.phase == phase)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Trace):
            return self.events == other.events
        if isinstance(other, Sequence):
            want = [(op, (ax,) if isinstance(ax, str) else tuple(ax)) for op, ax in other]
            return self.collectives() == want
        return NotImplemented

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def to_records(self) -> list[dict[str, Any]]:
        """One plain dict per event, its fields by name: ``pandas.DataFrame(t.to_records())`` is a table.

        >>> import numpy as np, shardsim
        >>> w = shardsim.shard(np.ones((8, 8), np.float32), shardsim.Mesh(X=4), "D_X F").named("W")
        >>> with shardsim.trace() as t:
        ...     full = shardsim.all_gather(w, "X")
        >>> r = t.to_records()[0]
        >>> r["op"], r["axes"], r["label"], r["sent_bytes"]
        ('all_gather', ('X',), 'W', 192)
        """
        return [dataclasses.asdict(e) for e in self.events]

    def to_chrome_trace(
        self, path: str | os.PathLike[str] | None = None, timeline: Timeline | None = None
    ) -> dict[str, Any]:
        """Write the trace as Trace Event Format JSON, which Perfetto and ``chrome://tracing`` open.

        One track per set of chips (all chips, or a pipeline stage's: ``Event.where``) for the
        matmuls, and one per network (the collective's mesh axes) for the collectives; each phase
        (forward, backward...) is a slice holding its events' slices; every event's fields (bytes,
        FLOPs, layouts: :meth:`to_records`) are its slice's ``args``. Without ``timeline`` time is
        event order (event ``i`` takes 1 µs from ``i`` µs); with the cost model's time line of this
        trace (:func:`shardsim.cost.timeline_of`) events take their place and length on it.
        Returns the JSON document; ``path`` None writes no file.

        >>> import numpy as np, shardsim
        >>> w = shardsim.shard(np.ones((8, 8), np.float32), shardsim.Mesh(X=4), "D_X F").named("W")
        >>> with shardsim.trace() as t:
        ...     full = shardsim.all_gather(w, "X")
        >>> doc = t.to_chrome_trace()
        >>> [(e["name"], e["ts"], e["dur"]) for e in doc["traceEvents"] if e["ph"] == "X"]
        [('forward', 0, 1), ('all_gather X W', 0, 1)]
        """
        records = self.to_records()
        if timeline is None:
            slices = [
                TraceSlice(_event_track(e), _event_name(e), e.phase, e.index, e.index + 1, r, e.is_collective)
                for e, r in zip(self.events, records)
            ]
        else:
            slices = []
            for b in timeline.bars:
                if b.index >= len(self.events) or self.events[b.index].op != b.op:
                    raise ShardingError(
                        f"the time line's bar {b.index} ({b.op}) is no event of this trace; pass the time line "
                        "made from this trace: shardsim.cost.timeline_of(trace, hardware, mesh)"
                    )
                e = self.events[b.index]
                args = {**records[b.index], "start_s": b.start, "end_s": b.end, "hidden_s": b.hidden}
                us = (b.start * 1e6, b.end * 1e6)
                slices.append(TraceSlice(b.stream, _event_name(e), e.phase, *us, args, not b.is_compute))
        return write_chrome_trace(slices, path, "shardsim trace")

    def __str__(self) -> str:
        from .pictures import trace_table

        return trace_table(self)

    def _repr_html_(self) -> str:
        from .pictures import trace_html

        return trace_html(self)


# -- Trace Event Format (Perfetto, chrome://tracing) ----------------------------------------------
@dataclass(frozen=True)
class TraceSlice:
    """One slice to export: its track, name, phase, start and end in µs, and its ``args``."""

    track: str
    name: str
    phase: str
    start_us: float
    end_us: float
    args: dict[str, Any]
    network: bool = False


def write_chrome_trace(
    slices: Sequence[TraceSlice], path: str | os.PathLike[str] | None, process: str
) -> dict[str, Any]:
    """The Trace Event Format document of ``slices`` (written to ``path`` unless None).

    Each track is a thread (``tid``) of one process, chips' tracks first, then networks; slices
    that would overlap on one track go to a second lane of it (``"comm X (2)"``), since a
    thread's slices must nest. Each run of consecutive slices of one phase on a lane is wrapped
    in a slice named after the phase (``cat`` ``"phase"``); times are ``X`` events in µs.

    >>> a = TraceSlice("comm X", "all_gather X W", "forward", 0.0, 2.5, {"sent_bytes": 96}, network=True)
    >>> doc = write_chrome_trace([a], None, "demo")
    >>> [(e["ph"], e["name"], e["tid"]) for e in doc["traceEvents"]][1:]
    [('M', 'thread_name', 1), ('M', 'thread_sort_index', 1), ('X', 'forward', 1), ('X', 'all_gather X W', 1)]
    """
    lanes: dict[str, list[list[TraceSlice]]] = {}
    network: dict[str, bool] = {}
    for s in sorted(slices, key=lambda s: (s.start_us, s.end_us)):
        track_lanes = lanes.setdefault(s.track, [])
        network.setdefault(s.track, s.network)
        lane = next((ln for ln in track_lanes if ln[-1].end_us <= s.start_us), None)
        if lane is None:
            lane = []
            track_lanes.append(lane)
        lane.append(s)
    rows = [
        (track if k == 0 else f"{track} ({k + 1})", lane)
        for track in sorted(lanes, key=lambda t: network[t])  # stable: chips' tracks first, by first use
        for k, lane in enumerate(lanes[track])
    ]
    events: list[dict[str, Any]] = [{"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": process}}]
    for tid, (name, _) in enumerate(rows, 1):
        events.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": name}})
        events.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    for tid, (_, lane) in enumerate(rows, 1):
        run_start = 0
        for i in range(1, len(lane) + 1):
            if i < len(lane) and lane[i].phase == lane[run_start].phase:
                continue
            run = lane[run_start:i]
            events.append(_x(run[0].phase, "phase", tid, run[0].start_us, max(s.end_us for s in run), {}))
            for s in run:
                events.append(_x(s.name, "collective" if s.network else "compute", tid, s.start_us, s.end_us, s.args))
            run_start = i
    doc = {"traceEvents": [{**e, "args": _plain(e["args"])} for e in events], "displayTimeUnit": "ns"}
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, allow_nan=False)
    return doc


def _x(name: str, cat: str, tid: int, start: float, end: float, args: dict[str, Any]) -> dict[str, Any]:
    """A complete (``X``) event; times rounded to the nanosecond so a phase's end is its last slice's."""
    ts, dur = _us(start), _us(_us(end) - _us(start))
    return {"ph": "X", "pid": 1, "tid": tid, "name": name, "cat": cat, "ts": ts, "dur": dur, "args": args}


def _us(t: float) -> float | int:
    r = round(t, 3)
    return int(r) if r == int(r) else r


def _plain(value: Any) -> Any:
    """``args`` as strict JSON: tuples as lists, NumPy numbers as Python's, inf and nan as text.

    >>> _plain({"axes": ("X",), "flops": np.int64(4), "intensity": float("inf")})
    {'axes': ['X'], 'flops': 4, 'intensity': 'inf'}
    """
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no inf or nan, and trace viewers refuse them
    return value


def _event_track(e: Event) -> str:
    """``chips`` / ``chips Z1`` for local work, ``network X`` / ``network X,Y Z1`` for a collective."""
    where = f" {e.where}" if e.where else ""
    if e.is_collective:
        return "network " + ",".join(e.axes) + where
    return "chips" + where


def _event_name(e: Event) -> str:
    return slice_name(e.op, e.axes, e.label, e.is_collective)


def slice_name(op: str, axes: Sequence[str], label: str, collective: bool) -> str:
    """``all_gather X W_in``, ``matmul In @ W_in``: an exported slice's name.

    >>> slice_name("all_gather", ("X", "Y"), "W_in", True), slice_name("matmul", (), "In @ W_in", False)
    ('all_gather X,Y W_in', 'matmul In @ W_in')
    """
    return " ".join(p for p in (op, ",".join(axes) if collective else "", label) if p)


@contextlib.contextmanager
def trace() -> Iterator[Trace]:
    """Record every collective and matmul run inside the block (traces nest)."""
    t = Trace()
    token = _active.set(_active.get() + (t,))
    try:
        yield t
    finally:
        _active.reset(token)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Tag the events inside the block with a phase: ``forward``, ``backward``, ``optimizer``..."""
    token = _phase.set(name)
    try:
        yield
    finally:
        _phase.reset(token)


def current_phase() -> str:
    return _phase.get()


def next_event_index() -> int | None:
    """The index the next event will get in the innermost active trace (None when not tracing)."""
    traces = _active.get()
    return len(traces[-1].events) if traces else None


def record(
    op: str,
    axes: tuple[str, ...],
    inputs: Sequence[ShardedArray],
    output: ShardedArray,
    **numbers: Any,
) -> None:
    """Append an event to every active trace (a no-op when none is active)."""
    traces = _active.get()
    if not traces:
        return
    if output.label:
        label = output.label
    elif len(inputs) > 1:  # a matmul: name it by its operands, "H @ W_out"
        label = " @ ".join(x.label or "?" for x in inputs)
    else:
        label = inputs[0].label or ""
    for t in traces:
        t.events.append(
            Event(
                index=len(t.events),
                op=op,
                axes=axes,
                label=label,
                before=tuple(str(x.layout) for x in inputs),
                after=str(output.layout),
                phase=_phase.get(),
                dtype=str(output.dtype),
                inputs=tuple(dict.fromkeys(s for x in inputs for s in x.sources)),
                output=output.uid,
                where=_where(inputs),
                **numbers,
            )
        )


def _where(inputs: Sequence[ShardedArray]) -> str:
    """``"Z1"``: the mesh coordinates all chips holding every input share ("" if every chip holds them)."""
    from .array import held_where

    held = held_where(*inputs)
    if held is None:
        return ""
    mesh = inputs[0].mesh
    chips = np.argwhere(held)
    fixed = [
        f"{a}{int(chips[0, i])}"
        for i, a in enumerate(mesh.axis_names)
        if mesh.shape[i] > 1 and (chips[:, i] == chips[0, i]).all()
    ]
    return ",".join(fixed) or f"{len(chips)} chips"
