"""``shardsim demo``: the seed's toy MLP run through the schemes, each checked against its reference.

Each scheme runs on its own small mesh (one axis of 2 chips per role, or ``--mesh``) through
:func:`~shardsim.cli.demo_run.run_demo`; the command prints its layouts, steps, bytes,
memory and the check (:mod:`shardsim.cli.demo_text`), one PASS/FAIL line per scheme with
``--quiet``, or the numbers with ``--json``/``--csv``. ``--model`` walks one block of a small
transformer preset through ``--plan`` instead (:mod:`shardsim.transformer.demo`).

>>> from shardsim.cli import main
>>> main(["demo", "--scheme", "tp", "fsdp", "--quiet"])
tp on Mesh(Y=2): PASS
fsdp on Mesh(X=2): PASS
0
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from .. import strategies
from ..dtypes import resolve_dtype
from ..errors import CommandLineError, MeshAxisError
from .args import LIMITS, count, key_values, mesh_type, seed
from .demo_run import SEED_SIZES, DemoRun, run_demo
from .demo_text import render, summary_table
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

#: The schemes ``shardsim demo`` runs when none is named: the seed's four, in its order.
SEED_SCHEMES = ("ddp", "fsdp", "tp", "fsdp_tp")


def option_value(text: str) -> int | float | str:
    """A scheme option's value: a number when it reads as one, else the text.

    >>> option_value("4"), option_value("0.5"), option_value("gpipe")
    (4, 0.5, 'gpipe')
    """
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def check_options(scheme: strategies.Scheme, options: Mapping[str, Any]) -> None:
    """Refuse an ``--option`` the scheme does not read, naming the ones it does.

    >>> check_options(strategies.get("pp"), {"microbatchs": 2})
    Traceback (most recent call last):
    ...
    shardsim.errors.CommandLineError: --option microbatchs: pp has no such option; its options: microbatches, schedule
    """
    for key, value in options.items():
        if key not in scheme.options:
            known = ", ".join(scheme.options) or "none"
            raise CommandLineError(f"--option {key}: {scheme.name} has no such option; its options: {known}")
        if key == "microbatches" and not (isinstance(value, int) and 1 <= value <= LIMITS["microbatches"]):
            raise CommandLineError(
                f"--option microbatches={value}: expected a whole number from 1 to {LIMITS['microbatches']:,}"
            )


def demo_options(p: argparse.ArgumentParser) -> None:
    """Add ``shardsim demo``'s options to ``p``.

    >>> p = argparse.ArgumentParser()
    >>> demo_options(p)
    >>> p.parse_args(["--scheme", "ddp", "--d-model", "8"]).d_model
    8
    """
    p.add_argument(
        "--scheme",
        nargs="+",
        metavar="NAME",
        help=f"scheme(s) to run, or 'all' (default: {' '.join(SEED_SCHEMES)}); see 'shardsim schemes'",
    )
    p.add_argument(
        "--mesh",
        type=mesh_type("chips"),
        metavar="X=2,Y=4",
        help=f"one mesh for every scheme, at most {LIMITS['chips']:,} chips "
        "(default: 2 chips on one axis per role of the scheme)",
    )
    p.add_argument(
        "--axes",
        type=key_values,
        metavar="data=X,model=Y",
        help="which mesh axis plays each role (default: the axes in order, or X for data and Y for model)",
    )
    p.add_argument(
        "--batch",
        type=count("batch"),
        help="tokens B (default: the seed's 2, or the smallest power of two the scheme lays out on the mesh)",
    )
    p.add_argument("--d-model", type=count("width"), default=SEED_SIZES["d_model"], help="D (default: %(default)s)")
    p.add_argument("--d-ff", type=count("width"), default=SEED_SIZES["d_ff"], help="F (default: %(default)s)")
    p.add_argument("--activation", default="identity", help="identity, relu or gelu (default: %(default)s)")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "float64", "bfloat16"),
        help="dtype of weights and activations (default: %(default)s)",
    )
    p.add_argument("--seed", type=seed, default=0, help="random seed of weights and inputs (default: %(default)s)")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        type=key_values,
        metavar="KEY=VALUE",
        help="a setting the scheme reads (e.g. microbatches=2 for pp; 'shardsim schemes' lists them); repeatable",
    )
    p.add_argument(
        "--engine",
        default="numpy",
        choices=("numpy", "jax"),
        help="run on the stacked NumPy engine or on JAX devices (needs shardsim[jax]) (default: %(default)s)",
    )
    p.add_argument(
        "--model",
        metavar="PRESET",
        help="walk one block of a small transformer preset (gpt-tiny, llama-tiny) through --plan instead of the MLP",
    )
    p.add_argument(
        "--plan",
        action="append",
        metavar="tp=2,sp",
        help="with --model: a plan to walk (repeatable; default: tp=2, then tp=2,sp)",
    )
    p.add_argument("--quiet", action="store_true", help="print one PASS/FAIL line per scheme only")
    add_chrome_trace_option(p, "each scheme's trace")
    add_output_options(p)


@subcommand(
    "demo",
    "run the seed's toy MLP (B=2, d_model=4, d_ff=8) through the schemes and check each one",
    configure=demo_options,
)
def demo(args: argparse.Namespace) -> int:
    """``shardsim demo``: layouts, steps, bytes, memory and the check, per scheme.

    >>> p = argparse.ArgumentParser()
    >>> demo_options(p)
    >>> demo(p.parse_args(["--scheme", "fsdp_tp", "--quiet"]))
    fsdp_tp on Mesh(X=2, Y=2): PASS
    0
    """
    if args.model is not None:
        check_model_options(args)
        return demo_model(args.model, args.plan or ["tp=2", "tp=2,sp"], quiet=args.quiet)
    if args.plan:
        raise CommandLineError("--plan walks a transformer: give --model too (e.g. --model gpt-tiny --plan tp=2,sp)")
    names = scheme_names(args.scheme)
    if args.axes:
        roles = {role for name in names for role in strategies.get(name).roles}
        unknown = sorted(set(args.axes) - roles)
        if unknown:
            raise MeshAxisError(
                f"--axes names role(s) {unknown} that none of {names} has; their roles: {sorted(roles)}"
            )
    options: dict[str, Any] = {}
    for group in args.option:
        options.update({k: option_value(v) for k, v in group.items()})
    for name in names:
        check_options(strategies.get(name), options)
    if args.dtype == "bfloat16":
        resolve_dtype("bfloat16")  # a clear error now if ml_dtypes is missing
    check_output_path("--chrome-trace", args.chrome_trace)
    # run everything first: a bad option then prints one error and nothing else
    runs = [
        run_demo(
            name,
            batch=args.batch,
            d_model=args.d_model,
            d_ff=args.d_ff,
            mesh=args.mesh,
            axes=args.axes,
            activation=args.activation,
            dtype=args.dtype,
            seed=args.seed,
            options=options,
            check_memory=True,
            engine=args.engine,
        )
        for name in progress(names, len(names), "schemes", every=0)
    ]
    if args.json:
        write_json({"command": "demo", "ok": all(run.ok for run in runs), "schemes": [demo_record(r) for r in runs]})
    elif args.csv:
        write_csv([demo_row(run) for run in runs])
    elif args.quiet:
        for run in runs:
            print(f"{run.result.scheme} on {run.result.mesh}: {'PASS' if run.ok else 'FAIL'}")
    else:
        for run in runs:
            print(render(run, dtype=args.dtype, activation=args.activation))
            print()
        print("Summary (bytes per chip; ring collectives)")
        print(summary_table(runs))
        failed = [run.result.scheme for run in runs if not run.ok]
        print("all checks PASS" if not failed else f"FAIL: {', '.join(failed)}")
    traces = {run.result.scheme: run.result.trace for run in runs}
    write_chrome_trace_option(traces, args.chrome_trace, quiet=args.json or args.csv or args.quiet)
    return 0 if all(run.ok for run in runs) else 1


# an exact walk holds every weight on the host, with its gradient and the reference's copy
MODEL_WALK_PARAMS = 1 << 22


#: The MLP demo's options and their defaults: ``--model`` walks a preset at its own sizes and
#: prints text, so it reads none of them (``--quiet`` it honours).
MLP_ONLY_OPTIONS: dict[str, Any] = {
    "scheme": None, "mesh": None, "axes": None, "batch": None, "d_model": SEED_SIZES["d_model"],
    "d_ff": SEED_SIZES["d_ff"], "activation": "identity", "dtype": "float32", "seed": 0, "option": [],
    "engine": "numpy", "json": False, "csv": False, "chrome_trace": None,
}  # fmt: skip


def check_model_options(args: argparse.Namespace) -> None:
    """Refuse, by name, the MLP demo's options given beside ``--model`` (they would be ignored).

    >>> check_model_options(argparse.Namespace(model="gpt-tiny", seed=3))
    Traceback (most recent call last):
    ...
    shardsim.errors.CommandLineError: --seed: the MLP demo's option(s); --model gpt-tiny walks ...
    """
    given = [name for name, default in MLP_ONLY_OPTIONS.items() if getattr(args, name, default) != default]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise CommandLineError(
            f"{flags}: the MLP demo's option(s); --model {args.model} walks the preset's own sizes under --plan and "
            f"prints text, so drop them (its step time and bytes as JSON: shardsim estimate --model {args.model} "
            "--batch-tokens N --json)"
        )


def demo_model(model: str, plans: list[str], *, quiet: bool = False) -> int:
    """``shardsim demo --model``: one block of a small transformer, step by step, under each plan
    (with ``quiet``, one PASS/FAIL line per plan).

    >>> demo_model("gpt-tiny", ["tp=2"], quiet=True)
    gpt-tiny under tp=2: PASS
    0
    """
    from ..models import get
    from ..transformer.demo import walk

    cfg = get(model)
    if cfg.param_count() > MODEL_WALK_PARAMS:
        raise CommandLineError(
            f"--model {model} has {cfg.param_count():,} parameters; the exact walk-through runs small presets "
            f"(at most {MODEL_WALK_PARAMS:,}: gpt-tiny, llama-tiny, moe-tiny); size {model} shape-only with "
            "'shardsim estimate'"
        )
    for plan in plans:  # every plan before any walk: a bad one prints one error and nothing else
        check_walk_plan(plan)
    texts = [walk(cfg, plan) for plan in plans]
    passed = [t.rstrip().endswith("PASS") for t in texts]
    if quiet:
        for plan, ok in zip(plans, passed):
            print(f"{model} under {plan}: {'PASS' if ok else 'FAIL'}")
    else:
        print("\n\n".join(texts))
    return 0 if all(passed) else 1


def check_walk_plan(text: str) -> None:
    """Refuse a ``--plan`` that is empty or needs more chips than a demo holds (each chip holds NumPy blocks).

    >>> check_walk_plan("tp=2,sp")
    >>> check_walk_plan(" ")
    Traceback (most recent call last):
    ...
    shardsim.errors.CommandLineError: --plan ' ' is empty; name the plan to walk, e.g. --plan tp=2 or --plan tp=2,sp
    """
    from ..plans import Plan

    if not text.strip():
        raise CommandLineError(f"--plan {text!r} is empty; name the plan to walk, e.g. --plan tp=2 or --plan tp=2,sp")
    chips = Plan.parse(text).chips
    if chips > LIMITS["chips"]:
        raise CommandLineError(
            f"--plan {text} needs {chips:,} chips; a walk-through holds every chip's blocks, at most "
            f"{LIMITS['chips']:,} chips: use smaller degrees, or size it shape-only with 'shardsim estimate --model'"
        )


def demo_row(run: DemoRun) -> dict[str, Any]:
    """The summary table's row of one scheme, as numbers (``--csv``)."""
    r = run.result
    return {
        "scheme": r.scheme,
        "mesh": ",".join(f"{a}={n}" for a, n in zip(r.mesh.axis_names, r.mesh.shape)),
        "batch": run.inputs["x"].shape[0],
        "forward_sent_bytes": r.trace.total("sent_bytes", "forward"),
        "backward_sent_bytes": r.trace.total("sent_bytes", "backward"),
        "forward_flops": r.trace.total("flops", "forward"),
        "backward_flops": r.trace.total("flops", "backward"),
        "peak_bytes": int(r.memory["total"].max()),
        "ok": run.ok,
    }


