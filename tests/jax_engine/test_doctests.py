"""The JAX engine's docstring examples, run on the package's own modules (see the root conftest.py)."""

from __future__ import annotations

import doctest
import importlib

import pytest

pytest.importorskip("jax")

MODULES = [
    "shardsim.engines.jax",
    "shardsim.engines.jax.kernels",
    "shardsim.engines.jax.model",
    "shardsim.engines.jax.placement",
    "shardsim.engines.jax.program",
    "shardsim.training.jax_step",
    "shardsim.training.jax_model_step",
    "shardsim.transformer.on_device",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    failed, attempted = doctest.testmod(module, optionflags=flags, verbose=False)
    assert attempted > 0 and failed == 0
