"""The ``shardsim`` command line: ``shardsim demo`` runs the seed's toy MLP through the schemes.

Each subcommand is one function registered with :func:`subcommand`; its ``configure``
function adds its options to its own parser. A new subcommand is one more decorated
function, nothing else::

    def _chips_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--mesh", type=mesh_type(), default={"X": 2, "Y": 4})

    @subcommand("chips", "list the chips of a mesh", configure=_chips_options)
    def chips(args: argparse.Namespace) -> int:
        ...
        return 0

A subcommand returns the exit code: 0 when all is well, 1 when a check failed. Every error
is one line on stderr and exit code 2, never a traceback: a bad option (argparse's message,
with the flag), a :class:`~shardsim.ShardsimError` (a mesh that does not fit, sizes that do
not divide, an unknown scheme, a run too big for the host), a file that cannot be written.
Ctrl-C prints one line and exits 130.

>>> main(["demo", "--scheme", "ddp", "--quiet"])
ddp on Mesh(X=2): PASS
0
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import textwrap
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from . import strategies
from ._cli_args import (
    LIMITS,
    add_chrome_trace_option,
    check_host_memory,
    check_output_path,
    cli_words,
    count,
    mesh_type,
    seed,
    write_chrome_trace_option,
)
from ._cli_output import add_output_options, progress, write_csv, write_json
from ._format import fmt_bytes, table_text
from ._options import key_values, mesh_sizes, positive_int
from .array import ShapeDtype, shard
from .cost import cli as cost_cli
from .dtypes import resolve_dtype, tolerance
from .errors import CommandLineError, MeshAxisError, ShardsimError
from .mesh import Mesh
from .pictures import chip_lines, step_labels
from .planner import cli as planner_cli
from .strategies import StrategyResult
from .strategies.base import ROLE_DEFAULTS
from .strategies.runner import run as run_scheme
from .tracing import Event
from .training import cli as train_cli

__all__ = [
    "LIMITS",
    "DemoRun",
    "build_parser",
    "commands",
    "count",
    "key_values",
    "main",
    "mesh_sizes",
    "mesh_type",
    "positive_int",
    "run_demo",
    "seed",
    "subcommand",
]

#: The schemes ``shardsim demo`` runs when none is named: the seed's four, in its order.
SEED_SCHEMES = ("ddp", "fsdp", "tp", "fsdp_tp")
#: The seed's toy sizes: X is 2×4 (B = 2 tokens, d_model = 4) and d_ff = 8.
SEED_SIZES = {"batch": 2, "d_model": 4, "d_ff": 8}
WIDTH = 96  # the output fits a terminal this wide

# -- the registry of subcommands --------------------------------------------------------------


@dataclass(frozen=True)
class Subcommand:
    """One ``shardsim NAME`` command: its help line, its options and the function that runs it."""

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    configure: Callable[[argparse.ArgumentParser], None] | None = None


_COMMANDS: dict[str, Subcommand] = {}


def subcommand(
    name: str, help: str, *, configure: Callable[[argparse.ArgumentParser], None] | None = None
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Register the decorated function as ``shardsim NAME``; ``configure`` adds its options."""

    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        _COMMANDS[name] = Subcommand(name, help, run, configure)
        return run

    return register


def commands() -> list[str]:
    """The registered subcommands, in registration order.

    >>> commands()[:2]
    ['demo', 'schemes']
    """
    return list(_COMMANDS)