def demo_record(run: DemoRun) -> dict[str, Any]:
    """One scheme's demo as plain data (``--json``; schema in ``docs/cli.md``)."""
    r = run.result
    return {
        **demo_row(run),
        "mesh": dict(zip(r.mesh.axis_names, r.mesh.shape)),
        "axes": dict(r.axes),
        "shapes": {k: list(v.shape) for k, v in run.inputs.items()},
        "layouts": dict(r.layouts),
        "steps": [
            {
                "phase": e.phase,
                "op": e.op,
                "axes": list(e.axes),
                "label": e.label,
                "layout": e.after,
                "sent_bytes": e.sent_bytes,
                "flops": e.flops,
            }
            for e in r.trace
        ],
        "peak_bytes_by_category": {c: int(v.max()) for c, v in r.memory.items()},
        "checks": [
            {"value": name, "max_abs_error": err, "tolerance": tol, "ok": ok} for name, err, tol, ok in run.checks
        ],
    }


def scheme_names(requested: Sequence[str] | None) -> list[str]:
    """The schemes ``--scheme`` names, each once, in order (``all``: every registered one; none:
    the seed's four).

    >>> scheme_names(None), scheme_names(["tp,ddp", "tp"])
    (['ddp', 'fsdp', 'tp', 'fsdp_tp'], ['tp', 'ddp'])
    """
    if requested is None:
        return [n for n in SEED_SCHEMES if n in strategies.names()]
    names: list[str] = []
    for item in requested:
        for name in filter(None, (s.strip() for s in item.split(","))):
            for n in strategies.names() if name == "all" else [strategies.get(name).name]:
                if n not in names:
                    names.append(n)
    if not names:
        raise CommandLineError(f"--scheme {' '.join(requested)!r} names no scheme; e.g. --scheme ddp, or all")
    return names
