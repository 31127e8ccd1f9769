"""The JAX engine: the programs shardsim checks run as ``jax.shard_map`` programs on JAX devices.

:func:`run_strategy` returns the same :class:`~shardsim.strategies.StrategyResult` as
:func:`shardsim.run_strategy`, and :func:`run_model` the same result as
:func:`shardsim.run_model` for the transformer under a plan; :func:`compile` and
:func:`compile_model` give the jitted function and its sharded arguments for a JAX
training loop. Needs ``pip install 'shardsim[jax]'``; ``import shardsim``
never imports JAX.

>>> from shardsim.engines import jax as engine
>>> "fsdp_tp" in engine.SUPPORTED
True
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from ...errors import EngineUnavailableError

if importlib.util.find_spec("jax") is None:
    raise EngineUnavailableError(
        "the JAX engine needs JAX: pip install 'shardsim[jax]' (or pip install 'jax[cpu]'); "
        "shardsim.run_strategy runs every scheme on the stacked NumPy engine without it"
    )

if TYPE_CHECKING:
    from .model import ModelProgram, compile_model, compile_step, plan_model, run_model
    from .program import SUPPORTED, Program, compile, plan, program_fn, run_strategy

_MODEL = ("ModelProgram", "compile_model", "compile_step", "plan_model", "run_model")


def __getattr__(name: str) -> Any:
    """The program's names, loaded on first use: the kernels and placement import without the
    schemes, which the program runs and which sit above the core's seam (PEP 562)."""
    if name in _MODEL:
        from . import model

        return getattr(model, name)
    if name in __all__:
        from . import program

        return getattr(program, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SUPPORTED",
    "ModelProgram",
    "Program",
    "compile",
    "compile_model",
    "compile_step",
    "plan",
    "plan_model",
    "program_fn",
    "run_model",
    "run_strategy",
]
