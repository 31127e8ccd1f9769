"""Published training runs beside the cost model: predicted against measured throughput.

Each :class:`Run` is one row someone published: the model, the plan it ran (tensor,
pipeline and data parallel degrees, ZeRO stage, recomputation, microbatches), the chips, the
global batch and the throughput they measured; the runs of 2021 (PTD-P, DeepSpeed's ZeRO-3)
predate FlashAttention and say so, ``attention=standard``. :func:`predict` runs the same model
under the same plan shape-only on the same chips and reads the step time from the cost
model's time line (``efficiency="calibrated"``, the preset's constants, the same for every row);
:func:`table` prints every row with its error, as ``docs/calibration.md`` shows it.

Throughput is TFLOP/s per GPU counted as the source counts it. PTD-P (Narayanan et al. 2021)
counts every matmul FLOP including the recomputed forward pass (its Eq. 3); the trace's own
matmul FLOPs under ``recompute=full`` are that count (``tests/test_calibration.py`` checks
it against Eq. 3), so the predicted figure is the trace's FLOPs per chip over the predicted
step. Llama 3 (Dubey et al. 2024) reports model FLOPs (no recomputation): the trace's FLOPs
without recomputation over the step.

>>> run = RUNS[0]
>>> run.name, run.plan, run.chips, run.measured_tflops
('PTD-P 1.7B', 'dp=32,attention=standard,recompute=full', 32, 137.0)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..cost.efficiency import Calibration
from ..cost.hardware import Hardware
from ..cost.model_estimate import ModelEstimate, estimate_model
from ..cost.presets import get_hardware
from ..errors import CostModelError, ShardsimError
from ..models import TransformerConfig
from ..models import presets as model_presets
from ..plans import Plan

PTDP = "Narayanan et al. 2021 (PTD-P)"
LLAMA3 = "Dubey et al. 2024 (Llama 3)"


@dataclass(frozen=True)
class Run:
    """One published run: ``model`` (a preset name, changed by ``overrides``) under ``plan`` on
    ``hardware``, ``batch`` sequences per step, ``measured_tflops`` per GPU as ``source`` reports.

    ``role`` is ``"fit"`` for the rows a constant was read from and ``"check"`` for the rest;
    ``assumed`` says what the source leaves open and the row assumes; ``options`` are the
    :func:`~shardsim.cost.estimate` options the software of the run implies (``overlap=False``
    where it did not overlap communication), each said and cited in ``assumed``. ``counted_layers``: the
    run's own layer count when the model runs more to keep its pipeline stages equal (the
    step is the busiest stage's either way; FLOPs are counted for ``counted_layers``).
    """

    name: str
    group: str
    model: str
    plan: str
    hardware: str
    batch: int
    measured_tflops: float
    source: str
    role: str = "check"
    measured_mfu: float | None = None
    overrides: tuple[tuple[str, Any], ...] = ()
    assumed: str = ""
    counted_layers: int | None = None
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def config(self) -> TransformerConfig:
        """The model the run trained."""
        cfg = model_presets.get(self.model)
        return cfg.scaled(**dict(self.overrides)) if self.overrides else cfg

    @property
    def parsed_plan(self) -> Plan:
        return Plan.parse(self.plan)

    @property
    def chips(self) -> int:
        return self.parsed_plan.chips

    @property
    def seq(self) -> int:
        return self.config.seq

    @property
    def batch_tokens(self) -> int:
        return self.batch * self.seq


_T1 = "PTD-P Table 1 (weak scaling, Selene DGX A100)"
_Z3 = "PTD-P ZeRO-3 comparison (175B, global batch 1536)"
_Z3_530 = "PTD-P ZeRO-3 comparison (529.6B)"
_T2 = "PTD-P Table 2 (PTD-P at a fixed global batch)"
_L3 = "Llama 3 405B, Table 4 (H100)"
_UNTIED = (("tie_embeddings", False),)
_MB1 = "microbatch 1, 1F1B (Table 1 gives neither); embedding and LM head untied (pp > 1)"


def _t1(size: str, t: int, p: int, gpus: int, batch: int, tflops: float, row: int, role: str = "check") -> Run:
    d = gpus // (t * p)
    plan = Plan(dp=d, tp=t, pp=p, microbatches=batch // d if p > 1 else 1, attention="standard", recompute="full")
    return Run(
        f"PTD-P {size}",
        _T1,
        f"ptdp-{size.lower()}",
        str(plan),
        "a100",
        batch,
        tflops,
        f"{PTDP}, Table 1 row {row}",
        role,
        overrides=_UNTIED if p > 1 else (),
        assumed=_MB1 if p > 1 else "no microbatching (every GPU takes its B/d sequences at once)",
    )


# DeepSpeed's ZeRO-3 of 2021 gathered each parameter with a blocking AllGather: "the async
# version is not async at all, because each all_gather calls torch.cuda.synchronize() to
# guarantee previous communication op to be completed" (DeepSpeed PR 1188, June 2021, after
# the PTD-P comparison was measured); "the prefetching only partially overlaps with
# computation" (DeepSpeed PR 1170, July 2021).
_ZERO3_SERIAL = (
    "DeepSpeed PR 1188: each ZeRO-3 AllGather synchronised before the next; PR 1170: prefetch barely overlapped"
)


def _table2_model(size: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """Table 2's model of ``size``: GPT-3 175B with PTD-P's vocabulary of 51,200, or PTD-P's own."""
    return ("gpt3-175b", (("vocab", 51200),)) if size == "175B" else (f"ptdp-{size.lower()}", ())


