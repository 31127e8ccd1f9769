"""The crossover plot: which scheme is fastest at which batch, on TPU v5p and on H100.

d_model 8192, d_ff 32768, 256 chips (TPU v5p rings of up to 16; 32 DGX H100 nodes), one layer:
MFU and step time per token against tokens per chip, for DDP, FSDP, TP (all 256 chips on one
axis) and FSDP+TP (the best X x Y split at each batch). Dashed lines mark each scheme's
critical batch, found on the same model. Every point runs the scheme's own program
shape-only and costs it.

Run:  python examples/crossover.py [--out docs/img/crossover.png]   (needs shardsim[plot])
      python examples/crossover.py --both docs/img/crossover-calibrated.png   (ideal beside calibrated)
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from shardsim.cli.estimate import parse_batches
from shardsim.cost import critical_batch, sweep
from shardsim.cost.crossover import crossover_both, crossover_png

D, F, CHIPS = 8192, 32768, 256
SCHEMES = ["ddp", "fsdp", "tp", "fsdp_tp"]
HARDWARE = ["tpu-v5p", "h100"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "img" / "crossover.png"))
    parser.add_argument("--both", help="instead draw the ideal and the calibrated model side by side to this PNG")
    args = parser.parse_args()
    if args.both:
        both(args.both)
        return
    batches = parse_batches("32:65536:45")
    results, critical = {}, {}
    for hw in HARDWARE:
        results[hw] = sweep(SCHEMES, hw, batches, D, F, chips=CHIPS, efficiency="ideal")
        critical[hw] = {s: critical_batch(s, hw, F, d_model=D, chips=CHIPS).per_chip_batch for s in SCHEMES}
        for scheme, b in critical[hw].items():
            shown = "never compute-bound" if math.isinf(b) else f"compute-bound above {b:,.0f} tokens per chip"
            print(f"{hw:<8} {scheme:<8} {shown}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    title = f"One MLP layer, d_model {D}, d_ff {F}, {CHIPS} chips: forward + backward step"
    crossover_png(results, args.out, critical=critical, title=title)
    print(f"wrote {args.out}")


def both(out: str) -> None:
    """Each hardware under the ideal and the calibrated model, one column each."""
    results, critical = {}, {}
    for hw in HARDWARE:
        r, c = crossover_both(SCHEMES, hw, parse_batches("32:65536:23"), D, F, chips=CHIPS)
        results.update(r)
        critical.update(c)
    title = f"One MLP layer, d_model {D}, d_ff {F}, {CHIPS} chips: ideal and calibrated model"
    crossover_png(results, out, critical=critical, title=title)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
