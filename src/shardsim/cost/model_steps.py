"""The whole-model program a cost is read from: ``run_model``'s shape-only trace, built fast.

A transformer's layers are identical, so its trace is periodic: every layer runs the same
steps, every microbatch of a pipeline the same items. :func:`model_program` traces a
shallow copy of the model shape-only (three layers per pipeline chunk: the first, one
middle layer and the last; the fewest microbatches the schedule allows) and repeats the
middle layer's steps, and each pipeline item's, as many times as the real model and
schedule have them, with fresh value ids and the real layer numbers. Each event knows its
layer and pipeline item (``Event.layer``, ``Event.item``), so the copies are cut from the
trace, never written by hand; a value a copy reads is mapped to the same value of the
layer (and microbatch) it reads in the real program. The result equals the full trace event
for event (op, axes, bytes, FLOPs, phase, layer, item, where; tested for small models,
pipelines included) and schedules to the same time line.

Without a pipeline a plan's ``microbatches`` is gradient accumulation: the program is one
microbatch's, repeated (:func:`accumulated`), its gradient reductions over the data and
context axes once, after the last, as the planner assembles the same step
(:mod:`shardsim.planner.evaluate`).

A shallow trace is cached by everything that changes it (the model's sizes, the plan, the
microbatch size, the sequence, the dtype), and so is each whole program, so a planner that
estimates thousands of plans traces each distinct layer once.

>>> from shardsim.models import get
>>> from shardsim.plans import Plan
>>> prog = model_program(get("llama3-8b"), Plan(dp=2, tp=4), batch_tokens=2 * 8192, seq=8192)
>>> prog.layers, prog.traced_layers, max(s.layer for s in prog.steps)
(32, 3, 31)
>>> [s.event.label for s in prog.steps if s.layer == 17][:2]
['A @ layers.17.attn.wq', 'A @ layers.17.attn.wk']
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..array import ShapeDtype
from ..dtypes import resolve_dtype
from ..errors import ArgumentTypeError, CostModelError, DivisibilityError
from ..mesh import Mesh
from ..models import TransformerConfig
from ..plans import Plan
from ..tracing import Event
from ..transformer import checks
from .program import Program, Step

TEMPLATE = 3  # layers per pipeline chunk in the shallow trace: first, middle (repeated), last


@dataclass
class ModelProgram(Program):
    """A model's step under a plan as :class:`~shardsim.cost.program.Step` s, with what it was
    built from: ``traced_layers`` the layers of the shallow trace (``layers`` when it was
    traced whole), ``memory`` the shallow trace's ledger peaks (bytes per chip, by category)."""

    cfg: TransformerConfig | None = None
    plan: Plan = field(default_factory=Plan)
    batch: int = 0
    seq: int = 0
    dtype: str = "bfloat16"
    traced_layers: int = 0


def check_batch(cfg: TransformerConfig, plan: Plan, batch_tokens: int, seq: int | None) -> tuple[int, int]:
    """``(sequences, seq)`` for a global batch of ``batch_tokens`` tokens, or a
    :class:`~shardsim.errors.DivisibilityError` naming the fix.

    >>> from shardsim.models import get
    >>> check_batch(get("llama3-8b"), Plan(dp=4), 4 * 8192, None)
    (4, 8192)
    >>> check_batch(get("llama3-8b"), Plan(dp=4), 8192, None)
    Traceback (most recent call last):
    ...
    shardsim.errors.DivisibilityError: batch of 8192 tokens is 1 sequence of 8192, fewer than dp=4 ...
    """
    s = cfg.seq if seq is None else seq
    if isinstance(s, bool) or not isinstance(s, int):
        raise ArgumentTypeError(f"seq={s!r} ({type(s).__name__}): the sequence is a whole number of tokens, e.g. 8192")
    if s < 1:
        raise DivisibilityError(f"seq must be a positive whole number of tokens, got {s!r}")
    if s > cfg.seq:
        raise DivisibilityError(f"seq={s} is longer than the model's context {cfg.seq}; use seq <= {cfg.seq}")
    if isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int) or batch_tokens < 1:
        raise DivisibilityError(f"batch_tokens must be a positive whole number, got {batch_tokens!r}")
    pieces = plan.dp * plan.microbatches  # a pipeline's microbatches, or gradient accumulation's
    what = f"dp={plan.dp}" + (f" x microbatches={plan.microbatches}" if plan.microbatches > 1 else "")
    if batch_tokens % s:
        raise DivisibilityError(
            f"batch of {batch_tokens} tokens is not a whole number of sequences of {s}; "
            f"use a multiple of {s * pieces} (seq x {what})"
        )
    b = batch_tokens // s
    if b < plan.dp:
        raise DivisibilityError(
            f"batch of {batch_tokens} tokens is {b} sequence{'s' if b > 1 else ''} of {s}, fewer than dp={plan.dp} "
            f"data-parallel replicas; use at least {s * pieces} tokens (seq x {what}) or a smaller dp"
        )
    if b % pieces:
        raise DivisibilityError(
            f"batch of {batch_tokens} tokens ({b} sequences of {s}) does not split into {what} equal pieces; "
            f"use a multiple of {s * pieces} tokens (seq x {what})"
        )
    return b, s


