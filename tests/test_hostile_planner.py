"""Hostile arguments to the planner and to a model's cost estimate: each is a result or a
documented ShardsimError naming the argument, within a second; huge batches enumerate at once."""

from __future__ import annotations

import contextlib
import functools
import math
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim import cost
from shardsim.cost.layer_program import LayerCache
from shardsim.cost.units import token_count, tokens_argument
from shardsim.errors import ArgumentTypeError, CostModelError, PlannerError, ShardsimError
from shardsim.models import get
from shardsim.planner import days_to_train, fewest_chips, largest_model, plan
from shardsim.planner.space import batch_sizes, candidates, divisors, divisors_between
from shardsim.plans import Plan

TINY = get("gpt-tiny")  # tied embeddings: no pipelines, a small space
SEQ = 16
HOSTILE: list[Any] = [None, 0, -1, 2**62, math.nan, math.inf, 1.5, True, "x", "16M", (), [3, 1], {}, object()]


class OverdueError(Exception):
    pass


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Fail (rather than hang) when the block takes longer than ``seconds``."""

    def overdue(*_: Any) -> None:
        raise OverdueError(f"took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, overdue)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- the plan space of a huge batch ------------------------------------------------------------
def test_divisors_match_trial_division() -> None:
    for n in range(1, 400):
        want = [d for d in range(1, n + 1) if n % d == 0]
        assert divisors(n) == want
        assert divisors_between(n, 3, 40) == [d for d in want if 3 <= d <= 40]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    lo=st.integers(1, 2000), width=st.integers(0, 2000), dp=st.integers(1, 12), want=st.integers(1, 300),
)  # fmt: skip
def test_batch_in_a_range_is_the_nearest_multiple_of_dp(lo: int, width: int, dp: int, want: int) -> None:
    rng = (lo, lo + width)
    first, last = -(-rng[0] // SEQ), rng[1] // SEQ
    every = [b for b in range(first, last + 1) if b % dp == 0]  # the reference: walk the range
    expected = sorted(every, key=lambda b: (abs(b - want), b))[:1]
    assert batch_sizes(want * SEQ, SEQ, dp, rng) == expected


def test_a_batch_of_2_to_the_40_tokens_enumerates_at_once() -> None:
    with within(1.0):
        space = list(candidates(TINY, chips=2, batch_tokens=2**40, seq=SEQ, domain=8))
        ranged = list(candidates(TINY, chips=2, batch_tokens=64, seq=SEQ, domain=8,
                                 constraints=plan_constraints(batch_range=(SEQ, 2**40))))  # fmt: skip
    per_rank = {c.plan.dp: 2**40 // SEQ // c.plan.dp for c in space}
    assert {c.micro for c in space} == {1, 2, 4, 8, 16, 32, 64}  # every divisor in the default 1..64
    assert all(c.micro * c.plan.microbatches == per_rank[c.plan.dp] for c in space)
    assert {c.batch for c in ranged} == {4}  # 64 tokens: 4 sequences, a multiple of every dp, in range


def plan_constraints(**options: Any) -> Any:
    from shardsim.planner.space import Constraints

    return Constraints.of(**options)


def test_pipelines_past_the_microbatch_limit_are_not_searched() -> None:
    llama = get("llama-tiny")
    with within(1.0):
        space = list(candidates(llama, chips=2, batch_tokens=2**30, seq=SEQ, domain=8))
    assert space and all(c.plan.pp == 1 for c in space)  # 2**25 sequences: m > 1024 on every pipeline
    shallow = list(candidates(llama, chips=2, batch_tokens=64 * SEQ, seq=SEQ, domain=8))
    assert any(c.plan.pp == 2 for c in shallow)


# -- the planner's arguments -------------------------------------------------------------------
BASE: dict[str, Any] = {"zero": 0, "recompute": "none", "micro_range": (4, 4), "progress": False}


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"tp": 0}, r"tp=0: a fixed tp is a whole number >= 1"),
        ({"dp": 0}, r"dp=0"),
        ({"tp": "2"}, r"tp='2'"),
        ({"virtual_stages": -1}, r"virtual_stages=-1"),
        ({"sp": "yes"}, r"sp='yes': sequence parallelism is on or off"),
        ({"zero": 9}, r"zero=9: the ZeRO stage is 0, 1, 2 or 3"),
        ({"schedule": "x"}, r"schedule='x': choose one of"),
        ({"model": None}, r"model=None \(NoneType\): pass a TransformerConfig or a preset name"),
        ({"cache": 5}, r"cache=5: pass a shardsim.cost.layer_program.LayerCache"),
        ({"batch_range": (SEQ, 2**60)}, r"batch_range=1152921504606846976: a token count is from 1 to 2\*\*40"),
        ({"batch_range": (128, 16)}, r"batch_range=\(128, 16\): give \(smallest, largest\) tokens, lo <= hi"),
        ({"batch_range": (17, 31)}, r"holds no whole number of 16-token sequences"),
        ({"batch_range": 64}, r"batch_range=64: give \(smallest, largest\)"),
        ({"window": -1}, r"window=-1: the fraction of the best plan's time"),
        ({"window": math.nan}, r"window=nan"),
        ({"headroom": "x"}, r"headroom='x' is the fraction of memory left free"),
        ({"tp_max": 0}, r"tp_max=0: the largest degree is a whole number >= 1"),
        ({"allow": None}, r"allow=None: give the parallelisms"),
        ({"allow": "dp"}, r"allow='dp': give the parallelisms"),
        ({"micro_range": (1.5, 4)}, r"micro_range=\(1.5, 4\): give \(smallest, largest\) as whole numbers"),
        ({"progress": "x"}, r"progress='x'"),
        ({"batch_tokens": 2**62}, r"batch_tokens=4611686018427387904: a token count is from 1 to 2\*\*40"),
        ({"batch_tokens": 64.0}, r"batch_tokens=64.0 \(float\): a token count is a whole number or a string"),
        ({"chips": 2**40}, r"chips=1099511627776: the cluster is a whole number of chips from 1 to 16,777,216"),
        ({"seq": 0}, r"seq=0: the sequence is a whole number of tokens"),
        ({"links": 5}, r"links=5 \(int\): map mesh axes to networks"),
    ],
)
def test_planner_arguments_are_refused_up_front(change: dict[str, Any], needle: str) -> None:
    args = {"model": TINY, "hardware": "h100", "chips": 2, "batch_tokens": 64, "seq": SEQ, **BASE, **change}
    t0 = time.perf_counter()
    with pytest.raises(ShardsimError, match=needle):
        plan(**args)
    assert time.perf_counter() - t0 < 1.0


def test_planner_reads_batch_tokens_as_the_command_line_does() -> None:
    cache = LayerCache(TINY, "h100", seq=SEQ)
    written = plan(TINY, "h100", 2, "1K", seq=SEQ, cache=cache, **BASE)
    counted = plan(TINY, "h100", 2, 1024, seq=SEQ, cache=cache, **BASE)
    assert written.batch_tokens == counted.batch_tokens == token_count("1K") == 1024
    assert [str(r.plan) for r in written.rows] == [str(r.plan) for r in counted.rows]
    assert written.best.step_s == counted.best.step_s


def test_inverse_questions_refuse_their_arguments() -> None:
    table = plan(TINY, "h100", 2, 64, seq=SEQ, **BASE)
    cases: list[tuple[Any, str]] = [
        (lambda: days_to_train(None, 1e9), r"estimate=None \(NoneType\): pass a PlanTable"),  # type: ignore[arg-type]
        (lambda: days_to_train(table, math.nan), r"positive, finite token budget, got nan"),
        (lambda: days_to_train(table, "1e9"), r"got '1e9'"),  # type: ignore[arg-type]
        (lambda: fewest_chips(TINY, "h100", batch_tokens=64, seq=SEQ, step_s=-1.0), r"step_s=-1.0"),
        (lambda: fewest_chips(TINY, "h100", batch_tokens=0, seq=SEQ, step_s=1.0), r"batch_tokens=0"),
        (lambda: fewest_chips(TINY, "h100", batch_tokens=64, seq=SEQ, step_s=1.0, tp=0), r"tp=0"),
        (lambda: fewest_chips(TINY, "h100", batch_tokens=64, seq=SEQ, step_s=1.0, chips=[0]), r"chips=0"),
        (lambda: largest_model(TINY, "h100", None, batch_tokens=64, seq=SEQ), r"plan=None"),  # type: ignore[arg-type]
        (lambda: largest_model(TINY, "h100", Plan(dp=2), batch_tokens=64, seq=SEQ, micro=0), r"micro=0"),
        (lambda: largest_model(TINY, "h100", Plan(dp=2), batch_tokens=64, seq=SEQ, max_layers=2**62),
         r"max_layers=4611686018427387904"),
        (lambda: largest_model(TINY, "h100", Plan(dp=8), batch_tokens=64, seq=SEQ), r"fewer than dp=8"),
    ]  # fmt: skip
    for call, needle in cases:
        t0 = time.perf_counter()
        with pytest.raises(PlannerError, match=needle):
            call()
        assert time.perf_counter() - t0 < 1.0


PLANNER_ARGUMENTS = ["model", "hardware", "chips", "batch_tokens", "seq", "efficiency", "links", "topology",
                     "window", "progress", "policy", "cache", "tp", "dp", "pp", "zero", "sp", "microbatches",
                     "virtual_stages", "schedule", "recompute", "allow", "headroom", "batch_range", "micro_range",
                     "tp_max", "cp_max"]  # fmt: skip
SHARED = LayerCache(TINY, "h100", seq=SEQ)


@functools.lru_cache(maxsize=1)
def warm() -> None:
    """Trace the shared cache's layer programs once, before any example is timed."""
    for tokens in (64, "16M"):
        plan(TINY, "h100", 2, tokens, seq=SEQ, cache=SHARED, **BASE)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(name=st.sampled_from(PLANNER_ARGUMENTS), value=st.sampled_from(HOSTILE))
