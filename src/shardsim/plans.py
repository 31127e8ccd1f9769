"""A Plan: the one description of how a model is parallelised, named as Megatron-LM names it.

Degrees: ``dp`` (data parallel), ``tp`` (tensor parallel), ``pp`` (pipeline stages), ``ep``
(expert parallel), ``cp`` (context parallel); ``zero`` is the ZeRO stage over the data axis
(0 plain DDP, 1 optimizer state, 2 + gradients, 3 + weights = FSDP); ``sp`` turns on
Megatron sequence parallelism inside the tensor-parallel group; ``schedule``,
``microbatches`` and ``virtual_stages`` describe the pipeline; ``cp_method`` is the context-parallel
attention (``ring`` or ``all_gather``) and ``cp_balanced`` its causal load balancing (the
zigzag order of :func:`shardsim.context.balanced_order`; False: contiguous blocks); ``attention`` is
the attention kernel without context parallelism (``standard``: the ``[B, N, S, S]`` scores and
probabilities in memory, as Megatron-LM ran it before FlashAttention; ``flash``: FlashAttention's
online softmax over 128-row tiles, only the output and its log-sum-exp kept; context-parallel
attention is always the latter); ``recompute`` is the
activation recomputation policy of Korthikanti et al. 2022 (``none``, ``selective``,
``full``); ``precision`` names a :class:`~shardsim.training.precision.Precision` (None: the
weights' own dtype). Each parallelism runs over its own mesh axis (``data``, ``model``,
``pipe``, ``expert``, ``context`` unless renamed).

>>> plan = Plan.parse("dp=4,tp=2,sp,zero=1,recompute=selective")
>>> str(plan)
'dp=4,zero=1,tp=2,sp,recompute=selective'
>>> Plan.parse(str(plan)) == plan
True
>>> plan.mesh()
Mesh(data=4, model=2)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import MeshAxisError, PlanError
from .mesh import Mesh
from .training.precision import _NAMES as PRECISIONS

ROLES = ("data", "pipe", "context", "expert", "model")  # mesh order: the tensor-parallel axis innermost
DEGREE = {"data": "dp", "pipe": "pp", "context": "cp", "expert": "ep", "model": "tp"}
SCHEDULES = ("gpipe", "1f1b", "interleaved")
CP_METHODS = ("ring", "all_gather")
ATTENTION = ("standard", "flash")
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Plan:
    """How a model is parallelised; see the module docstring for the fields.

    >>> Plan(dp=2, zero=3).axes()["data"]
    'data'
    """

    dp: int = 1
    zero: int = 0
    tp: int = 1
    sp: bool = False
    pp: int = 1
    schedule: str = "1f1b"
    microbatches: int = 1
    virtual_stages: int = 1
    ep: int = 1
    cp: int = 1
    cp_method: str = "ring"
    cp_balanced: bool = True
    attention: str = "standard"
    recompute: str = "none"
    precision: str | None = None
    data_axis: str = "data"
    model_axis: str = "model"
    pipe_axis: str = "pipe"
    expert_axis: str = "expert"
    context_axis: str = "context"

    def __post_init__(self) -> None:
        for f in ("dp", "tp", "pp", "ep", "cp", "microbatches", "virtual_stages"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlanError(f"Plan.{f} must be a whole number >= 1, got {v!r}")
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise PlanError(f"Plan.zero is the ZeRO stage 0, 1, 2 or 3 (3 = FSDP), got {self.zero!r}")
        if self.schedule not in SCHEDULES:
            raise PlanError(f"Plan.schedule={self.schedule!r}: choose one of {list(SCHEDULES)}")
        if self.cp_method not in CP_METHODS:
            raise PlanError(f"Plan.cp_method={self.cp_method!r}: choose one of {list(CP_METHODS)}")
        if not isinstance(self.cp_balanced, bool):
            raise PlanError(f"Plan.cp_balanced is True (zigzag chunks) or False (contiguous), got {self.cp_balanced!r}")
        if self.attention not in ATTENTION:
            raise PlanError(f"Plan.attention={self.attention!r}: choose one of {list(ATTENTION)}")
        if self.recompute not in RECOMPUTE:
            raise PlanError(f"Plan.recompute={self.recompute!r}: choose one of {list(RECOMPUTE)}")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise PlanError(f"Plan.precision={self.precision!r}: choose one of {sorted(PRECISIONS)}")
        if self.sp and self.tp == 1:
            raise PlanError("Plan.sp: sequence parallelism splits the tensor-parallel group's tokens; set tp > 1")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise PlanError(f"Plan.virtual_stages={self.virtual_stages} needs schedule='interleaved'")
        seen: dict[str, str] = {}
        for role in ROLES:
            axis = self.axes()[role]
            if self.degree(role) > 1:
                if axis in seen:
                    raise PlanError(
                        f"Plan: {DEGREE[seen[axis]]}={self.degree(seen[axis])} and {DEGREE[role]}={self.degree(role)} "
                        f"both run over mesh axis {axis!r}; give each parallelism its own axis "
                        f"({role}_axis=...)"
                    )
                seen[axis] = role

    # -- roles and degrees ------------------------------------------------------------------
    def axes(self) -> dict[str, str]:
        """The mesh axis of every parallelism: ``{"data": "data", "model": "model", ...}``."""
        return {role: getattr(self, f"{role}_axis") for role in ROLES}

    def degree(self, role: str) -> int:
        """How many chips ``role`` (data, model, pipe, expert, context) spans."""
        return int(getattr(self, DEGREE[role]))

    def axis(self, role: str) -> str | None:
        """The mesh axis of ``role`` if that parallelism is on (degree > 1), else None."""
        return self.axes()[role] if self.degree(role) > 1 else None

    @property
    def chips(self) -> int:
        """The number of chips the plan needs."""
        n = 1
        for role in ROLES:
            n *= self.degree(role)
        return n

    def mesh(self) -> Mesh:
        """The mesh this plan runs on: one axis per parallelism of degree > 1 (TP innermost)."""
        sizes = {self.axes()[r]: self.degree(r) for r in ROLES if self.degree(r) > 1}
        return Mesh(sizes or {self.data_axis: 1})

    def check(self, mesh: Mesh) -> None:
        """Raise :class:`PlanError` unless ``mesh`` has an axis of the right size for every parallelism."""
        used = set()
        for role in ROLES:
            axis, n = self.axes()[role], self.degree(role)
            if n == 1:
                if axis in mesh.axis_names and mesh.axis_size(axis) != 1 and axis not in used:
                    raise PlanError(
                        f"mesh {mesh} has axis {axis!r} of size {mesh.axis_size(axis)}, but plan {self} "
                        f"sets {DEGREE[role]}=1 on it; set {DEGREE[role]}={mesh.axis_size(axis)} or use "
                        f"plan.mesh() = {self.mesh()}"
                    )
                continue
            if axis not in mesh.axis_names:
                raise PlanError(
                    f"plan {self} runs {DEGREE[role]}={n} over mesh axis {axis!r}, which {mesh} does not have; "
                    f"use plan.mesh() = {self.mesh()} or set {role}_axis to one of {list(mesh.axis_names)}"
                )
            if mesh.axis_size(axis) != n:
                raise PlanError(
                    f"plan {self} sets {DEGREE[role]}={n} but mesh axis {axis!r} of {mesh} has "
                    f"{mesh.axis_size(axis)} chips; make them equal"
                )
            used.add(axis)
        idle = [a for a in mesh.axis_names if a not in used and mesh.axis_size(a) > 1]
        if idle:
            raise PlanError(f"mesh {mesh} axis {idle} plays no part in plan {self}; give it a parallelism or size 1")

    # -- text -------------------------------------------------------------------------------
    def __str__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v == f.default:
                continue
            parts.append(f.name if v is True else f"{f.name}={v}")
        return ",".join(parts) or "dp=1"

    @classmethod
    def parse(cls, text: str) -> Plan:
        """``"dp=4,tp=2,sp,zero=1,recompute=selective"`` (``fsdp=4`` means ``dp=4,zero=3``).

        >>> Plan.parse("fsdp=2, tp=2")
        Plan.parse('dp=2,zero=3,tp=2')
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for item in (s.strip() for s in text.split(",")):
            if not item:
                continue
            key, sep, value = (s.strip() for s in item.partition("="))
            if key == "fsdp" and sep:
                values.setdefault("zero", 3)
                key = "dp"
            if key not in fields:
                raise PlanError(f"unknown plan key {key!r} in {text!r}; keys are {[*fields, 'fsdp']}")
            if key in values and not (key == "zero" and values[key] == 3 and "dp" in values):
                raise PlanError(f"plan key {key!r} given twice in {text!r}")
            kind = fields[key].type
            if not sep:
                if "bool" not in str(kind):
                    raise PlanError(f"plan key {key!r} needs a value, e.g. {key}=2")
                values[key] = True
            elif "int" in str(kind):
                try:
                    values[key] = int(value)
                except ValueError:
                    raise PlanError(f"plan key {key!r} needs a whole number, got {value!r}") from None
            elif "bool" in str(kind):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise PlanError(f"plan key {key!r} is on or off (write {key} or {key}=false), got {value!r}")
                values[key] = value.lower() in ("true", "1")
            else:
                if key.endswith("_axis") and not value.isalnum():
                    raise MeshAxisError(f"mesh axis name {value!r} for {key} must be letters and digits")
                values[key] = value
        return cls(**values)

    def __repr__(self) -> str:
        return f"Plan.parse({str(self)!r})"

    def replace(self, **changes: Any) -> Plan:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
