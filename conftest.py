"""Test set-up shared by the doctests in ``src`` and the tests in ``tests``.

The JAX engine's doctests and tests run on 8 fake CPU devices. XLA reads the device count
when JAX is first imported, so it is set here, before any test module can import JAX (this
file imports nothing from JAX). The JAX engine's modules are not collected for doctests here;
``tests/jax_engine`` runs them (and skips itself without JAX).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

# Their doctests run from tests/jax_engine/test_doctests.py on the package's own modules: collected
# here, pytest's importlib mode would import a second copy of them, whose JAX-traced programs
# then mix with the first copy's engine.
NEEDS_JAX = ["src/shardsim/engines/jax", "src/shardsim/training/jax_step.py", "src/shardsim/training/jax_model_step.py"]
collect_ignore = NEEDS_JAX
