"""The transformer's local (per-chip, communication-free) pieces, on every chip's block at once.

Reshapes between ``[B, S, NH]`` and heads ``[B, S, N, H]``, GQA's repeat of the KV heads,
the causal softmax (in float32), RoPE, SiLU, the vocabulary-parallel embedding lookup and
the cross-entropy's per-chip parts. Each chip's vocabulary rows are ``V/t`` consecutive
ones, as Megatron's ``VocabParallelEmbedding`` splits them. Built on
:func:`shardsim.pieces.blockwise` and the ops; none of them sends a byte.

>>> import numpy as np, shardsim
>>> mesh = shardsim.Mesh(model=2)
>>> q = shardsim.shard(np.zeros((1, 3, 8)), mesh, "[B, S, NH_model]")
>>> split_heads(q, 2).layout
Layout('[B, S, N_{model}, H]')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import engines
from ..array import ShapeDtype, ShardedArray, shard
from ..layout import Dim, Layout
from ..models import reference
from ..ops import map_blocks
from ..pieces import blockwise
from ..xp import causal, namespace, scatter_add


def dim(name: str, *axes: str | None) -> str:
    """``D``, ``D_model`` or ``D_{model,data}``: a dimension split over the axes given (None skipped).

    >>> dim("B", "data"), dim("D", None), dim("F", "model", "data")
    ('B_data', 'D', 'F_{model,data}')
    """
    used = [a for a in axes if a]
    if not used:
        return name
    return f"{name}_{used[0]}" if len(used) == 1 else f"{name}_{{{','.join(used)}}}"


def scalar(value: float, like: ShardedArray) -> np.ndarray:
    """``value`` as a 0-d array of ``like``'s dtype: a Python float would promote bfloat16 to float32."""
    return np.asarray(value, like.dtype)


def _view(x: ShardedArray, layout: Layout, shape: tuple[int, ...], data: np.ndarray | None) -> ShardedArray:
    """A reshape of ``x``: the same chips' buffers (the ledger counts them once)."""
    return ShardedArray(x.mesh, layout, shape, x.dtype, data, label=x.label, category=x.category, view_of=x)


def _nm(x: ShardedArray) -> int:
    return len(x.mesh.shape)


def split_heads(x: ShardedArray, heads: int) -> ShardedArray:
    """``[B, S, NH] -> [B, S, N, H]`` (``KH -> K``): columns ``n*H:(n+1)*H`` are head ``n`` (a view).

    The heads dimension keeps the columns' split, so a chip's whole heads stay its own."""
    d = x.layout.dims[-1]
    h = x.global_shape[-1] // heads
    layout = Layout(x.layout.dims[:-1] + (Dim(d.name[0], d.axes), Dim("H")))
    data = None if x.is_shape_only else x.compact().reshape(x.compact().shape[:-1] + (-1, h))
    return _view(x, layout, x.global_shape[:-1] + (heads, h), data)


def merge_heads(x: ShardedArray, name: str = "NH") -> ShardedArray:
    """``[B, S, N, H] -> [B, S, NH]`` (the inverse of :func:`split_heads`)."""
    layout = Layout(x.layout.dims[:-2] + (Dim(name, x.layout.dims[-2].axes),))
    data = None if x.is_shape_only else x.compact().reshape(x.compact().shape[:-2] + (-1,))
    return _view(x, layout, x.global_shape[:-2] + (x.global_shape[-2] * x.global_shape[-1],), data)


def flat_tokens(x: ShardedArray) -> ShardedArray:
    """``[B, S, X] -> [T, X]`` with ``T = B*S`` split over the axes of B and S.

    With S split (context parallelism) a chip's rows are not a contiguous block of the
    global token order; the result is only ever contracted over T (a sum over tokens), which
    does not depend on the order."""
    b, s = x.layout.dims[:2]
    layout = Layout((Dim("T", b.axes + s.axes), x.layout.dims[2]), x.layout.partial)
    data = None if x.is_shape_only else x.compact().reshape(x.compact().shape[: _nm(x)] + (-1, x.local_shape[-1]))
    return _view(x, layout, (x.global_shape[0] * x.global_shape[1], x.global_shape[2]), data)


