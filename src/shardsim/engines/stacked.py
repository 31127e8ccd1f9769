"""The stacked NumPy engine: every chip's block in one NumPy array (the default engine).

A value is one array of shape ``(m0, m1, ..., *block)``, ``mi`` the size of mesh axis ``i``
where the value varies along it and 1 where it is replicated (see ``docs/design.md``).
Its kernels are :mod:`shardsim._blocks`; a collective is a reshape, a transpose or a sum
over the leading mesh dimensions. Two optimisations live here, behind the seam: a partial
sum of a matmul stays its operands (:class:`LazyMatmul`) until the reduction folds the chips
into the contraction, and chips whose blocks meet one shared operand are folded into one
matmul (``_blocks.matmul``).

>>> import numpy as np
>>> p = LazyMatmul(np.ones((2, 1, 3)), np.ones((2, 3, 1)))  # chip p holds lhs[p] @ rhs[p]
>>> STACKED.all_reduce(p, [0], ("X",)).materialize()
array([[[6.]]])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _blocks


class LazyMatmul:
    """A partial sum kept as its operands: every chip's block is ``lhs @ rhs`` (compact data).

    The reduction that clears the partial folds the chip axis into the contraction and runs
    one large matmul instead of materialising N full-size partials and adding them.
    """

    __slots__ = ("lhs", "rhs")

    def __init__(self, lhs: np.ndarray, rhs: np.ndarray) -> None:
        self.lhs, self.rhs = lhs, rhs

    def materialize(self) -> np.ndarray:
        return _blocks.matmul(self.lhs, self.rhs)

    def block(self, index: tuple[int, ...]) -> np.ndarray:
        nm = len(index)
        li = tuple(i if n > 1 else 0 for i, n in zip(index, self.lhs.shape[:nm]))
        ri = tuple(i if n > 1 else 0 for i, n in zip(index, self.rhs.shape[:nm]))
        return _blocks.matmul(self.lhs[li], self.rhs[ri])


class Engine:
    """The kernels an engine gives the front end; :class:`StackedEngine` documents each.

    ``lazy_partials`` says whether a matmul's partial sum may stay a :class:`LazyMatmul`
    (only on the stacked engine, whose reductions know how to fold it); ``reads_data``
    whether the front end may inspect the numbers (for checks such as overflow of a scaled
    partial sum), which a tracing engine's data does not allow; ``per_device`` whether a
    value's data is one chip's block (every mesh dimension 1) rather than every chip's.
    """

    name = "engine"
    lazy_partials = False
    reads_data = False
    per_device = False

    def chip_index(self, nm: int, position: int, name: str, size: int) -> Any:
        """Each chip's index along mesh axis ``name`` (``position`` of ``nm``, ``size`` chips),
        as an integer array with the mesh dims leading, to broadcast against blocks."""
        raise NotImplementedError

    def own_blocks(self, c: np.ndarray, names: tuple[str, ...]) -> Any:
        """The engine's data of a value whose every chip's block is stacked in ``c`` (mesh dims
        leading, named ``names``): a host constant such as a mask or the sequence's positions."""
        raise NotImplementedError

    def cast(self, c: Any, dtype: Any) -> Any:
        raise NotImplementedError

    def elementwise(self, fn: Any, nm: int, *cs: Any) -> Any:
        raise NotImplementedError

    def matmul(self, lhs: Any, rhs: Any) -> Any:
        raise NotImplementedError

    def sum(self, c: Any, axis: int, keepdims: bool) -> Any:
        raise NotImplementedError

    def transpose(self, c: Any, nm: int, perm: Sequence[int]) -> Any:
        raise NotImplementedError

    def all_gather(self, c: Any, nm: int, positions: Sequence[int], names: tuple[str, ...], dim: int) -> Any:
        raise NotImplementedError

    def all_reduce(self, c: Any, positions: Sequence[int], names: tuple[str, ...]) -> Any:
        raise NotImplementedError

    def reduce_scatter(
        self, c: Any, nm: int, positions: Sequence[int], names: tuple[str, ...], sizes: Sequence[int], dim: int
    ) -> Any:
        raise NotImplementedError

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
        raise NotImplementedError

    def ppermute(self, c: Any, positions: Sequence[int], names: tuple[str, ...], src_of: Sequence[int]) -> Any:
        raise NotImplementedError

    def local_slice(
        self, c: Any, nm: int, positions: Sequence[int], names: tuple[str, ...], sizes: Sequence[int], dim: int
    ) -> Any:
        raise NotImplementedError


