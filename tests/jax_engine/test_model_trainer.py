"""``Trainer(cfg, plan, ..., engine="jax")``: a transformer's whole training step jitted, the NumPy trainer's steps.

Against the NumPy engine's transformer trainer from the same weights: the losses of three
steps, the weights and moments after them, the same trace (every event of every phase, the
optimizer's AllGathers included, with their bytes), layouts, stored activations and memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from shardsim import EngineError  # noqa: E402
from shardsim.models import TransformerConfig, reference  # noqa: E402
from shardsim.plans import Plan  # noqa: E402
from shardsim.specs import to_partition_spec  # noqa: E402
from shardsim.training import SGD, Adam, AdamW, Trainer  # noqa: E402

pytestmark = pytest.mark.xdist_group("jax-model")

LLAMA = dict(layers=2, d_model=16, heads=4, d_ff=32, vocab=16, seq=8, kv_heads=2, mlp="swiglu", norm="rmsnorm")
CASES = [
    ("dp=2", SGD(lr=0.1, momentum=0.9)),
    ("dp=4,zero=1", Adam(lr=0.01)),
    ("dp=2,zero=2,tp=2", AdamW(lr=0.01, weight_decay=0.1)),
    ("dp=2,zero=3,tp=2,sp", Adam(lr=0.01)),
    ("tp=4,recompute=full", SGD(lr=0.1)),
    ("dp=2,ep=2,zero=1", Adam(lr=0.01)),  # with the experts of MOE
    ("dp=2,zero=2,cp=2,tp=2,sp", Adam(lr=0.01)),
]
MOE = dict(LLAMA, mlp="gelu", experts=4, top_k=2)


def tokens(cfg: TransformerConfig, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab, (8, cfg.seq)), rng.integers(0, cfg.vocab, (8, cfg.seq))


def same_steps(got: Trainer, want: Trainer, tok: np.ndarray, tgt: np.ndarray, tol: float) -> Any:
    for _ in range(3):
        a, b = got.step(tok, tgt), want.step(tok, tgt)
        assert a.loss == pytest.approx(b.loss, rel=tol, abs=tol)
        assert a.step == b.step
    for k, v in want.params_global().items():
        np.testing.assert_allclose(got.params_global()[k], v, rtol=tol, atol=tol * float(np.abs(v).max()), err_msg=k)
    for slot, ws in want.moments_global().items():
        for k, v in ws.items():
            np.testing.assert_allclose(got.moments_global()[slot][k], v, rtol=tol, atol=tol * float(np.abs(v).max()))
    return a, b


@pytest.mark.parametrize(("spec", "opt"), CASES, ids=[s for s, _ in CASES])
def test_jax_trainer_equals_numpy_trainer(spec: str, opt: object) -> None:
    cfg = TransformerConfig(**(MOE if "ep=" in spec else LLAMA))
    p, plan = reference.init(cfg, seed=1, dtype="float64"), Plan.parse(spec)
    got = Trainer(cfg, plan, plan.mesh(), p, opt, engine="jax")
    want = Trainer(cfg, plan, plan.mesh(), p, opt)
    a, b = same_steps(got, want, *tokens(cfg), 1e-9)  # Adam divides by sqrt(v): last-bit differences grow
    strip = lambda t: [(e.op, e.axes, e.phase, e.label, e.sent_bytes, e.flops) for e in t.events]  # noqa: E731
    assert strip(a.trace) == strip(b.trace)
    assert a.layouts == b.layouts
    np.testing.assert_array_equal(a.stored_activations, b.stored_activations)
    for c in set(b.memory) - {"params"}:  # ZeRO-1/2's new slice and its gathered weight overlap differently
        np.testing.assert_array_equal(a.memory[c], b.memory[c], err_msg=c)
    for c, v in b.model_state.items():
        np.testing.assert_array_equal(a.model_state[c], v, err_msg=c)


def test_mixed_precision_masters_in_the_states_layout() -> None:
    cfg = TransformerConfig(**LLAMA)
    p, plan = reference.init(cfg, seed=1, dtype="float32"), Plan.parse("dp=2,zero=1,tp=2,precision=bf16")
    got = Trainer(cfg, plan, plan.mesh(), p, SGD(lr=0.1), engine="jax")
    want = Trainer(cfg, plan, plan.mesh(), p, SGD(lr=0.1))
    a, b = same_steps(got, want, *tokens(cfg), 2e-2)  # bfloat16 compute: its rounding, in another order
    assert got.master["embed"].layout == want.master["embed"].layout and got.master["embed"].dtype == np.float32
    assert a.trace.collectives("optimizer") == b.trace.collectives("optimizer")
    np.testing.assert_array_equal(a.memory["total"], b.memory["total"])


def test_dropout_draws_each_steps_masks() -> None:
    cfg = TransformerConfig(**{**LLAMA, "dropout": 0.1})
    p, plan = reference.init(cfg, seed=1, dtype="float64"), Plan.parse("dp=2,tp=2,attention=standard")
    got = Trainer(cfg, plan, plan.mesh(), p, SGD(lr=0.1), engine="jax", dropout_seed=7)
    want = Trainer(cfg, plan, plan.mesh(), p, SGD(lr=0.1), dropout_seed=7)
    same_steps(got, want, *tokens(cfg), 1e-12)


def test_a_pipeline_is_refused_when_built() -> None:
    cfg = TransformerConfig(**LLAMA)
    with pytest.raises(EngineError, match=r"pipeline parallelism \(pp > 1\) yet.*engines.jax.run_model"):
        Trainer(cfg, "dp=2,pp=2", Plan(dp=2, pp=2).mesh(), reference.init(cfg), "sgd", engine="jax")


@pytest.mark.parametrize("spec", ["dp=2,zero=1,tp=2", "dp=2,zero=3,cp=2"])
def test_compile_step_is_the_trainers_step_in_a_jax_loop(spec: str) -> None:
    from shardsim.engines import jax as engine

    cfg = TransformerConfig(**LLAMA)
    p, plan = reference.init(cfg, seed=1, dtype="float64"), Plan.parse(spec)
    tok, tgt = tokens(cfg)
    step, state, factors = engine.compile_step(cfg, plan, plan.mesh(), Adam(lr=0.01), p, tok, tgt)
    want = Trainer(cfg, plan, plan.mesh(), p, Adam(lr=0.01))
    for n in (1, 2, 3):
        state, loss = step(state, tok, tgt, factors(n))
        assert float(loss) == pytest.approx(want.step(tok, tgt).loss, abs=1e-12)
    weights = state[0]
    for k, v in want.params_global().items():
        assert weights[k].sharding.spec == to_partition_spec(want.params[k].layout), k
        np.testing.assert_allclose(np.asarray(weights[k]), v, rtol=1e-9, atol=1e-9 * float(np.abs(v).max()), err_msg=k)