def unflat_tokens(t: ShardedArray, like: ShardedArray) -> ShardedArray:
    """``[T, X] -> [B, S, X]`` as ``like`` is laid out: the inverse of :func:`flat_tokens`
    (a view; each chip's tokens are its rows of B, every position of S)."""
    b, s = like.layout.dims[:2]
    layout = Layout((b, s, t.layout.dims[1]), t.layout.partial)
    data = None if t.is_shape_only else t.compact().reshape(t.compact().shape[: _nm(t)] + like.local_shape[:2] + (-1,))
    return _view(t, layout, like.global_shape[:2] + (t.global_shape[1],), data)


def heads_first(x: ShardedArray) -> ShardedArray:
    """``[B, S, N, H] <-> [B, N, S, H]`` (a transpose: a view)."""
    return x.transpose(0, 2, 1, 3)


def repeat_kv(k: ShardedArray, groups: int) -> ShardedArray:
    """``[B, K, S, H] -> [B, N, S, H]``: query head ``n`` reads kv head ``n // groups`` (GQA)."""
    d = k.layout.dims[1]
    layout = Layout((k.layout.dims[0], Dim("N", d.axes), *k.layout.dims[2:]))
    if groups == 1:
        return _view(k, layout, k.global_shape, None if k.is_shape_only else k.compact())
    shape = (k.global_shape[0], k.global_shape[1] * groups, *k.global_shape[2:])
    nm = _nm(k)
    return blockwise(
        lambda a: namespace(a).repeat(a, groups, axis=nm + 1), [k], (layout, shape, k.dtype), label=k.label
    )


