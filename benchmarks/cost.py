"""Speed of the cost model: an 80-layer, 1,024-chip estimate and a 50 x 4 batch sweep.

Run by hand (not by pytest):  python benchmarks/cost.py [--repeats 5] [--append docs/benchmarks.md]

What it measures
- ``shardsim.cost.estimate`` of one training step, 80 layers, d_model 8192, d_ff 32768,
  4,096 tokens per chip, on 1,024 TPU v5p chips: every scheme's shape-only program at full
  size, costed and scheduled on the time line. Target: under 1 s each.
- ``shardsim.cost.sweep`` of 50 per-chip batch sizes (64 to 65,536, log-spaced) for the four
  schemes on 256 chips, FSDP+TP searching every X x Y split at each batch. Target: under 30 s.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

try:
    import shardsim  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np
from _timing import cpu, medians

from shardsim import Mesh
from shardsim.cli.estimate import parse_batches
from shardsim.cost import estimate, sweep

D, F, LAYERS, PER_CHIP = 8192, 32768, 80, 4096
MESHES = {"ddp": Mesh(X=1024), "fsdp": Mesh(X=1024), "tp": Mesh(Y=1024), "fsdp_tp": Mesh(X=64, Y=16)}


def machine() -> str:
    """CPU model and cores, Python and NumPy versions."""
    return f"{cpu()}, Python {platform.python_version()}, NumPy {np.__version__}"


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``repeats`` calls."""
    return medians([fn], repeats, warmups=0)[0]


def met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--append", help="append the results as a 'Cost model' section to this Markdown file")
    args = parser.parse_args()

    rows = []
    for scheme, mesh in MESHES.items():
        batch = PER_CHIP * mesh.size
        est = estimate(scheme, mesh, "tpu-v5p", batch, D, F, layers=LAYERS)
        seconds = timed(
            lambda s=scheme, m=mesh, b=batch: estimate(s, m, "tpu-v5p", b, D, F, layers=LAYERS), args.repeats
        )
        rows.append((scheme, mesh, len(est.timeline.bars), seconds, est))
        print(f"estimate {scheme:<8} {mesh!s:<18} {len(est.timeline.bars):>5} events  {seconds * 1e3:8.1f} ms")

    batches = parse_batches("64:65536:50")
    assert len(batches) == 50
    t = time.perf_counter()
    results = sweep(["ddp", "fsdp", "tp", "fsdp_tp"], "tpu-v5p", batches, D, F, chips=256)
    sweep_s = time.perf_counter() - t
    print(f"sweep 50 batches x 4 schemes on 256 chips ({len(results)} estimates): {sweep_s:.2f} s")

    if args.append:
        lines = [
            "",
            "## Cost model",
            "",
            "```bash",
            f"python benchmarks/cost.py --repeats {args.repeats}",
            "```",
            "",
            f"Machine: {machine()}; run on {datetime.date.today().isoformat()}.",
            "",
            f"**What is measured.** `shardsim.cost.estimate` of one training step of {LAYERS} layers, d_model {D}, "
            f"d_ff {F}, {PER_CHIP:,} tokens per chip, on 1,024 TPU v5p chips: the scheme's shape-only "
            f"{LAYERS}-layer program, every event costed and scheduled on the time line. Median of "
            f"{args.repeats} runs. Then `shardsim.cost.sweep` of 50 per-chip batches (64 to 65,536, log-spaced) "
            "x 4 schemes on 256 chips, FSDP+TP trying every X x Y split at each batch, one layer, one run.",
            "",
            "| scheme | mesh | events | estimate | target < 1 s | modelled step | modelled MFU |",
            "|---|---|---:|---:|---|---:|---:|",
        ]
        for scheme, mesh, events, seconds, est in rows:
            took, step = f"{seconds * 1e3:.0f} ms", f"{est.step_s * 1e3:.0f} ms"
            lines.append(f"| {scheme} | `{mesh}` | {events} | {took} | {met(seconds < 1)} | {step} | {est.mfu:.0%} |")
        lines += [
            "",
            f"Sweep, {len(results)} estimates: {sweep_s:.2f} s (target < 30 s: {met(sweep_s < 30)}).",
            "",
        ]
        with open(args.append, "a", encoding="utf-8") as f:
            f.write("\n".join(lines))
        print(f"appended to {args.append}")


if __name__ == "__main__":
    main()
