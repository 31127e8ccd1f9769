"""One pipeline executor: the MLP schemes and the transformer run through the same Pipeline.run,
and a hand-made stage on a toy problem sees the schedule's items in order, its values routed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import shardsim as ss
from shardsim.array import ShardedArray, shard
from shardsim.models import TransformerConfig, reference
from shardsim.pieces import place, split
from shardsim.plans import Plan
from shardsim.strategies import pp
from shardsim.strategies.pipeline import Pipeline, PipelineStep, Schedule, make
from shardsim.transformer.run import run_model

D = 3


# -- one executor for both ------------------------------------------------------------------------
@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[type, Schedule]]:
    """Every Pipeline.run call: the stage program's type and the schedule it ran."""
    seen: list[tuple[type, Schedule]] = []
    run = Pipeline.run

    def spy(self: Pipeline, stage: Any) -> bool:
        seen.append((type(stage), self.schedule))
        return run(self, stage)

    monkeypatch.setattr(Pipeline, "run", spy)
    return seen


def test_the_mlp_scheme_and_the_transformer_run_through_the_same_executor(runs: list[tuple[type, Schedule]]) -> None:
    params = pp.init(4, 8, seed=0, dtype="float64", layers=2)
    x = np.random.default_rng(0).standard_normal((4, 4))
    ss.run_strategy("pp", ss.Mesh(Z=2), params, x, x, microbatches=2)
    mlp_runs = list(runs)
    assert [t for t, _ in mlp_runs] == [PipelineStep, PipelineStep]  # the forward call, then the backward call

    cfg = TransformerConfig(layers=2, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)  # one layer per stage
    plan = Plan.parse("pp=2,microbatches=2")
    tokens = np.random.default_rng(1).integers(0, cfg.vocab, (4, cfg.seq))
    got = run_model(cfg, plan, plan.mesh(), reference.init(cfg, seed=1, dtype="float64"), tokens, tokens)
    model_runs = runs[len(mlp_runs) :]
    assert len(model_runs) == 1 and model_runs[0][0] is not PipelineStep
    schedule = model_runs[0][1]
    assert (schedule.name, schedule.stages, schedule.microbatches) == (mlp_runs[0][1].name, 2, 2)
    # every item of the schedule ran, each tagged with its name
    ran = {e.item for e in got.trace.events if e.item}
    assert ran == {f"{it.kind}{schedule.virtual_stage(it)}.{it.microbatch}" for it in schedule.items}


