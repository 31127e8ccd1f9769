"""The cost model on the command line: ``shardsim estimate``, ``sweep`` and ``critical``.

Each pair is ``add_*_arguments(parser)`` (fills an argparse sub-parser) and ``cli_*(args)``
(runs it, prints, returns an exit code). Every run is shape-only, so no size allocates
anything; sizes, chips, layers and sweep points are still bounded (``docs/cli.md``,
"Limits") so that no invocation runs for hours. ``--json`` and ``--csv`` print the
numbers of the Python API (:func:`~shardsim.cost.estimate`, :func:`~shardsim.cost.sweep`,
:func:`~shardsim.cost.critical_batch`) unformatted.

>>> import argparse
>>> p = argparse.ArgumentParser()
>>> add_estimate_arguments(p)
>>> cli_estimate(p.parse_args(["--scheme", "fsdp", "--hardware", "v5p", "--mesh", "X=16",
...                            "--per-chip-batch", "4096", "--width", "40"]))  # doctest: +ELLIPSIS
fsdp on Mesh(X=16) (tpu-v5p), B=65536 tokens (4096/chip), D=8192, F=32768, 1 layer(s)
step ... ms: compute ... ms, comm ... ms (under compute ..., exposed ...)
MFU ...%, compute-bound: forward comm X ... ms <= FLOPs ... ms in the worst phase and axis
memory ... GB per chip of 96 GB
...
0
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from typing import Any

from .._format import table_text
from ..cost import (
    Critical,
    Estimate,
    Hardware,
    best_split,
    critical_batch,
    estimate,
    get_hardware,
    hardware_names,
    scheme_mesh,
    sweep,
)
from ..cost.changes import Fix
from ..cost.defaults import HARDWARE, line
from ..errors import CommandLineError
from ..mesh import Mesh
from ..plans import Plan
from ..strategies.base import ROLE_DEFAULTS
from .args import LIMITS, count, key_values, mesh_type
from .framework import subcommand
from .output import (
    add_chrome_trace_option,
    add_output_options,
    check_output_path,
    write_chrome_trace_option,
    write_csv,
    write_json,
    write_png_option,
)

COST_SCHEMES = ("ddp", "fsdp", "tp", "fsdp_tp")


def add_estimate_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``shardsim estimate``."""
    _common(parser)
    parser.add_argument("--scheme", help="a registered scheme, see 'shardsim schemes' (default fsdp)")
    _mesh_options(parser, "mesh axes, e.g. X=16 or X=64,Y=4 (default: --chips laid out for the scheme)")
    parser.add_argument(
        "--chips",
        type=count("cost_chips"),
        help="chips when --mesh is not given (default 16); with --model, the plan's product (checked)",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--batch", type=count("batch"), help="global batch in tokens")
    size.add_argument("--per-chip-batch", type=count("batch"), help="tokens per chip (default 4096)")
    model = parser.add_argument_group("a model under a plan (instead of --scheme and --mesh)")
    which = model.add_mutually_exclusive_group()
    which.add_argument("--model", help="a model preset, e.g. llama3-70b, gpt3-175b (shardsim.models.names())")
    which.add_argument("--hf-config", help="a Hugging Face config.json (or its folder) instead of a preset")
    plan = model.add_mutually_exclusive_group()
    plan.add_argument("--plan", help="the plan, e.g. dp=16,tp=8,pp=4,zero=1,microbatches=16 (default dp=--chips)")
    plan.add_argument(
        "--megatron",
        help="Megatron-LM's flags in quotes instead of --plan, --batch-tokens and --seq (the world size is --chips)",
    )
    plan.add_argument(
        "--deepspeed", help="a DeepSpeed JSON configuration instead of --plan and --batch-tokens (with --chips, --seq)"
    )
    plan.add_argument(
        "--torchtitan",
        help="a torchtitan TOML job configuration instead of --plan, --batch-tokens and --seq (with --chips)",
    )
    model.add_argument(
        "--batch-tokens",
        type=tokens_type,
        help="global batch in tokens; K, M, G, T are powers of 2 (16M = 2**24 = 2,048 x 8,192)",
    )
    model.add_argument("--seq", type=count("batch"), help="sequence length (default: the model's context)")
    model.add_argument(
        "--train-tokens", type=tokens_type, help="a token budget: also print the days it takes (e.g. 15e12)"
    )
    model.add_argument("--optimizer", default="adam", help="sgd, momentum, adam, adamw (default adam)")
    model.add_argument("--precision", help="fp32, bf16, fp16... (default: the plan's, else bf16)")
    parser.add_argument("--no-overlap", action="store_true", help="run communication and compute one after the other")
    parser.add_argument(
        "--width", type=count("columns", low=20), default=100, help="width of the text time line (default 100)"
    )
    parser.add_argument("--png", help="also save the time line as a PNG (needs shardsim[plot])")
    add_chrome_trace_option(parser, "the time line")
    parser.add_argument("--breakdown", action="store_true", help="print the time of every collective")
    parser.add_argument("--critical", action="store_true", help="print the scheme's critical batch on this hardware")
    parser.add_argument(
        "--efficiency",
        choices=("ideal", "calibrated"),
        default="calibrated",
        help="calibrated: measured matmul and collective rates (default); ideal: the book's peak rates",
    )
    add_output_options(parser)


@subcommand("estimate", "time one training step of a scheme on real hardware", configure=add_estimate_arguments)
def cli_estimate(args: argparse.Namespace) -> int:
    """Run ``shardsim estimate``: summary, text time line, optional breakdown, PNG, critical batch."""
    if args.model is not None or args.hf_config is not None:
        return cli_model_estimate(args)
    for flag in ("plan", "batch_tokens", "seq", "train_tokens", "precision"):
        if getattr(args, flag) is not None:
            raise CommandLineError(f"--{flag.replace('_', '-')} belongs to a model estimate: give --model too")
    args.scheme = "fsdp" if args.scheme is None else args.scheme
    args.chips = 16 if args.chips is None else args.chips
    args.per_chip_batch = 4096 if args.per_chip_batch is None else args.per_chip_batch
    hw = _hardware(args)
    scheme = _scheme(args.scheme)
    _check_png(args.png)
    check_output_path("--chrome-trace", args.chrome_trace)
    split = scheme == "fsdp_tp" and not args.mesh  # the chips' best X x Y split, as best_split finds it
    if args.mesh:
        mesh = Mesh(args.mesh)
    elif split:
        mesh = Mesh(X=args.chips)
    elif len(_roles(scheme)) > 1:
        example = ",".join(f"{ROLE_DEFAULTS[r]}=2" for r in _roles(scheme))
        raise CommandLineError(f"{scheme} needs --mesh with an axis for each of its roles, e.g. --mesh {example}")
    else:
        mesh = scheme_mesh(scheme, args.chips)
    batch = args.batch if args.batch is not None else args.per_chip_batch * mesh.size
    if batch > LIMITS["batch"]:
        raise CommandLineError(f"--per-chip-batch x {mesh.size} chips is {batch:,} tokens; the limit is 2**34")
    if split:
        est = best_split(
            hw,
            batch,
            args.d_model,
            args.d_ff,
            chips=args.chips,
            layers=args.layers,
            overlap=not args.no_overlap,
            links=args.links,
            efficiency=args.efficiency,
        )
        mesh = est.mesh
        if not (args.json or args.csv):
            print(f"fsdp_tp on {args.chips} chips: the fastest split is {mesh} (--mesh sets one)")
    else:
        est = estimate(
            scheme,
            mesh,
            hw,
            batch,
            args.d_model,
            args.d_ff,
            args.layers,
            not args.no_overlap,
            links=args.links,
            efficiency=args.efficiency,
        )
    crit = (
        critical_batch(scheme, hw, args.d_ff, d_model=args.d_model, mesh=mesh, links=args.links)
        if args.critical
        else None
    )
    _hardware_default(est, args)
    if args.json:
        record = estimate_record(est)
        record["collectives"] = est.breakdown("collective")
        record["defaults"] = est.defaults
        if crit is not None:
            record["critical"] = critical_record(crit)
        write_json(record)
    elif args.csv:
        write_csv(est.breakdown("collective") if args.breakdown else [estimate_record(est)])
    else:
        print(est.summary())
        print(est.timeline.text(args.width))
        if args.breakdown:
            _print_breakdown(est)
        if crit is not None:
            print(crit)
    if args.png:
        _png(lambda: est.timeline.plot(), args.png, quiet=args.json or args.csv)
    write_chrome_trace_option({est.scheme: est.timeline}, args.chrome_trace, quiet=args.json or args.csv)
    return 0


def cli_model_estimate(args: argparse.Namespace) -> int:
    """``shardsim estimate --model M --plan P``: the model's summary, its time line, optional
    breakdown, PNG and Chrome trace; ``--json`` the record :func:`model_record` gives."""
    from ..models import get as get_model
    from ..models.hf import from_hf_config

    named = f"--model {args.model}" if args.model is not None else f"--hf-config {args.hf_config}"
    mlp = {"scheme": None, "mesh": None, "batch": None, "per_chip_batch": None, "critical": False}
    given = [k for k, v in mlp.items() if getattr(args, k) != v]
    given += [k for k, v in {"d_model": 8192, "d_ff": 32768, "layers": 1}.items() if getattr(args, k) != v]
    if given:
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in given)
        raise CommandLineError(f"{flags}: the MLP's options; {named} has its own sizes, give --plan")
    cfg = get_model(args.model) if args.model is not None else from_hf_config(args.hf_config, seq=args.seq)
    _read_launch(args, cfg)
    if args.batch_tokens is None:
        raise CommandLineError(f"{named.split()[0]} needs --batch-tokens, the global batch in tokens (e.g. 16M)")
    plan = Plan.parse(args.plan) if args.plan else Plan(dp=args.chips or 1)
    hw = _hardware(args)
    _check_png(args.png)
    check_output_path("--chrome-trace", args.chrome_trace)
    est = estimate(
        cfg, plan, hw, batch_tokens=args.batch_tokens, seq=args.seq, chips=args.chips, links=args.links,
        efficiency=args.efficiency, optimizer=args.optimizer, precision=args.precision, overlap=not args.no_overlap,
    )  # fmt: skip
    _hardware_default(est, args)
    if args.json:
        record = model_record(est, args.train_tokens)
        record["collectives"] = est.breakdown("collective")
        record["defaults"] = est.defaults
        record["fixes"] = [fix_record(f) for f in est.fixes or []]
        write_json(record)
    elif args.csv:
        write_csv(est.breakdown("collective") if args.breakdown else [model_record(est, args.train_tokens)])
    else:
        print(est.summary())
        if args.train_tokens is not None:
            print(f"{args.train_tokens:,} tokens: {est.days(args.train_tokens):,.1f} days at this step")
        print(est.timeline.text(args.width))
        if args.breakdown:
            _print_breakdown(est)
    if args.png:
        _png(lambda: est.timeline.plot(), args.png, quiet=args.json or args.csv)
    write_chrome_trace_option({str(est.plan): est.timeline}, args.chrome_trace, quiet=args.json or args.csv)
    return 0


