"""Regenerate the tables of docs/calibration.md: published runs and collectives beside the model.

Run by hand (not by pytest):

    python benchmarks/calibration.py            # rewrite the generated blocks of docs/calibration.md
    python benchmarks/calibration.py --check    # exit 1 if the page is not what the code computes
    python benchmarks/calibration.py --fit      # refit each chip's elementwise_passes on its "fit" rows
    python benchmarks/calibration.py --all      # print the runs table with every row (tens of minutes)

Every number comes from ``shardsim.calibration`` (``table``, ``constants_table``), the
collective comparison (``shardsim.cost.measured``) and the critical batches under both
efficiency modes (``shardsim.cost.critical.critical_table``); nothing is typed by hand.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

try:
    import shardsim  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from shardsim.cost import calibration

PAGE = Path(__file__).resolve().parents[1] / "docs" / "calibration.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument(
        "--fit", action="store_true", help="refit elementwise_passes per chip and print it beside the preset"
    )
    parser.add_argument("--only", nargs="*", help="blocks to regenerate (default: all)")
    parser.add_argument("--all", action="store_true", help="print the runs table without the page's size budget")
    args = parser.parse_args()

    if args.all:
        print(calibration.table(budget=None))
        return 0

    if args.fit:
        for chip in sorted({r.hardware for r in calibration.RUNS if r.role == "fit"}):
            rows = [r for r in calibration.RUNS if r.hardware == chip and r.role == "fit"]
            value = calibration.fit_elementwise_passes(rows)
            preset = calibration.get_hardware(chip).calibration
            print(f"{chip}: fit {value:.3f} over {len(rows)} rows; preset {preset.elementwise_passes if preset else 0}")
        return 0
    text = PAGE.read_text()
    start = time.perf_counter()
    new = calibration.render(text, args.only)
    print(f"computed in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    if args.check:
        if new != text:
            print(f"{PAGE} is stale: run python benchmarks/calibration.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
