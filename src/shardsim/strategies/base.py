"""What a scheme is: its mesh-axis roles, its layouts, and its forward and backward steps.

A scheme module defines ``layouts(ctx)`` (the layout of ``x``, ``out`` and of every
parameter), ``forward(ctx, x, params)`` and ``backward(ctx, saved, dout, params)`` as the
numbered steps of the seed, and one
:class:`Scheme` tying them together. The plumbing that shards inputs, runs both passes
and gathers results lives in :mod:`shardsim.strategies.runner`, not in the scheme modules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..activations import get as get_activation
from ..array import ShapeDtype, ShardedArray
from ..errors import MeshAxisError, ModelInputError, ShardingError
from ..models import reference_mlp as mlp
from ..ops import activation, activation_grad, multiply

ROLE_DEFAULTS = {"data": "X", "model": "Y", "pipe": "Z", "expert": "Y"}  # expert: like TP, on the fast axis

Params = dict[str, ShardedArray]
Saved = dict[str, ShardedArray]
Grads = dict[str, ShardedArray]


@dataclass(frozen=True)
class Ctx:
    """What a scheme's steps need besides the values: its axes by role, the activation, options.

    ``ctx.data`` / ``ctx.model`` are the mesh axis names playing the data-parallel and
    model-parallel roles (``"X"`` and ``"Y"`` by default); ``ctx.axis(role)`` for any role.
    ``options`` carries a scheme's own settings (e.g. a pipeline's number of microbatches).

    >>> Ctx(axes={"data": "X"}).data
    'X'
    """

    axes: Mapping[str, str] = field(default_factory=lambda: dict(ROLE_DEFAULTS))
    activation: str = "identity"
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def data(self) -> str:
        return self.axis("data")

    @property
    def model(self) -> str:
        return self.axis("model")

    def axis(self, role: str) -> str:
        """The mesh axis playing ``role``."""
        try:
            return self.axes[role]
        except KeyError:
            raise MeshAxisError(f"no mesh axis plays the role {role!r}; roles given: {dict(self.axes)}") from None

    def act(self, h_pre: ShardedArray) -> ShardedArray:
        """``act(H_pre)``; the identity returns its input (nothing new to store)."""
        if self.activation == "identity":
            return h_pre
        return activation(h_pre, self.activation, label="H")

    def act_backward(self, dh: ShardedArray, h_pre: ShardedArray) -> ShardedArray:
        """``dH * act'(H_pre)``; the identity passes ``dH`` through."""
        if self.activation == "identity":
            return dh.named("dH")
        return multiply(dh, activation_grad(h_pre, self.activation), label="dH")

    def check(self) -> Ctx:
        get_activation(self.activation)
        return self


@dataclass(frozen=True)
class Scheme:
    """One sharding scheme: name, roles of its mesh axes, layouts and the two passes.

    ``options`` names the settings its steps read from ``ctx.options`` (the command line
    refuses any other ``--option``).
    """

    name: str
    roles: tuple[str, ...]
    layouts: Callable[[Ctx], dict[str, str]]
    forward: Callable[[Ctx, ShardedArray, Params], tuple[ShardedArray, Saved]]
    backward: Callable[[Ctx, Saved, ShardedArray, Params], tuple[ShardedArray, Grads]]
    summary: str
    check_shapes: Callable[[Mapping[str, Any], Any, Any], None] | None = None
    init: Callable[..., dict[str, np.ndarray]] = mlp.init
    reference: Callable[..., tuple[np.ndarray, dict[str, np.ndarray]]] = None  # type: ignore[assignment]
    options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.reference is None:
            object.__setattr__(self, "reference", mlp_reference)
        # every caller (run_strategy, the Trainer, the JAX engine) checks inputs through check_shapes:
        # the token count is checked there, once for all schemes, before the scheme's own shapes
        object.__setattr__(self, "check_shapes", _with_tokens(self.name, self.check_shapes))


def shape_of(v: Any) -> tuple[int, ...]:
    """The global shape of an array or a :class:`~shardsim.ShapeDtype` (what ``check_shapes`` reads)."""
    return tuple(v.shape) if isinstance(v, ShapeDtype) else np.shape(v)


def _with_tokens(
    scheme: str, check: Callable[[Mapping[str, Any], Any, Any], None] | None
) -> Callable[[Mapping[str, Any], Any, Any], None]:
    """``check`` preceded by :func:`check_tokens`; a scheme copied under a new name (``dataclasses.replace``)
    rewraps the scheme's own check, so the message names the copy."""
    check = getattr(check, "scheme_check", check)

    def checked(params: Mapping[str, Any], x: Any, dout: Any) -> None:
        check_tokens(scheme, x)
        if check is not None:
            check(params, x, dout)

    checked.scheme_check = check  # type: ignore[attr-defined]
    return checked


def check_tokens(scheme: str, x: Any) -> None:
    """Refuse an input without tokens: a step over an empty batch has no mean loss, and its
    per-chip batch (for a pipeline's microbatches, an expert's capacity) is zero.

    >>> check_tokens("ddp", np.ones((8, 4)))  # passes; (0, 4) raises ModelInputError
    """
    shape = shape_of(x)
    if len(shape) >= 1 and shape[0] == 0:
        example = (8,) + tuple(shape[1:])
        raise ModelInputError(
            f"{scheme}: x has 0 tokens (shape {tuple(shape)}); a step needs a batch of at least one token "
            f"per data-parallel chip, e.g. x of shape {example}"
        )


def check_dout(dout: Any, dims: str, want: tuple[int, ...]) -> None:
    """Raise unless ``dout`` has the output's shape ``want`` (``dims`` names it, e.g. ``[B, D]``)."""
    if shape_of(dout) != want:
        raise ShardingError(f"dout must have the output's shape {dims} = {want}, got {shape_of(dout)}")


def check_mlp_shapes(params: Mapping[str, Any], x: Any, dout: Any) -> None:
    b, d = (shape_of(x) + (None, None))[:2] if len(shape_of(x)) == 2 else (None, None)
    if b is None:
        raise ShardingError(f"x must be [B, D] (2-D), got shape {shape_of(x)}")
    w_in, w_out = shape_of(params["w_in"]), shape_of(params["w_out"])
    if len(w_in) != 2 or w_in[0] != d:
        raise ShardingError(f"W_in must be [D, F] with D = {d} (x is [B, D] = {shape_of(x)}), got shape {w_in}")
    if w_out != (w_in[1], d):
        raise ShardingError(f"W_out must be [F, D] = {(w_in[1], d)} to match W_in {w_in}, got shape {w_out}")
    check_dout(dout, "[B, D]", (b, d))


def mlp_reference(
    params: Mapping[str, np.ndarray], x: np.ndarray, dout: np.ndarray, activation: str = "identity", **options: Any
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The single-device answer an MLP scheme is held to: ``(out, {"x", "w_in", "w_out"})``."""
    p = dict(params)
    return mlp.forward(p, x, activation), mlp.backward(p, x, dout, activation)
