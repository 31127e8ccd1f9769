"""Pipeline parallelism — cut the depth: each stage of the pipe axis Z holds L/p of the layers.

Seed: "Put different layers on different GPUs; pass activations forward, partial gradients
backward. [...] The fix is micro-batches: chop the batch so a stage finishes a piece and
passes it on, keeping the pipeline full." The scaling book's notation:

    In[L_Z, B, D][i] · W_in[L_Z, D, F][i] · W_out[L_Z, F, D][i]

The batch is cut into ``microbatches``; a schedule (``gpipe``, ``1f1b``, or ``interleaved``
for ``pp_interleaved``) says which stage runs which microbatch when, and drives the run
(:mod:`shardsim.strategies.pipeline.execute`): activations go forward and gradients backward by
``ppermute`` over Z, and each stage stashes only its own activations (ledger category
``stash``). Compositions run the same schedule with another block per layer:

- ``dp_pp``: batch split over X too; the weight gradients are AllReduced over X once, after
  the pipeline flush.
- ``dp_pp_tp``: and each layer is the ``tp`` scheme over Y (AllGather in, ReduceScatter out);
  stages send ``[b_X, D_Y]``, i.e. ``b·D/t`` per chip (Narayanan's scatter/gather).

Options: ``schedule`` (``"1f1b"``, or ``"gpipe"``), ``microbatches`` (default: the per-chip
batch's largest divisor not above twice the stages). ``run_strategy`` returns the output once
the schedule has ended: under 1F1B the last microbatch leaves the last stage after the first
backward items ran, so the forward call hands back a value that the backward call completes.

>>> from shardsim.strategies import pp
>>> pp.layouts(pp.Ctx(axes={"pipe": "Z"}))["w_in"]
'[L_Z, D, F]'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..array import ShardedArray
from ..errors import DivisibilityError, ShardingError
from ..models import reference_mlp as mlp
from . import tp
from .base import Ctx, Grads, Params, Saved, Scheme, check_dout, shape_of
from .pipeline.execute import PipelineStep
from .pipeline.schedule import Schedule, make


# -- one layer on one stage -------------------------------------------------------------------
def block_forward(ctx: Ctx, a: ShardedArray, w: Params) -> tuple[ShardedArray, Saved]:
    """One MLP layer on its stage's chips: no communication (the stage holds the whole layer)."""
    h_pre = (a @ w["w_in"]).named("H_pre")  # 1. H[b, F]
    h = ctx.act(h_pre)
    out = (h @ w["w_out"]).named("Out")  # 2. Out[b, D]
    return out, {"In": a, "H_pre": h_pre, "H": h}


def block_backward(ctx: Ctx, saved: Saved, g: ShardedArray, w: Params) -> tuple[ShardedArray, Grads]:
    """Its backward; with the batch split over X the weight gradients are partial ``{U_X}``."""
    a, h_pre, h = saved["In"], saved["H_pre"], saved["H"]
    dw_out = (h.T @ g).named("dW_out")  # 1. dW_out[F, D]
    dh = ctx.act_backward(g @ w["w_out"].T, h_pre)  # 2. dH[b, F]
    dw_in = (a.T @ dh).named("dW_in")  # 3. dW_in[D, F]
    da = (dh @ w["w_in"].T).named("dIn")  # 4. dIn[b, D]
    return da, {"w_in": dw_in, "w_out": dw_out}


# -- layouts ----------------------------------------------------------------------------------
def layouts(ctx: Ctx) -> dict[str, str]:
    Z = ctx.axis("pipe")
    return {"x": "[B, D]", "w_in": f"[L_{Z}, D, F]", "w_out": f"[L_{Z}, F, D]", "out": "[B, D]"}


def interleaved_layouts(ctx: Ctx) -> dict[str, str]:
    Z = ctx.axis("pipe")
    return {"x": "[B, D]", "w_in": f"[C, L_{Z}, D, F]", "w_out": f"[C, L_{Z}, F, D]", "out": "[B, D]"}


def dp_layouts(ctx: Ctx) -> dict[str, str]:
    X, Z = ctx.data, ctx.axis("pipe")
    return {"x": f"[B_{X}, D]", "w_in": f"[L_{Z}, D, F]", "w_out": f"[L_{Z}, F, D]", "out": f"[B_{X}, D]"}


