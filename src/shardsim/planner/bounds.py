"""Cheap lower bounds on a candidate's memory and step time, to prune before tracing.

A bound only ever rejects: a candidate whose *lower bound* of memory exceeds the chip, or
whose lower bound of time per token is slower than the best plan found so far by more than
the search's window, cannot be in the answer, so it is not traced. The numbers of every
plan that survives come from its traced program (:mod:`shardsim.cost.layer_program`), never from here.

Memory: the weights, gradients and optimizer state of the layers on the busiest stage,
counted at the fewest bytes the byte policy stores them (:func:`state_bytes`: under the
default policy 16-bit weights and gradients and ``K = 12`` bytes of float32 master weights
and Adam moments, the ZeRO paper's ``(2 + 2 + K)Ψ``), each divided by ``dp`` where the ZeRO
stage shards it, plus the block inputs every recomputation
policy keeps for each microbatch chunk the first stage holds at once, at least ``min(m, p)``
under GPipe, 1F1B and the interleaved schedule alike. Embeddings, norms and every other
activation only add to it.

Time: the matmul FLOPs of the busiest stage's layers (``6Ψ`` per token, ``8Ψ`` under full
recomputation; attention only adds), each weight's at the fastest rate the efficiency curve
gives a matmul of its shape: ``[T, K] @ [K, N]`` on a chip moves at least ``TK + KN + TN``
elements (T the microbatch's tokens on the chip), so its intensity is at most that with the
larger of K and N split over the model axis (the untimed kernels after each matmul only add
to it); stretched by the pipeline's bubble ``(m + (p - 1)/v) / m``. Once a layer is traced,
:func:`stage_bound` bounds the schedule on its measured time, and :func:`stage_memory_bound`
the memory on its measured bytes, before the pipeline's clock and its probe run.

>>> from shardsim.models import get
>>> from shardsim.plans import Plan
>>> from shardsim.cost import get_hardware
>>> from .space import Candidate
>>> cfg, hw = get("llama3-8b"), get_hardware("h100")
>>> memory_bound(cfg, Candidate(Plan(dp=8), micro=1, batch=8), seq=8192) > 80e9  # DDP: 16 bytes x 7B
True
>>> memory_bound(cfg, Candidate(Plan(dp=8, zero=3), micro=1, batch=8), seq=8192) < 80e9
True
"""

from __future__ import annotations

import functools
from typing import Any

from ..cost.efficiency import Efficiency
from ..cost.hardware import Hardware
from ..cost.layer_program import Layer
from ..dtypes import resolve_dtype
from ..models import TransformerConfig
from ..plans import ZERO_BUBBLE, Plan
from ..strategies.pipeline.schedule import make
from ..training import optim, policies
from ..training.policies import BytePolicy
from ..training.precision import Precision
from ..training.stage_memory import stage_layers
from .space import Candidate


def state_bytes(policy: str | BytePolicy | None = None) -> tuple[int, int, int]:
    """The fewest bytes per parameter of the weights, the gradients and the optimizer state a
    training step under ``policy`` keeps (default :func:`shardsim.training.model_memory`'s):
    the weights' dtype for both of the first two, the master copy (if any) and one moment
    per optimizer slot for the third. The ledger may keep more (float32 reduced gradients,
    replicated norms); never less.

    >>> state_bytes(), state_bytes("bf16"), state_bytes("scaling-book")
    ((2, 2, 12), (2, 2, 4), (2, 2, 8))
    """
    chosen = None if policy is None else policies.get(policy)
    prec = Precision.of("bf16") if chosen is None else chosen.precision
    slots = len(optim.get("adam" if chosen is None else chosen.optimizer).slots)
    w = prec.compute.itemsize
    return w, w, (prec.state_dtype.itemsize if prec.mixed else 0) + slots * prec.moment_dtype.itemsize


@functools.lru_cache(maxsize=64)
def layer_matmul_params(model: TransformerConfig) -> int:
    """Ψ of one layer's matmul weights (the 2-D ones): what ``6Ψ`` FLOPs per token counts.

    >>> from shardsim.models import get
    >>> layer_matmul_params(get("llama3-405b"))  # 4 attention + 3 MLP matrices
    3187671040
    """
    return sum(k * n for k, n, _ in layer_matmuls(model, 1))


