"""A single-device training reference, written apart from shardsim's optimizers.

Plain functional NumPy in float64: the reference MLP stack (``shardsim.models.reference_mlp``, itself checked
against finite differences), the mean squared error, and SGD / Adam written from their
papers' formulas, one new array per step (no in-place tricks). Alongside the weights it
carries a bound on how far a run in a lower precision may drift from it (see ``Bound``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from shardsim import mlp
from shardsim.dtypes import eps as machine_eps
from shardsim.dtypes import tolerance


@dataclass(frozen=True)
class Opt:
    """Hyperparameters of the reference optimizers (``kind``: sgd, momentum, adam, adamw)."""

    kind: str
    lr: float
    momentum: float = 0.9
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0


def mse_grad(out: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
    diff = out - target
    return float(np.mean(diff**2)), 2.0 * diff / diff.size


@dataclass
class Bound:
    """Per-element bound on ``|w_run - w_ref|`` for a run whose gradients carry relative error ``rel``.

    Each step's gradient error is at most ``rel * max|g|`` per element. SGD passes it on
    scaled by ``lr`` (momentum sums the past ones); Adam divides it by ``sqrt(v_hat) + eps``
    (its sensitivity ``|d u / d g| <= (1 + |u|) / (sqrt(v_hat) + eps)`` for ``u = m_hat /
    (sqrt(v_hat) + eps)``, since ``m_hat`` and ``sqrt(v_hat)`` are weighted averages that move
    by at most the gradient error). Each update rounds the weights twice at most (weight decay,
    then the step; either side may do it in another order): ``2 ulp (|w| + |step|)``.
    """

    rel: float
    ulp: float
    err: dict[str, np.ndarray] = field(default_factory=dict)
    grad_err: dict[str, list[float]] = field(default_factory=dict)
    out_scale: list[float] = field(default_factory=list)  # max |Out| before each step

    def stable(self) -> bool:
        """True if no gradient grew tenfold: the bound leaves out how earlier drift feeds later
        gradients, which a diverging run amplifies step after step."""
        return all(np.isfinite(e).all() and max(e) <= 10 * e[0] for e in self.grad_err.values())

    def first_loss_error(self, loss: float, sum_rel: float) -> float:
        """Bound on the first step's loss error: Out carries ``e = rel * max|Out|`` per element,
        and ``|mean((d + e)²) - mean(d²)| <= 2 e sqrt(mean(d²)) + e²``; summing the squares
        in the run's dtype adds ``sum_rel * loss``."""
        e = self.rel * self.out_scale[0]
        return 2 * e * loss**0.5 + e * e + sum_rel * loss


def train(
    params: dict[str, np.ndarray],
    x: np.ndarray,
    target: np.ndarray,
    opt: Opt,
    steps: int,
    *,
    activation: str = "identity",
    residual: bool = False,
    bound: Bound | None = None,
) -> tuple[dict[str, np.ndarray], list[float]]:
    """``steps`` single-device steps in float64; returns the weights and the loss before each step."""
    w = {k: np.asarray(v, np.float64) for k, v in params.items()}
    x, target = np.asarray(x, np.float64), np.asarray(target, np.float64)
    state: dict[str, dict[str, np.ndarray]] = {k: {} for k in w}
    losses = []
    if bound is not None:
        bound.err = {k: np.zeros_like(v) for k, v in w.items()}
        bound.grad_err = {k: [] for k in w}
        bound.out_scale = []
    with warnings.catch_warnings():  # a diverging run may overflow: Bound.stable() then rejects it
        warnings.simplefilter("ignore", RuntimeWarning)
        for t in range(1, steps + 1):
            out = mlp.stack_forward(w, x, activation, residual)
            loss, dout = mse_grad(out, target)
            losses.append(loss)
            if bound is not None:
                bound.out_scale.append(float(np.abs(out).max()))
            grads = mlp.stack_backward(w, x, dout, activation, residual)
            for k in w:
                g = grads[k]
                new, sens = _step(opt, w[k], g, state[k], t)
                if bound is not None:
                    bound.grad_err[k].append(bound.rel * float(np.abs(g).max()))
                    rounding = 2 * bound.ulp * (np.abs(w[k]) + np.abs(new - w[k]))  # the decay and the step
                    bound.err[k] = bound.err[k] + _drift(opt, sens, bound.grad_err[k]) + rounding
                w[k] = new
    return w, losses


def _step(opt: Opt, w: np.ndarray, g: np.ndarray, s: dict[str, np.ndarray], t: int) -> tuple[np.ndarray, np.ndarray]:
    """One update; returns the new weights and the per-element sensitivity of the update to g."""
    if opt.kind in ("sgd", "momentum"):
        g = g + opt.weight_decay * w
        if opt.kind == "momentum":
            s["buf"] = g if "buf" not in s else opt.momentum * s["buf"] + g
            g = s["buf"]
        return w - opt.lr * g, np.full_like(w, opt.lr)
    decoupled = opt.kind == "adamw"
    if not decoupled:
        g = g + opt.weight_decay * w
    s["m"] = opt.b1 * s.get("m", 0.0) + (1 - opt.b1) * g
    s["v"] = opt.b2 * s.get("v", 0.0) + (1 - opt.b2) * g * g
    m_hat = s["m"] / (1 - opt.b1**t)
    v_hat = s["v"] / (1 - opt.b2**t)
    denom = np.sqrt(v_hat) + opt.eps
    u = m_hat / denom
    if decoupled:
        w = w - opt.lr * opt.weight_decay * w
    return w - opt.lr * u, opt.lr * (1 + np.abs(u)) / denom


def _drift(opt: Opt, sens: np.ndarray, grad_err: list[float]) -> np.ndarray:
    if opt.kind == "momentum":  # the buffer holds every past gradient, weights momentum^age
        ages = range(len(grad_err))
        return sens * sum(opt.momentum**a * e for a, e in zip(ages, reversed(grad_err)))
    return sens * max(grad_err)  # sgd: this step's; adam: m_hat and v_hat average the past ones


def gradient_rel_error(dtype: str, b: int, d: int, f: int, layers: int) -> float:
    """Relative error of a stack's weight gradients computed in ``dtype``: the dtype's tolerance
    for the longest contraction, once per matmul on the chain from the loss to the weights."""
    return tolerance(dtype, max(b, d, f)) * (4 * layers + 2)


def weight_ulp(dtype: str) -> float:
    return machine_eps(dtype)
