"""Checks of a transformer's inputs against its configuration: parameters, tokens, targets.

Each failure names the culprit (the weight, the token and its position) and the fix.

>>> import numpy as np
>>> from shardsim.models import get
>>> cfg = get("gpt-tiny")
>>> params = {k: np.zeros(s) for k, s in cfg.param_shapes().items()}
>>> tokens, targets = check_inputs(cfg, params, [[1, 2, 3]], [[2, 3, 4]])
>>> tokens.shape, targets.dtype.kind
((1, 3), 'i')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ArgumentTypeError, ConfigError, DtypeError, ShapeError
from .config import TransformerConfig


def check_params(cfg: TransformerConfig, params: Mapping[str, Any]) -> None:
    """Raise :class:`ShapeError` unless ``params`` has exactly the weights of ``cfg``, shaped as listed.

    >>> from shardsim.models import get
    >>> check_params(get("gpt-tiny"), {"embed": np.zeros((64, 32))})
    Traceback (most recent call last):
    ...
    shardsim.errors.ShapeError: params do not match the config gpt-tiny: missing ['pos_embed', ...
    """
    if not isinstance(params, Mapping):
        raise ArgumentTypeError(
            f"params is a mapping of weight names to arrays, got {type(params).__name__}; build it with "
            "shardsim.models.reference.init(cfg) or from cfg.param_shapes()"
        )
    shapes = cfg.param_shapes()
    missing = [k for k in shapes if k not in params]
    extra = [k for k in params if k not in shapes]
    if missing or extra:
        raise ShapeError(
            f"params do not match the config {cfg.name or 'TransformerConfig'}: missing {missing[:4]}, unexpected "
            f"{extra[:4]}; build them with shardsim.models.reference.init(cfg) or from cfg.param_shapes()"
        )
    for name, shape in shapes.items():
        got, dtype = _shape_and_dtype(params[name], name)
        if got != shape:
            raise ShapeError(
                f"param {name!r} has shape {got}, but the config {cfg.name or 'TransformerConfig'} needs {shape}; "
                f"build params with shardsim.models.reference.init(cfg) or from cfg.param_shapes()"
            )
        if dtype.kind != "f" and dtype.name != "bfloat16":
            raise DtypeError(
                f"param {name!r} has dtype {dtype}; weights are floating point: convert it, e.g. "
                f"params[{name!r}].astype('float32'), or build params with reference.init(cfg, dtype=...)"
            )


def _shape_and_dtype(value: Any, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """A weight's shape and dtype: an array's, a ShapeDtype's or a ShardedArray's, read without copying.

    Anything else (a nested list, a scalar) is refused rather than converted: every reader of
    params (the reference, the trainer's placement, a checkpoint) takes arrays.
    """
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return tuple(value.shape), np.dtype(value.dtype)
    raise ArgumentTypeError(
        f"param {name!r} is a {type(value).__name__}, not an array; pass np.asarray(...) of it, or build params "
        "with shardsim.models.reference.init(cfg)"
    )


def _check_ids(cfg: TransformerConfig, ids: Any, what: str) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 2 or arr.dtype.kind not in "iu":
        raise ShapeError(f"{what} must be an integer array [B, S], got dtype {arr.dtype} and shape {arr.shape}")
    if arr.shape[1] > cfg.seq:
        raise ConfigError(
            f"{what} have sequence length {arr.shape[1]}, longer than the config's seq={cfg.seq}; "
            f"pass at most {cfg.seq} tokens per row or use cfg.scaled(seq={arr.shape[1]})"
        )
    bad = (arr < 0) | (arr >= cfg.vocab)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ConfigError(
            f"{what}{list(where)} = {int(arr[where])} is outside the vocabulary [0, {cfg.vocab}) "
            f"({int(bad.sum())} of {arr.size} out of range); map them into range or use cfg.scaled(vocab=...)"
        )
    return arr


def check_inputs(
    cfg: TransformerConfig, params: Mapping[str, Any], tokens: Any, targets: Any = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """``tokens`` (and ``targets``) as int arrays ``[B, S]``, after checking them and ``params`` against ``cfg``.

    >>> from shardsim.models import get
    >>> cfg = get("gpt-tiny")
    >>> check_inputs(cfg, {k: np.zeros(s) for k, s in cfg.param_shapes().items()}, [[1, 2, 99]])
    Traceback (most recent call last):
    ...
    shardsim.errors.ConfigError: tokens[0, 2] = 99 is outside the vocabulary [0, 64) (1 of 3 out of range); ...
    """
    check_params(cfg, params)
    tok = _check_ids(cfg, tokens, "tokens")
    if targets is None:
        return tok, None
    tgt = _check_ids(cfg, targets, "targets")
    if tgt.shape != tok.shape:
        raise ShapeError(f"targets have shape {tgt.shape} but tokens {tok.shape}; give one target per token")
    return tok, tgt
