"""``shardsim train``: a small regression problem trained under every scheme and ZeRO stage.

A student MLP stack learns to reproduce a random teacher stack's outputs. Each scheme trains
it for a few steps from the same start; the command prints the loss per step (the same
under every scheme, and the same as plain single-device NumPy), then each chip's memory by
category next to the ZeRO closed forms, and the bytes each chip sent per step.

The check tells two failures apart: a scheme whose losses differ from single-device
training is a sharding mismatch (``FAIL``); a loss that becomes non-finite or ends above
where it started, on one device as under the schemes, is a learning rate too high for the
sizes (``DIVERGED``, with a lower rate to try). The default rate (:func:`default_lr`)
converges for the default sizes and well above them.

:func:`add_train_arguments` configures an ``argparse`` parser; :func:`train_command` runs it
and returns the exit code (0 when every scheme matched the single-device losses and they
fell, 1 if not); each scheme's mesh is :func:`~shardsim.cli.demo_run.mesh_for`'s.

>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> add_train_arguments(parser)
>>> code = train_command(parser.parse_args(["--scheme", "zero2", "--steps", "2", "--quiet"]))
zero2 on Mesh(X=4): PASS
>>> code
0
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import formulas, strategies
from .._format import fmt_bytes, table_text
from ..array import ShapeDtype
from ..dtypes import FLOAT_NAMES, eps, tolerance
from ..errors import ShardsimError
from ..host import check_host_memory
from ..mesh import Mesh
from ..models import reference_mlp as mlp
from ..training import optim
from ..training.precision import Precision, precision_dtype
from ..training.trainer import StepResult, Trainer
from .args import count, positive_float, seed
from .demo_run import mesh_for
from .framework import subcommand
from .output import (
    add_chrome_trace_option,
    add_output_options,
    check_output_path,
    progress,
    write_chrome_trace_option,
    write_csv,
    write_json,
)

#: The schemes ``shardsim train`` runs when none is named: the ZeRO stages, then model parallel.
DEFAULT_SCHEMES = ("ddp", "zero1", "zero2", "zero3", "tp", "fsdp_tp")
CATEGORIES = ("params", "grads", "optimizer")


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``shardsim train``'s options to ``parser``."""
    parser.add_argument(
        "--scheme",
        action="append",
        metavar="NAME",
        help=f"scheme to train under (repeatable; default: {' '.join(DEFAULT_SCHEMES)})",
    )
    parser.add_argument("--chips", type=count("chips"), default=4, help="chips per mesh (default 4)")
    parser.add_argument("--layers", type=count("layers"), default=2, help="MLP blocks in the stack (default 2)")
    parser.add_argument("--batch", type=count("batch"), default=8, help="batch size B (default 8)")
    parser.add_argument("--d-model", type=count("width"), default=16, help="model width D (default 16)")
    parser.add_argument("--d-ff", type=count("width"), default=32, help="hidden width F (default 32)")
    parser.add_argument("--steps", type=count("steps"), default=4, help="training steps (default 4)")
    parser.add_argument(
        "--optimizer", choices=["sgd", "momentum", "adam", "adamw"], default="adam", help="(default adam)"
    )
    parser.add_argument(
        "--lr",
        type=positive_float,
        help="learning rate (default: 0.1 for sgd and momentum; 0.05 / sqrt(max(D, F) * max(L, 2) / 2) for "
        "adam and adamw, 0.0088 at the default sizes)",
    )
    parser.add_argument(
        "--precision",
        choices=["fp32", "fp64", "bf16", "fp16"],
        default="fp32",
        help="fp32/fp64: one dtype throughout; bf16/fp16: 16-bit weights, activations and gradients "
        "with float32 master weights and moments (default fp32)",
    )
    parser.add_argument(
        "--reduce-dtype",
        type=reduce_dtype,
        help=f"dtype the gradients are reduced in, one of {', '.join(FLOAT_NAMES)} (default: the compute dtype)",
    )
    parser.add_argument("--activation", choices=["identity", "relu", "gelu"], default="gelu", help="(default gelu)")
    parser.add_argument("--residual", action="store_true", help="each block adds its input")
    parser.add_argument("--recompute", action="store_true", help="keep block inputs only; recompute in backward")
    parser.add_argument("--seed", type=seed, default=0, help="random seed (default 0)")
    parser.add_argument("--quiet", action="store_true", help="print one PASS/FAIL line per scheme only")
    add_chrome_trace_option(parser, "each scheme's last training step")
    add_output_options(parser)