def dp_tp_layouts(ctx: Ctx) -> dict[str, str]:
    X, Y, Z = ctx.data, ctx.model, ctx.axis("pipe")
    return {
        "x": f"[B_{X}, D_{Y}]",
        "w_in": f"[L_{Z}, D, F_{Y}]",
        "w_out": f"[L_{Z}, F_{Y}, D]",
        "out": f"[B_{X}, D_{Y}]",
    }


# -- the step ---------------------------------------------------------------------------------
class PipelineState(dict):  # type: ignore[type-arg]
    """What the forward call leaves for the backward call: the paused step (nothing else to list:
    the stash is in the ledger, category ``stash``)."""

    def __init__(self, step: PipelineStep) -> None:
        super().__init__()
        self.step = step


class PendingOutput:
    """The pipeline's output, complete when its schedule has run the last forward item.

    Under 1F1B that happens after backward items have run, i.e. during the backward call;
    until then reading it raises. Then it stands for the output ``ShardedArray``.
    """

    def __init__(self, step: PipelineStep) -> None:
        self._step = step

    def __getattr__(self, name: str) -> Any:
        out = self._step.out
        if out is None:
            raise ShardingError(
                "the pipeline's output is complete only once its last forward item has run; under "
                f"{self._step.schedule.name} that is after backward items: run the backward pass first"
            )
        return getattr(out, name)


def schedule_for(ctx: Ctx, x: ShardedArray, params: Params) -> Schedule:
    """The schedule the options ask for, on this mesh and batch."""
    p = x.mesh.axis_size(ctx.axis("pipe"))
    chunks = params["w_in"].global_shape[0] if params["w_in"].ndim == 4 else 1
    name = ctx.options.get("schedule", "interleaved" if chunks > 1 else "1f1b")
    return make(name, p, microbatches(ctx, x.local_shape[0], p, name == "interleaved"), chunks)


def microbatches(ctx: Ctx, per_chip: int, stages: int, multiple: bool) -> int:
    """The ``microbatches`` option, checked: a whole number >= 1 dividing the per-chip batch.

    >>> microbatches(Ctx(options={"microbatches": 3}), 6, 2, False), microbatches(Ctx(), 8, 2, False)
    (3, 4)
    """
    m = ctx.options.get("microbatches")
    if m is None:
        return default_microbatches(per_chip, stages, multiple)
    if isinstance(m, (bool, np.bool_)) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ShardingError(f"option microbatches must be a whole number >= 1, got {m!r}")
    if per_chip % m:
        divisors = [d for d in range(1, per_chip + 1) if per_chip % d == 0]
        raise DivisibilityError(
            f"option microbatches={m}: the {per_chip} rows of the batch each chip holds do not divide by {m}; "
            f"pass one of {divisors}"
        )
    return int(m)


def default_microbatches(per_chip: int, stages: int, multiple: bool) -> int:
    """The per-chip batch's largest divisor not above ``2·stages`` (a multiple of ``stages`` for
    the interleaved schedule, when one divides), so the bubble ``(p-1)/m`` stays small.

    >>> default_microbatches(8, 2, False), default_microbatches(6, 4, False), default_microbatches(6, 2, True)
    (4, 6, 2)
    """
    fits = [d for d in range(1, min(per_chip, 2 * stages) + 1) if per_chip % d == 0]
    whole = [d for d in fits if d % stages == 0] if multiple else []
    return max(whole or fits)


Forward = Callable[[Ctx, ShardedArray, Params], tuple[Any, Saved]]


def pipelined(block_fwd: Callable[..., Any], block_bwd: Callable[..., Any]) -> Forward:
    """A scheme's forward that runs the schedule with this layer block, up to its first backward."""

    def forward(ctx: Ctx, x: ShardedArray, params: Params) -> tuple[Any, Saved]:
        step = PipelineStep(ctx, x, params, schedule_for(ctx, x, params), block_fwd, block_bwd)
        step.run()  # every item before the first backward
        out = step.out if step.out is not None else PendingOutput(step)
        return out, PipelineState(step)

    return forward