def _read_launch(args: argparse.Namespace, cfg: Any) -> None:
    """``--megatron``, ``--torchtitan`` or ``--deepspeed``: the plan, the batch and the sequence
    set on ``args`` as the launch's configuration gives them (DeepSpeed's gives no sequence)."""
    from ..frameworks import from_deepspeed, from_megatron, from_torchtitan

    readers: dict[str, tuple[Any, tuple[str, ...]]] = {
        "megatron": (lambda: from_megatron(args.megatron, world_size=args.chips, model=cfg), ("batch_tokens", "seq")),
        "torchtitan": (
            lambda: from_torchtitan(args.torchtitan, world_size=args.chips, layers=cfg.layers),
            ("batch_tokens", "seq"),
        ),
        "deepspeed": (lambda: from_deepspeed(args.deepspeed, world_size=args.chips, seq=args.seq), ("batch_tokens",)),
    }
    for name, (read, gives) in readers.items():
        if getattr(args, name) is None:
            continue
        for flag in gives:
            if getattr(args, flag) is not None:
                raise CommandLineError(f"--{flag.replace('_', '-')}: --{name} gives it, from its own configuration")
        needs = {"chips": "--chips (the world size)", "seq": "--seq (the sequence length)"}
        missing = [text for key, text in needs.items() if key not in gives and getattr(args, key) is None]
        if missing:
            raise CommandLineError(f"--{name} needs {' and '.join(missing)}")
        launch = read()
        args.plan, args.batch_tokens, args.seq = str(launch.plan), launch.batch_tokens, launch.seq


