"""Every transformer plan of the support matrix gives the single-device loss and gradients on JAX
devices, and its jaxpr's collectives are the stacked engine's trace: each primitive, its mesh
axes and its bytes per chip, in program order."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from test_jaxpr import LAX_TO_SHARDSIM, equations, sent_per_chip  # noqa: E402

import shardsim  # noqa: E402
import support_matrix as support  # noqa: E402
from shardsim.engines import jax as engine  # noqa: E402
from shardsim.models import TransformerConfig, reference  # noqa: E402
from shardsim.plans import Plan  # noqa: E402

pytestmark = pytest.mark.xdist_group("jax-model")


@pytest.mark.parametrize("spec", support.PLANS)
def test_support_plan_on_jax_is_its_trace(spec: str) -> None:
    plan = Plan.parse(spec)
    experts = {"experts": 4, "top_k": 2} if plan.ep > 1 else {}
    layers = 2 * plan.pp * plan.virtual_stages
    cfg = TransformerConfig(layers=layers, d_model=8, heads=2, d_ff=16, vocab=8, seq=8, **experts)
    p = reference.init(cfg, seed=3, dtype="float64")
    rng = np.random.default_rng(3)
    tok, tgt = (rng.integers(0, cfg.vocab, (8, cfg.seq)) for _ in range(2))
    fn, args = engine.compile_model(cfg, plan, plan.mesh(), p, tok, tgt)
    loss, grads = fn(*args)
    want_loss, want = reference.loss_and_grads(cfg, p, tok, tgt)
    assert float(loss) == pytest.approx(want_loss, abs=1e-12)
    for k in p:
        np.testing.assert_allclose(np.asarray(grads[k]), want[k], atol=1e-12, err_msg=k)
    trace = shardsim.run_model(cfg, plan, plan.mesh(), p, tok, tgt).trace
    eqns = [e for e in equations(jax.make_jaxpr(fn)(*args).jaxpr) if e.primitive.name in LAX_TO_SHARDSIM]
    got = [(LAX_TO_SHARDSIM[e.primitive.name], tuple(e.params.get("axis_name", e.params.get("axes")))) for e in eqns]
    assert got == trace.collectives()
    mesh = plan.mesh()
    events = [e for e in trace.events if e.op in LAX_TO_SHARDSIM.values()]
    for eqn, (op, axes), event in zip(eqns, got, events):
        n = int(np.prod([mesh.axis_size(a) for a in axes]))
        assert sent_per_chip(op, eqn, n) == event.sent_bytes, (op, axes, event.label)
