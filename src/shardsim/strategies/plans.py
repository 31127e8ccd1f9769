"""Each registered MLP scheme is a :class:`~shardsim.plans.Plan` on the seeds' MLP, and back.

The scheme names are what people say; the plan is what they mean. ``ddp`` is ``dp``,
``fsdp`` and ``zero3`` are ``dp`` with ``zero=3``, ``zero1``/``zero2`` the other stages,
``tp`` is ``tp`` (``tp_ln`` on an ``MLP(norm=True)``), ``tp_sp`` is ``tp`` with ``sp``,
``fsdp_tp`` is ``dp`` with ``zero=3`` and ``tp``; the pipelines are ``pp`` (``pp_interleaved``:
``schedule=interleaved`` with ``virtual_stages``), ``dp_pp`` and ``dp_pp_tp``; the mixtures of
experts ``ep`` and ``dp_ep``. :func:`plan_of` reads the degrees off the mesh the scheme runs on,
:func:`scheme_of` names the scheme of a plan, or says which parallelism no MLP scheme has.
:func:`weights_of` gives a scheme's weights for an :class:`~shardsim.models.mlp.MLP`, read off
the scheme's own layouts, so an estimate or a shape-only trace never lists them a second time.

>>> from shardsim import Mesh
>>> plan = plan_of("fsdp_tp", Mesh(X=2, Y=4))
>>> plan
Plan.parse('dp=2,zero=3,tp=4,data_axis=X,model_axis=Y')
>>> scheme_of(plan), axes_of(plan, "fsdp_tp")
('fsdp_tp', {'data': 'X', 'model': 'Y'})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..array import ShapeDtype, require_mesh
from ..dtypes import resolve_dtype
from ..errors import ArgumentTypeError, ConfigError, PlanError
from ..layout import Layout
from ..mesh import Mesh
from ..models.mlp import MLP
from ..plans import DEGREE, ROLES, Plan
from .base import ROLE_DEFAULTS, Ctx, shape_of
from .registry import get
from .result import RunResult
from .runner import resolve_axes, run, stack_depth, weight_names

# What each scheme sets on a plan besides its degrees (one per role, read off the mesh).
SETTINGS: dict[str, dict[str, Any]] = {
    "ddp": {},
    "fsdp": {"zero": 3},
    "zero1": {"zero": 1},
    "zero2": {"zero": 2},
    "zero3": {"zero": 3},
    "tp": {},
    "tp_ln": {},
    "tp_sp": {"sp": True},
    "fsdp_tp": {"zero": 3},
    "pp": {},
    "pp_interleaved": {"schedule": "interleaved", "virtual_stages": 2},
    "dp_pp": {},
    "dp_pp_tp": {},
    "ep": {},
    "dp_ep": {},
}
ALIASES = {"zero3": "fsdp"}  # one plan, two names: scheme_of answers with the first
_AXES = list(dict.fromkeys(ROLE_DEFAULTS.values()))  # the axes the layouts of the default roles name
CHUNKS = 2  # pp_interleaved's model chunks per stage unless told (its init's default)


def plan_of(name: str, mesh: Mesh, axes: Mapping[str, str] | None = None, **options: Any) -> Plan:
    """The plan scheme ``name`` runs on ``mesh``: one degree per role, read off its axis.

    ``axes`` maps the scheme's roles to mesh axes as :func:`~shardsim.run_strategy` does;
    ``options`` are the scheme's own (a pipeline's ``schedule``, ``microbatches``, ``chunks``).

    >>> plan_of("zero1", Mesh(X=8))
    Plan.parse('dp=8,zero=1,data_axis=X')
    >>> plan_of("pp", Mesh(Z=4), microbatches=8)
    Plan.parse('pp=4,microbatches=8,pipe_axis=Z')
    """
    scheme = get(name)
    if name not in SETTINGS:
        raise PlanError(f"{name} is a scheme of its own, not a plan on the MLP; the plans are of {list(SETTINGS)}")
    chosen = resolve_axes(scheme, mesh, axes)
    fields: dict[str, Any] = dict(SETTINGS[name])
    for role, axis in chosen.items():
        fields[DEGREE[role]] = mesh.axis_size(axis)
        fields[f"{role}_axis"] = axis
    if "schedule" in options and name != "pp_interleaved":
        fields["schedule"] = options["schedule"]
    if "microbatches" in options:
        fields["microbatches"] = options["microbatches"]
    if name == "pp_interleaved":
        fields["virtual_stages"] = int(options.get("chunks", CHUNKS))
    return Plan(**fields)


def scheme_of(plan: Plan, model: MLP | None = None) -> str:
    """The registered MLP scheme that runs ``plan`` (on ``model``'s kind of block), or a
    :class:`~shardsim.PlanError` naming the parallelism no MLP scheme has and what to use.

    >>> from shardsim.plans import Plan
    >>> scheme_of(Plan(dp=4, zero=2)), scheme_of(Plan(tp=2), MLP(4, 8, norm=True))
    ('zero2', 'tp_ln')
    >>> try:
    ...     scheme_of(Plan(dp=2, tp=2))
    ... except PlanError as e:
    ...     print(str(e)[:60])
    no MLP scheme runs dp=2,tp=2: data x tensor parallelism with
    """
    dp, tp, pp, ep = plan.dp > 1, plan.tp > 1, plan.pp > 1, plan.ep > 1
    zero = plan.zero if dp else 0  # ZeRO over one chip splits nothing

    def missing(why: str, use: str) -> PlanError:
        return PlanError(f"no MLP scheme runs {plan}: {why}; {use}")

    if plan.cp > 1:
        raise missing("context parallelism splits attention's sequence, which the MLP has not", "run_model runs cp")
    if model is not None and (model.experts > 0) != ep:
        if ep:
            raise missing("ep splits experts, and this MLP has none", "use MLP(..., experts=E)")
        raise missing(f"this MLP has {model.experts} experts and ep=1", "set ep > 1 (schemes ep, dp_ep)")
    if ep:
        if tp or pp or zero or plan.sp:
            raise missing("the expert schemes (ep, dp_ep) split experts and tokens only", "set tp=1, pp=1, zero=0")
        return "dp_ep" if dp else "ep"
    if pp:
        if zero or plan.sp:
            raise missing("the pipeline schemes keep whole weights per stage (no ZeRO, no sp)", "run_model runs them")
        if plan.schedule == "interleaved":
            if dp or tp:
                raise missing("pp_interleaved runs over the pipe axis alone", "set dp=1, tp=1, or run_model")
            return "pp_interleaved"
        if tp and not dp:
            raise missing("dp_pp_tp needs a data axis too", "set dp > 1, or run_model")
        return "dp_pp_tp" if tp else "dp_pp" if dp else "pp"
    if tp:
        if plan.sp:
            if dp:
                raise missing("tp_sp runs over the model axis alone", "set dp=1, or run_model (dp with tp,sp)")
            return "tp_sp"
        if dp:
            if zero != 3:
                raise missing(
                    f"data x tensor parallelism with zero={zero}: the MLP's 2-D scheme is fsdp_tp (zero=3)",
                    "set zero=3, or run_model (Megatron's dp x tp with any ZeRO stage)",
                )
            return "fsdp_tp"
        return "tp_ln" if model is not None and model.norm else "tp"
    if plan.sp:
        raise missing("sp splits the tensor-parallel group's tokens", "set tp > 1")
    return {0: "ddp", 1: "zero1", 2: "zero2", 3: "fsdp"}[zero]


def axes_of(plan: Plan, name: str) -> dict[str, str]:
    """Scheme ``name``'s roles mapped to ``plan``'s mesh axes (what ``axes=`` takes).

    >>> from shardsim.plans import Plan
    >>> axes_of(Plan(dp=2, pp=2), "dp_pp")
    {'data': 'data', 'pipe': 'pipe'}
    """
    return {role: plan.axes()[role] for role in get(name).roles}


def options_of(plan: Plan, name: str) -> dict[str, Any]:
    """The scheme options ``plan`` sets: a pipeline's schedule and microbatches (the plan's default
    of 1 leaves the scheme's own choice, a batch divisor near twice the stages).

    >>> from shardsim.plans import Plan
    >>> options_of(Plan(pp=2, microbatches=4, schedule="gpipe"), "pp"), options_of(Plan(pp=2), "pp")
    ({'schedule': 'gpipe', 'microbatches': 4}, {'schedule': '1f1b'})
    """
    if "microbatches" not in get(name).options:
        return {}
    out: dict[str, Any] = {"schedule": plan.schedule}
    if plan.microbatches != 1:
        out["microbatches"] = plan.microbatches
    return out


def mlp_for(
    name: str, mesh: Mesh, d_model: int, d_ff: int, layers: int = 1, axes: Mapping[str, str] | None = None
) -> MLP:
    """The MLP scheme ``name`` runs at these sizes: Megatron's LayerNorm block for ``tp_ln``/``tp_sp``,
    and for the expert schemes one expert per chip of the expert axis (at least 4, as ``moe.init``).

    >>> mlp_for("ep", Mesh(Y=8), 1024, 4096).experts, mlp_for("dp_ep", Mesh(X=2, Y=2), 8, 16).experts
    (8, 4)
    """
    scheme = get(name)
    lay = scheme.layouts(Ctx(axes=dict(ROLE_DEFAULTS)))
    experts = 0
    if "router" in lay:
        n = mesh.axis_size(resolve_axes(scheme, mesh, axes)["expert"])
        experts = n * -(-4 // n)
    least = min_layers(name, mesh, axes)
    if layers % least:
        raise ConfigError(
            f"{name} on {mesh} runs its layers over {least} pipeline stages (x chunks); layers={layers} does not "
            f"divide by {least}: use layers={least * max(1, -(-layers // least))}"
        )
    return MLP(d_model, d_ff, layers, norm="gamma" in lay, experts=experts)


def min_layers(name: str, mesh: Mesh, axes: Mapping[str, str] | None = None) -> int:
    """The fewest layers scheme ``name`` runs on ``mesh``: one per stage and chunk of a pipeline, else 1.

    >>> min_layers("dp_pp", Mesh(X=2, Z=4)), min_layers("pp_interleaved", Mesh(Z=2)), min_layers("tp", Mesh(Y=4))
    (4, 4, 1)
    """
    scheme = get(name)
    if "pipe" not in scheme.roles:
        return 1
    stages = mesh.axis_size(resolve_axes(scheme, mesh, axes)["pipe"])
    return stages * (CHUNKS if name == "pp_interleaved" else 1)


def weights_of(name: str, model: MLP, dtype: Any = "float32") -> dict[str, ShapeDtype]:
    """Scheme ``name``'s weights for ``model``, shape-only, read off the scheme's layouts.

    Each dimension letter of a weight's layout takes ``model``'s size (D, F, E; a pipeline's
    L its layers, C its chunks); a scheme whose layouts have no L holds one block, and a
    ``model`` of several layers stacks them ``[L, ...]``.

    >>> w = weights_of("ep", MLP(8, 16, layers=2, experts=4))
    >>> {k: v.shape for k, v in w.items()}
    {'router': (2, 8, 4), 'w_in': (2, 4, 8, 16), 'w_out': (2, 4, 16, 8)}
    >>> weights_of("pp_interleaved", MLP(8, 16, layers=4))["w_in"].shape
    (2, 2, 8, 16)
    """
    scheme = get(name)
    lay = scheme.layouts(Ctx(axes=dict(ROLE_DEFAULTS)))
    sizes = dict(model.sizes)
    if (model.experts > 0) != ("router" in lay):
        kind = "experts (MLP(..., experts=E))" if "router" in lay else "a dense MLP (experts=0)"
        raise ConfigError(f"{name} runs {kind}; {model} does not fit it")
    if model.norm and "gamma" not in lay:
        raise ConfigError(f"{name} has no LayerNorm; {model} has norm=True: use tp_ln or tp_sp")
    chunks = CHUNKS if name == "pp_interleaved" else 1
    if model.layers % chunks:
        raise ConfigError(f"{name} splits the {model.layers} layers into {chunks} chunks; use layers divisible by it")
    sizes.update(L=model.layers // chunks, C=chunks)
    dt = resolve_dtype(dtype)
    out = {}
    for key, text in lay.items():
        if key in ("x", "out"):
            continue
        dims = [d.name for d in Layout.parse(text, _AXES).dims]
        shape = tuple(sizes[d] for d in dims)
        if "L" not in dims and model.layers > 1:
            shape = (model.layers, *shape)
        out[key] = ShapeDtype(shape, dt)
    return out


def init_of(name: str, model: MLP, seed: int = 0, dtype: Any = "float32") -> dict[str, np.ndarray]:
    """Scheme ``name``'s weights for ``model`` as global arrays, drawn by the scheme's own ``init``
    block by block (its reference takes the same keys).

    >>> {k: v.shape for k, v in init_of("tp_ln", MLP(4, 8, layers=3, norm=True)).items()}
    {'gamma': (3, 4), 'beta': (3, 4), 'w_in': (3, 4, 8), 'w_out': (3, 8, 4)}
    """
    scheme = get(name)
    shapes = weights_of(name, model, dtype)
    extra: dict[str, Any] = {}
    if "router" in shapes:
        extra["experts"] = model.experts
    if "microbatches" in scheme.options:  # a pipeline holds the whole stack itself
        extra["layers"] = model.layers
        if name == "pp_interleaved":
            extra["chunks"] = CHUNKS
        return {
            k: np.asarray(v) for k, v in scheme.init(model.d_model, model.d_ff, seed=seed, dtype=dtype, **extra).items()
        }
    blocks = [scheme.init(model.d_model, model.d_ff, seed=seed + i, dtype=dtype, **extra) for i in range(model.layers)]
    if model.layers == 1:
        return {k: np.asarray(v) for k, v in blocks[0].items()}
    return {k: np.stack([b[k] for b in blocks]) for k in shapes}


def reference_of(
    name: str,
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    dout: np.ndarray,
    activation: str = "identity",
    residual: bool = False,
    **options: Any,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The single-device answer for scheme ``name``'s params, one block or a stack of them:
    ``(out, grads)`` with ``grads`` keyed as ``params`` plus ``"x"``. A stack runs the scheme's
    own one-block reference block after block (with ``residual``, each adds its input), as
    :func:`~shardsim.run_strategy` runs its steps.

    >>> p = init_of("tp_ln", MLP(4, 8, layers=2, norm=True), dtype="float64")
    >>> out, g = reference_of("tp_ln", p, np.ones((2, 4)), np.ones((2, 4)))
    >>> out.shape, g["gamma"].shape
    ((2, 4), (2, 4))
    """
    scheme = get(name)
    lay = scheme.layouts(Ctx(axes=dict(ROLE_DEFAULTS)))
    keys = [k for k in lay if k not in ("x", "out")]
    depth = stack_depth(params, {k: Layout.parse(lay[k], _AXES).rank for k in keys})
    if depth is None:
        return scheme.reference(params, x, dout, activation, **options)
    blocks = [{k: np.asarray(v)[i] for k, v in params.items()} for i in range(depth)]
    inputs = []
    for block in blocks:
        inputs.append(x)
        y, _ = scheme.reference(block, x, np.zeros_like(x), activation, **options)
        x = x + y if residual else y
    grads: list[dict[str, np.ndarray]] = []
    for i in reversed(range(depth)):
        _, g = scheme.reference(blocks[i], inputs[i], dout, activation, **options)
        grads.append(g)
        dout = dout + g["x"] if residual else g["x"]
    grads.reverse()
    return x, {"x": dout, **{k: np.stack([g[k] for g in grads]) for k in params}}


def mlp_of(name: str, params: Mapping[str, Any], activation: str = "identity") -> MLP:
    """The :class:`~shardsim.models.mlp.MLP` whose weights under scheme ``name`` are ``params``: its
    sizes read off the scheme's layouts (D, F, E; a pipeline's L and C), its layers off a stack.

    >>> mlp_of("tp_ln", init_of("tp_ln", MLP(4, 8, layers=3, norm=True)))
    MLP(d_model=4, d_ff=8, layers=3, activation='identity', norm=True, experts=0, top_k=2)
    >>> mlp_of("pp_interleaved", init_of("pp_interleaved", MLP(4, 8, layers=4))).layers
    4
    """
    scheme = get(name)
    lay = scheme.layouts(Ctx(axes=dict(ROLE_DEFAULTS)))
    keys = weight_names(scheme, lay, params)
    parsed = {k: Layout.parse(lay[k], _AXES) for k in keys}
    depth = stack_depth(params, {k: v.rank for k, v in parsed.items()})
    sizes: dict[str, int] = {}
    for k, layout in parsed.items():
        sizes.update(zip((d.name for d in layout.dims), shape_of(params[k])[0 if depth is None else 1 :]))
    layers = sizes.get("L", 1) * sizes.get("C", 1) * (depth or 1)
    experts = sizes["E"] if "router" in lay else 0
    return MLP(sizes["D"], sizes["F"], layers, activation, "gamma" in lay, experts, min(2, experts) if experts else 2)


def run_mlp(
    model: MLP,
    plan: Plan | str,
    mesh: Mesh,
    params: Mapping[str, Any],
    x: Any,
    dout: Any,
    *,
    activation: str | None = None,
    residual: bool = False,
    recompute: bool = False,
    options: Mapping[str, Any] | None = None,
    scheme: str | None = None,
) -> RunResult:
    """One forward and backward of ``model`` under ``plan``: :func:`~shardsim.transformer.run_model` of an MLP.

    The step is the MLP scheme's that runs ``plan`` (``scheme``: a name of your choosing among
    those that run it, e.g. ``zero3`` for ``fsdp``'s plan, or a scheme whose degrees of 1 the
    plan cannot tell apart, e.g. ``tp`` on one chip), its roles on the plan's mesh axes;
    ``params`` are its weights for ``model`` (:func:`init_of`), ``x`` and the output's gradient
    ``dout`` are ``[B, D]``. ``activation`` defaults to the model's; with ``residual`` each
    block adds its input; with ``recompute`` each block keeps only its input and runs its
    forward again in the backward pass. ``options`` are the scheme's own (default: the plan's
    schedule and microbatches, :func:`options_of`; given, they are the options as they are).

    >>> from shardsim.plans import Plan
    >>> m, plan = MLP(4, 8, layers=2), Plan(dp=2, zero=2)
    >>> x = np.ones((2, 4))
    >>> r = run_mlp(m, plan, plan.mesh(), init_of("zero2", m), x, x)
    >>> r.scheme, r.loss, r.grads["w_in"].shape
    ('zero2', None, (2, 4, 8))
    """
    if isinstance(plan, str):
        plan = Plan.parse(plan)
    if not isinstance(plan, Plan):
        raise ArgumentTypeError(
            "run_model: plan must be a shardsim.plans.Plan or a plan string such as 'dp=2,tp=2', "
            f"got {type(plan).__name__}"
        )
    require_mesh(mesh, "mesh", "run_model")
    name = scheme_of(plan, model) if scheme is None else scheme
    strategy = get(name)
    if name not in SETTINGS:
        raise PlanError(f"{name} is a scheme of its own, not a plan on the MLP; the plans are of {list(SETTINGS)}")
    for role in ROLES:
        if role not in strategy.roles and plan.degree(role) > 1:
            raise PlanError(
                f"{name} has no {role} role, and plan {plan} sets {DEGREE[role]}={plan.degree(role)}: "
                "leave scheme= unset for the scheme that runs the plan (scheme_of(plan, model))"
            )
    axes = axes_of(plan, name)
    for role, axis in axes.items():
        if axis not in mesh.axis_names or mesh.axis_size(axis) != plan.degree(role):
            has = f"has {mesh.axis_size(axis)} chips on it" if axis in mesh.axis_names else "has no such axis"
            raise PlanError(
                f"plan {plan} sets {DEGREE[role]}={plan.degree(role)} on mesh axis {axis!r}, and {mesh} {has}; "
                f"use plan.mesh() = {plan.mesh()}"
            )
    held = mlp_of(name, params, model.activation)
    if held.scaled(top_k=model.top_k) != model:
        raise ConfigError(f"{name}'s params {_shapes(params)} are the weights of {held}, not of {model}")
    chosen = options_of(plan, name) if options is None else dict(options)
    act = model.activation if activation is None else activation
    return run(
        strategy, mesh, params, x, dout, act, axes, residual, recompute=recompute, plan=plan, model=model, **chosen
    )


def _shapes(params: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(shape_of(v)) for k, v in params.items()}
