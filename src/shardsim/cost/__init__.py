"""The cost model: time a scheme's step on real hardware from its own shape-only program.

Hardware presets (TPU v4p/v5e/v5p/v6e, NVIDIA A100/H100/H200/B200) or your own
:class:`Hardware`; :func:`estimate` one step (time line, MFU, memory, what binds it) of a model under a
plan (``estimate("llama3-70b", "dp=16,tp=8,pp=4", "h100", batch_tokens=...)``, or an
:class:`~shardsim.models.MLP`), one :class:`Estimate`, which an MLP scheme on a mesh spells
(``estimate("fsdp", Mesh(X=16), ...)``); :func:`program_of` is the shape-only program every
estimate reads (:func:`model_program` a transformer's, cached);
:func:`critical_batch` where a scheme turns compute-bound; :func:`sweep` many batches.
Formulas and sources: ``docs/cost-model.md``. Importing this package does not import
matplotlib; only drawing a PNG does.

>>> from shardsim import Mesh
>>> from shardsim import cost
>>> est = cost.estimate("fsdp", Mesh(X=16), "tpu-v5p", batch=16 * 2048, d_model=8192, d_ff=32768)
>>> est.bound  # 2,048 tokens per chip is below v5p's 2,550
'communication'
"""

from __future__ import annotations

from . import gantt as _gantt  # noqa: F401 - puts the Gantt charts on Timeline
from .builder import memory_of, program_of
from .collectives import CommTime, collective_time
from .critical import Critical, CriticalPair, axis_bandwidth, best_split, critical_batch, critical_both, scheme_mesh
from .efficiency import (
    AttentionEfficiency,
    Calibration,
    CalibrationWarning,
    CollectiveEfficiency,
    Efficiency,
    MatmulEfficiency,
    resolve_efficiency,
)
from .estimator import estimate
from .hardware import Hardware, Switched, Torus
from .model_estimate import estimate_model
from .model_steps import ModelProgram, model_program
from .placement import AxisLink, Placement, Route, default_topology, hungry_first, place, split_rings
from .presets import get_hardware, hardware_names
from .program import Program, Step, scheme_program, trace_steps
from .program_estimate import estimate_program
from .roofline import Roofline, matmul_critical_batch, matmul_time
from .step_estimate import Estimate, ModelEstimate
from .sweeps import sweep
from .timeline import Bar, Timeline, build_timeline, timeline_of

__all__ = [
    "AttentionEfficiency",
    "AxisLink",
    "Bar",
    "Calibration",
    "CalibrationWarning",
    "CollectiveEfficiency",
    "CommTime",
    "Critical",
    "CriticalPair",
    "Efficiency",
    "Estimate",
    "Hardware",
    "MatmulEfficiency",
    "ModelEstimate",
    "ModelProgram",
    "Placement",
    "Program",
    "Roofline",
    "Route",
    "Step",
    "Switched",
    "Timeline",
    "Torus",
    "axis_bandwidth",
    "best_split",
    "build_timeline",
    "collective_time",
    "critical_batch",
    "critical_both",
    "default_topology",
    "estimate",
    "estimate_model",
    "estimate_program",
    "get_hardware",
    "hardware_names",
    "hungry_first",
    "matmul_critical_batch",
    "matmul_time",
    "memory_of",
    "model_program",
    "place",
    "program_of",
    "resolve_efficiency",
    "scheme_mesh",
    "scheme_program",
    "split_rings",
    "sweep",
    "timeline_of",
    "trace_steps",
]
