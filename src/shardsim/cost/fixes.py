"""How to fit: the single changes to a transformer's plan that make a step fit the chip.

A plan whose step does not fit the chip's HBM is tried with each change a practitioner would
make first, one at a time and on the same chips: FlashAttention (``attention=flash``),
recomputation (``recompute=selective``, then ``full``), a higher ZeRO stage (up to 3), more
microbatches of the same global batch (a smaller microbatch), sequence parallelism when
``tp > 1``. Each is estimated as the plan was (:func:`shardsim.cost.estimate`, with the same
options); :func:`fixes` returns those that fit, the fastest first, and the estimate's summary
ends with the three fastest (``to fit: ...``) or says that no single change fits and what was
tried. The changes are estimated once, for the estimate asked for, never for its variants.

>>> from shardsim.cost import estimate, get_hardware
>>> small = get_hardware("h100").with_(hbm_capacity=340_000)  # a chip of 340 kB
>>> e = estimate("llama-tiny", "dp=2,tp=2,attention=standard", small, batch_tokens=8 * 16, seq=16)
>>> e.fits, e.fixes[0].change, all(f.memory <= 340_000 for f in e.fixes)
(False, 'zero=2', True)
>>> print(e.memory_line().splitlines()[-1])  # doctest: +NORMALIZE_WHITESPACE
to fit: zero=2 (0.000256 GB, -16% step) or recompute=full (0.0003217 GB, -3% step)
or attention=flash (0.0003369 GB, +0% step)
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

from ..errors import ShardsimError
from ..models import TransformerConfig
from ..plans import Plan
from .hardware import Hardware
from .numbers import gb
from .step_estimate import Estimate

_VARIANT: contextvars.ContextVar[bool] = contextvars.ContextVar("shardsim_fix_variant", default=False)


@dataclass(frozen=True)
class Fix:
    """One change that fits: ``change`` as plan text (``"recompute=selective"``), the ``plan``
    it makes, its per-chip ``memory`` bytes, its ``step_s`` and the unchanged plan's ``base_step_s``."""

    change: str
    plan: Plan
    memory: int
    step_s: float
    base_step_s: float

    @property
    def slowdown(self) -> float:
        """The step's change against the plan's own (0.03: 3% slower)."""
        return self.step_s / self.base_step_s - 1 if self.base_step_s > 0 else 0.0

    def __str__(self) -> str:
        return f"{self.change} ({gb(self.memory)} GB, {round(100 * self.slowdown):+d}% step)"


def changes(plan: Plan, sequences: int) -> list[tuple[str, Plan]]:
    """The single changes tried on ``plan`` with a global batch of ``sequences``, as (text, plan).

    >>> [c for c, _ in changes(Plan(dp=2, tp=2, attention="standard"), 8)]  # doctest: +NORMALIZE_WHITESPACE
    ['attention=flash', 'recompute=selective', 'recompute=full', 'zero=1', 'zero=2', 'zero=3',
     'microbatches=2', 'microbatches=4', 'sp']
    """
    out: list[tuple[str, dict[str, Any]]] = []
    if plan.attention != "flash" and plan.cp == 1:
        out.append(("attention=flash", {"attention": "flash"}))
    for r in ("selective", "full")[("none", "selective", "full").index(plan.recompute) :]:
        out.append((f"recompute={r}", {"recompute": r}))
    if plan.dp > 1:
        out += [(f"zero={z}", {"zero": z}) for z in range(plan.zero + 1, 4)]
    per_replica = sequences // plan.dp
    more = [m for m in range(plan.microbatches + 1, per_replica + 1) if per_replica % m == 0]
    out += [(f"microbatches={m}", {"microbatches": m}) for m in dict.fromkeys(more[:1] + more[-1:])]
    if plan.tp > 1 and not plan.sp:
        out.append(("sp", {"sp": True}))
    return [(text, plan.replace(**change)) for text, change in out if plan.replace(**change) != plan]


def fixes(
    model: TransformerConfig | str,
    plan: Plan | str,
    hardware: Hardware | str,
    *,
    batch_tokens: int | str,
    seq: int | None = None,
    **estimate_options: Any,
) -> list[Fix]:
    """The single changes (:func:`changes`) that make ``model``'s step under ``plan`` fit
    ``hardware``, each estimated with ``estimate_options`` on the same chips, fastest first
    (module doc). A plan that fits needs none: ``[]``.

    >>> fixes("gpt-tiny", "dp=2", "h100", batch_tokens=4 * 16, seq=16)
    []
    """
    from .model_estimate import estimate_model

    options = {**estimate_options, "memory": True}
    token = _VARIANT.set(True)
    try:
        base = estimate_model(model, plan, hardware, batch_tokens=batch_tokens, seq=seq, **options)
    finally:
        _VARIANT.reset(token)
    return [] if base.fits else _fitting(base, seq, options)


def _fitting(base: Estimate, seq: int | None, options: dict[str, Any]) -> list[Fix]:
    """The changes of ``base``'s plan whose estimates fit, fastest first."""
    from .model_estimate import estimate_model

    assert base.cfg is not None
    found = []
    token = _VARIANT.set(True)
    try:
        for text, changed in changes(base.plan, base.batch // base.seq):
            try:
                e = estimate_model(base.cfg, changed, base.hardware, batch_tokens=base.batch, seq=seq, **options)
            except ShardsimError:  # a change this model or batch cannot take (dropout under flash, say)
                continue
            if e.fits:
                found.append(Fix(text, changed, e.memory["total"], e.step_s, base.step_s))
    finally:
        _VARIANT.reset(token)
    return sorted(found, key=lambda f: f.step_s)


def advise(est: Estimate, *, seq: int | None, **options: Any) -> Estimate:
    """``est`` with the defaults it applied (:mod:`.defaults`) and, when its step does not fit
    and it is not itself a variant, the changes that fit (:attr:`Estimate.fixes`)."""
    from .defaults import applied

    assert est.cfg is not None
    est.defaults = applied(plan=est.plan, seq=seq, model_seq=est.cfg.seq, **_named(options))
    if est.memory and not est.fits and not _VARIANT.get():
        est.fixes = _fitting(est, seq, options)
    return est


def _named(options: dict[str, Any]) -> dict[str, Any]:
    return {k: options[k] for k in ("efficiency", "optimizer", "precision", "policy", "dtype") if k in options}


def advice_line(est: Estimate) -> str:
    """The summary's last memory line: the three fastest changes that fit, or what was tried."""
    if est.fixes is None:
        return ""
    if est.fixes:
        return "to fit: " + " or ".join(str(f) for f in est.fixes[:3])
    tried = ", ".join(text for text, _ in changes(est.plan, est.batch // max(est.seq, 1)))
    tried = tried or "nothing, every lever is pulled"
    return f"no single change fits: tried {tried}; try more chips or a shorter sequence"


__all__ = ["Fix", "advice_line", "advise", "changes", "fixes"]
