"""Estimate one training step of a scheme on a hardware: time, MFU, memory, what binds it.

The estimate runs the scheme's own program shape-only at the real sizes
(:func:`~shardsim.cost.program.scheme_program`), costs every event (roofline for matmuls,
the book's formulas for collectives) and schedules them on a time line
(:mod:`shardsim.cost.timeline`).

``bound`` follows the book's test, phase by phase: a phase whose collectives on some mesh
axis take longer than its matmul FLOPs (T_comms > T_math) makes the step
``"communication"``-bound (the forward pass decides for FSDP and TP, the backward pass for
DP); otherwise it is ``"memory"``-bound if the matmuls' HBM traffic outlasts their FLOPs
(the single-chip roofline), else ``"compute"``-bound. :func:`~shardsim.cost.critical_batch`
finds the batch where the first test flips.

``efficiency="calibrated"`` (the default) times matmuls and collectives at the chip's
measured rates (:mod:`~shardsim.cost.efficiency`), ``"ideal"`` at the book's; the summary
says which. ``topology`` gives a TPU slice shape (several mesh axes may share a hardware
axis, :func:`~shardsim.cost.place`); ``pad=True`` pads ``d_model``/``d_ff`` that do not
divide the mesh up to a multiple of its chips, as FSDP pads its flat parameters.

``memory`` is each chip's peak by category (``params``, ``grads``, ``optimizer``,
``activations``, ``total``) as the ledger measures it over the same shape-only training step
:class:`~shardsim.training.Trainer` runs: ``optimizer`` (Adam by default) and ``precision``
(by default ``dtype``'s policy: bf16 weights with float32 master weights and moments) decide
the optimizer state. ``fits`` compares ``total`` with the chip's HBM; ``shortfall`` and
``largest()`` say by how much and why when it does not. ``model_state`` is the
``params``, ``grads`` and ``optimizer`` bytes live between the backward pass and the update
(the moment the ZeRO paper's per-device figures describe), without the gathered weights and
unreduced gradients the peaks include.

>>> from shardsim import Mesh
>>> est = estimate("fsdp", Mesh(X=16), "tpu-v5p", batch=16 * 4096, d_model=8192, d_ff=32768, efficiency="ideal")
>>> est.bound, round(est.mfu, 2), est.per_chip_batch
('compute', 0.91, 4096.0)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..dtypes import resolve_dtype
from ..errors import ArgumentTypeError, DivisibilityError, ShardsimError
from ..mesh import Mesh
from ..models import TransformerConfig
from ..plans import Plan
from .efficiency import IDEAL, Efficiency, resolve_efficiency
from .hardware import Hardware, Torus
from .placement import AxisLink, place
from .presets import get_hardware
from .program import Program, scheme_program, training_memory
from .timeline import Timeline, build_timeline


@dataclass
class Estimate:
    """One step's estimate. Times in seconds, memory in bytes per chip.

    ``comm_s`` sums every collective; ``comm_exposed_s`` is the part the step waits for,
    ``comm_hidden_s`` the part hidden under compute (or under other collectives).
    ``phases`` gives compute and comm seconds per phase; ``breakdown()`` the per-collective
    or per-layer rows; ``timeline`` the bars (``.text()``, ``.plot()``). ``efficiency`` is
    the mode it was timed in; ``padding`` maps a padded size to (given, padded).
    """

    scheme: str
    hardware: Hardware
    mesh: Mesh
    batch: int
    d_model: int
    d_ff: int
    layers: int
    dtype: str
    timeline: Timeline
    memory: dict[str, int]
    phases: dict[str, dict[str, float]]
    efficiency: Efficiency = IDEAL
    padding: dict[str, tuple[int, int]] = field(default_factory=dict)
    memory_source: str = "the forward and backward passes only, no optimizer state"
    model_state: dict[str, int] = field(default_factory=dict)

    @property
    def chips(self) -> int:
        return self.mesh.size

    @property
    def per_chip_batch(self) -> float:
        """Tokens per chip, B / N (the x-axis of the book's rooflines)."""
        return self.batch / self.chips

    @property
    def step_s(self) -> float:
        return self.timeline.step_s

    @property
    def compute_s(self) -> float:
        return self.timeline.compute_s

    @property
    def comm_s(self) -> float:
        return self.timeline.comm_s

    @property
    def comm_exposed_s(self) -> float:
        return self.timeline.comm_exposed_s

    @property
    def comm_hidden_s(self) -> float:
        return self.timeline.comm_hidden_s

    @property
    def model_flops(self) -> float:
        """The MLP's FLOPs per step over all chips: 12 B D F per layer (forward 4, backward 8)."""
        return 12.0 * self.batch * self.d_model * self.d_ff * self.layers

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOPs / (chips x step time x peak FLOP/s)."""
        if self.step_s <= 0:
            return 0.0
        return self.model_flops / (self.chips * self.step_s * self.hardware.flops(self.dtype))

    @property
    def bound(self) -> str:
        """``"communication"``, ``"memory"`` or ``"compute"``: what limits the step (module doc)."""
        if comm_excess(self.phases) > 0:
            return "communication"
        memory = sum(p["memory"] for p in self.phases.values())
        flops = sum(p["flops"] for p in self.phases.values())
        return "memory" if memory > flops else "compute"

    @property
    def fits(self) -> bool:
        """Whether the per-chip peak memory fits the chip's HBM."""
        return self.memory.get("total", 0) <= self.hardware.hbm_capacity

    @property
    def shortfall(self) -> int:
        """Bytes per chip beyond the chip's HBM (0 when it fits)."""
        return max(0, int(self.memory.get("total", 0) - self.hardware.hbm_capacity))

    def largest(self, n: int = 3) -> list[tuple[str, int]]:
        """The ``n`` categories holding the most bytes at their peak, largest first.

        >>> from shardsim import Mesh
        >>> estimate("ddp", Mesh(X=8), "h100", 8 * 1024, 1024, 4096).largest(1)
        [('optimizer', 100663296)]
        """
        rows = [(c, b) for c, b in self.memory.items() if c != "total"]
        return sorted(rows, key=lambda cb: -cb[1])[:n]

    def memory_line(self) -> str:
        """Whether the step fits the chip and by how much it does not; then, on a second line,
        the bytes by category and the training step they were measured over."""
        mem, cap = _gb(self.memory.get("total", 0)), _gb(self.hardware.hbm_capacity)
        if self.fits:
            head = f"memory {mem} GB per chip of {cap} GB"
            rows = self.largest(len(self.memory))
        else:
            head = f"memory does not fit: needs {mem} GB of {cap} GB ({_gb(self.shortfall)} GB short)"
            rows = self.largest()
        parts = ", ".join(f"{c} {_gb(b)} GB" for c, b in rows)
        return f"{head}\n{'largest' if not self.fits else 'by category'}: {parts}; over {self.memory_source}"

    def breakdown(self, by: str = "collective") -> list[dict[str, Any]]:
        """Rows of seconds: ``by="collective"`` per (phase, op, axes, label) summed over layers,
        ``by="layer"`` per (layer, phase), ``by="event"`` every bar (:mod:`~shardsim.cost.breakdown`)."""
        from . import breakdown

        tables = {"collective": breakdown.by_collective, "layer": breakdown.by_layer, "event": breakdown.by_event}
        if by not in tables:
            raise ValueError(f"breakdown by {by!r}: use 'collective', 'layer' or 'event'")
        return tables[by](self.timeline)

    def bound_reason(self) -> str:
        """The numbers :attr:`bound` decides on, in words: the phase and mesh axis whose
        collectives come closest to (or past) its matmuls' FLOPs time, or the HBM time.

        >>> from shardsim import Mesh
        >>> estimate("fsdp", Mesh(X=8), "h100", 8 * 4096, 8192, 32768).bound_reason()  # doctest: +ELLIPSIS
        'forward comm X ... ms <= FLOPs ... ms in the worst phase and axis'
        """
        terms = excess_terms(self.phases)
        if self.bound == "memory" or not terms:
            memory = sum(p["memory"] for p in self.phases.values())
            flops = sum(p["flops"] for p in self.phases.values())
            sign = ">" if memory > flops else "<="
            return f"matmul HBM traffic {_ms(memory)} ms {sign} FLOPs {_ms(flops)} ms"
        (phase, link), excess = max(terms.items(), key=lambda kv: kv[1])
        flops = self.phases[phase]["flops"]
        sign = ">" if excess > 0 else "<="
        return f"{phase} {link} {_ms(excess + flops)} ms {sign} FLOPs {_ms(flops)} ms in the worst phase and axis"

    def summary(self) -> str:
        """A few lines: step, compute, comm (under compute / behind other comm / exposed), MFU,
        what bounds the step and the numbers that say so, memory."""
        parts = self.timeline.comm_parts()
        comm = ", ".join(f"{k} {_ms(v)}" for k, v in parts.items() if v or k != "behind other comm")
        return "\n".join(
            [
                f"{self.scheme} on {self.mesh} ({self.hardware.name}), B={self.batch} tokens "
                f"({self.per_chip_batch:g}/chip), D={self.d_model}, F={self.d_ff}, {self.layers} layer(s)",
                f"step {_ms(self.step_s)} ms: compute {_ms(self.compute_s)} ms, comm {_ms(self.comm_s)} ms ({comm})",
                f"MFU {self.mfu:.1%}, {self.bound}-bound: {self.bound_reason()}",
                self.memory_line(),
                self.efficiency.describe(),
                *(
                    f"padded {k} {a} -> {b} (a multiple of the {self.chips} chips, as FSDP pads its parameters)"
                    for k, (a, b) in self.padding.items()
                ),
            ]
        )

    def figures(self) -> list[tuple[str, str]]:
        """The summary's headline figures as (quantity, value) pairs, worded as :meth:`summary`
        prints them: the rows of the notebook table.

        >>> from shardsim import Mesh
        >>> e = estimate("ddp", Mesh(X=8), "h100", 8 * 4096, 8192, 32768)
        >>> [q for q, _ in e.figures()][:3], all(v.split()[0] in e.summary() for _, v in e.figures())
        (['step', 'compute', 'comm'], True)
        """
        parts = self.timeline.comm_parts()
        return [
            ("step", f"{_ms(self.step_s)} ms"),
            ("compute", f"{_ms(self.compute_s)} ms"),
            ("comm", f"{_ms(self.comm_s)} ms"),
            *((f"comm {k}", f"{_ms(v)} ms") for k, v in parts.items() if v or k != "behind other comm"),
            ("MFU", f"{self.mfu:.1%}"),
            ("bound", f"{self.bound}-bound"),
            ("memory per chip", f"{_gb(self.memory.get('total', 0))} GB"),
            ("HBM per chip", f"{_gb(self.hardware.hbm_capacity)} GB"),
        ]

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        from .._format import table_html

        caption = self.summary().splitlines()[0]
        return table_html([("quantity", "value"), *self.figures()], right={1}, caption=caption)


def estimate(
    scheme: str | TransformerConfig,
    mesh: Mesh | Mapping[str, int] | Plan | str,
    hardware: Hardware | str,
    batch: int | None = None,
    d_model: int | None = None,
    d_ff: int | None = None,
    layers: int = 1,
    overlap: bool = True,
    dtype: str = "bfloat16",
    *,
    links: Mapping[str, str | AxisLink] | None = None,
    axes: Mapping[str, str] | None = None,
    activation: str = "identity",
    prefetch: int = 1,
    topology: str | Sequence[int] | None = None,
    efficiency: str | Efficiency = "calibrated",
    pad: bool = False,
    optimizer: str = "adam",
    precision: str | None = None,
    batch_tokens: int | str | None = None,
    seq: int | None = None,
    chips: int | None = None,
) -> Estimate:
    """Estimate one training step of ``scheme`` with a global batch of ``batch`` tokens, or of a
    transformer under a plan: ``estimate(model, plan, hardware, batch_tokens=..., seq=...)``.

    The first argument decides: a registered scheme name (``"fsdp"``...) is the MLP of the
    seeds on ``mesh`` with ``d_model``, ``d_ff`` and ``layers``; a
    :class:`~shardsim.models.TransformerConfig` or a model preset name (``"llama3-70b"``)
    is that model under ``plan`` (a :class:`~shardsim.plans.Plan` or its string), estimated by
    :func:`~shardsim.cost.model_estimate.estimate_model` with ``batch_tokens``, ``seq``,
    ``chips`` and the options both share (``links``, ``topology``, ``efficiency``,
    ``optimizer``, ``precision``, ``overlap``, ``prefetch``, ``dtype``).

    ``mesh`` is a :class:`~shardsim.Mesh` or ``{"X": 16, ...}``; ``hardware`` a
    :class:`Hardware` or a preset name; ``links`` maps mesh axes to networks (see
    :func:`~shardsim.cost.place`); ``axes`` maps the scheme's roles to mesh axes;
    ``prefetch`` is how many matmuls ahead of its reader a collective may start
    (:mod:`~shardsim.cost.schedule`); ``topology``, ``efficiency`` and ``pad`` as the module
    doc says. ``optimizer`` (``sgd``, ``momentum``, ``adam``, ``adamw``) and ``precision``
    (``fp32``, ``bf16``, ``fp16``...; by default ``dtype``'s) are the training step's whose
    ledger gives ``memory``.

    >>> from shardsim import Mesh
    >>> est = estimate("ddp", Mesh(X=64), "h100", 64 * 1024, 5120, 20480, layers=27)
    >>> print(est.memory_line())  # doctest: +ELLIPSIS
    memory does not fit: needs 90.91 GB of 80 GB (10.91 GB short)
    largest: optimizer 67.95 GB, params 11.32 GB, grads 11.32 GB; over one training step, adam (...)
    """
    if _is_model(scheme):
        from .model_estimate import estimate_model

        given = {"batch": batch, "d_model": d_model, "d_ff": d_ff, "axes": axes}
        wrong = [k for k, v in given.items() if v is not None] + (["layers"] if layers != 1 else [])
        if wrong or batch_tokens is None or activation != "identity" or pad:
            raise ShardsimError(
                f"estimate({scheme if isinstance(scheme, str) else 'cfg'!r}, plan, hardware, ...) estimates a model: "
                "give batch_tokens= (and seq=), not batch/d_model/d_ff/layers/axes/activation/pad"
                + (f" (got {wrong})" if wrong else "")
            )
        return estimate_model(
            scheme, mesh, hardware, batch_tokens=batch_tokens, seq=seq, chips=chips,  # type: ignore[arg-type]
            links=links, topology=topology, efficiency=efficiency, optimizer=optimizer, precision=precision,
            overlap=overlap, prefetch=prefetch, dtype=dtype,
        )  # fmt: skip
    if not isinstance(scheme, str):
        raise ArgumentTypeError(
            f"estimate: the first argument is a scheme name ('fsdp', ...), a model preset name ('llama3-8b') or a "
            f"TransformerConfig, got {type(scheme).__name__} {scheme!r:.60}"
        )
    if isinstance(mesh, (Plan, str)) or batch_tokens is not None:
        from .. import strategies
        from ..models import get as get_model

        if scheme not in strategies.names():
            get_model(scheme)  # neither a scheme nor a model: the presets' error names them all
    if isinstance(mesh, (Plan, str)) or batch is None or d_model is None or d_ff is None:
        raise ShardsimError(
            f"estimate({scheme!r}, ...): a scheme runs on a mesh with batch, d_model and d_ff, e.g. "
            f"estimate({scheme!r}, Mesh(X=16), 'h100', batch=65536, d_model=8192, d_ff=32768); "
            "to estimate a model give a preset name or TransformerConfig first"
        )
    if batch_tokens is not None or seq is not None or chips is not None:
        raise ShardsimError("batch_tokens, seq and chips belong to a model estimate; a scheme takes batch and mesh")
    hw = get_hardware(hardware)
    m = mesh if isinstance(mesh, Mesh) else Mesh(dict(mesh))
    inner = _gpu_order(hw, scheme, m, axes) if links is None else None
    place(hw, m, links, topology=topology, inner=inner)  # fail early, before tracing, on a layout it cannot hold
    source = _memory_source(optimizer, precision, dtype)
    sizes = {"d_model": d_model, "d_ff": d_ff}
    try:
        program = scheme_program(
            scheme, m, batch, d_model, d_ff, layers=layers, dtype=dtype, activation=activation, axes=axes
        )
        padding: dict[str, tuple[int, int]] = {}
        traced = sizes
    except DivisibilityError as err:
        if not pad:
            raise DivisibilityError(f"{err} Or pass pad=True to pad d_model and d_ff as FSDP does.") from None
        padded = {k: -(-v // m.size) * m.size for k, v in sizes.items()}
        program = scheme_program(
            scheme,
            m,
            batch,
            padded["d_model"],
            padded["d_ff"],
            layers=layers,
            dtype=dtype,
            activation=activation,
            axes=axes,
        )
        padding = {k: (sizes[k], padded[k]) for k in sizes if padded[k] != sizes[k]}
        traced = padded
    est = estimate_program(
        program,
        hw,
        placement_links=links,
        inner=inner,
        overlap=overlap,
        prefetch=prefetch,
        batch=batch,
        d_model=d_model,
        d_ff=d_ff,
        dtype=dtype,
        topology=topology,
        efficiency=efficiency,
    )
    est.padding = padding
    try:  # the memory of the same shapes' training step, as the Trainer's ledger measures it
        est.memory, est.model_state = training_memory(
            scheme, m, batch, traced["d_model"], traced["d_ff"], layers=layers, dtype=dtype,
            optimizer=optimizer, precision=precision, activation=activation, axes=axes,
        )
    except ShardsimError as err:  # a scheme the Trainer cannot step yet: the passes' own ledger, said so
        est.memory_source = f"the forward and backward passes only, no optimizer state ({scheme}: {err})"
    else:
        est.memory_source = source
    return est


def _is_model(first: Any) -> bool:
    """A model (config or preset name) rather than a registered scheme's name."""
    from ..models import names

    return isinstance(first, TransformerConfig) or (isinstance(first, str) and first in names())


def _gpu_order(hw: Hardware, scheme: str, mesh: Mesh, axes: Mapping[str, str] | None) -> list[str] | None:
    """On GPUs, the scheme's axes innermost first by their parallelism's hunger (TP on NVLink)."""
    from ..strategies import get as get_scheme
    from ..strategies.runner import resolve_axes
    from .placement import hungry_first

    if isinstance(next(iter(hw.networks.values())), Torus):
        return None
    try:
        roles = resolve_axes(get_scheme(scheme), mesh, axes)
    except ShardsimError:
        return None  # the scheme's own run says what is wrong with its axes
    return hungry_first(roles, mesh)


def _memory_source(optimizer: str, precision: str | None, dtype: str) -> str:
    """The training step the memory is measured over, in words; an unknown optimizer or
    precision fails here, before any tracing, with the training package's own error."""
    from ..training import optim
    from ..training.precision import Precision

    if not isinstance(optimizer, str):
        raise ArgumentTypeError(f"optimizer={optimizer!r:.60}: name one, e.g. optimizer='adam'")
    if precision is not None and not isinstance(precision, (str, Precision)):
        raise ArgumentTypeError(f"precision={precision!r:.60}: name one, e.g. precision='bf16', or pass a Precision")
    optim.get(optimizer)
    policy = Precision.of(precision if precision is not None else resolve_dtype(dtype).name)
    return f"one training step, {optimizer} ({policy})"


def _gb(n: float) -> str:
    """Bytes as GB, four significant digits."""
    return f"{n / 1e9:.4g}"


def estimate_program(
    program: Program,
    hardware: Hardware,
    *,
    placement_links: Mapping[str, str | AxisLink] | None = None,
    overlap: bool = True,
    prefetch: int = 1,
    batch: int,
    d_model: int,
    d_ff: int,
    dtype: str = "bfloat16",
    topology: str | Sequence[int] | None = None,
    efficiency: str | Efficiency = "calibrated",
    inner: Sequence[str] | None = None,
) -> Estimate:
    """An :class:`Estimate` from a program already traced (used by sweeps and critical_batch).

    >>> from shardsim.cost import get_hardware, scheme_program
    >>> prog = scheme_program("ddp", Mesh(X=8), 8 * 4096, 8192, 32768)
    >>> estimate_program(prog, get_hardware("h100"), batch=8 * 4096, d_model=8192, d_ff=32768).bound
    'compute'
    """
    placement = place(hardware, program.mesh, placement_links, topology=topology, inner=inner)
    eff = resolve_efficiency(hardware, efficiency, placement.networks())
    layers = f"{program.layers} layer{'s' if program.layers > 1 else ''}"
    title = f"{program.scheme}, {layers} on {program.mesh}, {hardware.name}"
    tl = build_timeline(
        program.steps, hardware, placement, overlap=overlap, prefetch=prefetch, title=title, efficiency=eff,
        mesh=program.mesh,
    )
    return Estimate(
        scheme=program.scheme,
        hardware=hardware,
        mesh=program.mesh,
        batch=batch,
        d_model=d_model,
        d_ff=d_ff,
        layers=program.layers,
        dtype=dtype,
        timeline=tl,
        memory=program.memory,
        phases=tl.phase_totals(),
        efficiency=eff,
    )


def _ms(seconds: float) -> str:
    """Seconds as milliseconds, four significant digits."""
    return f"{seconds * 1e3:.4g}"


def comm_excess(phases: Mapping[str, Mapping[str, float]]) -> float:
    """The largest ``T_comms - T_math`` over phases and mesh axes (> 0: communication-bound).

    T_math is the phase's FLOPs at peak; T_comms the time of its collectives on one mesh
    axis's links: collectives on different axes overlap one another, as the book assumes
    for FSDP+TP (``T_comms = max(T_FSDP, T_TP)``).
    """
    return max(excess_terms(phases).values(), default=0.0)


def excess_terms(phases: Mapping[str, Mapping[str, float]]) -> dict[tuple[str, str], float]:
    """``T_comms - T_math`` for every (phase, mesh-axis link): the terms of :func:`comm_excess`.

    Phases without matmuls (an optimizer step) have no FLOPs to hide collectives behind and
    are left out, as the book's test is about the forward and backward passes.
    """
    out = {}
    for name, p in phases.items():
        if p["flops"] <= 0:
            continue
        links = {k: v for k, v in p.items() if k.startswith("comm ")} or {"comm": p["comm"]}
        for link, seconds in links.items():
            out[(name, link)] = seconds - p["flops"]
    return out


def sweep(
    schemes: Sequence[str],
    hardware: Hardware | str,
    per_chip_batches: Iterable[int],
    d_model: int,
    d_ff: int,
    *,
    chips: int,
    layers: int = 1,
    overlap: bool = True,
    dtype: str = "bfloat16",
    topology: str | Sequence[int] | None = None,
    efficiency: str | Efficiency = "calibrated",
) -> list[Estimate]:
    """Estimates for every scheme at every per-chip batch on ``chips`` chips.

    ``ddp``/``fsdp`` run on ``Mesh(X=chips)``, ``tp`` on ``Mesh(Y=chips)``, ``fsdp_tp`` on the
    split ``Mesh(X=chips/Y, Y=Y)`` with the shortest step (:func:`~shardsim.cost.best_split`).

    >>> rows = sweep(["ddp", "tp"], "h100", [1024, 4096], 8192, 32768, chips=8, efficiency="ideal")
    >>> [(e.scheme, e.per_chip_batch, e.bound) for e in rows]  # doctest: +NORMALIZE_WHITESPACE
    [('ddp', 1024.0, 'communication'), ('ddp', 4096.0, 'compute'),
     ('tp', 1024.0, 'compute'), ('tp', 4096.0, 'compute')]
    """
    from .critical import best_split, scheme_mesh

    hw = get_hardware(hardware)
    opts: dict[str, Any] = {"layers": layers, "overlap": overlap, "dtype": dtype, "topology": topology}
    eff = efficiency
    out = []
    for scheme in schemes:
        for b in per_chip_batches:
            if scheme == "fsdp_tp":
                out.append(best_split(hw, b * chips, d_model, d_ff, chips=chips, efficiency=eff, **opts))
            else:
                mesh = scheme_mesh(scheme, chips)
                out.append(estimate(scheme, mesh, hw, b * chips, d_model, d_ff, efficiency=eff, **opts))
    return out
