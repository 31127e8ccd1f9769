"""``shardsim.training.model_memory`` on Llama 3 405B (126 layers): carried on from a few layers and traced in full.

Each case is one shape-only training step of the model (``policy`` default: bf16 weights,
float32 master weights and Adam moments), sequence 8192; the figures the two ways give must
be equal (the script checks it). Medians of interleaved runs.

Run by hand: ``python benchmarks/model_memory.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import datetime
import platform

from _timing import cpu, medians

from shardsim.training import model_memory

CASES = [
    ("dp=8,zero=1,tp=8", 16),
    ("dp=16,zero=3,tp=8", 16),
    ("dp=2,zero=1,tp=8,pp=7,microbatches=14", 28),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{datetime.date.today()}, {cpu()}, Python {platform.python_version()}")
    for plan, batch in CASES:
        carried = model_memory("llama3-405b", plan, batch=batch, seq=8192)
        full = model_memory("llama3-405b", plan, batch=batch, seq=8192, full=True)
        assert carried == full, plan
        fast, slow = medians(
            [
                lambda: model_memory("llama3-405b", plan, batch=batch, seq=8192),  # noqa: B023
                lambda: model_memory("llama3-405b", plan, batch=batch, seq=8192, full=True),  # noqa: B023
            ],
            args.repeats,
            warmups=0,
        )
        total = carried[0]["total"] / 1e9
        print(f"{plan:45s} carried {fast:6.2f} s   full trace {slow:6.2f} s   peak {total:8.1f} GB per chip")


if __name__ == "__main__":
    main()
