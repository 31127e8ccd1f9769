"""A layer program's events at a third microbatch size, read off two traced ones, equal the traced events.

The planner reads a layer sharding at many microbatch sizes and traces two
(:mod:`shardsim.training.event_line`); each test here traces the program at the third size too and
holds every event read off the line to it, field by field (value ids by their first appearance),
over the layer shardings the planner walks: data, ZeRO 1 to 3, tensor with and without sequence
parallelism, KV heads replicated, context parallelism (ring and all-gather), recomputation,
standard attention, experts with and without a capacity.
"""

from __future__ import annotations

from dataclasses import fields

import pytest

from shardsim.cost.layer_program import LayerCache
from shardsim.models import get
from shardsim.plans import Plan
from shardsim.training.event_line import SIZES, on_line, same_program
from shardsim.training.precision import Precision
from shardsim.training.traced import _trace_step, clear_steps, steps_traced

CASES = [
    ("llama-tiny", "dp=2"),
    ("llama-tiny", "dp=2,zero=1,tp=2,sp"),
    ("llama-tiny", "dp=2,zero=3,tp=2"),
    ("llama-tiny", "dp=2,zero=2,tp=4"),  # 2 KV heads over 4 model ranks: replicated
    ("llama-tiny", "tp=2,sp,recompute=full"),
    ("llama-tiny", "dp=2,tp=2,attention=standard,recompute=selective"),
    ("llama-tiny", "dp=2,cp=2"),
    ("llama-tiny", "cp=2,cp_method=all_gather,tp=2,sp"),
    ("gpt-tiny", "dp=2,zero=3,tp=2,sp"),
    ("moe-tiny", "dp=2,ep=2"),
    ("moe-tiny", "ep=2,tp=2,sp"),
]


def _events(model: str, plan: Plan, micro: int, layers: int, **scaled: float) -> list:
    """The step's events, traced (never read off a line: the cache is not asked)."""
    cfg = get(model).scaled(layers=layers, name="", **scaled)
    tokens = (plan.dp * plan.ep * micro, cfg.seq)
    step = _trace_step(cfg, plan, plan.mesh(), tokens, "adam", Precision.of("bf16"), True)
    return [e for e in step.events if e.phase != "optimizer"]


def _assert_equal(derived: list, traced: list) -> None:
    assert same_program(derived, traced)
    for d, t in zip(derived, traced):
        for f in (*SIZES, "local_shapes"):
            assert getattr(d, f) == getattr(t, f), (d.op, d.label, f)
    names = {f.name for f in fields(traced[0])} - {"inputs", "output"}
    assert all(getattr(d, n) == getattr(t, n) for d, t in zip(derived, traced) for n in names)


@pytest.mark.parametrize(("model", "text"), CASES)
@pytest.mark.parametrize("layers", [1, 2])
def test_events_on_the_line_equal_the_traced(model: str, text: str, layers: int) -> None:
    plan = Plan.parse(text)
    one, two = (_events(model, plan, b, layers) for b in (1, 2))
    for b in (3, 4):
        derived = on_line((1, one), (2, two), b)
        assert derived is not None
        _assert_equal(derived, _events(model, plan, b, layers))
    # from any two sizes, not only the smallest
    derived = on_line((2, two), (4, _events(model, plan, 4, layers)), 3)
    assert derived is not None
    _assert_equal(derived, _events(model, plan, 3, layers))


def test_a_capacity_is_on_the_line_per_sequence() -> None:
    """An expert's capacity holds per sequence (``ceil(f k S / E)`` slots each), so it grows with the microbatch."""
    plan = Plan.parse("dp=2,ep=2")
    one, two = (_events("moe-tiny", plan, b, 2, capacity_factor=1.25) for b in (1, 2))
    derived = on_line((1, one), (2, two), 3)
    assert derived is not None
    _assert_equal(derived, _events("moe-tiny", plan, 3, 2, capacity_factor=1.25))


def test_another_program_is_not_on_the_line() -> None:
    """Two traces of different programs give no line: the caller traces."""
    a = _events("llama-tiny", Plan.parse("dp=2"), 1, 1)
    b = _events("llama-tiny", Plan.parse("dp=2,recompute=full"), 2, 1)
    assert not same_program(a, b) and on_line((1, a), (2, b), 3) is None


def test_a_size_off_the_whole_numbers_is_traced() -> None:
    """A size the line puts between whole numbers (here: traces at 1 and 3, asked at 2 with a
    size made odd) gives no line rather than a rounded event."""
    from dataclasses import replace

    plan = Plan.parse("dp=2")
    one, three = (_events("llama-tiny", plan, b, 1) for b in (1, 3))
    odd = [replace(three[0], flops=three[0].flops + 1), *three[1:]]
    assert on_line((1, one), (3, odd), 2) is None


@pytest.mark.parametrize("text", ["dp=4,zero=3,tp=2,sp", "dp=8,tp=2,pp=2,microbatches=4", "dp=2,cp=2,tp=2"])
def test_a_layer_at_a_third_microbatch_is_the_traced_layer(text: str) -> None:
    """The cache reads a third microbatch size off the line through two it traced: the same
    times, FLOPs, stash and bytes as a cache that traces it."""
    cfg = get("llama-tiny").scaled(layers=4)
    plan = Plan.parse(text)
    clear_steps()
    warm = LayerCache(cfg, "h100", seq=16)
    for b in (1, 2):
        warm.layer(plan, b).bytes_at("total", 4)
    before = steps_traced()
    lay = warm.layer(plan, 4)
    assert steps_traced() == before  # read off the line: nothing traced
    clear_steps()
    ref = LayerCache(cfg, "h100", seq=16).layer(plan, 4)
    assert (lay.per_layer, lay.edge, lay.stored, lay.flops, lay.hardware_flops, lay.work) == (
        ref.per_layer,
        ref.edge,
        ref.stored,
        ref.flops,
        ref.hardware_flops,
        ref.work,
    )
    for k in ("total", "activations", "params", "grads", "optimizer"):
        assert lay.bytes_at(k, 4) == ref.bytes_at(k, 4) and lay.state_at(k, 4) == ref.state_at(k, 4)
