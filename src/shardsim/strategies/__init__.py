"""The sharding schemes, one module each, reading like the seed's numbered steps.

>>> from shardsim import strategies
>>> strategies.names()[:7]
['ddp', 'fsdp', 'tp', 'fsdp_tp', 'zero1', 'zero2', 'zero3']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, PlanError
from ..mesh import Mesh
from .base import Ctx, Scheme, shape_of
from .registry import get, names, register
from .result import RunResult, StepMemory
from .runner import StrategyResult, prepare, run, run_prepared


def run_strategy(
    name: str,
    mesh: Mesh,
    params: Mapping[str, Any],
    x: Any,
    dout: Any,
    activation: str = "identity",
    axes: Mapping[str, str] | None = None,
    residual: bool = False,
    **options: Any,
) -> RunResult:
    """Run scheme ``name`` forward and backward on ``mesh`` and report what it did.

    ``params`` is ``{"w_in": [D, F], "w_out": [F, D]}`` and ``x``, ``dout`` are ``[B, D]``, all
    global arrays, or :class:`~shardsim.ShapeDtype` for a shape-only run at real sizes.
    ``axes`` maps the scheme's roles to mesh axes, e.g. ``{"data": "X", "model": "Y"}``
    (default: the mesh's axes in order, or the axes named X and Y). ``options`` go to the
    scheme (e.g. a pipeline's ``microbatches``).

    Stacked params ``{"w_in": [L, D, F], "w_out": [L, F, D]}`` run a deep stack of ``L``
    blocks, the scheme's per-layer steps layer after layer; with ``residual`` each block
    adds its input. ``grads`` then has ``[L, ...]`` weight gradients.

    The step is the one step skeleton's (:func:`~shardsim.strategies.runner.run_prepared`), which
    :func:`~shardsim.transformer.run_model` of an MLP runs too; a scheme that is a plan on the
    MLP names its plan (:func:`plan_of` on ``mesh``) and the :class:`~shardsim.models.mlp.MLP`
    the params are the weights of in the result, the same type a transformer's step gives.

    >>> import numpy as np, shardsim
    >>> p = shardsim.models.reference_mlp.init(8, 16)
    >>> r = run_strategy("ddp", shardsim.Mesh(X=2), p, np.ones((4, 8)), np.ones((4, 8)))
    >>> r.trace.collectives("backward")
    [('all_reduce', ('X',)), ('all_reduce', ('X',))]
    >>> r.plan, r.model.layers
    (Plan.parse('dp=2,data_axis=X'), 1)
    """
    scheme = get(name)
    ready = prepare(scheme, mesh, params, x, dout, activation, axes, residual, **options)  # its checks come first
    plan, model = _plan_and_model(name, mesh, ready.ctx.axes, params, activation, options) or (None, None)
    return run_prepared(ready, mesh, x, dout, residual=residual, plan=plan, model=model)


def _plan_and_model(
    name: str, mesh: Mesh, axes: Mapping[str, str], params: Mapping[str, Any], activation: str, options: Any
) -> tuple[Any, Any] | None:
    """Scheme ``name``'s plan on ``mesh`` and the MLP ``params`` are the weights of, or None for a
    scheme of its own, or options no plan says as they are given (a schedule or microbatch
    count only the scheme judges, a number of chunks its weights do not have): those run on
    the scheme directly, which answers in its own words."""
    if name not in SETTINGS:
        return None
    try:
        plan = plan_of(name, mesh, axes, **options)
        model = mlp_of(name, params, activation)
    except (PlanError, ConfigError, ValueError):
        return None
    if name == "pp_interleaved" and shape_of(params["w_in"])[-4] != plan.virtual_stages:
        return None
    return plan, model


from .plans import (  # noqa: E402  (plans and the runner's spelling, in the order they read)
    SETTINGS,
    axes_of,
    init_of,
    min_layers,
    mlp_for,
    mlp_of,
    options_of,
    plan_of,
    reference_of,
    run_mlp,
    scheme_of,
    weights_of,
)

__all__ = [
    "Ctx",
    "RunResult",
    "Scheme",
    "StepMemory",
    "StrategyResult",
    "axes_of",
    "get",
    "init_of",
    "min_layers",
    "mlp_for",
    "mlp_of",
    "names",
    "options_of",
    "plan_of",
    "reference_of",
    "register",
    "run",
    "run_mlp",
    "run_strategy",
    "scheme_of",
    "weights_of",
]
