"""The plan space: every way to shard a model on a cluster that the constraints allow.

A :class:`Candidate` is a :class:`~shardsim.plans.Plan` with the three things a plan alone
does not say: ``micro``, the sequences one data-parallel rank (one rank of data x expert
under expert parallelism) runs at once (the microbatch; ``plan.microbatches`` of them make
the rank's share of the global batch), ``batch``, the
global batch in sequences, and ``order``, the mesh axes outermost first, which decides the
network each parallelism runs over (the innermost on NVLink or the fastest torus rings).

The space (Narayanan et al. 2021, §3): tensor parallelism ``tp`` dividing the heads, the
MLP width and the vocabulary (with Megatron's rule for the KV heads), with and without
sequence parallelism; context parallelism ``cp`` where the sequence splits (inside a
pipeline too), its attention a ring or an all-gather of K and V (``cp_method``), and without
it FlashAttention (``attention=flash``, unless fixed); expert
parallelism ``ep`` dividing a mixture of experts' experts (which ``run_model`` runs with
ZeRO 0 and 1 and without context parallelism); pipeline depth
``pp`` whose stages hold whole layers (the first and last stage may hold one layer less,
as Llama 3 balances the embedding and the head; not for tied embeddings, which
``run_model`` does not pipeline); the data-parallel degree that remains and its ZeRO stage
(2 and 3 only without a pipeline); the schedule (1F1B, GPipe, interleaved with 2, 4...
chunks); the microbatch; recomputation; and with a pipeline and data parallelism both
across nodes, which of the two is outermost.

>>> from shardsim.models import get
>>> cands = list(candidates(get("gpt-tiny"), chips=4, batch_tokens=8 * 16, seq=16, domain=8))
>>> len(cands) > 10, all(c.plan.chips == 4 for c in cands)
(True, True)
>>> sorted({c.plan.tp for c in cands})
[1, 2, 4]
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._divisors import divisors
from ..cost.units import tokens_argument
from ..errors import PlannerError
from ..models import TransformerConfig
from ..plans import ATTENTION, CP_METHODS, RECOMPUTE, SCHEDULES, ZERO_BUBBLE, Plan
from ..training.stage_memory import stage_layers

PARALLELISMS = ("dp", "zero", "tp", "sp", "pp", "cp", "ep")
FIXABLE = (
    "dp", "zero", "tp", "sp", "pp", "cp", "ep", "cp_method", "attention", "schedule", "virtual_stages",
    "microbatches", "recompute",
)  # fmt: skip
DEGREES = ("dp", "tp", "pp", "cp", "ep")
#: The most microbatches a pipeline candidate runs: its schedule's clock walks every item
#: (stages x microbatches x chunks), a second or two at this many; PTD-P's 1T run had 512.
MAX_MICROBATCHES = 1024
DEFAULT_ORDER = ("data", "pipe", "context", "expert", "model")  # Plan.mesh()'s order: TP innermost
DATA_INSIDE = ("pipe", "data", "context", "expert", "model")  # Megatron's rank order: DP inside PP


@dataclass(frozen=True)
class Candidate:
    """One point of the plan space (see the module doc).

    >>> c = Candidate(Plan(dp=2, tp=2), micro=1, batch=4)
    >>> c.tokens(seq=16), c.describe()
    (64, 'dp=2,tp=2 mb=1')
    """

    plan: Plan
    micro: int
    batch: int
    order: tuple[str, ...] = DEFAULT_ORDER

    def tokens(self, seq: int) -> int:
        """Tokens in the global batch."""
        return self.batch * seq

    def describe(self) -> str:
        """The plan, its microbatch and, when not the default, the mesh order."""
        text = f"{self.plan} mb={self.micro}"
        return text if self.order == DEFAULT_ORDER else f"{text} order={'>'.join(self.order)}"


@dataclass(frozen=True)
class Constraints:
    """What the user fixes or limits.

    ``fixed``: plan fields held at one value (``{"tp": 8, "pp": 16}``); ``allow``: the
    parallelisms that may be used (the others stay at degree 1 / off; ``"zero"`` and ``"sp"``
    count as parallelisms); ``headroom``: the fraction of each chip's memory to leave free;
    ``batch_range``: the global batch in tokens may be any multiple of the sequence in this
    range (default: exactly ``batch_tokens``); ``micro_range``: sequences per microbatch
    (default 1 to 64; the memory bound prunes the large ones); ``tp_max``: the largest
    tensor-parallel degree (default the fast domain: TP within the NVLink domain; raise it to
    weigh TP across the slow network); ``cp_max``: the largest context-parallel degree
    (default one chip per 8,192 tokens of the sequence, as Llama 3 ran CP 16 at 131,072
    tokens; none for a mixture of experts); ``zero_bubble``: search the zero-bubble schedules
    beside 1F1B, GPipe and interleaving (ZB-H1, and ZB-H2 where ``m >= 2p``; off by default:
    each split backward is a layer program and a memory probe of its own, which doubles the
    published searches' time, and interleaving beats them wherever the layers divide into
    chunks). Sequence parallelism is searched on and off wherever TP is, unless ``sp`` is fixed.

    >>> Constraints.of(tp=8, headroom=0.1).fixed
    {'tp': 8}
    """

    fixed: Mapping[str, Any] = field(default_factory=dict)
    allow: tuple[str, ...] = PARALLELISMS
    headroom: float = 0.0
    batch_range: tuple[int, int] | None = None
    micro_range: tuple[int, int] = (1, 64)
    tp_max: int | None = None
    cp_max: int | None = None
    zero_bubble: bool = False

    @classmethod
    def of(cls, **options: Any) -> Constraints:
        """Constraints from keyword options: plan fields go to ``fixed``, the rest are fields.

        >>> Constraints.of(pp=4, allow=("dp", "pp")).allow
        ('dp', 'pp')
        """
        names = {f.name for f in dataclasses.fields(cls)}
        fixed = {k: v for k, v in options.items() if k in FIXABLE}
        unknown = sorted(set(options) - names - set(FIXABLE))
        if unknown:
            raise PlannerError(
                f"unknown planner option {unknown[0]!r}; fix a plan field ({', '.join(FIXABLE)}) or use one of "
                f"{sorted(names - {'fixed'})}"
            )
        rest = {k: v for k, v in options.items() if k in names}
        if "allow" in rest:
            rest["allow"] = _allowed(rest["allow"])
        if rest.get("batch_range") is not None:
            rest["batch_range"] = _pair("batch_range", rest["batch_range"], tokens=True)
        return cls(fixed=fixed, **rest)

    def check(self, model: TransformerConfig, chips: int) -> None:
        """Contradictions, named: a fixed degree that is not allowed or does not divide the chips."""
        self.check_values()
        for key, value in self.fixed.items():
            off = value in (1, 0, False, "none")
            if key in PARALLELISMS and key not in self.allow and not off:
                raise PlannerError(
                    f"{key}={value} is fixed but {key!r} is not among the allowed parallelisms {list(self.allow)}; "
                    f"drop one of the two"
                )
        problem = self.degrees_problem(chips)
        if problem:
            raise PlannerError(problem)

    def degrees_problem(self, chips: int) -> str | None:
        """Why the fixed degrees cannot form a mesh of ``chips`` chips (their product does not
        divide it), or None.

        >>> Constraints.of(tp=8, pp=3).degrees_problem(16)
        'the fixed degrees tp=8 x pp=3 = 24 do not divide 16 chips; change a degree or the chip count'
        """
        product = math.prod(self.fixed.get(k, 1) for k in DEGREES)
        if chips % product == 0:
            return None
        named = " x ".join(f"{k}={self.fixed[k]}" for k in DEGREES if k in self.fixed)
        return f"the fixed degrees {named} = {product} do not divide {chips} chips; change a degree or the chip count"

    def check_values(self) -> None:
        """Each option's own kind and range, whatever the chips: a degree that is not a whole
        number >= 1, a word outside its choices, a range that is not (smallest, largest)."""
        bad = sorted(set(_allowed(self.allow)) - set(PARALLELISMS))
        if bad:
            raise PlannerError(f"allow={list(self.allow)}: {bad[0]!r} is not a parallelism; use {list(PARALLELISMS)}")
        h = self.headroom
        if isinstance(h, bool) or not isinstance(h, numbers.Real) or not 0.0 <= h < 1.0:
            raise PlannerError(f"headroom={h!r} is the fraction of memory left free, a number in [0, 1); e.g. 0.1")
        for key, value in self.fixed.items():
            _check_fixed(key, value)
        lo, hi = _pair("micro_range", self.micro_range)
        if lo < 1 or hi < lo:
            raise PlannerError(f"micro_range={self.micro_range}: give (smallest, largest) sequences, 1 <= lo <= hi")
        if self.batch_range is not None:
            lo, hi = _pair("batch_range", self.batch_range, tokens=True)
            if hi < lo:
                raise PlannerError(
                    f"batch_range={self.batch_range}: give (smallest, largest) tokens, lo <= hi; e.g. ({hi}, {lo})"
                )
        if not isinstance(self.zero_bubble, bool):
            raise PlannerError(
                f"zero_bubble={self.zero_bubble!r}: True searches the zero-bubble schedules too, False not"
            )
        for name in ("tp_max", "cp_max"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise PlannerError(f"{name}={v!r}: the largest degree is a whole number >= 1, or None for the default")

    def options(self, key: str, values: Sequence[Any]) -> list[Any]:
        """The values ``key`` may take: the fixed one, the first (off) if not allowed, else all."""
        if key in self.fixed:
            return [self.fixed[key]] if self.fixed[key] in values or key == "dp" else []
        if key in PARALLELISMS and key not in self.allow:
            return list(values[:1])
        return list(values)


_CHOICES: dict[str, Sequence[Any]] = {
    "schedule": SCHEDULES, "recompute": RECOMPUTE, "cp_method": CP_METHODS, "attention": ATTENTION,
}  # fmt: skip


def _check_fixed(key: str, value: Any) -> None:
    """A fixed plan field of the right kind: degrees whole numbers >= 1, ``zero`` 0 to 3, ``sp`` on or off, words
    among their choices."""
    if key in _CHOICES:
        if not isinstance(value, str) or value not in _CHOICES[key]:
            raise PlannerError(f"{key}={value!r}: choose one of {list(_CHOICES[key])}")
    elif key == "sp":
        if not isinstance(value, bool):
            raise PlannerError(f"sp={value!r}: sequence parallelism is on or off, sp=True or sp=False")
    elif key == "zero":
        if isinstance(value, bool) or value not in (0, 1, 2, 3):
            raise PlannerError(f"zero={value!r}: the ZeRO stage is 0, 1, 2 or 3")
    elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlannerError(f"{key}={value!r}: a fixed {key} is a whole number >= 1, e.g. {key}=2")


def _allowed(allow: Any) -> tuple[str, ...]:
    """``allow`` as a tuple of names, or why it is not one."""
    if isinstance(allow, str) or not isinstance(allow, Iterable) or not all(isinstance(a, str) for a in allow):
        raise PlannerError(
            f"allow={allow!r}: give the parallelisms that may be used as a tuple of names, e.g. allow=('dp', 'tp')"
        )
    return tuple(allow)


def _pair(name: str, value: Any, *, tokens: bool = False) -> tuple[int, int]:
    """``value`` as (smallest, largest) whole numbers (token counts, read as ``batch_tokens`` is, when
    ``tokens``), or a :class:`PlannerError` naming ``name``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise PlannerError(f"{name}={value!r}: give (smallest, largest), e.g. {name}=(1, 8)")
    if tokens:
        lo, hi = (tokens_argument(v, name, PlannerError) for v in value)
        return lo, hi
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int):
            raise PlannerError(f"{name}={value!r}: give (smallest, largest) as whole numbers, e.g. {name}=(1, 8)")
    return value[0], value[1]


