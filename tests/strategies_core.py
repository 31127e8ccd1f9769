"""Hypothesis strategies for meshes, layouts and shapes, and plain-NumPy references.

The references here never call shardsim's block kernels: they place every chip's block by
explicit slicing, chip by chip, so a test compares the stacked kernels against the obvious
definition of a layout.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

import shardsim
from shardsim.layout import Dim, Layout
from shardsim.testing import layouts, meshes  # the tests draw their meshes and layouts from here too

# the core properties (collectives, matmuls) run three times the profile's examples
deep = settings(max_examples=3 * settings.default.max_examples)

DTYPES = (np.float32, np.float64)


def parts(mesh: shardsim.Mesh, axes: Sequence[str]) -> int:
    """Number of blocks a dimension split over ``axes`` has (1 when not split)."""
    return math.prod(mesh.axis_size(a) for a in axes)


@st.composite
def global_shapes(draw: st.DrawFn, mesh: shardsim.Mesh, layout: Layout, max_local: int = 3) -> tuple[int, ...]:
    """A global shape whose every dimension divides by its axes (local sizes 1..max_local)."""
    return tuple(draw(st.integers(1, max_local)) * parts(mesh, d.axes) for d in layout.dims)


def random_array(shape: Sequence[int], dtype: type, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(tuple(shape)).astype(dtype)


seeds = st.integers(0, 2**32 - 1)
dtypes = st.sampled_from(DTYPES)


@dataclass
class Case:
    """A mesh, a layout on it, a global array that fits it."""

    mesh: shardsim.Mesh
    layout: Layout
    array: np.ndarray


@st.composite
def cases(draw: st.DrawFn, rank: st.SearchStrategy[int] | None = None, *, min_split: int = 0) -> Case:
    """A random mesh, a random layout (no partial) with at least ``min_split`` split dims, data."""
    mesh = draw(meshes())
    r = draw(rank if rank is not None else st.integers(1, 3))
    layout = draw(layouts(mesh, r))
    split = [d for d in layout.dims if d.axes]
    if len(split) < min_split:
        # force one split: the first axis onto the first dim, dropping it elsewhere
        axis = mesh.axis_names[0]
        dims = [Dim(d.name, tuple(a for a in d.axes if a != axis)) for d in layout.dims]
        dims[0] = Dim(dims[0].name, (*dims[0].axes, axis))
        layout = Layout(tuple(dims))
    shape = draw(global_shapes(mesh, layout))
    return Case(mesh, layout, random_array(shape, draw(dtypes), draw(seeds)))


@dataclass
class MatmulCase:
    """Global operands ``a @ b``, their layouts, and the mesh axes that split the contraction."""

    mesh: shardsim.Mesh
    a: np.ndarray
    b: np.ndarray
    la: Layout
    lb: Layout
    k_axes: tuple[str, ...]


@st.composite
def legal_matmuls(draw: st.DrawFn, batch: bool = False, rhs_batched: bool = True, split_k: bool = False) -> MatmulCase:
    """Book cases 1 and 3: each mesh axis splits M, N, K (both sides), a batch dim L, or nothing.

    Roles are disjoint, so a 2-D right operand never uses an axis that splits the batch dim.
    """
    mesh = draw(meshes())
    roles: dict[str, list[str]] = {"L": [], "M": [], "K": [], "N": []}
    choices = ["-", "M", "K", "N"] + (["L"] if batch else [])
    for axis in draw(st.permutations(mesh.axis_names)):
        role = draw(st.sampled_from(choices))
        if role != "-":
            roles[role].append(axis)
    if split_k and not roles["K"]:  # case 3 wanted: move the first axis onto K
        axis = mesh.axis_names[0]
        roles = {r: [a for a in axes if a != axis] for r, axes in roles.items()}
        roles["K"] = [axis]
    k_parts = parts(mesh, roles["K"])

    def size(role: str, extra: int = 1) -> int:
        return draw(st.integers(1, 3)) * parts(mesh, roles[role]) * extra

    m, k, n = size("M", k_parts), size("K"), size("N", k_parts)  # M and N also divide for a ReduceScatter
    lead = (size("L"),) if batch else ()
    dims = {r: Dim(r, tuple(roles[r])) for r in roles}
    la = Layout(((dims["L"],) if batch else ()) + (dims["M"], dims["K"]))
    lb = Layout(((dims["L"],) if batch and rhs_batched else ()) + (dims["K"], dims["N"]))
    dtype = draw(dtypes)
    a = random_array(lead + (m, k), dtype, draw(seeds))
    b = random_array((lead if rhs_batched else ()) + (k, n), dtype, draw(seeds))
    return MatmulCase(mesh, a, b, la, lb, tuple(roles["K"]))


# -- the MLP schemes on their meshes ------------------------------------------------------------
MLP_SCHEMES = {  # the mesh axes of each MLP scheme's roles: data on X, model on Y
    "ddp": ("X",),
    "zero1": ("X",),
    "zero2": ("X",),
    "zero3": ("X",),
    "fsdp": ("X",),
    "tp": ("Y",),
    "fsdp_tp": ("X", "Y"),
}


@st.composite
def scheme_meshes(
    draw: st.DrawFn, max_size: int = 8, max_pair: int = 4
) -> tuple[str, dict[str, int], tuple[int, int, int]]:
    """An MLP scheme, its mesh sizes (1..max_size chips on its one axis, or X and Y of 1..max_pair
    each) and a shape ``(B, D, F)`` that divides over them: B by X, D and F by every axis."""
    name = draw(st.sampled_from(list(MLP_SCHEMES)))
    roles = MLP_SCHEMES[name]
    if len(roles) == 1:
        sizes = {roles[0]: draw(st.integers(1, max_size))}
    else:
        sizes = {"X": draw(st.integers(1, max_pair)), "Y": draw(st.integers(1, max_pair))}
    lcm = math.lcm(*sizes.values())
    b = sizes.get("X", 1) * draw(st.integers(1, 3))
    d = lcm * draw(st.integers(1, 3))
    f = lcm * draw(st.integers(1, 3))
    return name, sizes, (b, d, f)


# -- plain-NumPy references -----------------------------------------------------------------------
def chip_index(mesh: shardsim.Mesh, coords: dict[str, int], axes: Sequence[str]) -> int:
    """Block number of a dimension split over ``axes`` on chip ``coords`` (first axis major)."""
    index = 0
    for a in axes:
        index = index * mesh.axis_size(a) + coords[a]
    return index


def chip_slices(mesh: shardsim.Mesh, layout: Layout, shape: Sequence[int], coords: dict[str, int]) -> tuple[slice, ...]:
    """The global slices chip ``coords`` holds under ``layout``."""
    out = []
    for n, d in zip(shape, layout.dims):
        size = n // parts(mesh, d.axes)
        k = chip_index(mesh, coords, d.axes)
        out.append(slice(k * size, (k + 1) * size))
    return tuple(out)


def all_chips(mesh: shardsim.Mesh) -> list[dict[str, int]]:
    return [dict(zip(mesh.axis_names, c)) for c in itertools.product(*map(range, mesh.shape))]


def expected_blocks(mesh: shardsim.Mesh, layout: Layout, array: np.ndarray) -> np.ndarray:
    """Every chip's block, shape ``mesh.shape + local``, cut from ``array`` by slicing."""
    chips = all_chips(mesh)
    first = array[chip_slices(mesh, layout, array.shape, chips[0])]
    out = np.empty(mesh.shape + first.shape, array.dtype)
    for c in chips:
        out[tuple(c[a] for a in mesh.axis_names)] = array[chip_slices(mesh, layout, array.shape, c)]
    return out