class StackedEngine(Engine):
    """Every chip's block in one NumPy array; a collective moves blocks between leading dims.

    >>> import numpy as np
    >>> c = np.arange(4.0).reshape(2, 1, 2)  # two chips over X, a (1, 2) block each
    >>> STACKED.reduce_scatter(c, 1, [0], ("X",), [2], 1)[:, 0]  # sum, then chip p keeps column p
    array([[2.],
           [4.]])
    """

    name = "stacked"
    lazy_partials = True
    reads_data = True

    def chip_index(self, nm: int, position: int, name: str, size: int) -> np.ndarray:
        """``0 .. size-1`` along mesh dim ``position`` (every chip's index at once)."""
        shape = [1] * nm
        shape[position] = size
        return np.arange(size).reshape(shape)

    def own_blocks(self, c: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
        """``c`` itself: this engine's data is every chip's blocks."""
        return c

    def cast(self, c: Any, dtype: Any) -> np.ndarray:
        """The data in ``dtype`` (no copy when it has it already)."""
        return np.asarray(c, dtype)

    def elementwise(self, fn: Any, nm: int, *cs: Any) -> Any:
        """``fn`` of the stacked data (``nm`` leading mesh dims), one NumPy call for every chip."""
        return fn(*cs)

    def matmul(self, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        """Every chip's ``lhs @ rhs`` (one BLAS call when the chips fold into one matmul)."""
        return _blocks.matmul(lhs, rhs)

    def sum(self, c: np.ndarray, axis: int, keepdims: bool) -> np.ndarray:
        """Each chip's sum over one dimension of its block."""
        return np.sum(c, axis=axis, keepdims=keepdims)

    def transpose(self, c: np.ndarray, nm: int, perm: Sequence[int]) -> np.ndarray:
        """Every chip's block with its dimensions permuted (a view)."""
        return c.transpose(list(range(nm)) + [nm + i for i in perm])

    def all_gather(self, c: np.ndarray, nm: int, positions: Sequence[int], names: tuple[str, ...], dim: int) -> Any:
        """Concatenate the blocks along mesh dims ``positions`` into block dimension ``dim``."""
        return _blocks.merge_into_local(c, nm, positions, dim)

    def all_reduce(
        self, c: np.ndarray | LazyMatmul, positions: Sequence[int], names: tuple[str, ...]
    ) -> np.ndarray | LazyMatmul:
        """Sum the blocks over mesh dims ``positions``; a lazy partial folds the chips into its contraction."""
        if isinstance(c, LazyMatmul):
            return LazyMatmul(*_blocks.fold_contraction(c.lhs, c.rhs, positions))
        return _blocks.sum_mesh(c, positions)

    def reduce_scatter(
        self,
        c: np.ndarray | LazyMatmul,
        nm: int,
        positions: Sequence[int],
        names: tuple[str, ...],
        sizes: Sequence[int],
        dim: int,
    ) -> np.ndarray:
        """Sum over mesh dims ``positions``, then cut block dimension ``dim`` into their chips' pieces."""
        reduced = self.all_reduce(c, positions, names)
        if isinstance(reduced, LazyMatmul):
            reduced = reduced.materialize()
        return _blocks.split_local(reduced, nm, positions, sizes, dim)

    def all_to_all(
        self,
        c: np.ndarray,
        nm: int,
        positions: Sequence[int],
        names: tuple[str, ...],
        sizes: Sequence[int],
        src: int,
        dst: int,
    ) -> np.ndarray:
        """Concatenate the blocks along ``src``, then cut ``dst`` into the chips' pieces."""
        gathered = _blocks.merge_into_local(c, nm, positions, src)
        return _blocks.split_local(gathered, nm, positions, sizes, dst)

    def ppermute(
        self, c: np.ndarray, positions: Sequence[int], names: tuple[str, ...], src_of: Sequence[int]
    ) -> np.ndarray:
        """Chip ``d`` (linear index over ``positions``, major first) gets chip ``src_of[d]``'s block."""
        if all(c.shape[p] == 1 for p in positions):
            return c  # replicated along the axes (or they have one chip): nothing changes
        front = list(range(len(positions)))
        y = np.moveaxis(c, positions, front)
        lead = y.shape[: len(positions)]
        flat = y.reshape((math.prod(lead),) + y.shape[len(positions) :])
        return np.moveaxis(flat[list(src_of)].reshape(y.shape), front, list(positions))

    def local_slice(
        self, c: np.ndarray, nm: int, positions: Sequence[int], names: tuple[str, ...], sizes: Sequence[int], dim: int
    ) -> np.ndarray:
        """Each chip keeps its piece of block dimension ``dim``, cut over mesh dims ``positions`` (read-only)."""
        out = _blocks.split_local(c, nm, positions, sizes, dim).view()
        out.flags.writeable = False  # a view of the sliced value's blocks: reading it must not change them
        return out


STACKED = StackedEngine()
