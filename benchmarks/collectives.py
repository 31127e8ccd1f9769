"""Collectives at 8 and at 1,024 chips, and the host memory of a replicated weight.

Run by hand (not by pytest):  python benchmarks/collectives.py [--mib 32] [--repeats 21]

What it measures
- AllGather and ReduceScatter of the same total bytes over 8 chips (Mesh(X=8)) and over
  1,024 chips (Mesh(X=1024) and Mesh(X=32, Y=32)). "Total bytes" is what all chips' input
  blocks hold together: the whole array for an AllGather, the stacked partial sums for a
  ReduceScatter. Equal total bytes means equal host work, so any gap between 8 and 1,024
  chips is per-chip overhead. Target: 1,024-chip median within 2x of the 8-chip median.
- The host memory of a weight replicated on 1,024 chips, with tracemalloc (NumPy reports its
  buffers to it). Compact storage keeps one copy however many chips hold it, while the
  ledger counts it once per chip. Target: within 1.1x of one copy.

AllGather inputs are built from contiguous per-chip blocks (as after a computation), not from
``shard()`` views of a global array: gathering such a view back is free, which would measure nothing.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np

try:
    import shardsim as ss
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import shardsim as ss
from _timing import cpu, medians

Thunk = Callable[[], object]
MESHES: dict[str, dict[str, int]] = {"8": {"X": 8}, "1024": {"X": 1024}, "32x32": {"X": 32, "Y": 32}}


def machine() -> str:
    """CPU model and core count (lscpu), Python and NumPy versions, and today's date."""
    return f"{cpu()}; Python {platform.python_version()}, NumPy {np.__version__}; {datetime.date.today().isoformat()}"


def axes_of(mesh: ss.Mesh) -> str | tuple[str, ...]:
    return mesh.axis_names[0] if len(mesh.axis_names) == 1 else mesh.axis_names


def all_gather_case(mesh: ss.Mesh, rows: int, cols: int, split: str) -> tuple[Thunk, Thunk]:
    """AllGather of a (rows, cols) float32 array split over every mesh axis on ``split`` ('rows'/'cols').

    Returns the shardsim call and plain NumPy doing the same: concatenating the chip-major blocks.
    """
    layout = f"R_{''.join(mesh.axis_names)} C" if split == "rows" else f"R C_{''.join(mesh.axis_names)}"
    a = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    blocks = np.ascontiguousarray(ss.shard(a, mesh, layout).blocks())  # chip-major, as after a matmul
    x = ss.from_local(blocks, mesh, layout)
    axes = axes_of(mesh)
    flat = blocks.reshape((mesh.size,) + blocks.shape[-2:])  # (chips, r, c), first axis major
    along = 0 if split == "rows" else 1
    return (lambda: ss.all_gather(x, axes)), (lambda: np.concatenate(flat, axis=along))


