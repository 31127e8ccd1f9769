"""Command-line front ends of the cost model, for ``shardsim estimate`` and ``shardsim sweep``.

Each pair is ``add_*_arguments(parser)`` (fills an argparse sub-parser) and ``cli_*(args)``
(runs it, prints, returns an exit code): ``estimate``, ``sweep`` and ``critical``.

>>> import argparse
>>> p = argparse.ArgumentParser()
>>> add_estimate_arguments(p)
>>> cli_estimate(p.parse_args(["--scheme", "fsdp", "--hardware", "v5p", "--mesh", "X=16",
...                            "--per-chip-batch", "4096", "--width", "40"]))  # doctest: +ELLIPSIS
fsdp on Mesh(X=16) (tpu-v5p), B=65536 tokens (4096/chip), D=8192, F=32768, 1 layer(s)
step ... ms: compute ... ms, comm ... ms (hidden ..., exposed ...)
MFU ...%, compute-bound; memory ... GB per chip of 96 GB
...
0
"""

from __future__ import annotations

import argparse
import math

from .._options import pairs
from ..errors import ShardsimError
from ..mesh import Mesh
from .critical import critical_batch, scheme_mesh
from .estimator import estimate, sweep
from .hardware import Hardware
from .presets import get_hardware, hardware_names


def add_estimate_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``shardsim estimate``."""
    _common(parser)
    parser.add_argument("--scheme", default="fsdp", help="ddp, fsdp, tp or fsdp_tp (default fsdp)")
    parser.add_argument("--mesh", help="mesh axes, e.g. X=16 or X=64,Y=4 (default: --chips laid out for the scheme)")
    parser.add_argument("--chips", type=int, default=16, help="chips when --mesh is not given (default 16)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--batch", type=int, help="global batch in tokens")
    size.add_argument("--per-chip-batch", type=int, default=4096, help="tokens per chip (default 4096)")
    parser.add_argument("--no-overlap", action="store_true", help="run communication and compute one after the other")
    parser.add_argument("--width", type=int, default=100, help="width of the text time line")
    parser.add_argument("--png", help="also save the time line as a PNG (needs shardsim[plot])")
    parser.add_argument("--breakdown", action="store_true", help="print the time of every collective")
    parser.add_argument("--critical", action="store_true", help="print the scheme's critical batch on this hardware")
    parser.add_argument(
        "--efficiency",
        choices=("ideal", "calibrated"),
        default="calibrated",
        help="calibrated: measured matmul and collective rates (default); ideal: the book's peak rates",
    )


def cli_estimate(args: argparse.Namespace) -> int:
    """Run ``shardsim estimate``: summary, text time line, optional breakdown, PNG, critical batch."""
    hw = _hardware(args)
    if args.mesh:
        mesh = parse_mesh(args.mesh)
    elif args.scheme == "fsdp_tp":
        raise ShardsimError("fsdp_tp needs --mesh X=...,Y=...")
    else:
        mesh = scheme_mesh(args.scheme, args.chips)
    batch = args.batch if args.batch is not None else args.per_chip_batch * mesh.size
    overlap = not args.no_overlap
    est = estimate(
        args.scheme, mesh, hw, batch, args.d_model, args.d_ff, args.layers, overlap, efficiency=args.efficiency
    )
    print(est.summary())
    print(est.timeline.text(args.width))
    if args.breakdown:
        print(f"{'phase':<9}{'op':<15}{'axes':<5}{'label':<10}{'count':>6}{'ms':>10}{'exposed':>10}  limit")
        for r in est.breakdown("collective"):
            print(
                f"{r['phase']:<9}{r['op']:<15}{r['axes']:<5}{r['label']:<10}{r['count']:>6}"
                f"{r['seconds'] * 1e3:>10.4g}{r['exposed_s'] * 1e3:>10.4g}  {r['limit']}"
            )
    if args.critical:
        print(critical_batch(args.scheme, hw, args.d_ff, d_model=args.d_model, mesh=mesh))
    if args.png:
        est.timeline.plot(args.png)
        print(f"wrote {args.png}")
    return 0


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``shardsim sweep``."""
    _common(parser)
    parser.add_argument("--schemes", default="ddp,fsdp,tp,fsdp_tp", help="comma-separated schemes")
    parser.add_argument("--chips", type=int, default=256, help="chips (default 256)")
    parser.add_argument(
        "--batches", default="64:65536:12", help="per-chip batches: a list 512,1024 or lo:hi:count (log-spaced)"
    )
    parser.add_argument("--png", help="save the crossover plot (MFU and step time vs batch) as a PNG")


