"""Mixed FSDP + TP on a 2×2 mesh, step by step: the seed's walk-through, run.

The toy MLP of the seed: X is 2×4 (B = 2 tokens, d_model = 4) and d_ff = 8, so W_in is
4×8 and W_out is 8×4. After every step this prints the value's layout and the block each
chip holds, then checks the result against the single-device MLP and shows the backward
pass the scheme runs.

    python examples/seed_fsdp_tp.py
"""

from __future__ import annotations

import numpy as np

import shardsim as ss
from shardsim import mlp
from shardsim.pictures import chip_lines


def picture(step: str, value: ss.ShardedArray) -> None:
    """Print a step's title, the value's layout and the block each chip holds."""
    print(f"\n{step}")
    print(f"  {value.label}{value.layout}  global {value.global_shape}, each chip {value.local_shape}")
    for line in chip_lines(value, indent="    "):
        print(line)


def main() -> None:
    # Mixed runs FSDP and TP together on a 2×2 mesh (4 chips): axis X = FSDP (data), axis Y = TP (model).
    mesh = ss.Mesh(X=2, Y=2)
    params = mlp.init(d_model=4, d_ff=8, seed=0)
    tokens = np.arange(8, dtype=np.float32).reshape(2, 4)  # token 0 = [0 1 2 3], token 1 = [4 5 6 7]

    # Everything is doubly-sharded: the input is In[B_X, D_Y] — rows = tokens split on X, columns =
    # d_model split on Y — and the weights are quadrants, W_in[D_X, F_Y] and W_out[F_Y, D_X].
    x = ss.shard(tokens, mesh, "[B_X, D_Y]", label="In")
    w_in = ss.shard(params["w_in"], mesh, "[D_X, F_Y]", label="W_in", category="params")
    w_out = ss.shard(params["w_out"], mesh, "[F_Y, D_X]", label="W_out", category="params")

    # With batch = 2, token 0 lives on the X0 track and token 1 on the X1 track; within a track the
    # two Y-chips split the model.
    print("Starting layout — each chip holds its token, half the embedding:")
    picture("the input", x)
    print("    values:", {mesh.chip_name(c): x.local(**c).tolist() for c in mesh.chips()})
    picture("the first weight, in quadrants", w_in)
    picture("the second weight, in quadrants", w_out)

    print("\nForward pass — four collectives around two matmuls:")
    with ss.trace() as t:
        # 1. AllGather Y (activations) — complete each token's d_model. Within a track the two
        #    Y-chips swap embedding halves, so both hold the full token (1×4, replicated across Y).
        x_full = ss.all_gather(x, "Y", label="In")
        picture("1. AllGather Y (activations)", x_full)
        print("    values on (X0,Y1):", x_full.local(X=0, Y=1).tolist())

        # 2. AllGather X (W_in) — rebuild the d_model rows of W_in → W_in[d_model, F_Y]
        #    (replicated across X, still sharded on Y).
        w_in_full = ss.all_gather(w_in, "X")
        picture("2. AllGather X (W_in)", w_in_full)

        # 3. matmul 1: X full · W_in → H[B_X, F_Y] (hidden, sharded on d_ff by Y). No comms — the
        #    contracted d_model is fully present.
        h = (x_full @ w_in_full).named("H")
        picture("3. matmul 1: In · W_in → H", h)
        del x_full, w_in_full  # freed: only one gathered weight is alive at a time

        # 4. AllGather X (W_out) — rebuild the d_model columns of W_out → W_out[F_Y, d_model].
        w_out_full = ss.all_gather(w_out, "X")
        picture("4. AllGather X (W_out)", w_out_full)

        # 5. matmul 2: H · W_out → a partial Out[B_X, d_model] (each Y-chip summed only over its
        #    half of d_ff).
        partial = (h @ w_out_full).named("Out")
        picture("5. matmul 2: H · W_out → partial Out", partial)
        del w_out_full

        # 6. ReduceScatter Y (output) — add the two partials and re-shard along d_model, giving
        #    Out[B_X, D_Y] — back to the same doubly-sharded layout the next block expects.
        out = ss.reduce_scatter(partial, "Y", "D", label="Out")
        picture("6. ReduceScatter Y (output)", out)
        del partial

    # So the forward pass is exactly one AllGather-Y (activations), two AllGather-X (the two
    # weights), and one ReduceScatter-Y (output).
    print("\nThe trace (bytes each chip sends, FLOPs each chip does):")
    print(t)
    assert t == [("all_gather", "Y"), ("all_gather", "X"), ("all_gather", "X"), ("reduce_scatter", "Y")]

    print("\nMemory per chip (live now, and peak since the mesh was made):")
    print(mesh.memory)

    want = mlp.forward(params, tokens)
    err = float(np.abs(out.to_global() - want).max())
    print(f"\nOut against the single-device MLP: max abs error {err:.2e}")
    assert np.allclose(out.to_global(), want, rtol=1e-5, atol=1e-6)

    # Two views running at once. Along X it is data parallel — the X0 and X1 tracks run
    # identical-weight computations on different tokens, and they sync only in the backward pass,
    # via a ReduceScatter-X on the gradients. Along Y it is tensor parallel.
    print("\nThe backward pass, as the scheme runs it (the scaling book's algorithm):")
    dout = np.ones_like(tokens)
    r = ss.run_strategy("fsdp_tp", ss.Mesh(X=2, Y=2), params, tokens, dout)
    backward = [e for e in r.trace if e.phase == "backward"]
    for i, e in enumerate(backward, 1):
        cost = f"{e.sent_bytes} B sent per chip" if e.is_collective else f"{e.flops} FLOPs per chip"
        print(f"  {i:2}. {e.op:<15} {''.join(e.axes) or '-':<2} {e.label:<14} → {e.after:<14} {cost}")
    grads = mlp.backward(params, tokens, dout)
    for k, g in grads.items():
        assert np.allclose(r.grads[k], g, rtol=1e-5, atol=1e-6), k
    print("Gradients dIn, dW_in, dW_out match the single-device MLP.")


if __name__ == "__main__":
    main()
