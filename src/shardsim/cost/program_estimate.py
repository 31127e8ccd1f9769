"""An estimate from a program already traced: its steps costed and scheduled on the hardware.

The program's events are placed on the hardware's networks (:func:`~shardsim.cost.place`),
timed at the efficiency mode's rates and laid on a time line
(:func:`~shardsim.cost.build_timeline`); the :class:`~shardsim.cost.Estimate` reads its
phases' totals off it.

>>> from shardsim import Mesh
>>> from shardsim.cost import get_hardware, scheme_program
>>> prog = scheme_program("ddp", Mesh(X=8), 8 * 4096, 8192, 32768)
>>> estimate_program(prog, get_hardware("h100"), batch=8 * 4096, d_model=8192, d_ff=32768).bound
'compute'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .efficiency import Efficiency, resolve_efficiency
from .hardware import Hardware
from .placement import AxisLink, place
from .program import Program
from .step_estimate import Estimate
from .timeline import build_timeline


def estimate_program(
    program: Program,
    hardware: Hardware,
    *,
    placement_links: Mapping[str, str | AxisLink] | None = None,
    overlap: bool = True,
    prefetch: int = 1,
    batch: int,
    d_model: int,
    d_ff: int,
    dtype: str = "bfloat16",
    topology: str | Sequence[int] | None = None,
    efficiency: str | Efficiency = "calibrated",
    inner: Sequence[str] | None = None,
) -> Estimate:
    """An :class:`Estimate` from a program already traced (used by sweeps and critical_batch).

    >>> from shardsim import Mesh
    >>> from shardsim.cost import get_hardware, scheme_program
    >>> prog = scheme_program("tp", Mesh(Y=8), 8 * 4096, 8192, 32768)
    >>> estimate_program(prog, get_hardware("h100"), batch=8 * 4096, d_model=8192, d_ff=32768).chips
    8
    """
    placement = place(hardware, program.mesh, placement_links, topology=topology, inner=inner)
    eff = resolve_efficiency(hardware, efficiency, placement.networks())
    layers = f"{program.layers} layer{'s' if program.layers > 1 else ''}"
    title = f"{program.scheme}, {layers} on {program.mesh}, {hardware.name}"
    tl = build_timeline(
        program.steps, hardware, placement, overlap=overlap, prefetch=prefetch, title=title, efficiency=eff,
        mesh=program.mesh,
    )  # fmt: skip
    return Estimate(
        scheme=program.scheme,
        hardware=hardware,
        mesh=program.mesh,
        batch=batch,
        d_model=d_model,
        d_ff=d_ff,
        layers=program.layers,
        dtype=dtype,
        timeline=tl,
        memory=program.memory,
        phases=tl.phase_totals(),
        efficiency=eff,
        program=program,
        placement=placement,
    )


__all__ = ["estimate_program"]
