"""Gantt pictures of a time line: text for the terminal, PNG through matplotlib.

Text: one row per stream. Compute cells show ``f``/``F`` (forward matmul) or ``b``/``B``
(backward), the case alternating from one op to the next; communication cells show ``=``
while the compute stream is busy (under compute) and ``#`` while it waits (exposed).

>>> from shardsim import Mesh
>>> from shardsim.cost import estimate
>>> est = estimate("fsdp", Mesh(X=16), "tpu-v5p", 16 * 2048, 8192, 32768, layers=2, efficiency="ideal")
>>> print(est.timeline.text(width=60))  # doctest: +NORMALIZE_WHITESPACE
fsdp, 2 layers on Mesh(X=16), tpu-v5p: step 38.2 ms
compute 28.7 ms, comm 35.8 ms: 26.3 under compute, 9.44 exposed
           0                                        38.2 ms
compute    ....fffFFFFfff.FFFbbb.BBBbbb.BBBbbb..BBBbbb.BBB.
comm X     ####==========#   ===#======#======##======#===#
           f/F forward, b/B backward matmul; = under compute, # exposed communication

The PNG needs matplotlib: ``pip install 'shardsim[plot]'``.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any

from .timeline import Bar, Timeline

if TYPE_CHECKING:
    from matplotlib.figure import Figure

OP_COLORS = {
    "all_gather": "#2a9d8f",
    "reduce_scatter": "#8e5ea2",
    "all_reduce": "#e76f51",
    "all_to_all": "#a0522d",
    "ppermute": "#7f7f7f",
    "host_transfer": "#b5b5b5",
}
PHASE_COLORS = {"forward": "#4878a8", "backward": "#f2a541", "weight": "#7fb069"}
SHORT = {"all_gather": "AG", "reduce_scatter": "RS", "all_reduce": "AR", "all_to_all": "A2A", "ppermute": "PP"}


def gantt_text(tl: Timeline, width: int = 100) -> str:
    """The time line as text rows, ``width`` cells wide (see the module doc)."""
    step = tl.step_s
    scale, unit = _unit(step)
    lines = [tl.title + f": step {_num(step * scale)} {unit}" if tl.title else f"step {_num(step * scale)} {unit}"]
    parts = ", ".join(f"{_num(v * scale)} {k}" for k, v in tl.comm_parts().items() if v or k != "behind other comm")
    bubble = f"; bubble {_num(tl.bubble_s * scale)} {unit}" if tl.bubble_s > 1e-9 * step else ""
    lines.append(
        f"compute {_num(tl.compute_s * scale)} {unit}, comm {_num(tl.comm_s * scale)} {unit}: {parts}{bubble}"
        + ("" if tl.overlap else " (no overlap)")
    )
    if step <= 0:
        return "\n".join([*lines, "(nothing to draw)"])
    rows = {name: _Stream([b for b in tl.bars if b.stream == name]) for name in tl.streams()}
    names = min(max(10, *(len(n) for n in rows)), 24)  # "comm model pipe1" names a stage's link in full
    cells = max(10, width - names - 2)
    end_label = f"{_num(step * scale)} {unit}"
    lines.append(" " * (names + 1) + "0" + end_label.rjust(cells - 1))
    computes = [row for name, row in rows.items() if name.startswith("compute")]
    for name, bars in rows.items():
        row = []
        for c in range(cells):
            t = (c + 0.5) * step / cells
            k = bars.at(t)
            if k is None:
                row.append("." if name.startswith("compute") else " ")
            elif name.startswith("compute"):
                phase = bars.bars[k].phase
                ch = {"forward": "f", "backward": "b", "weight": "w"}.get(phase, "o")
                row.append(ch.upper() if k % 2 else ch)
            else:
                row.append("=" if any(cs.at(t) is not None for cs in computes) else "#")
        lines.append(f"{name[:names]:<{names + 1}}" + "".join(row))
    legend = "f/F forward, b/B backward matmul"
    if any(b.phase == "weight" for b in tl.bars):
        legend += ", w/W weight gradients (a split backward's W)"
    lines.append(" " * (names + 1) + legend + "; = under compute, # exposed communication")
    return "\n".join(lines)


def gantt_png(
    tl: Timeline, path: str | None = None, *, ax: Any = None, title: str | None = None, dpi: int = 150
) -> Figure:
    """Draw ``tl`` with matplotlib: compute by phase, collectives by kind, exposed time in red."""
    plt = pyplot()
    scale, unit = _unit(tl.step_s)
    streams = tl.streams()
    rows = [*streams, "compute waits"]
    if ax is None:
        fig, ax = plt.subplots(figsize=(11, 0.7 * len(rows) + 1.4))
    else:
        fig = ax.figure
    height = 0.7
    for y, stream in enumerate(rows[:-1]):
        for b in (b for b in tl.bars if b.stream == stream):
            color = PHASE_COLORS.get(b.phase, "#999999") if b.is_compute else OP_COLORS.get(b.op, "#555555")
            ax.broken_barh(
                [(b.start * scale, b.seconds * scale)],
                (y - height / 2, height),
                facecolors=color,
                edgecolor="white",
                linewidth=0.5,
            )
            text = f"L{b.layer}" if b.is_compute else f"{SHORT.get(b.op, b.op)} L{b.layer}"
            if b.layer >= 0 and b.seconds > 0.0065 * len(text) * tl.step_s:  # only where the text fits
                ax.text(
                    (b.start + b.seconds / 2) * scale,
                    y,
                    text,
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white",
                )
    exposed = _exposed_intervals(tl)
    ax.broken_barh(
        [(s * scale, (e - s) * scale) for s, e in exposed], (len(rows) - 1 - height / 2, height), facecolors="#d62728"
    )
    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_xlim(0, tl.step_s * scale * 1.005 or 1)
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(title if title is not None else _title(tl), fontsize=10)
    handles = (
        [plt.Rectangle((0, 0), 1, 1, color=c) for c in (PHASE_COLORS["forward"], PHASE_COLORS["backward"])]
        + [plt.Rectangle((0, 0), 1, 1, color=OP_COLORS[o]) for o in _ops(tl)]
        + [plt.Rectangle((0, 0), 1, 1, color="#d62728")]
    )
    labels = ["forward matmul", "backward matmul"] + [o.replace("_", " ") for o in _ops(tl)] + ["exposed communication"]
    ax.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.45 / len(rows) - 0.12),
        ncol=len(labels),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return fig


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (files, no window), or an ImportError saying what to install.

    >>> pyplot().__name__
    'matplotlib.pyplot'
    """
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("drawing a PNG needs matplotlib: pip install 'shardsim[plot]'") from None
    return plt