def busiest_stage_layers(model: TransformerConfig, c: Candidate) -> int:
    """Layers the busiest pipeline stage holds (all of them without a pipeline).

    >>> from shardsim.models import get
    >>> from shardsim.plans import Plan
    >>> busiest_stage_layers(get("llama3-405b"), Candidate(Plan(pp=16, microbatches=16), 1, 16))
    8
    """
    p, v = c.plan.pp, c.plan.virtual_stages
    if p == 1:
        return model.layers
    per = stage_layers(model.layers, p * v)
    assert per is not None
    return per * v


def memory_bound(
    model: TransformerConfig, c: Candidate, *, seq: int, state: tuple[int, int, int] = (2, 2, 12)
) -> float:
    """Bytes per chip no plan of this shape can store less than (module doc); ``state`` the
    bytes per parameter of :func:`state_bytes` (default: the default policy's)."""
    p = c.plan
    psi = layer_matmul_params(model) * busiest_stage_layers(model, c) / p.tp
    d = p.dp
    weights = state[0] / (d if p.zero >= 3 else 1)
    grads = state[1] / (d if p.zero >= 2 else 1)
    opt = state[2] / (d if p.zero >= 1 else 1)
    chunk = busiest_stage_layers(model, c) // p.virtual_stages
    block_input = state[0] * c.micro * seq * model.d_model / (p.cp * (p.tp if p.sp else 1))
    held = min(p.microbatches, p.pp)  # the first stage holds at least this many chunks under every schedule
    return psi * (weights + grads + opt) + held * chunk * block_input


def stage_memory_bound(model: TransformerConfig, c: Candidate, lay: Layer) -> float:
    """A lower bound of a pipelined candidate's memory once its layer is traced: the busiest
    stage's weights and optimizer state as the traced layer stores them (what a third layer
    adds), and what a layer keeps per microbatch (the traced activations' growth from two layers
    to three) for every layer of all but one of the microbatch chunks the schedule holds on its
    first or last stage at once (the last may still be running its forward). Gradients, the
    embedding, the head and every working set only add.

    >>> from shardsim.models import get
    >>> from shardsim.plans import Plan
    >>> from shardsim.cost.layer_program import LayerCache
    >>> cfg = get("llama-tiny").scaled(layers=8)
    >>> c = Candidate(Plan.parse("dp=2,pp=4,microbatches=8"), micro=1, batch=16)
    >>> lay = LayerCache(cfg, "h100", seq=16).layer(c.plan, c.micro)
    >>> from shardsim.training import model_memory
    >>> 0 < stage_memory_bound(cfg, c, lay) < model_memory(cfg, c.plan, batch=16, seq=16)[0]["total"]
    True
    """
    p = c.plan
    n = busiest_stage_layers(model, c)
    short = 1 if n * p.pp > model.layers else 0  # the first and last stage hold one layer fewer
    per_state = sum(lay.state_at(k, 3) - lay.state_at(k, 2) for k in ("params", "optimizer"))
    per_grads = lay.state_at("grads", 3) - lay.state_at("grads", 2)
    per_stash = lay.bytes_at("activations", 3) - lay.bytes_at("activations", 2)
    chunk = n // p.virtual_stages
    held, after_backward = in_flight(p.schedule, p.pp, p.microbatches, p.virtual_stages)
    bound = (n - short) * per_state + ((held - 1) * chunk - short) * per_stash
    if after_backward:  # a forward after the stage's first backward: its gradients live beside the stash
        with_grads = (n - short) * (per_state + per_grads) + ((after_backward - 1) * chunk - short) * per_stash
        bound = max(bound, with_grads)
    return bound


@functools.lru_cache(maxsize=256)
def in_flight(schedule: str, p: int, m: int, v: int) -> tuple[int, int]:
    """The most microbatch chunks the first or last stage holds at once under the schedule, and
    the most either holds while it runs a forward after its first backward (0 if neither does).

    >>> in_flight("1f1b", 4, 8, 1), in_flight("1f1b", 4, 4, 1), in_flight("gpipe", 4, 8, 1)
    ((4, 4), (4, 1), (8, 0))
    """
    items = make(schedule, p, m, v)
    orders, counts = items.orders(), items.in_flight()
    held, after = 0, 0
    for stage in sorted({0, p - 1}):
        held = max(held, max(counts[stage]))
        seen = False
        for it, count in zip(orders[stage], counts[stage]):
            seen = seen or it.kind == "B"
            if seen and it.kind == "F":
                after = max(after, count)
    return held, after


