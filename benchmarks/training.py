"""One Adam training step of a 4-block MLP stack under every ZeRO stage, against plain NumPy.

B=512, D=1024, F=4096, L=4, float32, ReLU, 8 chips (``Mesh(X=8)``; tp on ``Mesh(Y=8)`` and
fsdp_tp on ``Mesh(X=2, Y=4)`` for reference). The yardstick is one single-device step in
plain NumPy: forward through the four blocks, mean squared error, backward, and an in-place
Adam update of the 33.5M parameters. A contender is :meth:`shardsim.training.Trainer.step`,
the full entry point (trace and ledger on). Each round runs every contender once, in turn
(interleaved), so drift hits all alike; medians and ratios come from one run. Target: every
stage within 1.3x of the single-device step.

Run by hand: ``python benchmarks/training.py [--repeats N] [--profile zero1]``.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import platform
import pstats
from collections.abc import Callable

import numpy as np
from _timing import cpu, medians

import shardsim as ss
from shardsim import mlp
from shardsim.training import Adam, Trainer

B, D, F, L = 512, 1024, 4096, 4
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8
MESHES = {
    "ddp": {"X": 8},
    "zero1": {"X": 8},
    "zero2": {"X": 8},
    "zero3": {"X": 8},
    "tp": {"Y": 8},
    "fsdp_tp": {"X": 2, "Y": 4},
}
STAGES = ("ddp", "zero1", "zero2", "zero3")
TARGET = 1.3


class SingleDevice:
    """Plain NumPy: the stack's forward and backward and Adam, on one device, nothing else."""

    def __init__(self, params: dict[str, np.ndarray]) -> None:
        self.w = {k: v.copy() for k, v in params.items()}
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        w_in, w_out = self.w["w_in"], self.w["w_out"]
        saved = []
        for i in range(L):  # forward
            h_pre = x @ w_in[i]
            h = np.maximum(h_pre, 0)
            saved.append((x, h_pre, h))
            x = h @ w_out[i]
        diff = x - y
        loss = float(np.mean(diff * diff))
        dout = diff * (2.0 / diff.size)
        grads = {"w_in": np.empty_like(w_in), "w_out": np.empty_like(w_out)}
        for i in reversed(range(L)):  # backward
            x_i, h_pre, h = saved.pop()
            grads["w_out"][i] = h.T @ dout
            dh = (dout @ w_out[i].T) * (h_pre > 0)
            grads["w_in"][i] = x_i.T @ dh
            dout = dh @ w_in[i].T
        self.t += 1
        for k, g in grads.items():  # Adam, in place
            m, v, w = self.m[k], self.v[k], self.w[k]
            m *= B1
            m += (1 - B1) * g
            v *= B2
            g *= g
            g *= 1 - B2
            v += g
            denom = np.sqrt(v, out=g)
            denom *= 1 / np.sqrt(1 - B2**self.t)
            denom += EPS
            np.divide(m, denom, out=denom)
            denom *= LR / (1 - B1**self.t)
            w -= denom
        return loss


def contenders(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> dict[str, Callable[[], object]]:
    single = SingleDevice(params)
    out: dict[str, Callable[[], object]] = {"single-device": lambda: single.step(x, y)}
    for name, sizes in MESHES.items():
        trainer = Trainer(name, ss.Mesh(sizes), params, Adam(lr=LR, b1=B1, b2=B2, eps=EPS), activation="relu")
        out[name] = lambda trainer=trainer: trainer.step(x, y)
    return out


def machine() -> str:
    return f"{cpu()}, Python {platform.python_version()}, NumPy {np.__version__}, {datetime.date.today()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile", metavar="SCHEME", help="profile one step of SCHEME with cProfile instead")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    params = mlp.init_stack(L, D, F, seed=0, dtype="float32")
    x = rng.standard_normal((B, D)).astype(np.float32)
    y = rng.standard_normal((B, D)).astype(np.float32)
    runs = contenders(params, x, y)
    for fn in runs.values():  # warm up (BLAS threads, first-touch pages)
        fn()
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(runs[args.profile])
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        return
    times = dict(zip(runs, medians(list(runs.values()), args.repeats, warmups=0)))  # warmed up above
    base = times["single-device"]
    print(f"{machine()}, {args.repeats} rounds")
    print(f"| contender | mesh | median (ms) | ratio | target <= {TARGET}x |")
    print("|---|---|---:|---:|---|")
    for key, med in times.items():
        mesh = "1 device" if key == "single-device" else repr(ss.Mesh(MESHES[key]))
        verdict = ("met" if med / base <= TARGET else "MISSED") if key in STAGES else "-"
        print(f"| {key} | {mesh} | {med * 1e3:.0f} | {med / base:.2f} | {verdict} |")


if __name__ == "__main__":
    main()
