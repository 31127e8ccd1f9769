"""One transformer block's forward+backward under tensor parallelism against the single-device reference.

4,096 tokens (B=8, S=512), d_model 1024, 16 heads, d_ff 4096, LayerNorm, GELU, float32; a
vocabulary of 256 so that the embedding and the LM head around the block cost little. The
contenders: ``shardsim.models.reference.loss_and_grads`` (one device) and
``run_model`` under ``tp=4`` (Megatron TP on 4 chips) and ``tp=4,sp``, each checked once
against the reference before timing. Rounds interleave the contenders; we report medians.
Run by hand: ``python benchmarks/transformer.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import datetime

import numpy as np
from _timing import cpu, medians

from shardsim.models import TransformerConfig, reference
from shardsim.plans import Plan
from shardsim.transformer.run import run_model

B, S = 8, 512
CFG = TransformerConfig(layers=1, d_model=1024, heads=16, d_ff=4096, vocab=256, seq=S)
PLANS = ("tp=4", "tp=4,sp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    params = reference.init(CFG, seed=0, dtype="float32")
    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, CFG.vocab, (B, S)), rng.integers(0, CFG.vocab, (B, S))
    want, grads = reference.loss_and_grads(CFG, params, tokens, targets)
    for text in PLANS:
        plan = Plan.parse(text)
        got = run_model(CFG, plan, plan.mesh(), params, tokens, targets)
        assert got.grads is not None and abs(got.loss - want) < 1e-4 * abs(want)  # type: ignore[operator]
        assert all(np.allclose(got.grads[k], grads[k], rtol=1e-3, atol=1e-5 * np.abs(grads[k]).max()) for k in grads)

    def single() -> None:
        reference.loss_and_grads(CFG, params, tokens, targets)

    def sharded(text: str):
        plan = Plan.parse(text)
        mesh = plan.mesh()
        return lambda: run_model(CFG, plan, mesh, params, tokens, targets)

    times = medians([single, *(sharded(t) for t in PLANS)], repeats=args.repeats)
    print(f"{cpu()}; {datetime.date.today()}; B={B}, S={S}, d_model 1024, 16 heads, float32")
    print("| contender | mesh | median (ms) | ratio | target <= 1.3x |")
    print("|---|---|---:|---:|---|")
    print(f"| single-device reference | 1 device | {times[0] * 1e3:.0f} | 1.00 | - |")
    for text, t in zip(PLANS, times[1:]):
        ratio = t / times[0]
        mesh = Plan.parse(text).mesh()
        print(f"| run_model `{text}` | {mesh} | {t * 1e3:.0f} | {ratio:.2f} | {'met' if ratio <= 1.3 else 'MISSED'} |")


if __name__ == "__main__":
    main()