def fold_kv(dk: ShardedArray, groups: int) -> ShardedArray:
    """``[B, N, S, H] -> [B, K, S, H]``: each kv head's gradient sums over its group's query heads."""
    d, nm = dk.layout.dims[1], _nm(dk)
    layout = Layout((dk.layout.dims[0], Dim("K", d.axes), *dk.layout.dims[2:]))
    if groups == 1:
        return _view(dk, layout, dk.global_shape, None if dk.is_shape_only else dk.compact())
    shape = (dk.global_shape[0], dk.global_shape[1] // groups, *dk.global_shape[2:])

    def fold(a: np.ndarray) -> np.ndarray:
        return a.reshape(a.shape[: nm + 1] + (-1, groups) + a.shape[nm + 2 :]).sum(nm + 2)

    return blockwise(fold, [dk], (layout, shape, dk.dtype), label=dk.label)


def expand_kv(w: ShardedArray, copies: int, model: str) -> ShardedArray:
    """Megatron's KV replication when the model axis has more chips than there are KV heads:
    ``[..., KH]`` (the same on every chip) -> ``[..., (tH)_model]``, chip j keeping the columns of
    KV head ``j // copies`` (no communication: every chip holds all of them)."""
    nm, t = _nm(w), w.mesh.axis_size(model)
    h = w.global_shape[-1] * copies // t
    dims = w.layout.dims[:-1] + (Dim("KH", (model,)),)
    chip = _chips(w, model)

    def fn(a: np.ndarray) -> np.ndarray:
        heads = a.reshape(a.shape[:-1] + (-1, h))  # (..., K, H)
        head = (chip // copies).reshape(chip.shape + (1,) * (heads.ndim - nm))  # chip j's head j // copies
        return namespace(a).take_along_axis(heads, head, axis=-2)[..., 0, :]

    shape = w.global_shape[:-1] + (t * h,)
    return blockwise(fn, [w], (Layout(dims), shape, w.dtype), label=w.label)


def place_kv(d: ShardedArray, copies: int, model: str, kv_heads: int) -> ShardedArray:
    """The inverse map for gradients: ``[B, S, (tH)_model] -> [B, S, KH]{U_model}``, chip j's
    block in the columns of KV head ``j // copies`` and zeros elsewhere; the sum over the
    chips adds each head's copies."""
    nm, t = _nm(d), d.mesh.axis_size(model)
    h = d.global_shape[-1] // t
    chip = _chips(d, model)

    def fn(a: np.ndarray) -> np.ndarray:
        xp = namespace(a)
        owner = (chip // copies)[..., None] == xp.arange(kv_heads)  # mesh dims + (K,)
        sel = owner.reshape(chip.shape + (1,) * (a.ndim - nm - 1) + (kv_heads, 1))
        return (a[..., None, :] * sel).reshape(a.shape[:-1] + (kv_heads * h,))

    layout = f"[{d.layout.dims[0]}, {d.layout.dims[1]}, KH]{{U_{model}}}"
    shape = d.global_shape[:-1] + (kv_heads * h,)
    return blockwise(fn, [d], (layout, shape, d.dtype), label=d.label)


def _float(a: np.ndarray) -> np.ndarray:
    """Softmax and cross-entropy arithmetic in float32 (float64 stays float64)."""
    return a.astype(np.float64 if a.dtype == np.float64 else np.float32)


def causal_softmax(scores: ShardedArray, scale: float) -> ShardedArray:
    """``softmax(scores * scale)`` over the keys, key position <= query position, in float32."""

    def fn(s: np.ndarray) -> np.ndarray:
        xp = namespace(s)
        z = xp.where(causal(s.shape[-1], xp), _float(s) * scale, -np.inf)
        e = xp.exp(z - z.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)).astype(s.dtype)

    return blockwise(fn, [scores], (scores.layout, scores.global_shape, scores.dtype), label="P")


def softmax_backward(probs: ShardedArray, dprobs: ShardedArray, scale: float) -> ShardedArray:
    """``dScores = scale * P * (dP - sum(dP * P))`` over the keys."""

    def fn(p: np.ndarray, dp: np.ndarray) -> np.ndarray:
        pf, dpf = _float(p), _float(dp)
        return (scale * pf * (dpf - (dpf * pf).sum(-1, keepdims=True))).astype(dp.dtype)

    return blockwise(fn, [probs, dprobs], (dprobs.layout, dprobs.global_shape, dprobs.dtype), label="dScores")


def rope(
    x: ShardedArray, theta: float, *, inverse: bool = False, positions: ShardedArray | None = None
) -> ShardedArray:
    """RoPE on ``[B, S, N, H]``; ``inverse`` rotates back (its backward).

    ``positions`` (context parallelism): the int ``[S_context]`` global position of each row,
    so each chip rotates its rows by their real positions; None: the whole sequence in order."""
    sign = -1 if inverse else 1
    if positions is None or x.is_shape_only:
        pos = np.arange(x.global_shape[1]) * sign
        return map_blocks(x, lambda a: reference.rope(a, pos, theta).astype(a.dtype), "rope", label=x.label)
    nm = _nm(x)

    def fn(a: np.ndarray, p: np.ndarray) -> np.ndarray:
        return per_chip(lambda ab, pb: reference.rope(ab, pb * sign, theta).astype(ab.dtype), a, p, nm=nm)

    return blockwise(fn, [x, positions], (x.layout, x.global_shape, x.dtype), label=x.label)


def silu(x: ShardedArray) -> ShardedArray:
    """``x * sigmoid(x)``."""
    return map_blocks(x, lambda a: (a / (1.0 + namespace(a).exp(-a))).astype(a.dtype), "silu", label="silu(gate)")


def silu_grad(x: ShardedArray) -> ShardedArray:
    """``d silu / dx = s (1 + x (1 - s))`` with ``s = sigmoid(x)``."""

    def fn(a: np.ndarray) -> np.ndarray:
        s = 1.0 / (1.0 + namespace(a).exp(-a))
        return (s * (1.0 + a * (1.0 - s))).astype(a.dtype)

    return map_blocks(x, fn, "silu'")


# -- vocabulary-parallel pieces: chip j of the model axis owns rows j*V/t .. (j+1)*V/t ----------
def _chips(x: ShardedArray, axis: str) -> Any:
    """Each chip's index along ``axis``, shaped to broadcast against compact blocks (mesh dims first)."""
    return engines.active().chip_index(_nm(x), x.mesh.axis_index(axis), axis, x.mesh.axis_size(axis))


def _offsets(x: ShardedArray, model: str | None, rows: int) -> Any:
    """Each chip's first vocabulary row, shaped to broadcast against compact blocks (mesh dims first)."""
    if model is None:
        return np.zeros([1] * _nm(x), np.int64)
    return _chips(x, model) * rows


def per_chip(fn: Callable[..., np.ndarray], *arrays: np.ndarray, nm: int) -> np.ndarray:
    """``fn`` once per chip's blocks (for row gathers and scatters NumPy cannot broadcast): the
    first ``nm`` dimensions of ``arrays`` are the mesh's, broadcast against each other.

    >>> import numpy as np
    >>> per_chip(lambda a: a[::-1], np.arange(6).reshape(2, 3), nm=1)
    array([[2, 1, 0],
           [5, 4, 3]])
    """
    lead = np.broadcast_shapes(*(a.shape[:nm] for a in arrays))
    if all(n == 1 for n in lead):  # one chip's blocks (or one for all): no loop, any namespace
        out = fn(*(a.reshape(a.shape[nm:]) for a in arrays))
        return out.reshape(lead + out.shape)
    full = [np.broadcast_to(a, lead + a.shape[nm:]) for a in arrays]
    first = fn(*(a[(0,) * nm] for a in full))
    out = np.empty(lead + first.shape, first.dtype)
    for idx in np.ndindex(*lead):
        out[idx] = fn(*(a[idx] for a in full))
    return out


def embed_lookup(embed: ShardedArray, tokens: ShardedArray, model: str | None) -> ShardedArray:
    """``embed[tokens]`` from each chip's rows, zero where a token is another chip's: ``[B, S, D]{U_model}``."""
    v_local, nm = embed.local_shape[0], _nm(embed)
    off = _offsets(embed, model, v_local)
    b, s = tokens.layout.dims
    layout = f"[{b}, {s}, {embed.layout.dims[1]}]" + (f"{{U_{model}}}" if model else "")
    shape = tokens.global_shape + (embed.global_shape[1],)

    def fn(e: np.ndarray, t: np.ndarray) -> np.ndarray:
        local = t - off.reshape(off.shape + (1,) * (t.ndim - nm))
        mine = (local >= 0) & (local < v_local)

        def rows(eb: np.ndarray, lb: np.ndarray, mb: np.ndarray) -> np.ndarray:
            xp = namespace(eb)
            return xp.where(mb[..., None], eb[xp.where(mb, lb, 0)], 0).astype(eb.dtype)

        return per_chip(rows, e, local, mine, nm=nm)

    return blockwise(fn, [embed, tokens], (layout, shape, embed.dtype), label="Embedded")


def embed_scatter(
    dx: ShardedArray, tokens: ShardedArray, vocab: int, model: str | None, data: tuple[str, ...]
) -> ShardedArray:
    """``dEmbed[V_model, D]``: each chip adds the rows of ``dx[B, S, D]`` into its own vocabulary rows.

    A sum over the chip's tokens: partial over the axes splitting them (``data``)."""
    nm = _nm(dx)
    rows = vocab // (dx.mesh.axis_size(model) if model else 1)
    off = _offsets(dx, model, rows)
    layout = f"[{dim('V', model)}, D]" + ("{" + ", ".join(f"U_{a}" for a in data) + "}" if data else "")

    def fn(d: np.ndarray, t: np.ndarray) -> np.ndarray:
        local = t - off.reshape(off.shape + (1,) * (t.ndim - nm))

        def add(db: np.ndarray, lb: np.ndarray) -> np.ndarray:
            out = namespace(db).zeros((rows, db.shape[-1]), db.dtype)
            return scatter_add(out, lb, db, where=(lb >= 0) & (lb < rows))

        return per_chip(add, d, local, nm=nm)

    return blockwise(fn, [dx, tokens], (layout, (vocab, dx.global_shape[-1]), dx.dtype), label="dEmbed")


def vocab_max(logits: ShardedArray, model: str | None) -> ShardedArray:
    """Each chip's largest logit per token, ``[B, S, P_model]`` (P: one entry per vocabulary part)."""
    b, s, _ = logits.layout.dims
    parts = logits.mesh.axis_size(model) if model else 1
    layout = f"[{b}, {s}, {dim('P', model)}]"
    shape = logits.global_shape[:2] + (parts,)
    return blockwise(lambda a: a.max(-1, keepdims=True), [logits], (layout, shape, logits.dtype), label="max")


def largest(parts: ShardedArray) -> ShardedArray:
    """The max over the gathered parts ``[B, S, P] -> [B, S, 1]`` (broadcasts against the logits)."""
    b, s, _ = parts.layout.dims
    shape = parts.global_shape[:2] + (1,)
    return blockwise(lambda a: a.max(-1, keepdims=True), [parts], (f"[{b}, {s}, V]", shape, parts.dtype), label="max")


def target_logit(logits: ShardedArray, targets: ShardedArray, model: str | None) -> ShardedArray:
    """``logits[target]`` on the chip owning the target's row, 0 elsewhere: ``[B, S]{U_model}``."""
    v_local, nm = logits.local_shape[-1], _nm(logits)
    off = _offsets(logits, model, v_local)
    b, s, _ = logits.layout.dims
    layout = f"[{b}, {s}]" + (f"{{U_{model}}}" if model else "")

    def fn(lg: np.ndarray, t: np.ndarray) -> np.ndarray:
        local = t - off.reshape(off.shape + (1,) * (t.ndim - nm))
        mine = (local >= 0) & (local < v_local)
        xp = namespace(lg)
        lb = xp.broadcast_to(lg, np.broadcast_shapes(lg.shape[:nm], t.shape[:nm]) + lg.shape[nm:])
        picked = xp.take_along_axis(lb, xp.where(mine, local, 0)[..., None], -1)[..., 0]
        return xp.where(mine, picked, 0).astype(lg.dtype)

    return blockwise(fn, [logits, targets], (layout, targets.global_shape, logits.dtype), label="target logit")


def minus_onehot(probs: ShardedArray, targets: ShardedArray, model: str | None, scale: float) -> ShardedArray:
    """``(softmax - onehot(target)) * scale``, each chip on its vocabulary rows: dLogits."""
    v_local, nm = probs.local_shape[-1], _nm(probs)
    off = _offsets(probs, model, v_local)

    def fn(p: np.ndarray, t: np.ndarray) -> np.ndarray:
        local = t - off.reshape(off.shape + (1,) * (t.ndim - nm))
        hit = local[..., None] == namespace(p).arange(v_local)
        return ((p - hit) * scale).astype(p.dtype)

    return blockwise(fn, [probs, targets], (probs.layout, probs.global_shape, probs.dtype), label="dLogits")


def scatter_to(x: ShardedArray, index: int, axis: str) -> ShardedArray:
    """Keep each chip's part of dimension ``index`` along ``axis`` (no communication: it holds all of it)."""
    nm, n, pos = _nm(x), x.mesh.axis_size(axis), x.mesh.axis_index(axis)
    dims = list(x.layout.dims)
    dims[index] = Dim(dims[index].name, dims[index].axes + (axis,))

    def fn(a: np.ndarray) -> np.ndarray:
        return engines.active().local_slice(a, nm, [pos], (axis,), [n], index)

    return blockwise(fn, [x], (Layout(tuple(dims)), x.global_shape, x.dtype), label=x.label)


def rows(x: ShardedArray, n: int, total: int | None = None) -> ShardedArray:
    """The first ``n`` rows of dimension 0 (``total``: pad with zero rows up to ``total`` instead)."""
    nm = _nm(x)

    def fn(a: np.ndarray) -> np.ndarray:
        if total is None:
            return a[(slice(None),) * nm + (slice(0, n),)]
        pad = [(0, 0)] * a.ndim
        pad[nm] = (0, total - a.shape[nm])
        return namespace(a).pad(a, pad)

    shape = ((total if total is not None else n),) + x.global_shape[1:]
    return blockwise(fn, [x], (x.layout, shape, x.dtype), label=x.label)


def keep_mask(
    seed: int, layer: int, site: str, p: float, like: ShardedArray, layout: str, shape: tuple[int, ...]
) -> Any:
    """Dropout site ``site``'s global mask (the reference's draw), laid out as the value it drops."""
    mask = ShapeDtype(shape, bool) if like.is_shape_only else reference.dropout_mask(seed, layer, site, shape, p)
    return shard(mask, like.mesh, layout, label=f"mask {site}")
