"""The JAX engine's step of each scheme against a hand-written ``shard_map`` of the same collectives.

B=256, D=512, F=2048, float32, ReLU, on 8 fake CPU devices (``Mesh(X=8)``, ``Mesh(Y=8)``,
``Mesh(X=2, Y=4)`` for fsdp_tp), forward and backward. The engine's function is
``shardsim.engines.jax.compile``'s; the hand-written one is the scheme's steps written
directly with ``jax.lax`` on local blocks. Both are jitted and compiled before timing; each
round runs every contender once, in turn; medians of one run. Run by hand:
``python benchmarks/engines.py [--repeats N]``.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from _timing import cpu, medians
from jax import lax

import shardsim as ss
from shardsim.engines import jax as engine

B, D, F = 256, 512, 2048
MESHES = {"ddp": {"X": 8}, "fsdp": {"X": 8}, "tp": {"Y": 8}, "fsdp_tp": {"X": 2, "Y": 4}}


def relu(h: Any) -> Any:
    return jax.numpy.maximum(h, 0)


def mask(h_pre: Any) -> Any:
    return (h_pre > 0).astype(h_pre.dtype)


def ag(v: Any, axis: str, dim: int) -> Any:
    return lax.all_gather(v, axis, axis=dim, tiled=True)


def rs(v: Any, axis: str, dim: int) -> Any:
    return lax.psum_scatter(v, axis, scatter_dimension=dim, tiled=True)


def ddp(p: dict[str, Any], x: Any, dout: Any) -> Any:
    h_pre = x @ p["w_in"]
    h = relu(h_pre)
    out = h @ p["w_out"]
    dw_out = lax.psum(h.T @ dout, "X")
    dh = (dout @ p["w_out"].T) * mask(h_pre)
    dw_in = lax.psum(x.T @ dh, "X")
    return out, {"x": dh @ p["w_in"].T, "w_in": dw_in, "w_out": dw_out}


def fsdp(p: dict[str, Any], x: Any, dout: Any) -> Any:
    h_pre = x @ ag(p["w_in"], "X", 0)
    h = relu(h_pre)
    out = h @ ag(p["w_out"], "X", 0)
    w_out = ag(p["w_out"], "X", 0)
    dw_out = rs(h.T @ dout, "X", 0)
    dh = (dout @ w_out.T) * mask(h_pre)
    w_in = ag(p["w_in"], "X", 0)
    dw_in = rs(x.T @ dh, "X", 0)
    return out, {"x": dh @ w_in.T, "w_in": dw_in, "w_out": dw_out}


def tp(p: dict[str, Any], x: Any, dout: Any) -> Any:
    x_full = ag(x, "Y", 1)
    h_pre = x_full @ p["w_in"]
    h = relu(h_pre)
    out = rs(h @ p["w_out"], "Y", 1)
    dout_full = ag(dout, "Y", 1)
    dw_out = h.T @ dout_full
    dh = (dout_full @ p["w_out"].T) * mask(h_pre)
    dw_in = x_full.T @ dh
    return out, {"x": rs(dh @ p["w_in"].T, "Y", 1), "w_in": dw_in, "w_out": dw_out}


def fsdp_tp(p: dict[str, Any], x: Any, dout: Any) -> Any:
    h_pre = ag(x, "Y", 1) @ ag(p["w_in"], "X", 0)
    h = relu(h_pre)
    out = rs(h @ ag(p["w_out"], "X", 1), "Y", 1)
    dout_full = ag(dout, "Y", 1)
    dw_out = rs(h.T @ dout_full, "X", 1)
    dh = (dout_full @ ag(p["w_out"], "X", 1).T) * mask(h_pre)
    dw_in = rs(ag(x, "Y", 1).T @ dh, "X", 0)
    dx = rs(dh @ ag(p["w_in"], "X", 0).T, "Y", 1)
    return out, {"x": dx, "w_in": dw_in, "w_out": dw_out}


HAND = {"ddp": ddp, "fsdp": fsdp, "tp": tp, "fsdp_tp": fsdp_tp}


def contenders(name: str, params: dict[str, np.ndarray], x: np.ndarray, dout: np.ndarray) -> list[Callable[[], Any]]:
    """The engine's compiled step and the hand-written one, on the same arguments; checked equal once."""
    fn, args = engine.compile(name, ss.Mesh(MESHES[name]), params, x, dout, activation="relu")
    p_spec, x_spec, d_spec = (jax.tree.map(lambda a: a.sharding.spec, a) for a in args)
    out, grads = jax.eval_shape(fn, *args)
    out_specs = jax.tree.map(lambda a: a.sharding.spec, (out, grads))
    jmesh = args[1].sharding.mesh
    hand = jax.jit(jax.shard_map(HAND[name], mesh=jmesh, in_specs=(p_spec, x_spec, d_spec), out_specs=out_specs))
    ours, theirs = fn.lower(*args).compile(), hand.lower(*args).compile()
    a, b = ours(*args), theirs(*args)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-4, atol=1e-4)
    return [lambda: jax.block_until_ready(ours(*args)), lambda: jax.block_until_ready(theirs(*args))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    params = ss.mlp.init(D, F, seed=0, dtype="float32")
    x = rng.standard_normal((B, D)).astype(np.float32)
    dout = rng.standard_normal((B, D)).astype(np.float32)
    fns: list[Callable[[], Any]] = []
    for name in MESHES:
        fns += contenders(name, params, x, dout)
    times = medians(fns, args.repeats, alternate=True)
    print(f"{cpu()}, jax {jax.__version__}, 8 CPU devices, {args.repeats} rounds")
    print(f"{'scheme':<10}{'mesh':<16}{'engine ms':>10}{'shard_map ms':>14}{'ratio':>8}")
    for i, name in enumerate(MESHES):
        ours, theirs = times[2 * i], times[2 * i + 1]
        mesh = str(ss.Mesh(MESHES[name]))
        print(f"{name:<10}{mesh:<16}{ours * 1e3:>10.2f}{theirs * 1e3:>14.2f}{ours / theirs:>8.2f}")


if __name__ == "__main__":
    main()
