"""A campaign of hostile inputs against the core's public API, run by hand.

Every public function of the core (meshes, layouts, shard, the collectives, reshard, cast,
the operators, indexing, faults) is called with arguments that are wrong-typed, empty,
negative, zero-size, huge or non-finite: first every value of ``tests/hostile_inputs.HOSTILE``
(every pair, for the two-argument calls), then random values (integers across 64 bits, floats
across the exponent range, strings of layout characters, nested tuples). Each outcome is
classified as in the property tests: NumPy's answer, a documented ``ShardsimError``, a wrong
value, an undocumented exception, or a hang (a call still running after 10 s).

    PYTHONPATH=src python benchmarks/campaign_api.py            # --random 40000 --seed 0

It prints the machine line and a table per class for ``docs/reliability.md``; any wrong value,
undocumented exception or hang is listed with its arguments.
"""

from __future__ import annotations

import argparse
import itertools
import math
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import cpu

from hostile_inputs import CASES, HOSTILE, run_case

OUTCOMES = ("ok", "documented", "wrong", "undocumented", "hang")
CHARS = "XYBDU_{},[] αZ0"


class _HangError(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _HangError


def random_value(rng: np.random.Generator) -> Any:
    """One hostile value of a random kind."""
    kind = rng.integers(8)
    if kind == 0:
        return int(rng.integers(-(2**63), 2**63 - 1, dtype=np.int64)) >> int(rng.integers(0, 63))
    if kind == 1:
        return float(rng.choice([-1.0, 1.0]) * 10.0 ** rng.uniform(-320, 308))
    if kind == 2:
        return "".join(rng.choice(list(CHARS), size=int(rng.integers(0, 9))))
    if kind == 3:
        return tuple(random_value(rng) for _ in range(int(rng.integers(0, 3))))
    if kind == 4:
        return [(int(rng.integers(-2, 3)), int(rng.integers(-2, 3))) for _ in range(int(rng.integers(0, 3)))]
    if kind == 5:
        return np.zeros(tuple(int(n) for n in rng.integers(0, 3, size=int(rng.integers(0, 3)))))
    if kind == 6:
        return rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 5e-324], dtype=object))
    return HOSTILE[int(rng.integers(len(HOSTILE)))]


def one(name: str, args: list[Any]) -> str:
    signal.alarm(10)
    try:
        return run_case(name, args)
    except _HangError:
        return "hang"
    finally:
        signal.alarm(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=int, default=40000, help="random inputs after the exhaustive ones")
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args()
    signal.signal(signal.SIGALRM, _alarm)
    print(f"Machine: {cpu()}, Python {sys.version.split()[0]}, NumPy {np.__version__}; {time.strftime('%Y-%m-%d')}")
    counts: dict[str, Counter[str]] = {name: Counter() for name in CASES}
    bad: list[tuple[str, str, list[Any]]] = []
    start = time.perf_counter()

    def run(name: str, args: list[Any]) -> None:
        outcome = one(name, args)
        counts[name][outcome] += 1
        if outcome in ("wrong", "undocumented", "hang") and len(bad) < 200:
            bad.append((name, outcome, args))

    for name, (n, _, _) in CASES.items():  # every hostile value, every pair for two arguments
        for args in itertools.product(HOSTILE, repeat=n):
            run(name, list(args))
    rng = np.random.default_rng(opts.seed)
    names = sorted(CASES)
    for _ in range(opts.random):
        name = names[int(rng.integers(len(names)))]
        run(name, [random_value(rng) for _ in range(CASES[name][0])])
    seconds = time.perf_counter() - start

    total = Counter[str]()
    print(f"\n| call | inputs | {' | '.join(OUTCOMES)} |\n|---|---:|" + "---:|" * len(OUTCOMES))
    for name in CASES:
        c = counts[name]
        total.update(c)
        print(f"| `{name}` | {sum(c.values()):,} | " + " | ".join(f"{c[o]:,}" for o in OUTCOMES) + " |")
    print(f"| **all** | **{sum(total.values()):,}** | " + " | ".join(f"**{total[o]:,}**" for o in OUTCOMES) + " |")
    print(
        f"\n{sum(total.values()):,} inputs in {seconds:.0f} s ({math.floor(sum(total.values()) / seconds)} per second)"
    )
    for name, outcome, args in bad:
        print(f"{outcome}: {name} {args!r}")


if __name__ == "__main__":
    main()
