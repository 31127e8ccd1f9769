"""Which mesh axis each role of a plan runs on, and the layouts that follow: activations and weights.

Activations are ``[B, S, D]`` with B split over the data axis; under context parallelism S is
split over the context axis everywhere, and under sequence parallelism also over the model
axis outside the tensor-parallel regions (``S_{context,model}``). A weight is split over the
model axis as Megatron splits it (column-parallel ``wq, wk, wv, w_in, w_gate, w_up,
lm_head``, row-parallel ``wo, w_out, w_down``, vocabulary-parallel ``embed``) and, under
ZeRO-3 / FSDP, its ``D`` dimension (or its only one) also over the data axis.

>>> from shardsim.plans import Plan
>>> r = Roles.of(Plan(dp=2, tp=2, sp=True, zero=3))
>>> r.act(), r.weight_layout("layers.0.attn.wq"), r.weight_layout("layers.0.attn.bq")
('[B_data, S_model, D]', '[D_data, NH_model]', '[NH_{model,data}]')
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plans import ZERO_BUBBLE, Plan
from .local import dim

# dimension names of every weight (by the last part of its key) and which one the model axis splits
_WEIGHT_DIMS = {
    "embed": (("V", "D"), 0),
    "pos_embed": (("S", "D"), None),
    "lm_head": (("D", "V"), 1),
    "gamma": (("D",), None),
    "beta": (("D",), None),
    "wq": (("D", "NH"), 1),
    "wk": (("D", "KH"), 1),
    "wv": (("D", "KH"), 1),
    "wo": (("NH", "D"), 0),
    "bq": (("NH",), 0),
    "bk": (("KH",), 0),
    "bv": (("KH",), 0),
    "bo": (("D",), None),
    "w_in": (("D", "F"), 1),
    "w_gate": (("D", "F"), 1),
    "w_up": (("D", "F"), 1),
    "w_out": (("F", "D"), 0),
    "w_down": (("F", "D"), 0),
    "b_in": (("F",), 0),
    "b_out": (("D",), None),
    "b_gate": (("F",), 0),
    "b_up": (("F",), 0),
    "b_down": (("D",), None),
}
_KV = ("wk", "wv", "bk", "bv")
_MOE_DIMS = {"router": ("D", "E"), "w_in": ("E", "D", "F"), "w_out": ("E", "F", "D")}  # a mixture of experts


@dataclass(frozen=True)
class Roles:
    """The axes a run uses: ``data`` / ``model`` (None when that degree is 1), ``sp``, ``zero``, ``recompute``."""

    data: str | None
    model: str | None
    sp: bool
    zero: int
    recompute: str
    kv_copies: int = 1  # chips per KV head when the model axis has more chips than KV heads
    context: str | None = None
    cp_method: str = "ring"
    expert: str | None = None  # expert parallelism: splits the experts, and the batch outside them
    attention: str = "standard"  # the kernel without a context axis: "standard" or "flash"
    split_backward: bool = False  # a zero-bubble schedule: the weights' gradients in a later W pass

    @classmethod
    def of(cls, plan: Plan, kv_heads: int | None = None) -> Roles:
        copies = plan.tp // kv_heads if kv_heads is not None and kv_heads < plan.tp else 1
        fused = plan.cp > 1 or plan.attention == "flash"
        # selective recomputation drops the attention scores, which FlashAttention never keeps
        recompute = "none" if fused and plan.recompute == "selective" else plan.recompute
        return cls(
            plan.axis("data"),
            plan.axis("model"),
            plan.sp,
            plan.zero,
            recompute,
            copies,
            plan.axis("context"),
            plan.cp_method,
            plan.axis("expert"),
            plan.attention,
            plan.schedule in ZERO_BUBBLE,
        )

    @property
    def batch(self) -> tuple[str, ...]:
        """The axes splitting B: the data axis and, outside the experts, the expert axis
        (GShard's layout: attention is data parallel over the expert axis too)."""
        return tuple(a for a in (self.data, self.expert) if a is not None)

    @property
    def fused(self) -> bool:
        """Attention runs FlashAttention's loop (always under context parallelism): no scores kept."""
        return self.context is not None or self.attention == "flash"

    @property
    def seq(self) -> str | None:
        """The model axis when it splits S outside the tensor-parallel regions (sequence parallelism), or None."""
        return self.model if self.sp else None

    @property
    def fsdp(self) -> bool:
        return self.zero == 3 and self.data is not None

    def act(self, last: str = "D") -> str:
        """The residual stream's layout: ``[B_data, S, D]``, ``[B_data, S_model, D]`` under SP."""
        return f"[{dim('B', *self.batch)}, {dim('S', self.context, self.seq)}, {last}]"

    def full(self, last: str = "D") -> str:
        """A tensor-parallel region's layout: the whole sequence (the context block under CP), ``last`` as given."""
        return f"[{dim('B', *self.batch)}, {dim('S', self.context)}, {last}]"

    def weight_dims(self, name: str, *, sharded: bool) -> tuple[str, ...]:
        short = name.rsplit(".", 1)[-1]
        if ".moe." in name:  # the router is replicated; the experts are split over the expert axis
            moe_dims = _MOE_DIMS[short]
            split_e = [[self.expert if n == "E" and short != "router" else None] for n in moe_dims]
            if sharded:  # ZeRO-1's optimizer state: D over the data axis too
                split_e[moe_dims.index("D")].append(self.data)
            return tuple(dim(n, *a) for n, a in zip(moe_dims, split_e))
        names, split = _WEIGHT_DIMS[short]
        if self.kv_copies > 1 and short in _KV:
            split = None  # replicated on every chip; each takes its head's columns (local.expand_kv)
        out = [[self.model if i == split else None] for i in range(len(names))]
        if sharded:  # ZeRO-3: D (or the only dimension) also over the data axis, minor
            target = names.index("D") if "D" in names else 0
            out[target] = out[target] + [self.data]
        return tuple(dim(n, *a) for n, a in zip(names, out))

    def weight_layout(self, name: str) -> str:
        """The layout a weight is stored in (its FSDP shard under ZeRO-3)."""
        return "[" + ", ".join(self.weight_dims(name, sharded=self.fsdp)) + "]"

    def use_layout(self, name: str) -> str:
        """The layout a weight is used in (gathered over the data axis)."""
        return "[" + ", ".join(self.weight_dims(name, sharded=False)) + "]"

    def grad_layout(self, name: str) -> str:
        """The layout a gradient ends in: split over the data axis for ZeRO-2 and ZeRO-3."""
        sharded = self.zero >= 2 and self.data is not None
        return "[" + ", ".join(self.weight_dims(name, sharded=sharded)) + "]"

    def shard_dim(self, name: str) -> int:
        """The dimension ZeRO-2/3 split over the data axis."""
        names = _WEIGHT_DIMS[name.rsplit(".", 1)[-1]][0]
        return names.index("D") if "D" in names else 0