def cli_sweep(args: argparse.Namespace) -> int:
    """Run ``shardsim sweep``: a table of step time and MFU per scheme and per-chip batch."""
    hw = _hardware(args)
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    batches = parse_batches(args.batches)
    rows = sweep(schemes, hw, batches, args.d_model, args.d_ff, chips=args.chips, layers=args.layers)
    print(f"{hw.name}, {args.chips} chips, D={args.d_model}, F={args.d_ff}, {args.layers} layer(s)")
    print(f"{'scheme':<9}{'tokens/chip':>12}{'mesh':>20}{'step ms':>11}{'MFU':>8}  bound")
    for e in rows:
        mesh = ",".join(f"{a}={n}" for a, n in zip(e.mesh.axis_names, e.mesh.shape))
        print(f"{e.scheme:<9}{e.per_chip_batch:>12g}{mesh:>20}{e.step_s * 1e3:>11.4g}{e.mfu:>8.1%}  {e.bound}")
    if args.png:
        from .crossover import crossover_png

        crossover_png({hw.name: rows}, args.png)
        print(f"wrote {args.png}")
    return 0


def add_critical_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``shardsim critical``."""
    _common(parser)
    parser.add_argument("--scheme", default="fsdp", help="ddp, fsdp, tp or fsdp_tp (default fsdp)")
    parser.add_argument("--mesh", help="a fixed mesh, e.g. X=16 (default: --chips laid out for the scheme)")
    parser.add_argument("--chips", type=int, help="chips (default: a ring of 16 TPUs or a node of 8 GPUs)")


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
    mesh = parse_mesh(args.mesh) if args.mesh else None
    c = critical_batch(args.scheme, hw, args.d_ff, d_model=args.d_model, chips=args.chips, mesh=mesh)
    print(c)
    for y, b in c.splits.items():  # fsdp_tp: every split tried
        shown = "communication-bound at every batch" if math.isinf(b) else f"{b:.1f} tokens per chip"
        print(f"  X={c.mesh.size // y}, Y={y}: {shown}")
    return 0


def parse_mesh(text: str) -> Mesh:
    """``"X=64,Y=4"`` → ``Mesh(X=64, Y=4)``.

    >>> parse_mesh("X=64, Y=4")
    Mesh(X=64, Y=4)
    """
    axes = {}
    for name, _, size in pairs(text):
        if not size.isdigit():
            raise ShardsimError(f"mesh {text!r}: write axes as NAME=SIZE separated by commas, e.g. X=64,Y=4")
        axes[name] = int(size)
    return Mesh(axes)


def parse_batches(text: str) -> list[int]:
    """``"512,1024"`` or ``"lo:hi:count"`` (log-spaced integers, duplicates dropped).

    >>> parse_batches("100:10000:3")
    [100, 1000, 10000]
    """
    if ":" in text:
        lo, hi, count = (float(v) for v in text.split(":"))
        n = max(2, int(count))
        values = [round(math.exp(math.log(lo) + i * (math.log(hi) - math.log(lo)) / (n - 1))) for i in range(n)]
        return sorted(dict.fromkeys(max(1, v) for v in values))
    return [int(v) for v in text.split(",") if v.strip()]


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hardware", default="tpu-v5p", help=f"one of {', '.join(hardware_names())} (default tpu-v5p)")
    parser.add_argument("--d-model", type=int, default=8192, help="d_model (default 8192)")
    parser.add_argument("--d-ff", type=int, default=32768, help="d_ff (default 32768)")
    parser.add_argument("--layers", type=int, default=1, help="layers (default 1)")
    parser.add_argument(
        "--exact-rings", action="store_true", help="keep (N-1)/N on every ring (default: the book's V/W)"
    )


def _hardware(args: argparse.Namespace) -> Hardware:
    hw = get_hardware(args.hardware)
    return hw.with_(ring="exact") if args.exact_rings else hw
