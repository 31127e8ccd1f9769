"""How to fit: the single changes to a transformer's plan that make a step fit the chip.

A plan whose step does not fit the chip's HBM is tried with each change a practitioner would
make first (:func:`~shardsim.cost.changes.changes`), one at a time and on the same chips:
FlashAttention (``attention=flash``), recomputation (``recompute=selective``, unless
FlashAttention leaves it nothing to drop, then ``full``), a higher ZeRO stage (up to 3), more
microbatches of the same global batch (a smaller microbatch), sequence parallelism when
``tp > 1``. Each is estimated as the plan was, with the same options; :func:`fixes` returns
those that fit, the fastest first, and the summary of
:func:`shardsim.cost.estimate` ends with the three fastest (``to fit: ...``) or says that no
single change fits and what was tried.

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

from typing import Any

from ..errors import ShardsimError
from ..models import TransformerConfig
from ..plans import Plan
from .changes import Advice, Fix, changes
from .defaults import applied
from .hardware import Hardware
from .model_estimate import estimate_model
from .step_estimate import Estimate


def fixes(
    model: TransformerConfig | str,
    plan: Plan | str,
    hardware: Hardware | str,
    *,
    batch_tokens: int | str,
    seq: int | None = None,
    **estimate_options: Any,
) -> list[Fix]:
    """The single changes that make ``model``'s step under ``plan`` fit ``hardware``, each
    estimated with ``estimate_options`` (:func:`~shardsim.cost.estimate_model`'s) on the same
    chips, fastest first (module doc). A plan that fits needs none: ``[]``.

    >>> fixes("gpt-tiny", "dp=2", "h100", batch_tokens=4 * 16, seq=16)
    []
    """
    options = {**estimate_options, "memory": True}
    base = estimate_model(model, plan, hardware, batch_tokens=batch_tokens, seq=seq, **options)
    return [] if base.fits else _fitting(base, seq, options)


def _fitting(base: Estimate, seq: int | None, options: dict[str, Any]) -> list[Fix]:
    """The changes of ``base``'s plan whose estimates fit, fastest first."""
    assert base.cfg is not None
    found = []
    for text, changed in changes(base.plan, base.batch // base.seq):
        try:
            e = estimate_model(base.cfg, changed, base.hardware, batch_tokens=base.batch, seq=seq, **options)
        except ShardsimError:  # a change this model or batch cannot take (dropout under flash, say)
            continue
        if e.fits:
            found.append(Fix(text, changed, e.memory["total"], e.step_s, base.step_s))
    return sorted(found, key=lambda f: f.step_s)


def advise(est: Estimate, *, seq: int | None, **options: Any) -> Estimate:
    """``est`` with the defaults it applied (:mod:`~shardsim.cost.defaults`) and, when a
    transformer's step does not fit, the changes that do (:attr:`Estimate.fixes`, found when
    first read).
    ``options`` are the estimate's own (:func:`~shardsim.cost.estimate_model`'s)."""
    named = {k: options[k] for k in ("efficiency", "optimizer", "precision", "policy", "dtype") if k in options}
    cfg = est.cfg
    if cfg is None:  # an MLP's: no attention, no sequence
        est.defaults = applied(**{**named, "precision": named.get("precision") or est.plan.precision})
        return est
    est.defaults = applied(plan=est.plan, seq=seq, model_seq=cfg.seq, **named)
    if est.memory and not est.fits:  # found when first read: each is a whole estimate
        est.advice = Advice(lambda: _fitting(est, seq, options))
    return est


__all__ = ["Fix", "advise", "fixes"]
