"""Expert parallelism — a mixture of experts with the experts split over a mesh axis.

Seed: "Shard the experts (the FFNs) across devices — analogous to tensor parallel [...], but
you route sparse tokens instead of slicing dense matmuls. [...] heavy all-to-all dispatch."
GShard's layout (Lepikhin et al. 2020): each chip holds its own tokens and ``E/N`` experts;
a chip's tokens are one *group*, and each expert takes at most ``capacity`` tokens of it.

    In[T_Y, D] · W_r[D, E] · W_in[E_Y, D, F] · W_out[E_Y, F, D] → Out[T_Y, D]

Forward (Y = the expert axis):

    1. logits = In @ W_r → [T_Y, E]; probs = softmax       (the router, on own tokens)
    2. top_k experts per token; slots in token order up to the capacity (dropped past it)
    3. dispatch: Buf[E, S_Y, D], expert e's slots of this chip's group(s)
    4. AllToAll Y (S → E) → Buf[E_Y, S, D]: each expert gets its slots from every chip
    5. H = act(Buf @ W_in) [E_Y, S, F];  Y = H @ W_out [E_Y, S, D]
    6. AllToAll Y (E → S) → Y[E, S_Y, D]: the results go home
    7. combine: Out[t] = sum of probs[t, e] · Y[e, slot(t, e)] over t's kept experts

Backward: combine's backward (dY, and dprobs from Y), AllToAll Y, the experts' backward
(their weight gradients need no communication), AllToAll Y, dispatch's backward, softmax
backward, ``dW_r[D, E]{U_Y}`` → AllReduce Y (the router is replicated; its tokens are not).

Bytes: each AllToAll sends ``(N-1)/N`` of a chip's buffer, ``E · G · C · D · itemsize`` for
``G`` groups of ``C`` slots per expert per chip; at a balanced load with capacity factor 1
(``C = k · T_g / E``) that is ``(N-1)/N · k · T_local · D · itemsize``.

``dp_ep`` adds data parallelism over X: tokens ``[T_XY, D]``, experts ``[E_Y, ...]``
replicated over X; the expert weight gradients are ``{U_X}`` → AllReduce X, the router's
``{U_XY}`` → AllReduce over both.

Options: ``top_k`` (2), ``capacity`` (slots per expert per group; default: a group's token
count, so nothing is dropped) or ``capacity_factor`` (``C = ceil(f · k · T_g / E)``),
``groups`` (token groups in all, a multiple of the chips the tokens are split over; default
one per chip). Pass the same ``top_k``, ``capacity`` and ``groups`` to :func:`reference`.

>>> from shardsim.strategies import ep
>>> ep.layouts(ep.Ctx(axes={"expert": "Y"}))["w_in"]
'[E_Y, D, F]'
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..array import ShardedArray
from ..collectives import all_reduce, all_to_all
from ..errors import ShardingError
from ..models import reference_moe as moe
from ..ops import sum_dim
from ..pieces import blockwise
from ..xp import namespace, scatter_set
from .base import Ctx, Grads, Params, Saved, Scheme, check_dout, shape_of


def layouts(ctx: Ctx) -> dict[str, str]:
    Y = ctx.axis("expert")
    return {
        "x": f"[T_{Y}, D]",
        "router": "[D, E]",
        "w_in": f"[E_{Y}, D, F]",
        "w_out": f"[E_{Y}, F, D]",
        "out": f"[T_{Y}, D]",
    }


def dp_layouts(ctx: Ctx) -> dict[str, str]:
    X, Y = ctx.data, ctx.axis("expert")
    lay = layouts(ctx)
    return {**lay, "x": f"[T_{X}{Y}, D]", "out": f"[T_{X}{Y}, D]"}


def token_axes(ctx: Ctx) -> tuple[str, ...]:
    """The mesh axes the tokens are split over: (data,) expert (none, on one chip's worth of experts)."""
    return tuple(a for a in (ctx.axes.get("data"), ctx.axes.get("expert")) if a is not None)


def _shards(x: ShardedArray, ctx: Ctx) -> int:
    """The chips the tokens are split over (1 when no axis splits them)."""
    axes = token_axes(ctx)
    return x.mesh.axis_size(axes) if axes else 1


def _split(name: str, axes: tuple[str, ...]) -> str:
    """``T``, ``T_Y`` or ``T_{data,expert}``: a dimension split over ``axes``."""
    if not axes:
        return name
    return f"{name}_{axes[0]}" if len(axes) == 1 else f"{name}_{{{','.join(axes)}}}"


# -- the plan: top_k, groups and capacity -------------------------------------------------------
def plan(ctx: Ctx, x: ShardedArray, experts: int) -> dict[str, int]:
    """``top_k``, groups per chip, tokens per group and the capacity, from the options."""
    o = ctx.options
    k = _whole(o, "top_k", 2, 1)
    if not 1 <= k <= experts:
        raise ShardingError(f"top_k={k} must be between 1 and the number of experts {experts}")
    shards = _shards(x, ctx)
    groups = o.get("groups")
    if groups is None and shards > 1 and ("capacity" in o or "capacity_factor" in o):
        raise ShardingError(
            f"a capacity holds per group of tokens: pass groups= (a multiple of the {shards} chips the tokens "
            f"are split over, e.g. groups={shards}) and the same groups to the reference, so both drop the same tokens"
        )
    groups = _whole(o, "groups", shards, 1) if groups is not None else shards
    tokens = x.global_shape[0]
    if groups % shards or tokens % groups:
        raise ShardingError(
            f"groups={groups} must be a multiple of the {shards} token shards and divide the {tokens} tokens"
        )
    per_group = tokens // groups
    if "capacity" in o and "capacity_factor" in o:
        raise ShardingError("give capacity or capacity_factor, not both")
    if "capacity_factor" in o:
        capacity = _capacity_from_factor(o["capacity_factor"], k, per_group, experts)
    else:
        capacity = _whole(o, "capacity", per_group, 1)  # default, a group's tokens: nothing is dropped
    return {"top_k": k, "groups": groups // shards, "per_group": per_group, "capacity": capacity}


def _whole(options: Mapping[str, Any], name: str, default: int, least: int) -> int:
    """Option ``name`` as a whole number of at least ``least``, or a ShardingError naming it."""
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ShardingError(f"option {name}={value!r}: {name} is a whole number of at least {least}")
    return int(value)


def _capacity_from_factor(factor: Any, top_k: int, per_group: int, experts: int) -> int:
    """``C = ceil(f · k · T_g / E)`` slots per expert per group."""
    if isinstance(factor, bool) or not isinstance(factor, numbers.Real) or not 0 < float(factor) < math.inf:
        raise ShardingError(f"option capacity_factor={factor!r}: a capacity factor is a positive finite number")
    return math.ceil(float(factor) * top_k * per_group / experts)


# -- per-chip routing kernels (every chip's blocks at once; leading dims are the mesh) -------
def _route(probs: np.ndarray, k: int, groups: int, capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xp = namespace(probs)
    lead, (t, e) = probs.shape[:-2], probs.shape[-2:]
    p = probs.reshape(lead + (groups, t // groups, e))
    top = xp.argsort(-p, axis=-1, stable=True)[..., :k]  # ties: the lower expert first
    chose = (top[..., None] == xp.arange(e)).sum(axis=-2)  # 1 where the token chose the expert
    before = xp.cumsum(chose, axis=-2) - chose  # tokens of the group already routed to each expert
    pos = xp.take_along_axis(before, top, axis=-1)
    start = (xp.arange(groups) * capacity).reshape((groups, 1, 1))
    slot = xp.where(pos < capacity, start + pos, -1)  # -1: over capacity, dropped
    gate = xp.take_along_axis(p, top, axis=-1)
    shape = lead + (t, k)
    return top.reshape(shape), slot.reshape(shape), gate.reshape(shape)


def _flat(a: np.ndarray, lead: tuple[int, ...], tail: int) -> np.ndarray:
    """``a`` broadcast to ``lead`` and its last ``tail`` dims, the lead folded into one (every chip's)."""
    xp = namespace(a)
    return xp.broadcast_to(a, lead + a.shape[a.ndim - tail :]).reshape((-1,) + a.shape[a.ndim - tail :])


def _gather(buf: np.ndarray, experts: np.ndarray, slot: np.ndarray) -> np.ndarray:
    """``buf[e, slot]`` for every (token, k): (lead..., T, k, D); dropped pairs read slot 0."""
    xp = namespace(buf)
    lead = np.broadcast_shapes(buf.shape[:-3], experts.shape[:-2])
    b, e, s = _flat(buf, lead, 3), _flat(experts, lead, 2), _flat(xp.maximum(slot, 0), lead, 2)
    got = b[xp.arange(b.shape[0])[:, None, None], e, s]  # (chips, T, k, D)
    return got.reshape(lead + got.shape[1:])


def _scatter(rows: np.ndarray, experts: np.ndarray, slot: np.ndarray, e_all: int, s_all: int) -> np.ndarray:
    """The buffer (lead..., E, S, D) with ``rows[t, k]`` at ``[e, slot]`` of every kept pair."""
    xp = namespace(rows)
    lead = np.broadcast_shapes(rows.shape[:-3], experts.shape[:-2])
    r, e, s = _flat(rows, lead, 3), _flat(experts, lead, 2), _flat(slot, lead, 2)
    buf = xp.zeros((r.shape[0], e_all, s_all, r.shape[-1]), rows.dtype)
    chip = xp.broadcast_to(xp.arange(r.shape[0])[:, None, None], s.shape)
    buf = scatter_set(buf, (chip, e, s), r, where=s >= 0)  # each (expert, slot) is one token's: no collisions
    return buf.reshape(lead + buf.shape[1:])


# -- forward and backward -----------------------------------------------------------------------
def forward(ctx: Ctx, x: ShardedArray, params: Params) -> tuple[ShardedArray, Saved]:
    Y = ctx.axes.get("expert")  # None: every chip holds every expert (a mixture of experts without EP)
    t_all, d = x.global_shape
    e_all = params["router"].global_shape[1]
    pl = plan(ctx, x, e_all)
    k, cap, groups = pl["top_k"], pl["capacity"], pl["groups"]
    tok = _split("T", token_axes(ctx))  # "T_Y" or "T_{X,Y}"
    s_all = _shards(x, ctx) * groups * cap  # slots per expert over all chips
    logits = (x @ params["router"]).named("logits")  # 1. [T_Y, E]
    probs = blockwise(moe.softmax, [logits], (f"[{tok}, E]", (t_all, e_all), x.dtype), label="probs")
    experts, slot, gate = blockwise(  # 2. top_k and capacity, in token order per group
        lambda p: _route(p, k, groups, cap),
        [probs],
        [
            (f"[{tok}, K]", (t_all, k), "int64"),
            (f"[{tok}, K]", (t_all, k), "int64"),
            (f"[{tok}, K]", (t_all, k), x.dtype),
        ],
        label="route",
    )
    buf = blockwise(  # 3. dispatch into expert slots: Buf[E, S_Y, D]
        lambda xb, e, s: _scatter(
            namespace(xb).broadcast_to(xb[..., None, :], xb.shape[:-1] + (k, d)), e, s, e_all, groups * cap
        ),
        [x, experts, slot],
        (f"[E, {_split('S', token_axes(ctx))}, D]", (e_all, s_all, d), x.dtype),
        label="Buf",
    )
    if Y is not None:
        buf = all_to_all(buf, Y, "S", "E", label="Buf")  # 4. AllToAll Y → Buf[E_Y, S, D]
    h_pre = (buf @ params["w_in"]).named("H_pre")  # 5. H[E_Y, S, F]
    h = ctx.act(h_pre)
    y = (h @ params["w_out"]).named("Y")  # Y[E_Y, S, D]
    if Y is not None:
        y = all_to_all(y, Y, "E", "S", label="Y")  # 6. AllToAll Y → Y[E, S_Y, D]
    out = blockwise(  # 7. combine, weighted by the router's probabilities
        lambda yb, e, s, g: (_gather(yb, e, s) * (g * (s >= 0))[..., None]).sum(axis=-2),
        [y, experts, slot, gate],
        (f"[{tok}, D]", (t_all, d), x.dtype),
        label="Out",
    )
    saved = {"In": x, "probs": probs, "experts": experts, "slot": slot, "gate": gate}
    return out, {**saved, "Buf": buf, "H_pre": h_pre, "H": h, "Y": y}


def backward(ctx: Ctx, saved: Saved, dout: ShardedArray, params: Params) -> tuple[ShardedArray, Grads]:
    Y = ctx.axes.get("expert")
    x, probs, experts, slot, gate = (saved[k] for k in ("In", "probs", "experts", "slot", "gate"))
    buf, h_pre, h, y = saved["Buf"], saved["H_pre"], saved["H"], saved["Y"]
    e_all, s_local = y.global_shape[0], y.local_shape[1]
    dy, dprobs = blockwise(  # 1. combine backward: dY[e, slot] = gate · dOut[t]; dprobs = Y · dOut
        lambda db, yb, e, s, g: _combine_backward(db, yb, e, s, g, e_all, s_local),
        [dout, y, experts, slot, gate],
        [(str(y.layout), y.global_shape, dout.dtype), (str(probs.layout), probs.global_shape, dout.dtype)],
        label="dY",
    )
    if Y is not None:
        dy = all_to_all(dy, Y, "S", "E", label="dY")  # 2. AllToAll Y → dY[E_Y, S, D]
    dw_out = (h.T @ dy).named("dW_out")  # 3. dW_out[E_Y, F, D]: each expert's own slots
    dh = ctx.act_backward(dy @ params["w_out"].T, h_pre)  # dH[E_Y, S, F]
    dw_in = (buf.T @ dh).named("dW_in")  # dW_in[E_Y, D, F]
    dbuf = (dh @ params["w_in"].T).named("dBuf")
    if Y is not None:
        dbuf = all_to_all(dbuf, Y, "E", "S")  # 4. AllToAll Y → dBuf[E, S_Y, D]
    dx_experts = blockwise(  # 5. dispatch backward: each token sums its kept slots
        lambda b, e, s: (_gather(b, e, s) * (s >= 0)[..., None]).sum(axis=-2),
        [dbuf, experts, slot],
        (str(x.layout), x.global_shape, dout.dtype),
        label="dIn experts",
    )
    dlogits = (probs * (dprobs - sum_dim(probs * dprobs, "E", keepdims=True))).named("dlogits")  # 6. softmax
    dw_r = x.T @ dlogits  # 7. dW_r[D, E]{U_Y}: a sum over own tokens
    dx = (dx_experts + dlogits @ params["router"].T).named("dIn")  # 8. dIn[T_Y, D]
    grads = {"router": dw_r, "w_in": dw_in, "w_out": dw_out}
    for name, g in grads.items():  # the replicated weights: sum over the chips they are copied on
        if g.layout.partial:
            grads[name] = all_reduce(g, g.layout.partial, label="d" + name)
    return dx, grads


def _combine_backward(
    db: np.ndarray, yb: np.ndarray, e: np.ndarray, s: np.ndarray, g: np.ndarray, e_all: int, s_local: int
) -> tuple[np.ndarray, np.ndarray]:
    kept = s >= 0
    rows = db[..., None, :] * (g * kept)[..., None]  # (lead..., T, k, D)
    dy = _scatter(rows, e, s, e_all, s_local)
    dgate = (_gather(yb, e, s) * db[..., None, :]).sum(axis=-1) * kept  # (lead..., T, k)
    chosen = e[..., None] == namespace(e).arange(e_all)  # (lead..., T, k, E): a token's k experts differ
    dprobs = (dgate[..., None] * chosen).sum(axis=-2).astype(dgate.dtype)
    return dy, dprobs


# -- reference and checks ---------------------------------------------------------------------
def reference(
    params: Mapping[str, np.ndarray], x: np.ndarray, dout: np.ndarray, activation: str = "identity", **options: Any
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The MoE on one device (:mod:`shardsim.models.reference_moe`) with ``top_k``, ``capacity`` and ``groups``."""
    p = dict(params)
    groups = int(options.get("groups", 1))
    per_group = np.shape(x)[0] // groups
    k = int(options.get("top_k", 2))
    if "capacity_factor" in options:
        cap: int | None = _capacity_from_factor(options["capacity_factor"], k, per_group, np.shape(p["router"])[1])
    else:
        cap = options.get("capacity")
    return (
        moe.forward(p, x, activation, top_k=k, capacity=cap, groups=groups),
        moe.backward(p, x, dout, activation, top_k=k, capacity=cap, groups=groups),
    )


def check_shapes(params: Mapping[str, Any], x: Any, dout: Any) -> None:
    if len(shape_of(x)) != 2:
        raise ShardingError(f"x must be tokens [T, D], got shape {shape_of(x)}")
    t, d = shape_of(x)
    r = shape_of(params["router"])
    if len(r) != 2 or r[0] != d:
        raise ShardingError(f"router must be [D, E] with D = {d}, got {r}")
    e = r[1]
    w_in = shape_of(params["w_in"])
    if len(w_in) != 3 or w_in[:2] != (e, d):
        raise ShardingError(f"w_in must be [E, D, F] = [{e}, {d}, F], got {w_in}")
    if shape_of(params["w_out"]) != (e, w_in[2], d):
        raise ShardingError(f"w_out must be [E, F, D] = {(e, w_in[2], d)}, got {shape_of(params['w_out'])}")
    check_dout(dout, "[T, D]", (t, d))


SCHEMES = (
    Scheme(
        "ep",
        roles=("expert",),
        layouts=layouts,
        forward=forward,
        backward=backward,
        check_shapes=check_shapes,
        summary="mixture of experts, experts split over Y: AllToAll tokens to their experts and back",
        init=moe.init,
        reference=reference,
        options=("top_k", "groups", "capacity", "capacity_factor"),
    ),
    Scheme(
        "dp_ep",
        roles=("data", "expert"),
        layouts=dp_layouts,
        forward=forward,
        backward=backward,
        check_shapes=check_shapes,
        summary="data parallel over X x expert parallel over Y: tokens over both, experts over Y",
        init=moe.init,
        reference=reference,
        options=("top_k", "groups", "capacity", "capacity_factor"),
    ),
)