def reduce_dtype(text: str) -> str:
    """An argparse type: ``--reduce-dtype``, a floating-point dtype name (:func:`precision_dtype`).

    >>> reduce_dtype("float32")
    'float32'
    """
    try:
        return precision_dtype(text, "reduce").name
    except ShardsimError:  # said as the flag: argparse prefixes "argument --reduce-dtype:"
        raise argparse.ArgumentTypeError(
            f"expected a floating-point dtype, one of {', '.join(FLOAT_NAMES)}, got {text!r}"
        ) from None


def default_lr(optimizer: str, d_model: int, d_ff: int, layers: int) -> float:
    """A learning rate that converges on the teacher problem: Adam moves every weight by about
    ``lr`` a step whatever its gradient, and the weights are ``1/sqrt(width)`` in size, so its
    rate shrinks with the width (and with depth past two blocks); SGD's step is the gradient's.

    >>> round(default_lr("adam", 16, 32, 2), 4), default_lr("sgd", 16, 32, 2)
    (0.0088, 0.1)
    """
    if optimizer in ("adam", "adamw"):
        return float(f"{0.05 / math.sqrt(max(d_model, d_ff) * max(layers, 2) / 2):.2g}")
    return 0.1


@subcommand(
    "train",
    "train a small regression problem under every scheme and ZeRO stage",
    configure=add_train_arguments,
)
def train_command(args: argparse.Namespace) -> int:
    """Run ``shardsim train`` with parsed ``args``; 0 if every scheme matched single-device training."""
    names = args.scheme or list(DEFAULT_SCHEMES)
    if args.reduce_dtype and not args.scheme:  # tp reduces no gradients: leave it out
        names = [n for n in names if "data" in strategies.get(n).roles]
    for name in names:
        strategies.get(name)  # unknown names fail before any work
    precision = Precision.of(args.precision, reduce=args.reduce_dtype)
    check_output_path("--chrome-trace", args.chrome_trace)
    check_train_memory(names, args.chips, args.layers, args.batch, args.d_model, args.d_ff)
    params, x, target = problem(args.layers, args.batch, args.d_model, args.d_ff, args.seed)
    lr = args.lr if args.lr is not None else default_lr(args.optimizer, args.d_model, args.d_ff, args.layers)
    opt = optim.get(args.optimizer, lr=lr)
    options: dict[str, Any] = dict(
        precision=precision, activation=args.activation, residual=args.residual, recompute=args.recompute
    )
    with np.errstate(over="ignore", invalid="ignore"):  # a diverging run is reported, not warned about
        want = reference_losses(params, x, target, opt, args.steps, args.activation, args.residual)
    tol = loss_tolerance(precision, args.layers, args.batch, args.d_model, args.d_ff, args.steps)
    runs: dict[str, tuple[Mesh, list[StepResult]]] = {}
    verdicts: dict[str, str] = {}
    wants: dict[str, np.ndarray] = {}
    for name in names:
        mesh = mesh_for(name, args.chips)
        mine, wants[name] = params, want
        model = strategies.mlp_for(name, mesh, args.d_model, args.d_ff, args.layers)
        shapes = {k: v.shape for k, v in strategies.weights_of(name, model).items()}
        if shapes != {k: v.shape for k, v in params.items()}:  # another block (LayerNorm, experts, chunks)
            mine = strategies.init_of(name, model, seed=args.seed)
            with np.errstate(over="ignore", invalid="ignore"):
                wants[name] = reference_losses(
                    mine, x, target, opt, args.steps, args.activation, args.residual, scheme=name
                )
        trainer = Trainer(name, mesh, mine, opt, **options)
        with np.errstate(over="ignore", invalid="ignore"):
            results = [trainer.step(x, target) for _ in progress(range(args.steps), args.steps, f"{name} steps")]
        runs[name] = (mesh, results)
        verdicts[name] = verdict(np.array([r.loss for r in results]), wants[name], tol)
        if args.quiet and not (args.json or args.csv):
            print(f"{name} on {mesh}: {verdicts[name]}")
    advice = diverged_advice(want, lr, args)
    if args.json:
        write_json(train_record(args, lr, precision, want, tol, runs, verdicts, wants))
    elif args.csv:
        write_csv(
            [
                {"scheme": name, "mesh": _mesh_text(mesh), "step": i + 1, "loss": r.loss, "reference": wants[name][i]}
                for name, (mesh, results) in runs.items()
                for i, r in enumerate(results)
            ]
        )
    elif not args.quiet:
        n = args.layers * 2 * args.d_model * args.d_ff
        print(
            f"Training a {args.layers}-block MLP stack (B={args.batch}, D={args.d_model}, F={args.d_ff}; "
            f"{n:,} parameters) to fit a random teacher stack: {args.optimizer}, lr {lr:g}, "
            f"{precision}, {args.activation}{', residual' if args.residual else ''}"
            f"{', recompute' if args.recompute else ''}.\n"
        )
        print(loss_table(runs, want, tol, verdicts, wants))
        print()
        print(memory_table(runs, n, precision, opt.name))
    if advice and not (args.json or args.csv):
        print(advice)
    last_steps = {name: results[-1].trace for name, (_, results) in runs.items()}
    write_chrome_trace_option(last_steps, args.chrome_trace, quiet=args.json or args.csv or args.quiet)
    return 0 if all(v == "PASS" for v in verdicts.values()) else 1


