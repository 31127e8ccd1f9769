"""The one set of defaults every answer assumes, and the line that names those it applied.

Every entry point (:func:`shardsim.cost.estimate`, :func:`shardsim.planner.plan`, ``shardsim
estimate``, ``shardsim plan``...) takes the same, modern defaults: FlashAttention
(``attention=flash``), an H100 on the command line, bf16 weights with float32 master weights
and optimizer moments, Adam, the calibrated efficiency and the model's own sequence length.
Each answer prints one line naming the settings it ran at their default value (the command
line's hardware only when ``--hardware`` is not given); a published run of 2021 states its own
(``attention=standard``) instead. The planner and :func:`shardsim.cost.estimate` name them;
the bare :func:`~shardsim.cost.estimate_model` and :func:`shardsim.training.model_memory`
apply the same ones silently.

>>> from shardsim.plans import Plan
>>> print(line(applied(plan=Plan(tp=2), seq=None, model_seq=2048)))  # doctest: +NORMALIZE_WHITESPACE
defaults: attention=flash, precision=bf16 (fp32 master weights and moments), optimizer=adam,
efficiency=calibrated, seq=2048 (the model's)
>>> line(applied(plan=Plan(attention="standard"), efficiency="ideal", optimizer="sgd", precision="fp32"))
''
"""

from __future__ import annotations

from ..plans import Plan

HARDWARE = "h100"
ATTENTION = "flash"
EFFICIENCY = "calibrated"
OPTIMIZER = "adam"


def applied(
    *,
    plan: Plan | None = None,
    efficiency: object = EFFICIENCY,
    optimizer: object = OPTIMIZER,
    precision: object = None,
    policy: object = None,
    dtype: object = "bfloat16",
    seq: int | None = 0,
    model_seq: int | None = None,
    fixed_attention: bool = False,
) -> dict[str, str]:
    """The defaults an answer applied, by name, worded as the line prints them: each option left
    at its default (a plan's ``attention`` without context parallelism, unless
    ``fixed_attention``; ``precision`` and ``optimizer`` unless a byte ``policy`` names them;
    ``seq`` None with the model's ``model_seq``).

    >>> applied(plan=Plan(cp=2), efficiency="ideal")
    {'precision': 'bf16 (fp32 master weights and moments)', 'optimizer': 'adam'}
    """
    out: dict[str, str] = {}
    if plan is not None and plan.cp == 1 and plan.attention == ATTENTION and not fixed_attention:
        out["attention"] = ATTENTION
    if policy is None:
        if precision is None and (plan is None or plan.precision is None) and dtype == "bfloat16":
            out["precision"] = "bf16 (fp32 master weights and moments)"
        if optimizer == OPTIMIZER:
            out["optimizer"] = OPTIMIZER
    if efficiency == EFFICIENCY:
        out["efficiency"] = EFFICIENCY
    if seq is None and model_seq is not None:
        out["seq"] = f"{model_seq} (the model's)"
    return out


def line(defaults: dict[str, str]) -> str:
    """``defaults: attention=flash, ...``: one line, or ``""`` when none was applied.

    >>> line({"hardware": HARDWARE})
    'defaults: hardware=h100'
    """
    return "defaults: " + ", ".join(f"{k}={v}" for k, v in defaults.items()) if defaults else ""


__all__ = ["ATTENTION", "EFFICIENCY", "HARDWARE", "OPTIMIZER", "applied", "line"]
