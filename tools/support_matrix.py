"""The support matrix: every registered scheme and every parallelism, tried in every subsystem.

Each row is a registered MLP scheme (on a small mesh, one axis per role) or a plan of
:func:`~shardsim.run_model` on the transformer; each column a subsystem a user reaches for.
A cell *tries* the subsystem at a small size and records either what it checked ("works",
with the evidence) or the first line of the error a user gets. Nothing is claimed that
was not run:

- ``exact run``: :func:`~shardsim.run_strategy` / :func:`~shardsim.run_model` on data, held
  to the single-device reference (:func:`~shardsim.strategies.reference_of`,
  :func:`shardsim.models.reference.loss_and_grads`): its largest relative error.
- ``Trainer step``: one SGD step of :class:`~shardsim.training.Trainer` (for the
  transformer, ``Trainer.for_model``), held to the reference's update ``W - lr · dW`` and loss.
- ``shape-only trace``: the same program on shape-only values gives the exact run's trace
  (every op, axis, phase and byte), then runs at real widths (the chip's bytes it reports).
- ``estimate``, ``critical batch``: :func:`~shardsim.cost.estimate` (of the scheme, or of
  the model under the plan) and :func:`~shardsim.cost.critical_batch` on an H100 at real widths.
- ``checkpoint``: a Trainer's state saved and loaded into a fresh Trainer, whose next step
  equals the first Trainer's, bit for bit.
- ``CLI``: ``shardsim demo``, ``train`` and ``estimate`` for a scheme (``demo --model`` and
  ``estimate --model`` for a plan), each exiting 0.

The MLP rows run a stack of ``max(2, stages)`` blocks of D=8, F=16 (GELU) on 2 chips per
role; the transformer rows a 2-layer (or one per stage and chunk) model of width 8, with 4
experts under ``ep``. "Real widths" are D=8192, F=32768 for the MLP and Llama 3 8B's widths,
vocabulary and sequence for the transformer.

``python tools/support_matrix.py docs/support.md`` (from the repository's root) writes the table
(:func:`markdown`); the test suite imports this file to check the page is current.

>>> cells = scheme_row("ddp")
>>> [c.column for c in cells if c.works] == list(COLUMNS)
True
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardsim import checkpoint, strategies
from shardsim.array import ShapeDtype
from shardsim.cli.demo_run import mesh_for
from shardsim.errors import ShardsimError
from shardsim.mesh import Mesh
from shardsim.models import TransformerConfig, get, reference
from shardsim.plans import Plan
from shardsim.tracing import Trace

COLUMNS = ("exact run", "Trainer step", "shape-only trace", "estimate", "critical batch", "checkpoint", "CLI")
#: The transformer plans the matrix tries: each parallelism, then the combinations people use.
PLANS = (
    "dp=2",
    "dp=2,zero=1",
    "dp=2,zero=3",
    "tp=2",
    "tp=2,sp",
    "dp=2,tp=2",
    "dp=2,zero=1,tp=2,pp=2,microbatches=2",
    "dp=2,tp=2,pp=2,schedule=interleaved,virtual_stages=2,microbatches=2",
    "dp=2,tp=2,pp=2,schedule=zb-h1,microbatches=2",
    "pp=2,microbatches=2",
    "cp=2",
    "cp=2,pp=2,microbatches=2",
    "ep=2",
    "dp=2,ep=2",
    "dp=2,tp=2,ep=2",
)
SMALL = {"d_model": 8, "d_ff": 16, "batch": 16}  # the exact runs: float64 on the host
REAL = {"d_model": 8192, "d_ff": 32768, "per_chip": 4096}  # the shape-only runs and estimates
TOLERANCE = 1e-9  # relative, float64 at these sizes (the schemes differ from one device in rounding only)
LR = 0.1
CHIPS = {1: 2, 2: 4, 3: 8}  # chips of a scheme's small mesh, by its number of roles
SMALL_MODEL = TransformerConfig(layers=2, d_model=8, heads=2, d_ff=16, vocab=8, seq=8, name="small")
REAL_MODEL = "llama3-8b"  # its widths, vocabulary and sequence; its layers cut to what the plan needs
# (under ep, 4 GELU experts per block at small size, as many at real size)


@dataclass(frozen=True)
class Cell:
    """One subsystem tried on one row: ``works``, and the evidence or the error's first line."""

    row: str
    column: str
    works: bool
    note: str