def model_record(e: Any, train_tokens: int | None = None) -> dict[str, Any]:
    """A model estimate as plain numbers (``--model --json``; schema in ``docs/cli.md``)."""
    return {
        "model": e.cfg.name,
        "parameters": e.cfg.param_count(),
        "plan": str(e.plan),
        "hardware": e.hardware.name,
        "mesh": ",".join(f"{a}={n}" for a, n in zip(e.mesh.axis_names, e.mesh.shape)),
        "chips": e.chips,
        "batch_tokens": e.batch,
        "seq": e.seq,
        "step_s": e.step_s,
        "compute_s": e.compute_s,
        "comm_s": e.comm_s,
        "comm_exposed_s": e.comm_exposed_s,
        "bubble_s": e.bubble_s,
        "tokens_per_s": e.tokens_per_s,
        "model_flops": e.model_flops,
        "six_nt": e.six_nt,
        "mfu": e.mfu,
        "bound": e.bound,
        "bound_reason": e.bound_reason(),
        "bubble": e.bubble,
        "bubble_closed_form": e.bubble_closed_form,
        "memory_bytes": e.memory.get("total", 0),
        "memory_by_category": {k: v for k, v in e.memory.items() if k != "total"},
        "hbm_bytes": e.hardware.hbm_capacity,
        "fits": e.fits,
        "shortfall_bytes": e.shortfall,
        "efficiency": e.efficiency.describe(),
        "warnings": list(e.warnings),
        "train_tokens": train_tokens,
        "days": None if train_tokens is None else e.days(train_tokens),
    }