def _zero3(gpus: int, tflops: float, size: str = "175B", batch: int = 1536) -> Run:
    model, overrides = _table2_model(size)
    return Run(
        f"ZeRO-3 {size}, {gpus:,} GPUs",
        _Z3 if size == "175B" else _Z3_530,
        model,
        str(Plan(dp=gpus, zero=3, attention="standard", recompute="full")),
        "a100",
        batch,
        tflops,
        f"{PTDP}, §5.2 Table 2 (ZeRO-3 without model parallelism, microbatch {batch // gpus})",
        overrides=overrides,
        assumed=("vocabulary 51,200 as all PTD-P GPT models; " if overrides else "")
        + "DeepSpeed ZeRO-3 as ZeRO stage 3 over 'data'; "
        f"no overlap of communication with compute ({_ZERO3_SERIAL})",
        options=(("overlap", False),),
    )


def _t2(size: str, p: int, gpus: int, batch: int, tflops: float) -> Run:
    """PTD-P's own rows of Table 2: model-parallel size ``8 p`` (Table 2 prints the product;
    TP 8 in a node and PP ``p`` across, as Table 1 runs these models), microbatch 1."""
    model, overrides = _table2_model(size)
    d = gpus // (8 * p)
    plan = Plan(dp=d, tp=8, pp=p, microbatches=batch // d, attention="standard", recompute="full")
    return Run(
        f"PTD-P {size}, {gpus:,} GPUs",
        _T2,
        model,
        str(plan),
        "a100",
        batch,
        tflops,
        f"{PTDP}, §5.2 Table 2 (PTD-P, model-parallel size {8 * p}, microbatch 1)",
        overrides=overrides + _UNTIED,
        assumed=f"model-parallel size {8 * p} as TP 8 x PP {p}; 1F1B; embedding and LM head untied (pp > 1)",
    )


def _llama(gpus: int, cp: int, dp: int, tflops: float, mfu: float, role: str = "check") -> Run:
    seq = 8192 * cp if cp > 1 else 8192
    batch = 16 * 2**20 // seq  # "16M" tokens per step (Table 4)
    # Llama 3 §3.3.2: context parallelism all-gathers K and V and attends with the local queries,
    # the sequence cut in 2 x CP chunks for the causal load (the balanced order)
    method = "all_gather" if cp > 1 else "ring"
    plan = Plan(
        dp=dp, zero=1, tp=8, cp=cp, pp=16, microbatches=batch // dp, schedule="interleaved", virtual_stages=2,
        cp_method=method, attention="flash",
    )  # fmt: skip
    # 126 layers: 16 stages of 8 with one fewer on the first and the last (Llama 3 §3.3.2);
    # equal stages of 8 have the same busiest stage, so the step is the same
    layers = (("layers", 128),)
    return Run(
        f"Llama 3 405B, {gpus:,} GPUs" + (f", CP {cp}, seq {seq:,}" if cp > 1 else ""),
        _L3,
        "llama3-405b",
        str(plan),
        "h100",
        batch,
        tflops,
        f"{LLAMA3}, Table 4 (TP 8, CP {cp}, PP 16, DP {dp})",
        role,
        measured_mfu=mfu,
        overrides=(*layers, ("seq", seq)) if cp > 1 else layers,
        assumed="microbatch 1, the interleaved schedule with 2 chunks per stage (the least interleaving); "
        "FSDP that keeps the weights after the forward pass as ZeRO-1 "
        "(one gradient ReduceScatter and one weight AllGather per step); 16 equal stages of 8 layers, "
        "FLOPs counted for 126; FlashAttention, timed as the H100's fused kernel, its FLOPs those of the "
        "key tiles the causal mask leaves visible (about half of S^2)"
        + ("; all-gather context parallelism with balanced chunks (Llama 3 §3.3.2)" if cp > 1 else ""),
        counted_layers=126,
    )


RUNS: tuple[Run, ...] = (
    _t1("1.7B", 1, 1, 32, 512, 137.0, 1, "fit"),
    _t1("3.6B", 2, 1, 64, 512, 138.0, 2, "fit"),
    _t1("7.5B", 4, 1, 128, 512, 142.0, 3, "fit"),
    _t1("18.4B", 8, 1, 256, 1024, 135.0, 4, "fit"),
    _t1("39.1B", 8, 2, 512, 1536, 138.0, 5),
    _t1("76.1B", 8, 4, 1024, 1792, 140.0, 6),
    _t1("145.6B", 8, 8, 1536, 2304, 148.0, 7),
    _t1("310.1B", 8, 16, 1920, 2160, 155.0, 8),
    _t1("529.6B", 8, 35, 2520, 2520, 163.0, 9),
    _t1("1T", 8, 64, 3072, 3072, 163.0, 10),
    _zero3(384, 144.0),
    _zero3(768, 88.0),
    _zero3(1536, 44.0),
    _t2("175B", 12, 384, 1536, 153.0),
    _t2("175B", 12, 768, 1536, 149.0),
    _t2("175B", 12, 1536, 1536, 141.0),
    _zero3(640, 138.0, "529.6B", 2560),
    _t2("529.6B", 35, 1120, 2240, 167.0),
    _t2("529.6B", 35, 2240, 2240, 159.0),
    _llama(8192, 1, 64, 430.0, 0.43, "fit"),
    _llama(16384, 1, 128, 400.0, 0.41),
    _llama(16384, 16, 8, 380.0, 0.38),
)


@dataclass(frozen=True)
class Prediction:
    """A run with the cost model's step time (seconds), TFLOP/s per GPU and MFU for it."""

    run: Run
    step_s: float
    tflops: float
    mfu: float
    efficiency: str
    method: str = "whole model"

    @property
    def error(self) -> float:
        """Predicted over measured throughput, minus one."""
        return self.tflops / self.run.measured_tflops - 1

    @property
    def measured_step_s(self) -> float:
        """The step time the published throughput implies (same FLOP count as ``tflops``)."""
        return self.step_s * self.tflops / self.run.measured_tflops


def predict(
    run: Run, efficiency: str = "calibrated", hardware: Hardware | None = None, *, options: bool = True
) -> Prediction:
    """The cost model's figures for ``run``: :func:`~shardsim.cost.estimate` of its model under
    its plan on the preset (or on ``hardware``, the same chip with other constants, as
    :func:`fit_elementwise_passes` tries), with the run's ``options`` (``options=False``: the
    estimate's defaults, e.g. communication overlapped). Warns if the chip lacks a measured curve.

    >>> p = predict(RUNS[0])
    >>> p.run.name, abs(p.error) < 0.15
    ('PTD-P 1.7B', True)
    """
    est = _estimate(run, efficiency, hardware or get_hardware(run.hardware), dict(run.options) if options else {})
    counted = _counted(run)
    return Prediction(run, est.step_s, _tflops(run, est.hardware_flops, est.step_s), est.mfu * counted, efficiency)


def _counted(run: Run) -> float:
    """The share of the traced layers whose FLOPs the run counts (its own layer count)."""
    return (run.counted_layers or run.config.layers) / run.config.layers


def _tflops(run: Run, flops: float, step_s: float) -> float:
    """TFLOP/s per GPU: the step's FLOPs over all chips, counted as the run counts them."""
    return flops * _counted(run) / run.chips / step_s / 1e12


def predict_from_layers(run: Run, efficiency: str = "calibrated") -> Prediction:
    """The figures for ``run`` from its layer program, as the planner reads it
    (:func:`shardsim.planner.evaluate`): the training step traced shape-only at one and two
    layers under the run's layer sharding, each layer's time the difference of the two time
    lines, the pipeline schedule run on the planner's clock. The same trace as
    :func:`predict`'s, read without building the whole model's time line, so a row whose time
    line is beyond the page's budget still gets a figure. The planner has no ``options``
    (every row it times overlaps communication) and counts model FLOPs, so a run with options
    or recomputation is refused.

    >>> run = next(r for r in RUNS if r.name == "Llama 3 405B, 8,192 GPUs")
    >>> p = predict_from_layers(run)  # in a few seconds
    >>> p.method, abs(p.error) < 0.15
    ('layer program', True)
    """
    from ..cost.layer_program import LayerCache
    from ..planner.evaluate import evaluate
    from ..planner.space import Candidate

    plan = run.parsed_plan
    if run.options or plan.recompute != "none":
        raise CostModelError(
            f"{run.name}: predict_from_layers times plans without recomputation and without estimate options; "
            "use predict(run)"
        )
    cache = LayerCache(run.config, run.hardware, seq=run.seq, efficiency=efficiency)
    micro = run.batch // (plan.dp * plan.microbatches)
    est = evaluate(cache, Candidate(plan, micro, run.batch))
    tflops = _tflops(run, est.model_flops, est.step_s)
    return Prediction(run, est.step_s, tflops, est.mfu * _counted(run), efficiency, "layer program")


def _estimate(run: Run, efficiency: str, hardware: Hardware, options: dict[str, Any]) -> ModelEstimate:
    """The whole-model estimate of ``run`` (its program is cached by the cost model: a fit re-times it)."""
    try:
        est = estimate_model(
            run.config,
            run.parsed_plan,
            hardware,
            batch_tokens=run.batch_tokens,
            seq=run.seq,
            efficiency=efficiency,
            memory=False,  # the table is about time; the training step's ledger would only slow it
            **options,
        )
    except ShardsimError as err:
        raise type(err)(f"{run.name} ({run.source}): {err}") from None
    return est


def fit_elementwise_passes(runs: Sequence[Run], tol: float = 2e-3, steps: int = 8) -> float:
    """The :class:`~shardsim.cost.Calibration` ``elementwise_passes`` (k) of the runs' chip that
    makes the geometric mean of predicted over measured throughput 1 over ``runs``.

    The mean log error falls smoothly as k grows (every matmul is followed by k passes over
    its output at HBM bandwidth), so a few secant steps from 0 and 4 find it; each step
    re-times the runs' cached programs. 0 when the runs are slower than measured even without
    the untimed kernels. This is how the presets' value was read from the ``fit`` rows; the
    other rows are checks.
    """
    names = {r.hardware for r in runs}
    if len(names) != 1:
        raise ShardsimError(f"fit_elementwise_passes fits one chip at a time; these runs are on {sorted(names)}")
    base = get_hardware(names.pop())
    cal = base.calibration or Calibration()

    def log_error(value: float) -> float:
        hw = base.with_(calibration=dataclasses.replace(cal, elementwise_passes=value))
        return sum(math.log1p(predict(r, hardware=hw).error) for r in runs) / len(runs)

    x0, x1 = 0.0, 4.0
    f0 = log_error(x0)
    if f0 <= 0:
        return 0.0
    f1 = log_error(x1)
    for _ in range(steps):
        x2 = max(0.0, x1 - f1 * (x1 - x0) / (f1 - f0))
        if abs(x2 - x1) < tol:
            return x2
        x0, f0, x1, f1 = x1, f1, x2, log_error(x2)
    return x1


# Layer-microbatches (layers x microbatches, times cp^2 under context parallelism) above which
# a pipelined row is timed from its layer program (:func:`predict_from_layers`) instead of the
# whole model's time line (millions of steps). PTD-P's 1T (128 x 512) is within it and takes
# about three minutes alone on two cores. Context-parallel attention records one event per
# chip of the context axis whose work differs (the causal mask), each held by a mask over the
# axis, at each of cp ring steps (all-gather attention: once, over the gathered keys), so a
# layer-microbatch costs about cp^2 times the work: the Llama 3 CP 16 row (128 x 16 x 256) is
# beyond it (its whole-model time line at 32 layers took ten minutes).
PAGE_BUDGET = 100_000


def not_predicted(run: Run, budget: int | None = PAGE_BUDGET) -> str | None:
    """Why the table does not time ``run`` from the whole model's time line, or None when it
    does (``budget=None``: no size limit). Such a row is timed from its layer program."""
    plan = run.parsed_plan
    size = run.config.layers * plan.microbatches * plan.cp**2
    if budget is not None and plan.pp > 1 and size > budget:
        ring = f" x {plan.cp}^2 context-parallel attention events" if plan.cp > 1 else ""
        return (
            f"{run.config.layers} layers x {plan.microbatches} microbatches{ring}: a time line of millions of "
            f"steps, beyond the page's budget of {budget:,} layer-microbatches (predict() times it)"
        )
    return None


def predictable(run: Run, budget: int | None = PAGE_BUDGET) -> bool:
    """Whether the table times ``run`` (:func:`not_predicted` says why not)."""
    return not_predicted(run, budget) is None


def predictions(
    runs: Sequence[Run] = RUNS,
    efficiency: str = "calibrated",
    budget: int | None = PAGE_BUDGET,
    progress: bool | None = None,
) -> list[Prediction]:
    """:func:`predict` for every run that :func:`predictable` allows, :func:`predict_from_layers`
    for the rest; ``progress`` a line on stderr naming the run being timed (default: after a
    second, on a terminal; :class:`~shardsim.planner.progress.Progress`)."""
    from ..planner.progress import Progress

    bar, out = Progress(len(runs), enabled=progress), []
    for i, r in enumerate(runs):
        bar.show(f"calibration: {i}/{len(runs)} runs, timing {r.name}", force=True)
        out.append(predict(r, efficiency) if predictable(r, budget) else predict_from_layers(r, efficiency))
    bar.show(f"calibration: {len(runs)}/{len(runs)} runs", force=True)
    bar.close()
    return out


def table(runs: Sequence[Run] = RUNS, budget: int | None = PAGE_BUDGET, progress: bool | None = None) -> str:
    """Every run, measured beside predicted, as the Markdown table of ``docs/calibration.md``
    (``budget=None`` times every row, the largest pipelines included: tens of minutes;
    ``progress`` as :func:`predictions` takes it)."""
    lines = [
        "| run | plan | GPUs | batch | measured TFLOP/s | predicted | error | predicted MFU | row | source |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    done = {p.run: p for p in predictions(runs, budget=budget, progress=progress)}
    for r in runs:
        plan = f"`{r.plan}`" + (f", {_options_text(r.options)}" if r.options else "")
        head = f"| {r.name} | {plan} | {r.chips:,} | {r.batch:,} | {r.measured_tflops:.0f} "
        p = done[r]
        role = r.role if p.method == "whole model" else f"{r.role} ({p.method})"
        lines.append(head + f"| {p.tflops:.0f} | {p.error:+.0%} | {p.mfu:.1%} | {role} | {r.source} |")
    optioned = [p for p in done.values() if p.run.options]
    if optioned:
        lines += ["", "The same rows with the estimate's defaults instead of the run's options:", ""]
        for p in optioned:
            q = predict(p.run, options=False)
            lines.append(
                f"- {p.run.name} without {_options_text(p.run.options)}: {q.tflops:.0f} TFLOP/s ({q.error:+.0%})."
            )
    layered = [p for p in done.values() if p.method != "whole model"]
    if layered:
        title = "Timed from the layer program (`predict_from_layers`, the planner's reading of the same trace):"
        lines += ["", title, ""] + [f"- {p.run.name}: {not_predicted(p.run, budget)}." for p in layered]
        groups = {q.run.group for q in layered}
        beside = [p for p in done.values() if p.method == "whole model" and p.run.group in groups]
        for p in beside:
            q = predict_from_layers(p.run)
            lines.append(
                f"- {p.run.name}, for comparison: {q.tflops:.0f} TFLOP/s from the layer program, "
                f"{p.tflops:.0f} from the whole model ({q.tflops / p.tflops - 1:+.1%})."
            )
    return "\n".join(lines)


def _options_text(options: tuple[tuple[str, Any], ...]) -> str:
    """``(("overlap", False),)`` -> ```overlap=False```."""
    return ", ".join(f"`{name}={value}`" for name, value in options)


def constants_table() -> str:
    """The fitted constants per chip: the value in the preset and the rows it was read from."""
    from ..cost.presets import hardware_names

    lines = ["| chip | `elementwise_passes` | read from | source |", "|---|---:|---|---|"]
    for name in hardware_names():
        cal = get_hardware(name).calibration
        fit = [r.name for r in RUNS if r.hardware == name and r.role == "fit"]
        if not fit and (cal is None or not cal.elementwise_passes):
            lines.append(f"| `{name}` | 0 | no published end-to-end run in the table | |")
            continue
        value = cal.elementwise_passes if cal is not None else 0.0
        source = cal.source if cal is not None else ""
        lines.append(f"| `{name}` | {value:g} | {', '.join(fit) or 'borrowed'} | {source} |")
    return "\n".join(lines)


def blocks() -> dict[str, Callable[[], str]]:
    """The generated parts of ``docs/calibration.md``, by the name of their marker."""
    from ..cost.critical import critical_table
    from ..cost.measured import comparison_table

    return {"runs": table, "constants": constants_table, "collectives": comparison_table, "critical": critical_table}


def render(text: str, names: Sequence[str] | None = None) -> str:
    """``text`` with every ``<!-- BEGIN name -->`` ... ``<!-- END name -->`` block recomputed.

    >>> render("a\\n<!-- BEGIN constants -->\\nold\\n<!-- END constants -->\\nb", ["constants"]).splitlines()[2]
    '| chip | `elementwise_passes` | read from | source |'
    """
    makers = blocks()
    for name in names or list(makers):
        begin, end = f"<!-- BEGIN {name} -->\n", f"\n<!-- END {name} -->"
        if begin not in text or end not in text:
            raise ShardsimError(f"docs block {name!r} has no '<!-- BEGIN {name} -->' ... '<!-- END {name} -->' markers")
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + begin + makers[name]() + end + tail
    return text


def block(text: str, name: str) -> str:
    """The current content of block ``name`` in ``text`` (what :func:`render` would replace)."""
    return text.split(f"<!-- BEGIN {name} -->\n", 1)[1].split(f"\n<!-- END {name} -->", 1)[0]
