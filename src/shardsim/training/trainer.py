"""One trainer for every model: sharded weights and optimizer state, trained step by step.

A :class:`Trainer` holds a model's weights, master weights and optimizer moments, each chip
its part, and runs training steps: forward, loss, backward, gradient synchronisation and the
optimizer update, with every collective in the trace and every chip's bytes in the ledger.
The model is an MLP (:class:`~shardsim.models.MLP`, run by the registered scheme its plan
names) or a transformer (:class:`~shardsim.models.TransformerConfig`, run by
:func:`~shardsim.transformer.run_model`); what differs between the two is the step program
(:class:`~shardsim.training.mlp_step.MLPStep`, :class:`~shardsim.training.model_step.ModelStep`),
not the trainer: the update (:func:`~shardsim.training.update.update_weight`), the roll-back of
a failed step and the checkpoint (:class:`~shardsim.training.checkpointed.Checkpointed`) are one.

A step either happens or it does not: when :meth:`Trainer.step` raises (a failed chip, out of
memory, bad input), the weights, master weights, optimizer moments, step count and loss scale
are exactly as before the call, and a retry once the fault is gone computes the same step.

>>> import numpy as np, shardsim
>>> from shardsim import mlp
>>> from shardsim.models import MLP
>>> params = mlp.init_stack(2, 8, 16)
>>> x = np.ones((4, 8), np.float32)
>>> trainer = Trainer("zero2", shardsim.Mesh(X=2), params, SGD(lr=0.1))
>>> r = trainer.step(x, np.zeros_like(x))
>>> r.trace.collectives("optimizer")
[('all_gather', ('X',)), ('all_gather', ('X',)), ('all_gather', ('X',)), ('all_gather', ('X',))]
>>> r.layouts["dw_in"], r.layouts["opt_w_in"]
('[D_X, F]', '[D_X, F]')
>>> same = Trainer(MLP(8, 16, layers=2), "dp=2,zero=2", shardsim.Mesh(data=2), params, SGD(lr=0.1))
>>> same.scheme.name, same.step(x, np.zeros_like(x)).loss == r.loss
('zero2', True)
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import strategies
from ..array import ShardedArray
from ..errors import ArgumentTypeError, ConfigError, PlanError, ShardingError
from ..mesh import Mesh
from ..models import MLP, TransformerConfig
from ..strategies import zero
from ..strategies.base import Ctx, Params, Scheme
from ..strategies.runner import (
    block_ranks,
    check_residual,
    layer_of,
    resolve_axes,
    stack_depth,
    weight_label,
    weight_names,
)
from . import optim
from .checkpointed import Checkpointed
from .held import TrainerState
from .mlp_step import MLPStep, microbatch_loss, reductions_in
from .model_step import ModelStep
from .optim import SGD, Adam, Optimizer
from .precision import Precision
from .result import MODEL_STATE, StepResult
from .scaling import DynamicLossScale, ScaleState
from .state import own_all, place, shape_of, zeros_like
from .update import Slots, Undo, roll_back, state_slice, update_weight

if TYPE_CHECKING:
    from ..plans import Plan  # the plan module reads the training package's precisions

__all__ = [
    "MODEL_STATE",
    "Checkpointed",
    "StepResult",
    "Trainer",
    "microbatch_loss",
    "state_slice",
    "train_step",
    "update_weight",
]

# the keywords of an MLP's step that a transformer takes from its config and plan instead
MLP_KEYWORDS = ("activation", "residual", "recompute", "axes", "engine")


class Trainer(Checkpointed, TrainerState):
    """A model's sharded weights and optimizer state, trained step by step: an MLP or a transformer.

    Spellings (each builds this one class):

    - ``Trainer(model, plan, mesh, params, optimizer=None, **keywords)``: ``model`` a
      :class:`~shardsim.models.MLP` or a :class:`~shardsim.models.TransformerConfig`,
      ``plan`` a :class:`~shardsim.plans.Plan` or a plan string (``"dp=2,zero=1"``). An MLP
      runs the scheme :func:`~shardsim.strategies.scheme_of` names, over the plan's axes
      (:func:`~shardsim.strategies.axes_of`) with its options
      (:func:`~shardsim.strategies.options_of`), the model's activation (and ``top_k`` with
      experts), and recomputes each block under ``recompute=full`` (``selective`` recomputes
      attention, which an MLP has not). A transformer steps :func:`~shardsim.transformer.run_model`.
    - ``Trainer(scheme, mesh, params, optimizer=None, **keywords)``: an MLP under the
      registered ``scheme`` (a name or a :class:`~shardsim.strategies.base.Scheme`).
    - :meth:`Trainer.for_model`, the transformer's older spelling.
      :class:`~shardsim.training.model_trainer.ModelTrainer` is another name of this class.

    An MLP's ``params`` are global arrays ``{"w_in": [D, F], "w_out": [F, D]}`` or stacks
    ``[L, D, F]`` / ``[L, F, D]``; a transformer's have the keys of
    :func:`shardsim.models.reference.init`; either may be :class:`~shardsim.ShapeDtype` for a
    shape-only run at real sizes. ``precision`` is a :class:`Precision` or a name (``fp32``,
    ``fp64``, ``bf16``, ``fp16``), by default the plan's, else the params' own dtype with no
    master copy; ``reduce_dtype`` overrides the dtype gradients are reduced in.
    ``optimizer`` is an optimizer or its name (``sgd``, ``momentum``, ``adam``, ``adamw``).

    The MLP's own keywords: ``loss_scale`` is a static scale (a number), ``"dynamic"`` or a
    :class:`~shardsim.training.scaling.DynamicLossScale`; ``activation``, ``residual``;
    ``recompute`` keeps only each block's input and runs its forward again in the backward
    pass; ``axes`` maps the scheme's roles to mesh axes; ``engine="jax"`` runs each step as one
    jitted ``shard_map`` program on JAX devices (:mod:`shardsim.training.jax_step`;
    ``pip install 'shardsim[jax]'``); other keywords are the scheme's options. The
    transformer's: ``dropout_seed`` (a non-negative integer) turns on the config's dropout with
    the reference's masks, fresh every step (step ``n`` draws them from
    :func:`~shardsim.training.step_dropout_seed`), so a restored trainer draws the masks the
    original would have. The transformer has no loss scaling, and so refuses float16.

    ``step_count`` counts the updates applied (Adam's ``t``); ``skipped_steps`` the steps
    skipped for inf/NaN gradients; ``scale`` is the running loss scale. ``params``,
    ``master`` and ``moments`` are an MLP's list of blocks (one dict per block) and a
    transformer's one dict by parameter key; ``program`` is the step program.

    >>> import numpy as np, shardsim
    >>> t = Trainer("ddp", shardsim.Mesh(X=2), shardsim.models.reference_mlp.init(4, 8), precision="bf16")
    >>> t.master_dtype, t.weights()["w_in"].dtype.name
    (dtype('float32'), 'bfloat16')
    >>> from shardsim.models import get
    >>> cfg = get("gpt-tiny")
    >>> shapes = {k: shardsim.ShapeDtype(s) for k, s in cfg.param_shapes().items()}
    >>> t = Trainer(cfg, "dp=2,zero=3", shardsim.Mesh(data=2), shapes, precision="bf16")
    >>> t.master_dtype.name, t.params["embed"].layout, type(t).__name__
    ('float32', Layout('[V, D_{data}]'), 'Trainer')
    """

    # the fields the step programs use are TrainerState's; these are the trainer's own
    program: MLPStep | ModelStep
    model: MLP | TransformerConfig | None  # None: the scheme spelling
    roles: Any  # a transformer's
    params: Any  # a list of blocks (an MLP's) or a dict by key (a transformer's), as TrainerState says
    master: Any
    moments: Any

    def __init__(
        self,
        model: str | Scheme | MLP | TransformerConfig,
        *args: Any,
        precision: str | Precision | None = None,
        reduce_dtype: Any = None,
        loss_scale: float | str | DynamicLossScale | None = None,
        activation: str | None = None,
        residual: bool = False,
        recompute: bool | None = None,
        axes: Mapping[str, str] | None = None,
        engine: str = "numpy",
        **options: Any,
    ) -> None:
        if isinstance(model, TransformerConfig):
            plan, mesh, params, optimizer = _positional("Trainer(cfg, ...)", args, ("plan", "mesh", "params"), options)
            given = {"activation": activation, "axes": axes, "recompute": recompute}
            given |= {"residual": residual or None, "engine": None}
            wrong = [k for k in MLP_KEYWORDS if given[k] is not None] + sorted(set(options) - {"dropout_seed"})
            if wrong:
                raise TypeError(
                    f"Trainer of a transformer takes precision, reduce_dtype, dropout_seed, engine (and loss_scale, "
                    f"which it refuses), not {wrong}: "
                    "its activation, recomputation and axes are its config's and plan's"
                )
            self._init_model(
                model, plan, mesh, params, optimizer, "Trainer", precision, reduce_dtype, loss_scale, **options
            )
            self._engine_step = _engine_step(engine, self)
            return
        mlp_model = None
        if isinstance(model, MLP):
            spelling = "Trainer(model, ...)"
            plan, mesh, params, optimizer = _positional(spelling, args, ("plan", "mesh", "params"), options)
            mlp_model, plan = model, _plan(plan)
            model = strategies.scheme_of(plan, mlp_model)
            if not isinstance(mesh, Mesh):
                raise ShardingError(f"Trainer needs a shardsim.Mesh, got {type(mesh).__name__}")
            plan.check(mesh)
            if axes is not None:
                raise PlanError(f"Trainer(model, plan, ...): the plan {plan} names the mesh axes; drop axes={axes!r}")
            if activation not in (None, mlp_model.activation):
                raise ConfigError(
                    f"Trainer: activation={activation!r}, but {mlp_model} computes {mlp_model.activation!r}; "
                    "set it on the model"
                )
            axes, activation = strategies.axes_of(plan, model), mlp_model.activation
            recompute = plan.recompute == "full" if recompute is None else recompute
            precision = plan.precision if precision is None else precision
            top_k = {"top_k": mlp_model.top_k} if mlp_model.experts else {}
            options = {**strategies.options_of(plan, model), **top_k, **options}
        else:
            plan = None
            mesh, params, optimizer = _positional("Trainer(scheme, ...)", args, ("mesh", "params"), options)
        self.model, self.plan = mlp_model, plan
        self._init_scheme(
            model, mesh, params, optimizer, precision=precision, reduce_dtype=reduce_dtype, loss_scale=loss_scale,
            activation="identity" if activation is None else activation, residual=residual,
            recompute=bool(recompute), axes=axes, engine=engine, **options,
        )  # fmt: skip

    def _init_scheme(
        self,
        scheme: str | Scheme,
        mesh: Mesh,
        params: Mapping[str, Any],
        optimizer: Optimizer | str | None,
        *,
        precision: str | Precision | None,
        reduce_dtype: Any,
        loss_scale: float | str | DynamicLossScale | None,
        activation: str,
        residual: bool,
        recompute: bool,
        axes: Mapping[str, str] | None,
        engine: str,
        **options: Any,
    ) -> None:
        """An MLP's state under ``scheme``: each block's weights in the scheme's layouts, its
        master weights and moments in the state's (:func:`~shardsim.strategies.zero.state_layouts`)."""
        self.scheme = strategies.get(scheme) if isinstance(scheme, str) else scheme
        if not isinstance(mesh, Mesh):
            raise ShardingError(f"Trainer needs a shardsim.Mesh, got {type(mesh).__name__}")
        self.mesh = mesh
        self.optimizer = as_optimizer(optimizer)
        if not isinstance(params, Mapping) or not params:
            raise ShardingError(
                f"Trainer needs params: a dict of weight names to global arrays such as "
                f"{{'w_in': [D, F], 'w_out': [F, D]}}, got {params!r:.80}"
            )
        if precision is None:  # compute in the params' own dtype, no separate master
            precision = Precision(shape_of(next(iter(params.values()))).dtype)
        self.precision = Precision.of(precision, reduce=reduce_dtype, loss_scale=loss_scale)
        self.residual, self.recompute = residual, recompute
        self.axes = resolve_axes(self.scheme, mesh, axes)
        check_residual(self.scheme, residual)
        self.ctx = Ctx(axes=self.axes, activation=activation, options=options).check()
        self.layouts = self.scheme.layouts(self.ctx)
        self.names = weight_names(self.scheme, self.layouts, params)
        self.state_layouts = zero.state_layouts(self.scheme, self.ctx)
        reductions_in(self.precision, self.ctx, self.scheme)  # a reduce_dtype the scheme cannot use fails here
        self.depth = stack_depth(params, block_ranks(self.layouts, mesh, self.names))
        blocks = [params] if self.depth is None else [layer_of(params, i) for i in range(self.depth)]
        self.step_count = 0
        self.skipped_steps = 0
        self.scale = ScaleState(self.precision.initial_scale)
        self.params, self.master, self.moments = [], [], []
        prec = self.precision
        for i, block in enumerate(blocks):
            weights, masters, moments = {}, {}, {}
            for k in self.names:
                label = weight_label(k, i, self.depth)
                weights[k] = place(block[k], mesh, self.layouts[k], prec.compute, label, "params")
                if prec.mixed:
                    masters[k] = place(block[k], mesh, self.state_layouts[k], prec.state_dtype, label, "optimizer")
                zeros = zeros_like(block[k])
                moments[k] = {
                    slot: place(zeros, mesh, self.state_layouts[k], prec.moment_dtype, label, "optimizer")
                    for slot in self.optimizer.slots
                }
                del zeros
            self.params.append(weights)
            self.master.append(masters)
            self.moments.append(moments)
        self.block_shapes = [{k: shape_of(v) for k, v in b.items()} for b in blocks]  # shapes only from here on
        del blocks
        self.program = MLPStep()
        self._engine_step = _engine_step(engine, self)

    def _init_model(
        self,
        cfg: Any,
        plan: Any,
        mesh: Any,
        params: Mapping[str, Any],
        optimizer: Optimizer | str | None,
        who: str,
        precision: str | Precision | None = None,
        reduce_dtype: Any = None,
        loss_scale: float | str | DynamicLossScale | None = None,
        dropout_seed: int | None = None,
    ) -> None:
        """A transformer's state under ``plan``: the weights in the plan's storage layouts, held by
        their pipeline stage only under ``pp > 1``; master weights and moments split over the data
        axis under ZeRO-1/2/3 (each weight's ``D`` dimension, its only one for a vector)."""
        from ..models.inputs import check_params
        from ..transformer import checks
        from ..transformer.roles import Roles
        from ..transformer.run import place_weights

        plan = checks.check_arguments(cfg, plan, mesh, who=who)
        checks.check_plan(plan, mesh)
        check_params(cfg, params)
        checks.check_model(cfg, plan.replace(sp=False, cp=1), cfg.seq)  # the widths; each step checks its sequence
        if plan.pp > 1:
            checks.check_pipeline(cfg, plan, plan.dp * plan.ep * plan.microbatches)
        self.model, self.cfg, self.plan, self.mesh = cfg, cfg, plan, mesh
        self.optimizer = as_optimizer(optimizer)
        if precision is None:
            precision = plan.precision or Precision(np.dtype(next(iter(params.values())).dtype))
        self.precision = Precision.of(precision, reduce=reduce_dtype, loss_scale=loss_scale)
        if self.precision.checks_overflow:
            raise PlanError(
                f"precision {self.precision}: the transformer's step has no loss scaling yet, which float16 "
                "needs; use precision='bf16' (no loss scale) or the MLP Trainer"
            )
        self.dropout_seed = checks.check_dropout_seed(dropout_seed)
        self.roles = roles = Roles.of(plan, cfg.n_kv)
        self.data_axis = roles.data
        split = plan.zero >= 1 and roles.data is not None  # ZeRO-1/2/3: the state split over data
        self.state_layouts = {k: "[" + ", ".join(roles.weight_dims(k, sharded=split)) + "]" for k in cfg.param_shapes()}
        self.gathers = split and plan.zero < 3  # ZeRO-1/2: the updated slices are AllGathered
        prec = self.precision
        self.params = own_all(place_weights(cfg, plan, mesh, params, prec.compute))
        self.names, self.depth = list(self.params), None

        def state(values: Mapping[str, Any], dtype: np.dtype) -> dict[str, ShardedArray]:
            layout = self.state_layouts.__getitem__
            return own_all(place_weights(cfg, plan, mesh, values, dtype, layout=layout, category="optimizer"))

        self.master = state(params, prec.state_dtype) if prec.mixed else {}
        zeros = {k: zeros_like(v) for k, v in params.items()}
        self.moments = {k: {} for k in params}
        for slot in self.optimizer.slots:
            for k, v in state(zeros, prec.moment_dtype).items():
                self.moments[k][slot] = v.named(f"{slot}.{k}")
        del zeros
        self.step_count = 0
        self.skipped_steps = 0
        self.scale = ScaleState(1.0)  # no loss scaling: the checkpoint's counters are the MLP trainer's
        self.program = ModelStep()
        self._engine_step = None

    @classmethod
    def for_model(
        cls,
        cfg: Any,
        plan: Any,
        mesh: Mesh,
        params: Mapping[str, Any],
        optimizer: Optimizer | str | None = None,
        **options: Any,
    ) -> Trainer:
        """A trainer of transformer ``cfg`` (a :class:`~shardsim.models.TransformerConfig`) under
        ``plan`` (a :class:`~shardsim.plans.Plan`) on ``mesh``: ``Trainer(cfg, plan, mesh, params,
        optimizer, **options)``, whose steps run :func:`~shardsim.transformer.run_model` and then
        the optimizer update. ``options``: ``precision``, ``reduce_dtype``, ``dropout_seed``, ``engine``.

        >>> import numpy as np
        >>> from shardsim.models import get, reference
        >>> from shardsim.plans import Plan
        >>> cfg, plan = get("gpt-tiny"), Plan(dp=2, zero=2)
        >>> t = Trainer.for_model(cfg, plan, plan.mesh(), reference.init(cfg), "adam")
        >>> tok = np.arange(16).reshape(2, 8)
        >>> t.step(tok, tok + 1).step, t.moments["embed"]["m"].layout, type(t) is Trainer
        (1, Layout('[V, D_{data}]'), True)
        """
        trainer = cls.__new__(cls)
        engine = options.pop("engine", "numpy")
        trainer._init_model(cfg, plan, mesh, params, optimizer, "Trainer.for_model", **options)
        trainer._engine_step = _engine_step(engine, trainer)
        return trainer

    # -- the step ---------------------------------------------------------------------------
    def step(self, x: Any, target: Any) -> StepResult:
        """One training step: an MLP's on inputs ``x`` and regression targets ``target`` (both
        ``[B, D]``), a transformer's on ``[B, S]`` token ids and next-token targets.

        All or nothing: if the step raises, the trainer's weights, master weights, moments,
        step count and loss scale are exactly as before the call (the values the step made are
        released, even while the caller holds the traceback), so once the fault is healed the
        same call computes the same step, bit for bit. ``loss`` is the mean squared error (MLP)
        or the mean cross-entropy (transformer) before the update.

        >>> import numpy as np, shardsim
        >>> mesh = shardsim.Mesh(X=2)
        >>> t = Trainer("zero1", mesh, shardsim.models.reference_mlp.init(4, 8), SGD(lr=0.1))
        >>> x = np.ones((2, 4), np.float32)
        >>> mesh.fail(X=1)
        >>> try:
        ...     t.step(x, 0 * x)
        ... except shardsim.ChipFailureError:
        ...     print("failed at step", t.step_count + 1)
        failed at step 1
        >>> mesh.heal()
        >>> t.step(x, 0 * x).step
        1
        """
        self.program.check(self, x, target)
        if self._engine_step is not None:  # the whole step as one program on another engine
            return self._engine_step(x, target)  # type: ignore[no-any-return]
        undo: list[Undo] = []
        # float16 overflows are expected here and handled: the step checks its gradients and skips
        quiet = np.errstate(over="ignore", invalid="ignore") if self.precision.checks_overflow else None
        try:
            with quiet or contextlib.nullcontext():
                return self.program(self, x, target, undo)
        except BaseException as e:
            # Release what the aborted step made (the traceback's frames hold it), then undo.
            if e.__traceback__ is not None and e.__traceback__.tb_next is not None:
                traceback.clear_frames(e.__traceback__.tb_next)
            roll_back(self.mesh, undo)
            raise

    @property
    def engine_step(self) -> Any:
        """The step program of the trainer's engine: None on NumPy, the jitted step's builder on JAX
        (its ``compiled(tokens, targets)`` gives the jitted function and the state as its arguments).

        >>> import shardsim
        >>> Trainer("ddp", shardsim.Mesh(X=2), shardsim.models.reference_mlp.init(4, 8)).engine_step is None
        True
        """
        return self._engine_step

    # -- reading the state -----------------------------------------------------------------
    @property
    def master_dtype(self) -> np.dtype:
        """The dtype the optimizer updates (float32 master weights in mixed precision)."""
        return self.precision.state_dtype

    def params_global(self) -> dict[str, np.ndarray]:
        """The optimizer's weights as global arrays (the float32 masters in mixed precision)."""
        params, master, _ = self._layers()
        return self._gather(master if self.precision.mixed else params)

    def weights(self) -> dict[str, np.ndarray]:
        """The weights the chips compute with, as global arrays (16-bit in mixed precision)."""
        return self._gather(self._layers()[0])

    def moments_global(self) -> dict[str, dict[str, np.ndarray]]:
        """The optimizer's moments as global arrays: ``{"m": {"w_in": ...}, ...}``."""
        moments = self._layers()[2]
        return {s: self._gather([{k: m[k][s] for k in self.names} for m in moments]) for s in self.optimizer.slots}

    def _layers(self) -> tuple[list[Params], list[Params], list[dict[str, dict[str, ShardedArray]]]]:
        """The weights, masters and moments block by block: an MLP's blocks, a transformer's one."""
        if isinstance(self.params, list):
            return self.params, self.master, self.moments
        return [self.params], [self.master], [self.moments]

    def _gather(self, layers: list[Params]) -> dict[str, np.ndarray]:
        glob = {k: [np.array(layer[k].to_global()) for layer in layers] for k in self.names}
        return {k: v[0] if self.depth is None else np.stack(v) for k, v in glob.items()}

    @property
    def _name(self) -> str:
        return self.scheme.name if isinstance(self.program, MLPStep) else f"transformer ({self.plan})"

    def state_slots(self) -> Slots:
        """Where each value of :meth:`state` lives: its path, the dict holding it, and its key there.

        >>> import shardsim
        >>> t = Trainer("ddp", shardsim.Mesh(X=2), shardsim.models.reference_mlp.init(4, 8), "sgd")
        >>> [path for path, _, _ in t.state_slots()]
        [('params', 'w_in'), ('params', 'w_out')]
        """
        slots: list[tuple[tuple[str, ...], dict[str, Any], str]] = []
        for i, (params, master, moments) in enumerate(zip(*self._layers())):
            block = () if self.depth is None else (str(i),)
            for k in self.names:
                slots.append((("params", *block, k), params, k))
                if self.precision.mixed:
                    slots.append((("master", *block, k), master, k))
                for slot in self.optimizer.slots:
                    slots.append((("moments", slot, *block, k), moments[k], slot))
        return slots

    _state_slots = state_slots  # the name callers knew it by


def train_step(
    scheme: str | Scheme,
    mesh: Mesh,
    params: Mapping[str, Any],
    x: Any,
    target: Any,
    optimizer: Optimizer | None = None,
    **kwargs: Any,
) -> StepResult:
    """One training step from fresh optimizer state; the result's ``params`` are the updated weights.

    Keyword arguments are :class:`Trainer`'s (``precision``, ``activation``, ``residual``,
    ``recompute``, ``axes``...).

    >>> import numpy as np, shardsim
    >>> p = shardsim.models.reference_mlp.init(8, 16)
    >>> x = np.ones((4, 8), np.float32)
    >>> r = train_step("zero1", shardsim.Mesh(X=4), p, x, np.zeros_like(x), SGD(lr=0.1))
    >>> r.trace.collectives("optimizer")
    [('reduce_scatter', ('X',)), ('reduce_scatter', ('X',)), ('all_gather', ('X',)), ('all_gather', ('X',))]
    >>> r.params["w_in"].shape
    (8, 16)
    """
    trainer = Trainer(scheme, mesh, params, optimizer, **kwargs)
    result = trainer.step(x, target)
    if result.loss is not None:
        result.params = trainer.params_global()
    return result


def as_optimizer(optimizer: Any) -> Optimizer:
    """An optimizer, its name, or None (Adam's defaults).

    >>> type(as_optimizer("sgd")).__name__, type(as_optimizer(None)).__name__
    ('SGD', 'Adam')
    """
    if optimizer is None:
        return Adam()
    if isinstance(optimizer, str):
        return optim.get(optimizer)
    if not isinstance(optimizer, (SGD, Adam)):
        raise ShardingError(
            f"optimizer must be shardsim.training.SGD, Adam or AdamW (or one's name: 'sgd', 'momentum', "
            f"'adam', 'adamw'), got {type(optimizer).__name__}"
        )
    return optimizer


def _positional(
    spelling: str, args: tuple[Any, ...], names: tuple[str, ...], options: dict[str, Any]
) -> tuple[Any, ...]:
    """The spelling's positional arguments ``names`` and the optimizer (positional after them, or
    ``optimizer=`` among ``options``, which loses it)."""
    if len(args) < len(names) or len(args) > len(names) + 1:
        raise TypeError(f"{spelling} takes {', '.join(names)} and an optional optimizer; got {len(args)} more")
    optimizer = options.pop("optimizer", None)
    if len(args) > len(names):
        if optimizer is not None:
            raise TypeError(f"{spelling}: optimizer given twice, positionally and as optimizer=")
        optimizer = args[-1]
    return (*args[: len(names)], optimizer)


def _plan(plan: Any) -> Plan:
    """A plan, or a plan string read by :meth:`Plan.parse`."""
    from ..plans import Plan

    if isinstance(plan, str):
        return Plan.parse(plan)
    if not isinstance(plan, Plan):
        raise ArgumentTypeError(
            "Trainer: plan must be a shardsim.plans.Plan or a plan string such as 'dp=2,tp=2', "
            f"got {type(plan).__name__}"
        )
    return plan


def _engine_step(engine: str, trainer: Trainer) -> Any:
    """None for the stacked NumPy engine; for ``"jax"``, the jitted step of :mod:`.jax_step`
    (:mod:`.jax_model_step` for a transformer)."""
    if engine == "numpy":
        return None
    if engine == "jax" and getattr(trainer, "cfg", None) is not None:
        from .jax_model_step import JaxModelStep

        return JaxModelStep(trainer)
    if engine == "jax":
        from .jax_step import JaxStep

        return JaxStep(trainer)
    raise ShardingError(f"engine must be 'numpy' or 'jax', got {engine!r}")
