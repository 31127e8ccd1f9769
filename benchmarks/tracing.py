"""Shape-only tracing: one training step of a transformer on ``ShapeDtype`` weights, traced.

Every answer about a real model (an estimate's memory, the planner, the calibration) runs
such steps: no arithmetic, but every op records its trace event and books its bytes in the
per-chip ledger, so this is the cost of that bookkeeping. Each case builds a
:class:`~shardsim.training.Trainer` on a fresh mesh (bf16 weights, Adam) and runs one step,
as :func:`shardsim.training.traced.trained_step` does on a cache miss. Medians of
interleaved runs.

Run by hand: ``python benchmarks/tracing.py [--repeats N] [--profile CASE]``; to compare two
trees, run it once with each on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import platform
import pstats
from collections.abc import Callable

from _timing import cpu, medians

import shardsim as ss
from shardsim.models import get
from shardsim.plans import Plan
from shardsim.training import Precision, Trainer

# (name, preset, layers, plan, (sequences, seq))
CASES = [
    ("llama3-8b x4, dp=2,tp=2", "llama3-8b", 4, "dp=2,tp=2", (4, 8192)),
    ("llama3-8b x4, pp=2 of 8 microbatches, full recompute", "llama3-8b", 4,
     "tp=2,pp=2,microbatches=8,recompute=full", (8, 8192)),
]  # fmt: skip


def step(preset: str, layers: int, plan_text: str, tokens: tuple[int, int]) -> Callable[[], object]:
    """One shape-only training step of ``preset`` scaled to ``layers`` under ``plan_text``."""
    cfg, plan, precision = get(preset).scaled(layers=layers), Plan.parse(plan_text), Precision.of("bf16")

    def run() -> object:
        params = {k: ss.ShapeDtype(s, precision.compute) for k, s in cfg.param_shapes().items()}
        tok = ss.ShapeDtype(tokens, "int32")
        return Trainer(cfg, plan, plan.mesh(), params, "adam", precision=precision).step(tok, tok)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile", type=int, metavar="CASE", help="profile case CASE (0, 1, ...) with cProfile")
    args = parser.parse_args()
    runs = [step(*case[1:]) for case in CASES]
    if args.profile is not None:
        runs[args.profile]()
        prof = cProfile.Profile()
        prof.runcall(runs[args.profile])
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    times = medians(runs, args.repeats, alternate=True)
    print(f"{datetime.date.today()}, {cpu()}, Python {platform.python_version()}, {args.repeats} rounds")
    print("| case | events | median (ms) |")
    print("|---|---:|---:|")
    for (name, *_), run, t in zip(CASES, runs, times):
        events = len(run().trace.events)  # type: ignore[attr-defined]
        print(f"| {name} | {events} | {t * 1e3:.0f} |")


if __name__ == "__main__":
    main()