# -- a hand-made stage on a toy problem -----------------------------------------------------------
class Chain:
    """Layer ``l`` multiplies by ``W[l]`` (``[D, D]``): microbatch j's output is ``x_j W_0 ... W_{L-1}``.

    Records each layer call as ``(pipe stage, kind, microbatch, chunk)``, where the layer lives.
    """

    def __init__(self, mesh: ss.Mesh, schedule: Schedule, layers: int, x: np.ndarray, dout: np.ndarray) -> None:
        self.mesh, self.schedule, self.layers = mesh, schedule, layers  # layers per virtual stage
        rng = np.random.default_rng(5)
        self.w = rng.standard_normal((schedule.stages * schedule.chunks * layers, D, D))
        self.ws = [shard(w, mesh, "[D, E]", label=f"W{i}") for i, w in enumerate(self.w)]
        m = schedule.microbatches
        self.x = split(shard(x, mesh, "[B, D]", label="In"), "B", m)
        self.dout = split(shard(dout, mesh, "[B, D]", label="dOut"), "B", m)
        self.calls: list[tuple[int, str, int, int]] = []
        self.out: dict[int, np.ndarray] = {}
        self.dx: dict[int, np.ndarray] = {}
        self.dw: dict[int, np.ndarray] = {}
        self.finished = False

    def where(self, layer: int) -> tuple[int, int]:
        chunk, stage = divmod(layer // self.layers, self.schedule.stages)
        return stage, chunk

    def ready(self) -> bool:
        return True

    def forward_in(self, stage: int, j: int) -> ShardedArray:
        return place(self.x[j], **{"Z": stage})

    def forward_layer(self, layer: int, j: int, x: ShardedArray) -> tuple[ShardedArray, dict[str, ShardedArray]]:
        stage, chunk = self.where(layer)
        self.calls.append((stage, "F", j, chunk))
        return (x @ self.ws[layer]).named("Out"), {"In": x}

    def forward_out(self, j: int, x: ShardedArray) -> None:
        self.out[j] = np.asarray(x.to_global())

    def backward_in(self, stage: int, j: int) -> tuple[ShardedArray, dict[str, ShardedArray]]:
        return place(self.dout[j], **{"Z": stage}), {}

    def backward_layer(
        self, layer: int, j: int, saved: dict[str, ShardedArray], g: ShardedArray
    ) -> tuple[ShardedArray, dict[str, ShardedArray]]:
        stage, chunk = self.where(layer)
        self.calls.append((stage, "B", j, chunk))
        return (g @ self.ws[layer].T).named("dIn"), {"w": saved["In"].T @ g}

    def accumulate(self, layer: int, grads: dict[str, ShardedArray]) -> None:
        for dw in grads.values():
            self.dw[layer] = self.dw.get(layer, 0) + np.asarray(dw.to_global())

    def backward_out(self, j: int, g: ShardedArray) -> None:
        self.dx[j] = np.asarray(g.to_global())

    def message(self, kind: str, j: int) -> str:
        return f"{kind}msg{j}"

    def finish(self) -> None:
        self.finished = True


CASES = [("gpipe", 3, 4, 1, 1), ("1f1b", 3, 5, 1, 2), ("1f1b", 4, 2, 1, 1), ("interleaved", 2, 4, 2, 1)]


@pytest.mark.parametrize("name,p,m,v,layers", CASES)
def test_a_hand_made_stage_sees_each_stage_s_items_in_the_schedule_s_order(
    name: str, p: int, m: int, v: int, layers: int
) -> None:
    schedule = make(name, p, m, v)
    mesh = ss.Mesh(Z=p)
    rng = np.random.default_rng(0)
    x, dout = rng.standard_normal((2 * m, D)), rng.standard_normal((2 * m, D))
    chain = Chain(mesh, schedule, layers, x, dout)
    with ss.trace() as t:
        assert Pipeline(schedule, mesh, "Z", layers, tag_items=True).run(chain) and chain.finished
    for s, order in enumerate(schedule.orders()):
        want = [(s, it.kind, it.microbatch, it.chunk) for it in order for _ in range(layers)]
        assert [c for c in chain.calls if c[0] == s] == want

    # the values went where the schedule sent them: each microbatch through every layer in order
    want_dw = np.zeros_like(chain.w)
    for j, (xj, gj) in enumerate(zip(np.split(x, m), np.split(dout, m))):
        a = [xj]  # each layer's input, then the output
        for w in chain.w:
            a.append(a[-1] @ w)
        np.testing.assert_allclose(chain.out[j], a[-1], rtol=1e-12)
        g = gj
        for i in reversed(range(len(chain.w))):
            want_dw[i] += a[i].T @ g
            g = g @ chain.w[i].T
        np.testing.assert_allclose(chain.dx[j], g, rtol=1e-12, atol=1e-12)
    assert sorted(chain.dw) == list(range(len(chain.w)))
    np.testing.assert_allclose(np.stack([chain.dw[i] for i in range(len(chain.w))]), want_dw, rtol=1e-12, atol=1e-12)

    # one ppermute per stage boundary per microbatch each way, from the sending stage, named by the stage
    sends = [e for e in t.events if e.op == "ppermute"]
    boundaries = p * v - 1
    assert len(sends) == 2 * m * boundaries
    for e in sends:
        kind, k, j = e.item[0], *map(int, e.item[1:].split("."))
        assert e.label == f"{kind}msg{j}" and e.axes == ("Z",) and e.where == f"Z{k % p}"


def test_without_ready_the_walk_stops_before_the_first_backward_item() -> None:
    schedule = make("1f1b", 2, 3)
    mesh = ss.Mesh(Z=2)
    rng = np.random.default_rng(1)
    chain = Chain(mesh, schedule, 1, rng.standard_normal((3, D)), rng.standard_normal((3, D)))
    chain.ready = lambda: False  # type: ignore[method-assign]
    pipeline = Pipeline(schedule, mesh, "Z", 1)
    assert not pipeline.run(chain)
    first_b = min(it for it in schedule.items if it.kind == "B")
    assert [e.item for e in pipeline.executed] == sorted(it for it in schedule.items if it < first_b)
    del chain.ready
    assert pipeline.run(chain) and [e.item for e in pipeline.executed] == sorted(schedule.items)
    assert pipeline.run(chain)  # finished: nothing runs twice


def test_the_pipe_axis_must_have_a_coordinate_per_stage() -> None:
    with pytest.raises(ss.ShardingError, match="the schedule has 3 stages but the pipe axis 'Z' has 2"):
        Pipeline(make("gpipe", 3, 2), ss.Mesh(Z=2), "Z", 1)