def diverged(losses: np.ndarray) -> bool:
    """A loss that is not finite, or ends above where it started.

    >>> diverged(np.array([1.0, 0.5])), diverged(np.array([1.0, 2.0])), diverged(np.array([1.0, np.nan]))
    (False, True, True)
    """
    return bool(not np.all(np.isfinite(losses)) or (len(losses) > 1 and losses[-1] > losses[0]))


def verdict(got: np.ndarray, want: np.ndarray, tol: float) -> str:
    """``PASS``; ``DIVERGED`` when the loss diverges (the rate, not the sharding); ``FAIL`` when
    the losses differ from single-device training by more than ``tol`` (a sharding mismatch).

    >>> verdict(np.array([1.0, 0.5]), np.array([1.0, 0.5]), 1e-6)
    'PASS'
    >>> verdict(np.array([1.0, 3.0]), np.array([1.0, 3.0]), 1e-6)
    'DIVERGED'
    >>> verdict(np.array([1.0, 0.6]), np.array([1.0, 0.5]), 1e-6)
    'FAIL'
    """
    if diverged(got) or diverged(want):
        return "DIVERGED"
    return "PASS" if relative_error(got, want) <= tol else "FAIL"


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """The largest ``|got - want| / |want|`` over the steps (inf when not finite)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        err = np.abs(got - want) / np.abs(want)
    return float(np.max(err)) if np.all(np.isfinite(err)) else math.inf


def diverged_advice(want: np.ndarray, lr: float, args: argparse.Namespace) -> str:
    """What to do when single-device training itself diverges, or "" when it does not."""
    if not diverged(want):
        return ""
    how = "became non-finite" if not np.all(np.isfinite(want)) else f"rose from {want[0]:.4g} to {want[-1]:.4g}"
    return (
        f"DIVERGED: the loss {how} on one device as well, so the sharding is not at fault: learning rate "
        f"{lr:g} is too high for these sizes; try --lr {lr / 10:g}"
    )


def check_train_memory(names: Sequence[str], chips: int, layers: int, batch: int, d_model: int, d_ff: int) -> None:
    """Refuse, before anything is allocated, a run the host has no memory for: the student and
    teacher stacks and the float64 reference, then each scheme's chips, their peak read from a
    shape-only run's ledger plus float32 optimizer state and master weights on every chip."""
    weights = layers * 2 * d_model * d_ff
    alternative = (
        "use smaller --layers/--d-model/--d-ff/--batch/--chips, or see a step's bytes and time shape-only: "
        f"shardsim estimate --d-model {d_model} --d-ff {d_ff} --layers {layers}"
    )
    host = 4 * 2 * weights + 8 * 4 * weights + 8 * 4 * batch * (d_model + d_ff) * layers
    check_host_memory(host, "this training run", alternative)
    for name in names:
        mesh = mesh_for(name, chips)
        shapes = strategies.weights_of(name, strategies.mlp_for(name, mesh, d_model, d_ff, layers))
        r = strategies.run_strategy(name, mesh, shapes, ShapeDtype((batch, d_model)), ShapeDtype((batch, d_model)))
        check_host_memory(host + int(r.memory["total"].sum()) + 4 * 4 * weights * mesh.size, name, alternative)


