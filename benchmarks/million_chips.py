"""An exact fsdp_tp forward+backward on 1024x1024 = 1,048,576 chips against one device.

B = D = 1024, F = 4096, float32, ReLU; ``Mesh(X=1024, Y=1024)``, with ``Mesh(X=256, Y=256)``
(65,536 chips) as the comparison point. Each case runs in its own subprocess so its peak
host memory (``ru_maxrss``) is its own; inside, each round times one forward+backward and
we report the median. Targets: within 2x the single-device time and host memory.
Run by hand: ``python benchmarks/million_chips.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _timing import cpu
from schemes import bare, single_device

import shardsim as ss
from shardsim import mlp

B, D, F = 1024, 1024, 4096
CASES = {"single-device": None, "fsdp_tp 256x256": (256, 256), "fsdp_tp 1024x1024": (1024, 1024)}


def one_case(case: str, repeats: int) -> dict[str, float]:
    """Median seconds of ``repeats`` steps of ``case`` and this process's peak host memory."""
    rng = np.random.default_rng(0)
    params = mlp.init(D, F, seed=0, dtype="float32")
    x = rng.standard_normal((B, D)).astype(np.float32)
    dout = rng.standard_normal((B, D)).astype(np.float32)
    mesh = CASES[case]
    if mesh is None:

        def step() -> None:
            single_device(params, x, dout)
    else:
        step = bare("fsdp_tp", params, x, dout, mesh=ss.Mesh(X=mesh[0], Y=mesh[1]))
    step()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {"median_s": float(np.median(times)), "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--case", choices=list(CASES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(one_case(args.case, args.repeats)))
        return
    here = Path(__file__).parent
    results = {}
    for case in CASES:
        out = subprocess.run(
            [sys.executable, str(here / "million_chips.py"), "--case", case, "--repeats", str(args.repeats)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        results[case] = json.loads(out.splitlines()[-1])
    base = results["single-device"]
    print(f"{cpu()}, numpy {np.__version__}, {args.repeats} rounds")
    print(f"{'case':<20}{'median ms':>10}{'x time':>8}{'peak RSS MiB':>14}{'x memory':>10}")
    for case, r in results.items():
        print(
            f"{case:<20}{r['median_s'] * 1e3:>10.1f}{r['median_s'] / base['median_s']:>8.2f}"
            f"{r['maxrss_kib'] / 1024:>14.1f}{r['maxrss_kib'] / base['maxrss_kib']:>10.2f}"
        )


if __name__ == "__main__":
    main()
