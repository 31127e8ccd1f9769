"""The crossover plot: MFU and step time per token against tokens per chip, for every scheme.

One column per hardware; dashed lines (and the legend) mark each scheme's critical batch when given. Needs
matplotlib (``pip install 'shardsim[plot]'``), imported only when drawing. :func:`crossover_both`
computes the plot's data under the ideal and the calibrated model, one column each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .critical import critical_batch
from .gantt import pyplot
from .hardware import Hardware
from .presets import get_hardware
from .step_estimate import Estimate
from .sweeps import sweep

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SCHEME_COLORS = {"ddp": "#1f77b4", "fsdp": "#2ca02c", "tp": "#d62728", "fsdp_tp": "#9467bd"}
SCHEME_NAMES = {"ddp": "DDP", "fsdp": "FSDP", "tp": "TP", "fsdp_tp": "FSDP+TP (best split)"}


def crossover_both(
    schemes: Sequence[str],
    hardware: Hardware | str,
    per_chip_batches: Sequence[int],
    d_model: int,
    d_ff: int,
    *,
    chips: int,
    layers: int = 1,
) -> tuple[dict[str, list[Estimate]], dict[str, dict[str, float]]]:
    """Sweeps and critical batches under ``"ideal"`` and ``"calibrated"``, for :func:`crossover_png`.

    Returns ``({"<hw> ideal": rows, "<hw> calibrated": rows}, {same keys: {scheme: tokens/chip}})``.

    >>> rows, crit = crossover_both(["ddp"], "h100", [1024, 8192], 8192, 32768, chips=8)
    >>> list(rows), {k: round(v["ddp"]) for k, v in crit.items()}
    (['h100 ideal', 'h100 calibrated'], {'h100 ideal': 2200, 'h100 calibrated': 1593})
    """
    hw = get_hardware(hardware)
    results: dict[str, list[Estimate]] = {}
    critical: dict[str, dict[str, float]] = {}
    for mode in ("ideal", "calibrated"):
        key = f"{hw.name} {mode}"
        results[key] = sweep(schemes, hw, per_chip_batches, d_model, d_ff, chips=chips, layers=layers, efficiency=mode)
        critical[key] = {
            s: critical_batch(s, hw, d_ff, d_model=d_model, chips=chips, efficiency=mode).per_chip_batch
            for s in schemes
        }
    return results, critical


def crossover_png(
    results: Mapping[str, Sequence[Estimate]],
    path: str | None = None,
    *,
    critical: Mapping[str, Mapping[str, float]] | None = None,
    title: str | None = None,
    dpi: int = 150,
) -> Figure:
    """Draw ``{hardware name: estimates}``; ``critical`` is ``{hardware: {scheme: tokens/chip}}``."""
    plt = pyplot()
    cols = len(results)
    fig, axes = plt.subplots(2, cols, figsize=(5.6 * cols, 8.4), squeeze=False, sharex="col")
    for c, (hw_name, rows) in enumerate(results.items()):
        top, bottom = axes[0][c], axes[1][c]
        schemes = list(dict.fromkeys(e.scheme for e in rows))
        for scheme in schemes:
            pts = sorted((e for e in rows if e.scheme == scheme), key=lambda e: e.per_chip_batch)
            xs = [e.per_chip_batch for e in pts]
            color = SCHEME_COLORS.get(scheme)
            label = SCHEME_NAMES.get(scheme, scheme)
            b = (critical or {}).get(hw_name, {}).get(scheme)
            if b is not None:
                label += ": never compute-bound" if math.isinf(b) else f": compute-bound above {b:,.0f}"
            top.plot(xs, [100 * e.mfu for e in pts], marker="o", ms=2.5, lw=1.6, color=color, label=label)
            bottom.plot(xs, [1e6 * e.step_s / e.per_chip_batch for e in pts], marker="o", ms=2.5, lw=1.6, color=color)
            if b is not None and math.isfinite(b) and xs and xs[0] <= b <= xs[-1]:
                for ax in (top, bottom):
                    ax.axvline(b, color=color, ls="--", lw=0.9, alpha=0.8)
        first = rows[0] if rows else None
        chips = f", {first.chips} chips" if first is not None else ""
        top.set_title(f"{hw_name}{chips}", fontsize=11)
        top.set_ylabel("MFU (%)")
        top.set_ylim(0, 100)
        bottom.set_ylabel("step time / tokens per chip (µs)")
        bottom.set_yscale("log")
        bottom.set_xlabel("tokens per chip")
        for ax in (top, bottom):
            ax.set_xscale("log")
            ax.grid(True, which="both", alpha=0.25)
        handles, labels = top.get_legend_handles_labels()
        bottom.legend(
            handles,
            labels,
            fontsize=8,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.16),
            title="critical batch, tokens per chip (B / N)",
        )
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return fig
