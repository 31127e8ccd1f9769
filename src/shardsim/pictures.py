"""Pictures: which block lives on which chip, traces and memory as text tables and HTML.

>>> import numpy as np, shardsim
>>> mesh = shardsim.Mesh(X=2, Y=2)
>>> x = shardsim.shard(np.zeros((2, 4)), mesh, "B_X D_Y")
>>> shardsim.show(x)
array[B_X, D_Y] (2, 4) float64 on Mesh(X=2, Y=2)
          Y0                Y1
X0   B[0:1] D[0:2]     B[0:1] D[2:4]
X1   B[1:2] D[0:2]     B[1:2] D[2:4]
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from ._format import fmt_bytes, table_html, table_text
from .array import ShardedArray
from .memory import MemoryLedger
from .mesh import Mesh
from .tracing import Event, Trace


def block_slices(x: ShardedArray, coords: Mapping[str, int]) -> list[tuple[str, int, int]]:
    """``[(dim name, start, stop), ...]``: the global slice of each dimension chip ``coords`` holds.

    >>> import numpy as np, shardsim
    >>> x = shardsim.shard(np.zeros((2, 4)), shardsim.Mesh(X=2, Y=2), "B_X D_Y")
    >>> block_slices(x, {"X": 1, "Y": 0})
    [('B', 1, 2), ('D', 0, 2)]
    """
    out = []
    for loc, d in zip(x.local_shape, x.layout.dims):
        index = 0
        for a in d.axes:
            index = index * x.mesh.axis_size(a) + coords[a]
        out.append((d.name, index * loc, (index + 1) * loc))
    return out


def block_ranges(x: ShardedArray, coords: dict[str, int]) -> str:
    """``B[0:1] D[2:4]``: the global slices chip ``coords`` holds (``{U_Y}`` if partial)."""
    text = " ".join(f"{name}[{start}:{stop}]" for name, start, stop in block_slices(x, coords))
    if x.layout.partial:
        text += " {partial " + ",".join(f"{a}{coords[a]}" for a in x.layout.partial) + "}"
    return text


#: The seed's words for the MLP's dimensions: B counts tokens, D is d_model, F is d_ff.
SEED_WORDS: dict[str, str | tuple[str, str]] = {"B": ("token", "tokens"), "D": "d_model", "F": "d_ff"}


def block_words(
    x: ShardedArray, coords: Mapping[str, int], words: Mapping[str, str | tuple[str, str]] | None = None
) -> str:
    """``token 0, d_model[0:2]``: chip ``coords``'s block in the seed's words.

    ``words`` maps a dimension name to a word (``"d_model"`` gives ``d_model[0:2]``) or to a
    countable noun ``(singular, plural)`` (``("token", "tokens")`` gives ``token 0`` for one
    index, ``tokens[0:2]`` for more); default :data:`SEED_WORDS`. Other dimensions keep their
    names.

    >>> import numpy as np, shardsim
    >>> x = shardsim.shard(np.zeros((2, 4)), shardsim.Mesh(X=2, Y=2), "B_X D_Y")
    >>> block_words(x, {"X": 0, "Y": 1})
    'token 0, d_model[2:4]'
    """
    words = SEED_WORDS if words is None else words
    parts = []
    for name, start, stop in block_slices(x, coords):
        word = words.get(name, name)
        if isinstance(word, tuple):
            parts.append(f"{word[0]} {start}" if stop - start == 1 else f"{word[1]}[{start}:{stop}]")
        else:
            parts.append(f"{word}[{start}:{stop}]")
    text = ", ".join(parts)
    if x.layout.partial:
        text += " (partial sum: " + ",".join(f"{a}{coords[a]}" for a in x.layout.partial) + "'s share)"
    return text


def chip_lines(
    x: ShardedArray,
    words: Mapping[str, str | tuple[str, str]] | None = None,
    *,
    width: int = 96,
    indent: str = "",
    max_chips: int = 16,
) -> list[str]:
    """Every chip's block as ``(X0,Y0): token 0, d_model[0:2]``, packed into lines of ``width``.

    Chips go in mesh order, as many per line as fit (a 2-D mesh gives one line per row when
    it fits); past ``max_chips`` chips the rest are counted, not listed.

    >>> import numpy as np, shardsim
    >>> x = shardsim.shard(np.zeros((2, 4)), shardsim.Mesh(X=2, Y=2), "B_X D_Y")
    >>> for line in chip_lines(x):
    ...     print(line)
    (X0,Y0): token 0, d_model[0:2]   (X0,Y1): token 0, d_model[2:4]
    (X1,Y0): token 1, d_model[0:2]   (X1,Y1): token 1, d_model[2:4]
    """
    mesh = x.mesh
    chips = mesh.chips()
    cells = [f"{mesh.chip_name(c)}: {block_words(x, c, words)}" for c in chips[:max_chips]]
    cell_width = max(len(c) for c in cells) + 3
    per_line = max(1, (width - len(indent) + 3) // cell_width)
    if len(mesh.shape) >= 2 and mesh.shape[-1] <= per_line:
        per_line = mesh.shape[-1] * max(1, per_line // mesh.shape[-1])  # whole rows of the mesh
    lines = [
        indent + "".join(c.ljust(cell_width) for c in cells[i : i + per_line]).rstrip()
        for i in range(0, len(cells), per_line)
    ]
    if len(chips) > max_chips:
        lines.append(f"{indent}... and {len(chips) - max_chips} more chips")
    return lines


def layout_text(x: ShardedArray) -> str:
    """The chip-by-chip picture: a grid for a 2-D mesh, a list otherwise."""
    mesh = x.mesh
    head = f"{x.label or 'array'}{x.layout} {x.global_shape} {x.dtype} on {mesh}"
    if len(mesh.shape) == 2:
        (ra, rn), (ca, cn) = zip(mesh.axis_names, mesh.shape)
        cells = [[block_ranges(x, {ra: r, ca: c}) for c in range(cn)] for r in range(rn)]
        width = max(len(c) for row in cells for c in row) + 4
        lines = [head, " " * 5 + "".join(f"{ca}{c}".ljust(width) for c in range(cn)).rstrip()]
        for r, row in enumerate(cells):
            lines.append(f"{ra}{r}".ljust(5) + "".join(c.ljust(width) for c in row).rstrip())
        return "\n".join(lines)
    lines = [head] + [f"{mesh.chip_name(c)}: {block_ranges(x, c)}" for c in mesh.chips()]
    return "\n".join(lines)


def show(x: ShardedArray | Trace | Mesh | MemoryLedger) -> None:
    """Print a picture of a sharded value (which block on which chip), a trace or a ledger."""
    print(layout_text(x) if isinstance(x, ShardedArray) else str(x))


def step_labels(events: Sequence[Event]) -> dict[int, str]:
    """Each step's label by event index, with every unnamed value (``?``) named after the step
    that made it: the all_gather of an unnamed ``In @ W_in`` reads ``matmul(In, W_in)``.

    A value no traced step made (an unnamed input of the program) stays ``?``.

    >>> import numpy as np, shardsim
    >>> mesh = shardsim.Mesh(X=2)
    >>> x = shardsim.shard(np.ones((4, 2)), mesh, "B_X D", label="In")
    >>> w = shardsim.shard(np.ones((2, 2)), mesh, "D F", label="W_in")
    >>> with shardsim.trace() as t:
    ...     h = shardsim.all_gather(x @ w, "X")
    >>> step_labels(t.events)
    {0: 'In @ W_in', 1: 'matmul(In, W_in)'}
    """
    made: dict[int, str] = {}  # value id -> its readable name
    out: dict[int, str] = {}
    for e in events:
        label = e.label
        if e.op == "matmul":
            parts = label.split(" @ ")
            if len(parts) == len(e.inputs):  # each operand read from one traced value: name it
                parts = [made.get(i, "?") + p[1:] if p.startswith("?") else p for p, i in zip(parts, e.inputs)]
            out[e.index] = " @ ".join(parts)
            made[e.output] = "matmul(" + ", ".join(p.removesuffix(".T") for p in parts) + ")"
        else:
            if not label and len(e.inputs) == 1:  # a collective moves its input: the same value
                label = made.get(e.inputs[0], "")
            out[e.index] = label or "?"
            made[e.output] = out[e.index]
    return out


def trace_table(t: Trace) -> str:
    """The trace as a fixed-width table, one row per event; unnamed values are named by
    :func:`step_labels`."""
    return table_text(*_trace_rows(t))


def _trace_rows(t: Trace) -> tuple[list[tuple[str, ...]], set[int]]:
    """The trace table's rows and its right-aligned (number) columns."""
    names = step_labels(t.events)
    rows: list[tuple[str, ...]] = [("#", "phase", "op", "axes", "array", "layout", "sent/chip", "flops/chip")]
    for e in t.events:
        layout = " , ".join(e.before) + " -> " + e.after
        rows.append(
            (
                str(e.index),
                e.phase,
                e.op,
                "".join(e.axes) or "-",
                names[e.index],
                layout,
                fmt_bytes(e.sent_bytes) if e.is_collective else "-",
                f"{e.flops:,}" if e.flops else "-",  # as the demo prints them: exact, 1,024
            )
        )
    return rows, {0, 6, 7}