def divisors_between(n: int, lo: int, hi: int) -> list[int]:
    """The divisors of ``n`` from ``lo`` to ``hi``, ascending: by trial of that range when it
    is short (the microbatch range, 1 to 64 by default), else from :func:`divisors`.

    >>> divisors_between(2**40, 1, 8), divisors_between(12, 3, 10**12)
    ([1, 2, 4, 8], [3, 4, 6, 12])
    """
    hi = min(hi, n)
    if hi - lo < math.isqrt(n):
        return [d for d in range(max(lo, 1), hi + 1) if n % d == 0]
    return [d for d in divisors(n) if lo <= d <= hi]


def tp_degrees(model: TransformerConfig, chips: int, tp_max: int) -> list[int]:
    """Tensor-parallel degrees the model splits by (heads, d_ff, vocab; KV heads split or replicated).

    >>> from shardsim.models import get
    >>> tp_degrees(get("llama3-405b"), 16384, 8)
    [1, 2, 4, 8]
    """
    k = model.n_kv
    return [
        t
        for t in divisors(chips)
        if t <= tp_max
        and model.heads % t == 0
        and model.d_ff % t == 0
        and model.vocab % t == 0
        and (k % t == 0 or t % k == 0)
    ]


def batch_sizes(batch_tokens: int, seq: int, dp: int, rng: tuple[int, int] | None) -> list[int]:
    """Global batches in sequences a data-parallel degree ``dp`` can take: ``batch_tokens / seq``
    if it divides by ``dp``; with a range, the multiple of ``dp`` nearest that in the range.

    >>> batch_sizes(96, 16, 4, None), batch_sizes(96, 16, 4, (64, 128))
    ([], [4])
    """
    want = batch_tokens // seq
    if rng is None:
        return [want] if want % dp == 0 else []
    lo, hi = -(-rng[0] // seq), rng[1] // seq
    first, last = -(-lo // dp) * dp, hi // dp * dp  # the range's smallest and largest multiples of dp
    if first > last:
        return []
    near = min(max(want, first), last) // dp * dp  # found arithmetically: the range may span 2**40 tokens
    options = {b for b in (near, near + dp) if first <= b <= last}
    return sorted(options, key=lambda b: (abs(b - want), b))[:1]


def candidates(
    model: TransformerConfig,
    *,
    chips: int,
    batch_tokens: int,
    seq: int,
    domain: int,
    constraints: Constraints | None = None,
    orders: Sequence[tuple[str, ...]] = (DEFAULT_ORDER, DATA_INSIDE),
) -> Iterator[Candidate]:
    """Every candidate of the space (module doc); ``domain`` is the fast network's chip count."""
    c = constraints or Constraints()
    tp_max = c.tp_max or domain
    cp_max = 1 if model.experts else c.cp_max or max(1, seq // 8192)  # the router needs whole sequences
    opt = c.options
    for tp in opt("tp", tp_degrees(model, chips, tp_max if "tp" not in c.fixed else chips)):
        cps = [d for d in divisors(chips // tp) if (seq % (2 * d) == 0 and d <= cp_max) or d == 1]
        for cp in opt("cp", cps if "cp" not in c.fixed else divisors(chips // tp)):
            eps = [e for e in divisors(chips // (tp * cp)) if model.experts % e == 0] if model.experts else [1]
            for ep in opt("ep", eps):
                pps = [p for p in divisors(chips // (tp * cp * ep)) if p == 1 or not model.tie_embeddings]
                for pp in opt("pp", [p for p in pps if stage_layers(model.layers, p) is not None]):
                    dp = chips // (tp * cp * ep * pp)
                    if opt("dp", [dp]) == [dp]:
                        degrees = Plan(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
                        yield from _sharded(model, degrees, batch_tokens, seq, c, orders)


def _sharded(
    model: TransformerConfig,
    degrees: Plan,
    batch_tokens: int,
    seq: int,
    c: Constraints,
    orders: Sequence[tuple[str, ...]],
) -> Iterator[Candidate]:
    """The ZeRO stages, sequence parallelism, context-parallel attention and recomputation
    policies of one set of degrees."""
    dp, tp, cp = degrees.dp, degrees.tp, degrees.cp
    # FlashAttention unless fixed: it holds no [B, N, S, S] scores and, on every chip, runs
    # at least as fast as the scores in memory, so the standard kernel never wins a search
    attention = c.fixed.get("attention", "flash")
    # ZeRO-2/3 without a pipeline only: the layer program reduces their gradients once a step,
    # where each of a pipeline's microbatches would reduce-scatter its own (or hold them whole)
    stages = (0, 1, 2, 3) if degrees.pp == 1 else (0, 1)
    zeros = [z for z in stages if z == 0 or (dp > 1 and model.d_model % dp == 0)]  # the state splits D
    zeros = [z for z in zeros if z < 2 or not model.experts]  # the experts' gradients are reduced in the block
    for zero in c.options("zero", zeros):
        for sp in c.options("sp", [False, True] if tp > 1 else [False]):
            if sp and seq % (tp * cp):
                continue
            for method in c.options("cp_method", list(CP_METHODS)) if cp > 1 else ["ring"]:
                for recompute in c.options("recompute", list(RECOMPUTE)):
                    base = degrees.replace(zero=zero, sp=sp, recompute=recompute, cp_method=method, attention=attention)
                    yield from _batches(model, base, batch_tokens, seq, c, orders)


def _batches(
    model: TransformerConfig,
    base: Plan,
    batch_tokens: int,
    seq: int,
    c: Constraints,
    orders: Sequence[tuple[str, ...]],
) -> Iterator[Candidate]:
    lo, hi = c.micro_range
    ranks = base.dp * base.ep  # outside the experts the expert axis splits the batch too
    for batch in batch_sizes(batch_tokens, seq, ranks, c.batch_range):
        per_rank = batch // ranks
        for micro in divisors_between(per_rank, lo, hi):
            m = per_rank // micro
            if c.options("microbatches", [m]) != [m] or (base.pp > 1 and m > MAX_MICROBATCHES):
                continue
            for schedule, v in _schedules(model, base.pp, m, c):
                plan = base.replace(microbatches=m, schedule=schedule, virtual_stages=v)
                inside = base.pp > 1 and base.dp > 1
                for order in orders if inside else orders[:1]:
                    yield Candidate(plan, micro, batch, tuple(order))


def _schedules(model: TransformerConfig, pp: int, m: int, c: Constraints) -> list[tuple[str, int]]:
    if pp == 1:
        return [("1f1b", 1)] if c.options("schedule", ["1f1b"]) else []
    # ZB-H2's extra forwards fill the bubble once each stage has 2p of them to run
    zero_bubble = [s for s in ZERO_BUBBLE if c.zero_bubble and (s != "zb-h2" or m >= 2 * pp)]
    out = [(s, 1) for s in c.options("schedule", ["1f1b", "gpipe", *zero_bubble])]
    if c.fixed.get("schedule") in ZERO_BUBBLE:  # asked for by name: searched whatever m
        out = [(c.fixed["schedule"], 1)]
    if "interleaved" in c.options("schedule", ["interleaved"]) and m % pp == 0:
        for v in c.options("virtual_stages", [2, 4, 8]):
            if v > 1 and stage_layers(model.layers, pp * v) is not None:
                out.append(("interleaved", v))
    if "virtual_stages" in c.fixed and c.fixed["virtual_stages"] > 1:
        out = [(s, v) for s, v in out if v == c.fixed["virtual_stages"]]
    return out
