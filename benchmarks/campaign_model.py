"""A campaign of hostile inputs against the model-level API, run by hand.

Every input comes from the case table of ``tests/model_hostile_inputs.py``, as the property
test's do: near-valid configurations, plans and batches with one field or argument made
hostile (wrong types, ``None``, zero, negative, ``2**63``, ``10**400``, NaN, infinities,
strings, arrays, booleans, other objects), random valid small models under random plans, and
random plan strings. The calls: ``TransformerConfig``, ``Plan`` and ``Plan.parse``,
``run_model``, ``Trainer.for_model`` (built and stepped once), ``cost.estimate`` of a model,
the planner (a bounded search of a tiny model on 1 to 4 chips) and the model command lines
(``shardsim estimate/plan/demo --model``, ``shardsim train``, in-process through
``cli.main``). Each outcome is classified: a value the independent check agrees with (the
single-device reference for runs and steps), a documented ``ShardsimError``, a wrong value, an
undocumented exception, or a hang (a call still running after 10 s).

    PYTHONPATH=src python benchmarks/campaign_model.py            # --random 50000 --seed 0

It prints the machine line and a table per call for ``docs/reliability.md``; the first bad
inputs are listed with their recipes, and every distinct failure (call, what was made
hostile, the exception's type and message) once with its count.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import resource
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import cpu

from model_hostile_inputs import CALLS, OUTCOMES, SHARES, describe, draw, run_case

HOST_BYTES = 2 * 2**30  # an allocation past this is a MemoryError (undocumented), not the host's swap


def counts_for(total: int) -> dict[str, int]:
    """Each call's number of inputs: its share of ``total`` (at least one each)."""
    return {name: max(1, round(total * SHARES[name])) for name in CALLS}


def pattern(name: str, recipe: dict, outcome: str, detail: str) -> tuple[str, str]:
    """A failure's class, without the values that vary (the call, what was made hostile, the
    message with its quoted values and numbers blanked), and the hostile value's kind."""
    slot, kind = "", ""
    if recipe.get("mutate"):
        slot, how = recipe["mutate"]
        if isinstance(how, tuple) and len(how) == 2 and isinstance(how[0], str) and slot.endswith("field"):
            slot, how = f"{slot} {how[0]}", how[1]
        kind = repr(how)[:24] if isinstance(how, str) else type(how).__name__
    elif name == "cli":
        slot = " ".join(
            a for a in recipe["argv"][:1] + recipe["argv"][1:] if a.startswith("--") or a == recipe["argv"][0]
        )
    message = re.sub(r"accepted (\w+)=.*?, which", r"accepted \1=..., which", detail)
    message = re.sub(r"'[^']*' object", "'…' object", message)
    message = re.sub(r"[0-9]+(\.[0-9]+)?(e-?[0-9]+)?", "N", message)[:150]
    return f"{outcome}: {name}" + (f" [{slot}]" if slot else "") + f": {message}", kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=int, default=50000, help="inputs in all, shared among the calls")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=60, help="bad inputs to list with their recipes")
    opts = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_DATA, (HOST_BYTES, HOST_BYTES))
    print(f"Machine: {cpu()}, Python {sys.version.split()[0]}, NumPy {np.__version__}; {time.strftime('%Y-%m-%d')}")
    counts: dict[str, Counter[str]] = {name: Counter() for name in CALLS}
    bad: list[tuple[str, str, str, dict]] = []
    classes: Counter[str] = Counter()
    kinds: dict[str, set[str]] = {}
    rng = random.Random(opts.seed)
    plan = counts_for(opts.random)
    order = [name for name, n in plan.items() for _ in range(n)]
    rng.shuffle(order)
    start = time.perf_counter()
    for name in order:
        recipe = draw(name, rng)
        outcome, detail = run_case(name, recipe)
        counts[name][outcome] += 1
        if outcome in ("wrong", "undocumented", "hang"):
            key, kind = pattern(name, recipe, outcome, detail)
            classes[key] += 1
            kinds.setdefault(key, set()).add(kind)
            if len(bad) < opts.show:
                bad.append((name, outcome, detail, recipe))
    seconds = time.perf_counter() - start

    total = Counter[str]()
    print(f"\n| call | inputs | {' | '.join(OUTCOMES)} |\n|---|---:|" + "---:|" * len(OUTCOMES))
    for name in CALLS:
        c = counts[name]
        total.update(c)
        print(f"| `{name}` | {sum(c.values()):,} | " + " | ".join(f"{c[o]:,}" for o in OUTCOMES) + " |")
    print(f"| **all** | **{sum(total.values()):,}** | " + " | ".join(f"**{total[o]:,}**" for o in OUTCOMES) + " |")
    n = sum(total.values())
    print(f"\n{n:,} inputs in {seconds:.0f} s ({math.floor(n / seconds)} per second)")
    print(f"\nFirst {len(bad)} bad inputs:")
    for name, outcome, detail, recipe in bad:
        print(f"{outcome}: {name}: {detail}\n    {describe(recipe)[:400]}")
    print(f"\n{len(classes)} distinct failures (count, outcome, call [what was hostile], message; the hostile kinds):")
    for text, k in sorted(classes.items(), key=lambda kv: (-kv[1], kv[0])):
        shown = sorted(x for x in kinds[text] if x)
        print(f"{k:6,}  {text}" + (f"  ({', '.join(shown[:6])}{', ...' if len(shown) > 6 else ''})" if shown else ""))


if __name__ == "__main__":
    main()