def test_every_planner_argument_answers_or_refuses_within_a_second(name: str, value: Any) -> None:
    args: dict[str, Any] = {"model": TINY, "hardware": "h100", "chips": 2, "batch_tokens": 64, "seq": SEQ,
                            "cache": SHARED, **BASE}  # fmt: skip
    args[name] = value
    warm()
    t0 = time.perf_counter()
    try:
        with within(5.0):
            table = plan(**args)
    except ShardsimError as err:
        assert str(err)
    else:
        assert table.best.fits and table.best.plan.chips == 2
    assert time.perf_counter() - t0 < 1.0


# -- a model's cost estimate -------------------------------------------------------------------
LLAMA = get("llama-tiny")


@pytest.mark.parametrize(
    ("args", "error", "needle"),
    [
        ({"model": None}, ArgumentTypeError, r"the first argument is a scheme name .* got NoneType None"),
        ({"batch_tokens": 2**62}, CostModelError, r"batch_tokens=4611686018427387904: a token count is from 1"),
        ({"batch_tokens": 0}, CostModelError, r"batch_tokens=0"),
        ({"batch_tokens": 64.0}, ArgumentTypeError, r"batch_tokens=64.0 \(float\)"),
        ({"batch_tokens": "16Q"}, CostModelError, r"batch_tokens='16Q': expected tokens such as 4096 or 16M"),
        ({"hardware": "nope"}, CostModelError, r"unknown hardware 'nope'"),
        ({"hardware": None}, CostModelError, r"hardware=None \(NoneType\) is neither a preset name"),
        ({"mesh": None}, ShardsimError, r"plan must be a Plan or its string"),
        ({"chips": 0}, CostModelError, r"chips=0: the chip count is a whole number >= 1"),
        ({"prefetch": 0}, CostModelError, r"prefetch=0"),
        ({"overlap": "no"}, ArgumentTypeError, r"overlap='no': a switch"),
        ({"seq": "16"}, ArgumentTypeError, r"seq='16' \(str\)"),
        ({"links": 5}, CostModelError, r"links=5 \(int\): map mesh axes to networks"),
        ({"efficiency": np.array([])}, CostModelError, r"efficiency array\(\[\], dtype=float64\): use one of"),
        ({"links": {"data": 5}}, CostModelError, r"links\['data'\]=5"),
        ({"mesh": "pp=2,microbatches=2048", "model": {"layers": 128}, "batch_tokens": 2048 * SEQ},
         CostModelError, r"layers=128 x microbatches=2048"),
        ({"model": {"d_model": 2**20, "head_dim": 8, "d_ff": 2**22, "experts": 2**20, "mlp": "gelu"}},
         CostModelError, r"the MLP weights \[d_model, d_ff\] \(d_model x d_ff, x experts\) would hold"),
        ({"model": {"vocab": 2**24}, "batch_tokens": 2**40}, CostModelError,
         r"the logits \[B, S, vocab\] would hold .* use batch_tokens <= 34,359,738,352"),
    ],
)  # fmt: skip
def test_estimate_arguments_are_refused_up_front(args: dict[str, Any], error: type[Exception], needle: str) -> None:
    full: dict[str, Any] = {"model": LLAMA, "mesh": "dp=2", "hardware": "h100", "batch_tokens": 64, "seq": SEQ}
    full.update(args)
    if isinstance(full["model"], dict):  # a copy of the toy with these fields (each within the config's limits)
        full["model"] = LLAMA.scaled(**full["model"])
    model, mesh, hardware = full.pop("model"), full.pop("mesh"), full.pop("hardware")
    t0 = time.perf_counter()
    with pytest.raises(error, match=needle):
        cost.estimate(model, mesh, hardware, **full)
    assert time.perf_counter() - t0 < 1.0