def fix_record(f: Fix) -> dict[str, Any]:
    """One change that makes the plan fit (:class:`~shardsim.cost.changes.Fix`) as plain values."""
    return {"change": f.change, "plan": str(f.plan), "memory_bytes": f.memory, "step_s": f.step_s}


def tokens_type(text: str) -> int:
    """A token count: digits, optionally with a binary suffix K, M, G or T (powers of 2, as batch
    sizes are: ``16M`` = 2**24), or e-notation for a decimal count (``15e12``).

    >>> tokens_type("16M"), tokens_type("4k"), tokens_type("15e12")
    (16777216, 4096, 15000000000000)
    >>> tokens_type("1.5M")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a whole number of tokens such as 4096, 16M (2**24) or 15e12, got '1.5M'
    """
    usage = f"expected a whole number of tokens such as 4096, 16M (2**24) or 15e12, got {text!r}"
    t = text.strip().upper().replace("_", "").replace(",", "")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(t[-1:], 1)
    digits = t[:-1] if scale > 1 else t
    try:
        n = int(digits) * scale if digits.isdigit() else float(digits)
    except ValueError:
        raise argparse.ArgumentTypeError(usage) from None
    if isinstance(n, float) and (scale > 1 or not math.isfinite(n) or n != int(n)):
        raise argparse.ArgumentTypeError(usage)
    n = int(n)
    if not 1 <= n <= 2**60:
        raise argparse.ArgumentTypeError(f"expected a token count from 1 to 2**60, got {text!r}")
    return n


