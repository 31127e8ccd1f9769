"""The shape-only programs every cost is read from, built in one place.

A model under a plan has one program: :func:`program_of` builds it for an
:class:`~shardsim.models.MLP` (the registered scheme that runs the plan,
:func:`~shardsim.strategies.scheme_of`, traced shape-only at the real sizes:
:func:`~shardsim.cost.program.mlp_program`) and for a
:class:`~shardsim.models.TransformerConfig` (``run_model``'s trace with its layers repeated:
:func:`~shardsim.cost.model_steps.model_program`). :func:`memory_of` gives the memory of the
same model's training step. The transformer's training steps themselves, which
:func:`~shardsim.training.model_memory` and the planner's traced layers
(:class:`~shardsim.cost.layer_program.LayerCache`) both read, come from
:func:`~shardsim.training.traced.trained_step`, whose cache they share: a step traced once is
never traced again.

>>> from shardsim.models import MLP, get
>>> from shardsim.plans import Plan
>>> program_of(MLP(32, 128, layers=2), Plan(dp=4, zero=3), 64).scheme
'fsdp'
>>> program_of(get("gpt-tiny"), Plan(dp=2), batch_tokens=2 * 16, seq=16).layers
2
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import CostModelError
from ..mesh import Mesh
from ..models import TransformerConfig
from ..models.mlp import MLP
from ..plans import Plan
from ..training.traced import STEPS_KEPT, TrainedStep, clear_steps, steps_held, trained_step
from .program import Program, mlp_program, mlp_training_memory

if TYPE_CHECKING:
    pass

Model = TransformerConfig | MLP


def mlp_scheme(model: MLP, plan: Plan, scheme: str | None = None) -> str:
    """The registered scheme that runs ``plan`` on ``model`` (``scheme`` when given: a scheme
    that names the same plan, as ``zero3`` names ``fsdp``'s).

    >>> mlp_scheme(MLP(8, 16, norm=True), Plan(tp=2))
    'tp_ln'
    """
    from ..strategies.plans import scheme_of

    return scheme if scheme is not None else scheme_of(plan, model)


def mlp_axes(plan: Plan, scheme: str) -> dict[str, str]:
    """The scheme's roles on ``plan``'s mesh axes (what ``run_strategy``'s ``axes=`` takes).

    >>> mlp_axes(Plan(dp=2, tp=2, zero=3), "fsdp_tp")
    {'data': 'data', 'model': 'model'}
    """
    from ..strategies.plans import axes_of

    return axes_of(plan, scheme)


def program_of(
    model: Model,
    plan: Plan,
    batch_tokens: int,
    seq: int | None = None,
    dtype: str = "bfloat16",
    *,
    scheme: str | None = None,
    mesh: Mesh | None = None,
) -> Program:
    """The shape-only program of one step of ``model`` under ``plan`` on ``batch_tokens`` tokens
    (module doc). For an MLP, ``scheme`` names the scheme (default the plan's) and ``mesh``
    the mesh it runs on (default ``plan.mesh()``: a mesh with more axes replicates over them,
    and its slow chips are kept); a transformer's batch is sequences of ``seq`` tokens.

    >>> from shardsim import Mesh
    >>> program_of(MLP(32, 128), Plan(tp=4, model_axis="Y"), 64, mesh=Mesh(X=2, Y=4)).mesh
    Mesh(X=2, Y=4)
    """
    if isinstance(model, MLP):
        name = mlp_scheme(model, plan, scheme)
        on = plan.mesh() if mesh is None else mesh
        return mlp_program(name, model, on, batch_tokens, dtype=dtype, axes=mlp_axes(plan, name))
    from .model_steps import model_program

    return model_program(model, plan, batch_tokens, seq, dtype)


def memory_of(
    model: Model,
    plan: Plan,
    batch_tokens: int,
    seq: int | None = None,
    dtype: str = "bfloat16",
    *,
    optimizer: str = "adam",
    precision: str | None = None,
    policy: str | None = None,
    scheme: str | None = None,
    mesh: Mesh | None = None,
) -> tuple[dict[str, int], dict[str, int]]:
    """Each chip's peak bytes by category (and ``"total"``) over one shape-only training step of
    ``model`` under ``plan``, and the model state between the backward pass and the update:
    the :class:`~shardsim.training.Trainer`'s ledger for an MLP (``precision`` by default
    ``dtype``'s policy), :func:`~shardsim.training.model_memory`'s for a transformer.

    >>> peak, state = memory_of(MLP(32, 128), Plan(dp=4, zero=3), 64)
    >>> state["optimizer"] == 12 * (2 * 32 * 128) // 4  # float32 master + Adam's m and v, sharded
    True
    """
    if isinstance(model, MLP):
        if policy is not None:
            raise CostModelError(
                f"policy={policy!r}: a byte policy is the transformer's; an MLP takes optimizer and precision"
            )
        name = mlp_scheme(model, plan, scheme)
        on = plan.mesh() if mesh is None else mesh
        return mlp_training_memory(
            name, model, on, batch_tokens, dtype=dtype, optimizer=optimizer, precision=precision,
            axes=mlp_axes(plan, name),
        )  # fmt: skip
    from .model_steps import check_batch, model_memory_ledger

    b, s = check_batch(model, plan, batch_tokens, seq)
    if plan.pp == 1 and plan.microbatches > 1:  # gradient accumulation: each chip holds one microbatch's step
        plan, b = plan.replace(microbatches=1), b // plan.microbatches
    return model_memory_ledger(model, plan, b, s, optimizer, precision, policy)


__all__ = [
    "STEPS_KEPT",
    "TrainedStep",
    "clear_steps",
    "memory_of",
    "mlp_axes",
    "mlp_scheme",
    "program_of",
    "steps_held",
    "trained_step",
]
