"""Test set-up shared by the doctests in ``src`` and the tests in ``tests``.

The JAX engine's doctests and tests run on 8 fake CPU devices. XLA reads the device count
when JAX is first imported, so it is set here, before any test module can import JAX (this
file imports nothing from JAX). Without JAX installed, the JAX engine's modules are not
collected for doctests (``tests/jax`` skips itself).
"""

from __future__ import annotations

import importlib.util
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

NEEDS_JAX = ["src/shardsim/engines/jax", "src/shardsim/training/jax_step.py"]
collect_ignore = [] if importlib.util.find_spec("jax") else NEEDS_JAX
