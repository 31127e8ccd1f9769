"""What bounds a step, by the book's test phase by phase: its collectives against its matmuls.

A phase whose collectives on some mesh axis take longer than its matmul FLOPs
(``T_comms > T_math``) makes the step communication-bound; :func:`excess_terms` gives
``T_comms - T_math`` for every phase and mesh-axis link, :func:`comm_excess` the largest.

>>> phases = {"forward": {"flops": 2.0, "memory": 1.0, "comm": 3.0, "comm X": 3.0}}
>>> excess_terms(phases), comm_excess(phases)
({('forward', 'comm X'): 1.0}, 1.0)
"""

from __future__ import annotations

from collections.abc import Mapping


def comm_excess(phases: Mapping[str, Mapping[str, float]]) -> float:
    """The largest ``T_comms - T_math`` over phases and mesh axes (> 0: communication-bound).

    T_math is the phase's FLOPs at peak; T_comms the time of its collectives on one mesh
    axis's links: collectives on different axes overlap one another, as the book assumes
    for FSDP+TP (``T_comms = max(T_FSDP, T_TP)``).

    >>> comm_excess({"backward": {"flops": 2.0, "comm": 1.0}})
    -1.0
    """
    return max(excess_terms(phases).values(), default=0.0)


def excess_terms(phases: Mapping[str, Mapping[str, float]]) -> dict[tuple[str, str], float]:
    """``T_comms - T_math`` for every (phase, mesh-axis link): the terms of :func:`comm_excess`.

    Phases without matmuls (an optimizer step) have no FLOPs to hide collectives behind and
    are left out, as the book's test is about the forward and backward passes.

    >>> excess_terms({"optimizer": {"flops": 0.0, "comm": 1.0}})
    {}
    """
    out = {}
    for name, p in phases.items():
        if p["flops"] <= 0:
            continue
        links = {k: v for k, v in p.items() if k.startswith("comm ")} or {"comm": p["comm"]}
        for link, seconds in links.items():
            out[(name, link)] = seconds - p["flops"]
    return out


__all__ = ["comm_excess", "excess_terms"]
