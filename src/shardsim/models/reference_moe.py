"""The single-device reference for a mixture-of-experts MLP, written token by token.

``E`` expert MLPs ``W_in[E, D, F]``, ``W_out[E, F, D]`` and a router ``W_r[D, E]``
(Shazeer et al. 2017; GShard, Lepikhin et al. 2020):

    probs = softmax(x @ W_r)                     each token's top_k experts by probability
    capacity: the tokens are cut into ``groups`` equal groups (one per chip when sharded);
              in each group an expert takes at most ``capacity`` tokens, in token order,
              and drops the rest (Megatron-LM's ``drop_policy="position"``)
    out[t] = sum over kept (t, e) of probs[t, e] * expert_e(x[t])

Backward, by hand: ``d expert_e(x[t]) = probs[t, e] * dout[t]``; ``dprobs[t, e]`` is
``expert_e(x[t]) · dout[t]`` for kept pairs; the softmax gives
``dlogits = probs * (dprobs - sum_e probs * dprobs)``. The top-k choice is piecewise
constant: no gradient flows through it. The tests hold this to finite differences.

>>> import numpy as np
>>> p = init(d_model=4, d_ff=8, experts=4, seed=0)
>>> x = np.random.default_rng(1).standard_normal((6, 4))
>>> r = route(p, x, top_k=1, capacity=1, groups=2)  # one slot per expert per group of 3 tokens
>>> r["experts"][:, 0], r["kept"][:, 0]  # expert 2 takes token 0; tokens 1 and 2 are dropped
(array([2, 2, 2, 1, 0, 3]), array([ True, False, False,  True,  True,  True]))
>>> sorted(backward(p, x, np.ones((6, 4)), top_k=2))
['router', 'w_in', 'w_out', 'x']
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..activations import get as get_activation
from ..dtypes import resolve_dtype
from ..xp import namespace

Params = dict[str, np.ndarray]


def init(d_model: int, d_ff: int, seed: int = 0, dtype: Any = "float32", experts: int = 4) -> Params:
    """``{"router": [D, E], "w_in": [E, D, F], "w_out": [E, F, D]}`` drawn N(0, 1/fan_in)."""
    rng = np.random.default_rng(seed)
    dt = resolve_dtype(dtype)
    return {
        "router": (rng.standard_normal((d_model, experts)) / np.sqrt(d_model)).astype(dt),
        "w_in": (rng.standard_normal((experts, d_model, d_ff)) / np.sqrt(d_model)).astype(dt),
        "w_out": (rng.standard_normal((experts, d_ff, d_model)) / np.sqrt(d_ff)).astype(dt),
    }


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last dimension, shifted by the max so ``exp`` cannot overflow."""
    z = namespace(logits).exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def route(
    params: Params, x: np.ndarray, top_k: int = 2, capacity: int | None = None, groups: int = 1
) -> dict[str, np.ndarray]:
    """Which (token, expert) pairs are kept: ``{"probs" [T, E], "experts" [T, k], "kept" [T, k]}``.

    ``capacity`` is per expert per group of ``T/groups`` tokens; None keeps every token.
    """
    probs = softmax(x @ params["router"])
    t_all, e_all = probs.shape
    per_group = t_all // groups
    experts = np.zeros((t_all, top_k), np.int64)
    kept = np.zeros((t_all, top_k), bool)
    for g in range(groups):
        taken = [0] * e_all  # tokens each expert has taken in this group so far
        for t in range(g * per_group, (g + 1) * per_group):
            order = np.argsort(-probs[t], kind="stable").tolist()  # ties: lower expert first
            for k, e in enumerate(order[:top_k]):
                experts[t, k] = e
                if capacity is None or taken[e] < capacity:
                    taken[e] += 1
                    kept[t, k] = True
    return {"probs": probs, "experts": experts, "kept": kept}


def _expert(params: Params, e: int, xt: np.ndarray, activation: str) -> tuple[np.ndarray, np.ndarray]:
    h_pre = xt @ params["w_in"][e]
    return h_pre, get_activation(activation).fn(h_pre) @ params["w_out"][e]


def forward(
    params: Params,
    x: np.ndarray,
    activation: str = "identity",
    top_k: int = 2,
    capacity: int | None = None,
    groups: int = 1,
) -> np.ndarray:
    """``out[t] = sum over kept experts e of probs[t, e] * expert_e(x[t])``."""
    r = route(params, x, top_k, capacity, groups)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(top_k):
            if r["kept"][t, k]:
                e = int(r["experts"][t, k])
                out[t] += r["probs"][t, e] * _expert(params, e, x[t], activation)[1]
    return out


def backward(
    params: Params,
    x: np.ndarray,
    dout: np.ndarray,
    activation: str = "identity",
    top_k: int = 2,
    capacity: int | None = None,
    groups: int = 1,
) -> Params:
    """Gradients ``{"x", "router", "w_in", "w_out"}`` for the output cotangent ``dout``."""
    act = get_activation(activation)
    r = route(params, x, top_k, capacity, groups)
    probs = r["probs"]
    grads = {k: np.zeros_like(v) for k, v in params.items()}
    dx = np.zeros_like(x)
    dprobs = np.zeros_like(probs)
    for t in range(x.shape[0]):
        for k in range(top_k):
            if not r["kept"][t, k]:
                continue
            e = int(r["experts"][t, k])
            h_pre, y = _expert(params, e, x[t], activation)
            dprobs[t, e] = y @ dout[t]
            dy = probs[t, e] * dout[t]  # the expert's output cotangent
            grads["w_out"][e] += np.outer(act.fn(h_pre), dy)
            dh_pre = (dy @ params["w_out"][e].T) * act.grad(h_pre)
            grads["w_in"][e] += np.outer(x[t], dh_pre)
            dx[t] += dh_pre @ params["w_in"][e].T
    dlogits = probs * (dprobs - (probs * dprobs).sum(axis=-1, keepdims=True))  # softmax backward
    grads["router"] = x.T @ dlogits
    grads["x"] = dx + dlogits @ params["router"].T
    return grads
