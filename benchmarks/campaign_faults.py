"""Fault campaign against ``Trainer.step``: thousands of injected faults, counted by outcome.

Each trial builds a trainer (a scheme, a precision, an optimizer, one block or a stack, all
drawn at random), runs it to a random step and there injects one fault:

- ``chip``: a chip fails after a random trace event of the step (``mesh.fail``);
- ``oom``: after a random trace event the capacity becomes what the fullest chip holds, so the
  next allocation runs out of memory;
- ``input``: the step gets bad input (text, complex numbers, a wrong shape, a sharded value,
  None).

Half of the chip and memory faults land in the step's optimizer phase, where the state
changes. A step that raises must raise a documented ``ShardsimError`` and leave the
trainer exactly as it was (weights, masters, moments, step count, loss scale, ledger); the
step retried after healing must equal the same step of a run that never failed, bit for
bit, and so must the step after it. A fault that lands after the step's last failure point
lets it finish; it must then equal the uninterrupted step too. Separately, ``options``
trials build trainers, optimizers, precisions and pipeline runs with options that make no
sense; each must raise a documented ``ShardsimError``.

Run by hand: ``python benchmarks/campaign_faults.py [--trials 3000] [--seed 0]``.
Counts go to ``docs/reliability.md``, section *Fault campaign*.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the fault injector the tests use

import shardsim as ss
from fault_injection import KINDS, fault_after, heal, same_state, trainer_state
from shardsim import mlp
from shardsim.training import SGD, Adam, AdamW, Precision, Trainer
from shardsim.training.scaling import DynamicLossScale

SCHEMES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "tp", "fsdp_tp")
PRECISIONS = {
    "fp64": {"precision": "fp64"},
    "fp32": {"precision": "fp32"},
    "bf16": {"precision": "bf16"},
    "fp16": {"precision": "fp16", "loss_scale": DynamicLossScale(init_scale=2.0**14, growth_interval=2)},
}
OPTIMIZERS = {"sgd": SGD(lr=0.05), "momentum": SGD(lr=0.05, momentum=0.9), "adam": Adam(lr=1e-2), "adamw": AdamW()}
B, D, F, STEPS = 8, 8, 16, 3


def mesh_for(scheme: str, rng: np.random.Generator) -> ss.Mesh:
    n = int(rng.choice([2, 4]))
    return ss.Mesh(X=2, Y=n // 2 if n > 2 else 2) if scheme == "fsdp_tp" else ss.Mesh(X=n)


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(step)
    return r.standard_normal((B, D)), r.standard_normal((B, D))


class Reference:
    """The uninterrupted run of one configuration: each step's result and state, computed once."""

    def __init__(self, make: Any) -> None:
        t = make()
        self.results: list[str] = []
        self.states: list[dict[str, Any]] = []
        self.phases: list[list[str]] = []  # the phase of each trace event, per step
        for step in range(1, STEPS + 1):
            r = t.step(*batch(step))
            self.results.append(outcome(r))
            self.states.append(trainer_state(t))
            self.phases.append([e.phase for e in r.trace.events])


def readable_state(t: Trainer) -> dict[str, Any] | None:
    """The trainer's state, or None when it cannot even be read (a weight dropped, say)."""
    try:
        return trainer_state(t)
    except Exception:
        return None


def same(state: dict[str, Any] | None, want: dict[str, Any]) -> bool:
    return state is not None and same_state(state, want)


def outcome(r: Any) -> str:
    """What a step reports, comparable bit for bit (repr: a NaN loss equals a NaN loss)."""
    return repr((r.loss, r.step, r.skipped, r.loss_scale))


BAD_INPUTS = (
    lambda: np.full((B, D), "a"),
    lambda: np.ones((B, D), complex),
    lambda: np.ones((B, D + 1)),
    lambda: np.ones((B,)),
    lambda: None,
    lambda: ss.shard(np.ones((B, D)), ss.Mesh(X=2), "[B_X, D]"),
)