# -- the problem and its single-device answer ---------------------------------------------------
def problem(
    layers: int, batch: int, d_model: int, d_ff: int, seed: int = 0
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """``(params, x, target)``: a student stack and a teacher stack's outputs on random inputs.

    >>> p, x, y = problem(2, 4, 8, 16)
    >>> p["w_in"].shape, x.shape, y.shape
    ((2, 8, 16), (4, 8), (4, 8))
    """
    params = mlp.init_stack(layers, d_model, d_ff, seed=seed)
    teacher = mlp.init_stack(layers, d_model, d_ff, seed=seed + 1000)
    x = np.random.default_rng(seed).standard_normal((batch, d_model)).astype(np.float32)
    target = mlp.stack_forward(teacher, x, "gelu").astype(np.float32)
    return params, x, target


def reference_losses(
    params: dict[str, np.ndarray],
    x: np.ndarray,
    target: np.ndarray,
    opt: optim.Optimizer,
    steps: int,
    activation: str,
    residual: bool,
    scheme: str | None = None,
) -> np.ndarray:
    """The losses of ``steps`` plain single-device steps in float64 (the same optimizer on whole arrays):
    of the MLP stack, or with ``scheme`` of that scheme's block (:func:`shardsim.strategies.reference_of`)."""
    w = {k: v.astype(np.float64) for k, v in params.items()}
    state = {k: opt.init_state(v) for k, v in w.items()}
    x64, t64 = x.astype(np.float64), target.astype(np.float64)
    losses = []
    for step in range(1, steps + 1):
        if scheme is None:
            out = mlp.stack_forward(w, x64, activation, residual)
        else:
            out = strategies.reference_of(scheme, w, x64, np.zeros_like(x64), activation, residual)[0]
        diff = out - t64
        losses.append(float(np.mean(diff**2)))
        if scheme is None:
            grads = mlp.stack_backward(w, x64, 2 * diff / diff.size, activation, residual)
        else:
            grads = strategies.reference_of(scheme, w, x64, 2 * diff / diff.size, activation, residual)[1]
        for k in w:
            opt.update(w[k], grads[k], state[k], step)
    return np.array(losses)


def loss_tolerance(precision: Precision, layers: int, batch: int, d_model: int, d_ff: int, steps: int) -> float:
    """Relative tolerance on a loss: the compute dtype's rounding through the stack, per step.

    16-bit compute rounds each block's weights and activations, about one epsilon per block;
    32/64-bit compute sums ``max(B, D, F)`` products per matmul, a few ulps times its square
    root, on each of ``4L + 2`` matmuls between the loss and a weight.
    """
    if precision.compute.itemsize == 2:
        return layers * eps(precision.compute) * steps
    return tolerance(precision.compute, max(batch, d_model, d_ff)) * (4 * layers + 2) * steps


# -- tables ------------------------------------------------------------------------------------
def loss_table(
    runs: dict[str, tuple[Mesh, list[StepResult]]],
    want: np.ndarray,
    tol: float,
    verdicts: dict[str, str],
    wants: dict[str, np.ndarray] | None = None,
) -> str:
    """Loss per step under every scheme, with the single-device row and a verdict (a scheme of
    another block, ``wants[name]``, gets its own single-device row)."""
    steps = len(want)
    rows = [("scheme", "mesh", *(f"step {i + 1}" for i in range(steps)), "vs 1 device")]
    rows.append(("1 device", "-", *(f"{v:.6g}" for v in want), f"tol {tol:.1e}"))
    for name, (mesh, results) in runs.items():
        mine = want if wants is None else wants[name]
        if mine is not want:
            rows.append((f"{name}, 1 device", "-", *(f"{v:.6g}" for v in mine), ""))
        got = np.array([r.loss for r in results])
        rows.append(
            (name, _mesh_text(mesh), *(f"{v:.6g}" for v in got), f"{relative_error(got, mine):.1e} {verdicts[name]}")
        )
    return "Loss per step (mean squared error before each update)\n" + table_text(rows, right=range(2, steps + 2))


def _mesh_text(mesh: Mesh) -> str:
    return repr(mesh).removeprefix("Mesh")


def train_record(
    args: argparse.Namespace,
    lr: float,
    precision: Precision,
    want: np.ndarray,
    tol: float,
    runs: dict[str, tuple[Mesh, list[StepResult]]],
    verdicts: dict[str, str],
    wants: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """The run as plain data (``--json``; schema in ``docs/cli.md``)."""
    schemes = []
    for name, (mesh, results) in runs.items():
        r = results[-1]
        chip0 = (0,) * len(mesh.shape)
        got = np.array([s.loss for s in results])
        mine = want if wants is None else wants[name]
        schemes.append(
            {
                "scheme": name,
                "mesh": dict(zip(mesh.axis_names, mesh.shape)),
                "losses": got.tolist(),
                "reference_losses": mine.tolist(),
                "max_relative_error": relative_error(got, mine),
                "verdict": verdicts[name],
                "model_state_bytes": {c: int(r.model_state[c][chip0]) for c in CATEGORIES},
                "peak_bytes": int(r.memory["total"][chip0]),
                "sent_bytes_per_step": sum(
                    r.trace.total("sent_bytes", phase=p) for p in ("forward", "backward", "optimizer")
                ),
            }
        )
    return {
        "command": "train",
        "sizes": {"layers": args.layers, "batch": args.batch, "d_model": args.d_model, "d_ff": args.d_ff},
        "optimizer": args.optimizer,
        "lr": lr,
        "precision": str(precision),
        "steps": args.steps,
        "reference_losses": want.tolist(),
        "tolerance": tol,
        "ok": all(v == "PASS" for v in verdicts.values()),
        "schemes": schemes,
    }


def memory_table(
    runs: dict[str, tuple[Mesh, list[StepResult]]], num_params: int, precision: Precision, opt: str
) -> str:
    """Chip 0's bytes by category when the backward pass ends, the closed form, peaks and traffic."""
    header = ("scheme", "stage", *CATEGORIES, "model state", "formula", "activations", "peak total", "sent/step")
    rows: list[tuple[str, ...]] = [header]
    try:
        name = precision.formula_name
    except ValueError:
        name = None
    for scheme, (mesh, results) in runs.items():
        r = results[-1]
        chip0 = (0,) * len(mesh.shape)
        state = {c: int(r.model_state[c][chip0]) for c in CATEGORIES}
        formula = "-"
        if name is not None and scheme in formulas.SCHEME_STAGES:
            axes = {role: mesh.axis_size(axis) for role, axis in r.axes.items()}
            formula = fmt_bytes(sum(formulas.scheme_model_state(scheme, num_params, axes, name, opt).values()))
        stage = formulas.SCHEME_STAGES.get(scheme, "-")
        sent = sum(r.trace.total("sent_bytes", phase=p) for p in ("forward", "backward", "optimizer"))
        rows.append(
            (
                scheme,
                str(stage) if scheme in ("ddp", "zero1", "zero2", "zero3", "fsdp") else f"({stage})",
                *(fmt_bytes(state[c]) for c in CATEGORIES),
                fmt_bytes(sum(state.values())),
                formula,
                fmt_bytes(int(r.memory["activations"][chip0])),
                fmt_bytes(int(r.memory["total"][chip0])),
                fmt_bytes(sent),
            )
        )
    note = (
        "Per-chip memory (chip 0): params, grads and optimizer state live when the backward pass\n"
        "ends (what the ZeRO formulas count), their closed form, the step's activation and total peaks,\n"
        "and the bytes each chip sent for weights and gradients in one step. tp and fsdp_tp shard all\n"
        "state like stage 3, over their own chips."
    )
    return note + "\n" + table_text(rows, right=range(2, len(header)))
