"""How long ``estimate(model, plan, ...)`` takes: cold (nothing cached), warm, and against tracing whole.

Cases: Llama 3 405B (126 layers) under ``dp=64,tp=8,zero=1`` on 512 H100s (no pipeline) and
under ``dp=8,tp=8,pp=7,zero=1,microbatches=14`` on 448 (a pipeline); Llama 3 70B under 12
plans a planner might try (dp x tp x zero on 256 chips). "cold" clears every cache first;
"warm" is the same call again; "program" and "memory" are the cold whole-model program
(``cost.model_program``) and the training step's ledger (``training.model_memory``) alone;
"traced whole" is ``run_model``'s trace of every layer, what the program replaces. Medians
of ``--repeats`` rounds. Run by hand: ``python benchmarks/model_estimate.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Callable

import numpy as np
from _timing import cpu

from shardsim.cost import estimate, model_program
from shardsim.cost import model_steps as steps
from shardsim.models import TransformerConfig, get
from shardsim.plans import Plan

CASES = [
    ("llama3-405b", "dp=64,tp=8,zero=1", 64 * 8192),
    ("llama3-405b", "dp=8,tp=8,pp=7,zero=1,microbatches=14", 112 * 8192),
]
PLANNER = [f"dp={256 // tp},tp={tp},zero={z}" for tp in (1, 2, 4, 8) for z in (0, 1, 3)]


def clear() -> None:
    model_program.cache_clear()
    steps._program.cache_clear()
    steps._traced.cache_clear()
    steps._memory.cache_clear()


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(cfg: TransformerConfig, p: Plan, tokens: int, repeats: int) -> dict[str, float]:
    """Median seconds of each column for one case."""
    seqs = tokens // 8192
    rows: dict[str, list[float]] = {k: [] for k in ("cold", "warm", "program", "memory", "whole")}
    for _ in range(repeats):
        clear()
        rows["cold"].append(timed(lambda: estimate(cfg, p, "h100", batch_tokens=tokens, seq=8192)))
        rows["warm"].append(timed(lambda: estimate(cfg, p, "h100", batch_tokens=tokens, seq=8192)))
        clear()
        rows["program"].append(timed(lambda: model_program(cfg, p, tokens, 8192)))
        rows["memory"].append(timed(lambda: steps.model_memory_ledger(cfg, p, seqs, 8192)))
    rows["whole"].append(timed(lambda: steps.trace_model(cfg, p, seqs, 8192)))
    return {k: float(np.median(v)) for k, v in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{cpu()}, NumPy {np.__version__}, {datetime.date.today()}")
    print(f"{'case':<55}{'cold s':>9}{'warm s':>9}{'program s':>11}{'memory s':>10}{'traced whole s':>16}")
    for name, plan, tokens in CASES:
        med = measure(get(name), Plan.parse(plan), tokens, args.repeats)
        print(
            f"{name + ' ' + plan:<55}{med['cold']:>9.2f}{med['warm']:>9.2f}{med['program']:>11.2f}"
            f"{med['memory']:>10.2f}{med['whole']:>16.2f}"
        )
    clear()
    cfg = get("llama3-70b")
    start = time.perf_counter()
    for plan in PLANNER:
        estimate(cfg, plan, "h100", batch_tokens=256 * 8192, seq=8192)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    for plan in PLANNER:
        estimate(cfg, plan, "h100", batch_tokens=256 * 8192, seq=8192)
    print(f"llama3-70b, {len(PLANNER)} plans on 256 H100s: {cold:.2f} s cold, {time.perf_counter() - start:.3f} s warm")


if __name__ == "__main__":
    main()
