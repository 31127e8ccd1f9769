"""Faults at a chosen point of a program: a chip fails, or memory runs out, after the k-th trace event.

Shared by ``tests/test_training_atomic.py`` and ``benchmarks/campaign_faults.py``. The fault is
real: ``mesh.fail`` (the next collective raises ``ChipFailureError``) or ``mesh.memory.capacity``
set to what the fullest chip holds (the next allocation raises ``OutOfMemoryError``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

import shardsim
from shardsim import tracing

KINDS = ("chip", "oom")


def inject(mesh: shardsim.Mesh, kind: str) -> None:
    """The fault itself: fail the last chip along the mesh's first axis, or leave no free byte."""
    if kind == "chip":
        axis = mesh.axis_names[0]
        mesh.fail(**{axis: mesh.axis_size(axis) - 1})
    elif kind == "oom":
        mesh.memory.capacity = int(mesh.memory.live().max())
    else:
        raise ValueError(f"unknown fault kind {kind!r}; choose one of {KINDS}")


def heal(mesh: shardsim.Mesh) -> None:
    """Undo either fault."""
    mesh.heal()
    mesh.memory.capacity = None


@contextlib.contextmanager
def fault_after(mesh: shardsim.Mesh, events: int, kind: str) -> Iterator[list[int]]:
    """Inject ``kind`` once ``events`` trace events have been recorded (0: before the first).

    Yields a one-element list that ends up holding the number of events recorded.
    """
    original = tracing.record
    count = [0]
    if events == 0:
        inject(mesh, kind)

    def record(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        count[0] += 1
        if count[0] == events:
            inject(mesh, kind)

    # every module that records events, by ``tracing.record`` or its own imported name
    loaded = [m for name, m in list(sys.modules.items()) if name.startswith("shardsim")]
    users = [m for m in loaded if getattr(m, "record", None) is original]
    for m in users:
        m.record = record  # type: ignore[attr-defined]
    try:
        yield count
    finally:
        for m in users:
            m.record = original  # type: ignore[attr-defined]


def trainer_state(t: Any) -> dict[str, Any]:
    """Everything a step may change, as host arrays and numbers (read with no fault active)."""
    return {
        "weights": t.weights(),
        "master": t.params_global(),
        "moments": t.moments_global(),
        "step": t.step_count,
        "skipped": t.skipped_steps,
        "scale": t.scale,
    }


def same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Bit for bit (NaN payloads included): the weights, moments and counters of two states."""

    def same(x: Any, y: Any) -> bool:
        if isinstance(x, dict):
            return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
        if isinstance(x, np.ndarray):
            return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        return bool(x == y)

    return same(a, b)
