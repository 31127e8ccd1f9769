"""``import shardsim`` time: the median over fresh interpreters, for one or more source trees.

    python benchmarks/import_time.py src                      # this checkout
    python benchmarks/import_time.py OLD/src src --runs 41    # before and after, interleaved

Each run starts a new Python process that times ``import shardsim`` alone (``time.perf_counter``
around the import, so interpreter start-up is left out) and prints which of the package's
modules it loaded. The trees are run in turn, so background load falls on all of them alike.
A plain ``import numpy`` is timed the same way as the floor no NumPy library can go under.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import cpu

PROBE = (
    "import sys, time; t = time.perf_counter(); import {module}; dt = time.perf_counter() - t; "
    "print(dt, sum(m.startswith('shardsim') for m in sys.modules))"
)


def once(tree: str, module: str) -> tuple[float, int]:
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)], env=env, capture_output=True, text=True, check=True
    )
    seconds, modules = out.stdout.split()
    return float(seconds), int(modules)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", help="source directories holding the shardsim package")
    parser.add_argument("--runs", type=int, default=41)
    opts = parser.parse_args()
    print(f"Machine: {cpu()}, Python {sys.version.split()[0]}; {opts.runs} fresh interpreters per tree")
    times: dict[str, list[float]] = {t: [] for t in [*opts.trees, "numpy"]}
    loaded: dict[str, int] = {}
    for _ in range(opts.runs):
        for tree in opts.trees:
            dt, loaded[tree] = once(tree, "shardsim")
            times[tree].append(dt)
        times["numpy"].append(once(opts.trees[0], "numpy")[0])
    print("\n| tree | median (ms) | min (ms) | shardsim modules loaded |\n|---|---:|---:|---:|")
    for tree, ts in times.items():
        label = "`import numpy` alone" if tree == "numpy" else f"`{tree}`"
        mods = "" if tree == "numpy" else str(loaded[tree])
        print(f"| {label} | {statistics.median(ts) * 1e3:.1f} | {min(ts) * 1e3:.1f} | {mods} |")


if __name__ == "__main__":
    main()
