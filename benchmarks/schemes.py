"""Forward+backward of every scheme against a plain single-device NumPy step.

B=512, D=1024, F=4096, float32, 8 chips (2x4 for fsdp_tp), ReLU. The yardstick is the six
matmuls of one single-device forward+backward (plus the activation). Each round runs every
contender once, in turn (interleaved), so drift hits all alike; we report medians and
ratios from one run. Run by hand: ``python benchmarks/schemes.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
from _timing import cpu, medians

import shardsim as ss
from shardsim import mlp, strategies
from shardsim.activations import get as get_activation
from shardsim.strategies.base import Ctx
from shardsim.strategies.runner import run

B, D, F = 512, 1024, 4096
MESHES = {"ddp": {"X": 8}, "fsdp": {"X": 8}, "tp": {"Y": 8}, "fsdp_tp": {"X": 2, "Y": 4}}


def single_device(params: dict[str, np.ndarray], x: np.ndarray, dout: np.ndarray) -> None:
    """Six matmuls and the ReLU: the least a forward+backward can do."""
    act = get_activation("relu")
    w_in, w_out = params["w_in"], params["w_out"]
    h_pre = x @ w_in
    h = act.fn(h_pre)
    h @ w_out
    h.T @ dout
    dh = (dout @ w_out.T) * act.grad(h_pre)
    x.T @ dh
    dh @ w_in.T


def bare(
    name: str,
    params: dict[str, np.ndarray],
    x: np.ndarray,
    dout: np.ndarray,
    *,
    record: bool = False,
    mesh: ss.Mesh | None = None,
) -> Callable[[], None]:
    """The scheme's own steps; with ``record``, inside a trace (the ledger always runs).

    ``mesh`` defaults to the scheme's 8-chip mesh in ``MESHES``.
    """
    scheme = strategies.get(name)
    mesh = mesh or ss.Mesh(MESHES[name])
    ctx = Ctx(axes=dict(zip(scheme.roles, mesh.axis_names)), activation="relu")
    lay = scheme.layouts(ctx)

    def steps() -> None:
        xs = ss.shard(x, mesh, lay["x"])
        ps = {k: ss.shard(params[k], mesh, lay[k], category="params") for k in ("w_in", "w_out")}
        out, saved = scheme.forward(ctx, xs, ps)
        dx, grads = scheme.backward(ctx, saved, ss.shard(dout, mesh, lay["out"]), ps)
        out.compact(), dx.compact(), [g.compact() for g in grads.values()]

    def step() -> None:
        if not record:
            return steps()
        with ss.trace():
            return steps()

    return step


def entry_point(name: str, params: dict[str, np.ndarray], x: np.ndarray, dout: np.ndarray) -> Callable[[], None]:
    """``run_strategy``: trace, ledger, and results copied out to global NumPy arrays."""
    scheme = strategies.get(name)

    def step() -> None:
        run(scheme, ss.Mesh(MESHES[name]), params, x, dout, activation="relu")

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    params = mlp.init(D, F, seed=0, dtype="float32")
    x = rng.standard_normal((B, D)).astype(np.float32)
    dout = rng.standard_normal((B, D)).astype(np.float32)
    contenders: dict[str, Callable[[], None]] = {"single-device": lambda: single_device(params, x, dout)}
    for name in MESHES:
        contenders[f"{name} (bare)"] = bare(name, params, x, dout)
        contenders[f"{name} (traced)"] = bare(name, params, x, dout, record=True)
        contenders[f"{name} (run_strategy)"] = entry_point(name, params, x, dout)
    times = dict(zip(contenders, medians(list(contenders.values()), args.repeats, warmups=1)))
    base = times["single-device"]
    print(f"{cpu()}, numpy {np.__version__}, {args.repeats} rounds")
    print(f"{'contender':<28}{'median ms':>10}{'ratio':>8}")
    for key, med in times.items():
        print(f"{key:<28}{med * 1e3:>10.1f}{med / base:>8.2f}")


if __name__ == "__main__":
    main()
