"""A scheme's estimate, spelled by its name: the model estimate of the scheme's MLP under its plan.

``estimate("fsdp", mesh, hardware, batch, d_model, d_ff, layers)`` is the
:class:`~shardsim.models.MLP` the scheme runs at these sizes
(:func:`~shardsim.cost.program.scheme_model`), under the plan the scheme is on that mesh
(:func:`~shardsim.strategies.plans.plan_of`), estimated by the one estimate
(:func:`~shardsim.cost.model_estimate.estimate_model`). ``pad=True`` pads ``d_model`` and
``d_ff`` that do not divide the mesh up to a multiple of its chips, as FSDP pads its flat
parameters, and the estimate says so.

>>> from shardsim import Mesh
>>> estimate_scheme("fsdp", Mesh(X=8), "h100", 8 * 4096, 8192, 32768).plan
Plan.parse('dp=8,zero=3,data_axis=X')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ..errors import DivisibilityError
from ..mesh import Mesh
from ..plans import DEGREE, Plan
from ..strategies.plans import SETTINGS, plan_of
from .efficiency import Efficiency
from .hardware import Hardware
from .memory_source import memory_source
from .model_estimate import estimate_model, scheme_order
from .placement import AxisLink, place
from .presets import get_hardware
from .program import scheme_model
from .step_estimate import Estimate


def estimate_scheme(
    scheme: str,
    mesh: Mesh | Mapping[str, int],
    hardware: Hardware | str,
    batch: int,
    d_model: int,
    d_ff: int,
    layers: int = 1,
    overlap: bool = True,
    dtype: str = "bfloat16",
    *,
    links: Mapping[str, str | AxisLink] | None = None,
    axes: Mapping[str, str] | None = None,
    activation: str = "identity",
    prefetch: int = 1,
    topology: str | Sequence[int] | None = None,
    efficiency: str | Efficiency = "calibrated",
    pad: bool = False,
    optimizer: str = "adam",
    precision: str | None = None,
) -> Estimate:
    """Estimate one training step of ``scheme`` on ``mesh`` with a global batch of ``batch``
    tokens (module doc; the options are :func:`~shardsim.cost.estimate`'s).

    >>> from shardsim import Mesh
    >>> estimate_scheme("ddp", Mesh(X=8), "h100", 8 * 1024, 1024, 4096, pad=True).padding
    {}
    """
    hw = get_hardware(hardware)
    m = mesh if isinstance(mesh, Mesh) else Mesh(dict(mesh))
    inner = scheme_order(hw, scheme, m, axes) if links is None else None
    place(hw, m, links, topology=topology, inner=inner)  # fail early, before building, on a layout it cannot hold
    memory_source(optimizer, precision, dtype)
    opts = dict(
        links=links, topology=topology, efficiency=efficiency, optimizer=optimizer, precision=precision,
        overlap=overlap, prefetch=prefetch, dtype=dtype,
    )  # fmt: skip

    def at(dm: int, df: int) -> Estimate:
        model = scheme_model(scheme, m, dm, df, layers, axes).scaled(activation=activation)
        plan = plan_of(scheme, m, axes) if scheme in SETTINGS else degrees_plan(scheme, m, axes)
        return estimate_model(model, plan, hw, batch_tokens=batch, scheme=scheme, mesh=m, **opts)  # type: ignore[arg-type]

    try:
        return at(d_model, d_ff)
    except DivisibilityError as err:
        if not pad:
            raise DivisibilityError(f"{err} Or pass pad=True to pad d_model and d_ff as FSDP does.") from None
    sizes = {"d_model": d_model, "d_ff": d_ff}
    padded = {k: -(-v // m.size) * m.size for k, v in sizes.items()}
    est = at(padded["d_model"], padded["d_ff"])
    padding = {k: (sizes[k], padded[k]) for k in sizes if padded[k] != sizes[k]}
    return dataclasses.replace(est, d_model=d_model, d_ff=d_ff, padding=padding)


def degrees_plan(scheme: str, mesh: Mesh, axes: Mapping[str, str] | None = None) -> Plan:
    """The plan of a scheme registered on its own (no plan among the seeds'): one degree per
    role, read off the mesh axis it runs on, and nothing else.

    >>> degrees_plan("tp", Mesh(Y=4))
    Plan.parse('tp=4,model_axis=Y')
    """
    from ..strategies import get
    from ..strategies.runner import resolve_axes

    fields: dict[str, object] = {}
    for role, axis in resolve_axes(get(scheme), mesh, axes).items():
        fields[DEGREE[role]] = mesh.axis_size(axis)
        fields[f"{role}_axis"] = axis
    return Plan(**fields)  # type: ignore[arg-type]


__all__ = ["degrees_plan", "estimate_scheme"]