def reduce_scatter_case(mesh: ss.Mesh, total: int) -> tuple[Thunk, Thunk]:
    """ReduceScatter over every mesh axis of a partial sum whose blocks hold ``total`` floats together.

    Returns the shardsim call and plain NumPy doing the same: the sum over chips of the blocks.
    """
    cols = 8192
    blocks = np.random.default_rng(1).standard_normal(mesh.shape + (total // mesh.size // cols, cols))
    blocks = blocks.astype(np.float32)
    p = ss.from_local(blocks, mesh, "[R, C]{U_" + "".join(mesh.axis_names) + "}")
    axes = axes_of(mesh)
    flat = blocks.reshape((mesh.size,) + blocks.shape[-2:])
    return (lambda: ss.reduce_scatter(p, axes, "C")), (lambda: flat.sum(axis=0))


def host_bytes_of_replicated_weight(chips: int, d: int, f: int) -> dict[str, int]:
    """Host bytes a (d, f) float32 weight replicated on ``chips`` chips takes, made two ways.

    ``shard``: from a global array (the array is allocated inside the measurement).
    ``all_gather``: gathered from chip-major blocks (only the gather is inside the measurement).
    Peaks are reported too, so a transient copy per chip could not hide.
    """
    mesh = ss.Mesh(X=chips)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    w = ss.shard(np.ones((d, f), np.float32), mesh, "D F", category="params")
    shard_now, shard_peak = (m - base for m in tracemalloc.get_traced_memory())
    ledger = mesh.memory.live("params")
    blocks = np.ascontiguousarray(ss.shard(np.ones((d, f), np.float32), mesh, "D F_X").blocks())
    v = ss.from_local(blocks, mesh, "D F_X", category="params")
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    gathered = ss.all_gather(v, "X")
    gather_now, gather_peak = (m - base for m in tracemalloc.get_traced_memory())
    tracemalloc.stop()
    assert w.compact().nbytes == gathered.compact().nbytes == d * f * 4
    return {
        "one_copy": d * f * 4,
        "shard": shard_now,
        "shard_peak": shard_peak,
        "all_gather": gather_now,
        "all_gather_peak": gather_peak,
        "ledger_per_chip": int(ledger[0]),
        "ledger_all_chips": int(ledger.sum()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=32, help="total bytes moved per case, MiB (default 32)")
    parser.add_argument("--repeats", type=int, default=21, help="timed runs per case (default 21)")
    args = parser.parse_args()
    total = args.mib * 2**20 // 4  # float32 elements
    print(f"machine: {machine()}")
    print(f"total bytes per case: {args.mib} MiB float32; median of {args.repeats} runs\n")

    # (name, rows, cols, split): per-chip row chunk at 1,024 chips is cols/1024 floats
    gathers = [
        (f"[R, C_X], R={128}: 256-byte block rows at 1,024 chips", 128, total // 128, "cols"),
        (f"[R, C_X], C={8192}: 32-byte block rows at 1,024 chips", total // 8192, 8192, "cols"),
        ("[R_X, C]: whole rows per chip", total // 8192, 8192, "rows"),
    ]
    cases: list[tuple[str, Callable[[ss.Mesh], tuple[Thunk, Thunk]]]] = [
        (f"AllGather {name}", lambda m, r=r, c=c, s=split: all_gather_case(m, r, c, s)) for name, r, c, split in gathers
    ]
    cases.append(("ReduceScatter [R, C]{U_X} -> [R, C_X]", lambda m: reduce_scatter_case(m, total)))
    missed = []
    print("| case | mesh | 8 chips (ms) | 1,024 chips (ms) | ratio | plain NumPy at 1,024 (ms) | target <= 2x |")
    print("|---|---|---:|---:|---:|---:|---|")
    for name, make in cases:
        run8 = make(ss.Mesh(MESHES["8"]))[0]
        run1024, floor1024 = make(ss.Mesh(MESHES["1024"]))
        run32, floor32 = make(ss.Mesh(MESHES["32x32"]))
        t8, t1024, f1024, t32, f32 = medians([run8, run1024, floor1024, run32, floor32], args.repeats)
        for key, t, tf in (("1024", t1024, f1024), ("32x32", t32, f32)):
            ok = t / t8 <= 2.0
            if not ok:
                missed.append(f"{name} on {key}")
            verdict = "met" if ok else "MISSED"
            print(f"| {name} | {key} | {t8 * 1e3:.3f} | {t * 1e3:.3f} | {t / t8:.2f} | {tf * 1e3:.3f} | {verdict} |")

    mem = host_bytes_of_replicated_weight(1024, 1024, 4096)
    mib = 2.0**20
    print("\nweight (1024, 4096) float32 replicated on 1,024 chips (host bytes by tracemalloc):")
    print(f"  one copy: {mem['one_copy'] / mib:.2f} MiB")
    for how in ("shard", "all_gather"):
        ratio = mem[how] / mem["one_copy"]
        peak = mem[f"{how}_peak"] / mem["one_copy"]
        ok = max(ratio, peak) <= 1.1
        if not ok:
            missed.append(f"host memory via {how}")
        print(
            f"  made by {how:<10}: {mem[how] / mib:.2f} MiB held = {ratio:.3f}x one copy, "
            f"peak {peak:.3f}x (target <= 1.1x: {'met' if ok else 'MISSED'})"
        )
    print(
        f"  ledger: {mem['ledger_per_chip'] / mib:.2f} MiB on each chip, "
        f"{mem['ledger_all_chips'] / mib:.0f} MiB over all chips (= 1,024 copies)"
    )
    if missed:
        print("\ntargets missed: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