#: The most elements one tensor of a model's step may hold: at 8 bytes an element its bytes stay
#: below 2**62, the byte counts NumPy and the ledger can index (``shardsim.array.MAX_BYTES``).
MAX_ELEMENTS = 2**59
#: The most layer-microbatches (layers, times the microbatches of a pipeline) a whole-model
#: program holds: its time line schedules every op of each, about a millisecond apiece; twice
#: PTD-P's 1T run (128 layers, 512 microbatches).
MAX_LAYER_ITEMS = 2**17


def check_sizes(cfg: TransformerConfig, sequences: int, seq: int) -> None:
    """Refuse, before any tracing, a model and batch whose tensors would pass :data:`MAX_ELEMENTS`:
    a :class:`~shardsim.errors.CostModelError` naming the tensor, the fields that size it and
    the fix (the largest batch that fits, or smaller fields).

    >>> from shardsim.models import get
    >>> check_sizes(get("llama3-8b"), 2**27, 8192)  # 2**40 tokens: every tensor indexable
    >>> check_sizes(get("llama-tiny").scaled(vocab=2**24), 2**24, 2**16)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    shardsim.errors.CostModelError: batch_tokens=1099511627776 (16,777,216 sequences of 65536): the logits ...
    """
    hd = cfg.hd
    weights = {
        "the embedding [vocab, d_model] (vocab x d_model)": cfg.vocab * cfg.d_model,
        "the attention projections [d_model, heads x head_dim] (d_model x heads x head_dim)": cfg.d_model
        * cfg.heads
        * hd,
        "the MLP weights [d_model, d_ff] (d_model x d_ff, x experts)": cfg.d_model * cfg.d_ff * max(1, cfg.experts),
    }
    for what, n in weights.items():
        if n >= MAX_ELEMENTS:
            raise CostModelError(
                f"{cfg.name or 'the model'}: {what} would hold {n:,} elements, past the 2**59 a tensor may hold "
                "(its bytes must stay below 2**62); use smaller fields"
            )
    routed = cfg.top_k if cfg.experts else 1
    per_token = {
        "the logits [B, S, vocab]": cfg.vocab,
        "the MLP activations [B, S, d_ff]": cfg.d_ff * routed * (2 if cfg.experts else 1),
        "the attention projections [B, S, heads x head_dim]": cfg.heads * hd,
        "the attention scores [B, heads, S, S]": cfg.heads * seq,
    }
    what, widest = max(per_token.items(), key=lambda kv: kv[1])
    tokens = sequences * seq
    if tokens * widest >= MAX_ELEMENTS:
        fits = (MAX_ELEMENTS - 1) // widest // seq * seq
        fix = f"use batch_tokens <= {fits:,}" if fits else "use a shorter seq or smaller fields"
        raise CostModelError(
            f"batch_tokens={tokens} ({sequences:,} sequences of {seq}): {what} would hold {tokens * widest:,} "
            f"elements, past the 2**59 a tensor may hold (its bytes must stay below 2**62); {fix}"
        )