def time_bound(
    model: TransformerConfig, c: Candidate, hw: Hardware, eff: Efficiency, *, seq: int, dtype: Any = "bfloat16"
) -> float:
    """Seconds no plan of this shape can take less than for one step (module doc); ``dtype``
    the matmuls' (the byte policy's compute dtype, unless the plan names its precision).

    >>> from shardsim.models import get
    >>> from shardsim.plans import Plan
    >>> from shardsim.cost import get_hardware
    >>> from shardsim.cost.efficiency import IDEAL
    >>> c = Candidate(Plan(dp=8), micro=1, batch=8)
    >>> t = time_bound(get("llama3-8b"), c, get_hardware("h100"), IDEAL, seq=8192)
    >>> round(t * 9.9e14 / (6 * 32 * layer_matmul_params(get("llama3-8b")) * 8192), 6)  # 6 Psi T at peak
    1.0
    """
    p = c.plan
    passes = 4 if p.recompute == "full" else 3  # forward, the two backward products, the forward again
    tokens = c.micro * seq / p.cp  # the rows of each matmul on a chip
    if p.precision is not None:
        dtype = Precision.of(p.precision).compute
    itemsize = resolve_dtype(dtype).itemsize
    seconds = 0.0
    for k, n, split in layer_matmuls(model, p.tp):
        # [T, K] @ [K, N] reads and writes at least (TK + KN + TN) elements, the split one of K
        # and N divided by tp: its intensity is at most that with the larger one divided
        # (the backward's two products have the same three dimensions)
        big, small = max(k, n) / split, min(k, n)
        intensity = 2 / (itemsize * (1 / tokens + 1 / big + 1 / small))
        rate = hw.flops(dtype) * eff.matmul_fraction(intensity, dtype)
        seconds += passes * 2 * tokens * k * n / p.tp / rate
    bubble = (p.microbatches + (p.pp - 1) / p.virtual_stages) / p.microbatches
    return seconds * busiest_stage_layers(model, c) * p.microbatches * bubble


@functools.lru_cache(maxsize=64)
def layer_matmuls(model: TransformerConfig, tp: int) -> tuple[tuple[int, int, int], ...]:
    """``(K, N, split)`` of each of one layer's 2-D matmul weights: ``split`` is ``tp`` when
    the model axis splits it where it is used, else 1 (replicated, as KV heads are when the
    model axis has more chips than the model has KV heads).

    >>> from shardsim.models import get
    >>> layer_matmuls(get("llama3-8b"), 16)[:2]  # wq split, wk replicated (8 KV heads)
    ((4096, 4096, 16), (4096, 1024, 1))
    """
    from ..transformer.roles import Roles

    roles = Roles.of(Plan(tp=tp), model.n_kv)
    out = []
    for key, shape in model.scaled(layers=1).param_shapes().items():
        if key.startswith("layers.") and len(shape) == 2:
            split = tp > 1 and any(str(roles.model) in d for d in roles.weight_dims(key, sharded=False))
            out.append((shape[0], shape[1], tp if split else 1))
    return tuple(out)


def stage_bound(model: TransformerConfig, c: Candidate, per_layer_s: float, forward_s: float = 0.0) -> float:
    """A lower bound of a step once its layer is traced: the busiest stage runs ``m``
    microbatches of its layers (``per_layer_s`` each, forward and backward), and the schedule
    can do no better than ``(m + (p - 1)/v)`` microbatches of its lightest stage's (one layer
    fewer when the stages are unequal); a zero-bubble schedule's W passes may fill that, so it is
    held to the ramp no schedule avoids: the last stage starts after ``p - 1`` stages' forwards
    of a microbatch (``forward_s`` per layer) and then runs all its work. The gradient
    reduction is not counted: it may hide under the last backward (:func:`~shardsim.planner.evaluate.clock`).

    >>> from shardsim.models import get
    >>> from shardsim.plans import Plan
    >>> stage_bound(get("gpt-tiny"), Candidate(Plan(pp=1, microbatches=4), 1, 4), 1.0)
    8.0
    """
    p = c.plan
    if p.pp == 1:
        return p.microbatches * model.layers * per_layer_s
    n = busiest_stage_layers(model, c)
    lightest = n - (1 if n * p.pp > model.layers else 0)
    work = p.microbatches * n * per_layer_s
    if p.schedule in ZERO_BUBBLE:
        return max(work, ((p.pp - 1) * forward_s + p.microbatches * per_layer_s) * lightest)
    return max(work, (p.microbatches + (p.pp - 1) / p.virtual_stages) * lightest * per_layer_s)
