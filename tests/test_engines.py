"""The engine seam without JAX: ``import shardsim`` never imports JAX, and the JAX engine says what it needs."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import shardsim
from shardsim.collectives import engines  # the module the kernels are dispatched through

ROOT = Path(__file__).resolve().parents[1]


def python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_shardsim_never_imports_jax() -> None:
    out = python(
        "import sys, numpy as np, shardsim\n"
        "from shardsim.training import Trainer\n"
        "from shardsim import cli\n"
        "p = shardsim.models.reference_mlp.init(4, 8); x = np.ones((2, 4), np.float32)\n"
        "shardsim.run_strategy('fsdp_tp', shardsim.Mesh(X=2, Y=2), p, x, x)\n"
        "Trainer('zero1', shardsim.Mesh(X=2), p).step(x, x)\n"
        "cli.main(['demo', '--quiet'])\n"
        "print('jax' in sys.modules)\n"
    )
    assert out.splitlines()[-1] == "False"


def test_without_jax_the_engine_names_the_extra() -> None:
    out = python(
        "import sys\n"
        "sys.modules['jax'] = None  # as if JAX were not installed\n"
        "import shardsim\n"
        "try:\n"
        "    import shardsim.engines.jax\n"
        "except shardsim.EngineUnavailableError as e:\n"
        "    print(type(e).__mro__[1].__name__, isinstance(e, ImportError), e)\n"
        "try:\n"
        "    shardsim.training.Trainer('ddp', shardsim.Mesh(X=2), shardsim.mlp.init(4, 8), engine='jax')\n"
        "except shardsim.EngineUnavailableError as e:\n"
        "    print('trainer:', e)\n"
    )
    first, second = out.splitlines()
    assert first.startswith("ShardsimError True the JAX engine needs JAX: pip install 'shardsim[jax]'")
    assert second.startswith("trainer: the JAX engine needs JAX: pip install 'shardsim[jax]'")


def test_the_default_engine_is_the_stacked_one() -> None:
    assert engines.active() is engines.STACKED
    seen = []

    class Counting(type(engines.STACKED)):  # the stacked kernels, counted: ops and collectives go through the seam
        def all_gather(self, *args: object) -> object:
            seen.append("all_gather")
            return super().all_gather(*args)

        def matmul(self, *args: object) -> object:
            seen.append("matmul")
            return super().matmul(*args)

    p = shardsim.models.reference_mlp.init(4, 8)
    x = np.ones((4, 4), np.float32)
    with engines.use(Counting()):
        r = shardsim.run_strategy("fsdp", shardsim.Mesh(X=2), p, x, x)
    assert engines.active() is engines.STACKED
    assert seen.count("all_gather") == len([c for c in r.trace.collectives() if c[0] == "all_gather"]) == 4
    assert seen.count("matmul") >= 2


def relative_imports(path: Path) -> set[str]:
    """The shardsim modules a file imports, function-level imports included (as ``..x`` / ``.y``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            found |= {"." * node.level + (node.module or a.name) for a in node.names}
    return found


def test_the_engine_layer_imports_only_the_kernels_below_it() -> None:
    """The seam adds no cycle: the engines import the block kernels and each other, nothing above them."""
    src = ROOT / "src" / "shardsim" / "engines"
    assert relative_imports(src / "__init__.py") == {".stacked"}
    assert relative_imports(src / "stacked.py") == {".._blocks"}
    assert relative_imports(src / "jax" / "kernels.py") == {"..stacked"}