def memory_table(ledger: MemoryLedger) -> str:
    """Per chip: live and peak bytes by category."""
    return table_text(*_memory_rows(ledger))


def _memory_rows(ledger: MemoryLedger) -> tuple[list[tuple[str, ...]], set[int]]:
    """The ledger table's rows and its right-aligned (bytes) columns: all but the chip."""
    mesh = ledger.mesh
    cats = ledger.categories()
    rows = [("chip", *(f"{c} (peak)" for c in cats), "total live", "total peak")]
    for coords in mesh.chips():
        idx = tuple(coords[a] for a in mesh.axis_names)
        rows.append(
            (
                mesh.chip_name(coords),
                *(fmt_bytes(int(ledger.peak(c)[idx])) for c in cats),
                fmt_bytes(int(ledger.live()[idx])),
                fmt_bytes(int(ledger.peak()[idx])),
            )
        )
    return rows, set(range(1, len(rows[0])))


# -- HTML for notebooks -----------------------------------------------------------------------
_COLORS = ["#fde2e4", "#e2ece9", "#dfe7fd", "#fff1e6", "#e8e8e4", "#f0efeb", "#d8e2dc", "#cddafd"]


def array_html(x: ShardedArray) -> str:
    """A coloured grid of chips, each cell naming the global slices it holds.

    Chips holding the same block share a colour; distinct blocks get distinct colours, in
    order of first appearance (the palette repeats past eight blocks).
    """
    mesh = x.mesh
    title = html.escape(f"{x.label or 'array'}{x.layout} {x.global_shape} {x.dtype}")
    cells = []
    palette: dict[str, str] = {}
    for coords in mesh.chips():
        text = block_ranges(x, coords)
        color = palette.setdefault(text, _COLORS[len(palette) % len(_COLORS)])
        cells.append(
            f"<td style='background:{color};padding:4px 8px;border:1px solid #999'>"
            f"<b>{html.escape(mesh.chip_name(coords))}</b><br>{html.escape(text)}</td>"
        )
    cols = mesh.shape[-1]
    body = "".join("<tr>" + "".join(cells[i : i + cols]) + "</tr>" for i in range(0, len(cells), cols))
    return f"<div><b>{title}</b> on {html.escape(repr(mesh))}<table>{body}</table></div>"


