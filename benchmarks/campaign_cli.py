"""A hand-run campaign of hostile ``shardsim`` command lines (not part of the test suite).

Runs N invocations from ``tests/cli_cases.py`` in-process through ``cli.main(argv)`` (with a
per-invocation time limit through SIGALRM) and a sample through a subprocess, and counts per
class: tracebacks, undocumented exceptions ("internal error" lines, or an exception escaping
``main``), hangs and wrong exit codes (2 for every mutated command line, 0 for a valid one)::

    PYTHONPATH=src python benchmarks/campaign_cli.py 10000 200
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import platform
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from cli_cases import random_case  # noqa: E402
from shardsim import cli  # noqa: E402

LIMIT_S = 30


class Hang(Exception):  # noqa: N818 - what it counts
    pass


def _alarm(signum: int, frame: object) -> None:
    raise Hang


def one(argv: list[str]) -> tuple[int | None, str, str]:
    out, err = io.StringIO(), io.StringIO()
    signal.alarm(LIMIT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
    except Hang:
        return None, "hang", ""
    except BaseException as e:  # escaped main: undocumented by definition
        return -1, f"escaped {type(e).__name__}", ""
    finally:
        signal.alarm(0)
    return code, err.getvalue(), out.getvalue()


def main(n: int = 10_000, sub: int = 200, seed: int = 2026) -> None:
    signal.signal(signal.SIGALRM, _alarm)
    rng = random.Random(seed)
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    start = time.perf_counter()
    for i in range(n + sub):
        kind, argv = random_case(rng)
        c = counts[kind]
        c["runs"] += 1
        if i < n:
            code, err, _ = one(argv)
        else:  # through a real process: the console entry point, its exit status and stderr
            env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
            try:
                p = subprocess.run(
                    [sys.executable, "-m", "shardsim", *argv], capture_output=True, text=True, env=env, timeout=LIMIT_S
                )
                code, err = p.returncode, p.stderr
            except subprocess.TimeoutExpired:
                code, err = None, "hang"
            c["subprocess"] += 1
        want = 0 if kind == "valid" else 2
        if code is None:
            c["hangs"] += 1
        elif "Traceback" in err:
            c["tracebacks"] += 1
        elif code == -1 or "internal error" in err:
            c["undocumented"] += 1
        if code is not None and code != want:
            c["wrong exit code"] += 1
        if code == 2 and len(err.splitlines()) != 1:
            c["not one line"] += 1
    took = time.perf_counter() - start
    print(f"{n} in-process + {sub} subprocess invocations, {took:.0f} s, {platform.platform()}, "
          f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")  # fmt: skip
    keys = ["runs", "subprocess", "tracebacks", "undocumented", "hangs", "wrong exit code", "not one line"]
    print("| class | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for kind in sorted(counts):
        print(f"| {kind} | " + " | ".join(str(counts[kind][k]) for k in keys) + " |")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
