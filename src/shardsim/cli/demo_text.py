"""The text ``shardsim demo`` prints: each scheme's layouts, steps, memory and check, then a summary.

>>> from shardsim.cli.demo_run import run_demo
>>> print(summary_table([run_demo("ddp")]))  # doctest: +ELLIPSIS
scheme  mesh       fwd sent/chip  bwd sent/chip  peak/chip  check
ddp     Mesh(X=2)  ... PASS
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from .._format import fmt_bytes, table_text
from ..array import shard
from ..pictures import chip_lines, step_labels
from ..strategies import StrategyResult
from ..tracing import Event
from .demo_run import DemoRun
from .output import WIDTH

_OP_NAMES = {
    "all_gather": "AllGather",
    "reduce_scatter": "ReduceScatter",
    "all_reduce": "AllReduce",
    "all_to_all": "AllToAll",
    "ppermute": "Permute",
}


def step_rows(events: Sequence[Event]) -> list[tuple[str, ...]]:
    """One table row per event: number, step, axis, array, layout after, bytes sent and FLOPs per
    chip; an unnamed value is named after the step that made it (:func:`~shardsim.pictures.step_labels`).

    >>> from shardsim.cli.demo_run import run_demo
    >>> step_rows(run_demo("ddp").result.trace.events)[0]
    ('#', 'step', 'axis', 'array', 'layout after', 'sent/chip', 'FLOPs/chip')
    """
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


def indent(text: str, by: str = "  ") -> str:
    """``text`` with each line that is not empty moved right by ``by``.

    >>> indent("a\\n\\nb")
    '  a\\n\\n  b'
    """
    return "\n".join(by + line if line else line for line in text.splitlines())


def memory_rows(result: StrategyResult) -> list[tuple[str, ...]]:
    """Per chip: peak bytes of each category during the run (chips alike are merged into one row).

    >>> from shardsim.cli.demo_run import run_demo
    >>> [row[0] for row in memory_rows(run_demo("ddp").result)]
    ['chip', 'each of 2']
    """
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
    """The text ``shardsim demo`` prints for one scheme.

    >>> from shardsim.cli.demo_run import run_demo
    >>> print(render(run_demo("ddp"), dtype="float32", activation="identity"))  # doctest: +ELLIPSIS
    ====...
    ddp on Mesh(X=2)  (data=X)
    ...
      ddp: PASS
    """
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
            out.append(indent(table_text(step_rows(events), right={0, 5, 6})))
        else:
            out.append("  (no steps)")
    out += ["", "Peak memory per chip, by category (bytes above the start of the run):"]
    out.append(indent(table_text(memory_rows(r), right=range(1, len(r.memory) + 1))))
    out += ["", "Check against the single-device computation (scheme's reference):"]
    rows: list[tuple[str, ...]] = [("value", "max abs error", "tolerance", "")]
    rows += [(name, f"{err:.2e}", f"{tol:.2e}", "PASS" if ok else "FAIL") for name, err, tol, ok in run.checks]
    out.append(indent(table_text(rows, right={1, 2})))
    out.append(f"  {r.scheme}: {'PASS' if run.ok else 'FAIL'}")
    return "\n".join(out)


def summary_table(runs: Sequence[DemoRun]) -> str:
    """One row per scheme: mesh, bytes sent per chip forward and backward, peak per chip, check.

    >>> from shardsim.cli.demo_run import run_demo
    >>> summary_table([run_demo("tp")]).splitlines()[1].split()[:2]
    ['tp', 'Mesh(Y=2)']
    """
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