def fault_trial(rng: np.random.Generator, refs: dict, counts: collections.Counter) -> None:
    scheme = str(rng.choice(SCHEMES))
    precision = str(rng.choice(list(PRECISIONS)))
    opt = str(rng.choice(list(OPTIMIZERS)))
    depth = None if rng.random() < 0.5 else int(rng.integers(2, 4))
    mesh_shape = mesh_for(scheme, rng).shape
    kind = str(rng.choice([*KINDS, "input"]))
    dtype = "float64" if precision == "fp64" else "float32"
    params = mlp.init(D, F, seed=1, dtype=dtype) if depth is None else mlp.init_stack(depth, D, F, seed=1, dtype=dtype)
    axes = ("X", "Y") if scheme == "fsdp_tp" else ("X",)

    def make() -> Trainer:
        mesh = ss.Mesh(dict(zip(axes, mesh_shape)))
        return Trainer(scheme, mesh, params, OPTIMIZERS[opt], activation="gelu", **PRECISIONS[precision])

    key = (scheme, precision, opt, depth, mesh_shape)
    if key not in refs:
        refs[key] = Reference(make)
    ref = refs[key]
    fault_step = int(rng.integers(1, STEPS + 1))
    t = make()
    for step in range(1, fault_step):
        t.step(*batch(step))
    x, y = batch(fault_step)
    counts["faults injected"] += 1
    counts[f"faults: {kind}"] += 1
    before, live = trainer_state(t), t.mesh.memory.live().copy()
    raised: BaseException | None = None
    if kind == "input":
        bad = BAD_INPUTS[int(rng.integers(len(BAD_INPUTS)))]()
        args = (bad, y) if rng.random() < 0.5 else (x, bad)
        try:
            t.step(*args)
        except Exception as e:
            raised = e
    else:
        # where: any event of the step, or (half the time) one of its optimizer phase
        phases = ref.phases[fault_step - 1]
        events = [i for i, ph in enumerate(phases) if ph == "optimizer"]
        n = len(phases)
        where = int(rng.choice(events)) + 1 if events and rng.random() < 0.5 else int(rng.integers(0, n + 1))
        with fault_after(t.mesh, where, kind):
            try:
                result = t.step(x, y)
            except Exception as e:
                raised = e
        heal(t.mesh)
        if raised is None:  # the fault came after the step's last failure point
            counts["steps that finished despite the fault"] += 1
            want = ref.states[fault_step - 1]
            if outcome(result) != ref.results[fault_step - 1] or not same(readable_state(t), want):
                counts["finished steps that differ from the uninterrupted run"] += 1
            return
    if raised is None:
        counts["bad inputs accepted"] += 1
        return
    counts["steps that raised"] += 1
    if not isinstance(raised, ss.ShardsimError) or not str(raised):
        counts["undocumented exceptions"] += 1
        counts[f"undocumented: {type(raised).__name__}"] += 1
    del raised
    if not same(readable_state(t), before):
        counts["raised steps that changed the state"] += 1
    if not np.array_equal(t.mesh.memory.live(), live):
        counts["raised steps that left values on the ledger"] += 1
    for step in range(fault_step, STEPS + 1):  # the retry, and the step after it
        try:
            r = t.step(*batch(step))
        except Exception:
            counts["retried runs that diverge from the uninterrupted run"] += 1
            break
        if outcome(r) != ref.results[step - 1] or not same(readable_state(t), ref.states[step - 1]):
            counts["retried runs that diverge from the uninterrupted run"] += 1
            break


BAD_VALUES = (-1.0, 0.0, float("nan"), float("inf"), -float("inf"), "0.1", None, True, [1.0])
BAD_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("SGD lr", lambda v: SGD(lr=v)),
    ("SGD momentum", lambda v: SGD(momentum=v if v != 0.0 else -0.5)),
    ("Adam lr", lambda v: Adam(lr=v)),
    ("Adam b1", lambda v: Adam(b1=v if v != 0.0 else 1.0)),
    ("Adam b2", lambda v: Adam(b2=v if v != 0.0 else 2.0)),
    ("Adam eps", lambda v: Adam(eps=v)),
    ("AdamW weight_decay", lambda v: AdamW(weight_decay=v if v != 0.0 else -0.01)),
    ("loss_scale", lambda v: Precision.of("fp16", loss_scale="none" if v is None else v)),
    ("DynamicLossScale init_scale", lambda v: DynamicLossScale(init_scale=v)),
    ("DynamicLossScale growth_interval", lambda v: DynamicLossScale(growth_interval=v)),
    ("optimizer step", lambda v: Adam().update(np.ones(2), np.ones(2), Adam().init_state(np.ones(2)), v)),
    ("precision", lambda v: Trainer("ddp", ss.Mesh(X=2), mlp.init(4, 8), precision=str(v))),
    ("optimizer", lambda v: Trainer("ddp", ss.Mesh(X=2), mlp.init(4, 8), str(v))),
    ("params", lambda v: Trainer("ddp", ss.Mesh(X=2), {} if v is None else v)),
    (
        "microbatches",
        lambda v: ss.run_strategy(
            "pp",
            ss.Mesh(Z=2),
            ss.strategies.get("pp").init(4, 8),
            np.ones((8, 4)),
            np.ones((8, 4)),
            microbatches=3 if v is None or v == 0.0 else v,
        ),
    ),
)


def options_trial(rng: np.random.Generator, counts: collections.Counter) -> None:
    name, make = BAD_OPTIONS[int(rng.integers(len(BAD_OPTIONS)))]
    value = BAD_VALUES[int(rng.integers(len(BAD_VALUES)))]
    counts["bad options tried"] += 1
    try:
        make(value)
    except ss.ShardsimError as e:
        if not str(e):
            counts["undocumented exceptions"] += 1
        return
    except Exception as e:
        counts["undocumented exceptions"] += 1
        counts[f"undocumented: {type(e).__name__} ({name}={value!r})"] += 1
        return
    counts[f"bad options accepted: {name}={value!r}"] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3000, help="fault trials (default 3000)")
    parser.add_argument("--options", type=int, default=600, help="bad-option trials (default 600)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # NumPy's float16 overflow warnings outside the trainer's own steps
    rng = np.random.default_rng(args.seed)
    counts: collections.Counter = collections.Counter()
    refs: dict = {}
    start = time.perf_counter()
    for i in range(args.trials):
        fault_trial(rng, refs, counts)
        if (i + 1) % 500 == 0:
            print(f"  {i + 1} fault trials, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    for _ in range(args.options):
        options_trial(rng, counts)
    elapsed = time.perf_counter() - start
    print(
        f"{datetime.date.today()}, {platform.machine()}, {platform.python_version()}, seed {args.seed}, "
        f"{elapsed:.0f} s, {len(refs)} configurations"
    )
    for key in sorted(counts):
        print(f"{counts[key]:8d}  {key}")
    for must_be_zero in (
        "raised steps that changed the state",
        "raised steps that left values on the ledger",
        "retried runs that diverge from the uninterrupted run",
        "finished steps that differ from the uninterrupted run",
        "undocumented exceptions",
        "bad inputs accepted",
    ):
        print(f"{counts[must_be_zero]:8d}  {must_be_zero} (must be 0)")


if __name__ == "__main__":
    main()
