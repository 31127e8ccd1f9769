"""Pipeline parallelism: schedules as data, and the executor that runs them stage by stage.

>>> from shardsim.strategies.pipeline import one_f_one_b
>>> one_f_one_b(stages=4, microbatches=8).bubble()  # (p-1)/m
0.375
"""

from __future__ import annotations

from .execute import Executed, Pipeline, PipelineStep, Stage
from .schedule import Item, Schedule, gpipe, interleaved, make, one_f_one_b

__all__ = [
    "Executed",
    "Item",
    "Pipeline",
    "PipelineStep",
    "Schedule",
    "Stage",
    "gpipe",
    "interleaved",
    "make",
    "one_f_one_b",
]