def _print_breakdown(est: Estimate) -> None:
    rows = [("phase", "op", "axes", "label", "count", "ms", "exposed ms", "limit")]
    for r in est.breakdown("collective"):
        times = f"{r['seconds'] * 1e3:.4g}", f"{r['exposed_s'] * 1e3:.4g}"
        rows.append((r["phase"], r["op"], r["axes"], r["label"], str(r["count"]), *times, r["limit"]))
    print(table_text(rows, right={4, 5, 6}))


def estimate_record(e: Estimate) -> dict[str, Any]:
    """One estimate as plain numbers (``--json`` and ``--csv``; schema in ``docs/cli.md``)."""
    return {
        "scheme": e.scheme,
        "hardware": e.hardware.name,
        "mesh": ",".join(f"{a}={n}" for a, n in zip(e.mesh.axis_names, e.mesh.shape)),
        "chips": e.chips,
        "batch": e.batch,
        "per_chip_batch": e.per_chip_batch,
        "d_model": e.d_model,
        "d_ff": e.d_ff,
        "layers": e.layers,
        "dtype": e.dtype,
        "step_s": e.step_s,
        "compute_s": e.compute_s,
        "comm_s": e.comm_s,
        "comm_hidden_s": e.comm_hidden_s,
        "comm_under_compute_s": e.timeline.comm_under_compute_s,
        "comm_exposed_s": e.comm_exposed_s,
        "bubble_s": e.bubble_s,
        "mfu": e.mfu,
        "bound": e.bound,
        "memory_bytes": e.memory.get("total", 0),
        "hbm_bytes": e.hardware.hbm_capacity,
        "fits": e.fits,
    }


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``shardsim sweep``."""
    _common(parser)
    parser.add_argument("--schemes", default=",".join(COST_SCHEMES), help="comma-separated schemes")
    parser.add_argument("--chips", type=count("cost_chips"), default=256, help="chips (default 256)")
    parser.add_argument(
        "--batches", default="64:65536:12", help="per-chip batches: a list 512,1024 or lo:hi:count (log-spaced)"
    )
    parser.add_argument("--png", help="save the crossover plot (MFU and step time vs batch) as a PNG")
    add_output_options(parser)


@subcommand("sweep", "step time and MFU against batch for every scheme", configure=add_sweep_arguments)
def cli_sweep(args: argparse.Namespace) -> int:
    """Run ``shardsim sweep``: a table of step time and MFU per scheme and per-chip batch."""
    hw = _hardware(args)
    schemes = [_scheme(s.strip()) for s in args.schemes.split(",") if s.strip()]
    if not schemes:
        raise CommandLineError(f"--schemes {args.schemes!r} names no scheme; e.g. --schemes ddp,fsdp")
    batches = parse_batches(args.batches)
    points = len(schemes) * len(batches)
    if points > LIMITS["sweep_points"]:
        raise CommandLineError(
            f"{len(schemes)} schemes x {len(batches)} batches is {points:,} estimates; the limit is "
            f"{LIMITS['sweep_points']:,}: fewer --batches (lo:hi:count) or --schemes"
        )
    if max(batches) * args.chips > LIMITS["batch"]:
        raise CommandLineError(f"--batches {max(batches):,} x {args.chips} chips is past the 2**34-token limit")
    _check_png(args.png)
    rows = sweep(schemes, hw, batches, args.d_model, args.d_ff, chips=args.chips, layers=args.layers)
    if args.json:
        write_json({"hardware": hw.name, "chips": args.chips, "rows": [estimate_record(e) for e in rows]})
    elif args.csv:
        write_csv([estimate_record(e) for e in rows])
    else:
        print(f"{hw.name}, {args.chips} chips, D={args.d_model}, F={args.d_ff}, {args.layers} layer(s)")
        if args.hardware is None:
            print(line({"hardware": HARDWARE}))
        print(f"{'scheme':<9}{'tokens/chip':>12}{'mesh':>20}{'step ms':>11}{'MFU':>8}  bound")
        for e in rows:
            mesh = ",".join(f"{a}={n}" for a, n in zip(e.mesh.axis_names, e.mesh.shape))
            print(f"{e.scheme:<9}{e.per_chip_batch:>12g}{mesh:>20}{e.step_s * 1e3:>11.4g}{e.mfu:>8.1%}  {e.bound}")
    if args.png:
        from ..cost.crossover import crossover_png

        _png(lambda: crossover_png({hw.name: rows}), args.png, quiet=args.json or args.csv)
    return 0


def add_critical_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``shardsim critical``."""
    _common(parser)
    parser.add_argument("--scheme", default="fsdp", help="a registered scheme, see 'shardsim schemes' (default fsdp)")
    _mesh_options(parser, "a fixed mesh, e.g. X=16 (default: --chips laid out for the scheme)")
    parser.add_argument(
        "--chips", type=count("cost_chips"), help="chips (default: a ring of 16 TPUs or a node of 8 GPUs)"
    )
    add_output_options(parser, table=False)