def backward(ctx: Ctx, saved: Saved, dout: ShardedArray, params: Params) -> tuple[ShardedArray, Grads]:
    """The rest of the schedule, now that ``dOut`` is here: ``dIn`` and ``dW[L_Z, ...]``."""
    step = saved.step  # type: ignore[attr-defined]
    step.run(dout)  # the rest of the schedule
    assert step.dx is not None
    return step.dx, dict(step.grads)


# -- the single-device reference --------------------------------------------------------------
def init(d_model: int, d_ff: int, seed: int = 0, dtype: Any = "float32", layers: int = 4) -> dict[str, np.ndarray]:
    """``layers`` MLP layers: ``{"w_in": [L, D, F], "w_out": [L, F, D]}``."""
    return mlp.init_stack(layers, d_model, d_ff, seed=seed, dtype=dtype)


def init_chunked(
    d_model: int, d_ff: int, seed: int = 0, dtype: Any = "float32", layers: int = 4, chunks: int = 2
) -> dict[str, np.ndarray]:
    """The same layers as ``[C, L/C, ...]``: chunk ``c`` holds layers ``c·L/C ...`` (Megatron's
    interleaving: stage ``s`` then holds layers ``s``, ``s + p``, ... in units of ``L/(C·p)``)."""
    stack = init(d_model, d_ff, seed, dtype, layers)
    return {k: v.reshape((chunks, layers // chunks) + v.shape[1:]) for k, v in stack.items()}


def reference(
    params: Mapping[str, np.ndarray], x: np.ndarray, dout: np.ndarray, activation: str = "identity", **options: Any
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The L layers one after the other on one device: ``(out, {"x", "w_in", "w_out"})``."""
    flat = {k: np.asarray(v).reshape((-1,) + np.shape(v)[-2:]) for k, v in params.items()}
    grads = mlp.stack_backward(flat, x, dout, activation)
    shaped = {k: grads[k].reshape(np.shape(params[k])) for k in params}
    return mlp.stack_forward(flat, x, activation), {"x": grads["x"], **shaped}


def check_shapes(params: Mapping[str, Any], x: Any, dout: Any) -> None:
    if len(shape_of(x)) != 2:
        raise ShardingError(f"x must be [B, D], got shape {shape_of(x)}")
    b, d = shape_of(x)
    w_in, w_out = shape_of(params["w_in"]), shape_of(params["w_out"])
    if len(w_in) not in (3, 4) or w_in[-2] != d:
        raise ShardingError(f"W_in must be [L, D, F] (or [C, L, D, F]) with D = {d}, got shape {w_in}")
    if w_out != w_in[:-2] + (w_in[-1], d):
        raise ShardingError(f"W_out must be {w_in[:-2] + (w_in[-1], d)} to match W_in {w_in}, got {w_out}")
    check_dout(dout, "[B, D]", (b, d))


def _scheme(name: str, roles: tuple[str, ...], lay: Any, fwd: Any, summary: str, **kw: Any) -> Scheme:
    return Scheme(
        name,
        roles=roles,
        layouts=lay,
        forward=fwd,
        backward=backward,
        check_shapes=check_shapes,
        summary=summary,
        init=kw.get("init", init),
        reference=reference,
        options=("microbatches", "schedule"),
    )


forward = pipelined(block_forward, block_backward)  # each layer local to its stage
SCHEMES = (
    _scheme("pp", ("pipe",), layouts, forward, "layers in stages over Z, microbatches, ppermute between stages"),
    _scheme(
        "pp_interleaved",
        ("pipe",),
        interleaved_layouts,
        forward,
        "v model chunks per stage (interleaved 1F1B): the bubble shrinks by v, more ppermutes",
        init=init_chunked,
    ),
    _scheme("dp_pp", ("data", "pipe"), dp_layouts, forward, "data parallel over X x pipeline over Z"),
    _scheme(
        "dp_pp_tp",
        ("data", "model", "pipe"),
        dp_tp_layouts,
        pipelined(tp.forward, tp.backward),
        "3-D: data over X, tensor parallel layers over Y, pipeline stages over Z",
    ),
)
