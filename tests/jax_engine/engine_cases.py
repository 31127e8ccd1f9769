"""Hypothesis cases for the JAX engine's tests: a supported scheme on a 1-D or 2-D mesh, inputs that fit.

Meshes are the shapes 8 fake CPU devices allow, 1-D and 2-D including 4x2 and 2x4; a
one-role scheme on a 2-D mesh runs on one of its axes (``axes=``) and is replicated over the
other. Shapes are multiples of the chip count, so every layout divides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

import shardsim
from shardsim import strategies
from shardsim.engines.jax import SUPPORTED

MESH_SHAPES = ((2,), (4,), (8,), (2, 2), (4, 2), (2, 4))
AXIS_NAMES = (("X", "Y"), ("data", "model"), ("a", "b"))


@dataclass
class Case:
    scheme: str
    shape: dict[str, int]  # the mesh: axis name -> size
    axes: dict[str, str]  # role -> axis
    params: dict[str, np.ndarray]
    x: np.ndarray
    dout: np.ndarray
    activation: str
    dtype: Any

    def mesh(self) -> shardsim.Mesh:
        return shardsim.Mesh(self.shape)


@st.composite
def cases(draw: st.DrawFn, schemes: tuple[str, ...] = SUPPORTED) -> Case:
    name = draw(st.sampled_from(schemes))
    roles = strategies.get(name).roles
    sizes = draw(st.sampled_from([s for s in MESH_SHAPES if len(s) >= len(roles)]))
    names = draw(st.sampled_from(AXIS_NAMES))[: len(sizes)]
    order = draw(st.permutations(names)) if len(names) > len(roles) else names
    axes = dict(zip(roles, order))
    n = int(np.prod(sizes))
    b, d, f = (draw(st.integers(1, 2)) * n for _ in range(3))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    params = {k: v.astype(dtype) for k, v in shardsim.models.reference_mlp.init(d, f, seed=seed).items()}
    if name in ("ep", "dp_ep"):  # a mixture of n experts, split over the expert axis
        params = {k: v.astype(dtype) for k, v in shardsim.models.reference_moe.init(d, f, seed, experts=n).items()}
    if name in ("tp_ln", "tp_sp"):  # a LayerNorm before the MLP
        params |= {"gamma": rng.standard_normal(d).astype(dtype), "beta": rng.standard_normal(d).astype(dtype)}
    return Case(
        name,
        dict(zip(names, sizes)),
        axes,
        params,
        rng.standard_normal((b, d)).astype(dtype),
        rng.standard_normal((b, d)).astype(dtype),
        draw(st.sampled_from(["identity", "relu", "gelu"])),
        dtype,
    )