@subcommand("critical", "the per-chip batch above which a scheme is compute-bound", configure=add_critical_arguments)
def cli_critical(args: argparse.Namespace) -> int:
    """Run ``shardsim critical``: the tokens per chip above which the scheme is compute-bound.

    >>> import argparse
    >>> p = argparse.ArgumentParser()
    >>> add_critical_arguments(p)
    >>> cli_critical(p.parse_args(["--scheme", "ddp", "--hardware", "h100", "--chips", "256"]))
    ddp on Mesh(X=256) (h100): compute-bound above 2475.0 tokens per chip (closed form 2475.0)
    0
    """
    hw = _hardware(args)
    mesh = Mesh(args.mesh) if args.mesh else None
    c = critical_batch(
        _scheme(args.scheme), hw, args.d_ff, d_model=args.d_model, chips=args.chips, mesh=mesh, links=args.links
    )
    if args.json:
        write_json(critical_record(c))
        return 0
    print(c)
    if args.hardware is None:
        print(line({"hardware": HARDWARE}))
    for y, b in c.splits.items():  # fsdp_tp: every split tried
        shown = "communication-bound at every batch" if math.isinf(b) else f"{b:.1f} tokens per chip"
        print(f"  X={c.mesh.size // y}, Y={y}: {shown}")
    return 0


def critical_record(c: Critical) -> dict[str, Any]:
    """A critical batch as plain numbers; ``per_chip_batch`` is null when never compute-bound."""
    return {
        "scheme": c.scheme,
        "hardware": c.hardware,
        "mesh": ",".join(f"{a}={n}" for a, n in zip(c.mesh.axis_names, c.mesh.shape)),
        "per_chip_batch": c.per_chip_batch,
        "closed_form": c.closed_form,
        "x_opt": c.x_opt,
        "bandwidth": c.bandwidth,
        "splits": {f"X={c.mesh.size // y},Y={y}": b for y, b in c.splits.items()},
    }