def mesh_html(mesh: Mesh) -> str:
    cols = mesh.shape[-1]
    cells = [
        f"<td style='border:1px solid #999;padding:4px'>{html.escape(mesh.chip_name(c))}</td>" for c in mesh.chips()
    ]
    body = "".join("<tr>" + "".join(cells[i : i + cols]) + "</tr>" for i in range(0, len(cells), cols))
    return f"<div><b>{html.escape(repr(mesh))}</b><table>{body}</table></div>"


def trace_html(t: Trace) -> str:
    """:func:`trace_table` as an HTML table: the same cells, numbers right-aligned."""
    return table_html(*_trace_rows(t))


def memory_html(ledger: MemoryLedger) -> str:
    """:func:`memory_table` as an HTML table: the same cells, bytes right-aligned."""
    return table_html(*_memory_rows(ledger), caption=f"memory of {ledger.mesh!r}")


# The display methods, put on the classes here as shardsim.operators puts the operators on arrays:
# arrays, meshes, ledgers and traces sit below the pictures, so the pictures come to them.
for _cls, _name, _method in [
    (ShardedArray, "_repr_html_", array_html),
    (Mesh, "_repr_html_", mesh_html),
    (MemoryLedger, "__str__", memory_table),
    (MemoryLedger, "_repr_html_", memory_html),
    (Trace, "__str__", trace_table),
    (Trace, "_repr_html_", trace_html),
]:
    setattr(_cls, _name, _method)