def _title(tl: Timeline) -> str:
    scale, unit = _unit(tl.step_s)
    return (
        f"{tl.title}  step {_num(tl.step_s * scale)} {unit}: compute {_num(tl.compute_s * scale)}, "
        f"comm {_num(tl.comm_s * scale)} (hidden {_num(tl.comm_hidden_s * scale)}, "
        f"exposed {_num(tl.comm_exposed_s * scale)})"
        + (f", bubble {_num(tl.bubble_s * scale)}" if tl.bubble_s > 1e-9 * tl.step_s else "")
    )


def _ops(tl: Timeline) -> list[str]:
    return [o for o in OP_COLORS if any(b.op == o for b in tl.bars)]


def _exposed_intervals(tl: Timeline) -> list[tuple[float, float]]:
    """Intervals where the compute stream is idle inside the step (it waits for communication)."""
    out, t = [], 0.0
    for b in sorted((b for b in tl.bars if b.is_compute), key=lambda b: b.start):
        if b.start > t:
            out.append((t, b.start))
        t = max(t, b.end)
    if tl.step_s > t:
        out.append((t, tl.step_s))
    return out


class _Stream:
    """The bars of one sequential stream, for finding the one running at a given time."""

    def __init__(self, bars: list[Bar]) -> None:
        self.bars = sorted(bars, key=lambda b: b.start)
        self.starts = [b.start for b in self.bars]

    def at(self, t: float) -> int | None:
        k = bisect.bisect_right(self.starts, t) - 1
        return k if k >= 0 and self.bars[k].end > t else None


def _unit(seconds: float) -> tuple[float, str]:
    if seconds >= 1:
        return 1.0, "s"
    if seconds >= 1e-3:
        return 1e3, "ms"
    return 1e6, "us"


def _num(x: float) -> str:
    return f"{x:.3g}"


# The charts, put on the class here as shardsim.pictures puts the pictures on arrays: the time
# line sits below its charts, so the charts come to it.
for _name, _chart in (("text", gantt_text), ("plot", gantt_png)):
    setattr(Timeline, _name, _chart)
