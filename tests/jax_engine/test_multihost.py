"""fsdp_tp and a transformer's step as 2 processes x 4 CPU devices (``jax.distributed`` on localhost) equal the
single-process run.

Marked ``multihost``: it starts two processes and takes ~10 s; CI runs it with the rest.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.multihost
def test_two_processes_equal_one() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("XLA_FLAGS", None)  # each process asks for its own 4 devices
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "jax" / "multihost_fsdp_tp.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "process 0: 4 of 8 devices, 11 collectives; the transformer under" in proc.stdout
    assert "process 1: 4 of 8 devices, 11 collectives; the transformer under" in proc.stdout
    assert "out and gradients, and the transformer's loss and gradients, equal the single-process run" in proc.stdout