def check_work(cfg: TransformerConfig, plan: Plan) -> None:
    """Refuse a whole-model program past :data:`MAX_LAYER_ITEMS` layer-microbatches, before tracing.

    >>> from shardsim.models import get
    >>> check_work(get("llama-tiny").scaled(layers=2**14), Plan(pp=2, microbatches=16))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    shardsim.errors.CostModelError: layers=16384 x microbatches=16: the whole-model program times every op of ...
    """
    m = plan.microbatches
    if cfg.layers * m > MAX_LAYER_ITEMS:
        what = f"layers={cfg.layers}" + (f" x microbatches={m}" if m > 1 else "")
        raise CostModelError(
            f"{what}: the whole-model program times every op of {cfg.layers * m:,} layer-microbatches, more than "
            f"the {MAX_LAYER_ITEMS:,} it holds; estimate fewer layers or microbatches, or search with "
            "shardsim.planner.plan, which times one traced layer"
        )


def recorded_steps(events: Sequence[Event]) -> list[Step]:
    """A transformer step's events as the cost model's steps: each in its own layer, waiting for
    the ids it recorded and nothing else (the step computes its loss gradient inside the trace,
    so no input stands for an outside ``dOut``, as :func:`~shardsim.cost.program.program_steps`
    assumes for the MLP schemes). The whole-model estimate and the planner's layer both read them so.

    >>> e = Event(0, "matmul", (), "A.T @ dQ", (), "", "backward", inputs=(7,), output=8)
    >>> [(s.inputs, s.output) for s in recorded_steps([e])]
    [((7,), 8)]
    """
    return [Step(e, e.layer, e.inputs, e.output) for e in events]


def trace_model(cfg: TransformerConfig, plan: Plan, batch: int, seq: int, dtype: str = "bfloat16") -> Program:
    """``run_model`` shape-only on ``batch`` sequences of ``seq`` tokens, every layer traced: the
    reference :func:`model_program` is tested against (and what it uses for shallow models)."""
    return _traced(cfg, plan, batch, seq, dtype)


@functools.lru_cache(maxsize=512)
def _traced(cfg: TransformerConfig, plan: Plan, batch: int, seq: int, dtype: str) -> ModelProgram:
    from ..transformer.run import run_model

    mesh = plan.mesh()
    params = {k: ShapeDtype(s, dtype) for k, s in cfg.param_shapes().items()}
    tokens = ShapeDtype((batch, seq), "int32")
    res = run_model(cfg, plan, mesh, params, tokens, tokens)
    steps = recorded_steps(res.trace.events)
    ledger = res.memory
    peak = {**{c: int(np.max(ledger.peak(c))) for c in ledger.categories()}, "total": int(np.max(ledger.peak()))}
    return ModelProgram(
        str(plan), Mesh(dict(zip(mesh.axis_names, mesh.shape))), steps, cfg.layers, peak,
        cfg=cfg, plan=plan, batch=batch, seq=seq, dtype=dtype, traced_layers=cfg.layers,
    )  # fmt: skip


@functools.lru_cache(maxsize=4096)
def model_program(
    cfg: TransformerConfig, plan: Plan, batch_tokens: int, seq: int | None = None, dtype: str = "bfloat16"
) -> ModelProgram:
    """The program of one training step of ``cfg`` under ``plan`` on ``batch_tokens`` tokens in
    sequences of ``seq`` (default the model's context); cached (see the module doc):
    ``model_program.cache_info()`` and ``cache_clear()`` are the cache's. Treat the program
    as read-only: every caller with the same arguments gets the same object."""
    b, s = check_batch(cfg, plan, batch_tokens, seq)
    if plan.pp > 1:  # the pipeline's rules, as run_model checks them, before any tracing
        checks.check_pipeline(cfg, plan, b)
    return _program(cfg, plan, b, s, resolve_dtype(dtype).name)


