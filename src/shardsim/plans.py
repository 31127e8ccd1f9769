"""A Plan: the one description of how a model is parallelised, named as Megatron-LM names it.

Degrees: ``dp`` (data parallel), ``tp`` (tensor parallel), ``pp`` (pipeline stages), ``ep``
(expert parallel), ``cp`` (context parallel); ``zero`` is the ZeRO stage over the data axis
(0 plain DDP, 1 optimizer state, 2 + gradients, 3 + weights = FSDP); ``sp`` turns on
Megatron sequence parallelism inside the tensor-parallel group; ``schedule``,
``microbatches`` and ``virtual_stages`` describe the pipeline (the zero-bubble schedules
``zb-h1`` and ``zb-h2`` split each backward into the input's gradient and a later pass
for the weights'); ``cp_method`` is the context-parallel
attention (``ring`` or ``all_gather``) and ``cp_balanced`` its causal load balancing (the
zigzag order of :func:`shardsim.strategies.context.balanced_order`; False: contiguous blocks); ``attention`` is
the attention kernel without context parallelism (``flash``, the default: FlashAttention's
online softmax over 128-row tiles, only the output and its log-sum-exp kept, as every current
framework runs it; ``standard``: the ``[B, N, S, S]`` scores and probabilities in memory, as
Megatron-LM ran it before FlashAttention, which the published runs of 2021 state explicitly;
context-parallel attention is always flash); ``recompute`` is the
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
>>> Plan().attention, str(Plan(attention="standard"))  # a plan text without attention= means flash
('flash', 'attention=standard')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .dtypes import PRECISION_DTYPES as PRECISIONS
from .errors import MeshAxisError, PlanError
from .mesh import Mesh

ROLES = ("data", "pipe", "context", "expert", "model")  # mesh order: the tensor-parallel axis innermost
DEGREE = {"data": "dp", "pipe": "pp", "context": "cp", "expert": "ep", "model": "tp"}
_AXIS_NAMES_SEEN: set[str] = set()  # axis names a Mesh has accepted: plans are built by the thousand
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2")
ZERO_BUBBLE = ("zb-h1", "zb-h2")  # the schedules that split the backward into B and a later W
CP_METHODS = ("ring", "all_gather")
ATTENTION = ("standard", "flash")
RECOMPUTE = ("none", "selective", "full")


def _word(field: str, value: Any, words: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in words:
        raise PlanError(f"Plan.{field}={value!r}: choose one of {list(words)}")


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
    attention: str = "flash"
    recompute: str = "none"
    precision: str | None = None
    data_axis: str = "data"
    model_axis: str = "model"
    pipe_axis: str = "pipe"
    expert_axis: str = "expert"
    context_axis: str = "context"

    def __post_init__(self) -> None:
        self._check_axis_names()
        for f in ("dp", "tp", "pp", "ep", "cp", "microbatches", "virtual_stages"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlanError(f"Plan.{f} must be a whole number >= 1, got {v!r}")
        if isinstance(self.zero, bool) or not isinstance(self.zero, int) or self.zero not in (0, 1, 2, 3):
            raise PlanError(f"Plan.zero is the ZeRO stage 0, 1, 2 or 3 (3 = FSDP), got {self.zero!r}")
        for f, words in (("schedule", SCHEDULES), ("cp_method", CP_METHODS), ("attention", ATTENTION)):
            _word(f, getattr(self, f), words)
        _word("recompute", self.recompute, RECOMPUTE)
        if self.precision is not None:
            _word("precision", self.precision, tuple(sorted(PRECISIONS)))
        if not isinstance(self.sp, bool):
            raise PlanError(f"Plan.sp is True (sequence parallelism on) or False, got {self.sp!r}")
        if not isinstance(self.cp_balanced, bool):
            raise PlanError(f"Plan.cp_balanced is True (zigzag chunks) or False (contiguous), got {self.cp_balanced!r}")
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

    def _check_axis_names(self) -> None:
        """Each ``*_axis`` is a name a :class:`Mesh` accepts, so ``plan.mesh()`` and ``str(plan)`` work."""
        for role in ROLES:
            name = getattr(self, f"{role}_axis")
            if isinstance(name, str) and name in _AXIS_NAMES_SEEN:
                continue
            try:
                Mesh({name: 1})  # the mesh's own rule for axis names
            except (MeshAxisError, TypeError) as e:
                raise PlanError(f"Plan.{role}_axis={name!r}: {e}") from None
            _AXIS_NAMES_SEEN.add(name)

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
        if not isinstance(text, str):
            raise PlanError(f"Plan.parse takes a plan string such as 'dp=4,tp=2', got {type(text).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        fsdp = None  # the fsdp=N item, which means dp=N,zero=3
        for item in (s.strip() for s in text.split(",")):
            if not item:
                continue
            key, sep, value = (s.strip() for s in item.partition("="))
            if key == "fsdp":
                if not sep:
                    raise PlanError("plan key 'fsdp' needs the data-parallel degree, e.g. fsdp=4 (dp=4,zero=3)")
                key, fsdp = "dp", item
            if key not in fields:
                raise PlanError(f"unknown plan key {key!r} in {text!r}; keys are {[*fields, 'fsdp']}")
            if key in values:
                also = f" ({fsdp} sets dp)" if key == "dp" and fsdp else ""
                raise PlanError(f"plan key {key!r} given twice in {text!r}{also}; give it once")
            values[key] = _parse_value(key, sep, value, str(fields[key].type))
        if fsdp is not None:
            if values.get("zero", 3) != 3:
                raise PlanError(
                    f"{fsdp} means dp={values['dp']},zero=3 (FSDP), but {text!r} also sets zero={values['zero']}; "
                    f"write {fsdp} alone, or dp={values['dp']},zero={values['zero']}"
                )
            values["zero"] = 3
        return cls(**values)

    def __repr__(self) -> str:
        return f"Plan.parse({str(self)!r})"

    def replace(self, **changes: Any) -> Plan:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def _parse_value(key: str, sep: str, value: str, kind: str) -> Any:
    """``value`` of plan key ``key`` (``sep`` empty: the key alone, a flag) as the field's type."""
    if not sep:
        if "bool" not in kind:
            raise PlanError(f"plan key {key!r} needs a value, e.g. {key}=2")
        return True
    if "int" in kind:
        try:
            return int(value)
        except ValueError:
            raise PlanError(f"plan key {key!r} needs a whole number, got {value!r}") from None
    if "bool" in kind:
        if value.lower() not in ("true", "false", "1", "0"):
            raise PlanError(f"plan key {key!r} is on or off (write {key} or {key}=false), got {value!r}")
        return value.lower() in ("true", "1")
    return value