class MismatchError(ShardsimError):
    """A subsystem ran but its answer is not the single-device reference's."""


def _try(row: str, column: str, attempt: Callable[[], str]) -> Cell:
    try:
        return Cell(row, column, True, attempt())
    except Exception as e:  # the cell records what the user would see, whatever it is
        first = (str(e).strip().splitlines() or [""])[0]
        return Cell(row, column, False, f"{type(e).__name__}: {first}")


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """``max |got - want| / max |want|`` (0 for two zero arrays).

    >>> relative_error(np.array([1.0, 2.0]), np.array([1.0, 2.5]))
    0.2
    """
    scale = float(np.max(np.abs(want))) if np.size(want) else 0.0
    diff = float(np.max(np.abs(np.asarray(got) - np.asarray(want)))) if np.size(want) else 0.0
    return diff / scale if scale else diff


def _held(err: float, what: str) -> str:
    if not err <= TOLERANCE:
        raise MismatchError(f"{what} differs from the single-device reference by {err:.1e} (relative)")
    return f"{what} = one device to {max(err, 1e-16):.0e}"


def same_program(a: Trace, b: Trace) -> bool:
    """Whether two traces ran the same steps: op, axes, phase, bytes sent and FLOPs of each event."""

    def key(t: Trace) -> list[tuple[Any, ...]]:
        return [(e.op, e.axes, e.phase, e.sent_bytes, e.flops) for e in t.events]

    return key(a) == key(b)


def _estimated(e: Any) -> str:
    """What an estimate gave, in words that do not move with the efficiency constants: a positive
    step time, and per-chip memory by category from the training step's ledger."""
    if not (e.step_s > 0 and e.memory.get("optimizer", 0) > 0 and e.memory.get("total", 0) > 0):
        raise MismatchError(f"the estimate has no step time or no training-step memory: {e.memory}")
    return "a step time, and per-chip memory with the optimizer state from the training step's ledger"


def _cli(argv: Sequence[str]) -> str:
    """Run the command line quietly; its error line (or last line) if it does not exit 0."""
    from shardsim.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    if code != 0:
        lines = (err.getvalue() or out.getvalue()).strip().splitlines() or [f"exit code {code}"]
        raise ShardsimError(f"`shardsim {' '.join(argv)}` (exit {code}): {lines[-1]}")
    return argv[0]


# -- the registered MLP schemes -------------------------------------------------------------
def scheme_mesh(name: str) -> Mesh:
    """The small mesh a scheme's row runs on: 2 chips per role (X data, Y model or expert, Z pipe).

    >>> scheme_mesh("dp_pp_tp")
    Mesh(X=2, Y=2, Z=2)
    """
    return mesh_for(name, CHIPS[len(strategies.get(name).roles)])


