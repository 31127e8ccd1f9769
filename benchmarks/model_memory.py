"""``shardsim.training.model_memory`` on Llama 3 405B (126 layers): as answered and traced in full.

Each case is one shape-only training step of the model (``policy`` default: bf16 weights,
float32 master weights and Adam moments), sequence 8192. Without a pipeline the answer is
carried on from a few layers and equals the full trace; with one it is the steady state of a
two-stage probe, equal to the full trace in the weights, gradients and optimizer state and
within 0.5% in the activations and the total (the script checks both). Each timed call starts
from empty caches. Medians of interleaved runs.

Run by hand: ``python benchmarks/model_memory.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import datetime
import platform

from _timing import cpu, medians

from shardsim.training import model_memory, stage_memory
from shardsim.training.traced import clear_steps

CASES = [
    ("dp=8,zero=1,tp=8", 16),
    ("dp=16,zero=3,tp=8", 16),
    ("dp=2,zero=1,tp=8,pp=7,microbatches=14", 28),
    ("dp=4,zero=1,tp=8,pp=2,microbatches=32", 128),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{datetime.date.today()}, {cpu()}, Python {platform.python_version()}")
    for plan, batch in CASES:
        carried = model_memory("llama3-405b", plan, batch=batch, seq=8192)
        full = model_memory("llama3-405b", plan, batch=batch, seq=8192, full=True)
        assert carried[1] == full[1], plan
        for c, b in full[0].items():
            assert abs(carried[0][c] - b) <= (0 if c in ("params", "grads", "optimizer") else 0.005 * b), (plan, c)

        def cold(full: bool) -> object:
            clear_steps()
            stage_memory._memory.cache_clear()
            return model_memory("llama3-405b", plan, batch=batch, seq=8192, full=full)  # noqa: B023

        fast, slow = medians(
            [lambda: cold(False), lambda: cold(True)],
            args.repeats,
            warmups=0,
        )
        total = carried[0]["total"] / 1e9
        print(f"{plan:45s} carried {fast:6.2f} s   full trace {slow:6.2f} s   peak {total:8.1f} GB per chip")


if __name__ == "__main__":
    main()