class UsageError(CommandLineError):
    """A bad option or command, as argparse words it; ``prog`` is the (sub)command it is about."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """An argparse parser that raises :class:`UsageError` instead of printing usage and exiting,
    so :func:`main` reports it as one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    """The ``shardsim`` parser with one sub-parser per registered subcommand."""
    from . import __version__

    parser = _Parser(
        prog="shardsim",
        description="Run sharded training schemes on a virtual mesh of NumPy chips and see every "
        "collective, byte and chip's memory.",
    )
    parser.add_argument("--version", action="version", version=f"shardsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in _COMMANDS.values():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        if cmd.configure is not None:
            cmd.configure(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``) and return the exit code.

    Never raises: every error is one line on stderr and exit code 2; Ctrl-C exits 130.
    """
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("shardsim: interrupted", file=sys.stderr)
        return 130


@contextlib.contextmanager
def _warnings_as_lines(prog: str) -> Iterator[None]:
    """Print each warning a command raises as one line on stderr, ``prog: warning: ...``, not
    as Python's file, line and source text."""

    def show(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
        print(f"{prog}: warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def _main(argv: Sequence[str] | None) -> int:
    try:
        args, extra = build_parser().parse_known_args(argv)
        if extra:  # name the subcommand they were given to, not the top-level parser
            prog = f"shardsim {args.command}"
            raise UsageError(prog, f"unrecognized arguments: {' '.join(extra)} (see '{prog} --help')")
    except UsageError as e:
        return _fail(e.prog, str(e))
    except SystemExit as e:  # --help and --version have printed and exit 0
        return e.code if isinstance(e.code, int) else 0
    prog = f"shardsim {args.command}"
    try:
        with _warnings_as_lines(prog):
            return int(args._run(args))
    except UsageError as e:  # a subcommand's own parser (e.g. a --scheme list) refused a value
        return _fail(e.prog, str(e))
    except ShardsimError as e:
        return _fail(prog, str(e))
    except BrokenPipeError:  # the reader went away (``shardsim demo | head``): stop quietly
        with contextlib.suppress(OSError, ValueError):  # stdout may not be a file descriptor
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:  # a --png path in a missing folder, a read-only file...
        where = f" {e.filename!r}" if e.filename else ""
        return _fail(prog, f"cannot write{where}: {e.strerror or e}")
    except MemoryError:
        return _fail(prog, "the host ran out of memory; use smaller sizes, or a shape-only command (estimate)")
    except Exception as e:  # a bug: still one line, and named as one
        return _fail(prog, f"internal error {type(e).__name__}: {e} (please report this command line)")


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {cli_words(message)}", file=sys.stderr)
    return 2


# -- option types -----------------------------------------------------------------------------
# positive_int, key_values and mesh_sizes come from shardsim._options, shared with train and the cost commands.


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


# -- shardsim demo ----------------------------------------------------------------------------


@dataclass
class DemoRun:
    """One scheme's demo: the run, the inputs it was given and the check against the reference."""

    scheme: strategies.Scheme
    result: StrategyResult
    inputs: dict[str, np.ndarray]  # x, dout and every parameter, global
    checks: list[tuple[str, float, float, bool]]  # (name, max abs error, tolerance, ok)

    @property
    def ok(self) -> bool:
        return all(ok for *_, ok in self.checks)


def default_mesh(scheme: strategies.Scheme, chips: int = 2) -> tuple[Mesh, dict[str, str]]:
    """The demo's mesh for ``scheme``: one axis of ``chips`` chips per role.

    A role's axis is the scaling book's letter (``data`` → X, ``model`` → Y) or, for other
    roles, the role's first letter in capitals.

    >>> default_mesh(strategies.get("fsdp_tp"))
    (Mesh(X=2, Y=2), {'data': 'X', 'model': 'Y'})
    """
    axes: dict[str, str] = {}
    for role in scheme.roles:
        name = ROLE_DEFAULTS.get(role, "".join(c for c in role if c.isalnum())[:1].upper() or "A")
        base, i = name, 2
        while name in axes.values():
            name, i = f"{base}{i}", i + 1
        axes[role] = name
    return Mesh({a: chips for a in axes.values()}), axes


def demo_mesh(
    scheme: strategies.Scheme, mesh: Mapping[str, int] | None, axes: Mapping[str, str] | None
) -> tuple[Mesh, dict[str, str] | None]:
    """The mesh a demo runs on and the axes of its roles: ``mesh`` as given, or one axis of 2
    chips per role, named as ``axes`` asks.

    >>> demo_mesh(strategies.get("ddp"), None, {"data": "D"})
    (Mesh(D=2), {'data': 'D'})
    """
    if axes is not None:  # the roles this scheme has (one --axes may serve several schemes)
        axes = {role: axis for role, axis in axes.items() if role in scheme.roles} or None
    if mesh is not None:
        return Mesh(dict(mesh)), axes
    the_mesh, chosen = default_mesh(scheme)
    if axes is not None:  # name the default mesh's axes as asked
        chosen.update(axes)
        the_mesh = Mesh({axis: 2 for axis in chosen.values()})
    return the_mesh, chosen


def shape_only_run(
    name: str | strategies.Scheme,
    mesh: Mesh,
    params: Mapping[str, Any],
    batch: int,
    d_model: int,
    dtype: Any,
    *,
    axes: Mapping[str, str] | None = None,
    activation: str = "identity",
    options: Mapping[str, Any] | None = None,
) -> StrategyResult:
    """The demo's run without data (:class:`~shardsim.ShapeDtype` values) on a fresh copy of
    ``mesh``: its trace and each chip's ledger, in milliseconds and no bytes.

    >>> r = shape_only_run("ddp", Mesh(X=2), {"w_in": ShapeDtype((4, 8)), "w_out": ShapeDtype((8, 4))}, 2, 4, "float32")
    >>> r.out is None, int(r.memory["total"].max()) > 0
    (True, True)
    """
    fresh = Mesh(dict(zip(mesh.axis_names, mesh.shape)))
    shapes = {k: ShapeDtype(np.shape(v), getattr(v, "dtype", dtype)) for k, v in params.items()}
    x = ShapeDtype((batch, d_model), dtype)
    scheme = name if isinstance(name, strategies.Scheme) else strategies.get(name)  # a user's scheme too
    return run_scheme(scheme, fresh, shapes, x, x, activation=activation, axes=axes, **dict(options or {}))


def default_batch(
    name: str | strategies.Scheme, mesh: Mesh, params: Mapping[str, Any], d_model: int, dtype: Any, **kw: Any
) -> int:
    """The seed's 2 tokens, or the smallest power of two above it the scheme can lay out on
    ``mesh`` (``dp_ep`` splits its tokens over X and Y: 4 on the default 2×2 mesh).

    >>> default_batch("ddp", Mesh(X=2), {"w_in": np.zeros((4, 8)), "w_out": np.zeros((8, 4))}, 4, "float32")
    2
    >>> default_batch("ddp", Mesh(X=8), {"w_in": np.zeros((4, 8)), "w_out": np.zeros((8, 4))}, 4, "float32")
    8
    """
    batch = SEED_SIZES["batch"]
    for _ in range(12):
        try:
            shape_only_run(name, mesh, params, batch, d_model, dtype, **kw)
            return batch
        except ShardsimError:
            batch *= 2
    return SEED_SIZES["batch"]  # none lays out: the real run says why


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


def demo_need(result: StrategyResult, params: Mapping[str, Any], batch: int, d_model: int) -> int:
    """Host bytes a demo needs: every chip's peak from the shape-only run's ledger, plus one
    float64 copy of the global values (In, dOut, H and the weights) for the single-device
    reference and the check: a bound from above (for ddp at B = 4M tokens it says 1.0 GiB; the
    process's peak resident memory was 0.79 GiB)."""
    chips = int(result.memory["total"].sum())
    d_ff = max((np.shape(v)[-1] for v in params.values()), default=0)
    weights = sum(int(np.prod(np.shape(v))) for v in params.values())
    host = (2 * batch * d_model + batch * d_ff + weights) * 8
    return chips + host


def run_demo(
    name: str | strategies.Scheme,
    *,
    batch: int | None = None,
    d_model: int = SEED_SIZES["d_model"],
    d_ff: int = SEED_SIZES["d_ff"],
    mesh: Mapping[str, int] | None = None,
    axes: Mapping[str, str] | None = None,
    activation: str = "identity",
    dtype: str = "float32",
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
    check_memory: bool = False,
    engine: str = "numpy",
) -> DemoRun:
    """Run scheme ``name`` forward and backward on the toy case and check it against its reference.

    The parameters come from the scheme's own ``init``, the expected values from its own
    ``reference``; ``x`` and ``dout`` are ``[batch, d_model]`` normal draws (``batch``
    defaults to :func:`default_batch`). Without ``mesh``, each of the scheme's roles gets its
    own axis of 2 chips. With ``check_memory``, a run the host has no memory for is refused
    (:class:`~shardsim.CommandLineError`) before anything big is allocated. ``engine="jax"``
    runs it on JAX devices (:mod:`shardsim.engines.jax`).

    >>> r = run_demo("tp")
    >>> r.ok, r.result.layouts["x"], str(r.result.mesh)
    (True, '[B, D_Y]', 'Mesh(Y=2)')
    """
    scheme = name if isinstance(name, strategies.Scheme) else strategies.get(name)  # a user's scheme too
    dt = resolve_dtype(dtype)
    the_mesh, axes = demo_mesh(scheme, mesh, axes)
    opts = dict(options or {})
    kw: dict[str, Any] = dict(axes=axes, activation=activation, options=opts)
    sizes = ",".join(f"{a}={n}" for a, n in zip(the_mesh.axis_names, the_mesh.shape))
    too_big = (
        f"use smaller --batch/--d-model/--d-ff, or see its bytes and time shape-only: shardsim estimate "
        f"--scheme {name} --mesh {sizes} --batch {batch or SEED_SIZES['batch']} --d-model {d_model} --d-ff {d_ff}"
    )
    if check_memory:  # the host holds at least In, dOut, W_in and W_out: check them before init allocates
        least = (2 * d_model * d_ff + 2 * (batch or 0) * d_model) * np.dtype(dt).itemsize
        check_host_memory(least, f"{name} on {the_mesh}", too_big)
    params = scheme.init(d_model, d_ff, seed=seed, dtype=dtype)
    if batch is None:
        batch = default_batch(scheme, the_mesh, params, d_model, dt, **kw)
    if check_memory:
        need = demo_need(shape_only_run(scheme, the_mesh, params, batch, d_model, dt, **kw), params, batch, d_model)
        check_host_memory(need, f"{name} on {the_mesh} with B={batch}", too_big)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((batch, d_model)).astype(dt)
    dout = rng.standard_normal((batch, d_model)).astype(dt)
    if engine == "jax":
        result = _jax_engine(the_mesh).run_strategy(
            scheme.name, the_mesh, params, x, dout, activation=activation, axes=axes, options=opts
        )
    else:
        result = run_scheme(scheme, the_mesh, params, x, dout, activation=activation, axes=axes, **opts)
    want_out, want_grads = scheme.reference(params, x, dout, activation, **opts)
    contraction = max(batch, d_model, d_ff)
    checks = [_check("Out", result.out, want_out, dtype, contraction)]
    for k, expected in want_grads.items():
        got = None if result.grads is None else result.grads.get(k)
        checks.append(_check(grad_name(k), got, expected, dtype, contraction))
    return DemoRun(scheme, result, {"x": x, "dout": dout, **params}, checks)


def _jax_engine(mesh: Mesh) -> Any:
    """The JAX engine; on CPU, first asks XLA for as many (fake) devices as the mesh has chips."""
    if "jax" not in sys.modules:  # XLA reads the flag when JAX is first imported
        os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={max(mesh.size, 8)}")
    from .engines import jax as engine

    return engine


def grad_name(key: str) -> str:
    """The seed's name of a gradient: ``x`` → ``dIn``, ``w_in`` → ``dW_in``.

    >>> grad_name("x"), grad_name("w_out")
    ('dIn', 'dW_out')
    """
    return "dIn" if key == "x" else "d" + key[:1].upper() + key[1:]


def _check(
    name: str, got: np.ndarray | None, want: np.ndarray, dtype: str, contraction: int
) -> tuple[str, float, float, bool]:
    """Max abs error of ``got`` against ``want``, its tolerance (a few ulps × √contraction, × 4
    for two chained matmuls, relative to the largest expected value) and whether it is within."""
    want = np.asarray(want, np.float64)
    scale = float(np.abs(want).max()) if want.size else 1.0
    tol = 4 * tolerance(dtype, contraction) * (scale or 1.0)
    if got is None or np.shape(got) != want.shape:
        return name, float("inf"), tol, False
    err = float(np.abs(np.asarray(got, np.float64) - want).max()) if want.size else 0.0
    return name, err, tol, bool(err <= tol)


_OP_NAMES = {
    "all_gather": "AllGather",
    "reduce_scatter": "ReduceScatter",
    "all_reduce": "AllReduce",
    "all_to_all": "AllToAll",
    "ppermute": "Permute",
}


def step_rows(events: Sequence[Event]) -> list[tuple[str, ...]]:
    """One table row per event: number, step, axis, array, layout after, bytes sent and FLOPs per
    chip; an unnamed value is named after the step that made it (:func:`~shardsim.pictures.step_labels`)."""
    names = step_labels(events)
    rows: list[tuple[str, ...]] = [("#", "step", "axis", "array", "layout after", "sent/chip", "FLOPs/chip")]
    for i, e in enumerate(events, 1):
        rows.append(
            (
                str(i),
                _OP_NAMES.get(e.op, e.op),
                "".join(e.axes) or "-",
                names[e.index],
                e.after,
                fmt_bytes(e.sent_bytes) if e.is_collective else "-",
                f"{e.flops:,}" if e.flops else "-",
            )
        )
    return rows


def _indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line if line else line for line in text.splitlines())


def memory_rows(result: StrategyResult) -> list[tuple[str, ...]]:
    """Per chip: peak bytes of each category during the run (chips alike are merged into one row)."""
    mesh = result.mesh
    cats = [c for c in result.memory if c != "total"] + ["total"]
    rows: list[tuple[str, ...]] = [("chip", *cats)]
    per_chip = []
    for coords in mesh.chips():
        idx = tuple(coords[a] for a in mesh.axis_names)
        per_chip.append((mesh.chip_name(coords), tuple(fmt_bytes(int(result.memory[c][idx])) for c in cats)))
    if len({v for _, v in per_chip}) == 1 and len(per_chip) > 1:
        rows.append((f"each of {len(per_chip)}", *per_chip[0][1]))
    else:
        rows.extend((name, *v) for name, v in per_chip)
    return rows


def render(run: DemoRun, *, dtype: str, activation: str) -> str:
    """The text ``shardsim demo`` prints for one scheme."""
    r, scheme = run.result, run.scheme
    roles = ", ".join(f"{role}={axis}" for role, axis in r.axes.items())
    b, d = run.inputs["x"].shape
    sizes = f"B={b} tokens, d_model={d}"
    if "w_in" in run.inputs:  # [D, F], or a stack [L, D, F] (pipelines, experts): say so
        w_in = run.inputs["w_in"]
        sizes += f", d_ff={w_in.shape[-1]}"
        if w_in.ndim > 2:
            sizes += f", W_in {tuple(w_in.shape)}"
    out = [
        "=" * WIDTH,
        f"{r.scheme} on {r.mesh}  ({roles})",
        *textwrap.wrap(scheme.summary, WIDTH),
        f"{sizes}, {dtype}, activation {activation}",
        "=" * WIDTH,
        "",
        "Starting layout, per chip:",
    ]
    for key, lay in r.layouts.items():
        if key not in run.inputs or key == "dout":  # the inputs and weights, not outputs or gradients
            continue
        label = "In" if key == "x" else key[:1].upper() + key[1:]
        value = shard(run.inputs[key], r.mesh, lay, label=label)
        out.append(f"  {label}{lay} {value.global_shape}")
        out.extend(chip_lines(value, width=WIDTH, indent="    "))
        del value
    for phase in ("forward", "backward"):
        events = [e for e in r.trace if e.phase == phase]
        sent = sum(e.sent_bytes for e in events)
        flops = sum(e.flops for e in events)
        collectives = sum(e.is_collective for e in events)
        out += [
            "",
            f"{phase.capitalize()}: {collectives} collectives, {fmt_bytes(sent)} sent and {flops:,} FLOPs per chip",
        ]
        if events:
            out.append(_indent(table_text(step_rows(events), right={0, 5, 6})))
        else:
            out.append("  (no steps)")
    out += ["", "Peak memory per chip, by category (bytes above the start of the run):"]
    out.append(_indent(table_text(memory_rows(r), right=range(1, len(r.memory) + 1))))
    out += ["", "Check against the single-device computation (scheme's reference):"]
    rows: list[tuple[str, ...]] = [("value", "max abs error", "tolerance", "")]
    rows += [(name, f"{err:.2e}", f"{tol:.2e}", "PASS" if ok else "FAIL") for name, err, tol, ok in run.checks]
    out.append(_indent(table_text(rows, right={1, 2})))
    out.append(f"  {r.scheme}: {'PASS' if run.ok else 'FAIL'}")
    return "\n".join(out)


def summary_table(runs: Sequence[DemoRun]) -> str:
    """One row per scheme: mesh, bytes sent per chip forward and backward, peak per chip, check."""
    rows: list[tuple[str, ...]] = [("scheme", "mesh", "fwd sent/chip", "bwd sent/chip", "peak/chip", "check")]
    for run in runs:
        r = run.result
        rows.append(
            (
                r.scheme,
                str(r.mesh),
                fmt_bytes(r.trace.total("sent_bytes", "forward")),
                fmt_bytes(r.trace.total("sent_bytes", "backward")),
                fmt_bytes(int(r.memory["total"].max())),
                "PASS" if run.ok else "FAIL",
            )
        )
    return table_text(rows, right={2, 3, 4})


def _demo_options(p: argparse.ArgumentParser) -> None:
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
    configure=_demo_options,
)
def demo(args: argparse.Namespace) -> int:
    """``shardsim demo``: layouts, steps, bytes, memory and the check, per scheme."""
    if args.model is not None:
        check_model_options(args)
        return _demo_model(args.model, args.plan or ["tp=2", "tp=2,sp"], quiet=args.quiet)
    if args.plan:
        raise CommandLineError("--plan walks a transformer: give --model too (e.g. --model gpt-tiny --plan tp=2,sp)")
    names = _scheme_names(args.scheme)
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
    """Refuse, by name, the MLP demo's options given beside ``--model`` (they would be ignored)."""
    given = [name for name, default in MLP_ONLY_OPTIONS.items() if getattr(args, name, default) != default]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise CommandLineError(
            f"{flags}: the MLP demo's option(s); --model {args.model} walks the preset's own sizes under --plan and "
            f"prints text, so drop them (its step time and bytes as JSON: shardsim estimate --model {args.model} "
            "--batch-tokens N --json)"
        )


def _demo_model(model: str, plans: list[str], *, quiet: bool = False) -> int:
    """``shardsim demo --model``: one block of a small transformer, step by step, under each plan
    (with ``quiet``, one PASS/FAIL line per plan)."""
    from .models import get
    from .transformer.demo import walk

    cfg = get(model)
    if cfg.param_count() > MODEL_WALK_PARAMS:
        raise CommandLineError(
            f"--model {model} has {cfg.param_count():,} parameters; the exact walk-through runs small presets "
            f"(at most {MODEL_WALK_PARAMS:,}: gpt-tiny, llama-tiny, moe-tiny); size {model} shape-only with "
            "'shardsim estimate'"
        )
    for plan in plans:  # every plan before any walk: a bad one prints one error and nothing else
        _check_walk_plan(plan)
    texts = [walk(cfg, plan) for plan in plans]
    passed = [t.rstrip().endswith("PASS") for t in texts]
    if quiet:
        for plan, ok in zip(plans, passed):
            print(f"{model} under {plan}: {'PASS' if ok else 'FAIL'}")
    else:
        print("\n\n".join(texts))
    return 0 if all(passed) else 1


def _check_walk_plan(text: str) -> None:
    """Refuse a ``--plan`` that is empty or needs more chips than a demo holds (each chip holds NumPy blocks)."""
    from .plans import Plan

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


def _scheme_names(requested: Sequence[str] | None) -> list[str]:
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


# -- shardsim schemes -------------------------------------------------------------------------


@subcommand("schemes", "list the registered schemes, their roles, what each does and the options it reads")
def schemes(args: argparse.Namespace) -> int:
    """``shardsim schemes``: one line per registered scheme."""
    names = strategies.names()
    lead = max(len(n) for n in names) + max(len(",".join(strategies.get(n).roles)) for n in names) + 4
    rows: list[tuple[str, ...]] = [("scheme", "roles", "what it does")]
    for name in names:
        s = strategies.get(name)
        text = s.summary + (f" (--option {', '.join(s.options)})" if s.options else "")
        lines = textwrap.wrap(text, max(30, WIDTH - lead))
        rows.append((name, ",".join(s.roles), lines[0]))
        rows.extend(("", "", more) for more in lines[1:])
    print(table_text(rows))
    return 0


# -- commands whose options and logic live with their package ---------------------------------
subcommand(
    "train",
    "train a small regression problem under every scheme and ZeRO stage",
    configure=train_cli.add_train_arguments,
)(train_cli.train_command)
for _name, _help, _configure, _run in (
    ("estimate", "time one training step of a scheme on real hardware", "add_estimate_arguments", "cli_estimate"),
    ("sweep", "step time and MFU against batch for every scheme", "add_sweep_arguments", "cli_sweep"),
    ("critical", "the per-chip batch above which a scheme is compute-bound", "add_critical_arguments", "cli_critical"),
):
    subcommand(_name, _help, configure=getattr(cost_cli, _configure))(getattr(cost_cli, _run))
subcommand(
    "plan",
    "the fastest plans of a model on a cluster that fit, ranked and explained",
    configure=planner_cli.add_plan_arguments,
)(planner_cli.cli_plan)
