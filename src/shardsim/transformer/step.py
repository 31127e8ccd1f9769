"""What every piece of one training step shares: the config, the roles, the weights, dropout.

The four conjugate collectives of Megatron live here, each a single line, so the blocks
read as their papers: ``f`` / ``g`` of tensor parallelism (Shoeybi et al. 2019) and their
sequence-parallel forms (Korthikanti et al. 2022):

==================  ===========================  ==============================
                    tensor parallel              + sequence parallel
==================  ===========================  ==============================
``enter`` forward   identity                     AllGather over the model axis
``enter`` backward  AllReduce (``leave`` fwd)    ReduceScatter over S
``leave`` forward   AllReduce                    ReduceScatter over S
``leave`` backward  identity                     AllGather over the model axis
==================  ===========================  ==============================

>>> from shardsim.plans import Plan
>>> from shardsim.models import TransformerConfig
>>> cfg = TransformerConfig(layers=1, d_model=8, heads=2, d_ff=16, vocab=8, seq=4)
>>> Step(cfg, Roles.of(Plan()), {}, None).dropout_on
False
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..array import ShardedArray
from ..collectives import all_gather, all_reduce, reduce_scatter
from ..models import TransformerConfig
from ..ops import sum_dim
from ..pieces import concat, split
from .local import keep_mask, scalar
from .roles import Roles


@dataclass
class Step:
    """One step's context: ``cfg``, ``roles``, the stored weights by key, the dropout seed."""

    cfg: TransformerConfig
    roles: Roles
    weights: dict[str, ShardedArray]
    seed: int | None
    micro: tuple[int, int] | None = None  # (microbatch j, of m) when a pipeline splits the batch
    rows: np.ndarray | None = None  # context parallelism: the global position of each row of the sequence
    positions: ShardedArray | None = None  # ... as the [S_context] the attention's causal mask reads

    @property
    def dropout_on(self) -> bool:
        return self.seed is not None and self.cfg.dropout > 0.0

    def w(self, key: str) -> ShardedArray:
        """The weight as the block uses it: under ZeRO-3 / FSDP, AllGather over the data axis first."""
        stored, data = self.weights[key], self.roles.data
        if not (self.roles.fsdp and data is not None):
            return stored
        return all_gather(stored, data, label=key, category="temporaries")  # a buffer, freed after use

    @property
    def kv_heads(self) -> int:
        """The KV heads the program computes: ``cfg.kv_heads``, or one per model chip when they are replicated."""
        return self.cfg.n_kv * self.roles.kv_copies

    def has(self, key: str) -> bool:
        return key in self.weights

    # -- Megatron's conjugate collectives ------------------------------------------------------
    def enter(self, x: ShardedArray, label: str) -> ShardedArray:
        """Into a tensor-parallel region: identity (TP) or AllGather of the sequence (SP)."""
        y = self.roles.model
        return all_gather(x, y, label=label) if self.roles.sp and y is not None else x

    def leave(self, x: ShardedArray, label: str) -> ShardedArray:
        """Out of a tensor-parallel region: the partial sum over the model axis AllReduced (TP)
        or ReduceScattered over S (SP)."""
        y = self.roles.model
        if y is None:
            return x.named(label)
        if self.roles.sp:
            return reduce_scatter(x, y, "S", label=label)
        return all_reduce(x, y, label=label)

    # -- dropout -------------------------------------------------------------------------------
    def mask(self, layer: int, site: str, like: ShardedArray, layout: str) -> ShardedArray | None:
        """The kept elements of a dropout site (1 byte each), as the value ``like`` is laid out."""
        if not self.dropout_on:
            return None
        assert self.seed is not None
        if self.micro is None:
            mask = keep_mask(self.seed, layer, site, self.cfg.dropout, like, layout, like.global_shape)
        else:  # the whole batch's mask, cut as the batch was into microbatches: the reference's draw
            j, m = self.micro
            whole = (like.global_shape[0] * m,) + like.global_shape[1:]
            full = keep_mask(self.seed, layer, site, self.cfg.dropout, like, layout, whole)
            mask = concat([split(full, 0, m)[j]], 0)  # its own buffer: the rest of the mask dies
        if like.holders is None:
            return mask
        data = None if mask.is_shape_only else mask.compact()
        return ShardedArray(  # held by the stage that drops: a pipeline stage keeps its own masks
            mask.mesh, mask.layout, mask.global_shape, mask.dtype, data, label=mask.label, holders=like.holders
        )

    def drop(self, x: ShardedArray, mask: ShardedArray | None) -> ShardedArray:
        """``x * mask / (1 - p)`` (``x`` itself without dropout); the backward is the same map."""
        if mask is None:
            return x
        return x * mask * scalar(1.0 / (1.0 - self.cfg.dropout), x)

    # -- gradient sums --------------------------------------------------------------------------
    def token_sum(self, d: ShardedArray, label: str) -> ShardedArray:
        """A bias or gain gradient: the sum over every token a chip holds; over the model axis
        too when S is split there (sequence parallelism), so only the data axis stays partial."""
        return self.over_model(sum_dim(sum_dim(d, "B"), "S", label=label))

    def over_model(self, g: ShardedArray) -> ShardedArray:
        """AllReduce a gradient over the model axis if it is partial there (SP norm gains)."""
        y = self.roles.model
        return all_reduce(g, y, label=g.label) if y is not None and y in g.layout.partial else g