@functools.lru_cache(maxsize=4096)
def _program(cfg: TransformerConfig, plan: Plan, batch: int, seq: int, dtype: str) -> ModelProgram:
    if plan.pp == 1 and plan.microbatches > 1:  # gradient accumulation: one microbatch's program, m times
        m = plan.microbatches
        one = _program(cfg, plan.replace(microbatches=1), batch // m, seq, dtype)
        repeated = accumulated(one.steps, m, frozenset(cfg.param_shapes()))
        return ModelProgram(
            str(plan), one.mesh, repeated, cfg.layers, one.memory,
            cfg=cfg, plan=plan, batch=batch, seq=seq, dtype=dtype, traced_layers=one.traced_layers,
        )  # fmt: skip
    chunks = plan.pp * plan.virtual_stages
    per_chunk = cfg.layers // chunks
    m = plan.microbatches if plan.pp > 1 else 1
    m_t = _template_microbatches(plan) if plan.pp > 1 else 1
    if per_chunk <= TEMPLATE and m_t == m:
        return _traced(cfg, plan, batch, seq, dtype)
    n_t = min(per_chunk, TEMPLATE)
    small = cfg.scaled(layers=n_t * chunks)
    small_plan = plan.replace(microbatches=m_t) if plan.pp > 1 else plan
    template = _traced(small, small_plan, batch // m * m_t, seq, dtype)
    steps = _expand(template.steps, plan, per_chunk, n_t, m, m_t)
    if steps is None:  # the layers' steps differ (not one periodic program): trace it whole
        return _traced(cfg, plan, batch, seq, dtype)
    return ModelProgram(
        str(plan), template.mesh, steps, cfg.layers, template.memory,
        cfg=cfg, plan=plan, batch=batch, seq=seq, dtype=dtype, traced_layers=small.layers,
    )  # fmt: skip


def is_sync(e: Event, params: Collection[str]) -> bool:
    """A parameter's gradient reduction over the data or context axis (it runs once per step,
    after the accumulation, not per microbatch). ``params`` are the parameter names; a
    context-parallel step also reduce-scatters activation gradients (``dK``), every microbatch.

    >>> e = Event(0, "all_reduce", ("context",), "dlayers.0.mlp.w_in", (), "", "backward")
    >>> dk = Event(1, "reduce_scatter", ("context",), "dK", (), "", "backward")
    >>> moe = Event(2, "all_reduce", ("data", "expert"), "dw_in", (), "", "backward")
    >>> is_sync(e, {"layers.0.mlp.w_in"}), is_sync(dk, {"layers.0.mlp.w_in"}), is_sync(moe, {"layers.0.moe.w_in"})
    (True, False, True)
    """
    return (
        e.phase == "backward"
        and e.op in ("all_reduce", "reduce_scatter")
        and e.label.startswith("d")
        and (e.label[1:] in params or e.label[1:] in _leaves(frozenset(params)))
        and any(a in ("data", "context") for a in e.axes)
    )


@functools.lru_cache(maxsize=64)
def _leaves(params: frozenset[str]) -> frozenset[str]:
    """The parameters' last names (``w_in`` of ``layers.0.moe.w_in``): a mixture of experts
    labels its weights' gradient reductions by them."""
    return frozenset(p.rsplit(".", 1)[-1] for p in params)


def accumulated(steps: Sequence[Step], m: int, params: Collection[str]) -> list[Step]:
    """Gradient accumulation without a pipeline: one microbatch's steps ``m`` times, one after
    another, the gradient reductions over the data and context axes (:func:`is_sync`) in the
    last copy only, after which the optimizer reads the summed gradients. Each earlier copy
    writes fresh value ids and reads the weights and the tokens as the first does.

    >>> e = Event(0, "matmul", (), "A @ w", (), "", "forward", inputs=(1,), output=2)
    >>> r = Event(1, "all_reduce", ("data",), "dw", (), "", "backward", inputs=(2,), output=3)
    >>> steps = [Step(e, 0, (1,), 2), Step(r, 0, (2,), 3)]
    >>> [(s.event.op, s.inputs, s.output) for s in accumulated(steps, 2, {"w"})]
    [('matmul', (1,), 4), ('matmul', (1,), 2), ('all_reduce', (2,), 3)]
    """
    out: list[Step] = []
    fresh = max((max(s.output, *s.inputs) for s in steps), default=0) + 1
    for _ in range(m - 1):
        ids: dict[int, int] = {}
        for s in steps:
            if is_sync(s.event, params):
                continue
            ids[s.output] = fresh
            out.append(Step(s.event, s.layer, tuple(ids.get(v, v) for v in s.inputs), fresh))
            fresh += 1
    return [*out, *steps]


def _template_microbatches(plan: Plan) -> int:
    """The fewest microbatches the plan's schedule runs (interleaved 1F1B needs a multiple of pp)."""
    return plan.pp if plan.schedule == "interleaved" else 1


# -- repeating the template --------------------------------------------------------------------
_ITEM = re.compile(r"([FBW])(\d+)\.(\d+)")


@dataclass(frozen=True)
class _Run:
    """Consecutive template events of one (pipeline item, layer); ``occurrence`` counts the
    earlier runs with the same item and layer (a layer's forward, then its backward)."""

    item: str
    layer: int
    occurrence: int
    events: tuple[Event, ...]


def _runs(events: Sequence[Event]) -> list[_Run]:
    out: list[_Run] = []
    seen: dict[tuple[str, int], int] = {}
    start = 0
    for i in range(1, len(events) + 1):
        if i == len(events) or (events[i].item, events[i].layer) != (events[start].item, events[start].layer):
            key = (events[start].item, events[start].layer)
            out.append(_Run(key[0], key[1], seen.get(key, 0), tuple(events[start:i])))
            seen[key] = seen.get(key, 0) + 1
            start = i
    return out


def _signature(e: Event) -> tuple[object, ...]:
    sizes = (e.flops, e.hbm_bytes, e.sent_bytes, e.received_bytes, e.array_bytes)
    return (e.op, e.axes, e.phase, e.kernel, *sizes, e.where)


def _expand(template: Sequence[Step], plan: Plan, per_chunk: int, n_t: int, m: int, m_t: int) -> list[Step] | None:
    """The real program's steps from the template's (see the module doc); None when the
    template's layers of one chunk do not run the same steps (then the caller traces whole)."""
    from ..strategies.pipeline.schedule import make

    events = [st.event for st in template]
    runs = _runs(events)
    by_key = {(r.item, r.layer, r.occurrence): r for r in runs}
    for r in runs:  # every layer of a chunk runs the same steps as the chunk's first layer
        if r.layer >= 0:
            first = by_key.get((r.item, r.layer - r.layer % n_t, r.occurrence))
            if first is None or [_signature(e) for e in first.events] != [_signature(e) for e in r.events]:
                return None
    owner: dict[int, tuple[_Run, int]] = {}
    for r in runs:
        for q, e in enumerate(r.events):
            owner[e.output] = (r, q)

    def real_layers(t: int, forward: bool) -> list[int]:
        """The real layers template layer ``t`` stands for, in program order."""
        chunk, pos = divmod(t, n_t)
        base = chunk * per_chunk
        if n_t == per_chunk:
            out = [base + pos]
        elif pos == 0:
            out = [base]
        elif pos == n_t - 1:
            out = [base + per_chunk - 1]
        else:
            out = list(range(base + 1, base + per_chunk - 1))
        return out if forward else out[::-1]

    def anchor(t: int) -> int:
        """The real layer a template layer's value is read at from outside any layer."""
        return real_layers(t, True)[-1]

    # the real items in program order: each template item stands for the same item on every microbatch
    if plan.pp > 1:
        sched = make(plan.schedule, plan.pp, m, plan.virtual_stages)
        order = [(f"{it.kind}{sched.virtual_stage(it)}", it.microbatch) for it in sorted(sched.items)]
        items = [(f"{name}.0", f"{name}.{j}", j) for name, j in order] + [("", "", -1)]  # then the flush
    else:
        items = [("", "", -1)]
    template_runs: dict[str, list[_Run]] = {}
    for r in runs:
        template_runs.setdefault(r.item, []).append(r)

    # real (item, microbatch, layer, occurrence) -> the ids its run wrote, in order
    produced: dict[tuple[str, int, int, int], list[int]] = {}
    next_id = max((max(e.output, *e.inputs) if e.inputs else e.output) for e in events) + 1
    steps: list[Step] = []
    # per template event, how to find each input in the real program: a program input (a weight,
    # the tokens: one value for every copy) or (item, template microbatch, layer, occurrence, offset)
    recipes = {
        id(e): [
            None if v not in owner else (*_item_parts(owner[v][0].item), *_layer_occ(owner[v][0]), owner[v][1])
            for v in e.inputs
        ]
        for e in events
    }
    labels: dict[tuple[str, int, int], str] = {}

    def source(v: int, how: tuple[str, int, int, int, int] | None, micro: int, t: int, r: int) -> int:
        """The real id of template value ``v`` read by a copy of template layer ``t`` at real layer ``r``."""
        if how is None:
            return v
        item, j_t, lt, occ, q = how
        j = -1 if not item else micro if micro >= 0 else m - m_t + j_t  # the flush reads the last microbatches
        if lt < 0:
            layer = -1
        elif t >= 0:  # a layer reads its neighbours: the same offset in the real program
            layer = r + (lt - t)
        else:  # the embedding, head or a flush reads a layer's value
            layer = anchor(lt)
        ids = produced.get((item, j, layer, occ))
        if ids is None or q >= len(ids):
            ids = produced.get((item, j, anchor(lt) if lt >= 0 else -1, occ))
        return ids[q] if ids is not None and q < len(ids) else v

    for t_item, real_item, micro in items:
        prefix = _item_parts(t_item)[0]
        for run in template_runs.get(t_item, []):
            forward = run.events[0].phase == "forward"
            for real in real_layers(run.layer, forward) if run.layer >= 0 else [-1]:
                out_ids: list[int] = []
                produced[(prefix, micro, real, run.occurrence)] = out_ids  # filled as the run goes: it reads its own
                for e in run.events:
                    inputs = tuple(source(v, how, micro, run.layer, real) for v, how in zip(e.inputs, recipes[id(e)]))
                    key = (e.label, run.layer, real)
                    if key not in labels:
                        labels[key] = _renamer(run.layer, real)(e.label)
                    new = _copy(e, index=len(steps), label=labels[key], layer=real, item=real_item, inputs=inputs,
                                output=next_id)  # fmt: skip
                    out_ids.append(next_id)
                    next_id += 1
                    steps.append(Step(new, real, inputs, next_id - 1))
    return steps


def _item_parts(item: str) -> tuple[str, int]:
    """``"F3.0"`` -> ``("F3", 0)``; ``""`` (no pipeline item) -> ``("", -1)``."""
    if not item:
        return "", -1
    match = _ITEM.fullmatch(item)
    assert match is not None, item
    return f"{match.group(1)}{match.group(2)}", int(match.group(3))


def _layer_occ(run: _Run) -> tuple[int, int]:
    return run.layer, run.occurrence


def _copy(e: Event, **changes: object) -> Event:
    """``dataclasses.replace`` without ``__init__``: the program copies events by the hundred thousand."""
    new = object.__new__(Event)
    new.__dict__.update(e.__dict__)
    new.__dict__.update(changes)
    return new


def _renamer(t: int, r: int) -> Callable[[str], str]:
    """Labels of template layer ``t``'s weights (``layers.t.``) renamed to real layer ``r``'s."""
    if t < 0 or t == r:
        return lambda label: label
    pattern = re.compile(rf"(?<![\d.])layers\.{t}\.")
    return lambda label: pattern.sub(f"layers.{r}.", label)


def model_memory_ledger(
    cfg: TransformerConfig,
    plan: Plan,
    batch: int,
    seq: int,
    optimizer: str = "adam",
    precision: str | None = None,
    policy: str | None = None,
) -> tuple[dict[str, int], dict[str, int]]:
    """Each chip's peak bytes by category (and ``"total"``) and the model state over one
    shape-only training step of ``batch`` sequences of ``seq``: the ledger of
    :func:`shardsim.training.model_memory` (the trainer's own step: forward, backward,
    gradient reduction, optimizer update), cached like the program."""
    peak, state = _memory(cfg, plan, batch, seq, optimizer, precision, policy)
    return dict(peak), dict(state)


@functools.lru_cache(maxsize=1024)
def _memory(
    cfg: TransformerConfig, plan: Plan, batch: int, seq: int, optimizer: str, precision: str | None, policy: str | None
) -> tuple[dict[str, int], dict[str, int]]:
    from ..training import model_memory

    return model_memory(cfg, plan, batch=batch, seq=seq, optimizer=optimizer, precision=precision, policy=policy)
