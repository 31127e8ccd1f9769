"""Estimate one training step on a hardware: time, MFU, memory, what binds it.

:func:`estimate` is one estimate (:func:`~shardsim.cost.model_estimate.estimate_model`) of a
model under a plan, ``estimate(model, plan, hardware, batch_tokens=..., seq=...)``, the model a
:class:`~shardsim.models.TransformerConfig`, a preset name or an :class:`~shardsim.models.MLP`;
``estimate("fsdp", mesh, hardware, batch, d_model, d_ff, layers)`` spells it for a registered
scheme (:mod:`~shardsim.cost.scheme_estimate`): the scheme's MLP under the scheme's plan, the
same :class:`~shardsim.cost.Estimate`. Either way the model's own program runs shape-only at
the real sizes (:mod:`~shardsim.cost.builder`), every event is costed (roofline for matmuls,
the book's formulas for collectives) and scheduled on a time line
(:mod:`shardsim.cost.timeline`).

``bound`` follows the book's test, phase by phase: a phase whose collectives on some mesh
axis take longer than its matmul FLOPs (T_comms > T_math) makes the step
``"communication"``-bound (the forward pass decides for FSDP and TP, the backward pass for
DP); otherwise it is ``"memory"``-bound if the matmuls' HBM traffic outlasts their FLOPs
(the single-chip roofline), else ``"compute"``-bound. :func:`~shardsim.cost.critical_batch`
finds the batch where the first test flips.

``efficiency="calibrated"`` (the default) times matmuls and collectives at the chip's
measured rates (:mod:`~shardsim.cost.efficiency`), ``"ideal"`` at the book's; the summary
says which. ``topology`` gives a TPU slice shape (several mesh axes may share a hardware
axis, :func:`~shardsim.cost.place`); ``pad=True`` pads ``d_model``/``d_ff`` that do not
divide the mesh up to a multiple of its chips, as FSDP pads its flat parameters.

``memory`` is each chip's peak by category (``params``, ``grads``, ``optimizer``,
``activations``, ``total``) as the ledger measures it over the same shape-only training step
:class:`~shardsim.training.Trainer` runs: ``optimizer`` (Adam by default) and ``precision``
(by default ``dtype``'s policy: bf16 weights with float32 master weights and moments) decide
the optimizer state. ``fits`` compares ``total`` with the chip's HBM; ``shortfall`` and
``largest()`` say by how much and why when it does not. ``model_state`` is the
``params``, ``grads`` and ``optimizer`` bytes live between the backward pass and the update
(the moment the ZeRO paper's per-device figures describe), without the gathered weights and
unreduced gradients the peaks include.

>>> from shardsim import Mesh
>>> from shardsim.models import MLP
>>> from shardsim.strategies.plans import plan_of
>>> est = estimate("fsdp", Mesh(X=16), "tpu-v5p", batch=16 * 4096, d_model=8192, d_ff=32768, efficiency="ideal")
>>> est.bound, round(est.mfu, 2), est.per_chip_batch
('compute', 0.91, 4096.0)
>>> plan = plan_of("fsdp", Mesh(X=16))
>>> same = estimate(MLP(8192, 32768), plan, "tpu-v5p", batch_tokens=16 * 4096, efficiency="ideal")
>>> same.step_s == est.step_s and same.memory == est.memory
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ArgumentTypeError, CostModelError, ShardsimError
from ..mesh import Mesh
from ..models import TransformerConfig
from ..models.mlp import MLP
from ..plans import Plan
from .bound import comm_excess, excess_terms
from .efficiency import Efficiency
from .fixes import advise
from .hardware import Hardware
from .placement import AxisLink
from .program_estimate import estimate_program
from .step_estimate import Estimate


def estimate(
    scheme: str | TransformerConfig | MLP,
    mesh: Mesh | Mapping[str, int] | Plan | str,
    hardware: Hardware | str,
    batch: int | None = None,
    d_model: int | None = None,
    d_ff: int | None = None,
    layers: int = 1,
    overlap: bool = True,
    dtype: str = "bfloat16",
    *,
    links: Mapping[str, str | AxisLink] | None = None,
    axes: Mapping[str, str] | None = None,
    activation: str = "identity",
    prefetch: int = 1,
    topology: str | Sequence[int] | None = None,
    efficiency: str | Efficiency = "calibrated",
    pad: bool = False,
    optimizer: str = "adam",
    precision: str | None = None,
    policy: str | None = None,
    batch_tokens: int | str | None = None,
    seq: int | None = None,
    chips: int | None = None,
) -> Estimate:
    """Estimate one training step of a model under a plan, ``estimate(model, plan, hardware,
    batch_tokens=..., seq=...)``, or of ``scheme`` with a global batch of ``batch`` tokens.

    The first argument decides: a :class:`~shardsim.models.TransformerConfig`, a model preset
    name (``"llama3-70b"``) or an :class:`~shardsim.models.MLP` is that model under ``plan`` (a
    :class:`~shardsim.plans.Plan` or its string), estimated by
    :func:`~shardsim.cost.model_estimate.estimate_model` with ``batch_tokens``, ``seq``,
    ``chips``, a byte ``policy`` (:mod:`shardsim.training.policies`: a transformer's optimizer
    and precision in one name) and the options all share (``links``, ``topology``,
    ``efficiency``, ``optimizer``, ``precision``, ``overlap``, ``prefetch``, ``dtype``); a registered scheme
    name (``"fsdp"``...) is the MLP of the seeds on ``mesh`` with ``d_model``, ``d_ff`` and
    ``layers`` under the scheme's plan (:func:`~shardsim.cost.scheme_estimate.estimate_scheme`).

    ``mesh`` is a :class:`~shardsim.Mesh` or ``{"X": 16, ...}``; ``hardware`` a
    :class:`Hardware` or a preset name; ``links`` maps mesh axes to networks (see
    :func:`~shardsim.cost.place`); ``axes`` maps the scheme's roles to mesh axes;
    ``prefetch`` is how many matmuls ahead of its reader a collective may start
    (:mod:`~shardsim.cost.schedule`); ``topology``, ``efficiency`` and ``pad`` as the module
    doc says. ``optimizer`` (``sgd``, ``momentum``, ``adam``, ``adamw``) and ``precision``
    (``fp32``, ``bf16``, ``fp16``...; by default ``dtype``'s) are the training step's whose
    ledger gives ``memory``.

    >>> from shardsim import Mesh
    >>> est = estimate("ddp", Mesh(X=64), "h100", 64 * 1024, 5120, 20480, layers=27)
    >>> print(est.memory_line())  # doctest: +ELLIPSIS
    memory does not fit: needs 90.91 GB of 80 GB (10.91 GB short)
    largest: optimizer 67.95 GB, params 11.32 GB, grads 11.32 GB; over one training step, adam (...)
    """
    shared: dict[str, Any] = dict(
        links=links, topology=topology, efficiency=efficiency, optimizer=optimizer, precision=precision,
        overlap=overlap, prefetch=prefetch, dtype=dtype,
    )  # fmt: skip
    if is_model(scheme) or isinstance(scheme, MLP):
        from .model_estimate import estimate_model

        given = {"batch": batch, "d_model": d_model, "d_ff": d_ff, "axes": axes}
        wrong = [k for k, v in given.items() if v is not None] + (["layers"] if layers != 1 else [])
        if wrong or batch_tokens is None or activation != "identity" or pad:
            raise ShardsimError(
                f"estimate({scheme if isinstance(scheme, str) else 'cfg'!r}, plan, hardware, ...) estimates a model: "
                "give batch_tokens= (and seq=), not batch/d_model/d_ff/layers/axes/activation/pad"
                + (f" (got {wrong})" if wrong else "")
            )
        plan: Any = mesh
        est = estimate_model(
            scheme, plan, hardware, batch_tokens=batch_tokens, seq=seq, chips=chips, policy=policy, **shared
        )
        return advise(est, seq=seq, policy=policy, **shared)  # its defaults named; how to fit, if it does not
    check_scheme_arguments(scheme, mesh, batch, d_model, d_ff, batch_tokens, seq, chips)
    if policy is not None:
        raise CostModelError(
            f"policy={policy!r}: a byte policy is the transformer's; a scheme's MLP takes optimizer and precision"
        )
    from .scheme_estimate import estimate_scheme

    assert isinstance(scheme, str) and not isinstance(mesh, (Plan, str))
    assert batch is not None and d_model is not None and d_ff is not None
    est = estimate_scheme(
        scheme, mesh, hardware, batch, d_model, d_ff, layers, axes=axes, activation=activation, pad=pad, **shared
    )
    return advise(est, seq=None, **shared)


def check_scheme_arguments(
    scheme: object,
    mesh: object,
    batch: int | None,
    d_model: int | None,
    d_ff: int | None,
    batch_tokens: object,
    seq: object,
    chips: object,
) -> None:
    """A scheme's estimate takes a scheme name, a mesh and the MLP's sizes, and none of a model's
    arguments; anything else is refused with what to give instead.

    >>> check_scheme_arguments("fsdp", Mesh(X=2), 8, 4, 8, None, None, None)
    >>> check_scheme_arguments("fsdp", "dp=2", 8, 4, 8, None, None, None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    shardsim.errors.ShardsimError: estimate('fsdp', ...): a scheme runs on a mesh with batch, d_model and d_ff, ...
    """
    if not isinstance(scheme, str):
        raise ArgumentTypeError(
            f"estimate: the first argument is a scheme name ('fsdp', ...), a model preset name ('llama3-8b') or a "
            f"TransformerConfig, got {type(scheme).__name__} {scheme!r:.60}"
        )
    if isinstance(mesh, (Plan, str)) or batch_tokens is not None:
        from .. import strategies
        from ..models import get as get_model

        if scheme not in strategies.names():
            get_model(scheme)  # neither a scheme nor a model: the presets' error names them all
    if isinstance(mesh, (Plan, str)) or batch is None or d_model is None or d_ff is None:
        raise ShardsimError(
            f"estimate({scheme!r}, ...): a scheme runs on a mesh with batch, d_model and d_ff, e.g. "
            f"estimate({scheme!r}, Mesh(X=16), 'h100', batch=65536, d_model=8192, d_ff=32768); "
            "to estimate a model give a preset name or TransformerConfig first"
        )
    if batch_tokens is not None or seq is not None or chips is not None:
        raise ShardsimError("batch_tokens, seq and chips belong to a model estimate; a scheme takes batch and mesh")


def is_model(first: object) -> bool:
    """A transformer (a config or a preset name) rather than a registered scheme's name.

    >>> is_model("llama3-8b"), is_model("fsdp")
    (True, False)
    """
    from ..models import names

    return isinstance(first, TransformerConfig) or (isinstance(first, str) and first in names())


__all__ = ["Estimate", "comm_excess", "estimate", "estimate_program", "excess_terms", "is_model"]