def scheme_row(name: str) -> list[Cell]:
    """Every column tried on registered scheme ``name``."""
    mesh = scheme_mesh(name)
    layers = max(2, strategies.min_layers(name, mesh))
    model = strategies.mlp_for(name, mesh, SMALL["d_model"], SMALL["d_ff"], layers)
    model = model.scaled(activation="gelu")
    params = strategies.init_of(name, model, seed=1, dtype="float64")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SMALL["batch"], model.d_model))
    target = rng.standard_normal(x.shape)
    real_mesh_text = ",".join(f"{a}={n}" for a, n in zip(mesh.axis_names, mesh.shape))
    real_layers = strategies.min_layers(name, mesh)

    def exact() -> str:
        r = strategies.run_strategy(name, Mesh(dict(zip(mesh.axis_names, mesh.shape))), params, x, target, "gelu")
        out, grads = strategies.reference_of(name, params, x, target, "gelu")
        assert r.out is not None and r.grads is not None
        err = max(relative_error(r.out, out), *(relative_error(r.grads[k], grads[k]) for k in grads))
        return _held(err, "out and grads")

    def trainer(m: Mesh | None = None) -> Any:
        from shardsim.training import SGD, Trainer

        return Trainer(name, m or Mesh(dict(zip(mesh.axis_names, mesh.shape))), params, SGD(lr=LR), activation="gelu")

    def step() -> str:
        t = trainer()
        loss = t.step(x, target).loss
        out, _ = strategies.reference_of(name, params, x, np.zeros_like(x), "gelu")
        _, grads = strategies.reference_of(name, params, x, 2 * (out - target) / out.size, "gelu")
        new = t.params_global()
        err = max(relative_error(new[k], params[k] - LR * grads[k]) for k in params)
        err = max(err, abs(float(loss) - float(np.mean((out - target) ** 2))) / float(np.mean((out - target) ** 2)))
        return _held(err, "loss and updated weights")

    def shape_only() -> str:
        m = Mesh(dict(zip(mesh.axis_names, mesh.shape)))
        exact_run = strategies.run_strategy(name, m, params, x, target, "gelu")
        spec = {k: ShapeDtype(v.shape, v.dtype) for k, v in params.items()}
        shapes = strategies.run_strategy(
            name, m, spec, ShapeDtype(x.shape, x.dtype), ShapeDtype(x.shape, x.dtype), "gelu"
        )
        if not same_program(exact_run.trace, shapes.trace):
            raise MismatchError("the shape-only run's trace is not the exact run's")
        big = strategies.mlp_for(name, mesh, REAL["d_model"], REAL["d_ff"], real_layers)
        b = ShapeDtype((REAL["per_chip"] * mesh.size, big.d_model), "bfloat16")
        r = strategies.run_strategy(name, m, strategies.weights_of(name, big, "bfloat16"), b, b, "gelu")
        return f"same trace as the exact run; D={big.d_model}: {int(r.memory['total'].max()) / 1e9:.2f} GB/chip"

    def estimate() -> str:
        from shardsim.cost import estimate as est

        e = est(name, mesh, "h100", REAL["per_chip"] * mesh.size, REAL["d_model"], REAL["d_ff"], real_layers)
        return _estimated(e)

    def critical() -> str:
        from shardsim.cost import critical_batch

        c = critical_batch(name, "h100", REAL["d_ff"], d_model=REAL["d_model"], mesh=mesh)
        return "comm-bound at every batch" if np.isinf(c.per_chip_batch) else f"{c.per_chip_batch:.3g} tokens/chip"

    def saved() -> str:
        a, b = trainer(), trainer()
        a.step(x, target)
        with tempfile.TemporaryDirectory() as d:
            b.restore(checkpoint.load(checkpoint.save(f"{d}/ckpt", a.state()), b.mesh))
        la, lb = a.step(x, target).loss, b.step(x, target).loss
        if la != lb or any(not np.array_equal(a.params_global()[k], b.params_global()[k]) for k in params):
            raise MismatchError("the restored Trainer's next step differs from the saved one's")
        return "saved, restored, next step bit for bit"

    def cli() -> str:
        axes = ["--mesh", real_mesh_text]
        sizes = ["--d-model", str(SMALL["d_model"]), "--d-ff", str(SMALL["d_ff"])]
        _cli(["demo", "--scheme", name, *axes, "--quiet", "--dtype", "float64", *sizes])
        _cli(
            [
                "train",
                "--scheme",
                name,
                "--chips",
                str(mesh.size),
                "--layers",
                str(layers),
                "--steps",
                "2",
                "--quiet",
                *sizes,
            ]
        )
        _cli(["estimate", "--scheme", name, *axes, "--layers", str(real_layers), "--hardware", "h100"])
        return "demo, train, estimate"

    attempts = (exact, step, shape_only, estimate, critical, saved, cli)
    return [_try(name, col, f) for col, f in zip(COLUMNS, attempts)]


