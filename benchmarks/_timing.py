"""What the benchmark scripts share: the machine they ran on and interleaved median timings."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence


def cpu() -> str:
    """CPU model (lscpu) and core count."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        model = platform.processor() or "unknown CPU"
    return f"{model}, {os.cpu_count()} cores"


def medians(
    fns: Sequence[Callable[[], object]], repeats: int, warmups: int = 2, *, alternate: bool = False
) -> list[float]:
    """Median wall time of each of ``fns``, run in turn ``repeats`` times after ``warmups`` calls each.

    Interleaving the runs spreads any background load over all of them alike, so their
    ratios stay fair on a busy machine. With ``alternate`` every other round runs ``fns`` in
    reverse order, so no contender always runs right after the same other one (a call can
    leave work behind, such as freeing its results, that the next call pays for).
    """
    for fn in fns:
        for _ in range(warmups):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for r in range(repeats):
        order = list(zip(fns, times))
        for fn, ts in reversed(order) if alternate and r % 2 else order:
            start = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - start)
    return [statistics.median(ts) for ts in times]