def assemble(mesh: shardsim.Mesh, layout: Layout, blocks: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """The global array whose chips hold ``blocks`` (inverse of :func:`expected_blocks`)."""
    out = np.empty(tuple(shape), blocks.dtype)
    for c in all_chips(mesh):
        out[chip_slices(mesh, layout, shape, c)] = blocks[tuple(c[a] for a in mesh.axis_names)]
    return out


def assert_blocks(x: shardsim.ShardedArray, array: np.ndarray) -> None:
    """Every chip's ``local()`` block equals the slice of ``array`` its layout names (bitwise)."""
    for c in all_chips(x.mesh):
        want = array[chip_slices(x.mesh, x.layout, array.shape, c)]
        np.testing.assert_array_equal(x.local(**c), want, err_msg=f"chip {c} of {x.layout}")


def assert_close(got: np.ndarray, want: np.ndarray, scale: np.ndarray, dtype: object, contraction: int) -> None:
    """``|got - want| <= tol * scale`` elementwise, tol from the dtype and the contraction length.

    ``scale`` is the sum of absolute terms (e.g. ``|A| @ |B|``), the standard bound for a
    floating-point sum whatever its order.
    """
    tol = shardsim.dtypes.tolerance(dtype, contraction)
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    bound = tol * scale.astype(np.float64) + np.finfo(np.float64).tiny
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else ()
    assert (err <= bound).all(), f"error {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst} (tol {tol:.3g})"