# -- the transformer under a plan -------------------------------------------------------------
def plan_row(text: str) -> list[Cell]:
    """Every column tried on the transformer under plan ``text``."""
    from shardsim.transformer.run import run_model

    plan = Plan.parse(text)
    experts = {"experts": 4, "mlp": "gelu"} if plan.ep > 1 else {}  # expert parallelism splits a mixture of experts
    cfg = SMALL_MODEL.scaled(layers=max(2, plan.pp * plan.virtual_stages), **experts)
    params = reference.init(cfg, seed=1, dtype="float64")
    rng = np.random.default_rng(0)
    b = 2 * plan.dp * plan.ep * plan.microbatches
    tokens, targets = rng.integers(0, cfg.vocab, (b, cfg.seq)), rng.integers(0, cfg.vocab, (b, cfg.seq))

    def exact() -> str:
        got = run_model(cfg, plan, plan.mesh(), params, tokens, targets)
        want_loss, want = reference.loss_and_grads(cfg, params, tokens, targets)
        assert got.grads is not None and got.loss is not None
        err = max(abs(got.loss - want_loss) / abs(want_loss), *(relative_error(got.grads[k], want[k]) for k in want))
        return _held(err, "loss and grads")

    def trainer() -> Any:
        from shardsim.training import SGD, Trainer

        return Trainer.for_model(cfg, plan, plan.mesh(), params, SGD(lr=LR))

    def step() -> str:
        t = trainer()
        loss = t.step(tokens, targets).loss
        want_loss, want = reference.loss_and_grads(cfg, params, tokens, targets)
        new = t.params_global()
        err = max(
            abs(loss - want_loss) / abs(want_loss), *(relative_error(new[k], params[k] - LR * want[k]) for k in want)
        )
        return _held(err, "loss and updated weights")

    def shape_only() -> str:
        exact_run = run_model(cfg, plan, plan.mesh(), params, tokens, targets)
        spec = {k: ShapeDtype(v.shape, v.dtype) for k, v in params.items()}
        ids = ShapeDtype(tokens.shape, tokens.dtype)
        shapes = run_model(cfg, plan, plan.mesh(), spec, ids, ids)
        if not same_program(exact_run.trace, shapes.trace):
            raise MismatchError("the shape-only run's trace is not the exact run's")
        big = get(REAL_MODEL).scaled(layers=plan.pp * plan.virtual_stages, **experts)
        spec = {k: ShapeDtype(v, "bfloat16") for k, v in big.param_shapes().items()}
        ids = ShapeDtype((plan.dp * plan.ep * plan.microbatches, big.seq), "int64")
        r = run_model(big, plan, plan.mesh(), spec, ids, ids)
        assert r.peak is not None
        return f"same trace as the exact run; {REAL_MODEL} widths: {int(r.peak.max()) / 1e9:.2f} GB/chip"

    def estimate() -> str:
        from shardsim.cost import estimate as est

        big = get(REAL_MODEL).scaled(**experts) if experts else get(REAL_MODEL)
        e = est(big, plan, "h100", batch_tokens=2 * plan.dp * plan.ep * plan.microbatches * big.seq)
        return f"{big.name}: {_estimated(e)}"

    def critical() -> str:
        from shardsim.cost import critical_batch

        critical_batch(get(REAL_MODEL), "h100", mesh=plan.mesh())  # type: ignore[arg-type]
        return "critical batch"

    def saved() -> str:
        a, b = trainer(), trainer()
        a.step(tokens, targets)
        with tempfile.TemporaryDirectory() as d:
            b.restore(checkpoint.load(checkpoint.save(f"{d}/ckpt", a.state()), b.mesh))
        same = a.step(tokens, targets).loss == b.step(tokens, targets).loss
        if not same or any(not np.array_equal(v, b.params_global()[k]) for k, v in a.params_global().items()):
            raise MismatchError("the restored Trainer's next step differs from the saved one's")
        return "saved, restored, next step bit for bit"

    def cli() -> str:
        preset = "moe-tiny" if plan.ep > 1 else "llama-tiny"  # a preset with experts for ep
        _cli(["demo", "--model", preset, "--plan", text])
        model = preset if plan.ep > 1 else REAL_MODEL
        tokens = 2 * plan.dp * plan.ep * plan.microbatches * get(model).seq
        _cli(["estimate", "--model", model, "--plan", text, "--hardware", "h100", "--batch-tokens", str(tokens)])
        return "demo, estimate"

    attempts = (exact, step, shape_only, estimate, critical, saved, cli)
    return [_try(text, col, f) for col, f in zip(COLUMNS, attempts)]


