"""The planner: the best way to shard a model on a cluster, found in seconds and explained.

:func:`plan` searches data parallelism and its ZeRO stage, tensor and sequence parallelism,
pipelines (stages, schedule, microbatches, virtual stages), context parallelism,
recomputation and the placement of each on the networks; keeps the plans whose memory (from
the ledger of their shape-only program) fits the chip; ranks them by estimated step time;
and says why the best wins and why the rest lost. The inverse questions:
:func:`largest_model`, :func:`fewest_chips`, :func:`days_to_train`. ``docs/planner.md``.

>>> from shardsim.models import get
>>> table = plan(get("gpt-tiny"), "h100", chips=2, batch_tokens=4 * 16, seq=16, zero=0, recompute="none")
>>> table.best.fits
True
"""

from __future__ import annotations

from .evaluate import PlanEstimate
from .inverse import days_to_train, fewest_chips, largest_model
from .search import plan
from .space import Candidate, Constraints
from .table import PlanTable, Rejection

__all__ = [
    "Candidate",
    "Constraints",
    "PlanEstimate",
    "PlanTable",
    "Rejection",
    "days_to_train",
    "fewest_chips",
    "largest_model",
    "plan",
]
