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
import functools
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .errors import ShardingError
from .holders import held_where

if TYPE_CHECKING:
    from .array import ShardedArray
    from .trace_events import TraceSlice

_phase: contextvars.ContextVar[str] = contextvars.ContextVar("shardsim_phase", default="forward")
_active: contextvars.ContextVar[tuple[Trace, ...]] = contextvars.ContextVar("shardsim_traces", default=())
_layer: contextvars.ContextVar[int] = contextvars.ContextVar("shardsim_layer", default=-1)
_item: contextvars.ContextVar[str] = contextvars.ContextVar("shardsim_item", default="")


class TimedStep(Protocol):
    """One event of a trace placed on a time line (the cost model's :class:`~shardsim.cost.timeline.Bar`).

    >>> import numpy as np, shardsim
    >>> from shardsim.cost import get_hardware, timeline_of
    >>> w = shardsim.shard(np.ones((8, 8), np.float32), shardsim.Mesh(X=4), "D_X F")
    >>> with shardsim.trace() as t:
    ...     full = shardsim.all_gather(w, "X")
    >>> [(b.index, b.op, b.is_compute) for b in timeline_of(t, get_hardware("h100"), w.mesh).bars]
    [(0, 'all_gather', False)]
    """

    @property
    def index(self) -> int: ...
    @property
    def op(self) -> str: ...
    @property
    def stream(self) -> str: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...
    @property
    def hidden(self) -> float: ...
    @property
    def is_compute(self) -> bool: ...


class TimeLine(Protocol):
    """A trace's events on a time line (the cost model's :class:`~shardsim.cost.timeline.Timeline`): the
    trace exports it without knowing the cost model.

    >>> import numpy as np, shardsim
    >>> from shardsim.cost import get_hardware, timeline_of
    >>> w = shardsim.shard(np.ones((8, 8), np.float32), shardsim.Mesh(X=4), "D_X F")
    >>> with shardsim.trace() as t:
    ...     full = shardsim.all_gather(w, "X")
    >>> len(timeline_of(t, get_hardware("h100"), w.mesh).bars)
    1
    """

    @property
    def bars(self) -> Sequence[TimedStep]: ...


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
    A ppermute runs where it sends from. ``layer`` is the model layer whose work the event
    does (-1 outside any layer: embedding, head, loss); ``item`` the pipeline schedule's unit
    of work it belongs to (``"F2.0"``: forward of virtual stage 2 on microbatch 0; ``""``
    without a pipeline). A cost model reads both to rebuild a deep program from a shallow one.
    ``kernel`` is ``"attention"`` for a block matmul of fused (online-softmax) attention, whose
    scores stay on chip (:mod:`shardsim.strategies.context`); ``""`` for any other step.
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
    layer: int = -1
    item: str = ""
    kernel: str = ""

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
        self, path: str | os.PathLike[str] | None = None, timeline: TimeLine | None = None
    ) -> dict[str, Any]:
        """Write the trace as Trace Event Format JSON, which Perfetto and ``chrome://tracing`` open.

        One track per set of chips (all chips, or a pipeline stage's: ``Event.where``) for the
        matmuls, and one per network (the collective's mesh axes) for the collectives; each phase
        (forward, backward...) is a slice holding its events' slices; every event's fields (bytes,
        FLOPs, layouts: :meth:`to_records`) are its slice's ``args``. Without ``timeline`` time is
        event order (event ``i`` takes 1 µs from ``i`` µs); with the cost model's time line of this
        trace (:func:`shardsim.cost.timeline_of`) events take their place and length on it.
        Returns the JSON document; ``path`` None writes no file. Several traces and time lines go
        in one file with :func:`shardsim.trace_events.export_chrome_trace`.

        >>> import numpy as np, shardsim
        >>> w = shardsim.shard(np.ones((8, 8), np.float32), shardsim.Mesh(X=4), "D_X F").named("W")
        >>> with shardsim.trace() as t:
        ...     full = shardsim.all_gather(w, "X")
        >>> doc = t.to_chrome_trace()
        >>> [(e["name"], e["ts"], e["dur"]) for e in doc["traceEvents"] if e["ph"] == "X"]
        [('forward', 0, 1), ('all_gather X W', 0, 1)]
        """
        from .trace_events import write_chrome_trace

        return write_chrome_trace(self.chrome_slices(timeline), path, "shardsim trace")

    def chrome_slices(self, timeline: TimeLine | None = None) -> list[TraceSlice]:
        """The slices :meth:`to_chrome_trace` exports: one per event, in event order or on ``timeline``."""
        from .trace_events import TraceSlice

        records = self.to_records()
        if timeline is None:
            return [
                TraceSlice(_event_track(e), _event_name(e), e.phase, e.index, e.index + 1, r, e.is_collective)
                for e, r in zip(self.events, records)
            ]
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
        return slices

    # __str__ and _repr_html_ are the pictures' (shardsim.pictures puts them on the class)


