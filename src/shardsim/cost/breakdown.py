"""Tables of a time line: per event, per collective, per layer.

>>> from shardsim import Mesh
>>> from shardsim.cost import estimate
>>> est = estimate("fsdp", Mesh(X=16), "tpu-v5p", 16 * 1024, 8192, 32768, layers=2)
>>> [(r["phase"], r["op"], r["label"], r["count"]) for r in by_collective(est.timeline)][:2]
[('forward', 'all_gather', 'W_in', 2), ('forward', 'all_gather', 'W_out', 2)]
"""

from __future__ import annotations

import re
from typing import Any

from .timeline import Timeline

_LAYER = re.compile(r"\.\d+\b")


def base_label(label: str) -> str:
    """A label without its layer number: ``In @ W_in.3`` → ``In @ W_in``."""
    return _LAYER.sub("", label)


def by_event(tl: Timeline) -> list[dict[str, Any]]:
    """One row per bar: where it runs, when, how long, how much of it is hidden, what limits it."""
    return [
        {
            "layer": b.layer,
            "phase": b.phase,
            "op": b.op,
            "axes": "".join(b.axes),
            "label": b.label,
            "start_s": b.start,
            "seconds": b.seconds,
            "hidden_s": b.hidden,
            "bytes": b.nbytes,
            "limit": b.limit,
            "intensity": b.intensity,
        }
        for b in tl.bars
    ]


def by_collective(tl: Timeline) -> list[dict[str, Any]]:
    """Per (phase, op, axes, label without layer number), over the layers: count, seconds, and ``exposed_s``, the
    seconds each ran with compute idle (collectives on two axes may be exposed at once)."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for b in tl.bars:
        if b.is_compute:
            continue
        row = rows.setdefault(
            (b.phase, b.op, b.axes, base_label(b.label)),
            {
                "phase": b.phase,
                "op": b.op,
                "axes": "".join(b.axes),
                "label": base_label(b.label),
                "count": 0,
                "seconds": 0.0,
                "exposed_s": 0.0,
                "bytes": b.nbytes,
                "limit": b.limit,
            },
        )
        row["count"] += 1
        row["seconds"] += b.seconds
        row["exposed_s"] += b.exposed
    return list(rows.values())


def by_layer(tl: Timeline) -> list[dict[str, Any]]:
    """Per (layer, phase): compute and comm seconds, and ``exposed_s``, the time the compute
    stream waited before that layer's matmuls (the wait after the last matmul goes to the
    layer of the last collective). When every chip runs every step the ``exposed_s`` add up to
    ``tl.comm_exposed_s``; across a pipeline's stages they are the moments no stage computes."""
    rows: dict[tuple[int, str], dict[str, Any]] = {}

    def row(layer: int, phase: str) -> dict[str, Any]:
        return rows.setdefault(
            (layer, phase), {"layer": layer, "phase": phase, "compute_s": 0.0, "comm_s": 0.0, "exposed_s": 0.0}
        )

    t = 0.0
    for b in sorted(tl.bars, key=lambda b: (b.start, not b.is_compute)):
        r = row(b.layer, b.phase)
        if b.is_compute:
            r["compute_s"] += b.seconds
            r["exposed_s"] += max(0.0, b.start - t)
            t = max(t, b.end)
        else:
            r["comm_s"] += b.seconds
    comm = [b for b in tl.bars if not b.is_compute]
    if comm and tl.step_s > t:
        last = max(comm, key=lambda b: b.end)
        row(last.layer, last.phase)["exposed_s"] += tl.step_s - t
    return list(rows.values())