def test_estimate_reads_batch_tokens_as_the_command_line_does() -> None:
    written = cost.estimate("llama-tiny", "dp=2", "h100", batch_tokens="1K", seq=SEQ, efficiency="ideal")
    counted = cost.estimate("llama-tiny", "dp=2", "h100", batch_tokens=1024, seq=SEQ, efficiency="ideal")
    assert written.batch == counted.batch == 1024
    assert written.step_s == counted.step_s and written.memory == counted.memory


def test_tokens_argument_holds_the_command_lines_limits() -> None:
    assert tokens_argument("2K", "n") == 2048 == token_count("2k")
    assert tokens_argument(2**40, "n") == 2**40
    for bad in (2**40 + 1, "2**41", "-1", True):
        with pytest.raises(ShardsimError, match=r"^n="):
            tokens_argument(bad, "n")


ESTIMATE_ARGUMENTS = ["model", "mesh", "hardware", "batch_tokens", "seq", "chips", "links", "topology",
                      "efficiency", "optimizer", "precision", "overlap", "prefetch", "dtype"]  # fmt: skip


@settings(max_examples=60, deadline=None, derandomize=True)
@given(name=st.sampled_from(ESTIMATE_ARGUMENTS), value=st.sampled_from(HOSTILE))
def test_every_estimate_argument_answers_or_refuses_within_a_second(name: str, value: Any) -> None:
    args: dict[str, Any] = {"model": "llama-tiny", "mesh": "dp=2", "hardware": "h100", "batch_tokens": 64,
                            "seq": SEQ, "efficiency": "ideal"}  # fmt: skip
    args[name] = value
    model, mesh, hardware = args.pop("model"), args.pop("mesh"), args.pop("hardware")
    t0 = time.perf_counter()
    try:
        with within(5.0):
            est = cost.estimate(model, mesh, hardware, **args)
    except ShardsimError as err:
        assert str(err)
    else:
        assert est.step_s > 0 and est.chips == 2
    assert time.perf_counter() - t0 < 1.0
