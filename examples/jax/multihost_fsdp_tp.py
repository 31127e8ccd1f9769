"""The fsdp_tp step and a transformer's step across hosts: 2 processes x 4 CPU devices, joined by ``jax.distributed``.

Run with no arguments, it starts the two processes on localhost (each one a "host" with 4
CPU devices, talking over CPU collectives), lets them run shardsim's fsdp_tp forward and
backward on the 4 x 2 mesh of all 8 devices, then a Llama-style transformer's step under
``dp=2,zero=3,tp=2,sp,cp=2`` on the same 8 devices, and checks both against the same steps
in one process. Each process is this script again, with ``--process-id``::

    python examples/jax/multihost_fsdp_tp.py              # both processes, then the check
    python examples/jax/multihost_fsdp_tp.py --process-id 0 --port 12355 --out out.npz   # one host

On real hosts, ``jax.distributed.initialize()`` finds the coordinator itself (TPU, SLURM);
the shardsim code is the same.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PROCESSES, DEVICES_PER_PROCESS = 2, 4
B, D, F = 16, 16, 32


def inputs() -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The same global inputs in every process (each places only its own devices' blocks)."""
    import shardsim

    rng = np.random.default_rng(0)
    params = shardsim.models.reference_mlp.init(D, F, seed=0)
    return params, rng.standard_normal((B, D)).astype(np.float32), rng.standard_normal((B, D)).astype(np.float32)


PLAN = "dp=2,zero=3,tp=2,sp,cp=2"


def model_inputs() -> tuple[object, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """A small Llama-style model, its weights and a batch of token ids (the same in every process)."""
    from shardsim.models import TransformerConfig, reference

    cfg = TransformerConfig(layers=2, d_model=16, heads=4, d_ff=32, vocab=32, seq=16, kv_heads=2,
                            mlp="swiglu", norm="rmsnorm", position="rope")  # fmt: skip
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, cfg.vocab, (4, cfg.seq)).astype(np.int32)
    return cfg, reference.init(cfg, seed=1), tokens, np.roll(tokens, -1, axis=1)


def one_host(process_id: int, port: int, out: str) -> None:
    """One process: join the others, run the step on the global mesh, save what this host sees."""
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES_PER_PROCESS}"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives between processes
    jax.distributed.initialize(f"localhost:{port}", num_processes=PROCESSES, process_id=process_id)
    from shardsim.engines import jax as engine

    mesh = jax.make_mesh((4, 2), ("X", "Y"))  # all 8 devices of both processes
    params, x, dout = inputs()
    r = engine.run_strategy("fsdp_tp", mesh, params, x, dout, activation="relu")
    from shardsim.plans import Plan

    plan = Plan.parse(PLAN)
    layout = plan.mesh()
    model = engine.run_model(*model_inputs()[:1], plan, jax.make_mesh(layout.shape, layout.axis_names),
                             *model_inputs()[1:])  # fmt: skip
    np.savez(out, out=r.out, **{f"d{k}": v for k, v in r.grads.items()}, loss=model.loss,
             **{f"model.d{k}": v for k, v in model.grads.items()})  # fmt: skip
    print(f"process {process_id}: {jax.local_device_count()} of {jax.device_count()} devices, "
          f"{len(r.trace.collectives())} collectives; the transformer under {PLAN}: "
          f"{len(model.trace.collectives())} collectives")  # fmt: skip
    jax.distributed.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def main() -> None:
    """Start both processes, wait for them, compare with the single-process run."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        outs = [str(Path(tmp) / f"host{i}.npz") for i in range(PROCESSES)]
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--process-id", str(i), "--port", str(port), "--out", outs[i]],
            )
            for i in range(PROCESSES)
        ]
        codes = [p.wait(timeout=120) for p in procs]
        if any(codes):
            raise SystemExit(f"a process failed: exit codes {codes}")
        hosts = [dict(np.load(o)) for o in outs]

    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    import shardsim
    from shardsim.engines import jax as engine

    params, x, dout = inputs()
    single = engine.run_strategy("fsdp_tp", shardsim.Mesh(X=4, Y=2), params, x, dout, activation="relu")
    want = {"out": single.out, **{f"d{k}": v for k, v in single.grads.items()}}
    cfg, model_params, tokens, targets = model_inputs()
    plan = shardsim.Plan.parse(PLAN)
    step = engine.run_model(cfg, plan, plan.mesh(), model_params, tokens, targets)
    want |= {"loss": np.asarray(step.loss), **{f"model.d{k}": v for k, v in step.grads.items()}}
    # CPU collectives between processes sum in their own order: equal within float32's tolerance
    tol = shardsim.dtypes.tolerance("float32", F) * 8
    worst = 0.0
    for i, got in enumerate(hosts):
        for key, value in want.items():
            err = float(np.abs(got[key] - value).max()) / float(np.abs(value).max())
            assert err <= tol, f"process {i}: {key} differs by {err:.3g} (relative), above {tol:.3g}"
            worst = max(worst, err)
    print(
        f"{PROCESSES} processes x {DEVICES_PER_PROCESS} devices: out and gradients, and the transformer's loss and "
        "gradients, equal the single-process run "
        f"(largest relative difference {worst:.1e}, tolerance {tol:.1e})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.process_id is None:
        main()
    else:
        one_host(args.process_id, args.port, args.out)
