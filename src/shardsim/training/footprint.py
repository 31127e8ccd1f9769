"""The memory of one training step of a transformer under a plan, read from the step's ledger.

:func:`model_memory` runs :class:`~shardsim.training.model_trainer.ModelTrainer`'s own step
shape-only at the real sizes (no arithmetic: every value's bytes and lifetime, no numbers) and
returns what the ledger measured, per chip (the busiest chip of each category):

- ``params``, ``grads``, ``optimizer`` (master weights and moments where the precision and
  the ZeRO stage keep them), ``activations`` (what the blocks keep for the backward pass under
  the plan's microbatching, recomputation and pipeline schedule, plus what each op makes),
  ``temporaries`` (communication buffers: gathered weights, unreduced gradients, the slices
  ZeRO-1/2 AllGather), and ``total``: each one's peak over the step;
- the model state (``params``, ``grads``, ``optimizer``) live when the backward pass has
  finished and the update has not begun, the moment the ZeRO paper's figures describe.

The same contract as :func:`shardsim.cost.program.training_memory` for the MLP.

The layers are identical, so a deep model need not be traced layer by layer: with more layers
than :data:`SAMPLES`' largest, the step is run on copies of the model with 2, 3 and 4 layers,
and every figure, which each added layer changes by the same bytes, is carried on along the
line through them; if three runs are not on one line the step is traced in full (as
``full=True`` always does). A pipeline's figures come from the steady state of a two-stage
probe (:mod:`~shardsim.training.stage_memory`): its stages' own state, and the stash of the
microbatches the schedule holds in flight, so a step of hundreds of microbatches over dozens of
stages is never traced whole; stages of unequal depth (the first and last a layer short, as
BLOOM's 70 layers on 12 stages) are counted at the deepest. The tests hold both to the full trace.

>>> from shardsim.models import get
>>> from shardsim.plans import Plan
>>> peak, state = model_memory(get("gpt-tiny"), Plan(dp=4, zero=3), batch=8, seq=16)
>>> state["optimizer"] == 12 * get("gpt-tiny").param_count() // 4  # float32 master + m + v, split
True
>>> peak["temporaries"] > 0  # the weights FSDP gathers come and go
True
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from ..errors import ModelInputError, PlanError
from ..mesh import Mesh
from ..models import TransformerConfig
from ..models import get as get_model
from . import policies
from .precision import Precision
from .stage_memory import check_stages, pipeline_memory
from .traced import trained_step

if TYPE_CHECKING:
    from ..plans import Plan


def model_memory(
    cfg: TransformerConfig | str,
    plan: Plan | str,
    mesh: Mesh | None = None,
    *,
    batch: int,
    seq: int | None = None,
    optimizer: str = "adam",
    precision: str | Precision | None = None,
    policy: str | policies.BytePolicy | None = None,
    full: bool = False,
) -> tuple[dict[str, int], dict[str, int]]:
    """Each category's per-chip peak bytes over one shape-only training step (and ``"total"``),
    and the model state between the backward pass and the update; see the module docstring.

    ``cfg`` is a config or a preset name (``"llama3-70b"``), ``plan`` a :class:`Plan` or its
    text; ``mesh`` (by default ``plan.mesh()``) gives the axis names and sizes only: the step
    runs on a fresh copy. ``batch`` is the global batch in sequences of ``seq`` tokens (by
    default ``cfg.seq``). ``precision`` (default: the plan's, else ``bf16``: bf16 weights,
    float32 master weights and moments) or ``policy``, a byte policy's name
    (:mod:`shardsim.training.policies`), which also names the optimizer. ``full`` traces
    every layer even of a deep model.
    """
    from ..plans import Plan

    cfg = get_model(cfg) if isinstance(cfg, str) else cfg
    plan = Plan.parse(plan) if isinstance(plan, str) else plan
    if not isinstance(plan, Plan):
        raise PlanError(f"model_memory needs a Plan (or its text, e.g. 'dp=8,tp=8,zero=1'), got {plan!r:.60}")
    mesh = plan.mesh() if mesh is None else Mesh(dict(zip(mesh.axis_names, mesh.shape)))
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < plan.dp:
        raise ModelInputError(
            f"batch={batch!r} sequences is smaller than the data-parallel degree dp={plan.dp}: every "
            f"data-parallel chip needs at least one sequence; use a batch of at least {plan.dp} "
            f"(a multiple of dp x microbatches = {plan.dp * plan.microbatches})"
        )
    if policy is not None:
        if precision is not None:
            raise PlanError("give precision= or policy=, not both: a byte policy is a precision and an optimizer")
        chosen = policies.get(policy)
        if chosen.zero is not None and chosen.zero != plan.zero:
            raise PlanError(
                f"byte policy {chosen.name!r} counts ZeRO stage {chosen.zero} ({chosen.bytes_per_param}); the plan "
                f"has zero={plan.zero}: set zero={chosen.zero} in the plan or choose another policy"
            )
        precision, optimizer = chosen.precision, chosen.optimizer
    prec = Precision.of(precision or plan.precision or "bf16")
    length = cfg.seq if seq is None else seq

    if plan.pp > 1 and not full:  # the steady state of a two-stage probe (its module doc)
        deepest = check_stages(cfg, plan, batch)  # uneven stages counted at the deepest
        return pipeline_memory(
            cfg, plan, batch=batch, seq=length, optimizer=optimizer, precision=prec, stage_layers=deepest
        )

    def measure(model: TransformerConfig) -> _Figures:
        """The ledger of one step of ``model``."""
        step = trained_step(model, plan, mesh, (batch, length), optimizer, prec, events=False)
        return dict(step.memory), dict(step.model_state)

    if full or plan.pp > 1 or cfg.layers <= SAMPLES[-1]:
        return measure(cfg)
    runs = [measure(cfg.scaled(layers=k)) for k in SAMPLES]
    return _carried(SAMPLES, runs, cfg.layers) or measure(cfg)  # not one line: trace every layer


_Figures = tuple[dict[str, int], dict[str, int]]


def _carried(ks: tuple[int, ...], runs: list[_Figures], k: int) -> _Figures | None:
    """Both dicts of figures at ``k``, on the lines through ``runs`` at ``ks``; None if any is off its line."""
    peak, state = (_along_the_line(ks, [r[i] for r in runs], k) for i in (0, 1))
    return None if peak is None or state is None else (peak, state)


SAMPLES = (2, 3, 4)  # layers of the runs a deep model's figures are carried on from


def _along_the_line(ks: tuple[int, ...], runs: list[dict[str, int]], k: int) -> dict[str, int] | None:
    """Each figure at ``k`` on the line through its values at ``ks`` (equally spaced), or None
    if some figure's values are not on one line."""
    out = {}
    for c in runs[0]:
        ys = [r.get(c, 0) for r in runs]
        steps = {b - a for a, b in itertools.pairwise(ys)}
        if len(steps) != 1:
            return None
        out[c] = ys[0] + (k - ks[0]) // (ks[1] - ks[0]) * steps.pop()
    return out
