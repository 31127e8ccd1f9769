"""The planner's search of Llama 3 405B on 16,384 H100s: candidates, traces and wall time.

``shardsim.planner.plan("llama3-405b", "h100", 16384, 16M tokens, seq 8192)`` with no
constraints, run ``--repeats`` times, each from empty caches (the traced layer programs and
the pipeline schedules are rebuilt every run, as in a fresh process). Reports the candidates
considered, the distinct layer programs traced, the plans kept, the best plan and where the
published one (TP 8, PP 16, CP 1, DP 128) ranks, and the median wall time (target: 10 s).
Run by hand: ``python benchmarks/planner.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _timing import cpu

from shardsim.planner import bounds, evaluate, plan


def search() -> object:
    bounds._SCHEDULES.clear()  # every run from empty caches
    bounds._IN_FLIGHT.clear()
    evaluate._COMPILED.clear()
    return plan("llama3-405b", "h100", 16384, 16 * 2**20, 8192, progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    times, table = [], None
    for _ in range(args.repeats):
        start = time.perf_counter()
        table = search()
        times.append(time.perf_counter() - start)
    assert table is not None
    published = table.find(tp=8, pp=16, cp=1, dp=128)
    print(f"machine: {cpu()}, load average {os.getloadavg()[0]:.1f}; {datetime.date.today()}")
    print(f"candidates considered {table.considered}, layer programs traced {table.traced}, plans kept {table.kept}")
    kinds = collections.Counter(r.kind for r in table.rejected)
    print(
        "rejected (memory, bound: by a lower bound, untraced; oom, slower: measured): "
        + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    )
    print(f"best: {table.best.plan} (mb={table.best.candidate.micro}), {table.best.step_s:.3f} s per step")
    if published:
        print(f"published TP 8, PP 16, CP 1, DP 128: {published[0].plan}, {table.slowdown(published[0]):.1%} slower")
    print(f"wall time: median {statistics.median(times):.2f} s, min {min(times):.2f} s, max {max(times):.2f} s "
          f"over {args.repeats} runs (target 10 s)")  # fmt: skip


if __name__ == "__main__":
    main()
