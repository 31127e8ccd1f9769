"""The transformer's step under a plan on the JAX engine against the same step on the stacked NumPy engine.

A Llama-style model (4 layers, d_model 256, 8 heads, 4 KV heads, SwiGLU d_ff 1024, RMSNorm,
RoPE, vocabulary 2048, sequence 128), batch 16, float32, forward and backward, on 8 fake CPU
devices. The JAX contender is ``shardsim.engines.jax.compile_model``'s function, jitted and
compiled before timing; the NumPy one is ``shardsim.run_model`` (which also records its
trace and ledger on every call). Each round runs every contender once, in turn; medians of
one run. The two are checked equal once. Run by hand: ``python benchmarks/jax_model.py
[--repeats N]``.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from _timing import cpu, medians

import shardsim as ss
from shardsim.engines import jax as engine
from shardsim.models import TransformerConfig, reference

CFG = TransformerConfig(layers=4, d_model=256, heads=8, d_ff=1024, vocab=2048, seq=128, kv_heads=4,
                        mlp="swiglu", norm="rmsnorm", position="rope")  # fmt: skip
BATCH = 16
PLANS = ("dp=8", "dp=2,tp=4,sp", "dp=2,zero=3,tp=2,sp,cp=2", "dp=2,tp=2,pp=2,microbatches=4")


def contenders(spec: str, params: dict[str, np.ndarray], tokens: np.ndarray) -> list[Callable[[], Any]]:
    """The JAX engine's compiled step and the NumPy engine's run of plan ``spec``; checked equal once."""
    plan = ss.Plan.parse(spec)
    fn, args = engine.compile_model(CFG, plan, plan.mesh(), params, tokens, tokens)
    compiled = fn.lower(*args).compile()
    loss, _ = compiled(*args)
    want = ss.run_model(CFG, plan, plan.mesh(), params, tokens, tokens)
    assert abs(float(loss) - want.loss) < 1e-4 * abs(want.loss), (spec, float(loss), want.loss)
    return [
        lambda: jax.block_until_ready(compiled(*args)),
        lambda: ss.run_model(CFG, plan, plan.mesh(), params, tokens, tokens),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    params = reference.init(CFG, seed=0, dtype="float32")
    tokens = np.random.default_rng(0).integers(0, CFG.vocab, (BATCH, CFG.seq)).astype(np.int32)
    fns: list[Callable[[], Any]] = []
    for spec in PLANS:
        fns += contenders(spec, params, tokens)
    times = medians(fns, args.repeats, alternate=True)
    print(f"{cpu()}, jax {jax.__version__}, 8 CPU devices, {args.repeats} rounds")
    print(f"{'plan':<34}{'jax ms':>10}{'numpy ms':>12}{'numpy / jax':>13}")
    for i, spec in enumerate(PLANS):
        ours, numpy_ = times[2 * i], times[2 * i + 1]
        print(f"{spec:<34}{ours * 1e3:>10.1f}{numpy_ * 1e3:>12.1f}{numpy_ / ours:>13.2f}")


if __name__ == "__main__":
    main()
