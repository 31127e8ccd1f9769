"""Train one small regression problem under every scheme and ZeRO stage, and compare memory.

A 4-block MLP stack learns to imitate a random "teacher" stack, with Adam in mixed precision
(bfloat16 weights, activations and gradients; float32 master weights and moments), on 8
chips. The loss per step is the same under every scheme: they all compute the same step,
split differently. What differs is where the bytes live, and the ledger measures them:

    python examples/train.py

bfloat16 comes from ml_dtypes, which shardsim depends on.
"""

from __future__ import annotations

import numpy as np

import shardsim as ss
from shardsim import formulas, mlp
from shardsim.training import Adam, Trainer

LAYERS, BATCH, D_MODEL, D_FF, CHIPS, STEPS = 4, 32, 64, 256, 8, 5
SCHEMES = {  # name -> mesh; the data-parallel ZeRO stages first
    "ddp": ss.Mesh(X=CHIPS),
    "zero1": ss.Mesh(X=CHIPS),
    "zero2": ss.Mesh(X=CHIPS),
    "zero3": ss.Mesh(X=CHIPS),
    "tp": ss.Mesh(Y=CHIPS),
    "fsdp_tp": ss.Mesh(X=2, Y=CHIPS // 2),
}


def main() -> None:
    rng = np.random.default_rng(0)
    student = mlp.init_stack(LAYERS, D_MODEL, D_FF, seed=0)
    teacher = mlp.init_stack(LAYERS, D_MODEL, D_FF, seed=1)
    x = rng.standard_normal((BATCH, D_MODEL)).astype(np.float32)
    target = mlp.stack_forward(teacher, x, "gelu", residual=True).astype(np.float32)
    psi = LAYERS * 2 * D_MODEL * D_FF

    print(f"{LAYERS} residual MLP blocks, B={BATCH}, D={D_MODEL}, F={D_FF}: {psi:,} parameters, {CHIPS} chips")
    print("Adam, bfloat16 compute with float32 master weights and moments\n")
    print(f"{'scheme':<9}" + "".join(f"{'step ' + str(i + 1):>10}" for i in range(STEPS)))
    last = {}
    for name, mesh in SCHEMES.items():
        trainer = Trainer(name, mesh, student, Adam(lr=3e-3), precision="bf16", activation="gelu", residual=True)
        results = [trainer.step(x, target) for _ in range(STEPS)]
        print(f"{name:<9}" + "".join(f"{r.loss:>10.5f}" for r in results))
        last[name] = results[-1]

    print("\nBytes on each chip when the backward pass ends (measured by the ledger) and the")
    print("ZeRO closed form for the same Ψ and N (2 + 2 + 12 bytes per parameter, sharded by stage):\n")
    cats = ("params", "grads", "optimizer")
    print(f"{'scheme':<9}{'stage':>6}" + "".join(f"{c:>11}" for c in cats) + f"{'total':>11}{'formula':>11}")
    for name, r in last.items():
        chip = {c: int(r.model_state[c].flat[0]) for c in cats}
        axes = {role: r.mesh.axis_size(axis) for role, axis in r.axes.items()}
        formula = sum(formulas.scheme_model_state(name, psi, axes).values())
        stage = formulas.SCHEME_STAGES[name]
        print(
            f"{name:<9}{stage:>6}"
            + "".join(f"{chip[c]:>11,}" for c in cats)
            + f"{sum(chip.values()):>11,}{formula:>11,.0f}"
        )
    print("\n(tp and fsdp_tp shard every part of the state, like stage 3, over their model-parallel chips.)")


if __name__ == "__main__":
    main()
