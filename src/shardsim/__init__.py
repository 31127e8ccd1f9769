"""shardsim: run sharded training of neural-network layers on a virtual mesh of NumPy chips.

>>> import numpy as np, shardsim
>>> mesh = shardsim.Mesh(X=2, Y=2)
>>> x = shardsim.shard(np.arange(16.0).reshape(4, 4), mesh, "B_X D_Y")
>>> shardsim.all_gather(x, "Y").layout
Layout('[B_X, D]')
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from . import operators as _operators  # noqa: F401 - puts the operators on ShardedArray
from . import pictures as _pictures  # noqa: F401 - puts the display methods on arrays, meshes, ledgers, traces
from . import specs as _specs  # noqa: F401 - puts the PartitionSpec/placement methods on Layout
from .array import ShapeDtype, ShardedArray, from_local, shard
from .collectives import all_gather, all_reduce, all_to_all, ppermute, reduce_scatter
from .errors import ArgumentTypeError as ArgumentTypeError  # X as X: attributes, for type checkers too, not in __all__
from .errors import CheckpointError as CheckpointError
from .errors import ChipFailureError as ChipFailureError
from .errors import CollectiveError as CollectiveError
from .errors import CommandLineError as CommandLineError
from .errors import ConfigError as ConfigError
from .errors import CostModelError as CostModelError
from .errors import DivisibilityError as DivisibilityError
from .errors import DtypeError as DtypeError
from .errors import EngineError as EngineError
from .errors import EngineUnavailableError as EngineUnavailableError
from .errors import LayoutParseError as LayoutParseError
from .errors import MatmulShardingError as MatmulShardingError
from .errors import MeshAxisError as MeshAxisError
from .errors import MeshMismatchError as MeshMismatchError
from .errors import ModelInputError as ModelInputError
from .errors import OutOfMemoryError as OutOfMemoryError
from .errors import PartialSumError as PartialSumError
from .errors import PlanError as PlanError
from .errors import PlannerError as PlannerError
from .errors import ShapeError as ShapeError
from .errors import ShapeOnlyError as ShapeOnlyError
from .errors import ShardingError as ShardingError
from .errors import ShardsimError
from .layout import Layout
from .mesh import Mesh
from .ops import activation, activation_grad, cast, matmul
from .resharding import reshard
from .tracing import Trace, phase, trace

if TYPE_CHECKING:  # loaded on first use (see __getattr__), named here for type checkers
    from . import checkpoint, cost, formulas, memory, models, pieces, training
    from .models import reference_mlp as mlp
    from .models import reference_moe as moe
    from .models import reference_norm as norm
    from .pictures import show
    from .planner import plan
    from .plans import Plan
    from .strategies import pipeline, run_strategy
    from .training import Trainer, train_step
    from .transformer import run_model

# Names whose modules load on first use, as NumPy and SciPy load their submodules: the
# training loop, checkpoints and cost model pull in json, hashing and the schemes, which a
# program that only shards and reduces never needs.
_LAZY = {
    "Plan": "plans",
    "plan": "planner",
    "run_model": "transformer",
    "show": "pictures",
    "run_strategy": "strategies",
    "Trainer": "training",
    "train_step": "training",
}


# Modules that moved, old name: new name. The old name (``from shardsim import mlp, pipeline``,
# a submodule under it) keeps working and gives the very module, and so the very classes, the
# new name gives, never a second copy. The one list of moves (docs/design.md, "Layers and
# folders"); a name and everything under it follows the move.
_MOVED: dict[str, str] = {
    "shardsim.mlp": "shardsim.models.reference_mlp",
    "shardsim.moe": "shardsim.models.reference_moe",
    "shardsim.norm": "shardsim.models.reference_norm",
    "shardsim.pipeline": "shardsim.strategies.pipeline",
    "shardsim.context": "shardsim.strategies.context",
    "shardsim.cost.calibration": "shardsim.calibration",
    "shardsim.strategies.demo": "shardsim.cli.demo_run",
}


def _moved_name(name: str) -> str | None:
    """The module's name now, if ``name`` is one of a module that moved (or under one); else None."""
    for old, new in _MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a moved module by its old name as the module itself, under both names."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if _moved_name(fullname) else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(_moved_name(spec.name) or spec.name)

    def exec_module(self, module: ModuleType) -> None:
        pass  # already run under its own name


if _MOVED and not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())


def __getattr__(name: str) -> Any:
    """``shardsim.cost``, ``shardsim.Trainer``...: import the submodule the first time it is asked for."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    elif name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise  # the submodule exists but needs something missing: say so
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__version__ = "0.1.0"


__all__ = [
    "Layout",
    "Mesh",
    "Plan",
    "ShapeDtype",
    "ShardedArray",
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
    "cost",
    "formulas",
    "from_local",
    "matmul",
    "memory",
    "mlp",
    "models",
    "moe",
    "norm",
    "phase",
    "pieces",
    "pipeline",
    "plan",
    "planner",
    "plans",
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