def matrix() -> list[Cell]:
    """Every registered scheme's row, then every plan of :data:`PLANS`."""
    cells = []
    for name in strategies.names():
        cells += scheme_row(name)
    for text in PLANS:
        cells += plan_row(text)
    return cells


def markdown(cells: Sequence[Cell]) -> str:
    """The matrix as ``docs/support.md``: a table per kind of row, each failure's message as a note."""
    notes: dict[str, int] = {}
    out = [HEADER]
    for title, rows in (
        ("Registered MLP schemes", [n for n in strategies.names()]),
        ("The transformer under a plan (`run_model`)", list(PLANS)),
    ):
        out += ["", f"## {title}", "", "| | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
        for row in rows:
            texts = []
            for c in (c for c in cells if c.row == row):
                if c.works:
                    texts.append("works")
                else:
                    n = notes.setdefault(c.note, len(notes) + 1)
                    texts.append(f"no [{n}](#note-{n})")
            out.append(f"| `{row}` | " + " | ".join(texts) + " |")
    out += [
        "",
        "## Each registered scheme as a plan",
        "",
        PLAN_NOTE,
        "",
        "| scheme | its mesh | plan | back |",
        "|---|---|---|---|",
    ]
    for name in strategies.names():
        mesh = scheme_mesh(name)
        plan = strategies.plan_of(name, mesh)
        sizes = ",".join(f"{a}={n}" for a, n in zip(mesh.axis_names, mesh.shape))
        out.append(f"| `{name}` | `{sizes}` | `{plan}` | `{strategies.scheme_of(plan, _model_of(name))}` |")
    out += ["", "## Why not", ""]
    out += [f'<a id="note-{n}"></a>{n}. {note.replace("|", "/")}' for note, n in notes.items()]
    out += ["", "## What each working cell checked", ""]
    out += [f"- `{c.row}`, {c.column}: {c.note}" for c in cells if c.works]
    return "\n".join(out) + "\n"


def _model_of(name: str) -> Any:
    """The small MLP of scheme ``name``'s row (its kind of block: dense, LayerNorm or experts)."""
    mesh = scheme_mesh(name)
    return strategies.mlp_for(name, mesh, SMALL["d_model"], SMALL["d_ff"], strategies.min_layers(name, mesh))


PLAN_NOTE = """`strategies.plan_of(name, mesh)` gives the plan, `strategies.scheme_of(plan, model)` the scheme
back (`zero3` and `fsdp` are one plan); a plan no MLP scheme runs (`dp=2,tp=2` without ZeRO-3,
`cp`, experts with `tp`...) gets a `PlanError` naming the missing parallelism, and runs on the
transformer with `run_model` (table above)."""

HEADER = """# Support matrix

Every registered scheme and every parallelism of the transformer, tried in every subsystem.
This page is generated: `python tools/support_matrix.py docs/support.md` runs each cell at a
small size (float64, checked against the single-device reference) and, shape-only, at real
widths, and writes what it found; the test suite regenerates it and fails if it is stale.
"works" means the cell ran and was checked (what was checked is listed at the end); "no"
links to the error a user gets, word for word."""


def main(argv: Sequence[str] | None = None) -> int:
    """Write the matrix to the path given (or print it)."""
    args = list(sys.argv[1:] if argv is None else argv)
    text = markdown(matrix())
    if args:
        with open(args[0], "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
