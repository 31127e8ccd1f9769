"""shardsim: run sharded training of neural-network layers on a virtual mesh of NumPy chips.

>>> import numpy as np, shardsim
>>> mesh = shardsim.Mesh(X=2, Y=2)
>>> x = shardsim.shard(np.arange(16.0).reshape(4, 4), mesh, "B_X D_Y")
>>> shardsim.all_gather(x, "Y").layout
Layout('[B_X, D]')
"""

from __future__ import annotations

from . import checkpoint, formulas, mlp, moe, norm, pieces, pipeline, training
from .array import ShapeDtype, ShardedArray, from_local, shard
from .collectives import all_gather, all_reduce, all_to_all, ppermute, reduce_scatter
from .errors import (
    CheckpointError,
    ChipFailureError,
    CollectiveError,
    ConfigError,
    CostModelError,
    DivisibilityError,
    DtypeError,
    LayoutParseError,
    MatmulShardingError,
    MeshAxisError,
    MeshMismatchError,
    ModelInputError,
    OutOfMemoryError,
    PartialSumError,
    PlanError,
    ShapeError,
    ShapeOnlyError,
    ShardingError,
    ShardsimError,
)
from .layout import Layout
from .mesh import Mesh
from .ops import activation, activation_grad, cast, matmul
from .pictures import show
from .plan import Plan
from .reshard import reshard
from .strategies import run_strategy
from .tracing import Trace, phase, trace
from .training import Trainer, train_step

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # shardsim.models is imported on first use, so importing shardsim stays as light as before
    if name == "models":
        import importlib

        return importlib.import_module(".models", __name__)
    if name == "run_model":  # it needs shardsim.models: loaded on first use as well
        from .transformer import run_model

        return run_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "CheckpointError",
    "ChipFailureError",
    "CollectiveError",
    "ConfigError",
    "CostModelError",
    "DivisibilityError",
    "DtypeError",
    "Layout",
    "LayoutParseError",
    "MatmulShardingError",
    "Mesh",
    "MeshAxisError",
    "MeshMismatchError",
    "ModelInputError",
    "OutOfMemoryError",
    "PartialSumError",
    "Plan",
    "PlanError",
    "ShapeDtype",
    "ShapeError",
    "ShapeOnlyError",
    "ShardedArray",
    "ShardingError",
    "ShardsimError",
    "Trace",
    "Trainer",
    "activation",
    "activation_grad",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "cast",
    "checkpoint",
    "formulas",
    "from_local",
    "matmul",
    "mlp",
    "moe",
    "norm",
    "phase",
    "pieces",
    "pipeline",
    "ppermute",
    "reduce_scatter",
    "reshard",
    "run_model",
    "run_strategy",
    "shard",
    "show",
    "trace",
    "train_step",
    "training",
]