def _event_track(e: Event) -> str:
    """``chips`` / ``chips Z1`` for local work, ``network X`` / ``network X,Y Z1`` for a collective."""
    where = f" {e.where}" if e.where else ""
    if e.is_collective:
        return "network " + ",".join(e.axes) + where
    return "chips" + where


def _event_name(e: Event) -> str:
    from .trace_events import slice_name

    return slice_name(e.op, e.axes, e.label, e.is_collective)


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
def _tagged(var: contextvars.ContextVar[Any], value: Any) -> Iterator[None]:
    """``var`` set to ``value`` inside the block, restored after."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def phase(name: str) -> contextlib.AbstractContextManager[None]:
    """Tag the events inside the block with a phase: ``forward``, ``backward``, ``optimizer``..."""
    return _tagged(_phase, name)


def layer(index: int) -> contextlib.AbstractContextManager[None]:
    """Tag the events inside the block with the model layer they belong to (``Event.layer``)."""
    return _tagged(_layer, index)


def item(name: str) -> contextlib.AbstractContextManager[None]:
    """Tag the events inside the block with the pipeline item they belong to (``Event.item``)."""
    return _tagged(_item, name)


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
    *,
    held: np.ndarray | None = None,
    output_id: int | None = None,
    **numbers: Any,
) -> None:
    """Append an event to every active trace (a no-op when none is active).

    ``held`` (bool, the mesh's shape) names the chips that run the step when only some of
    those holding its operands do (one context-parallel chip's share of causal attention);
    ``output_id`` the value id its result gets then (each chip's share is a value of its own).
    """
    traces = _active.get()
    if not traces:
        return
    if output.label:
        label = output.label
    elif len(inputs) > 1:  # a matmul: name it by its operands, "H @ W_out"
        label = " @ ".join(x.label or "?" for x in inputs)
    else:
        label = inputs[0].label or ""
    fields = {
        "op": op,
        "axes": axes,
        "label": label,
        "before": tuple([str(x.layout) for x in inputs]),
        "after": str(output.layout),
        "phase": _phase.get(),
        "dtype": _dtype_name(output.dtype),
        # one input's sources are already distinct
        "inputs": inputs[0].sources if len(inputs) == 1 else tuple(dict.fromkeys(s for x in inputs for s in x.sources)),
        "output": output.uid if output_id is None else output_id,
        "where": _where(inputs) if held is None else _where_mask(inputs[0].mesh, held),
        "layer": _layer.get(),
        "item": _item.get(),
        **numbers,
    }
    event = None
    for t in traces:  # nested traces (a step's inside a trainer's) share one event where its index agrees
        index = len(t.events)
        if event is None or event.index != index:
            event = Event(index=index, **fields)
        t.events.append(event)


@functools.lru_cache(maxsize=64)
def _dtype_name(dtype: np.dtype) -> str:
    """``str(dtype)``, which NumPy builds anew in Python each time: an event per op asks."""
    return str(dtype)


def _where(inputs: Sequence[ShardedArray]) -> str:
    """``"Z1"``: the mesh coordinates all chips holding every input share ("" if every chip holds them)."""
    held = held_where(*inputs)
    return "" if held is None else _where_mask(inputs[0].mesh, held)


def _where_mask(mesh: Any, held: np.ndarray) -> str:
    """``"Z1"`` of the chips ``held`` marks ("" if it marks every chip)."""
    if held.all():
        return ""
    return _where_text(mesh.axis_names, mesh.shape, held.astype(bool, copy=False).tobytes())


@functools.lru_cache(maxsize=1024)  # a pipeline's events name a few sets of chips, over and over
def _where_text(axis_names: tuple[str, ...], shape: tuple[int, ...], held: bytes) -> str:
    chips = np.argwhere(np.frombuffer(held, bool).reshape(shape))
    fixed = [
        f"{a}{int(chips[0, i])}"
        for i, a in enumerate(axis_names)
        if shape[i] > 1 and (chips[:, i] == chips[0, i]).all()
    ]
    return ",".join(fixed) or f"{len(chips)} chips"
