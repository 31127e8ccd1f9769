"""The exceptions shardsim raises, defined once.

Every error names the culprit (the layout, the dimension, the axis, the chip) and, where
it can, the fix. All derive from :class:`ShardsimError`; those about bad input also derive
from :class:`ValueError`, so generic ``except ValueError`` code keeps working.

>>> import shardsim
>>> try:
...     shardsim.Mesh(X=2).axis_index("Z")
... except shardsim.MeshAxisError as e:
...     print(type(e).__name__)
MeshAxisError
"""

from __future__ import annotations


class ShardsimError(Exception):
    """Base class of every error raised by shardsim."""


class ShardingError(ShardsimError, ValueError):
    """Base class of errors about layouts, meshes, shapes and sharded operations."""


class LayoutParseError(ShardingError):
    """A layout string does not parse; the message points at the offending token."""


class MeshAxisError(ShardingError):
    """An unknown mesh axis, an axis used twice, or a malformed mesh."""


class DivisibilityError(ShardingError):
    """A dimension does not divide evenly by the product of the mesh axes it is split over."""


class ShapeError(ShardingError):
    """Shapes or ranks that do not match: operand shapes, block shapes, layout rank."""


class MatmulShardingError(ShardingError):
    """A sharded matmul no local computation can do; the message names the case and the fixing collective."""


class CollectiveError(ShardingError):
    """A collective asked of a value that is not split (or not partial) over the axis."""


class PartialSumError(ShardingError):
    """A partial sum ``{U_axis}`` used where only a reduced value makes sense."""


class MeshMismatchError(ShardingError):
    """Operands that live on different meshes."""


class DtypeError(ShardingError, TypeError):
    """An elementwise op NumPy refuses for these dtypes or scalars (``bool - bool``, ``int8 + 300``)."""


class ArgumentTypeError(ShardingError, TypeError):
    """An argument of the wrong kind (not a ``ShardedArray``, not a ``Mesh``, an axis that is not a
    name, a shift that is not an integer); the message names the argument and what it must be."""


class ShapeOnlyError(ShardsimError, TypeError):
    """Data asked of a shape-only value, or data and shape-only values mixed in one op."""


class OutOfMemoryError(ShardsimError, MemoryError):
    """A chip's live bytes would exceed its capacity."""


class ChipFailureError(ShardsimError, RuntimeError):
    """A collective involves a chip that has been marked as failed."""


class CheckpointError(ShardsimError, OSError):
    """A checkpoint is missing, corrupt, or does not fit the requested mesh."""


class ConfigError(ShardsimError, ValueError):
    """A model configuration field out of range, or model inputs that do not fit the configuration."""


class CostModelError(ShardsimError, ValueError):
    """Hardware, placement or efficiency figures the cost model cannot use as given."""


class EngineError(ShardingError):
    """A scheme, mesh or device set an engine cannot run: the message names the culprit and the fix."""


class EngineUnavailableError(ShardsimError, ImportError):
    """An engine whose library is not installed (``pip install 'shardsim[jax]'`` for the JAX engine)."""


class CommandLineError(ShardsimError, ValueError):
    """A command-line argument that is malformed, out of its documented range, or too big for the host."""


class PlanError(ShardingError):
    """A parallelisation plan that cannot be: an unknown key, a bad degree, two parallelisms on one
    mesh axis, a plan that does not fit its mesh, or a combination ``run_model`` does not run."""


class PlannerError(ShardsimError, ValueError):
    """A plan search that cannot answer: constraints that contradict one another, a chip count
    the hardware cannot form, or a model that fits under no plan (the message gives the
    smallest shortfall and what would close it)."""


class ModelInputError(ShardingError):
    """Tokens or targets that do not fit the model under a plan: not ``[B, S]`` integers, outside
    the vocabulary, or longer than ``cfg.seq``."""


__all__ = [
    "ArgumentTypeError",
    "CheckpointError",
    "ChipFailureError",
    "CollectiveError",
    "CommandLineError",
    "ConfigError",
    "CostModelError",
    "DivisibilityError",
    "DtypeError",
    "EngineError",
    "EngineUnavailableError",
    "LayoutParseError",
    "MatmulShardingError",
    "MeshAxisError",
    "MeshMismatchError",
    "ModelInputError",
    "OutOfMemoryError",
    "PartialSumError",
    "PlanError",
    "PlannerError",
    "ShapeError",
    "ShapeOnlyError",
    "ShardingError",
    "ShardsimError",
]
