"""The result of a transformer's step, read back the same way whether it ran pipelined or not.

>>> import numpy as np
>>> from shardsim.models import TransformerConfig, reference
>>> from shardsim.plans import Plan
>>> from shardsim.transformer import run_model
>>> cfg = TransformerConfig(layers=2, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)
>>> tok = np.arange(8).reshape(2, 4) % 8
>>> a = run_model(cfg, Plan(dp=2), Plan(dp=2).mesh(), reference.init(cfg, seed=0), tok, tok)
>>> b = run_model(cfg, Plan(pp=2), Plan(pp=2).mesh(), reference.init(cfg, seed=0), tok, tok)
>>> sorted(a.activations) == sorted(b.activations), a.axes, b.axes, b.plan
(True, {'data': 'data'}, {'pipe': 'pipe'}, Plan.parse('pp=2'))
"""

from __future__ import annotations

import numpy as np

from ..array import ShardedArray
from ..mesh import Mesh
from ..models import TransformerConfig
from ..plans import Plan
from ..strategies.result import RunResult, StepMemory
from ..tracing import Trace


def model_result(
    cfg: TransformerConfig,
    plan: Plan,
    mesh: Mesh,
    *,
    loss: float | None,
    sharded_grads: dict[str, ShardedArray],
    trace: Trace,
    memory: StepMemory,
    stored: list[np.ndarray],
    stored_values: list[dict[str, int]],
    grads: dict[str, np.ndarray] | None = None,
    layouts: dict[str, str] | None = None,
) -> RunResult:
    """The step's :class:`~shardsim.strategies.RunResult`: the gradients global too (unless
    shape-only), each stored activation named by its layer, the gradients' layouts, the axes
    of the plan's parallelisms and the ledger's peak.

    An engine whose values live on its devices passes the gradients fetched (``grads``) and
    their ``layouts`` instead of ``sharded_grads``."""
    if grads is None and not any(v.is_shape_only for v in sharded_grads.values()):
        grads = {k: v.to_global() for k, v in sharded_grads.items()}
    return RunResult(
        loss=loss,
        grads=grads,
        sharded_grads=sharded_grads,
        trace=trace,
        memory=memory,
        mesh=mesh,
        stored=stored,
        stored_values=stored_values,
        peak=mesh.memory.peak(),
        activations={f"{k}.{i}": n for i, values in enumerate(stored_values) for k, n in values.items()},
        layouts=layouts if layouts is not None else {f"d{k}": str(v.layout) for k, v in sharded_grads.items()},
        axes={r: a for r, a in plan.axes().items() if plan.degree(r) > 1},
        model=cfg,
        plan=plan,
    )


__all__ = ["model_result"]
