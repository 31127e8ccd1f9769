"""Traces and time lines as Trace Event Format JSON, the file Perfetto and ``chrome://tracing`` open.

A time line of 32 layers drawn as a PNG is a barcode; exported, it can be zoomed into. Each
exported program is one process; each track (a set of chips' compute, a network) is one of its
threads; each phase (forward, backward...) is a slice around its steps' slices; times are in
µs, and a step's bytes, FLOPs and layouts are its slice's ``args``. :meth:`shardsim.Trace.to_chrome_trace`
and :meth:`shardsim.cost.Timeline.to_chrome_trace` write one program; :func:`export_chrome_trace`
writes several side by side (the schemes of one ``shardsim demo``, say).

>>> import numpy as np, shardsim
>>> mesh = shardsim.Mesh(X=2)
>>> runs = {n: shardsim.run_strategy(n, mesh, shardsim.mlp.init(4, 8), np.ones((2, 4)), np.ones((2, 4)))
...         for n in ("ddp", "fsdp")}
>>> doc = export_chrome_trace({n: r.trace for n, r in runs.items()}, None)
>>> sorted({(e["pid"], e["args"]["name"]) for e in doc["traceEvents"] if e["name"] == "process_name"})
[(1, 'ddp'), (2, 'fsdp')]
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


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


class Exportable(Protocol):
    """A trace or a time line: anything that gives its slices."""

    def chrome_slices(self) -> list[TraceSlice]: ...


def write_chrome_trace(
    slices: Sequence[TraceSlice], path: str | os.PathLike[str] | None, process: str
) -> dict[str, Any]:
    """The Trace Event Format document of one program's ``slices`` (written to ``path`` unless None).

    Each track is a thread (``tid``), chips' tracks first, then networks; slices that would
    overlap on one track go to a second lane of it (``"comm X (2)"``), since a thread's slices
    must nest. Each run of consecutive slices of one phase on a lane is wrapped in a slice named
    after the phase (``cat`` ``"phase"``); times are complete (``X``) events in µs.

    >>> a = TraceSlice("comm X", "all_gather X W", "forward", 0.0, 2.5, {"sent_bytes": 96}, network=True)
    >>> doc = write_chrome_trace([a], None, "demo")
    >>> [(e["ph"], e["name"], e["tid"]) for e in doc["traceEvents"]][1:]
    [('M', 'thread_name', 1), ('M', 'thread_sort_index', 1), ('X', 'forward', 1), ('X', 'all_gather X W', 1)]
    """
    return _write({"traceEvents": _process(1, process, slices), "displayTimeUnit": "ns"}, path)


def export_chrome_trace(programs: Mapping[str, Exportable], path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """Several traces or time lines in one file, one process each, named by the keys of ``programs``.

    The function the command line's ``--chrome-trace`` calls: each scheme a demo runs, or each
    estimate, becomes one process (``pid`` 1, 2, ...) with its own tracks. Returns the document.
    """
    events: list[dict[str, Any]] = []
    for pid, (name, program) in enumerate(programs.items(), 1):
        events += _process(pid, name, program.chrome_slices())
    return _write({"traceEvents": events, "displayTimeUnit": "ns"}, path)


def slice_name(op: str, axes: Sequence[str], label: str, collective: bool) -> str:
    """``all_gather X W_in``, ``matmul In @ W_in``: an exported slice's name.

    >>> slice_name("all_gather", ("X", "Y"), "W_in", True), slice_name("matmul", (), "In @ W_in", False)
    ('all_gather X,Y W_in', 'matmul In @ W_in')
    """
    return " ".join(p for p in (op, ",".join(axes) if collective else "", label) if p)


def _process(pid: int, process: str, slices: Sequence[TraceSlice]) -> list[dict[str, Any]]:
    """The metadata and complete events of one process."""
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
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": process}}
    ]
    for tid, (name, _) in enumerate(rows, 1):
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}})
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    for tid, (_, lane) in enumerate(rows, 1):
        run_start = 0
        for i in range(1, len(lane) + 1):
            if i < len(lane) and lane[i].phase == lane[run_start].phase:
                continue
            run = lane[run_start:i]
            events.append(_x(run[0].phase, "phase", pid, tid, run[0].start_us, max(s.end_us for s in run), {}))
            for s in run:
                cat = "collective" if s.network else "compute"
                events.append(_x(s.name, cat, pid, tid, s.start_us, s.end_us, s.args))
            run_start = i
    return [{**e, "args": _plain(e["args"])} for e in events]


def _write(doc: dict[str, Any], path: str | os.PathLike[str] | None) -> dict[str, Any]:
    if path is not None:  # as a checkpoint writes: never through a link, never into a FIFO
        from ._output_file import write_output

        write_output(path, json.dumps(doc, allow_nan=False).encode("utf-8"))
    return doc


def _x(name: str, cat: str, pid: int, tid: int, start: float, end: float, args: dict[str, Any]) -> dict[str, Any]:
    """A complete (``X``) event; times rounded to the nanosecond so a phase's end is its last slice's."""
    ts, dur = _us(start), _us(_us(end) - _us(start))
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": ts, "dur": dur, "args": args}


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


__all__ = ["TraceSlice", "export_chrome_trace", "slice_name", "write_chrome_trace"]
