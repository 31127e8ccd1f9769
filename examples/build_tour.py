"""Write ``examples/tour.ipynb``, the notebook tour of the seed's four schemes, from the cells below.

The notebook is generated, not edited by hand: change the cells here and run

    python examples/build_tour.py               # write and execute examples/tour.ipynb
    python examples/build_tour.py --no-execute  # write it without outputs

Executing needs the test extra (``pip install -e '.[test]'``: nbformat, nbclient, ipykernel).
"""

from __future__ import annotations

import argparse
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOTEBOOK = HERE / "tour.ipynb"

# (kind, source): the tour, cell by cell
CELLS: list[tuple[str, str]] = [
    (
        "markdown",
        """# A tour of shardsim: one MLP, four sharding schemes

The toy two-layer MLP of the scaling book's seed: `In · W_in → H · W_out → Out`, with `In`
2×4 (B = 2 tokens, d_model = 4) and d_ff = 8. We run it on a virtual mesh of NumPy "chips"
and look at which block lives on which chip, every collective and its bytes, and every
chip's memory. `shardsim demo` prints the same in a terminal.""",
    ),
    (
        "code",
        """import numpy as np

import shardsim as ss
from shardsim import mlp

params = mlp.init(d_model=4, d_ff=8, seed=0)
tokens = np.arange(8, dtype=np.float32).reshape(2, 4)  # token 0 = [0 1 2 3], token 1 = [4 5 6 7]
mesh = ss.Mesh(X=2, Y=2)  # axis X = FSDP (data), axis Y = TP (model)
mesh""",
    ),
    (
        "markdown",
        """## Mixed FSDP + TP on a 2×2 mesh

"Everything is doubly-sharded: the input is In[B_X, D_Y] — rows = tokens split on X, columns
= d_model split on Y — and the weights are quadrants, W_in[D_X, F_Y] and W_out[F_Y, D_X]."
Each cell below names the slices of the global array that chip holds; chips with the same
colour hold the same block.""",
    ),
    (
        "code",
        """x = ss.shard(tokens, mesh, "[B_X, D_Y]", label="In")
w_in = ss.shard(params["w_in"], mesh, "[D_X, F_Y]", label="W_in", category="params")
w_out = ss.shard(params["w_out"], mesh, "[F_Y, D_X]", label="W_out", category="params")
display(x, w_in, w_out)""",
    ),
    (
        "markdown",
        """### Forward pass — four collectives around two matmuls

1. **AllGather Y** (activations): within a track the two Y-chips swap embedding halves.
2. **AllGather X** (W_in): rebuild the d_model rows of W_in → `W_in[D, F_Y]`.
3. **matmul 1**: `In · W_in → H[B_X, F_Y]`, no comms.
4. **AllGather X** (W_out): → `W_out[F_Y, D]`.
5. **matmul 2**: `H · W_out` → a partial `Out[B_X, D]{U_Y}`.
6. **ReduceScatter Y** (output): add the partials, re-shard along d_model → `Out[B_X, D_Y]`.""",
    ),
    (
        "code",
        """with ss.trace() as t:
    x_full = ss.all_gather(x, "Y", label="In")  # 1
    w_in_full = ss.all_gather(w_in, "X")  # 2
    h = (x_full @ w_in_full).named("H")  # 3
    w_out_full = ss.all_gather(w_out, "X")  # 4
    partial = (h @ w_out_full).named("Out")  # 5
    out = ss.reduce_scatter(partial, "Y", "D", label="Out")  # 6
display(x_full, w_in_full, h, partial, out)""",
    ),
    (
        "markdown",
        """The trace: every step, the bytes each chip sends (ring collectives) and the FLOPs each
chip does.""",
    ),
    ("code", "t"),
    (
        "markdown",
        """Each chip's memory, by category: live now, and the peak since the mesh was made.""",
    ),
    ("code", "mesh.memory"),
    (
        "code",
        """want = mlp.forward(params, tokens)
print("max abs error against the single-device MLP:", float(np.abs(out.to_global() - want).max()))
assert np.allclose(out.to_global(), want, rtol=1e-5, atol=1e-6)""",
    ),
    (
        "markdown",
        """## All four schemes, forward and backward

`run_strategy` runs a scheme's forward and backward passes and reports its trace, its
per-chip memory and its results; each is checked here against the single-device MLP.""",
    ),
    (
        "code",
        """from shardsim.memory import fmt_bytes

dout = np.ones_like(tokens)
runs = {
    "ddp": ss.run_strategy("ddp", ss.Mesh(X=2), params, tokens, dout),
    "fsdp": ss.run_strategy("fsdp", ss.Mesh(X=2), params, tokens, dout),
    "tp": ss.run_strategy("tp", ss.Mesh(Y=2), params, tokens, dout),
    "fsdp_tp": ss.run_strategy("fsdp_tp", ss.Mesh(X=2, Y=2), params, tokens, dout),
}
grads = mlp.backward(params, tokens, dout)
for name, r in runs.items():
    ok = np.allclose(r.out, want, rtol=1e-5, atol=1e-6) and all(
        np.allclose(r.grads[k], g, rtol=1e-5, atol=1e-6) for k, g in grads.items()
    )
    print(
        f"{name:8} {r.mesh!s:15} forward {fmt_bytes(r.trace.total('sent_bytes', 'forward')):>6}, "
        f"backward {fmt_bytes(r.trace.total('sent_bytes', 'backward')):>6} sent per chip; "
        f"peak {fmt_bytes(int(r.memory['total'].max()))} per chip; {'PASS' if ok else 'FAIL'}"
    )
    assert ok, name""",
    ),
    (
        "markdown",
        """The 2-D scheme's backward pass is the scaling book's algorithm: AllGather-Y dOut,
ReduceScatter-X dW_out, AllGather-X W_out, AllGather-Y In, ReduceScatter-X dW_in,
AllGather-X W_in, ReduceScatter-Y dIn.""",
    ),
    ("code", 'runs["fsdp_tp"].trace'),
    (
        "markdown",
        """In a terminal, `ss.show` prints the same pictures as text: which block of the global
array each chip holds, the trace, the ledger.""",
    ),
    (
        "code",
        """ss.show(w_in)
ss.show(out)""",
    ),
    (
        "markdown",
        """## What it would cost on real hardware

The cost model runs the same scheme's program shape-only at full size and puts every step on
a time line: compute on each chip, each mesh axis's collectives on its own network, overlapped
where the schedule allows. Here FSDP+TP on 256 TPU v5p chips, one transformer-sized MLP of
d_model 8192 and d_ff 32768, two layers, 2048 tokens per chip.""",
    ),
    (
        "code",
        """import io
import warnings

import matplotlib.pyplot as plt
from IPython.display import Image

from shardsim.cost import estimate, sweep
from shardsim.cost.crossover import crossover_png

warnings.simplefilter("ignore")  # preset chips without measured efficiency curves say so; ideal rates here


def png(fig):
    \"\"\"The figure as a PNG (the same bytes whatever matplotlib backend the kernel has).\"\"\"
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72)
    plt.close(fig)
    return Image(buf.getvalue())


e = estimate("fsdp_tp", ss.Mesh(X=64, Y=4), "tpu-v5p", 256 * 2048, 8192, 32768, layers=2, efficiency="ideal")
display(e, e.timeline)""",
    ),
    ("markdown", "The time line as a picture: one row per stream, bars coloured by phase."),
    ("code", "png(e.timeline.plot())"),
    (
        "markdown",
        """## The crossover plot

Which scheme is fastest at which batch: MFU and step time per token against tokens per chip
on 256 TPU v5p chips (`examples/crossover.py` draws it for TPU v5p and H100 with the critical
batches marked).""",
    ),
    (
        "code",
        """batches = [64 * 2**i for i in range(9)]  # 64 ... 16384 tokens per chip
schemes = ["ddp", "fsdp", "tp", "fsdp_tp"]
results = {"tpu-v5p": sweep(schemes, "tpu-v5p", batches, 8192, 32768, chips=256, efficiency="ideal")}
png(crossover_png(results, title="One MLP layer, d_model 8192, d_ff 32768, 256 chips"))""",
    ),
    (
        "markdown",
        """Next: `docs/schemes.md` has every step's bytes and FLOPs as closed forms, and
`examples/compare_schemes.py` shows the schemes as the model grows.""",
    ),
]


def build() -> object:
    """The notebook, as an ``nbformat`` node, without outputs."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    make = {"markdown": nbformat.v4.new_markdown_cell, "code": nbformat.v4.new_code_cell}
    nb.cells = [make[kind](source) for kind, source in CELLS]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"  # stable ids: the file changes only when a cell does
    return nb


def execute(nb: object, timeout: int = 120) -> object:
    """Run every cell in a fresh kernel (from this folder) and keep the outputs."""
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    for cell in nb.cells:  # no timings or kernel-specific counters in the stored file
        cell.metadata.pop("execution", None)
    return nb


def main(argv: list[str] | None = None) -> None:
    import nbformat

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", type=Path, default=NOTEBOOK, help="where to write (default: examples/tour.ipynb)")
    p.add_argument("--no-execute", action="store_true", help="write the cells without running them")
    args = p.parse_args(argv)
    nb = build()
    if not args.no_execute:
        execute(nb)
    nbformat.write(nb, str(args.output))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
