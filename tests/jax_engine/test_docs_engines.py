"""The code on ``docs/engines.md`` runs, one block after the other, as a reader would run it."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")

from doc_blocks import python_blocks, run_blocks


def test_engines_page_runs() -> None:
    assert len(python_blocks("engines.md")) == 5
    ns = run_blocks("engines.md")
    assert ns["t"].step_count == 1 and ns["out"].shape == (8, 8)
    assert ns["loss"].shape == () and ns["n"] == 3


def test_the_pages_trace_beside_its_jaxpr_is_the_programs() -> None:
    import numpy as np
    from test_jaxpr import LAX_TO_SHARDSIM, equations

    import shardsim
    from doc_blocks import DOCS
    from shardsim.engines import jax as engine
    from shardsim.models import TransformerConfig, reference

    jax = pytest.importorskip("jax")
    cfg = TransformerConfig(layers=1, d_model=16, heads=4, d_ff=32, vocab=16, seq=8, kv_heads=2,
                            mlp="swiglu", norm="rmsnorm", position="rope")  # fmt: skip
    p = reference.init(cfg, seed=0)
    tok = np.random.default_rng(0).integers(0, cfg.vocab, (4, cfg.seq)).astype(np.int32)
    plan = shardsim.Plan.parse("dp=2,tp=2,sp")
    fn, args = engine.compile_model(cfg, plan, plan.mesh(), p, tok, tok)
    eqns = [e for e in equations(jax.make_jaxpr(fn)(*args).jaxpr) if e.primitive.name in LAX_TO_SHARDSIM]
    events = [
        e
        for e in shardsim.run_model(cfg, plan, plan.mesh(), p, tok, tok).trace.events
        if e.op in LAX_TO_SHARDSIM.values()
    ]
    rows = [
        f"| {e.phase} | {e.op} {e.axes} `{e.label}` | {e.sent_bytes} | `{q.primitive.name}` "
        f"{tuple(q.params.get('axis_name', q.params.get('axes')))} {q.invars[0].aval.str_short()} |"
        for e, q in zip(events, eqns)
    ]
    page = (DOCS / "engines.md").read_text(encoding="utf-8")
    forward = [r for r in rows if r.startswith("| forward")]
    assert len(events) == len(eqns) == 33 and len(forward) == 9
    assert "\n".join(forward) in page
