"""The JAX engine's tests: 8 fake CPU devices (set by the root ``conftest.py``) and 64-bit types.

The float64 property tests need ``jax_enable_x64``; the rest of the suite never imports JAX,
and without JAX these tests are not collected. The folder is on ``sys.path`` for the shared
cases (``engine_cases``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

if importlib.util.find_spec("jax") is None:
    collect_ignore_glob = ["test_*.py", "engine_cases.py"]
else:
    import jax

    jax.config.update("jax_enable_x64", True)
