"""The JAX engine: every scheme shardsim checks runs as a ``jax.shard_map`` program on JAX devices.

:func:`run_strategy` returns the same :class:`~shardsim.strategies.StrategyResult` as
:func:`shardsim.run_strategy`; :func:`compile` gives the jitted function and its sharded
arguments for a JAX training loop. Needs ``pip install 'shardsim[jax]'``; ``import shardsim``
never imports JAX.

>>> import shardsim
>>> "fsdp_tp" in SUPPORTED
True
"""

from __future__ import annotations

import importlib.util

from ...errors import EngineUnavailableError

if importlib.util.find_spec("jax") is None:
    raise EngineUnavailableError(
        "the JAX engine needs JAX: pip install 'shardsim[jax]' (or pip install 'jax[cpu]'); "
        "shardsim.run_strategy runs every scheme on the stacked NumPy engine without it"
    )

from .program import SUPPORTED, Program, compile, plan, program_fn, run_strategy

__all__ = ["SUPPORTED", "Program", "compile", "plan", "program_fn", "run_strategy"]
