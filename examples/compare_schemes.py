"""The four schemes as the model grows: bytes each chip sends and each chip's peak memory.

Every number is measured from a run of the scheme on shape-only values
(:class:`shardsim.ShapeDtype`: shapes and dtypes, no data), so real sizes trace in
milliseconds. All schemes get the same 16 chips: DDP and FSDP split the batch 16 ways, TP
splits the model 16 ways, FSDP+TP is 4 × 4. One MLP layer, a batch of B tokens, bfloat16.

    python examples/compare_schemes.py
    python examples/compare_schemes.py --tokens 4096 --chips 4x4

FSDP moves weights, so its bytes grow with d_model · d_ff and not with the batch; TP moves
activations, so its bytes grow with B · d_model and not with d_ff; FSDP+TP divides each by
the other axis. See docs/schemes.md for the closed forms.
"""

from __future__ import annotations

import argparse

import shardsim as ss
from shardsim.memory import fmt_bytes

SIZES = [(1024, 4096), (2048, 8192), (4096, 16384), (8192, 32768), (16384, 65536)]  # (d_model, d_ff)
SCHEMES = ("ddp", "fsdp", "tp", "fsdp_tp")


def meshes(x: int, y: int) -> dict[str, ss.Mesh]:
    """Each scheme's mesh of ``x * y`` chips: one axis for the 1-D schemes, ``X × Y`` for FSDP+TP."""
    n = x * y
    return {"ddp": ss.Mesh(X=n), "fsdp": ss.Mesh(X=n), "tp": ss.Mesh(Y=n), "fsdp_tp": ss.Mesh(X=x, Y=y)}


def measure(
    scheme: str, mesh: ss.Mesh, tokens: int, d_model: int, d_ff: int, dtype: str = "bfloat16"
) -> tuple[int, int]:
    """(bytes sent per chip forward + backward, peak bytes per chip) of one shape-only run.

    >>> measure("ddp", ss.Mesh(X=4), 64, 32, 128, "float32")  # two AllReduces of 2·(3/4)·D·F·4 bytes
    (49152, ...)
    """
    params = {"w_in": ss.ShapeDtype((d_model, d_ff), dtype), "w_out": ss.ShapeDtype((d_ff, d_model), dtype)}
    x = ss.ShapeDtype((tokens, d_model), dtype)
    r = ss.run_strategy(scheme, mesh, params, x, x, activation="gelu")
    return r.trace.total("sent_bytes"), int(r.memory["total"].max())


def table(title: str, rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [title] + ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=16384, help="tokens B in the batch (default: %(default)s)")
    p.add_argument("--chips", default="4x4", help="X x Y for FSDP+TP; the others use X*Y chips (default: 4x4)")
    args = p.parse_args(argv)
    x, y = (int(n) for n in args.chips.lower().split("x"))
    mesh_of = meshes(x, y)
    head = ("d_model", "d_ff", *SCHEMES)
    sent, peak = [head], [head]
    for d_model, d_ff in SIZES:
        numbers = {s: measure(s, mesh_of[s], args.tokens, d_model, d_ff) for s in SCHEMES}
        sent.append((str(d_model), str(d_ff), *(fmt_bytes(numbers[s][0]) for s in SCHEMES)))
        peak.append((str(d_model), str(d_ff), *(fmt_bytes(numbers[s][1]) for s in SCHEMES)))
    print(f"One MLP layer, B = {args.tokens} tokens, bfloat16, {x * y} chips:")
    print("  " + ", ".join(f"{s} on {m}" for s, m in mesh_of.items()) + "\n")
    print(table("Bytes sent per chip, forward + backward:", sent))
    print()
    print(table("Peak memory per chip (weights, gradients, activations of the step):", peak))


if __name__ == "__main__":
    main()
