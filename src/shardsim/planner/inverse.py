"""The inverse questions: the largest model that fits, the fewest chips that reach a target,
the days a token budget takes.

- :func:`largest_model`: the most layers (or the widest ``d_model``) of a model family that
  fits ``chips`` chips under one plan, by bisection on the ledger's memory of the plan's
  program (scaling the layers reuses one traced layer program).
- :func:`fewest_chips`: the smallest chip count (doubling from one fast domain) whose best
  plan reaches a step time or a throughput.
- :func:`days_to_train`: the days a token budget takes at a plan's estimated tokens per second.

>>> from shardsim.models import get
>>> from shardsim.plans import Plan
>>> cfg, est = largest_model(get("gpt-tiny"), "h100", Plan(dp=2), batch_tokens=2 * 16, seq=16, max_layers=64)
>>> cfg.layers  # the toy is tiny: the search stops at its ceiling
64
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

from ..cost.efficiency import Efficiency
from ..cost.hardware import Hardware
from ..cost.layer_program import LayerCache
from ..cost.presets import get_hardware
from ..errors import PlannerError
from ..mesh import MAX_CHIPS
from ..models import TransformerConfig
from ..plans import Plan
from ..training.policies import BytePolicy
from .evaluate import PlanEstimate, evaluate, model_state
from .search import check_arguments
from .search import plan as search
from .space import Candidate
from .table import PlanTable

#: The most layers :func:`largest_model` tries (its bisection halves this range), the most
#: widths, and the most chip counts :func:`fewest_chips` searches.
MAX_LAYERS = 2**16
MAX_WIDTHS = 64
MAX_COUNTS = 64


def largest_model(
    family: TransformerConfig,
    hardware: Hardware | str,
    plan: Plan,
    *,
    batch_tokens: int,
    seq: int,
    scale: str = "layers",
    micro: int = 1,
    count: str = "step",
    max_layers: int = 4096,
    widths: Sequence[int] | None = None,
    efficiency: str | Efficiency = "calibrated",
    policy: str | BytePolicy | None = None,
) -> tuple[TransformerConfig, PlanEstimate]:
    """The largest member of ``family`` whose memory under ``plan`` fits one chip of ``hardware``.

    ``scale="layers"`` varies the layer count (1 to ``max_layers``); ``scale="width"`` tries
    ``widths`` as ``d_model`` (with ``d_ff = 4 d_model`` and the heads' width kept). ``count``
    is ``"step"`` (the peak of the whole training step: weights, gradients, optimizer state,
    activations) or ``"model_state"`` (weights, reduced gradients and optimizer state alone,
    as the ZeRO paper's Table 2 counts), both from the ledger of the training step under the
    byte ``policy`` (:mod:`shardsim.training.policies`). Returns the model and its estimate.
    """
    family, hw, batch_tokens, seq, _, _ = check_arguments(family, hardware, batch_tokens, seq, constraints={})
    plan = _plan(plan)
    if scale not in ("layers", "width"):
        raise PlannerError(f"largest_model scale={scale!r}: choose 'layers' or 'width'")
    if count not in ("step", "model_state"):
        raise PlannerError(f"largest_model count={count!r}: choose 'step' or 'model_state'")
    _whole("micro", micro, batch_tokens // seq // plan.dp or 1)
    _whole("max_layers", max_layers, MAX_LAYERS)
    if widths is not None:
        if isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence) or len(widths) > MAX_WIDTHS:
            raise PlannerError(
                f"widths={widths!r:.60}: give up to {MAX_WIDTHS} d_model values, e.g. widths=[4096, 8192]"
            )
        for w in widths:
            _whole("widths", w, 2**24)
    if batch_tokens // seq < plan.dp * micro:
        raise PlannerError(
            f"batch_tokens={batch_tokens} is {batch_tokens // seq} sequences of {seq}, fewer than dp={plan.dp} x "
            f"micro={micro}; use at least {plan.dp * micro * seq} tokens"
        )
    per_rank = batch_tokens // seq // plan.dp
    cand = Candidate(plan.replace(microbatches=max(1, per_rank // micro)), micro, batch_tokens // seq)

    def members() -> list[TransformerConfig]:
        if scale == "layers":
            return []
        hd = family.hd
        return [family.scaled(d_model=w, d_ff=4 * w, heads=w // hd, kv_heads=None) for w in widths or ()]

    options: dict[str, Any] = {"efficiency": efficiency, "policy": policy}
    shared = LayerCache(family, hw, seq=seq, **options)

    def fits(cfg: TransformerConfig) -> tuple[bool, PlanEstimate]:
        same = scale == "layers"  # deeper members share the family's traced layer program
        cache = shared.with_layers(cfg.layers) if same else LayerCache(cfg, hw, seq=seq, **options)
        est = evaluate(cache, cand)
        if count == "model_state":
            total = model_state(cache, cand)["total"]
            return total <= hw.hbm_capacity, est
        return est.fits, est

    if scale == "width":
        best: tuple[TransformerConfig, PlanEstimate] | None = None
        for cfg in members():
            ok, est = fits(cfg)
            if not ok:
                break
            best = (cfg, est)
        if best is None:
            raise PlannerError(f"no width of {family.name or 'the family'} in {list(widths or ())} fits under {plan}")
        return best
    cache_layers: dict[int, tuple[bool, PlanEstimate]] = {}

    def at(layers: int) -> tuple[bool, PlanEstimate]:
        if layers not in cache_layers:
            cache_layers[layers] = fits(family.scaled(layers=layers))
        return cache_layers[layers]

    step = plan.pp * plan.virtual_stages
    lo, hi = 1, max_layers // step
    if not at(lo * step)[0]:
        raise PlannerError(
            f"not even {step} layer(s) of {family.name or 'the family'} fit one {hw.name} under {plan}; "
            "use more chips, a higher ZeRO stage or recomputation"
        )
    if at(hi * step)[0]:
        return family.scaled(layers=hi * step), at(hi * step)[1]
    while hi - lo > 1:  # at(lo) fits, at(hi) does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid * step)[0] else (lo, mid)
    return family.scaled(layers=lo * step), at(lo * step)[1]


def fewest_chips(
    model: TransformerConfig | str,
    hardware: Hardware | str,
    *,
    batch_tokens: int,
    seq: int | None = None,
    step_s: float | None = None,
    tokens_per_s: float | None = None,
    chips: Sequence[int] | None = None,
    **options: Any,
) -> tuple[int, PlanTable]:
    """The fewest chips whose best plan takes at most ``step_s`` per step or reaches
    ``tokens_per_s``; ``chips`` the counts to try, ascending (default: one fast domain,
    doubling, up to 65,536). ``options`` go to :func:`~shardsim.planner.plan`."""
    if (step_s is None) == (tokens_per_s is None):
        raise PlannerError("fewest_chips needs exactly one target: step_s=... or tokens_per_s=...")
    for name, goal in (("step_s", step_s), ("tokens_per_s", tokens_per_s)):
        if goal is not None and not _positive(goal):
            raise PlannerError(f"fewest_chips {name}={goal!r}: the target is a finite number above 0")
    hw = get_hardware(hardware)
    # the arguments every count shares, checked once: a PlannerError inside the loop means that count missed
    checked = dict(options)
    check_arguments(model, hw, batch_tokens, seq, window=checked.pop("window", 0.15),
                    progress=checked.pop("progress", None), policy=checked.pop("policy", None),
                    cache=checked.pop("cache", None), constraints=_constraint_options(checked))  # fmt: skip
    if chips is not None:
        if isinstance(chips, (str, bytes)) or not isinstance(chips, Sequence) or not 1 <= len(chips) <= MAX_COUNTS:
            raise PlannerError(f"chips={chips!r:.60}: give 1 to {MAX_COUNTS} chip counts, ascending, e.g. [8, 16, 32]")
        for n in chips:
            _whole("chips", n, MAX_CHIPS)
    counts = list(chips) if chips is not None else _doublings(hw)
    misses: list[str] = []
    for n in counts:
        try:
            table = search(model, hw, n, batch_tokens, seq, nearest=False, **options)  # the walk is ours
        except PlannerError as err:
            misses.append(f"{n}: {str(err).split(';')[0]}")
            continue
        b = table.best
        if (step_s is not None and b.step_s <= step_s) or (tokens_per_s is not None and b.tokens_per_s >= tokens_per_s):
            return n, table
        misses.append(f"{n}: best {b.step_s:.4g} s per step, {b.tokens_per_s:,.0f} tokens/s")
    target = f"step_s <= {step_s}" if step_s is not None else f"tokens_per_s >= {tokens_per_s}"
    raise PlannerError(f"no chip count in {counts} reaches {target}: " + "; ".join(misses[-3:]))


def _plan(plan: Any) -> Plan:
    """A plan or its string, or a :class:`PlannerError` naming it."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, str):
        return Plan.parse(plan)
    raise PlannerError(f"plan={plan!r:.60} ({type(plan).__name__}): pass a Plan or its string, e.g. 'dp=8,tp=8'")


def _whole(name: str, value: Any, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise PlannerError(f"{name}={value!r}: a whole number from 1 to {most:,}")


def _positive(x: Any) -> bool:
    """A finite real number above 0 (not a bool)."""
    return not isinstance(x, bool) and isinstance(x, numbers.Real) and 0 < float(x) < math.inf


def _constraint_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options of :func:`~shardsim.planner.plan` that are constraints (efficiency, links and
    topology are checked where the chips are placed)."""
    return {k: v for k, v in options.items() if k not in ("efficiency", "links", "topology")}


def _doublings(hw: Hardware) -> list[int]:
    net = next(iter(hw.networks.values()))
    n = getattr(net, "domain", None) or 1
    out = []
    while n <= 65536:
        out.append(n)
        n *= 2
    return out


def days_to_train(estimate: PlanEstimate | PlanTable, tokens: float) -> float:
    """Days to train on ``tokens`` tokens at the estimate's (or the table's best plan's) tokens per second.

    >>> from shardsim.models import get
    >>> from shardsim.planner import plan
    >>> t = plan(get("gpt-tiny"), "h100", chips=2, batch_tokens=4 * 16, seq=16, zero=0, recompute="none")
    >>> days_to_train(t, t.best.tokens_per_s * 86400)
    1.0
    """
    if not isinstance(estimate, (PlanEstimate, PlanTable)):
        raise PlannerError(
            f"days_to_train estimate={estimate!r:.60} ({type(estimate).__name__}): pass a PlanTable or a PlanEstimate "
            "(a row of one)"
        )
    est = estimate.best if isinstance(estimate, PlanTable) else estimate
    if not _positive(tokens):
        raise PlannerError(f"days_to_train needs a positive, finite token budget, got {tokens!r}")
    return float(tokens / est.tokens_per_s / 86400)