def parse_batches(text: str) -> list[int]:
    """``"512,1024"`` or ``"lo:hi:count"`` (log-spaced integers, duplicates dropped); every
    batch a whole number of at least 1, at most 1,000 of them.

    >>> parse_batches("100:10000:3")
    [100, 1000, 10000]
    >>> parse_batches("1:2")
    Traceback (most recent call last):
    ...
    shardsim.errors.CommandLineError: --batches '1:2': write lo:hi:count (e.g. 64:65536:12) or a list 512,1024
    """
    usage = f"--batches {text!r}: write lo:hi:count (e.g. 64:65536:12) or a list 512,1024"
    limit = LIMITS["sweep_points"]
    if ":" in text:
        try:
            lo, hi, n = (float(v) for v in text.split(":"))
        except ValueError:
            raise CommandLineError(usage) from None
        if not (math.isfinite(lo) and math.isfinite(hi) and 1 <= lo <= hi <= LIMITS["batch"]):
            raise CommandLineError(f"{usage}, with 1 <= lo <= hi <= 2**34")
        if not (math.isfinite(n) and n == int(n) and 2 <= n <= limit):
            raise CommandLineError(f"{usage}, with a count from 2 to {limit:,}")
        steps = int(n) - 1
        values = [round(math.exp(math.log(lo) + i * (math.log(hi) - math.log(lo)) / steps)) for i in range(steps + 1)]
        return sorted(dict.fromkeys(max(1, v) for v in values))
    items = [v.strip() for v in text.split(",") if v.strip()]
    if not 1 <= len(items) <= limit:
        raise CommandLineError(f"{usage}: 1 to {limit:,} batches")
    batches = []
    for item in items:
        try:
            b = int(item)
        except ValueError:
            raise CommandLineError(f"{usage}: {item!r} is not a whole number") from None
        if not 1 <= b <= LIMITS["batch"]:
            raise CommandLineError(f"{usage}: every batch from 1 to 2**34 tokens per chip, got {b}")
        batches.append(b)
    return batches


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hardware", help=f"one of {', '.join(hardware_names())} (default {HARDWARE})")
    parser.add_argument("--d-model", type=count("width"), default=8192, help="d_model (default 8192)")
    parser.add_argument("--d-ff", type=count("width"), default=32768, help="d_ff (default 32768)")
    parser.add_argument("--layers", type=count("cost_layers"), default=1, help="layers (default 1)")
    parser.add_argument(
        "--exact-rings", action="store_true", help="keep (N-1)/N on every ring (default: the book's V/W)"
    )


def _mesh_options(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--mesh", type=mesh_type("cost_chips"), metavar="X=16,Y=4", help=help)
    parser.add_argument(
        "--links",
        type=key_values,
        metavar="X=dcn",
        help="the hardware network each mesh axis runs on (default: the fastest that holds it)",
    )


def _scheme(name: str) -> str:
    """A registered scheme's name, or the registry's error naming the known ones."""
    from .. import strategies

    return strategies.get(name).name


def _roles(name: str) -> tuple[str, ...]:
    from .. import strategies

    return strategies.get(name).roles


def _hardware(args: argparse.Namespace) -> Hardware:
    hw = get_hardware(HARDWARE if args.hardware is None else args.hardware)
    return hw.with_(ring="exact") if args.exact_rings else hw


def _hardware_default(est: Estimate, args: argparse.Namespace) -> None:
    """Name the command line's hardware among the estimate's defaults when ``--hardware`` was not given."""
    if args.hardware is None:
        est.defaults = {"hardware": HARDWARE, **est.defaults}


def _check_png(path: str | None) -> None:
    """Refuse a ``--png`` that cannot be written, or drawn without matplotlib, before any work is done."""
    check_output_path("--png", path)
    if path is not None and importlib.util.find_spec("matplotlib") is None:
        raise CommandLineError(f"--png {path!r} needs matplotlib to draw: pip install 'shardsim[plot]'")


def _png(draw: Any, path: str, *, quiet: bool) -> None:
    """Draw the figure (``draw()``) and save it as ``--png``'s ``path`` the safe way."""
    try:
        figure = draw()
    except ImportError as e:
        raise CommandLineError(f"--png: {e}") from None
    write_png_option(figure, path, quiet=quiet)
