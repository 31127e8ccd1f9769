"""Optimizers by hand: SGD with momentum, Adam and AdamW, elementwise on the blocks.

An optimizer's :meth:`update` works in place on one chip-stacked array of weights and the
matching arrays of its state (the compact blocks of sharded values, or any NumPy arrays):
every element is updated from its own gradient, so a chip holding a slice updates exactly
that slice. Which slice a chip holds is the scheme's business (``[D_X, F]`` under ZeRO),
not the optimizer's.

The arithmetic is written once, in :meth:`apply`, on the arrays' own array API namespace,
with the step's numbers (:meth:`factors`) passed in as values. It updates with augmented
assignments (``m *= b1``): in place on NumPy's mutable blocks, as ``update`` wants (no copy of
the weights or the moments), and into new arrays on immutable ones, where Python rebinds the
name: the JAX trainer runs the same lines inside its jitted step, the factors an input so
one compiled program serves every step.

>>> import numpy as np
>>> w, g = np.array([1.0, -2.0]), np.array([0.5, 0.5])
>>> opt = Adam(lr=0.1)
>>> state = opt.init_state(w)
>>> opt.update(w, g, state, step=1)  # first Adam step: lr * sign(g)
>>> w
array([ 0.9, -2.1])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import ShardingError
from ..xp import namespace
from .scaling import number

State = dict[str, np.ndarray]
Factors = tuple[Any, Any]


def _check(name: str, value: float, *, low: float, above: bool, below: float | None = None) -> None:
    """Raise unless ``value`` is a finite number ``> low`` (``above``) or ``>= low``, and ``< below``."""
    v = number(value, f"{name}")
    ok = math.isfinite(v) and (v > low if above else v >= low) and (below is None or v < below)
    if not ok:
        want = f"{'above' if above else 'at least'} {low:g}" + (f" and below {below:g}" if below is not None else "")
        raise ShardingError(f"{name} must be a finite number {want}, got {value!r}")


def check_step(step: int) -> int:
    """An optimizer step number: a whole number from 1 (Adam's bias correction divides by ``1 - b^t``).

    >>> check_step(0)
    Traceback (most recent call last):
    ...
    shardsim.errors.ShardingError: the optimizer step counts from 1, got 0: pass step=1 for the first update
    """
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)):
        raise ShardingError(f"the optimizer step is a whole number counting from 1, got {step!r}")
    if step < 1:
        raise ShardingError(f"the optimizer step counts from 1, got {step}: pass step=1 for the first update")
    return int(step)


@dataclass(frozen=True)
class SGD:
    """Stochastic gradient descent, with momentum as PyTorch writes it (no dampening).

    ``buf = momentum * buf + g``; ``w -= lr * buf``. ``weight_decay`` adds ``wd * w`` to the
    gradient (L2). With ``momentum=0`` there is no state.

    >>> import numpy as np
    >>> w = np.array([1.0]); opt = SGD(lr=0.5, momentum=0.9); s = opt.init_state(w)
    >>> opt.update(w, np.array([1.0]), s, 1); opt.update(w, np.array([1.0]), s, 2); w
    array([-0.45])
    """

    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check("SGD lr", self.lr, low=0, above=True)
        _check("SGD momentum", self.momentum, low=0, above=False)
        _check("SGD weight_decay", self.weight_decay, low=0, above=False)

    @property
    def name(self) -> str:
        """``momentum`` or ``sgd``: the key of :data:`shardsim.formulas.MOMENTS`."""
        return "momentum" if self.momentum else "sgd"

    @property
    def slots(self) -> tuple[str, ...]:
        """Names of the per-parameter state arrays."""
        return ("momentum",) if self.momentum else ()

    def init_state(self, w: np.ndarray) -> State:
        """Zero state shaped like ``w``."""
        return {k: np.zeros_like(w) for k in self.slots}

    def factors(self, step: int) -> Factors:
        """SGD's update does not depend on the step: a placeholder pair (see :meth:`Adam.factors`)."""
        check_step(step)
        return (0.0, 0.0)

    def apply(self, w: Any, g: Any, state: dict[str, Any], factors: Factors) -> tuple[Any, dict[str, Any]]:
        """The updated weights and state, on any array API arrays: in place on NumPy arrays
        (the result is the inputs, updated), new arrays on immutable ones (JAX's).

        >>> import numpy as np
        >>> w, buf = np.array([1.0]), np.array([1.0])
        >>> new_w, new_state = SGD(lr=0.5, momentum=0.9).apply(w, np.array([1.0]), {"momentum": buf}, (0, 0))
        >>> w, buf, new_w is w and new_state["momentum"] is buf  # NumPy: updated in place
        (array([0.05]), array([1.9]), True)
        """
        g = _as(g, w.dtype)
        if self.weight_decay:
            g = g + self.weight_decay * w
        if self.momentum:
            buf = state["momentum"]
            buf *= self.momentum
            buf += g
            state, g = {"momentum": buf}, buf
        w -= self.lr * g
        return w, state

    def update(self, w: np.ndarray, g: np.ndarray, state: State, step: int) -> None:
        """One step in place on ``w`` and ``state`` (``step`` counts from 1)."""
        _in_place(w, state, *self.apply(w, g, state, self.factors(step)))


@dataclass(frozen=True)
class Adam:
    """Adam (Kingma & Ba) with bias correction; ``decoupled`` weight decay makes it AdamW.

    ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g²``,
    ``w -= lr · (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``. Weight decay is L2 (added to
    ``g``) unless ``decoupled``, where ``w -= lr · wd · w`` first (Loshchilov & Hutter).

    >>> Adam().slots
    ('m', 'v')
    """

    lr: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = False
    slots: ClassVar[tuple[str, ...]] = ("m", "v")

    def __post_init__(self) -> None:
        what = "AdamW" if self.decoupled else "Adam"
        _check(f"{what} lr", self.lr, low=0, above=True)
        _check(f"{what} b1", self.b1, low=0, above=False, below=1)
        _check(f"{what} b2", self.b2, low=0, above=False, below=1)
        _check(f"{what} eps", self.eps, low=0, above=True)
        _check(f"{what} weight_decay", self.weight_decay, low=0, above=False)
        if not isinstance(self.decoupled, (bool, np.bool_)):
            raise ShardingError(f"Adam decoupled must be True or False, got {self.decoupled!r}")

    @property
    def name(self) -> str:
        return "adamw" if self.decoupled else "adam"

    def init_state(self, w: np.ndarray) -> State:
        return {k: np.zeros_like(w) for k in self.slots}

    def factors(self, step: int) -> Factors:
        """The bias corrections of step ``step`` (from 1): ``(1/sqrt(1 - b2^t), lr / (1 - b1^t))``.

        >>> [round(f, 4) for f in Adam(lr=0.1).factors(1)]  # 1/sqrt(0.001), 0.1/0.1
        [31.6228, 1.0]
        """
        step = check_step(step)
        return 1.0 / math.sqrt(1.0 - self.b2**step), self.lr / (1.0 - self.b1**step)

    def apply(self, w: Any, g: Any, state: dict[str, Any], factors: Factors) -> tuple[Any, dict[str, Any]]:
        """The updated weights and ``m``, ``v`` on any array API arrays, in place on NumPy arrays
        (see :meth:`SGD.apply`); ``factors`` are :meth:`factors` of the step.

        ``w -= lr · wd · w`` (decoupled decay) comes before the step, as Loshchilov & Hutter write it.
        """
        g = _as(g, w.dtype)
        if self.weight_decay and not self.decoupled:
            g = g + self.weight_decay * w
        m, v = state["m"], state["v"]
        m *= self.b1
        m += (1.0 - self.b1) * g
        v *= self.b2
        g2 = _as(g, v.dtype)  # g² in the moment's dtype (g + wd·w may have widened a 16-bit g)
        g2 = g2 * g2
        g2 *= 1.0 - self.b2
        v += g2
        denom = namespace(v).sqrt(v)  # sqrt(v / (1 - b2^t)) + eps
        denom *= factors[0]
        denom += self.eps
        if self.weight_decay and self.decoupled:
            w *= 1.0 - self.lr * self.weight_decay
        delta = m / denom
        delta *= factors[1]
        w -= delta
        return w, {"m": m, "v": v}

    def update(self, w: np.ndarray, g: np.ndarray, state: State, step: int) -> None:
        """One step in place on ``w``, ``m`` and ``v`` (``step`` counts from 1)."""
        _in_place(w, state, *self.apply(w, g, state, self.factors(step)))


def AdamW(  # noqa: N802 - reads as the optimizer's name
    lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.01
) -> Adam:
    """Adam with decoupled weight decay (``torch.optim.AdamW``'s defaults).

    >>> AdamW().name
    'adamw'
    """
    return Adam(lr=lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, decoupled=True)


Optimizer = SGD | Adam


def _as(g: Any, dtype: Any) -> Any:
    """``g`` in ``dtype``: a 16-bit gradient joins float32 master weights (no copy when it is already)."""
    return g if g.dtype == dtype else g.astype(dtype)


def get(name: str, lr: float | None = None, **kwargs: Any) -> Optimizer:
    """An optimizer by name: ``sgd``, ``momentum`` (SGD with momentum 0.9), ``adam``, ``adamw``.

    >>> get("momentum", lr=0.1)
    SGD(lr=0.1, momentum=0.9, weight_decay=0.0)
    >>> get("adagrad")
    Traceback (most recent call last):
    ...
    shardsim.errors.ShardingError: unknown optimizer 'adagrad'; choose one of ['sgd', 'momentum', 'adam', 'adamw']
    """
    if lr is not None:
        kwargs["lr"] = lr
    accepted = {"sgd": ("lr", "momentum", "weight_decay"), "momentum": ("lr", "momentum", "weight_decay")}
    known = accepted.get(name, ("lr", "b1", "b2", "eps", "weight_decay"))
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise ShardingError(f"optimizer {name!r} has no option(s) {unknown}; it takes {list(known)}")
    if name == "sgd":
        return SGD(**kwargs)
    if name == "momentum":
        return SGD(**{"momentum": 0.9, **kwargs})
    if name == "adam":
        return Adam(**kwargs)
    if name == "adamw":
        return AdamW(**kwargs)
    raise ShardingError(f"unknown optimizer {name!r}; choose one of ['sgd', 'momentum', 'adam', 'adamw']")


def _in_place(w: np.ndarray, state: State, new_w: np.ndarray, new_state: State) -> None:
    """Make ``w`` and ``state`` hold an :meth:`apply` result: ours updates them in place already;
    an ``apply`` of one's own may return new arrays, which are copied in."""
    for k, v in new_state.items():
        if v is not state[k]:
            np.copyto(state[k], v)
    if new_w is not w:
        np.copyto(w, new_w)
