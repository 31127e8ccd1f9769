"""The JAX engine's kernels: one device's block inside ``jax.shard_map``.

A value's data is the device's own block with a leading size-1 dimension per mesh axis,
so the front end indexes blocks exactly as on the stacked engine. Each collective is the
``jax.lax`` collective of the scaling book's notation:

===============  ================================================
shardsim         inside ``shard_map``
===============  ================================================
all_gather       ``lax.all_gather(x, axes, axis=d, tiled=True)``
reduce_scatter   ``lax.psum_scatter(x, axes, scatter_dimension=d, tiled=True)``
all_reduce       ``lax.psum(x, axes)``
all_to_all       ``lax.all_to_all(x, axes, split, concat, tiled=True)``
ppermute         ``lax.ppermute(x, axes, perm)``
local slice      ``lax.dynamic_slice_in_dim`` at ``lax.axis_index(axes)``
chip index       ``lax.axis_index(axis)``
own blocks       a host constant's block at ``lax.axis_index`` of each axis
===============  ================================================

A partial sum ``{U_Y}`` is an ordinary value that varies over ``Y``; there are no lazy
partials on this engine (``lazy_partials`` is False): XLA schedules the reduction.

>>> JAX.name, JAX.lazy_partials
('jax', False)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ..stacked import Engine


class JaxEngine(Engine):
    """The kernels on a device's block (with size-1 mesh dims in front); see the module's table."""

    name = "jax"
    lazy_partials = False
    per_device = True

    def chip_index(self, nm: int, position: int, name: str, size: int) -> Any:
        return lax.axis_index(name).reshape((1,) * nm)

    def own_blocks(self, c: Any, names: tuple[str, ...]) -> Any:
        if all(n == 1 for n in c.shape[: len(names)]):
            return c  # the same on every device: it stays a host constant, readable while JAX traces
        mine = tuple(lax.axis_index(n) if c.shape[i] > 1 else 0 for i, n in enumerate(names))
        return jnp.asarray(c)[mine].reshape((1,) * len(names) + c.shape[len(names) :])

    def cast(self, c: Any, dtype: Any) -> Any:
        # JAX's own dtype for it (int64 is int32 without jax_enable_x64): the ledger counts the logical one
        return c.astype(jax.dtypes.canonicalize_dtype(dtype))

    def elementwise(self, fn: Callable[..., Any], nm: int, *cs: Any) -> Any:
        # on the block without the size-1 mesh dims, as every other kernel: with them XLA
        # orders the step's independent dots differently from the same program written by hand
        out = fn(*(c.reshape(c.shape[nm:]) for c in cs))
        return out.reshape((1,) * nm + out.shape)

    def matmul(self, lhs: Any, rhs: Any) -> Any:
        lead = jnp.broadcast_shapes(lhs.shape[:-2], rhs.shape[:-2])
        if all(n == 1 for n in lead):  # the usual case: one 2-D matmul per device, XLA's fastest
            out = lhs.reshape(lhs.shape[-2:]) @ rhs.reshape(rhs.shape[-2:])
            return out.reshape(lead + out.shape)
        return jnp.matmul(lhs, rhs)

    def transpose(self, c: Any, nm: int, perm: Sequence[int]) -> Any:
        return _on_block(c, nm, lambda b: b.transpose(list(perm)))

    def sum(self, c: Any, axis: int, keepdims: bool) -> Any:
        return jnp.sum(c, axis=axis, keepdims=keepdims)

    def all_gather(self, c: Any, nm: int, positions: Sequence[int], names: tuple[str, ...], dim: int) -> Any:
        return _on_block(c, nm, lambda b: lax.all_gather(b, names, axis=dim, tiled=True))

    def all_reduce(self, c: Any, positions: Sequence[int], names: tuple[str, ...]) -> Any:
        return lax.psum(c, names)

    def reduce_scatter(
        self, c: Any, nm: int, positions: Sequence[int], names: tuple[str, ...], sizes: Sequence[int], dim: int
    ) -> Any:
        return _on_block(c, nm, lambda b: lax.psum_scatter(b, names, scatter_dimension=dim, tiled=True))

    def all_to_all(
        self,
        c: Any,
        nm: int,
        positions: Sequence[int],
        names: tuple[str, ...],
        sizes: Sequence[int],
        src: int,
        dst: int,
    ) -> Any:
        return _on_block(c, nm, lambda b: lax.all_to_all(b, names, split_axis=dst, concat_axis=src, tiled=True))

    def ppermute(self, c: Any, positions: Sequence[int], names: tuple[str, ...], src_of: Sequence[int]) -> Any:
        return lax.ppermute(c, names, perm=[(int(s), d) for d, s in enumerate(src_of)])

    def local_slice(
        self, c: Any, nm: int, positions: Sequence[int], names: tuple[str, ...], sizes: Sequence[int], dim: int
    ) -> Any:
        chunk = c.shape[nm + dim] // math.prod(sizes)
        return _on_block(c, nm, lambda b: lax.dynamic_slice_in_dim(b, lax.axis_index(names) * chunk, chunk, axis=dim))


def _on_block(c: Any, nm: int, fn: Callable[[Any], Any]) -> Any:
    """``fn`` of the device's block without the size-1 mesh dims, which are put back after.

    XLA lays out and fuses the block's own dimensions better without them (a transpose folds
    into the matmul reading it, a gathered block needs no copy).
    """
    out = fn(c.reshape(c.shape[nm:]))
    return out.reshape(c.shape[:nm] + out.shape)


JAX = JaxEngine()
