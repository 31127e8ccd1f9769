"""How long an answer takes: estimates, memory and plan searches of published configurations.

Every case is asked as a user would ask it. "cold" runs it in a fresh interpreter, the import
of shardsim included (the wall time of the whole child process, median of ``--repeats``);
"warm" asks the same model on the same hardware again in one process with another batch (the
first call primes the caches; the median of the later calls). The cases:

- ``estimate`` of every published run of ``docs/calibration.md`` (its model, plan, hardware,
  batch and options, as ``shardsim.calibration.RUNS`` holds them), and of BLOOM-176B's
  published plan (TP 4 x PP 12 x DP 8, 128 microbatches of 2 sequences on A100s);
- ``training.model_memory`` of the same plans;
- ``planner.plan`` of the docs' and a newcomer's searches (Llama 3 405B on 16,384 H100s with
  and without context parallelism, 70B on 512, 8B on 16, Llama 2 7B on 64);
- ``benchmarks/calibration.py --check``.

A case still running after ``--timeout`` seconds is stopped and printed as ``> timeout``.
Run by hand (not by pytest): ``python benchmarks/answers.py [--only estimate,memory,planner,
calibration] [--match TEXT] [--repeats N] [--timeout S]``; paste the table into ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from _timing import cpu

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


@dataclass(frozen=True)
class Case:
    """One question: its kind, a label, the code that asks it cold, and the code that asks it warm."""

    kind: str
    label: str
    cold: str
    warm: str | None = None  # a statement of the same model and hardware with another batch


def _published() -> list[tuple[str, str, str, str, int, int, dict[str, object]]]:
    """(label, model, plan, hardware, batch_tokens, seq, options) of each published run, BLOOM last."""
    sys.path.insert(0, str(ROOT / "src"))
    from shardsim.calibration import RUNS

    rows: list[tuple[str, str, str, str, int, int, dict[str, object]]] = []
    for run in RUNS:
        overrides = dict(run.overrides)
        model = f"get({run.model!r}).scaled(**{overrides!r})" if overrides else repr(run.model)
        rows.append((run.name, model, run.plan, run.hardware, run.batch_tokens, run.seq, dict(run.options)))
    # BigScience 2022 (BLOOM, §3.4): 384 A100 80GB, TP 4, PP 12, DP 8, ZeRO-1, activation
    # checkpointing, 2048 sequences a step of microbatch 2 (128 microbatches a pipeline); its
    # embedding and head are one matrix, copied on the first and last stage by Megatron-DeepSpeed,
    # untied here as run_model pipelines them.
    rows.append(
        (
            "BLOOM-176B",
            "get('bloom-176b').scaled(tie_embeddings=False)",
            "dp=8,zero=1,tp=4,pp=12,microbatches=128,recompute=full",
            "a100",
            2048 * 2048,
            2048,
            {},
        )
    )
    return rows


def cases(kinds: set[str]) -> list[Case]:
    """Every case of ``kinds``, in the order of the module doc."""
    out: list[Case] = []
    imports = {"estimate": "from shardsim.cost import estimate", "memory": "from shardsim.training import model_memory"}

    def code(kind: str, call: str) -> str:
        return f"from shardsim.models import get\n{imports[kind]}\n{call}"

    for label, model, plan, hw, tokens, seq, options in _published():
        opts = "".join(f", {k}={v!r}" for k, v in options.items())
        if "estimate" in kinds:
            ask = f"estimate({model}, {plan!r}, {hw!r}, seq={seq}{opts}, batch_tokens="
            out.append(
                Case("estimate", label, code("estimate", f"{ask}{tokens})"), code("estimate", f"{ask}{2 * tokens})"))
            )
        if "memory" in kinds:
            call = f"model_memory({model}, {plan!r}, seq={seq}, batch={tokens // seq})"
            out.append(Case("memory", label, code("memory", call)))
    if "planner" in kinds:
        searches = [
            ("Llama 3 405B, 16,384 H100, 16M tokens at 8K", "'llama3-405b', 'h100', 16384, 16 * 2**20, 8192"),
            ("the same with cp_max=2", "'llama3-405b', 'h100', 16384, 16 * 2**20, 8192, cp_max=2"),
            ("Llama 3 70B, 512 H100, 4M tokens at 8K", "'llama3-70b', 'h100', 512, 4 * 2**20, 8192"),
            ("Llama 3 8B, 16 H100, 1M tokens at 8K", "'llama3-8b', 'h100', 16, 2**20, 8192"),
            ("Llama 2 7B, 64 A100, 4M tokens at 4K", "'llama2-7b', 'a100', 64, 4 * 2**20, 4096"),
        ]
        for label, args in searches:
            out.append(Case("planner", label, f"from shardsim.planner import plan\nplan({args}, progress=False)"))
    if "calibration" in kinds:
        out.append(Case("calibration", "benchmarks/calibration.py --check", ""))
    return out


def _child(code: str, timeout: float) -> float | None:
    """Wall seconds of a fresh interpreter running ``code`` (import included), None past ``timeout``."""
    start = time.perf_counter()
    try:
        subprocess.run([sys.executable, "-c", code], env=ENV, check=True, timeout=timeout, capture_output=True)
    except subprocess.TimeoutExpired:
        return None
    except subprocess.CalledProcessError as err:
        raise SystemExit(f"failed:\n{code}\n{err.stderr.decode()[-2000:]}") from None
    return time.perf_counter() - start


def _calibration(timeout: float) -> float | None:
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "calibration.py"), "--check"],
            env=ENV,
            timeout=timeout,
            capture_output=True,
        )
    except subprocess.TimeoutExpired:
        return None
    if done.returncode:
        print(f"calibration.py --check exited {done.returncode}: {done.stdout.decode()[-500:]}")
    return time.perf_counter() - start


def _warm(case: Case, repeats: int, timeout: float) -> float | None:
    """Median seconds of the warm statement, timed inside one child after the cold one primed it."""
    assert case.warm is not None
    again = case.warm.rsplit("\n", 1)[1]  # the question with another batch, after the cold one
    code = (
        f"{case.cold}\nimport statistics, time\nts = []\nfor _ in range({repeats}):\n"
        f"    t = time.perf_counter()\n    {again}\n    ts.append(time.perf_counter() - t)\n"
        "print(statistics.median(ts))"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], env=ENV, check=True, timeout=timeout, capture_output=True, text=True
        )
    except subprocess.TimeoutExpired:
        return None
    return float(done.stdout.strip().splitlines()[-1])


def _seconds(s: float | None, timeout: float) -> str:
    return f"> {timeout:.0f} s" if s is None else f"{s:.3g} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", default="estimate,memory,planner,calibration")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--match", default="", help="only the cases whose label contains this")
    args = parser.parse_args()
    kinds = set(args.only.split(","))
    print(f"{datetime.date.today()}, {cpu()}, load {os.getloadavg()[0]:.2f}; medians of {args.repeats}")
    print("\n| kind | case | cold | warm |\n|---|---|---:|---:|")
    for case in (c for c in cases(kinds) if args.match in c.label):
        if case.kind == "calibration":
            cold = [_calibration(args.timeout)]
        else:
            cold = [_child(case.cold, args.timeout) for _ in range(1 if case.kind == "planner" else args.repeats)]
        times = [t for t in cold if t is not None]
        median = statistics.median(times) if len(times) == len(cold) else None
        warm = "" if case.warm is None or median is None else _seconds(_warm(case, args.repeats, args.timeout), 0)
        print(f"| {case.kind} | {case.label} | {_seconds(median, args.timeout)} | {warm} |", flush=True)


if __name__ == "__main__":
    main()
